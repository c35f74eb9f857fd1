"""Numba kernel of the prefetch pool (CPU) for LRU eviction with no predictor or the heat one, the same step for
step as :mod:`.reference` (same signature, same result; tested miss for miss)::

    pool(steps, windows, n_pos, cfg, scorer=None) -> dict

The LRU order is a doubly linked list over the slots 0..C-1 with the sentinel H = C (:mod:`ess.kernels.lru_list`:
nxt[H] the least recent, prv[H] the most recent; prv[x] = -1: slot x is not in the list). It is the order of the
reference's stamps (unique among resident slots: touch counts up, touch_cold counts down below all), kept in O(1)
per move.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..lru_list import empty, touch, unlink_if_linked
from .reference import delayed_queue

__all__ = ["pool", "applies"]


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
def _pool(steps, before, observed, queue, n_pos, C, E, bw, step_s, speculative, delayed, budget0, spec_fraction,
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


def applies(cfg) -> bool:
    """Whether the kernel simulates ``cfg``: LRU eviction, with no predictor or the heat one."""
    return cfg.eviction == "lru" and cfg.predictor in ("none", "heat")


_OUT = ("accesses", "hits", "stall_s", "elapsed_s", "link_busy_s", "bytes_immediate", "bytes_speculative",
        "bytes_delayed", "bytes_prefetched_unused")


def pool(steps, windows, n_pos, cfg, scorer=None) -> dict:
    """:func:`ess.kernels.prefetch.reference.pool` for a ``cfg`` the kernel :func:`applies` to (same arguments, same
    result); ``scorer`` is not called: the kernel keeps the heat history itself (:class:`ess.heat_predictor.History`'s
    arithmetic, in float32)."""
    if not applies(cfg):
        raise ValueError("the Numba prefetch kernel simulates LRU eviction with predictor 'none' or 'heat'")
    valid = (steps >= 0).sum(axis=1)
    if valid.size and valid.max() > cfg.capacity:
        t = int(np.argmax(valid > cfg.capacity))
        raise ValueError(f"step {t} selects {int(valid[t])} entries but the pool has {cfg.capacity} slots")
    mode = cfg.warmup_mode if windows is not None else "none"
    empty = np.empty((0, 1), np.int64)
    before = np.ascontiguousarray(windows, np.int64) if mode == "before" else empty
    observed = np.ascontiguousarray(windows, np.int64) if mode == "delayed" else empty
    queue = delayed_queue(windows) if mode == "delayed" else np.empty(0, np.int64)
    counts, floats, misses, stalls = _pool(
        np.ascontiguousarray(steps, np.int64), before, observed, queue, int(n_pos), int(cfg.capacity),
        int(cfg.entry_bytes), float(cfg.link_GB_per_s * 1e9), float(cfg.step_time_us * 1e-6), bool(cfg.speculative),
        bool(cfg.delayed), int(cfg.budget_entries), float(cfg.spec_fraction), int(cfg.history), float(cfg.decay))
    out = {k: int(v) for k, v in zip(("accesses", "hits", "bytes_immediate", "bytes_speculative", "bytes_delayed",
                                      "bytes_prefetched_unused"), counts)}
    out.update(zip(("stall_s", "elapsed_s", "link_busy_s"), (float(v) for v in floats)))
    return {**{k: out[k] for k in _OUT}, "misses": misses, "stalls": stalls}
