"""NumPy oracle of the trace statistics (signatures in :mod:`ess.kernels.trace_stats`), written to be read: each row
as the set of its valid positions."""
from __future__ import annotations

import numpy as np

__all__ = ["first_duplicate_row", "adjacent_overlaps", "union_sizes", "leave_return"]


def _valid(row) -> np.ndarray:
    return np.asarray(row)[np.asarray(row) >= 0]


def first_duplicate_row(rows, n_pos) -> int:
    for r, row in enumerate(rows):
        v = _valid(row)
        if np.unique(v).size < v.size:
            return r
    return -1


def adjacent_overlaps(rows, n_pos, out) -> None:
    for t in range(1, rows.shape[0]):
        before, now = _valid(rows[t - 1]), _valid(rows[t])
        out[t - 1] = np.intersect1d(before, now).size / now.size if now.size else np.nan


def union_sizes(rows, n_pos, window, out) -> None:
    for t in range(rows.shape[0] - window + 1):
        out[t] = np.unique(_valid(rows[t:t + window])).size


def leave_return(rows, n_pos, within) -> tuple[int, int]:
    T = rows.shape[0]
    left = back = 0
    for s in range(1, T - within):                                  # s = 1 .. T-1-within
        gone = np.setdiff1d(_valid(rows[s - 1]), _valid(rows[s]))
        later = _valid(rows[s + 1:s + 1 + within])
        left += gone.size
        back += np.isin(gone, later).sum()
    return int(left), int(back)
