"""Locality studies of notebook 04: a trace recorded from the real lightning indexer on synthetic activations, and the
locality model grounded in the evidence of ``data/locality/README.md``: each piece of evidence as a statistic of a
model (:func:`buffer_hit_rate` for vLLM's hit rate, :func:`gvr_overlaps` for GVR's, :func:`trace_shape` /
:func:`model_shape` for the real traces' shape), the drift model's ``rho`` fitted on vLLM's range
(:func:`fit_drift_rho`), and the rule that chooses the default model and reading (:func:`evidence_distances`,
:func:`choose_locality`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from ..attention import indexer_scores, topk_indices
from ..cachesim import misses_per_step, trace_misses
from ..quant import encode_indexer_keys
from ..specs import DATA_DIR, ModelSpec, model_spec
from ..locality import FIT_HIT_RATE, READINGS, TRACE_MODELS, LocalityModel
from ..tracegen import Workload, geometry, synthetic_trace
from ..traces import Trace, TraceRecorder, adjacent_overlap, load_trace, return_share, union_share
from ..validate import real

__all__ = ["record_indexer_trace", "VLLM_BUFFER_2K_HIT_RATE", "GVR_DEEP_OVERLAP", "GVR_SHALLOW_OVERLAP",
           "GVR_SHALLOW_LAYERS", "FIT_HIT_RATE", "range_distance", "buffer_hit_rate", "fit_drift_rho", "gvr_overlaps",
           "trace_shape", "model_shape", "real_traces", "evidence_distances", "choose_locality", "candidates",
           "measure_evidence", "SHAPE_STATS"]

SHAPE_STATS = ("hit_2k", "union4", "return8")


def record_indexer_trace(model: Any = "tiny", *, context_len: int = 1024, steps: int = 16, batch: int = 2,
                         mtp: int = 1, warmup_windows: int = 4, query_correlation: float = 0.9, seed: int = 0,
                         backend: str = "auto") -> Trace:
    """Record a trace from the real lightning indexer and top-K of :mod:`ess.attention` with synthetic activations.

    Keys are random (one FP8 indexer entry per token, :func:`ess.quant.encode_indexer_keys`); each layer's query
    follows an AR(1) walk ``q <- c q + sqrt(1 - c^2) e`` from one query token to the next (``c`` =
    ``query_correlation``, a design choice: there is no trained model here), so adjacent steps select overlapping
    sets for the indexer's own reasons. Every step, the indexer scores the cache that exists before the step
    (``context_len + t * mtp`` tokens) for each of the ``mtp`` query tokens, :func:`ess.attention.topk_indices`
    picks the model's top-K, and a :class:`TraceRecorder` stores the union. The warmup windows are the top-K of the
    last ``warmup_windows`` prefill positions.
    """
    model = model_spec(model) if isinstance(model, str) else model
    if not isinstance(model, ModelSpec):
        raise TypeError(f"model must be a ModelSpec or preset name, got {type(model).__name__}")
    k = model.index_topk
    w = Workload(context_len, mtp=mtp, steps=steps, batch=batch, warmup_windows=warmup_windows, seed=seed,
                 n_layers=model.n_layers, k=k)                      # the setting, checked as a trace's
    context_len, mtp, steps, batch, n_layers, warmup_windows, seed = (
        w.context_len, w.mtp, w.steps, w.batch, w.n_layers, w.warmup_windows, w.seed)
    query_correlation = real("query_correlation", query_correlation, lo=0.0, hi=1.0, hi_open=True)
    rng = np.random.default_rng(seed)
    Hi, D = model.index_n_heads, model.index_head_dim
    n_pos = context_len + steps * mtp
    c = float(query_correlation)
    rec = TraceRecorder(context_len=context_len, k=k, n_layers=n_layers, batch=batch, mtp=mtp,
                        meta={"recorded_from": "ess.attention.indexer_scores + topk_indices", "model": model.name,
                              "activations": "synthetic: random keys, AR(1) queries",
                              "query_correlation": c, "seed": seed})
    keys = [encode_indexer_keys(rng.standard_normal((batch, n_pos, D)).astype(np.float32), model)
            for _ in range(n_layers)]                                            # per layer (B, n_pos, D + 4)
    weights = [np.abs(rng.standard_normal((batch, Hi))).astype(np.float32) for _ in range(n_layers)]
    q = [rng.standard_normal((batch, Hi, D)).astype(np.float32) for _ in range(n_layers)]

    def advance(layer):
        q[layer] = (c * q[layer] + np.sqrt(1 - c * c) * rng.standard_normal((batch, Hi, D))).astype(np.float32)
        return q[layer]

    def select(layer, length):
        s = indexer_scores(advance(layer), weights[layer], keys[layer], np.full(batch, length, np.int64),
                           backend=backend)
        return topk_indices(s, k)                                                # (B, k)

    if warmup_windows:
        for layer in range(n_layers):
            wins = [select(layer, context_len - warmup_windows + i + 1) for i in range(warmup_windows)]
            rec.observe_windows(layer, np.stack(wins, axis=1))                    # (B, W, k)
    for t in range(steps):
        length = context_len + t * mtp
        for layer in range(n_layers):
            rec.observe(layer, np.stack([select(layer, length) for _ in range(mtp)], axis=1))
        rec.end_step()
    tr = rec.to_trace()
    return Trace(tr.indices, tr.context_len, tr.k, tr.mtp, seed, tr.windows, tr.meta)


# vLLM RFC #48203 via paper-facts.md: 80-90 % hit rate on DeepSeek-V3.2 with a GPU buffer of 2 x top-k per request
# (an independent figure, not calibration data of the simulator: E2 of data/locality/README.md)
VLLM_BUFFER_2K_HIT_RATE = (0.80, 0.90)
# NVIDIA's GVR paper via paper-facts.md: consecutive-step top-2048 overlap 35-50 % in deep layers, ~1-2 % in layers 0-1
GVR_DEEP_OVERLAP = (0.35, 0.50)
GVR_SHALLOW_OVERLAP = (0.01, 0.02)
GVR_SHALLOW_LAYERS = 2          # layers 0-1; "deep" is every later layer (data/locality/README.md, E3)


def range_distance(x: float, band: tuple[float, float]) -> float:
    """Distance of ``x`` to the range ``band = (low, high)``: 0 inside it, else the distance to the nearer end."""
    low, high = band
    return float(max(low - x, x - high, 0.0))


def buffer_hit_rate(context_len: int, *, buffer_k: int = 2, steps: int = 128, batch: int = 2, seed: int = 0,
                    locality: LocalityModel | None = None, n_layers: int | None = None,
                    profile: Any = "paper") -> float:
    """LRU hit rate of a synthetic trace with a pool of ``buffer_k`` x K entries per (request, layer): 1 - misses / K
    over the second half of ``steps`` decode steps, MTP 1 (one top-K selection per step), LRU with the warmup
    windows, every layer of the model (:func:`ess.tracegen.geometry`; or ``n_layers``), mean over layers and
    ``batch`` requests, of the locality model ``locality`` (``None``: the central one) on ``profile``
    (:class:`ess.tracegen.Workload`'s).
    With the defaults at 32K it is the statistic h2K of ``data/locality/README.md`` (setting S)."""
    from ..validate import integer, positive_int
    context_len, buffer_k, steps, batch = (positive_int(n, v) for n, v in (
        ("context_len", context_len), ("buffer_k", buffer_k), ("steps", steps), ("batch", batch)))
    seed = integer("seed", seed)
    k = geometry()[1]
    workload = Workload(context_len, mtp=1, steps=steps, batch=batch, seed=seed, locality=locality,
                        n_layers=n_layers, profile=profile)
    m = misses_per_step(workload, buffer_k * k / context_len)                         # (n_layers, steps)
    return float(1 - m[:, steps // 2:].mean() / k)


def fit_drift_rho(target: float, *, reading: str, context_len: int = 32768, lo: float = 0.0, hi: float = 0.95,
                  tol: float = 0.005, evaluated: dict | None = None, **hit_kw: Any) -> dict:
    """The drift model's ``rho`` at which :func:`buffer_hit_rate` (``hit_kw``; setting S by default) equals
    ``target``, by bisection on ``[lo, hi]`` to ``tol``; the hit rate falls as rho grows (the two ends are
    evaluated, and a rise between them raises). When ``target`` lies outside the hit rates of the two ends, the end
    nearer to it is returned with ``reachable`` False. ``evaluated`` (a dict ``{rho: hit rate}``) is read and
    filled, so fits to several targets share their evaluations. Returns ``{"rho", "hit_rate", "reachable",
    "evaluations"}``."""
    from ..validate import positive_int
    target = real("target", target, lo=0.0, hi=1.0)
    context_len = positive_int("context_len", context_len)       # checked here: ``evaluated`` may answer every rho
    evaluated = {} if evaluated is None else evaluated

    def hit(rho: float) -> float:
        rho = round(float(rho), 6)
        if rho not in evaluated:
            evaluated[rho] = buffer_hit_rate(context_len, locality=LocalityModel.of("drift", reading, rho),
                                             **hit_kw)
        return evaluated[rho]

    h_lo, h_hi = hit(lo), hit(hi)
    if h_hi > h_lo:
        raise ValueError(f"the hit rate rises with rho ({h_lo:.4f} at {lo}, {h_hi:.4f} at {hi}); bisection needs it "
                         "to fall")
    if target >= h_lo or target <= h_hi:
        end = lo if target >= h_lo else hi
        return {"rho": end, "hit_rate": hit(end), "reachable": target == hit(end), "evaluations": dict(evaluated)}
    a, b = lo, hi
    while b - a > tol:
        mid = 0.5 * (a + b)
        if hit(mid) > target:
            a = mid
        else:
            b = mid
    rho = min((a, b), key=lambda x: abs(hit(x) - target))
    return {"rho": round(rho, 6), "hit_rate": hit(rho), "reachable": True, "evaluations": dict(evaluated)}


def gvr_overlaps(context_len: int = 32768, *, steps: int = 16, seed: int = 1,
                 locality: LocalityModel | None = None) -> dict:
    """GVR's statistics of a synthetic model (E3 of ``data/locality/README.md``): the measured adjacent overlap per
    layer (MTP 1, ``steps`` decode steps, one request, no warmup, ``seed``; ``locality`` the model, ``None`` the
    central one), its mean over layers 2 and later (``deep``) and over layers 0-1 (``shallow``)."""
    tr = synthetic_trace(Workload(context_len, mtp=1, steps=steps, batch=1, warmup_windows=0, seed=seed,
                                  locality=locality))
    per_layer = adjacent_overlap(tr)
    return {"per_layer": per_layer, "deep": float(per_layer[GVR_SHALLOW_LAYERS:].mean()),
            "shallow": float(per_layer[:GVR_SHALLOW_LAYERS].mean())}


def trace_shape(trace: Trace, *, buffer_k: int = 2, union_window: int = 4, return_within: int = 8) -> dict:
    """The shape statistics of E4 (``data/locality/README.md``) of a trace with one query token per step, means over
    requests, layers and steps: ``hit_2k`` LRU hit rate with a pool of ``buffer_k`` x K (warmup windows, second half
    of the steps); ``union4`` the share of distinct entries among ``union_window`` consecutive sets
    (:func:`ess.traces.union_share`); ``return8`` the share of entries leaving the set that come back within
    ``return_within`` steps (:func:`ess.traces.return_share`). Also ``overlap``, the mean adjacent overlap."""
    from ..validate import positive_int
    buffer_k, union_window, return_within = (positive_int(n, v) for n, v in (
        ("buffer_k", buffer_k), ("union_window", union_window), ("return_within", return_within)))
    if trace.mtp != 1:
        raise ValueError(f"trace_shape needs a trace with one query token per step (mtp 1), got mtp {trace.mtp}")
    m = trace_misses(trace, "lru", capacity=buffer_k * trace.k, warmup=trace.windows is not None)
    return {"hit_2k": float(1 - m[:, :, trace.steps // 2:].mean() / trace.k),
            "union4": float(union_share(trace, union_window).mean()),
            "return8": float(np.nanmean(return_share(trace, return_within))),
            "overlap": float(adjacent_overlap(trace).mean())}


def model_shape(real_trace: Trace, *, seed: int = 0, locality: LocalityModel | None = None,
                n_sinks: int | None = None, local_window: int | None = None) -> dict:
    """:func:`trace_shape` of a synthetic model run at ``real_trace``'s geometry (context, K, layers, steps,
    requests, warmup windows) with ``real_trace``'s own measured per-layer overlap as its profile (``locality``:
    the model, ``None`` the central one; its reading does not apply), so that the comparison tests the model's time
    structure, not its overlap level. The generator's structure (attention sinks, local window: 4 and 64 entries of
    DeepSeek's K = 2,048) is scaled to the trace's K unless ``n_sinks`` / ``local_window`` set it, so that it keeps
    its share of the set (at K = 64 the unscaled window alone would fill it)."""
    from ..tracegen import generator_defaults
    tr = real_trace
    d, k_ref = generator_defaults(), geometry()[1]
    n_sinks = int(round(d["n_sinks"] * tr.k / k_ref)) if n_sinks is None else n_sinks
    local_window = int(round(d["local_window"] * tr.k / k_ref)) if local_window is None else local_window
    syn = synthetic_trace(Workload(tr.context_len, n_layers=tr.n_layers, k=tr.k, mtp=1, steps=tr.steps,
                                   batch=tr.batch, warmup_windows=tr.n_windows, seed=seed, locality=locality,
                                   profile=np.clip(adjacent_overlap(tr), 0.0, 1.0), n_sinks=n_sinks,
                                   local_window=local_window))
    return trace_shape(syn)


def real_traces(folder: str | Path | None = None) -> dict[str, Trace]:
    """The recorded real-model traces with one query token per step (``mtp`` 1) in ``data/traces/`` (or
    ``folder``), by file name; empty when there are none."""
    folder = Path(folder) if folder is not None else DATA_DIR / "traces"
    out = {}
    for path in sorted(folder.glob("*.npz")) if folder.is_dir() else []:
        tr = load_trace(path)
        if tr.mtp == 1:
            out[path.stem] = tr
    return out


def candidates(rho: Mapping[str, float]) -> list[LocalityModel]:
    """The four candidates of the rule: (``uniform``, ``drift``) x :data:`ess.locality.READINGS`, the drift model
    with ``rho[reading]`` (its fitted ``rho*``)."""
    return [LocalityModel(f"{tm}/{rd}", tm, rd, float(rho[rd]) if tm == "drift" else None)
            for tm in TRACE_MODELS for rd in READINGS]


def evidence_distances(hit_2k: float, gvr: Mapping[str, float], shape: Mapping[str, float] | None = None,
                       real_shape: Mapping[str, float] | None = None) -> dict:
    """The distances of one candidate to the evidence (``data/locality/README.md``, "The rule"): ``d_E2`` of its
    2 x K hit rate to vLLM's range; ``d_E3`` of GVR's deep and shallow means to their ranges (summed); ``d_E4`` the
    mean absolute difference of the three shape statistics from the real traces' (None without real traces);
    ``score`` their sum."""
    d2 = range_distance(hit_2k, VLLM_BUFFER_2K_HIT_RATE)
    d3 = range_distance(gvr["deep"], GVR_DEEP_OVERLAP) + range_distance(gvr["shallow"], GVR_SHALLOW_OVERLAP)
    d4 = None
    if shape is not None and real_shape is not None:
        d4 = float(np.mean([abs(shape[s] - real_shape[s]) for s in SHAPE_STATS]))
    return {"d_E2": d2, "d_E3": d3, "d_E4": d4, "score": d2 + d3 + (d4 or 0.0)}


def choose_locality(scores: Mapping[tuple[str, str], float], *, tie: float = 0.005,
                    keep: tuple[str, str] = ("drift", "fraction")) -> tuple[str, str]:
    """The rule of ``data/locality/README.md``: the candidate ``(trace model, reading)`` with the smallest score;
    a score within ``tie`` of the smallest counts as a tie, which keeps ``keep`` (the earlier default) when it is
    among the tied candidates."""
    best = min(scores, key=scores.get)
    return keep if keep in scores and scores[keep] <= scores[best] + tie else best


def measure_evidence(models: Iterable[LocalityModel], *, context_len: int = 32768, probe_steps: int = 16,
                     probe_seed: int = 1, hit_rates: Mapping[str, float] | None = None,
                     real: Mapping[str, Trace] | None = None, **hit_kw: Any):
    """Each model against every piece of evidence of ``data/locality/README.md``: one row per model (by
    ``name``) with ``hit_2k`` (E2; taken from ``hit_rates[name]`` when given, else :func:`buffer_hit_rate` with
    ``hit_kw``), ``gvr_deep`` / ``gvr_shallow`` (E3, :func:`gvr_overlaps` with ``probe_steps`` and ``probe_seed``),
    ``e1_max_error`` (E1: the largest ``|measured - target|`` over the layers on the same probe, the target raised to
    the model's floor where it lies below it), the mean shape statistics of the model at each real trace's
    geometry (E4, :func:`model_shape`; ``real`` = :func:`real_traces` by default) and the real traces' own, the
    distances and the score (:func:`evidence_distances`). Returns a DataFrame and the probes' per-layer overlaps."""
    import pandas as pd
    from ..locality import drift_calibration
    from ..tracegen import generator_defaults, locality_profile
    from ..validate import integer, positive_int
    context_len, probe_steps = positive_int("context_len", context_len), positive_int("probe_steps", probe_steps)
    probe_seed = integer("probe_seed", probe_seed)
    real = real_traces() if real is None else dict(real)
    real_mean = ({s: float(np.mean([trace_shape(tr)[s] for tr in real.values()])) for s in SHAPE_STATS}
                 if real else None)
    rows, per_layer = [], {}
    k, n_layers = geometry()[1], geometry()[0]
    d = generator_defaults()
    for m in models:
        h = (hit_rates[m.name] if hit_rates and m.name in hit_rates else
             buffer_hit_rate(context_len, locality=m, **hit_kw))
        gvr = gvr_overlaps(context_len, steps=probe_steps, seed=probe_seed, locality=m)
        target = locality_profile("paper", n_layers, m.reading)
        floor = ((d["n_sinks"] + d["local_window"] - 1) / k if m.trace_model == "uniform" else
                 drift_calibration(0.0, context_len, k, rho=m.drift_rho)["floor"])
        e1 = float(np.abs(gvr["per_layer"] - np.maximum(target, floor)).max())
        shape = None
        if real:
            shapes = [model_shape(tr, locality=m) for tr in real.values()]
            shape = {s: float(np.mean([x[s] for x in shapes])) for s in SHAPE_STATS}
        dist = evidence_distances(h, gvr, shape, real_mean)
        per_layer[m.name] = gvr["per_layer"]
        rows.append({"name": m.name, "trace_model": m.trace_model, "reading": m.reading, "drift_rho": m.drift_rho,
                     "hit_2k": h, "gvr_deep": gvr["deep"], "gvr_shallow": gvr["shallow"], "e1_max_error": e1,
                     "floor": floor, **{f"model_{s}": (shape or {}).get(s) for s in SHAPE_STATS},
                     **{f"real_{s}": (real_mean or {}).get(s) for s in SHAPE_STATS}, **dist})
    return pd.DataFrame(rows).set_index("name"), per_layer
