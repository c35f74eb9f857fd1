"""Synthetic access traces: two generators of per-(request, layer) top-K streams and their calibration.

Both follow a per-layer adjacent-step overlap profile (default: paper Fig. 2 read by eye,
``data/locality/paper_fig2.yaml``) with attention sinks, a local window, context growth and MTP as the union of
several query tokens' sets:

* ``"uniform"`` -- new entries drawn uniformly (or with a log-normal popularity skew);
* ``"drift"`` -- persistent token scores plus AR(1) noise, the noise level calibrated per layer to the profile
  (:func:`ess.locality.drift_calibration`).

Fig. 2's metric has two readings (:data:`ess.locality.READINGS`: the overlap fraction, or the Jaccard index, which
:func:`locality_profile` turns into the fraction ``2J / (1 + J)``). Which models exist, which is central and which
make every prediction's band, and the drift model's calibration, are :mod:`ess.locality`'s (the generators read their
defaults there).
:func:`synthetic_streams` yields one (request, layer) stream at a time; :func:`synthetic_trace` builds a whole
:class:`ess.traces.Trace`.
"""
from __future__ import annotations

import functools
import math
import numbers
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import yaml

from .kernels import resolve_backend
from .kernels import trace_stats as _trace_stats
from .kernels import tracegen as _tracegen_kernels
from .locality import check_reading, check_trace_model, drift_calibration, fitted_drift_rho
from .specs import model_spec
from .traces import MAX_POSITIONS, Trace, _Owned
from .validate import fits_in_memory, integer, number_array, real

__all__ = ["PAPER_WARMUP_WINDOWS", "DRIFT_CUTOFF_SIGMAS", "synthetic_trace", "synthetic_streams", "locality_profile",
           "generator_defaults", "geometry"]

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "locality"
PAPER_WARMUP_WINDOWS = 32  # [ARX] LRU-Warmup inserts the top-2K of the last 32 prefill positions (paper-facts.md)
_CALIB_QUERIES = 17          # calibration stream: 17 query tokens = 16 adjacent pairs (mtp 1, no warmup)
_CALIB_SEED = 20251210       # fixed seed of the calibration streams (common random numbers for the bisection)
DRIFT_CUTOFF_SIGMAS = 6.0     # candidate set: tokens whose base term is within 6 noise widths of the threshold
_THRESHOLD_MARGIN = 0.25      # ... minus this margin for the threshold's own movement (checked in every run)
# the uniform model draws a token's distinct free entries by rejection; a popularity skew so strong that this takes
# more than this many draws per entry is refused instead of running without end (a bound on run time only: it
# changes no stream that ends within it)
_MAX_DRAWS_PER_ENTRY = 10_000


# ------------------------------------------------------------------------------------------------------ profiles
@lru_cache(maxsize=None)
def _read_profile_file(name: str) -> tuple[tuple[float, ...], dict]:
    path = DATA_DIR / f"{name}.yaml"
    with open(path, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)
    layers = raw["layers"]
    values = tuple(float(layers[i]["value"]) for i in range(len(layers)))
    return values, {k: v["value"] for k, v in raw.get("generator", {}).items()}


def generator_defaults() -> dict:
    """The generator's structural choices (sinks, local window, popularity) from ``data/locality/paper_fig2.yaml``."""
    return dict(_read_profile_file("paper_fig2")[1])


def locality_profile(profile: Any = "paper", n_layers: int | None = None, reading: str | None = None) -> np.ndarray:
    """Adjacent-step overlap fraction per layer, shape (n_layers,), each in [0, 1].

    ``profile`` is ``"paper"`` (paper Fig. 2, read by eye; a model with fewer layers takes the layer at the same
    relative depth), a number (every layer the same) or a sequence of ``n_layers`` numbers. ``reading`` says how
    Fig. 2's values are read (:data:`ess.locality.READINGS`; ``None`` = the default model's): ``"fraction"`` takes
    them as they are, ``"jaccard"`` turns each Jaccard index ``J`` into the overlap fraction of two K-sets,
    ``2J / (1 + J)``. A reading applies to ``"paper"`` only (other profiles are fractions already). ``n_layers``
    defaults to the model's (:func:`geometry`).
    """
    n_layers = integer("n_layers", geometry(n_layers)[0], lo=1)
    fits_in_memory("n_layers", 16 * n_layers, "the profile's arrays (n_layers x 16 B)")
    if isinstance(profile, str):
        if profile != "paper":
            raise ValueError(f"profile must be 'paper', a number or a sequence of n_layers numbers, got {profile!r}")
        reading = check_reading(reading)
        paper = np.array(_read_profile_file("paper_fig2")[0])
        if reading == "jaccard":
            paper = 2 * paper / (1 + paper)
        if n_layers == len(paper):
            out = paper.copy()
        else:
            pick = np.rint(np.arange(n_layers) * (len(paper) - 1) / max(n_layers - 1, 1)).astype(int)
            out = paper[pick]
    elif reading is not None:
        raise ValueError("reading applies to profile='paper' only (a given profile is an overlap fraction)")
    elif isinstance(profile, numbers.Real) and not isinstance(profile, bool):
        out = np.full(n_layers, real("profile", profile))
    else:
        out = number_array("profile", profile, positive=False, max_ndim=None)
        if out.shape != (n_layers,):
            raise ValueError(f"profile must have n_layers = {n_layers} values, got shape {out.shape}")
    if not np.all((out >= 0) & (out <= 1)):
        raise ValueError(f"profile overlaps must lie in [0, 1], got {out.min()} .. {out.max()}")
    return out


def geometry(n_layers: int | None = None, k: int | None = None) -> tuple[int, int]:
    """``(n_layers, k)``, each ``None`` meaning DeepSeek-V3.2-Exp's (61 layers, top-k 2,048; ``data/models``)."""
    spec = model_spec()
    return (spec.n_layers if n_layers is None else integer("n_layers", n_layers, lo=1),
            spec.index_topk if k is None else integer("k", k, lo=1))


# ----------------------------------------------------------------------------------------------------- kernels
def _kernels():
    """The generator kernels (:mod:`ess.kernels.tracegen`) of the backend :func:`ess.kernels.resolve_backend`
    picks."""
    return _tracegen_kernels.get(resolve_backend())


@lru_cache(maxsize=None)
def _normal_table() -> np.ndarray:
    """65,536 equiprobable standard-normal values: the quantiles Phi^-1((i + 1/2) / 65536), i = 0 .. 65535
    (|value| <= 4.33). A 16-bit random index into it is a discretised N(0, 1) draw."""
    from statistics import NormalDist
    inv = NormalDist().inv_cdf
    return np.array([inv((i + 0.5) / 65536.0) for i in range(65536)])


# ----------------------------------------------------------------------------------------------------- drift
def _drift_params(c: float, rho: float) -> tuple[float, float]:
    """(pi, rho_layer) giving adjacent-token score correlation ``c`` = pi + (1 - pi) * rho_layer; pi = 0 and
    rho_layer = c when c <= rho (the continuous limit: no persistent part)."""
    if c <= rho:
        return 0.0, max(c, 0.0)
    return (c - rho) / (1.0 - rho), rho


def _drift_stream_arrays(seed: int, n_pos: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n_pos), rng.standard_normal(n_pos)


def _drift_run(seed: int, n_pos: int, context_len: int, k: int, mtp: int, steps: int, n_warm: int, pi: float,
               rho: float, n_sinks: int, window: int, cutoff: float) -> tuple[np.ndarray, np.ndarray, int]:
    """Run one drift stream; returns (warm, steps, n_candidates).

    Candidate set (``cutoff`` finite): the first query token's threshold ``theta0`` (the score of its weakest free
    entry, computed exactly over every token) sets ``cut = theta0 - margin - cutoff * sqrt(1 - pi)``; only tokens
    with ``sqrt(pi) * b_i >= cut`` are simulated. Another token could be selected only if its noise exceeded
    ``cutoff`` standard deviations (or the threshold fell by more than the margin, which the kernel reports and
    which makes this function rerun the full model). The noise is stationary N(0, 1), so the expected number of
    selections the restriction misses is at most ``n_pos * queries * P(N(0,1) > cutoff)`` (about 1e-9 per token
    and query at 6 sigma). Every simulated token draws the same numbers as in the full model (counter-based
    random numbers), so where nothing crosses, the output is identical.
    """
    gen = _kernels().gen_drift
    table = _normal_table()
    base, noise0 = _drift_stream_arrays(seed, n_pos)
    ns = min(n_sinks, k)
    nw = min(window, k - ns)
    need = k - ns - nw
    cand = np.arange(ns, n_pos, dtype=np.int64)
    if math.isfinite(cutoff) and pi > 0 and need > 0:
        hi0 = (context_len - n_warm + 1 if n_warm else context_len) - nw
        s0 = math.sqrt(pi) * base[ns:hi0] + math.sqrt(1 - pi) * noise0[ns:hi0]
        theta0 = float(np.partition(s0, s0.size - need)[s0.size - need])
        cut = theta0 - _THRESHOLD_MARGIN - cutoff * math.sqrt(1 - pi)
        keep = math.sqrt(pi) * base[ns:] >= cut
        cand = cand[keep]
        warm = np.empty((n_warm, k), np.int32)
        out = np.empty((steps, mtp * k), np.int32)
        lowest = gen(seed, base, noise0.copy(), cand, context_len, k, mtp, steps, n_warm, pi, rho, n_sinks, window,
                     table, warm, out)
        if lowest >= theta0 - _THRESHOLD_MARGIN:
            return warm, out, cand.size
        cand = np.arange(ns, n_pos, dtype=np.int64)            # the margin was crossed: run the full model
    warm = np.empty((n_warm, k), np.int32)
    out = np.empty((steps, mtp * k), np.int32)
    gen(seed, base, noise0, cand, context_len, k, mtp, steps, n_warm, pi, rho, n_sinks, window, table, warm, out)
    return warm, out, cand.size


@lru_cache(maxsize=4096)
def _drift_overlap_at(c: float, rho: float, context_len: int, k: int, n_sinks: int, window: int) -> float:
    n_q = _CALIB_QUERIES
    n_pos = context_len + n_q
    pi, rl = _drift_params(c, rho)
    _, out, _ = _drift_run(_CALIB_SEED, n_pos, context_len, k, 1, n_q, 0, pi, rl, n_sinks, window, math.inf)
    # Fig. 2's overlap, the definition ess.traces.adjacent_overlap averages too (ess.kernels.trace_stats); every
    # query token selects k >= 1 entries, so no term is NaN. Summed in step order, as the calibration always has
    # been (np.mean's pairwise sum would move the fitted noise levels by a rounding)
    terms = np.empty(n_q - 1)
    _trace_stats.get(resolve_backend()).adjacent_overlaps(out, n_pos, terms)
    return float(np.add.accumulate(terms)[-1] / terms.size)


def _structure(n_sinks, local_window, context_len: int) -> tuple[int, int]:
    """The attention sinks and the local window (``None``: :func:`generator_defaults`), each at most the context."""
    d = generator_defaults()
    n_sinks = integer("n_sinks", d["n_sinks"] if n_sinks is None else n_sinks, lo=0, below=context_len + 1)
    local_window = integer("local_window", d["local_window"] if local_window is None else local_window, lo=0,
                           below=context_len + 1)
    return n_sinks, local_window


# ----------------------------------------------------------------------------------------------------- streams
def _stream_seed(seed: int, request: int, layer: int) -> int:
    return int(np.random.SeedSequence([seed, request, layer]).generate_state(1)[0] & 0x7FFFFFFF)


def _check_generator_args(context_len, k, mtp, steps, batch, n_layers, warmup_windows, seed):
    model_geometry = k is None
    n_layers, k = geometry(n_layers, k)
    context_len = integer("context_len", context_len, lo=1)
    k = integer("k", k, lo=1)
    if k > context_len:
        raise ValueError(f"k (top-K) = {k} is larger than the context ({context_len} tokens); expected k <= context_len")
    mtp = integer("mtp", mtp, lo=1)
    steps = integer("steps", steps, lo=1)
    batch = integer("batch", batch, lo=1)
    n_layers = integer("n_layers", n_layers, lo=1)
    warmup_windows = integer("warmup_windows", warmup_windows, lo=0)
    if context_len - warmup_windows + 1 < k:
        raise ValueError(f"the first warmup window (prefill position {context_len - warmup_windows}) sees fewer than "
                         f"k = {k} tokens; use fewer warmup_windows or a longer context")
    seed = integer("seed", seed, lo=0)
    n_pos = context_len + steps * mtp
    if model_geometry and n_pos > model_spec().max_position_embeddings:
        raise ValueError(f"context_len + steps * mtp = {n_pos} tokens exceeds the maximum context of "
                         f"{model_spec().name} ({model_spec().max_position_embeddings} tokens), whose top-K (k=None) "
                         f"the trace takes")
    if n_pos > MAX_POSITIONS:
        raise ValueError(f"context_len + steps * mtp = {n_pos} positions; traces index int32 positions "
                         f"(at most 2**31 - 1)")
    return context_len, k, mtp, steps, batch, n_layers, warmup_windows, seed


def _synthetic_streams(context_len: int, *, n_layers: int | None = None, k: int | None = None, mtp: int = 2,
                      steps: int = 64,
                      batch: int = 4, warmup_windows: int = PAPER_WARMUP_WINDOWS, profile: Any = "paper",
                      seed: int = 0, n_sinks: int | None = None, local_window: int | None = None,
                      popularity_sigma: float | None = None, trace_model: str | None = None,
                      reading: str | None = None, drift_rho: float | None = None,
                      drift_cutoff_sigmas: float | None = None) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """Yield ``(request, layer, windows (W, k), steps (steps, mtp*k))`` one stream at a time (no full trace in
    memory); ``windows`` are the warmup windows.

    Both models (``trace_model="uniform"`` or ``"drift"``; ``None`` = :func:`ess.locality.default_trace_model`)
    follow, per request and layer, a chain of query tokens: the W warmup positions, then ``mtp`` tokens per decode
    step. Each token selects the ``n_sinks`` first tokens, the last ``local_window`` tokens of its context and
    ``k - n_sinks - local_window`` "free" entries; a decode step's set is the union of its ``mtp`` tokens' sets, and
    the context grows by ``mtp`` tokens per step.

    ``"uniform"``: the next token keeps a random subset of the previous free entries, as many as make its overlap
    with the previous token's set equal ``profile[layer] * k`` (when the sinks and the shifted window alone exceed
    that, it keeps none), and draws the rest from the older context among entries the previous set did not hold
    (uniformly, or weighted by a per-position log-normal popularity when ``popularity_sigma > 0``).

    ``"drift"`` (score drift): every token of the stream has a persistent base score ``b_i`` and an AR(1) noise
    ``n_i(q) = rho * n_i(q-1) + sqrt(1 - rho^2) * eps`` that moves once per query token ``q`` (so the ``mtp``
    tokens of one step see successive, slightly different noise draws, and the next step continues the chain);
    the free entries are the top ``k - n_sinks - local_window`` of ``sqrt(pi) * b_i + sqrt(1 - pi) * n_i(q)``
    over the free range. Tokens added by the growing context have their own (fresh) base scores. The adjacent-token
    score correlation ``c = pi + (1 - pi) * rho`` is solved per layer by :func:`drift_calibration` so that the
    adjacent-step overlap equals ``profile[layer]`` at this context length and K; ``drift_rho`` is the noise's own
    correlation (default: the value fitted on vLLM's hit rate for ``reading``, :func:`fitted_drift_rho`). ``b_i`` and the first noise
    values are standard normal, the innovations ``eps`` discretised standard normal (:func:`_normal_table`).
    Only tokens whose base term lies within ``drift_cutoff_sigmas`` (default 6) noise widths of the first
    threshold are simulated; ``math.inf`` simulates every token. The restriction is exact unless a token's noise
    exceeds 6 standard deviations (see :func:`_drift_run` for the bound; the tests compare both). Streams are
    generated two at a time on two threads; the output does not depend on it.

    ``reading`` (:data:`ess.locality.READINGS`, ``None`` = the default model's) says how Fig. 2 is read when
    ``profile`` is ``"paper"``, and which fitted ``rho`` the drift model takes by default (with any profile).
    """
    context_len, k, mtp, steps, batch, n_layers, warmup_windows, seed = _check_generator_args(
        context_len, k, mtp, steps, batch, n_layers, warmup_windows, seed)
    trace_model = check_trace_model(trace_model)
    reading = check_reading(reading)
    r = locality_profile(profile, n_layers, reading if isinstance(profile, str) else None)
    n_sinks, local_window = _structure(n_sinks, local_window, context_len)
    d = generator_defaults()
    n_pos = context_len + steps * mtp
    if trace_model == "drift":
        if popularity_sigma is not None:
            raise ValueError("popularity_sigma belongs to trace_model='uniform'; the drift model has no popularity skew "
                             "(its persistent base scores play that part)")
        rho = real("drift_rho", fitted_drift_rho(reading) if drift_rho is None else drift_rho, lo=0.0, hi=1.0,
                   hi_open=True)
        calib = {float(v): drift_calibration(float(v), context_len, k, n_sinks, local_window, rho)
                 for v in np.unique(r)}
        if drift_cutoff_sigmas is None:
            cutoff = DRIFT_CUTOFF_SIGMAS
        elif isinstance(drift_cutoff_sigmas, (float, np.floating)) and drift_cutoff_sigmas == math.inf:
            cutoff = math.inf
        else:
            cutoff = real("drift_cutoff_sigmas (math.inf = simulate every token)", drift_cutoff_sigmas, lo=0.0,
                          lo_open=True)
        jobs = [(b, layer) for b in range(batch) for layer in range(n_layers)]

        def run(job):
            b, layer = job
            cal = calib[float(r[layer])]
            return _drift_run(_stream_seed(seed, b, layer), n_pos, context_len, k, mtp, steps, warmup_windows,
                              cal["pi"], cal["rho"], n_sinks, local_window, cutoff)

        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max_workers=2) as pool:       # the kernel releases the GIL: two streams at once
            futures = [pool.submit(run, job) for job in jobs[:2]]
            for i, (b, layer) in enumerate(jobs):
                warm, out, _ = futures[i].result()
                futures[i] = None
                if i + 2 < len(jobs):
                    futures.append(pool.submit(run, jobs[i + 2]))
                yield b, layer, warm, out
        return
    if drift_rho is not None or drift_cutoff_sigmas is not None:
        raise ValueError("drift_rho and drift_cutoff_sigmas belong to trace_model='drift'")
    sigma = real("popularity_sigma", d["popularity_sigma"] if popularity_sigma is None else popularity_sigma, lo=0.0)
    gen = _kernels().gen_uniform
    for b in range(batch):
        for layer in range(n_layers):
            s = _stream_seed(seed, b, layer)
            if sigma > 0:
                with np.errstate(over="ignore"):
                    w = np.exp(sigma * np.random.default_rng(s).standard_normal(n_pos))
                cdf = np.concatenate([[0.0], np.cumsum(w)])
                if not np.isfinite(cdf[-1]):
                    raise ValueError(f"popularity_sigma={sigma:g} overflows the popularity weights exp(sigma x N(0, 1))")
            else:
                cdf = np.zeros(1)
            warm = np.empty((warmup_windows, k), np.int32)
            out = np.empty((steps, mtp * k), np.int32)
            if gen(s, context_len, k, mtp, steps, warmup_windows, float(r[layer]), n_sinks, local_window, cdf,
                   sigma > 0, _MAX_DRAWS_PER_ENTRY, warm, out) < 0:
                raise ValueError(f"popularity_sigma={sigma:g} is too skewed to draw k = {k} distinct entries from a "
                                 f"context of {context_len} tokens (more than {_MAX_DRAWS_PER_ENTRY} draws per entry)")
            yield b, layer, warm, out


@functools.wraps(_synthetic_streams)
def synthetic_streams(context_len, **kwargs):
    # the generator's arguments are checked when it is made, not at its first item (a wrong one would otherwise
    # surface far from the call that passed it)
    _check_generator_args(context_len, kwargs.get("k"), kwargs.get("mtp", 2), kwargs.get("steps", 64),
                          kwargs.get("batch", 4), kwargs.get("n_layers"),
                          kwargs.get("warmup_windows", PAPER_WARMUP_WINDOWS), kwargs.get("seed", 0))
    for name in ("n_sinks", "local_window"):
        if kwargs.get(name) is not None:
            integer(name, kwargs[name], lo=0)
    return _synthetic_streams(context_len, **kwargs)


def synthetic_trace(context_len: int, *, n_layers: int | None = None, k: int | None = None, mtp: int = 2,
                    steps: int = 64,
                    batch: int = 4, warmup_windows: int = PAPER_WARMUP_WINDOWS, profile: Any = "paper",
                    seed: int = 0, n_sinks: int | None = None, local_window: int | None = None,
                    popularity_sigma: float | None = None, trace_model: str | None = None,
                    reading: str | None = None, drift_rho: float | None = None,
                    drift_cutoff_sigmas: float | None = None) -> Trace:
    """A whole synthetic :class:`Trace` (see :func:`synthetic_streams` for the models). Memory: B*layers*steps*mtp*k*4 B."""
    context_len, k, mtp, steps, batch, n_layers, warmup_windows, seed = _check_generator_args(
        context_len, k, mtp, steps, batch, n_layers, warmup_windows, seed)
    trace_model = check_trace_model(trace_model)
    nbytes = batch * n_layers * steps * mtp * k * 4
    if nbytes > 2e9:
        raise ValueError(f"this trace would take {Decimal(nbytes) / 10 ** 9:,.3g} GB (batch={batch} x n_layers={n_layers} x "
                         f"steps={steps} x mtp={mtp} x k={k} x 4 B); use synthetic_streams() or "
                         f"ess.cachesim.misses_per_layer(), which never hold the whole trace")
    idx = np.empty((batch, n_layers, steps, mtp * k), np.int32)
    warm = np.empty((batch, n_layers, warmup_windows, k), np.int32) if warmup_windows else None
    for b, layer, w, s in synthetic_streams(context_len, n_layers=n_layers, k=k, mtp=mtp, steps=steps, batch=batch,
                                            warmup_windows=warmup_windows, profile=profile, seed=seed,
                                            n_sinks=n_sinks, local_window=local_window,
                                            popularity_sigma=popularity_sigma, trace_model=trace_model,
                                            reading=reading, drift_rho=drift_rho,
                                            drift_cutoff_sigmas=drift_cutoff_sigmas):
        idx[b, layer] = s
        if warm is not None:
            warm[b, layer] = w
    d = generator_defaults()
    reading = check_reading(reading)
    meta = {"generator": "ess.tracegen.synthetic_trace", "trace_model": trace_model, "reading": reading,
            "profile": profile if isinstance(profile, (str, numbers.Real)) else list(map(float, profile)),
            "n_sinks": d["n_sinks"] if n_sinks is None else n_sinks,
            "local_window": d["local_window"] if local_window is None else local_window}
    if trace_model == "uniform":
        meta["popularity_sigma"] = d["popularity_sigma"] if popularity_sigma is None else popularity_sigma
    else:
        meta["drift_rho"] = fitted_drift_rho(reading) if drift_rho is None else drift_rho
    return Trace(_Owned(idx), context_len, k, mtp, seed, None if warm is None else _Owned(warm), meta)
