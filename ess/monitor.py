"""Following a decode while it runs: the per-step row protocol, and the series of rows a live view draws.

Monitoring is four modules, one job each:

* :mod:`ess.monitor` (here) what a row is (:data:`ROW_FIELDS`, :func:`check_row`) and :class:`StepSeries`, the rows
  seen so far as arrays and totals;
* the sources of rows: the decode engine's per-step records (:class:`ess.metrics.DecodeStepMetrics`, handed over
  by ``on_step``) and a trace replayed through a cache (:func:`ess.replay.replay_steps`);
* :mod:`ess.viz.monitor` the figure of a series (:func:`~ess.viz.monitor.fig_monitor`);
* :mod:`ess.widgets.monitor` the live widget (:class:`~ess.widgets.monitor.LiveMonitor`): a series, its figure,
  a progress bar, redrawn as rows arrive.

:mod:`ess.metrics` holds the records themselves (the cache's per-event log, the engine's per-step log, the link
model).

**The protocol.** A *row* describes one decode step of the whole batch; it is any object with these attributes
(:data:`ROW_FIELDS`):

========================  ===========================================================================
``step``                  int >= 0, the step's number (increasing)
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
"""
from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

from .metrics import StepRow
from .validate import integer, positive_int, real

__all__ = ["ROW_FIELDS", "StepRow", "StepSeries", "check_row"]

ROW_FIELDS = ("step", "step_s", "stall_s", "link_busy_s", "bytes_h2d", "bytes_d2h", "hits", "misses")
_INT64 = 2 ** 63                      # counts, bytes and step numbers are drawn as int64 arrays


def check_row(row, n_layers: int | None = None) -> StepRow:
    """``row`` as a :class:`StepRow`, checked: ``TypeError`` when an attribute of :data:`ROW_FIELDS` is missing
    or not a number, ``ValueError`` for a value out of range or ``n_layers`` per-layer counts not matching."""
    missing = [f for f in ROW_FIELDS if not hasattr(row, f)]
    if missing:
        raise TypeError(f"a metrics row needs the attributes {ROW_FIELDS}; {type(row).__name__} lacks {missing}")
    if n_layers is not None:
        n_layers = integer("n_layers", n_layers, lo=0)
    hits, misses = _counts("hits", row.hits), _counts("misses", row.misses)
    if len(hits) != len(misses) or (n_layers is not None and len(hits) != n_layers):
        raise ValueError(f"a metrics row must count hits and misses for each of the "
                         f"{len(hits) if n_layers is None else n_layers} layers, "
                         f"got {len(hits)} and {len(misses)}")
    return StepRow(integer("step", row.step, lo=0, below=_INT64), real("step_s", row.step_s, lo=0.0, lo_open=True),
                   real("stall_s", row.stall_s, lo=0.0), real("link_busy_s", row.link_busy_s, lo=0.0),
                   integer("bytes_h2d", row.bytes_h2d, lo=0, below=_INT64),
                   integer("bytes_d2h", row.bytes_d2h, lo=0, below=_INT64), hits, misses)


def _counts(name: str, value) -> tuple:
    """Per-layer counts of a row: a sequence (tuple, list, 1-D integer array) of integers >= 0."""
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise ValueError(f"a metrics row's {name} must be 1-D, one count per layer, got shape {value.shape}")
        value = value.tolist()
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"a metrics row's {name} must be a sequence of integers, one per layer, got "
                        f"{type(value).__name__}")
    return tuple(integer(f"{name}[{i}]", v, lo=0, below=_INT64) for i, v in enumerate(value))


class StepSeries:
    """The rows seen so far, as arrays a figure can draw. ``total_steps`` (optional) is how many the source will
    give (the progress); ``n_layers`` is fixed by the first row when not given."""

    def __init__(self, total_steps: int | None = None, n_layers: int | None = None):
        self.total_steps = None if total_steps is None else positive_int("total_steps", total_steps)
        self.n_layers = None if n_layers is None else positive_int("n_layers", n_layers)
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
        try:
            if isinstance(rows, (str, bytes)):
                raise TypeError
            rows = iter(rows)
        except TypeError:
            raise TypeError(f"rows must be an iterable of metrics rows, got {type(rows).__name__}") from None
        return self._follow(rows)

    def _follow(self, rows: Iterable) -> Iterator[StepRow]:
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
