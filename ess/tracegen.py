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

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import yaml

from .kernels import resolve_backend
from .kernels import trace_stats as _trace_stats
from .kernels import tracegen as _tracegen_kernels
from .locality import (LocalityModel, check_reading, default_locality, drift_calibration, locality_named,
                       locality_names)
from .options import option, parse_tokens
from .specs import model_spec
from .traces import MAX_POSITIONS, Trace, _Owned
from .validate import fits_in_memory, integer, number_array, real

__all__ = ["PAPER_WARMUP_WINDOWS", "DRIFT_CUTOFF_SIGMAS", "Workload", "synthetic_trace", "synthetic_streams",
           "locality_profile", "generator_defaults", "geometry"]

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


@dataclass(frozen=True)
class Workload:
    """The setting of a synthetic trace: the requests, their context and steps, and the locality model that draws
    their top-K sets (:func:`synthetic_streams`, :func:`synthetic_trace`, :func:`ess.cachesim.sweep_synthetic`).

    Checked when made (each wrong field named); ``None`` fields are resolved then: ``n_layers`` and ``k`` to
    DeepSeek-V3.2-Exp's (:func:`geometry`), ``locality`` to the central model (:func:`ess.locality.default_locality`),
    ``n_sinks``, ``local_window`` and (uniform) ``popularity_sigma`` to :func:`generator_defaults`, (drift)
    ``drift_cutoff_sigmas`` to :data:`DRIFT_CUTOFF_SIGMAS`. Each field's help and unit are in its metadata
    (:func:`ess.options.option`; those with a flag are ``ess misses``'s command line). :meth:`replace` makes a
    changed copy, checked again.

    >>> w = Workload(32768, steps=16)
    >>> (w.n_layers, w.k, w.mtp, w.batch, w.locality.name)
    (61, 2048, 2, 4, 'central')
    >>> w.replace(mtp=0)
    Traceback (most recent call last):
    ...
    ValueError: mtp must be a positive integer, got 0
    """

    context_len: int = field(metadata=option(
        "context at the first decode step", "tokens (32k = 32,768)", "--context", parse=parse_tokens))
    mtp: int = field(default=2, metadata=option(
        "query tokens per request and decode step (MTP); a step's set is the union of theirs", "tokens", "--mtp",
        parse=int))
    steps: int = field(default=64, metadata=option("decode steps", "steps", "--steps", parse=int))
    batch: int = field(default=4, metadata=option("requests (independent streams)", "requests", "--batch",
                                                  parse=int))
    warmup_windows: int = field(default=PAPER_WARMUP_WINDOWS, metadata=option(
        "prefill positions whose top-K sets LRU-Warmup inserts (paper: 32)", "positions", "--warmup-windows",
        parse=int))
    seed: int = field(default=0, metadata=option("random seed", "integer", "--seed", parse=int))
    locality: LocalityModel | None = field(default=None, metadata=option(
        "locality model: a model of the band or a trace model with its defaults (default: the central model)",
        "name", "--locality", parse=locality_named, choices=locality_names))
    n_layers: int | None = field(default=None, metadata=option(
        "layers, one stream each (default DeepSeek-V3.2-Exp's 61)", "layers", "--layers", parse=int))
    k: int | None = field(default=None, metadata=option(
        "top-K entries a query token selects (default DeepSeek-V3.2-Exp's 2,048)", "entries", "--topk", parse=int))
    profile: Any = field(default="paper", metadata=option(
        "adjacent-step overlap per layer: 'paper' (Fig. 2), a number or one per layer (locality_profile)",
        "fraction"))
    n_sinks: int | None = field(default=None, metadata=option(
        "attention sinks every token selects (default data/locality/paper_fig2.yaml)", "tokens"))
    local_window: int | None = field(default=None, metadata=option(
        "the last tokens of its context every token selects (default data/locality/paper_fig2.yaml)", "tokens"))
    popularity_sigma: float | None = field(default=None, metadata=option(
        "uniform model: log-normal popularity skew of the free entries (0: none)", "sigma of ln(weight)"))
    drift_cutoff_sigmas: float | None = field(default=None, metadata=option(
        "drift model: tokens simulated within this many noise widths of the threshold (math.inf: all)",
        "noise widths"))

    def __post_init__(self) -> None:
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 -- frozen: set once, here
        model_geometry = self.k is None
        n_layers, k = geometry(self.n_layers, self.k)
        context_len = integer("context_len", self.context_len, lo=1)
        if k > context_len:
            raise ValueError(f"k (top-K) = {k} is larger than the context ({context_len} tokens); expected "
                             f"k <= context_len")
        mtp, steps, batch = (integer(n, getattr(self, n), lo=1) for n in ("mtp", "steps", "batch"))
        warmup_windows = integer("warmup_windows", self.warmup_windows, lo=0)
        if context_len - warmup_windows + 1 < k:
            raise ValueError(f"the first warmup window (prefill position {context_len - warmup_windows}) sees fewer "
                             f"than k = {k} tokens; use fewer warmup_windows or a longer context")
        seed = integer("seed", self.seed, lo=0)
        n_pos = context_len + steps * mtp
        if model_geometry and n_pos > model_spec().max_position_embeddings:
            raise ValueError(f"context_len + steps * mtp = {n_pos} tokens exceeds the maximum context of "
                             f"{model_spec().name} ({model_spec().max_position_embeddings} tokens), whose top-K "
                             f"(k=None) the trace takes")
        if n_pos > MAX_POSITIONS:
            raise ValueError(f"context_len + steps * mtp = {n_pos} positions; traces index int32 positions "
                             f"(at most 2**31 - 1)")
        locality = default_locality() if self.locality is None else self.locality
        if not isinstance(locality, LocalityModel):
            raise TypeError(f"locality must be an ess.locality.LocalityModel (or None: the central model), got "
                            f"{type(locality).__name__}")
        profile = self.profile
        # checked here, so that a wrong profile is named when the workload is made
        locality_profile(profile, n_layers, locality.reading if isinstance(profile, str) else None)
        if not isinstance(profile, (str, numbers.Real)):
            profile = tuple(float(v) for v in np.asarray(profile, dtype=float).ravel())
        n_sinks, local_window = _structure(self.n_sinks, self.local_window, context_len)
        d = generator_defaults()
        if locality.trace_model == "drift":
            if self.popularity_sigma is not None:
                raise ValueError("popularity_sigma belongs to the uniform trace model; the drift model has no "
                                 "popularity skew (its persistent base scores play that part)")
            cutoff = self.drift_cutoff_sigmas
            if cutoff is None:
                cutoff = DRIFT_CUTOFF_SIGMAS
            elif not (isinstance(cutoff, (float, np.floating)) and cutoff == math.inf):
                cutoff = real("drift_cutoff_sigmas (math.inf = simulate every token)", cutoff, lo=0.0, lo_open=True)
            sigma = None
        else:
            if self.drift_cutoff_sigmas is not None:
                raise ValueError("drift_cutoff_sigmas belongs to the drift trace model")
            sigma = real("popularity_sigma", d["popularity_sigma"] if self.popularity_sigma is None
                         else self.popularity_sigma, lo=0.0)
            cutoff = None
        for name, value in dict(context_len=context_len, mtp=mtp, steps=steps, batch=batch,
                                warmup_windows=warmup_windows, seed=seed, locality=locality, n_layers=n_layers, k=k,
                                profile=profile, n_sinks=n_sinks, local_window=local_window, popularity_sigma=sigma,
                                drift_cutoff_sigmas=cutoff).items():
            put(name, value)

    @property
    def n_positions(self) -> int:
        """Positions a stream spans: the context and ``steps * mtp`` decode tokens."""
        return self.context_len + self.steps * self.mtp

    def overlaps(self) -> np.ndarray:
        """The adjacent-step overlap per layer the streams follow (:func:`locality_profile`), shape (n_layers,)."""
        p = self.profile
        return locality_profile(p if isinstance(p, (str, numbers.Real)) else list(p), self.n_layers,
                                self.locality.reading if isinstance(p, str) else None)

    def replace(self, **changes: Any) -> "Workload":
        """A copy with ``changes`` (checked as when made). A locality model of the other trace model drops the
        resolved option of the old one (``popularity_sigma`` or ``drift_cutoff_sigmas``) unless ``changes`` set it."""
        if "locality" in changes:
            new = default_locality() if changes["locality"] is None else changes["locality"]
            if getattr(new, "trace_model", None) != self.locality.trace_model:
                changes.setdefault("popularity_sigma", None)
                changes.setdefault("drift_cutoff_sigmas", None)
        return dataclasses.replace(self, **changes)

    def config(self) -> dict:
        """What identifies the workload in a recorded configuration."""
        p = self.profile
        out = {"context_len": self.context_len, "mtp": self.mtp, "steps": self.steps, "batch": self.batch,
               "warmup_windows": self.warmup_windows, "seed": self.seed, "n_layers": self.n_layers, "k": self.k,
               "profile": p if isinstance(p, (str, numbers.Real)) else list(p), "n_sinks": self.n_sinks,
               "local_window": self.local_window, **self.locality.config()}
        if self.popularity_sigma is not None:
            out["popularity_sigma"] = self.popularity_sigma
        return out


def _workload(name: str, workload: Any) -> Workload:
    if not isinstance(workload, Workload):
        raise TypeError(f"{name} must be an ess.tracegen.Workload (e.g. Workload(32768, steps=16)), got "
                        f"{type(workload).__name__}")
    return workload


def synthetic_streams(workload: Workload) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """Yield ``(request, layer, windows (W, k), steps (steps, mtp*k))`` for each stream of ``workload`` (a
    :class:`Workload`), one at a time (no full trace in memory); ``windows`` are the warmup windows.

    Both trace models of the workload's locality model (``"uniform"`` or ``"drift"``)
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
    correlation (the locality model's ``drift_rho``). ``b_i`` and the first noise
    values are standard normal, the innovations ``eps`` discretised standard normal (:func:`_normal_table`).
    Only tokens whose base term lies within ``drift_cutoff_sigmas`` (default 6) noise widths of the first
    threshold are simulated; ``math.inf`` simulates every token. The restriction is exact unless a token's noise
    exceeds 6 standard deviations (see :func:`_drift_run` for the bound; the tests compare both). Streams are
    generated two at a time on two threads; the output does not depend on it.

    The locality model's ``reading`` (:data:`ess.locality.READINGS`) says how Fig. 2 is read when ``profile`` is
    ``"paper"``. The workload is checked when it is made, so a wrong setting is named at the call, not at the
    first stream.
    """
    return _streams(_workload("workload", workload))


def _streams(w: Workload) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    r = w.overlaps()
    context_len, k, mtp, steps, n_pos = w.context_len, w.k, w.mtp, w.steps, w.n_positions
    if w.locality.trace_model == "drift":
        calib = {float(v): drift_calibration(float(v), context_len, k, w.n_sinks, w.local_window,
                                             w.locality.drift_rho)
                 for v in np.unique(r)}
        jobs = [(b, layer) for b in range(w.batch) for layer in range(w.n_layers)]

        def run(job):
            b, layer = job
            cal = calib[float(r[layer])]
            return _drift_run(_stream_seed(w.seed, b, layer), n_pos, context_len, k, mtp, steps, w.warmup_windows,
                              cal["pi"], cal["rho"], w.n_sinks, w.local_window, w.drift_cutoff_sigmas)

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
    sigma = w.popularity_sigma
    gen = _kernels().gen_uniform
    for b in range(w.batch):
        for layer in range(w.n_layers):
            s = _stream_seed(w.seed, b, layer)
            if sigma > 0:
                with np.errstate(over="ignore"):
                    weights = np.exp(sigma * np.random.default_rng(s).standard_normal(n_pos))
                cdf = np.concatenate([[0.0], np.cumsum(weights)])
                if not np.isfinite(cdf[-1]):
                    raise ValueError(f"popularity_sigma={sigma:g} overflows the popularity weights exp(sigma x N(0, 1))")
            else:
                cdf = np.zeros(1)
            warm = np.empty((w.warmup_windows, k), np.int32)
            out = np.empty((steps, mtp * k), np.int32)
            if gen(s, context_len, k, mtp, steps, w.warmup_windows, float(r[layer]), w.n_sinks, w.local_window, cdf,
                   sigma > 0, _MAX_DRAWS_PER_ENTRY, warm, out) < 0:
                raise ValueError(f"popularity_sigma={sigma:g} is too skewed to draw k = {k} distinct entries from a "
                                 f"context of {context_len} tokens (more than {_MAX_DRAWS_PER_ENTRY} draws per entry)")
            yield b, layer, warm, out


def synthetic_trace(workload: Workload) -> Trace:
    """The whole synthetic :class:`Trace` of ``workload`` (a :class:`Workload`; see :func:`synthetic_streams` for
    the models). Memory: batch x n_layers x steps x mtp x k x 4 B."""
    w = _workload("workload", workload)
    batch, n_layers, steps, mtp, k = w.batch, w.n_layers, w.steps, w.mtp, w.k
    nbytes = batch * n_layers * steps * mtp * k * 4
    if nbytes > 2e9:
        raise ValueError(f"this trace would take {Decimal(nbytes) / 10 ** 9:,.3g} GB (batch={batch} x n_layers={n_layers} x "
                         f"steps={steps} x mtp={mtp} x k={k} x 4 B); use synthetic_streams() or "
                         f"ess.cachesim.misses_per_layer(), which never hold the whole trace")
    idx = np.empty((batch, n_layers, steps, mtp * k), np.int32)
    warm = np.empty((batch, n_layers, w.warmup_windows, k), np.int32) if w.warmup_windows else None
    for b, layer, windows, s in _streams(w):
        idx[b, layer] = s
        if warm is not None:
            warm[b, layer] = windows
    loc = w.locality
    p = w.profile
    meta = {"generator": "ess.tracegen.synthetic_trace", "trace_model": loc.trace_model, "reading": loc.reading,
            "profile": p if isinstance(p, (str, numbers.Real)) else list(p),
            "n_sinks": w.n_sinks, "local_window": w.local_window}
    if loc.trace_model == "uniform":
        meta["popularity_sigma"] = w.popularity_sigma
    else:
        meta["drift_rho"] = loc.drift_rho
    return Trace(_Owned(idx), w.context_len, k, mtp, w.seed, None if warm is None else _Owned(warm), meta)
