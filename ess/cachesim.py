"""Trace-driven simulation of the GPU latent pool, fast: misses per (request, layer, step) for a replacement policy.

Each (request, layer) has its own pool of ``capacity`` slots (from a ratio: :func:`ess.layout.pool_slots`,
``floor(ratio x page-padded context)``, the rule the memory model and the storage use; in the synthetic sweeps a
layer whose step union needs more takes it from the others, :func:`ess.layout.layer_pool_slots`). For one step
with valid indices ``S`` (array order; -1 padding ignored):

* hits = S & pool, misses = S - pool (each miss is one entry copied host -> device);
* victims for the misses are chosen among resident entries **not in S** by the policy;
* afterwards every entry of S is resident.

The policies (``policy=``, one of :data:`ess.policies.POLICIES`: ``"lru"``, ``"fifo"``, ``"heat"``, ``"clock"``,
``"sampled_clock"``, ``"belady"``)
are defined by their readable references in :mod:`ess.policies`; the Numba kernels of :mod:`ess.kernels.cachesim`
are their fast path and are tested against :func:`ess.policies.simulate_misses` miss for miss. Heat counts one per
access (traces carry no indexer scores) with decay ``decay`` (:data:`ess.policies.DEFAULT_HEAT_DECAY`).

Warmup (``warmup=True``) processes each of the trace's W warmup windows (the top-K of the last W prefill positions,
in order) like a step, without counting its loads as misses (LRU-Warmup of the paper; any policy may use it).
A pool smaller than one step's set is an error.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import numpy as np

from .kernels import cachesim as _kernels
from .kernels import resolve_backend
from .layout import layer_pool_slots, pool_slots, step_entries
from .policies import DEFAULT_HEAT_DECAY, POLICIES
from .specs import model_spec
from .tracegen import Workload, _workload, synthetic_streams
from .traces import Trace, index_rows
from .validate import fraction, one_of, positive_int, real

__all__ = ["trace_misses", "sequence_misses", "misses_per_layer", "misses_per_step", "sweep_synthetic",
           "smallest_pool"]


# ----------------------------------------------------------------------------------------------------- validation
def _capacity(ratio: Any, context_len: int, k: int) -> int:
    """Slots per pool for ``ratio`` (:func:`ess.layout.pool_slots` with DeepSeek-V3.2-Exp's cache pages), at least
    ``k`` (one step's top-K must fit)."""
    return pool_slots(model_spec(), ratio, context_len, need=k)


def _layer_capacities(ratio: Any, context_len: int, k: int, mtp: int, overlap: np.ndarray) -> np.ndarray:
    """Slots per layer (n_layers,): the ratio's slots shared over the layers so that each holds its step's union
    (:func:`ess.layout.step_entries` with the layer's overlap, :func:`ess.layout.layer_pool_slots`)."""
    model = model_spec()
    return layer_pool_slots(model, ratio, context_len, step_entries(model, context_len, mtp, overlap=overlap, k=k))


# A (request, layer) pool is sized from the layer's mean adjacent overlap (step_entries); a step whose query tokens
# overlap less than the mean selects a few more entries. Up to this share more than its slots, the pool takes them
# (it must hold the step); beyond it the ratio is too small and the simulation says so. A design choice.
STEP_SLACK = 0.05


def _holding_the_step(capacity: int, width: int) -> int:
    """The slots of a pool whose largest step selects ``width`` entries: ``width`` when it exceeds ``capacity`` by
    at most :data:`STEP_SLACK`, else ``capacity`` (then the kernel refuses the step)."""
    return width if capacity < width <= capacity * (1 + STEP_SLACK) else capacity


def _check_policy(policy: str, decay: float) -> None:
    one_of("policy", policy, POLICIES)
    fraction("decay", decay)


def _pad_rows(rows: np.ndarray, width: int) -> np.ndarray:
    if rows.shape[1] == width:
        return rows
    out = np.full((rows.shape[0], width), -1, np.int32)
    out[:, :rows.shape[1]] = rows[:, :width]
    return out


def sequence_misses(steps: np.ndarray, capacity: int, *, policy: str = "lru", windows: np.ndarray | None = None,
                    n_positions: int | None = None, decay: float = DEFAULT_HEAT_DECAY) -> np.ndarray:
    """Misses per step (steps.shape[0],) for one pool: ``steps`` (T, width) and ``windows`` (W, K) (the warmup
    windows, applied first and not counted, or None) are NumPy integer arrays of positions, -1 = padding, distinct
    within a row; ``n_positions`` (default: one more than the largest position) bounds them.

    Every argument is checked before a kernel runs (the kernels index memory with the positions): a ``TypeError``
    for a non-integer array or capacity, a ``ValueError`` for a position outside ``[-1, n_positions)``, a repeat
    within a row, or an empty ``steps``. The kernels read a private int32 copy."""
    _check_policy(policy, decay)
    capacity = positive_int("capacity", capacity)
    steps, n_pos = index_rows("steps", steps, n_positions)
    if steps.shape[0] == 0:
        raise ValueError(f"steps must hold at least one step (T >= 1), got shape {steps.shape}")
    if windows is not None:
        windows, n_win = index_rows("windows", windows, n_positions, shape_doc="(W, K)")
        n_pos = max(n_pos, n_win)           # without n_positions: one more than the largest position of either
    if windows is not None and windows.shape[0]:
        width = max(steps.shape[1], windows.shape[1])
        seq = np.concatenate([_pad_rows(windows, width), _pad_rows(steps, width)])
        n_free = windows.shape[0]
    else:
        seq, n_free = steps, 0
    return _run_seq(seq, n_free, capacity, policy, n_pos, decay)


def _run_seq(seq: np.ndarray, n_free: int, capacity: int, policy: str, n_pos: int, decay: float,
             backend: str = "auto") -> np.ndarray:
    """Run one policy kernel (:mod:`ess.kernels.cachesim`, ``backend`` resolved by
    :func:`ess.kernels.resolve_backend`) over ``seq`` (T, W) int32 whose first ``n_free`` rows are uncounted warmup
    rows. The rows must hold distinct positions (checked by the callers: :func:`ess.traces.index_rows`); the range,
    which every array write of the kernels depends on, is checked here again."""
    if seq.dtype != np.int32 or seq.ndim != 2 or not seq.flags.c_contiguous:
        raise TypeError(f"the kernels take a C-contiguous 2-D int32 array, got {seq.dtype} {seq.shape}")
    if seq.size and (int(seq.min()) < -1 or int(seq.max()) >= n_pos):
        raise ValueError(f"positions must lie in [-1, {n_pos}), got [{int(seq.min())}, {int(seq.max())}]")
    out = np.zeros(seq.shape[0] - n_free, np.int64)
    bad = _kernels.get(resolve_backend(backend)).simulate(seq, n_free, capacity, policy, n_pos, float(decay), out)
    if bad >= 0:
        size = int((seq[bad] >= 0).sum())
        what = f"warmup window {bad}" if bad < n_free else f"step {bad - n_free}"
        raise ValueError(f"the pool ({capacity} slots) is smaller than the {size} entries of {what}; "
                         f"raise the ratio (capacity must hold one step's union of top-K sets)")
    return out


def trace_misses(trace: Trace, policy: str = "lru", *, capacity: int | None = None, ratio: float | None = None,
             warmup: bool = True, decay: float = DEFAULT_HEAT_DECAY) -> np.ndarray:
    """Misses per (request, layer, step) of ``trace``: int64 array (B, n_layers, steps).

    Give ``capacity`` (slots per pool) or ``ratio`` (:func:`ess.layout.pool_slots` of the trace's context). ``warmup=True``
    uses the trace's warmup windows (an error when it has none).
    """
    if not isinstance(trace, Trace):
        raise TypeError(f"trace must be an ess.traces.Trace, got {type(trace).__name__}")
    _check_policy(policy, decay)
    if (capacity is None) == (ratio is None):
        raise ValueError("give exactly one of capacity= or ratio=")
    if ratio is not None:
        capacity = _capacity(ratio, trace.context_len, trace.k)
    capacity = positive_int("capacity", capacity)
    if capacity < trace.k:
        raise ValueError(f"capacity ({capacity} slots) is smaller than K = {trace.k}; one step's top-K must fit")
    if warmup and trace.windows is None:
        raise ValueError("warmup=True but the trace has no warmup windows; pass warmup=False")
    out = np.zeros((trace.batch, trace.n_layers, trace.steps), np.int64)
    for b in range(trace.batch):
        for layer in range(trace.n_layers):
            windows = trace.windows[b, layer] if warmup else None
            try:
                out[b, layer] = sequence_misses(trace.indices[b, layer], capacity, policy=policy, windows=windows,
                                                n_positions=trace.n_positions, decay=decay)
            except ValueError as exc:
                raise ValueError(f"request {b}, layer {layer}: {exc}") from None
    return out


# -------------------------------------------------------------------------------------- synthetic sweeps (contract)
def sweep_synthetic(workload: Workload, ratios: Sequence[float], *, policies: Iterable[str] = ("lru",),
                    warmups: Iterable[bool] = (True,), decay: float = DEFAULT_HEAT_DECAY, threads: int = 1,
                    selected: np.ndarray | None = None) -> dict:
    """Generate each synthetic (request, layer) stream of ``workload`` (:class:`ess.tracegen.Workload`) once and
    simulate every (ratio, policy, warmup) on it.

    Each ratio's slots are shared over the layers so that every layer's pool holds its step's union of the ``mtp``
    query tokens' sets, as the layer's overlap in the workload's profile bounds it
    (:func:`ess.layout.layer_pool_slots`); with ``mtp`` 1, or whenever the even share suffices, every layer gets
    :func:`ess.layout.pool_slots`. A step whose tokens overlap less than the layer's mean may select up to
    :data:`STEP_SLACK` more entries than that; the pool takes them. Returns
    ``{(ratio, policy, warmup): misses}`` with ``misses`` of shape (n_layers, steps), the mean over the
    workload's requests of misses per decode step. ``threads > 1`` simulates the configurations of one stream in
    parallel (the kernels release the GIL); the result does not depend on it. ``selected`` (optional, a float64
    array (n_layers, steps)) receives the mean over the requests of the entries each decode step selects (the
    denominator of a hit rate).
    """
    from .validate import boolean
    w = _workload("workload", workload)
    context_len, mtp, steps, batch, n_layers, k = w.context_len, w.mtp, w.steps, w.batch, w.n_layers, w.k
    threads = positive_int("threads", threads)
    if isinstance(ratios, (str, bytes)) or not isinstance(ratios, Iterable):
        raise TypeError(f"ratios must be a list of sparse-memory ratios, got {type(ratios).__name__}")
    ratios = list(ratios)
    policies = list(policies)
    warmups = [boolean(f"warmups[{i}]", x) for i, x in enumerate(warmups)]
    if not ratios:
        raise ValueError("ratios must not be empty")
    for p in policies:
        _check_policy(p, decay)
    overlap = w.overlaps()
    caps = {r: _layer_capacities(r, context_len, k, mtp, overlap) for r in ratios}
    out = {(r, p, x): np.zeros((n_layers, steps)) for r in ratios for p in policies for x in warmups}
    n_pos = w.n_positions
    if w.warmup_windows == 0 and any(warmups):
        raise ValueError("warmup=True needs warmup_windows >= 1")
    if selected is not None and (not isinstance(selected, np.ndarray) or selected.dtype != np.float64
                                 or selected.shape != (n_layers, steps)):
        raise TypeError(f"selected must be a float64 array of shape ({n_layers}, {steps}) (or None), got "
                        f"{type(selected).__name__} {getattr(selected, 'dtype', '')} {getattr(selected, 'shape', '')}")
    sizes = np.zeros((n_layers, steps))
    keys = list(out)
    pool = None
    if threads > 1:
        from concurrent.futures import ThreadPoolExecutor
        pool = ThreadPoolExecutor(max_workers=int(threads))
    try:
        for b, layer, warm, st in synthetic_streams(w):
            st, _ = index_rows("steps", st, n_pos)            # the kernels' input checked once per stream
            if warm.size:
                warm, _ = index_rows("windows", warm, n_pos)
            width = max(int((st >= 0).sum(axis=1).max()), int((warm >= 0).sum(axis=1).max()) if warm.size else 1)
            cold_seq = np.ascontiguousarray(st[:, :width])                      # drop the all-padding columns
            warm_seq = np.concatenate([_pad_rows(warm, width), cold_seq]) if warm.size else cold_seq
            n_w = warm.shape[0]
            run = lambda key: _run_seq(warm_seq if key[2] else cold_seq, n_w if key[2] else 0,  # noqa: E731
                                       _holding_the_step(int(caps[key[0]][layer]), width), key[1], n_pos, decay)
            try:
                results = list(pool.map(run, keys)) if pool is not None else [run(key) for key in keys]
            except ValueError as exc:
                raise ValueError(f"context {context_len}, layer {layer}: {exc}") from None
            for key, m in zip(keys, results):
                out[key][layer] += m
            sizes[layer] += (cold_seq >= 0).sum(axis=1)
    finally:
        if pool is not None:
            pool.shutdown()
    for acc in out.values():
        acc /= batch
    if selected is not None:
        selected[:] = sizes / batch
    return out


def misses_per_step(workload: Workload, ratio: float, *, warmup: bool = True, policy: str = "lru") -> np.ndarray:
    """Mean misses per request in each layer and decode step: (n_layers, steps). See :func:`misses_per_layer`."""
    from .validate import boolean
    warmup = boolean("warmup", warmup)
    res = sweep_synthetic(workload, [ratio], policies=[policy], warmups=[warmup])
    return res[(ratio, policy, warmup)]


def misses_per_layer(workload: Workload, ratio: float, *, warmup: bool = True, policy: str = "lru") -> np.ndarray:
    """Mean misses per request per decode step in each layer: (n_layers,) float64.

    From the synthetic streams of ``workload`` (:class:`ess.tracegen.Workload`: its locality model, profile, MTP
    and warmup windows; :func:`ess.tracegen.synthetic_streams`) and the cache simulation with
    :func:`ess.layout.pool_slots` slots per (request, layer) at ``ratio``, ``policy`` with or without LRU-Warmup
    (``warmup``). Raises ValueError when the pool cannot hold one step's union of top-K sets.
    """
    return misses_per_step(workload, ratio, warmup=warmup, policy=policy).mean(axis=1)


def smallest_pool(workload: Workload, target: float, *, resolution: int | None = None) -> dict:
    """The smallest pool (slots per request and layer) whose average misses (over layers, requests and steps, from
    :func:`misses_per_layer` of ``workload``) stay below ``target``, by bisection between the mean step union of
    the layers (:func:`ess.layout.step_entries` with the profile's overlaps; smaller pools cannot hold the steps)
    and the whole context, to ``resolution`` slots (default context / 64).

    Assumes misses do not grow with the pool (checked at both ends of the final bracket). Returns
    ``{"slots", "ratio", "misses", "below_slots", "below_misses"}``.
    """
    w = _workload("workload", workload)
    real("target", target, lo=0.0, lo_open=True)
    context_len = w.context_len
    resolution = max(1, context_len // 64) if resolution is None else positive_int("resolution", resolution)
    avg = lambda cap: float(misses_per_layer(w, cap / context_len).mean())  # noqa: E731
    need = step_entries(model_spec(), context_len, w.mtp, k=w.k, overlap=w.overlaps())
    lo, hi = min(int(math.ceil(np.mean(need))), context_len), context_len
    at_hi = avg(hi)
    if at_hi >= target:
        raise ValueError(f"even a pool of the whole context ({context_len} slots) has {at_hi:.1f} misses >= {target}")
    try:
        at_lo = avg(lo)
    except ValueError:
        at_lo = math.inf                      # the smallest pool cannot hold a step: counts as too small
    if at_lo < target:
        return {"slots": lo, "ratio": lo / context_len, "misses": at_lo, "below_slots": None, "below_misses": None}
    while hi - lo > resolution:
        mid = (lo + hi) // 2
        m = avg(mid)
        if m < target:
            hi, at_hi = mid, m
        else:
            lo, at_lo = mid, m
    return {"slots": hi, "ratio": hi / context_len, "misses": at_hi, "below_slots": lo, "below_misses": at_lo}
