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

Two implementations of one pool: :func:`_pool`, the reference (NumPy, on :class:`ess.policies.SlotPool`, any
predictor and eviction), and a Numba kernel for LRU eviction with no predictor or the heat predictor, the same step
for step (tested miss for miss against the reference); ``backend="auto"`` takes the kernel where it applies.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from .policies import DEFAULT_HEAT_DECAY, SlotPool, first_in_order
from .heat_predictor import History, HeatScorer, LSTMHeatPredictor
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


def _delayed_queue(windows: np.ndarray) -> np.ndarray:
    """The delayed class's queue of warmup entries: each entry once, at its last occurrence (the latest window
    last; the queue is sent from its end)."""
    rev = windows[windows >= 0].astype(np.int64)[::-1]
    return rev[np.sort(np.unique(rev, return_index=True)[1])][::-1]


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
    queue = np.empty(0, np.int64)            # the delayed class's entries; the last is sent first
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
            hist.observe(row)
        if cfg.warmup_mode == "delayed":
            queue = _delayed_queue(windows)
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
                order = first_in_order((-sc,), n_spec)          # the highest scores first, ties by position
                cand, sc = cand[order], sc[order]
                free = int((pool.token_of < 0).sum())
                take = list(cand[:free])
                rest, rest_sc = cand[free:], sc[free:]
                if rest.size:
                    res = np.sort(pool.token_of[pool.token_of >= 0])
                    rsc = scores(res)
                    o = first_in_order((rsc,), min(rest.size, res.size))     # the lowest resident scores first
                    res, rsc = res[o], rsc[o]
                    beats = rest_sc[:o.size] > rsc                   # swap while the candidate scores higher
                    n_swap = o.size if beats.all() else int(np.argmin(beats))
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
        if cfg.delayed and queue.size and budget > 0:
            # from the end of the queue (latest window first: the most useful entries), the non-resident ones
            # until the budget or the free slots run out; resident ones met on the way leave the queue
            want = min(budget, int((pool.token_of < 0).sum()))
            tail = queue[::-1]
            cum = np.cumsum(pool.slot_of[tail] < 0)
            popped = int(np.searchsorted(cum, want)) + 1 if want and cum[-1] >= want else (tail.size if want else 0)
            sent = tail[:popped][pool.slot_of[tail[:popped]] < 0]
            queue = queue[:queue.size - popped]
            if sent.size:
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
                      requests: Sequence[int] | None = None, layers: Sequence[int] | None = None,
                      backend: str = "auto") -> PrefetchResult:
    """Run the classes over the chosen pools of ``trace`` (all by default) and sum their figures. ``backend``:
    ``"reference"`` (any setting), ``"numba"`` (LRU eviction with no predictor or the heat one) or ``"auto"``
    (the kernel where it applies)."""
    if not isinstance(trace, Trace):
        raise TypeError(f"trace must be an ess.traces.Trace, got {type(trace).__name__}")
    if not isinstance(config, PrefetchConfig):
        raise TypeError(f"config must be a PrefetchConfig, got {type(config).__name__}")
    one_of("backend", backend, BACKENDS)
    if backend == "numba" and not _kernel_applies(config):
        raise ValueError("backend='numba' simulates LRU eviction with predictor 'none' or 'heat'; use 'reference'")
    fast = backend == "numba" or (backend == "auto" and _kernel_applies(config))
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
            r = (_pool_numba(trace.indices[b, layer], windows, trace.n_positions, config) if fast else
                 _pool(trace.indices[b, layer], windows, trace.n_positions, config, scorer))
            misses += r.pop("misses")
            stalls += r.pop("stalls")
            for k, v in r.items():
                tot[k] = tot.get(k, 0) + v
            n += 1
    if n == 0:
        raise ValueError("no pool selected (requests and layers must not be empty)")
    return PrefetchResult(config=asdict(config), pools=n, steps=trace.steps, misses_per_step=misses,
                          stall_per_step_s=stalls, **tot)


# ------------------------------------------------------------------------------------------- the Numba kernel
_OUT = ("accesses", "hits", "stall_s", "elapsed_s", "link_busy_s", "bytes_immediate", "bytes_speculative",
        "bytes_delayed", "bytes_prefetched_unused")


def _kernel_applies(cfg: PrefetchConfig) -> bool:
    return cfg.eviction == "lru" and cfg.predictor in ("none", "heat")


def _pool_numba(steps: np.ndarray, windows: np.ndarray | None, n_pos: int, cfg: PrefetchConfig) -> dict:
    """:func:`_pool` for LRU eviction and no predictor or the heat one, as a Numba kernel (same arguments, same
    result)."""
    valid = (steps >= 0).sum(axis=1)
    if valid.size and valid.max() > cfg.capacity:
        t = int(np.argmax(valid > cfg.capacity))
        raise ValueError(f"step {t} selects {int(valid[t])} entries but the pool has {cfg.capacity} slots")
    mode = cfg.warmup_mode if windows is not None else "none"
    empty = np.empty((0, 1), np.int64)
    before = np.ascontiguousarray(windows, np.int64) if mode == "before" else empty
    observed = np.ascontiguousarray(windows, np.int64) if mode == "delayed" else empty
    queue = _delayed_queue(windows) if mode == "delayed" else np.empty(0, np.int64)
    counts, floats, misses, stalls = _kernel()(
        np.ascontiguousarray(steps, np.int64), before, observed, queue, int(n_pos), int(cfg.capacity),
        int(cfg.entry_bytes), float(cfg.link_GB_per_s * 1e9), float(cfg.step_time_us * 1e-6), bool(cfg.speculative),
        bool(cfg.delayed), int(cfg.budget_entries), float(cfg.spec_fraction), int(cfg.history), float(cfg.decay))
    out = {k: int(v) for k, v in zip(("accesses", "hits", "bytes_immediate", "bytes_speculative", "bytes_delayed",
                                      "bytes_prefetched_unused"), counts)}
    out.update(zip(("stall_s", "elapsed_s", "link_busy_s"), (float(v) for v in floats)))
    return {**{k: out[k] for k in _OUT}, "misses": misses, "stalls": stalls}


@lru_cache(maxsize=None)
def _kernel():
    from numba import njit

    # The LRU order is a doubly linked list over the slots 0..C-1 with the sentinel H = C (ess.lru_list: nxt[H] the
    # least recent, prv[H] the most recent; prv[x] = -1: slot x is not in the list). It is the order of the
    # reference's stamps (unique among resident slots: touch counts up, touch_cold counts down below all), kept in
    # O(1) per move.
    from .lru_list import empty, touch, unlink_if_linked

    @njit(cache=True)
    def load(tokens, slot_of, token_of, prv, nxt, in_s, pending, E, unused):
        """SlotPool.plan + commit under LRU for ``tokens`` (distinct): hits stay, misses take the first free slots,
        then the least recent resident slots not in the set; the victims' prefetch marks are dropped (unused[0]
        += their bytes); every slot of the set becomes the most recent, in order. Returns the misses."""
        n = tokens.size
        C = token_of.size
        H = C
        slots = np.empty(n, np.int64)
        n_miss = 0
        for i in range(n):
            slots[i] = slot_of[tokens[i]]
            if slots[i] < 0:
                n_miss += 1
            else:
                in_s[slots[i]] = True
        fill = np.empty(n_miss, np.int64)
        k = 0
        for j in range(C):                               # free slots first, in slot order
            if k == n_miss:
                break
            if token_of[j] < 0:
                fill[k] = j
                k += 1
        x = nxt[H]
        while k < n_miss:                                # then victims, least recent first
            if not in_s[x]:
                fill[k] = x
                k += 1
                tok = token_of[x]
                unused[0] += pending[tok] * E
                pending[tok] = 0
                slot_of[tok] = -1
            x = nxt[x]
        k = 0
        for i in range(n):
            if slots[i] < 0:
                slots[i] = fill[k]
                token_of[fill[k]] = tokens[i]
                slot_of[tokens[i]] = fill[k]
                k += 1
            else:
                in_s[slots[i]] = False
        touch(prv, nxt, slots, n, True)
        return n_miss

    @njit(cache=True)
    def head_order(keys, n):
        """np.argsort(keys, kind="stable")[:n] without sorting everything (first_in_order's way: only the keys at
        most the n-th smallest are sorted, every tie at it included)."""
        m = keys.size
        if n >= m:
            return np.argsort(keys, kind="mergesort")
        if n <= 0:
            return np.empty(0, np.int64)
        kth = np.partition(keys, n - 1)[n - 1]
        cnt = 0
        for i in range(m):
            if keys[i] <= kth:
                cnt += 1
        near = np.empty(cnt, np.int64)
        j = 0
        for i in range(m):
            if keys[i] <= kth:
                near[j] = i
                j += 1
        return near[np.argsort(keys[near], kind="mergesort")[:n]]

    @njit(cache=True, inline="always")
    def observe(row, heat, last, t_hist, decay32):
        """History.observe: heat decays, then counts the row; last[p] = the observation that last selected p."""
        for p in range(heat.size):
            heat[p] *= decay32
        for x in row:
            if x >= 0:
                heat[x] += np.float32(1.0)
                last[x] = t_hist
        return t_hist + 1

    @njit(cache=True)
    def valid_of(row):
        n = 0
        for x in row:
            if x >= 0:
                n += 1
        out = np.empty(n, np.int64)
        n = 0
        for x in row:
            if x >= 0:
                out[n] = x
                n += 1
        return out

    @njit(cache=True, nogil=True)
    def pool(steps, before, observed, queue, n_pos, C, E, bw, step_s, speculative, delayed, budget0, spec_fraction,
             history, decay):
        slot_of = np.full(n_pos, -1, np.int64)
        token_of = np.full(C, -1, np.int64)
        prv, nxt = empty(C, np.int64)
        in_s = np.zeros(C, np.bool_)
        pending = np.zeros(n_pos, np.int64)
        heat = np.zeros(n_pos, np.float32)
        last = np.full(n_pos, -history - 1, np.int64)
        decay32 = np.float32(decay)
        unused = np.zeros(1, np.int64)
        t_hist = 0
        accesses = hits = b_imm = b_spec = b_del = 0
        stall_s = elapsed_s = busy_s = 0.0
        T = steps.shape[0]
        miss_t = np.zeros(T, np.int64)
        stall_t = np.zeros(T)
        for w in range(before.shape[0]):                 # warmup before decoding: a free load per window
            load(valid_of(before[w]), slot_of, token_of, prv, nxt, in_s, pending, E, unused)
            t_hist = observe(before[w], heat, last, t_hist, decay32)
        for w in range(observed.shape[0]):               # windows queued for the delayed class: seen, not loaded
            t_hist = observe(observed[w], heat, last, t_hist, decay32)
        qn = queue.size
        for t in range(T):
            s = valid_of(steps[t])
            accesses += s.size
            for x in s:
                pending[x] = 0
            n_miss = load(s, slot_of, token_of, prv, nxt, in_s, pending, E, unused)
            hits += s.size - n_miss
            t_imm = n_miss * E / bw
            b_imm += n_miss * E
            miss_t[t] = n_miss
            stall_t[t] = t_imm
            t_hist = observe(steps[t], heat, last, t_hist, decay32)
            budget = budget0
            busy = t_imm
            # speculative class: the recent entries not resident, by heat, into free slots or over colder residents
            if speculative and budget > 0 and t + 1 < T:
                n_spec = int(budget * spec_fraction)
                cand = np.empty(n_pos, np.int64)
                nc = 0
                for p in range(n_pos):                   # selected in one of the last `history` observations
                    if slot_of[p] < 0 and last[p] >= t_hist - history:
                        cand[nc] = p
                        nc += 1
                if nc > 0 and n_spec > 0:
                    cand = cand[:nc]
                    sc = heat[cand].astype(np.float64)
                    order = head_order(-sc, n_spec)      # the highest first, ties by position (stable)
                    cand, sc = cand[order], sc[order]
                    free = 0
                    for j in range(C):
                        if token_of[j] < 0:
                            free += 1
                    n_take = min(free, cand.size)
                    n_swap = 0
                    if cand.size > free:
                        res = np.empty(C, np.int64)
                        nr = 0
                        for p in range(n_pos):           # resident tokens, ascending
                            if slot_of[p] >= 0:
                                res[nr] = p
                                nr += 1
                        res = res[:nr]
                        rsc = heat[res].astype(np.float64)
                        m = min(cand.size - free, nr)
                        o = head_order(rsc, m)           # the m coldest residents, ties by token
                        while n_swap < m and sc[free + n_swap] > rsc[o[n_swap]]:
                            n_swap += 1
                        for i in range(n_swap):          # forget and drop the colder residents
                            v = res[o[i]]
                            unused[0] += pending[v] * E
                            pending[v] = 0
                            sl = slot_of[v]
                            slot_of[v] = -1
                            token_of[sl] = -1
                            unlink_if_linked(prv, nxt, sl)
                    take = np.concatenate((cand[:n_take], cand[free:free + n_swap]))
                    if take.size:
                        load(take, slot_of, token_of, prv, nxt, in_s, pending, E, unused)
                        for x in take:
                            pending[x] = 1
                        kept = np.empty(s.size, np.int64)
                        nk = 0
                        for x in s:
                            if slot_of[x] >= 0:
                                kept[nk] = slot_of[x]
                                nk += 1
                        touch(prv, nxt, kept, nk, True)   # the step's set stays more recent
                        b_spec += take.size * E
                        busy += take.size * E / bw
                        budget -= take.size
            # delayed class: from the end of the queue, into free slots, at the cold end of the LRU order
            if delayed and qn > 0 and budget > 0:
                n_free = 0
                for j in range(C):
                    if token_of[j] < 0:
                        n_free += 1
                want = min(budget, n_free)
                sent = np.empty(want, np.int64)
                ns = 0
                while qn > 0 and ns < want:
                    qn -= 1
                    if slot_of[queue[qn]] < 0:
                        sent[ns] = queue[qn]
                        ns += 1
                if ns:
                    sent = sent[:ns]
                    load(sent, slot_of, token_of, prv, nxt, in_s, pending, E, unused)
                    slots = np.empty(ns, np.int64)
                    for i in range(ns):
                        slots[i] = slot_of[sent[i]]
                        pending[sent[i]] = 1
                    touch(prv, nxt, slots, ns, False)
                b_del += ns * E
                busy += ns * E / bw
            stall_s += t_imm
            elapsed_s += t_imm + step_s
            busy_s += busy
        unused[0] += pending.sum() * E
        counts = np.array([accesses, hits, b_imm, b_spec, b_del, unused[0]], np.int64)
        return counts, np.array([stall_s, elapsed_s, busy_s]), miss_t, stall_t

    return pool
