"""Three prefetch classes sharing one host->device link, simulated step by step over a trace (a class is a kind of
transfer with its priority; "tier" in ``ess`` means where bytes live: GPU, host, disk).

Time line of one step of one pool (one request, one layer)::

    | immediate: this step's misses (the step waits: stall) | compute (step_time): the link is free for ... |
                                                              speculative, then delayed transfers

* **immediate** -- the misses of the step; highest priority, always served, and the step cannot start before they
  arrive (no overlap of transfers with attention: the paper's "no overlap" baseline; the DA/DBA overlaps are
  modelled in the throughput simulator).
* **speculative** -- entries the predictor expects the next step to select, not resident; sent in the link time
  left while the step computes (at most ``spec_fraction`` of it). One is loaded only when the pool has a free slot
  or the predictor scores it above the resident entry it would replace.
* **delayed** -- background work (here: the LRU-Warmup windows when ``warmup_mode="delayed"``), lowest priority,
  uses the remaining link time and only free slots (it never evicts).

The pool is :class:`ess.policies.SlotPool` under LRU (``eviction="predictor"`` ranks the victims by the predictor's
score instead): a step's set is the most recent; speculative loads rank just below it (newer than every earlier
step); delayed loads enter at the cold end of the LRU order, the first sent the warmest.

Per step the link can move ``link_GB_per_s * step_time`` bytes for the two background classes (the per-step budget).
Reported: stall time, hit rate, bytes moved per class, bytes prefetched but never used before eviction or the end,
and link use = busy time / elapsed time (elapsed = stall + compute per step).

Two implementations of one pool, the kernel family :mod:`ess.kernels.prefetch`: the reference (NumPy, on
:class:`ess.policies.SlotPool`, any predictor and eviction), and a Numba kernel for LRU eviction with no predictor or
the heat predictor, the same step for step (tested miss for miss against the reference). ``backend="auto"`` is
resolved by :func:`ess.kernels.resolve_backend` (the Numba kernel on the CPU), and falls back to the reference
where the kernel does not apply.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from .heat_predictor import HeatScorer, LSTMHeatPredictor
from .kernels import prefetch as _kernels
from .kernels import resolve_backend
from .policies import DEFAULT_HEAT_DECAY
from .traces import Trace
from .validate import fraction, integer, one_of, positive_int, real

__all__ = ["PrefetchConfig", "PrefetchResult", "simulate_prefetch", "PREDICTORS", "EVICTIONS", "WARMUP_MODES",
           "BACKENDS"]

PREDICTORS = ("none", "heat", "lstm")
EVICTIONS = ("lru", "predictor")
WARMUP_MODES = ("none", "before", "delayed")
BACKENDS = ("auto", "reference", "numba")


@dataclass(frozen=True)
class PrefetchConfig:
    """One pool's prefetch setting. ``step_time_us``: compute time of one step of one (request, layer) -- the link
    time the background classes may use per step (a per-request share when requests share the link)."""

    capacity: int                          # slots per (request, layer)
    link_GB_per_s: float = 37.0            # [BLOG] FlashTrans H2D (data/hardware/links.yaml)
    step_time_us: float = 23.1             # [derived] 73.3 ms step / 61 layers / batch 52 (paper-facts.md, Table 2)
    entry_bytes: int = 656                 # [FMLA] FP8 latent entry (paper-facts.md, Byte layouts)
    speculative: bool = True
    delayed: bool = True
    predictor: str = "heat"                # "none" | "heat" | "lstm" (an LSTMHeatPredictor must then be given)
    eviction: str = "lru"                  # "lru" | "predictor" (lowest predicted score first)
    warmup_mode: str = "before"            # "none" | "before" (free, before decoding, as the paper) | "delayed"
    spec_fraction: float = 1.0             # share of the per-step link budget the speculative class may take
    history: int = 8                       # steps of history the predictor sees
    decay: float = DEFAULT_HEAT_DECAY      # heat decay per step

    def __post_init__(self) -> None:
        from .validate import boolean
        boolean("speculative", self.speculative)
        boolean("delayed", self.delayed)
        positive_int("capacity", self.capacity)
        real("link_GB_per_s", self.link_GB_per_s, lo=0.0, lo_open=True)
        real("step_time_us", self.step_time_us, lo=0.0, lo_open=True)
        positive_int("entry_bytes", self.entry_bytes)
        one_of("predictor", self.predictor, PREDICTORS)
        one_of("eviction", self.eviction, EVICTIONS)
        one_of("warmup_mode", self.warmup_mode, WARMUP_MODES)
        if self.eviction == "predictor" and self.predictor == "none":
            raise ValueError("eviction='predictor' needs a predictor ('heat' or 'lstm')")
        if self.speculative and self.predictor == "none":
            raise ValueError("the speculative class needs a predictor ('heat' or 'lstm'); set speculative=False")
        fraction("spec_fraction", self.spec_fraction)
        positive_int("history", self.history)
        fraction("decay", self.decay)

    @property
    def budget_entries(self) -> int:
        """Entries the link moves in one step's compute time (the background classes' per-step budget)."""
        return int(self.link_GB_per_s * 1e3 * self.step_time_us // self.entry_bytes)


@dataclass
class PrefetchResult:
    """Totals over every simulated pool, and per-step series summed over pools."""

    config: dict
    pools: int
    steps: int
    accesses: int
    hits: int
    stall_s: float
    elapsed_s: float
    link_busy_s: float
    bytes_immediate: int
    bytes_speculative: int
    bytes_delayed: int
    bytes_prefetched_unused: int
    misses_per_step: np.ndarray = field(repr=False)       # (steps,) summed over pools
    stall_per_step_s: np.ndarray = field(repr=False)      # (steps,)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.accesses if self.accesses else 1.0

    @property
    def bytes_moved(self) -> int:
        return self.bytes_immediate + self.bytes_speculative + self.bytes_delayed

    @property
    def link_use(self) -> float:
        return self.link_busy_s / self.elapsed_s if self.elapsed_s else 0.0

    def summary(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("misses_per_step", "stall_per_step_s", "config")}
        d.update(hit_rate=self.hit_rate, bytes_moved=self.bytes_moved, link_use=self.link_use,
                 misses_per_pool_step=float(self.misses_per_step.sum() / (self.pools * self.steps)))
        return d


def _distinct(name: str, values: Any, n: int) -> list[int]:
    """A selection of distinct indices in ``[0, n)`` (no negative index from the end, no repeat, no bool)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray, range)):
        raise TypeError(f"{name} must be a sequence of integers, got {type(values).__name__}")
    out = [integer(f"{name}[{i}]", v, lo=0, below=n) for i, v in enumerate(values)]
    if len(set(out)) != len(out):
        raise ValueError(f"{name} must not repeat an index (each pool is counted once), got {list(values)}")
    return out


def simulate_prefetch(trace: Trace, config: PrefetchConfig, *, predictor: LSTMHeatPredictor | None = None,
                      requests: Sequence[int] | None = None, layers: Sequence[int] | None = None,
                      backend: str = "auto") -> PrefetchResult:
    """Run the classes over the chosen pools of ``trace`` (all by default) and sum their figures. ``backend``:
    ``"reference"`` (any setting), ``"numba"`` (LRU eviction with no predictor or the heat one) or ``"auto"``
    (:func:`ess.kernels.resolve_backend`'s choice, the Numba kernel, where it applies; the reference elsewhere)."""
    if not isinstance(trace, Trace):
        raise TypeError(f"trace must be an ess.traces.Trace, got {type(trace).__name__}")
    if not isinstance(config, PrefetchConfig):
        raise TypeError(f"config must be a PrefetchConfig, got {type(config).__name__}")
    one_of("backend", backend, BACKENDS)
    be = resolve_backend(backend)                      # "auto": the Numba kernel on the CPU ...
    if be == "numba" and not _kernels.get("numba").applies(config):
        if backend != "auto":
            raise ValueError("backend='numba' simulates LRU eviction with predictor 'none' or 'heat'; use "
                             "'reference'")
        be = "reference"                               # ... where it applies; the reference simulates every setting
    kernel = _kernels.get(be)
    if config.capacity < trace.k:
        raise ValueError(f"capacity ({config.capacity} slots) is smaller than K = {trace.k}")
    if config.warmup_mode != "none" and trace.windows is None:
        raise ValueError(f"warmup_mode={config.warmup_mode!r} but the trace has no warmup windows")
    if config.predictor == "lstm":
        if not isinstance(predictor, LSTMHeatPredictor) or predictor.model is None:
            raise ValueError("predictor='lstm' needs a trained LSTMHeatPredictor (predictor=...)")
        if predictor.history != config.history:
            raise ValueError(f"config.history ({config.history}) must equal the predictor's ({predictor.history})")
        scorer = predictor
    elif config.predictor == "heat":
        scorer = HeatScorer()
    else:
        scorer = None
    requests = range(trace.batch) if requests is None else _distinct("requests", requests, trace.batch)
    layers = range(trace.n_layers) if layers is None else _distinct("layers", layers, trace.n_layers)
    tot: dict[str, Any] = {}
    misses = np.zeros(trace.steps, np.int64)
    stalls = np.zeros(trace.steps)
    n = 0
    for b in requests:
        for layer in layers:
            windows = trace.windows[b, layer] if trace.windows is not None else None
            r = kernel.pool(trace.indices[b, layer], windows, trace.n_positions, config, scorer)
            misses += r.pop("misses")
            stalls += r.pop("stalls")
            for k, v in r.items():
                tot[k] = tot.get(k, 0) + v
            n += 1
    if n == 0:
        raise ValueError("no pool selected (requests and layers must not be empty)")
    return PrefetchResult(config=asdict(config), pools=n, steps=trace.steps, misses_per_step=misses,
                          stall_per_step_s=stalls, **tot)
