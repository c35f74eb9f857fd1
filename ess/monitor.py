"""Following a decode while it runs: per-step metric rows from a source, gathered into series a live view draws.

**The protocol.** A *row* describes one decode step of the whole batch; it is any object with these attributes
(:data:`ROW_FIELDS`):

========================  ===========================================================================
``step``                  int, the step's number (increasing)
``step_s``                float > 0, seconds the step took
``stall_s``               float >= 0, seconds the compute waited for the link within the step
``link_busy_s``           float >= 0, seconds the host-to-device link moved bytes within the step
``bytes_h2d``             int >= 0, bytes copied host to device (the misses)
``bytes_d2h``             int >= 0, bytes written back device to host (the new tokens)
``hits``, ``misses``      one int >= 0 per layer (summed over the batch's requests), same length every step
========================  ===========================================================================

:class:`ess.metrics.StepRow` is the row; the decode engine's per-step record (:class:`ess.metrics.DecodeStepMetrics`)
is one, its steps counted from 0 (the trace replay's from 1). To follow the engine, pass
``on_step=monitor.update`` to :meth:`ess.engine.DecodeEngine.decode`. A
*source* hands rows over in one of two ways: an iterable of rows (:meth:`StepSeries.follow` or
:meth:`ess.widgets.monitor.LiveMonitor.follow` pull them), or a producer that calls a callback with each new row
(pass ``series.add`` or ``monitor.update``, e.g. to a metrics log's ``subscribe``). Derived per step: link
utilisation = ``link_busy_s / step_s``, hit rate = sum(hits) / (sum(hits) + sum(misses)).

:func:`replay_steps` is a source now: a :class:`ess.traces.Trace` replayed through a
:class:`ess.storage.TieredCache` (real bytes, real copies), timed by a link model (the bytes over the link's
bandwidth) and a compute time per layer, with no overlap of the copies with compute (a miss stalls the step).
"""
from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

from .metrics import LinkModel, StepRow, link_model
from .validate import real

__all__ = ["ROW_FIELDS", "StepRow", "StepSeries", "check_row", "replay_steps", "COMPUTE_S_PER_LAYER"]

ROW_FIELDS = ("step", "step_s", "stall_s", "link_busy_s", "bytes_h2d", "bytes_d2h", "hits", "misses")
# [derived] compute time of one step of one (request, layer): 73.3 ms step / 61 layers / batch 52 (paper Table 2,
# paper-facts.md), the figure ess.prefetch.PrefetchConfig.step_time_us uses
COMPUTE_S_PER_LAYER = 23.1e-6


def check_row(row, n_layers: int | None = None) -> StepRow:
    """``row`` as a :class:`StepRow`, checked: ``TypeError`` when an attribute of :data:`ROW_FIELDS` is missing
    or not a number, ``ValueError`` for a value out of range or ``n_layers`` per-layer counts not matching."""
    missing = [f for f in ROW_FIELDS if not hasattr(row, f)]
    if missing:
        raise TypeError(f"a metrics row needs the attributes {ROW_FIELDS}; {type(row).__name__} lacks {missing}")
    try:
        hits = tuple(int(h) for h in row.hits)
        misses = tuple(int(m) for m in row.misses)
    except TypeError:
        raise TypeError("a metrics row's hits and misses must be sequences of integers, one per layer") from None
    if len(hits) != len(misses) or (n_layers is not None and len(hits) != n_layers):
        raise ValueError(f"a metrics row must count hits and misses for each of the {n_layers or len(hits)} layers, "
                         f"got {len(hits)} and {len(misses)}")
    if min(hits + misses, default=0) < 0:
        raise ValueError("a metrics row's hits and misses must be >= 0")
    out = StepRow(int(row.step), real("step_s", row.step_s, lo=0.0, lo_open=True),
                      real("stall_s", row.stall_s, lo=0.0), real("link_busy_s", row.link_busy_s, lo=0.0),
                      int(row.bytes_h2d), int(row.bytes_d2h), hits, misses)
    if out.bytes_h2d < 0 or out.bytes_d2h < 0:
        raise ValueError("a metrics row's bytes must be >= 0")
    return out


class StepSeries:
    """The rows seen so far, as arrays a figure can draw. ``total_steps`` (optional) is how many the source will
    give (the progress); ``n_layers`` is fixed by the first row when not given."""

    def __init__(self, total_steps: int | None = None, n_layers: int | None = None):
        self.total_steps = total_steps
        self.n_layers = n_layers
        self.rows: list[StepRow] = []

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, row) -> StepRow:
        """Append one row (checked; its step must follow the last one's). A callback for a producer."""
        r = check_row(row, self.n_layers)
        if self.rows and r.step <= self.rows[-1].step:
            raise ValueError(f"step {r.step} does not follow step {self.rows[-1].step}")
        self.n_layers = len(r.hits)
        self.rows.append(r)
        return r

    def follow(self, rows: Iterable) -> Iterator[StepRow]:
        """Add each row of ``rows`` as it comes, yielding it (a generator: the caller redraws between rows)."""
        for row in rows:
            yield self.add(row)

    def frame(self):
        """One row per step: the fields, ``hits`` and ``misses`` summed over layers, ``link_utilisation`` and
        ``hit_rate`` (a pandas DataFrame)."""
        import pandas as pd
        cols = ["step", "step_s", "stall_s", "link_busy_s", "bytes_h2d", "bytes_d2h", "hits", "misses",
                "link_utilisation", "hit_rate"]
        return pd.DataFrame([(r.step, r.step_s, r.stall_s, r.link_busy_s, r.bytes_h2d, r.bytes_d2h, sum(r.hits),
                              sum(r.misses), r.link_utilisation, r.hit_rate) for r in self.rows], columns=cols)

    def misses_by_layer(self) -> np.ndarray:
        """(layers, steps) misses."""
        return np.array([r.misses for r in self.rows], dtype=np.int64).T.reshape(self.n_layers or 0, len(self.rows))

    def totals(self) -> dict:
        """Over every row: steps, hit rate, link utilisation (busy time over elapsed time), stall and elapsed
        seconds, bytes both ways."""
        hits = sum(sum(r.hits) for r in self.rows)
        misses = sum(sum(r.misses) for r in self.rows)
        elapsed = sum(r.step_s for r in self.rows)
        return {"steps": len(self.rows), "hit_rate": hits / (hits + misses) if hits + misses else 1.0,
                "link_utilisation": sum(r.link_busy_s for r in self.rows) / elapsed if elapsed else 0.0,
                "stall_s": sum(r.stall_s for r in self.rows), "elapsed_s": elapsed,
                "bytes_h2d": sum(r.bytes_h2d for r in self.rows), "bytes_d2h": sum(r.bytes_d2h for r in self.rows)}


def replay_steps(cache, trace, request_id, *, h2d: LinkModel | None = None, d2h: LinkModel | None = None,
                 compute_s_per_layer: float = COMPUTE_S_PER_LAYER, batch_index: int = 0, warmup: bool = True,
                 new_tokens=None, verify: bool = False) -> Iterator[StepRow]:
    """A source of rows: one request of ``trace`` replayed through ``cache`` (:meth:`ess.storage.TieredCache.replay_trace`,
    whose arguments these are and which checks them here, before anything runs), one :class:`StepRow` per decode
    step as it finishes.

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
    compute = real("compute_s_per_layer", compute_s_per_layer, lo=0.0, lo_open=True)
    steps = cache.replay_trace(trace, request_id, batch_index=batch_index, warmup=warmup, new_tokens=new_tokens,
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
