"""Trace replay: one request of an :class:`ess.traces.Trace` driven through a cache, step by step, with real bytes
and real copies.

What it owns: turning a recorded (or generated) trace into calls of a cache's step protocol -- the warmup windows
first, then for every decode step :meth:`plan`, :meth:`copy` and :meth:`commit` on every layer, then the step's new
tokens written back (:meth:`append_token`) -- and reading what the cache logged. Three forms:

* :func:`replay_trace` an iterator that yields, after each decode step, the metrics records that step added (a
  caller follows the replay while it runs);
* :func:`run_trace` the whole replay, its records as a DataFrame;
* :func:`replay_steps` a source of per-step rows for the monitor (:mod:`ess.monitor`'s row protocol), the cache's
  counts timed by a link model.

The cache is anything with the step protocol of :class:`ess.storage.TieredCache` (:data:`REPLAY_CALLS`: ``n_layers``,
``capacity``, ``entry_bytes``, ``metrics`` (an :class:`ess.metrics.MetricsLog`), ``n_tokens``, ``plan``, ``copy``,
``commit``, ``append_token``, and ``warmup`` when the trace's windows are fed; ``verify=True`` also reads
``device_rows`` and ``host``). The cache is not told it is being replayed: nothing here reaches into it.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from . import validate
from .metrics import LinkModel, StepRow, link_model

__all__ = ["REPLAY_CALLS", "replay_trace", "run_trace", "replay_steps", "COMPUTE_S_PER_LAYER"]

#: What a replay uses of the cache (``warmup`` only with the trace's windows; ``device_rows`` and ``host`` only to
#: verify).
REPLAY_CALLS = ("n_layers", "capacity", "entry_bytes", "metrics", "n_tokens", "plan", "copy", "commit",
                "append_token")
# [derived] compute time of one step of one (request, layer): 73.3 ms step / 61 layers / batch 52 (paper Table 2,
# paper-facts.md), the figure ess.prefetch.PrefetchConfig.step_time_us uses
COMPUTE_S_PER_LAYER = 23.1e-6


def _check_cache(cache, warmup: bool, verify: bool) -> None:
    need = REPLAY_CALLS + (("warmup",) if warmup else ()) + (("device_rows", "host") if verify else ())
    missing = [c for c in need if not hasattr(cache, c)]
    if missing:
        raise TypeError(f"cache must offer the step protocol {need} (an ess.storage.TieredCache); "
                        f"{type(cache).__name__} lacks {missing}")


def replay_trace(cache, trace, request_id, *, batch_index: int = 0, warmup: bool = True, new_tokens=None,
                 verify: bool = False) -> Iterator[list]:
    """Replay one request of ``trace`` through ``cache``, one decode step at a time: an iterator that yields, after
    each step, the :class:`ess.metrics.StepMetrics` records that step added (one ``"step"`` record per layer, then
    the ``"append"`` records of its new tokens), so that a caller can follow the replay while it runs.

    Layer ``l`` of the trace drives layer ``l`` of the cache; the trace's request ``batch_index`` drives
    ``request_id``, whose token count must be the trace's ``context_len``. With ``warmup`` the trace's LRU-Warmup
    windows are fed first (``cache.warmup``; their records are logged, not yielded). Then every decode step plans,
    copies and commits every layer and writes back the step's ``trace.mtp`` new tokens (``cache.append_token``)
    from ``new_tokens`` ``(steps * mtp, n_layers, entry_bytes)`` uint8 (``None``: nothing is appended, then no step
    may select a token past the prefill). ``verify=True`` compares the rows each step loaded with their host copies
    and raises ``RuntimeError`` on a difference.

    Every argument is checked here, before anything changes (and before the first step is asked for); a transfer
    that fails part-way (``TransferError``) leaves the steps before it done."""
    from .traces import Trace
    if not isinstance(trace, Trace):
        raise TypeError(f"trace must be an ess.traces.Trace, got {type(trace).__name__}")
    warmup = validate.boolean("warmup", warmup)
    verify = validate.boolean("verify", verify)
    _check_cache(cache, warmup, verify)
    n_tok = cache.n_tokens(request_id)                                 # ValueError for an unknown request
    batch_index = validate.integer("batch_index", batch_index, lo=0, below=trace.batch)
    if trace.n_layers != cache.n_layers:
        raise ValueError(f"trace has {trace.n_layers} layers, the cache {cache.n_layers}: one trace layer drives "
                         f"one cache layer")
    if trace.context_len != n_tok:
        raise ValueError(f"trace starts at context_len={trace.context_len} tokens but request {request_id!r} "
                         f"holds {n_tok}")
    steps = trace.indices[batch_index]                                 # (n_layers, steps, width)
    windows = trace.windows[batch_index] if trace.windows is not None else None
    if warmup and windows is None:
        raise ValueError("warmup=True but the trace has no warmup windows (pass warmup=False)")
    sizes = [int((steps >= 0).sum(axis=-1).max())] + ([windows.shape[-1]] if warmup else [])
    if max(sizes) > cache.capacity:
        raise ValueError(f"trace selects up to {max(sizes)} entries per step but the pool has capacity="
                         f"{cache.capacity} slots")
    n_new = trace.steps * trace.mtp
    if new_tokens is None:
        if steps.max(initial=-1) >= n_tok:
            raise ValueError(f"new_tokens is None but the trace selects token {int(steps.max())}, past the "
                             f"{n_tok} tokens of the prefill: pass the decoded tokens' entries")
    else:
        new_tokens = validate.entries("new_tokens", new_tokens, (cache.n_layers, cache.entry_bytes), ndim=3,
                                      shape_doc=f"(steps * mtp, {cache.n_layers}, {cache.entry_bytes})")
        if new_tokens.shape[0] != n_new:
            raise ValueError(f"new_tokens must hold steps * mtp = {n_new} tokens, got {new_tokens.shape[0]}")
    return _replay(cache, request_id, steps, windows if warmup else None, trace, new_tokens, verify)


def _replay(cache, request_id, steps, windows, trace, new_tokens, verify):
    """The steps of :func:`replay_trace`, its arguments checked (``windows`` None: no warmup)."""
    if windows is not None:
        for layer in range(cache.n_layers):
            cache.warmup(request_id, layer, windows[layer])
    for t in range(trace.steps):
        n0 = len(cache.metrics)
        for layer in range(cache.n_layers):
            plan = cache.plan(request_id, layer, steps[layer, t])
            cache.copy(plan)
            res = cache.commit(plan)
            if verify and res.n_misses:
                got = cache.device_rows(res.slots[res.miss_pos])
                want = cache.host.entries(request_id)[layer][res.indices[res.miss_pos]]
                if not np.array_equal(got, want):
                    raise RuntimeError(f"request {request_id!r} layer {layer} step {t}: rows loaded into the "
                                       f"device pool differ from their host copies")
        if new_tokens is not None:
            for j in range(trace.mtp):
                cache.append_token(request_id, new_tokens[t * trace.mtp + j])
        yield cache.metrics.records[n0:]


def run_trace(cache, trace, request_id, *, batch_index: int = 0, warmup: bool = True, new_tokens=None,
              verify: bool = False):
    """Replay one request of ``trace`` through ``cache`` to the end (:func:`replay_trace`, whose arguments these
    are) and return the metrics records the replay added, warmup included (a DataFrame with the columns of
    :meth:`ess.metrics.MetricsLog.to_frame`)."""
    it = replay_trace(cache, trace, request_id, batch_index=batch_index, warmup=warmup, new_tokens=new_tokens,
                      verify=verify)
    start = len(cache.metrics)
    for _ in it:
        pass
    return cache.metrics.to_frame(start)


def replay_steps(cache, trace, request_id, *, h2d: LinkModel | None = None, d2h: LinkModel | None = None,
                 compute_s_per_layer: float = COMPUTE_S_PER_LAYER, batch_index: int = 0, warmup: bool = True,
                 new_tokens=None, verify: bool = False) -> Iterator[StepRow]:
    """A source of rows for the monitor (:mod:`ess.monitor`): one request of ``trace`` replayed through ``cache``
    (:func:`replay_trace`, whose arguments these are and which checks them here, before anything runs), one
    :class:`ess.metrics.StepRow` per decode step as it finishes, steps counted from 1.

    Timing is modelled, not measured: the misses cross the ``h2d`` link (default FlashTrans host to device,
    ``data/hardware/links.yaml``) and the new tokens the ``d2h`` link (FlashTrans device to host) at their
    bandwidths; every layer computes for ``compute_s_per_layer`` (default :data:`COMPUTE_S_PER_LAYER`) and waits for
    its misses first (no overlap: ``stall_s`` is the host-to-device time); ``step_s`` = layers x compute + stall +
    the write-back; ``link_busy_s`` the host-to-device time."""
    h2d = link_model("flashtrans_h2d") if h2d is None else h2d
    d2h = link_model("flashtrans_d2h") if d2h is None else d2h
    for name, link in (("h2d", h2d), ("d2h", d2h)):
        if not isinstance(link, LinkModel):
            raise TypeError(f"{name} must be an ess.metrics.LinkModel, got {type(link).__name__}")
    compute = validate.real("compute_s_per_layer", compute_s_per_layer, lo=0.0, lo_open=True)
    steps = replay_trace(cache, trace, request_id, batch_index=batch_index, warmup=warmup, new_tokens=new_tokens,
                         verify=verify)
    return _rows(steps, cache.n_layers, h2d, d2h, compute)


def _rows(steps, n_layers: int, h2d: LinkModel, d2h: LinkModel, compute: float) -> Iterator[StepRow]:
    for t, records in enumerate(steps, start=1):
        hits, misses = [0] * n_layers, [0] * n_layers
        b_h2d = b_d2h = 0
        for r in records:
            if r.kind == "step":
                hits[r.layer] += r.hits
                misses[r.layer] += r.misses
            b_h2d += r.bytes_h2d
            b_d2h += r.bytes_d2h
        stall = h2d.transfer_s(b_h2d)
        yield StepRow(t, n_layers * compute + stall + d2h.transfer_s(b_d2h), stall, stall, b_h2d, b_d2h,
                      tuple(hits), tuple(misses))
