"""Numba kernels of the trace-driven cache simulation (CPU), one per policy family, the fast path of the policy
references in :mod:`ess.policies` (:mod:`.reference` runs those references behind the same signature)::

    simulate(seq, n_free, capacity, policy, n_pos, decay, out) -> int

    seq       (T, W) int32   one step's positions per row, -1 = padding, distinct within a row, in [-1, n_pos)
    n_free    int            the first n_free rows are warmup windows: applied like steps, not counted
    capacity  int            slots of the pool
    policy    str            one of ess.policies.POLICIES
    n_pos     int            positions are < n_pos
    decay     float          the heat policy's decay per step (read by "heat" only)
    out       (T - n_free,) int64   misses of each counted row (written)

Returns -1, or the first row whose entries outnumber the slots (the rows before it simulated, ``out`` past it
undefined). The kernels read positions as array indices without bounds checks of their own: the caller
(:func:`ess.cachesim.sequence_misses` and its siblings) checks the range and the distinctness first.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ...policies import POLICIES, SAMPLED_CLOCK_BLOCK, SAMPLED_CLOCK_PROBE, SAMPLED_CLOCK_SAMPLES
# the LRU order: a doubly linked list over positions 0..n_pos-1, sentinel H = n_pos (ess.kernels.lru_list)
from ..lru_list import empty, push_newest, unlink

__all__ = ["simulate"]


@njit(cache=True, inline="always")
def _mark_step(seq, t, mark, res, n_res, capacity):
    """Mark step t's valid entries (mark[x] = t + 1); return (entries, misses, entries to evict)."""
    size = 0
    hits = 0
    for j in range(seq.shape[1]):
        x = seq[t, j]
        if x < 0:
            continue
        size += 1
        mark[x] = t + 1
        if res[x]:
            hits += 1
    return size, size - hits, n_res + size - hits - capacity


@njit(cache=True, nogil=True)
def lru(seq, n_free, capacity, n_pos, out):
    """seq (T, W): rows 0..n_free-1 are warmup (not counted). out (T - n_free,) misses. Returns -1 or bad row."""
    prv, nxt = empty(n_pos, np.int32)
    res = np.zeros(n_pos, np.bool_)
    H = n_pos                                     # sentinel: nxt[H] = least recent, prv[H] = most recent
    n_res = 0
    T, W = seq.shape
    for t in range(T):
        size = 0
        hits = 0
        for j in range(W):
            x = seq[t, j]
            if x < 0:
                continue
            size += 1
            if res[x]:
                hits += 1
                unlink(prv, nxt, x)
        if size > capacity:
            return t
        misses = size - hits
        evict = n_res + misses - capacity
        while evict > 0:                          # the list now holds only residents not in S
            v = nxt[H]
            unlink(prv, nxt, v)
            res[v] = False
            n_res -= 1
            evict -= 1
        for j in range(W):
            x = seq[t, j]
            if x < 0:
                continue
            push_newest(prv, nxt, H, x)
            if not res[x]:
                res[x] = True
                n_res += 1
        if t >= n_free:
            out[t - n_free] = misses
    return -1


# ---- CLOCK and HiSparse's sampled CLOCK: slots in a ring, slot_tok (capacity,) the position each holds (-1
# free), slot_of (n_pos,) the slot of each resident position; free slots fill lowest first (ess.policies.SlotPool)
@njit(cache=True, inline="always")
def _install(x, s, slot_tok, slot_of, res):
    """Position x into slot s; the position it held (if any) leaves the pool."""
    old = slot_tok[s]
    if old >= 0:
        res[old] = False
        slot_of[old] = -1
    slot_tok[s] = x
    slot_of[x] = s
    res[x] = True


@njit(cache=True, inline="always")
def _stamp(seq, t, ref, slot_of, value, resident_only, res):
    """ref[slot of x] = value for every valid x of step t (only those resident now when ``resident_only``)."""
    for j in range(seq.shape[1]):
        x = seq[t, j]
        if x >= 0 and (not resident_only or res[x]):
            ref[slot_of[x]] = value


@njit(cache=True, nogil=True)
def clock(seq, n_free, capacity, n_pos, out):
    """ess.policies.ClockPolicy: each miss (in S order) takes the next free slot, else the hand sweeps the
    ring: a slot selected by this step is passed, a set bit is cleared (second chance), the first clear one is
    the victim and the hand stops past it. Then every entry of S has its bit set. (The reference clears the bits
    of the step's own slots it passes too; the step sets them again, so the result is the same.)"""
    slot_tok = np.full(capacity, -1, np.int64)
    slot_of = np.full(n_pos, -1, np.int64)
    ref = np.zeros(capacity, np.bool_)
    res = np.zeros(n_pos, np.bool_)
    mark = np.zeros(n_pos, np.int64)              # == t + 1: selected by step t
    n_used = 0
    hand = 0
    T, W = seq.shape
    for t in range(T):
        size, misses, _ = _mark_step(seq, t, mark, res, n_used, capacity)
        if size > capacity:
            return t
        for j in range(W):
            x = seq[t, j]
            if x < 0 or res[x]:
                continue
            if n_used < capacity:
                s = n_used
                n_used += 1
            else:
                while True:                       # ends: fewer than capacity slots hold entries of S
                    s = hand
                    hand = hand + 1 if hand + 1 < capacity else 0
                    if mark[slot_tok[s]] == t + 1:
                        continue
                    if ref[s]:
                        ref[s] = False
                        continue
                    break
            _install(x, s, slot_tok, slot_of, res)
        _stamp(seq, t, ref, slot_of, True, False, res)
        if t >= n_free:
            out[t - n_free] = misses
    return -1


@njit(cache=True, nogil=True)
def sampled_clock(seq, n_free, capacity, n_pos, samples, block, probe, out):
    """ess.policies.SampledClockPolicy (SGLang HiSparse's multi-step CLOCK): misses take the free slots first
    (lowest first, in S order); the other m misses, numbered i = 0 .. m-1 in S order, each take the oldest of
    up to ``samples`` positions of its stripe (cursor + i + j m) not stamped with this step, ``block`` misses
    at a time, then the uint32 ``probe`` for misses whose samples were all taken; the cursor moves by m."""
    slot_tok = np.full(capacity, -1, np.int64)
    slot_of = np.full(n_pos, -1, np.int64)
    ref = np.zeros(capacity, np.int64)            # the step at which each slot was last selected or filled
    res = np.zeros(n_pos, np.bool_)
    mark = np.zeros(n_pos, np.int64)
    victims = np.empty(capacity, np.int64)
    wrap = np.int64(4294967296)
    n_used = 0
    cursor = 0
    epoch = 0
    T, W = seq.shape
    for t in range(T):
        size, misses, _ = _mark_step(seq, t, mark, res, n_used, capacity)
        if size > capacity:
            return t
        e = epoch + 1
        _stamp(seq, t, ref, slot_of, e, True, res)                # hits: selected this step
        m = misses - min(misses, capacity - n_used)       # misses that need a victim
        for j in range(W if n_used < capacity else 0):    # the first misses fill the free slots
            x = seq[t, j]
            if x < 0 or res[x] or n_used == capacity:
                continue
            _install(x, n_used, slot_tok, slot_of, res)
            ref[n_used] = e
            n_used += 1
        for first in range(0, m, block):
            last = min(m, first + block)
            for i in range(first, last):          # each miss samples its own stripe
                stripe = (capacity - 1 - i) // m + 1
                looks = min(stripe, samples)
                v = -1
                for s in range(looks):
                    c = cursor + i + (s * stripe // looks) * m    # i + (stripe - 1) m < capacity: one wrap
                    if c >= capacity:
                        c -= capacity
                    if ref[c] != e and (v < 0 or ref[c] < ref[v]):      # older = smaller stamp
                        v = c
                victims[i] = v
                if v >= 0:
                    ref[v] = e
            for i in range(first, last):          # the probe, for misses whose samples were all taken
                if victims[i] >= 0:
                    continue
                start = (cursor + (i * probe) % wrap) % wrap % capacity
                v = -1
                for a in range(capacity):
                    c = (start + (a * probe) % wrap) % wrap % capacity
                    if ref[c] != e:
                        v = c
                        break
                if v < 0:                         # the probe did not cover the ring: from the cursor on
                    for a in range(capacity):
                        c = (cursor + a) % capacity
                        if ref[c] != e:
                            v = c
                            break
                victims[i] = v
                ref[v] = e
        i = 0
        for j in range(W):                        # the remaining misses take the victims, in order
            x = seq[t, j]
            if x < 0 or res[x]:
                continue
            _install(x, victims[i], slot_tok, slot_of, res)
            i += 1
        if m > 0:
            cursor = (cursor + min(m, capacity)) % capacity
        epoch = e                                 # every slot of the step holds e already (hit, filled, claimed)
        if t >= n_free:
            out[t - n_free] = misses
    return -1


@njit(cache=True, nogil=True)
def fifo(seq, n_free, capacity, n_pos, out):
    prv, nxt = empty(n_pos, np.int64)
    res = np.zeros(n_pos, np.bool_)
    mark = np.zeros(n_pos, np.int64)
    H = n_pos
    n_res = 0
    T, W = seq.shape
    for t in range(T):
        size, misses, evict = _mark_step(seq, t, mark, res, n_res, capacity)
        if size > capacity:
            return t
        v = nxt[H]
        while evict > 0:
            w = nxt[v]
            if mark[v] != t + 1:
                unlink(prv, nxt, v)
                res[v] = False
                n_res -= 1
                evict -= 1
            v = w
        for j in range(W):
            x = seq[t, j]
            if x < 0 or res[x]:
                continue
            push_newest(prv, nxt, H, x)
            res[x] = True
            n_res += 1
        if t >= n_free:
            out[t - n_free] = misses
    return -1


# ---- indexed binary min-heap: keys (cap,), items (cap,), pos (n_pos,) = slot or -1
@njit(cache=True)
def _swap(keys, items, pos, i, j):
    ki = keys[i]
    keys[i] = keys[j]
    keys[j] = ki
    ii = items[i]
    items[i] = items[j]
    items[j] = ii
    pos[items[i]] = i
    pos[items[j]] = j


@njit(cache=True)
def _up(keys, items, pos, i):
    while i > 0:
        p = (i - 1) // 2
        if keys[i] < keys[p]:
            _swap(keys, items, pos, i, p)
            i = p
        else:
            break


@njit(cache=True)
def _down(keys, items, pos, i, n):
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and keys[c + 1] < keys[c]:
            c += 1
        if keys[c] < keys[i]:
            _swap(keys, items, pos, i, c)
            i = c
        else:
            break


@njit(cache=True)
def _push(keys, items, pos, n, x, key):
    keys[n] = key
    items[n] = x
    pos[x] = n
    _up(keys, items, pos, n)
    return n + 1


@njit(cache=True)
def _remove(keys, items, pos, n, x):
    i = pos[x]
    n -= 1
    pos[x] = -1
    if i != n:
        keys[i] = keys[n]
        items[i] = items[n]
        pos[items[i]] = i
        _up(keys, items, pos, i)
        _down(keys, items, pos, i, n)
    return n


@njit(cache=True, nogil=True)
def keyed(seq, keyseq, n_free, capacity, n_pos, out):
    """Evict the resident entry (not in S) with the smallest key; keyseq[t, j] is seq[t, j]'s key after step t."""
    keys = np.empty(capacity, np.float64)
    items = np.empty(capacity, np.int64)
    pos = np.full(n_pos, -1, np.int64)
    n = 0
    T, W = seq.shape
    for t in range(T):
        size = 0
        hits = 0
        for j in range(W):
            x = seq[t, j]
            if x < 0:
                continue
            size += 1
            if pos[x] >= 0:
                hits += 1
                n = _remove(keys, items, pos, n, x)
        if size > capacity:
            return t
        misses = size - hits
        evict = n + size - capacity               # n = residents not in S
        while evict > 0:
            v = items[0]
            n = _remove(keys, items, pos, n, v)
            evict -= 1
        for j in range(W):
            x = seq[t, j]
            if x < 0:
                continue
            n = _push(keys, items, pos, n, x, keyseq[t, j])
        if t >= n_free:
            out[t - n_free] = misses
    return -1


@njit(cache=True, nogil=True)
def heat(seq, n_free, capacity, n_pos, decay, out):
    """ess.policies.HeatPolicy with weight 1 per access: after each step every resident entry's heat is
    multiplied by ``decay``, then each entry of S adds 1 (in S order, stamped as most recent); victims are the
    residents not in S with the lowest heat, ties by least recent use; an evicted entry's heat is forgotten.
    The same float operations in the same order as the reference, so the two agree miss for miss."""
    heat = np.zeros(n_pos, np.float64)
    stamp = np.zeros(n_pos, np.int64)
    res = np.zeros(n_pos, np.bool_)
    mark = np.zeros(n_pos, np.int64)              # == t + 1: selected by step t
    members = np.empty(capacity, np.int64)        # resident positions (unordered)
    where = np.full(n_pos, -1, np.int64)          # index of a resident in members
    cand = np.empty(capacity, np.int64)
    n_res = 0
    clock = 0
    T, W = seq.shape
    for t in range(T):
        size, misses, evict = _mark_step(seq, t, mark, res, n_res, capacity)
        if size > capacity:
            return t
        if evict > 0:
            nc = 0
            for i in range(n_res):
                v = members[i]
                if mark[v] != t + 1:
                    cand[nc] = v
                    nc += 1
            c = cand[:nc][np.argsort(stamp[cand[:nc]], kind="mergesort")]     # LRU order first ...
            c = c[np.argsort(heat[c], kind="mergesort")]                        # ... then heat, stable
            for i in range(evict):
                v = c[i]
                res[v] = False
                heat[v] = 0.0
                stamp[v] = 0
                k = where[v]
                last = members[n_res - 1]
                members[k] = last
                where[last] = k
                where[v] = -1
                n_res -= 1
        for j in range(W):
            x = seq[t, j]
            if x < 0 or res[x]:
                continue
            res[x] = True
            members[n_res] = x
            where[x] = n_res
            n_res += 1
        for i in range(n_res):
            heat[members[i]] *= decay
        for j in range(W):
            x = seq[t, j]
            if x < 0:
                continue
            heat[x] += 1.0
            clock += 1
            stamp[x] = clock
        if t >= n_free:
            out[t - n_free] = misses
    return -1


@njit(cache=True, nogil=True)
def belady_keys(seq, n_pos):
    """-(next step that reads the entry); never again = -(T + 1), so it is evicted first."""
    T = seq.shape[0]
    nxt_use = np.full(n_pos, T + 1, np.int64)
    keys = np.empty(seq.shape, np.float64)
    for t in range(T - 1, -1, -1):
        for j in range(seq.shape[1]):
            x = seq[t, j]
            keys[t, j] = -float(nxt_use[x]) if x >= 0 else 0.0
        for j in range(seq.shape[1]):
            x = seq[t, j]
            if x >= 0:
                nxt_use[x] = t
    return keys


def simulate(seq, n_free, capacity, policy, n_pos, decay, out) -> int:
    """Run the kernel of ``policy`` over ``seq`` (module docstring); the Belady kernel is the keyed one on the keys
    of :func:`belady_keys`."""
    if policy in ("lru", "fifo", "clock"):
        kernel = {"lru": lru, "fifo": fifo, "clock": clock}[policy]
        return int(kernel(seq, n_free, capacity, n_pos, out))
    if policy == "sampled_clock":
        return int(sampled_clock(seq, n_free, capacity, n_pos, SAMPLED_CLOCK_SAMPLES, SAMPLED_CLOCK_BLOCK,
                                 SAMPLED_CLOCK_PROBE, out))
    if policy == "heat":
        return int(heat(seq, n_free, capacity, n_pos, float(decay), out))
    if policy == "belady":
        return int(keyed(seq, belady_keys(seq, n_pos), n_free, capacity, n_pos, out))
    raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
