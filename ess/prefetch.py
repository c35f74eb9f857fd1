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
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from .policies import DEFAULT_HEAT_DECAY, SlotPool
from .predict import History, HeatScorer, LSTMHeatPredictor
from .traces import Trace
from .validate import fraction, integer, one_of, positive_int, real

__all__ = ["PrefetchConfig", "PrefetchResult", "simulate_prefetch", "PREDICTORS", "EVICTIONS", "WARMUP_MODES"]

PREDICTORS = ("none", "heat", "lstm")
EVICTIONS = ("lru", "predictor")
WARMUP_MODES = ("none", "before", "delayed")


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


def _pool(steps: np.ndarray, windows: np.ndarray | None, n_pos: int, cfg: PrefetchConfig, scorer) -> dict:
    """One pool (request, layer) over its steps: the slot map and LRU order are :class:`ess.policies.SlotPool`'s
    (``eviction="predictor"`` ranks the victims by the predictor's score instead, ties by token)."""
    C = cfg.capacity
    E = cfg.entry_bytes
    bw = cfg.link_GB_per_s * 1e9
    step_s = cfg.step_time_us * 1e-6
    pool = SlotPool(C, "lru", n_pos)
    pending = np.zeros(n_pos, np.int8)       # 1: prefetched (speculative/delayed) and not used since
    hist = History(n_pos, cfg.history, cfg.decay)
    queue: list[int] = []
    out = dict(accesses=0, hits=0, stall_s=0.0, elapsed_s=0.0, link_busy_s=0.0, bytes_immediate=0,
               bytes_speculative=0, bytes_delayed=0, bytes_prefetched_unused=0)
    T = steps.shape[0]
    miss_t = np.zeros(T, np.int64)
    stall_t = np.zeros(T)

    def scores(cand):
        return scorer.score(hist, cand) if scorer is not None else np.zeros(cand.size)

    def forget(tokens):
        out["bytes_prefetched_unused"] += int(pending[tokens].sum()) * E
        pending[tokens] = 0

    def load(tokens):
        """Plan, evict (LRU or predictor) and commit ``tokens``; returns the plan."""
        plan = pool.plan(tokens, rank=scores if cfg.eviction == "predictor" else None)
        forget(pool.token_of[plan.victims])
        pool.commit(plan)
        return plan

    # warmup windows: before decoding (free, like a step each), or queued for the delayed class
    if windows is not None and cfg.warmup_mode != "none":
        for row in windows:
            if cfg.warmup_mode == "before":
                load(row[row >= 0].astype(np.int64))
            else:
                queue.extend(int(x) for x in row[row >= 0])
            hist.observe(row)
        if cfg.warmup_mode == "delayed":                                   # each entry once, latest window last
            seen, q = set(), []
            for x in reversed(queue):
                if x not in seen:
                    seen.add(x)
                    q.append(x)
            queue = q[::-1]
    for t in range(T):
        row = steps[t]
        s = row[row >= 0].astype(np.int64)
        if s.size > C:
            raise ValueError(f"step {t} selects {s.size} entries but the pool has {C} slots")
        out["accesses"] += s.size
        pending[s] = 0
        plan = load(s)
        n_miss = plan.n_misses
        out["hits"] += s.size - n_miss
        t_imm = n_miss * E / bw
        out["bytes_immediate"] += n_miss * E
        miss_t[t] = n_miss
        stall_t[t] = t_imm
        hist.observe(row)
        budget = cfg.budget_entries
        busy = t_imm
        # speculative class: predicted next-step entries, in the compute time of this step
        if cfg.speculative and budget > 0 and t + 1 < T:
            n_spec = int(budget * cfg.spec_fraction)
            cand = hist.recent()
            cand = cand[pool.slot_of[cand] < 0]
            if cand.size and n_spec > 0:
                sc = scores(cand)
                order = np.argsort(-sc, kind="stable")[:n_spec]
                cand, sc = cand[order], sc[order]
                free = int((pool.token_of < 0).sum())
                take = list(cand[:free])
                rest, rest_sc = cand[free:], sc[free:]
                if rest.size:
                    res = np.sort(pool.token_of[pool.token_of >= 0])
                    rsc = scores(res)
                    o = np.argsort(rsc, kind="stable")
                    res, rsc = res[o], rsc[o]
                    n_swap = 0
                    while n_swap < min(rest.size, res.size) and rest_sc[n_swap] > rsc[n_swap]:
                        n_swap += 1
                    if n_swap:
                        v = res[:n_swap]
                        forget(v)
                        pool.drop(pool.slot_of[v])
                        take += list(rest[:n_swap])
                take = np.asarray(take, np.int64)
                if take.size:
                    load(take)                                        # into free slots: nothing is evicted
                    pending[take] = 1
                    kept = s[pool.slot_of[s] >= 0]
                    pool.policy.touch(pool.slot_of[kept])            # the step's set stays more recent
                    out["bytes_speculative"] += take.size * E
                    busy += take.size * E / bw
                    budget -= take.size
        # delayed class: background queue, free slots only, entering at the cold end of the LRU order
        if cfg.delayed and queue and budget > 0:
            sent = []
            n_free = int((pool.token_of < 0).sum())
            while queue and len(sent) < budget and len(sent) < n_free:
                x = queue.pop()                       # latest window first: the most useful entries
                if pool.slot_of[x] < 0:
                    sent.append(x)
            if sent:
                sent = np.asarray(sent, np.int64)
                load(sent)
                pool.policy.touch_cold(pool.slot_of[sent])
                pending[sent] = 1
            out["bytes_delayed"] += len(sent) * E
            busy += len(sent) * E / bw
        out["stall_s"] += t_imm
        out["elapsed_s"] += t_imm + step_s
        out["link_busy_s"] += busy
    out["bytes_prefetched_unused"] += int(pending.sum()) * E
    out["misses"] = miss_t
    out["stalls"] = stall_t
    return out


def _distinct(name: str, values: Any, n: int) -> list[int]:
    """A selection of distinct indices in ``[0, n)`` (no negative index from the end, no repeat, no bool)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray, range)):
        raise TypeError(f"{name} must be a sequence of integers, got {type(values).__name__}")
    out = [integer(f"{name}[{i}]", v, lo=0, below=n) for i, v in enumerate(values)]
    if len(set(out)) != len(out):
        raise ValueError(f"{name} must not repeat an index (each pool is counted once), got {list(values)}")
    return out


def simulate_prefetch(trace: Trace, config: PrefetchConfig, *, predictor: LSTMHeatPredictor | None = None,
                      requests: Sequence[int] | None = None, layers: Sequence[int] | None = None) -> PrefetchResult:
    """Run the classes over the chosen pools of ``trace`` (all by default) and sum their figures."""
    if not isinstance(trace, Trace):
        raise TypeError(f"trace must be an ess.traces.Trace, got {type(trace).__name__}")
    if not isinstance(config, PrefetchConfig):
        raise TypeError(f"config must be a PrefetchConfig, got {type(config).__name__}")
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
            r = _pool(trace.indices[b, layer], windows, trace.n_positions, config, scorer)
            misses += r.pop("misses")
            stalls += r.pop("stalls")
            for k, v in r.items():
                tot[k] = tot.get(k, 0) + v
            n += 1
    if n == 0:
        raise ValueError("no pool selected (requests and layers must not be empty)")
    return PrefetchResult(config=asdict(config), pools=n, steps=trace.steps, misses_per_step=misses,
                          stall_per_step_s=stalls, **tot)
