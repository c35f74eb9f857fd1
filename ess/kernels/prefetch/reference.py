"""The reference of the prefetch pool, written to be read: one pool (one request, one layer) over its steps on
:class:`ess.policies.SlotPool` under LRU, with any predictor (a scorer with ``score(history, tokens)``: the heat
scorer or the LSTM) and either eviction (LRU, or the predictor's lowest score first)::

    pool(steps, windows, n_pos, cfg, scorer) -> dict

    steps    (T, W) integer   the positions each step selects, -1 = padding
    windows  (W', K) integer  the LRU-Warmup windows, or None
    n_pos    int              positions are < n_pos
    cfg      ess.prefetch.PrefetchConfig (its fields are read)
    scorer   the predictor's scorer (None: predictor "none")

Returns the totals of :class:`ess.prefetch.PrefetchResult` for this pool (``accesses``, ``hits``, ``stall_s`` ...)
plus ``misses`` and ``stalls``, (T,) per step. :mod:`ess.prefetch` explains the three classes; its
:func:`ess.prefetch.simulate_prefetch` validates and sums the pools.
"""
from __future__ import annotations

import numpy as np

from ...heat_predictor import History
from ...policies import SlotPool, first_in_order

__all__ = ["pool", "delayed_queue"]


def delayed_queue(windows: np.ndarray) -> np.ndarray:
    """The delayed class's queue of warmup entries: each entry once, at its last occurrence (the latest window
    last; the queue is sent from its end)."""
    rev = windows[windows >= 0].astype(np.int64)[::-1]
    return rev[np.sort(np.unique(rev, return_index=True)[1])][::-1]


def pool(steps: np.ndarray, windows: np.ndarray | None, n_pos: int, cfg, scorer) -> dict:
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
            queue = delayed_queue(windows)
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
