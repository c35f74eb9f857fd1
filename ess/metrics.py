"""The records of what moved: the tiered cache's per-event log, the decode engine's per-step log and per-operation
timer, and the link model that turns bytes into seconds. (Following a run while it goes is :mod:`ess.monitor`'s
job; this module only holds the records.)

:class:`ess.storage.TieredCache` appends one :class:`StepMetrics` per event to its :class:`MetricsLog`:

* ``"step"``    a decode step of one layer: hits, misses, bytes host->device (the misses);
* ``"warmup"``  one LRU-Warmup window (loads, not counted as misses of the decode);
* ``"append"``  the write-back of one new token (bytes device->host, all layers in one record, ``layer = -1``);
* ``"restore"`` the device pool of a request rebuilt from host memory after a restore from disk.

The link utilisation of an interval is the bytes moved over the link's bandwidth times the interval.

A decode engine adds two things, so that a monitoring view can follow a run while it decodes:

* :class:`OpTimer` where the time of each step goes: one :class:`OpRecord` per operation, layer and step on the
  compute lane (``indexer``, ``plan``, ``attn_hits``, ``wait_h2d`` ...), beside the link's own records
  (:class:`ess.link.Transfer`);
* :class:`DecodeStepMetrics` one record per decode step (hits and misses per layer, bytes both ways, link busy
  time and utilisation, stall, step time, schedule) in a :class:`DecodeMetricsLog`, which calls every subscriber
  (:meth:`DecodeMetricsLog.subscribe`) with each new record.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Callable

from .specs import link_figures
from .validate import boolean, integer, one_of, real, request_id as _request_id

__all__ = ["STEP_KINDS", "StepMetrics", "MetricsLog", "LinkModel", "link_model", "OpRecord", "OpTimer", "StepRow",
           "DecodeStepMetrics",
           "DecodeMetricsLog"]


STEP_KINDS = ("step", "warmup", "append", "restore")


@dataclass(frozen=True)
class StepMetrics:
    """One event of the tiered cache: ``kind`` (one of :data:`STEP_KINDS`), the ``request_id`` (int or str),
    ``layer`` (-1: all layers), the pool's decode ``step``, ``hits``, ``misses``, bytes both ways (integers >= 0)."""

    kind: str
    request_id: object
    layer: int
    step: int
    hits: int
    misses: int
    bytes_h2d: int
    bytes_d2h: int

    def __post_init__(self):
        one_of("kind", self.kind, STEP_KINDS)
        object.__setattr__(self, "request_id", _request_id("request_id", self.request_id))
        object.__setattr__(self, "layer", integer("layer", self.layer, lo=-1))
        for name in ("step", "hits", "misses", "bytes_h2d", "bytes_d2h"):
            object.__setattr__(self, name, integer(name, getattr(self, name), lo=0))


class MetricsLog:
    """An append-only list of :class:`StepMetrics` with pandas views."""

    def __init__(self):
        self.records: list[StepMetrics] = []

    def add(self, record: StepMetrics) -> None:
        if not isinstance(record, StepMetrics):
            raise TypeError(f"record must be an ess.metrics.StepMetrics, got {type(record).__name__}")
        self.records.append(record)

    def __len__(self) -> int:
        return len(self.records)

    def clear(self) -> None:
        self.records.clear()

    def to_frame(self, start: int = 0):
        """The records from number ``start`` on (default all) as a DataFrame, one row per record."""
        import pandas as pd
        start = integer("start", start, lo=0, below=len(self.records) + 1)
        cols = ["kind", "request_id", "layer", "step", "hits", "misses", "bytes_h2d", "bytes_d2h"]
        return pd.DataFrame([asdict(r) for r in self.records[start:]], columns=cols)

    def totals(self) -> dict:
        """Sums over all records, by kind, as ``{kind: {hits, misses, bytes_h2d, bytes_d2h}}``."""
        out: dict = {}
        for r in self.records:
            t = out.setdefault(r.kind, {"hits": 0, "misses": 0, "bytes_h2d": 0, "bytes_d2h": 0})
            t["hits"] += r.hits
            t["misses"] += r.misses
            t["bytes_h2d"] += r.bytes_h2d
            t["bytes_d2h"] += r.bytes_d2h
        return out

    def per_step(self):
        """Decode steps summed over layers and requests: one row per step number, with the write-back bytes of
        the token appended after that step (the ``append`` record with the same step number)."""
        df = self.to_frame()
        steps = df[df.kind == "step"].groupby("step")[["hits", "misses", "bytes_h2d"]].sum()
        app = df[df.kind == "append"].groupby("step")[["bytes_d2h"]].sum()
        return steps.join(app, how="left").fillna(0).astype("int64").reset_index()

    def link_utilisation(self, link: "LinkModel", step_time_s: float):
        """:meth:`per_step` with the share of ``link`` each step's host->device and device->host bytes use when a
        decode step lasts ``step_time_s`` (``h2d_utilisation``, ``d2h_utilisation``; above 1: the link is too slow
        for that step time)."""
        if not isinstance(link, LinkModel):
            raise TypeError(f"link must be an ess.metrics.LinkModel, got {type(link).__name__}")
        step_time_s = real("step_time_s", step_time_s, lo=0.0, lo_open=True)
        df = self.per_step()
        df["h2d_utilisation"] = [link.utilisation(b, step_time_s) for b in df.bytes_h2d]
        df["d2h_utilisation"] = [link.utilisation(b, step_time_s) for b in df.bytes_d2h]
        return df


@dataclass(frozen=True)
class LinkModel:
    """A host-device link moving ``bandwidth_GB_per_s`` (GB = 1e9 B) in one direction."""

    name: str
    bandwidth_GB_per_s: float
    source: str = ""

    def __post_init__(self):
        real("LinkModel.bandwidth_GB_per_s", self.bandwidth_GB_per_s, lo=0.0, lo_open=True)
        for name in ("name", "source"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"LinkModel.{name} must be a str, got {type(getattr(self, name)).__name__}")

    def transfer_s(self, n_bytes: float) -> float:
        """Seconds to move ``n_bytes`` (a finite number >= 0) at full bandwidth."""
        return real("n_bytes", n_bytes, lo=0.0) / (self.bandwidth_GB_per_s * 1e9)

    def utilisation(self, n_bytes: float, interval_s: float) -> float:
        """Share of the link's capacity used when ``n_bytes`` cross it within ``interval_s`` (may exceed 1: the
        link cannot keep up)."""
        interval_s = real("interval_s", interval_s, lo=0.0, lo_open=True)
        return self.transfer_s(n_bytes) / interval_s


_LINKS = {
    "flashtrans_h2d": ("flashtrans", "h2d_GB_per_s"),
    "flashtrans_d2h": ("flashtrans", "d2h_GB_per_s"),
    "memcpy_per_entry_h2d": ("flashtrans", "memcpy_per_entry_h2d_GB_per_s"),
    "memcpy_per_entry_d2h": ("flashtrans", "memcpy_per_entry_d2h_GB_per_s"),
    "pcie5_x16": ("pcie", "gen5_x16_GB_per_s_per_direction"),
    "pcie4_x16": ("pcie", "gen4_x16_GB_per_s_per_direction"),
}


def link_model(name: str = "flashtrans_h2d") -> LinkModel:
    """A link preset from ``data/hardware/links.yaml``: one of ``flashtrans_h2d``, ``flashtrans_d2h``,
    ``memcpy_per_entry_h2d``, ``memcpy_per_entry_d2h``, ``pcie5_x16``, ``pcie4_x16``."""
    one_of("link", name, sorted(_LINKS))
    group, field = _LINKS[name]
    return LinkModel(name, float(link_figures()[group][field]), f"data/hardware/links.yaml {group}.{field}")


# ----------------------------------------------------------------------------------------------------------------
# A decode engine's timing and per-step metrics
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OpRecord:
    """One operation on the compute lane: decode ``step``, ``layer`` (-1 outside the layers), ``op`` name,
    ``start_s`` and ``end_s`` on the timer's clock."""

    step: int
    layer: int
    op: str
    start_s: float
    end_s: float


class OpTimer:
    """Times operations with :meth:`span` (a context manager) into ``records``; ``step`` is set by the caller.
    ``enabled=False`` times nothing (the spans cost one attribute check). ``clock``: :func:`time.perf_counter`
    (wall time) or another clock, e.g. :func:`time.thread_time` (the calling thread's CPU time)."""

    def __init__(self, enabled: bool = True, clock=time.perf_counter):
        self.enabled = boolean("enabled", enabled)
        if not callable(clock):
            raise TypeError(f"clock must be a function returning seconds, got {type(clock).__name__}")
        self.clock = clock
        self.step = 0
        self.records: list[OpRecord] = []

    def span(self, op: str, layer: int = -1):
        """A context that times ``op`` of ``layer`` (-1: not a layer's); its arguments are checked when it is made."""
        if not isinstance(op, str):
            raise TypeError(f"op must be an operation's name (str), got {type(op).__name__}")
        return self._span(op, integer("layer", layer, lo=-1))

    @contextmanager
    def _span(self, op: str, layer: int):
        if not self.enabled:
            yield
            return
        t0 = self.clock()
        try:
            yield
        finally:
            self.records.append(OpRecord(self.step, layer, op, t0, self.clock()))

    def add(self, op: str, layer: int, start_s: float, end_s: float) -> None:
        """Record an interval measured elsewhere (e.g. a wait): ``start_s <= end_s``, finite, on the timer's clock."""
        if not isinstance(op, str):
            raise TypeError(f"op must be an operation's name (str), got {type(op).__name__}")
        integer("layer", layer, lo=-1)
        if real("end_s", end_s) < real("start_s", start_s):
            raise ValueError(f"end_s must be >= start_s, got {end_s} < {start_s}")
        if self.enabled:
            self.records.append(OpRecord(self.step, layer, op, start_s, end_s))

    def to_frame(self):
        """One row per record with ``seconds`` = end - start."""
        import pandas as pd
        df = pd.DataFrame([asdict(r) for r in self.records], columns=["step", "layer", "op", "start_s", "end_s"])
        df["seconds"] = df.end_s - df.start_s
        return df


@dataclass(frozen=True)
class StepRow:
    """One decode step of a batch, what a live view follows (:mod:`ess.monitor`): ``step`` (its number),
    ``step_s`` (seconds it took), ``stall_s`` (seconds the compute lane waited for the link), ``link_busy_s``
    (seconds the link moved bytes during the step), ``bytes_h2d``/``bytes_d2h`` moved, ``hits``/``misses`` per
    layer (summed over the batch, tuples of n_layers)."""

    step: int
    step_s: float
    stall_s: float
    link_busy_s: float
    bytes_h2d: int
    bytes_d2h: int
    hits: tuple
    misses: tuple

    @property
    def link_utilisation(self) -> float:
        """Share of the step the link was busy."""
        return self.link_busy_s / self.step_s if self.step_s > 0 else 0.0

    @property
    def hit_rate(self) -> float:
        """Hits over the entries read, all layers (1 when nothing was read)."""
        n = sum(self.hits) + sum(self.misses)
        return sum(self.hits) / n if n else 1.0


@dataclass(frozen=True)
class DecodeStepMetrics(StepRow):
    """A :class:`StepRow` of the decode engine, with its ``schedule``, ``batch`` and ``context_len``."""

    schedule: str = ""
    batch: int = 0
    context_len: int = 0


@dataclass
class DecodeMetricsLog:
    """Per-step records of a decode run; every subscriber is called with each record as it is added (a live view
    subscribes with :meth:`subscribe`)."""

    records: list = field(default_factory=list)
    subscribers: list = field(default_factory=list)

    def subscribe(self, callback: Callable[[DecodeStepMetrics], None]) -> None:
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        self.subscribers.append(callback)

    def add(self, record: DecodeStepMetrics) -> None:
        if not isinstance(record, StepRow):
            raise TypeError(f"record must be an ess.metrics.StepRow (a DecodeStepMetrics), got {type(record).__name__}")
        self.records.append(record)
        for fn in self.subscribers:
            fn(record)

    def __len__(self) -> int:
        return len(self.records)

    def to_frame(self):
        """One row per step: the scalar fields, ``link_utilisation``, and the totals of hits and misses."""
        import pandas as pd
        rows = []
        for r in self.records:
            d = asdict(r)
            hits, misses = d.pop("hits"), d.pop("misses")
            rows.append({**d, "hits": int(sum(hits)), "misses": int(sum(misses)),
                         "link_utilisation": r.link_utilisation})
        return pd.DataFrame(rows)

    def per_layer(self):
        """Hits and misses per (step, layer): one row each."""
        import pandas as pd
        rows = [{"step": r.step, "layer": l, "hits": int(h), "misses": int(m)}
                for r in self.records for l, (h, m) in enumerate(zip(r.hits, r.misses))]
        return pd.DataFrame(rows, columns=["step", "layer", "hits", "misses"])
