"""Numba kernels of the trace statistics (CPU), same signatures as :mod:`.reference`: one pass over the rows with an
array of ``n_pos`` stamps (``stamp[x] == r + 1``: position x seen in row r) instead of sets."""
from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["first_duplicate_row", "adjacent_overlaps", "union_sizes", "leave_return"]


@njit(cache=True)
def first_duplicate_row(rows, n_pos):
    """Index of the first row with a repeated valid entry, -1 if none."""
    seen = np.zeros(n_pos, np.int64)
    for r in range(rows.shape[0]):
        for j in range(rows.shape[1]):
            x = rows[r, j]
            if x < 0:
                continue
            if seen[x] == r + 1:
                return r
            seen[x] = r + 1
    return -1


@njit(cache=True)
def adjacent_overlaps(rows, n_pos, out):
    """out[t - 1] = |S(t-1) & S(t)| / |S(t)| for t >= 1; NaN where S(t) is empty."""
    mark = np.zeros(n_pos, np.int64)                   # == t: in row t - 1
    for t in range(rows.shape[0]):
        n = 0
        both = 0
        for j in range(rows.shape[1]):
            x = rows[t, j]
            if x < 0:
                continue
            n += 1
            if t > 0 and mark[x] == t:
                both += 1
            mark[x] = t + 1
        if t > 0:
            out[t - 1] = both / n if n > 0 else np.nan


@njit(cache=True)
def union_sizes(rows, n_pos, window, out):
    """Distinct valid entries of rows t .. t+window-1 for each t = 0 .. T-window: out (T-window+1,)."""
    T = rows.shape[0]
    stamp = np.zeros(n_pos, np.int64)
    for t in range(T - window + 1):
        n = 0
        for i in range(t, t + window):
            for j in range(rows.shape[1]):
                x = rows[i, j]
                if x >= 0 and stamp[x] != t + 1:
                    stamp[x] = t + 1
                    n += 1
        out[t] = n


@njit(cache=True)
def leave_return(rows, n_pos, within):
    """(left, returned): entries of row t-1 missing from row t, and those of them found again in rows
    t+1 .. t+within, summed over t = 1 .. T-1-within (steps whose whole window lies in the trace)."""
    T = rows.shape[0]
    next_use = np.full(n_pos, T, np.int64)        # next row (>= the current one) that holds the entry
    left = 0
    back = 0
    for t in range(T - 1, -1, -1):
        # next_use holds, for every entry, the first row > t that selects it
        if t + 1 <= T - 1 - within:
            for j in range(rows.shape[1]):
                x = rows[t, j]
                if x < 0:
                    continue
                n = next_use[x]
                if n != t + 1:                    # x is in row t, not in row t + 1: it left at t + 1
                    left += 1
                    if n <= t + 1 + within:
                        back += 1
        for j in range(rows.shape[1]):
            x = rows[t, j]
            if x >= 0:
                next_use[x] = t
    return left, back
