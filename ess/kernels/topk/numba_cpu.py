"""Numba kernel of top-K selection for the CPU, same signature as :mod:`.reference`: per row, the K-th highest
score by a partition (O(L)), then one scan in position order that keeps every score above it and, of those equal
to it, the first ones (ties to the lower position)."""
from __future__ import annotations

import numpy as np
from numba import njit

from .. import scratch

__all__ = ["topk_positions"]


@njit(nogil=True, cache=True)
def _topk(scores, k, neg, out):
    B, L = scores.shape
    for b in range(B):
        row = scores[b]
        n_vis = 0
        for s in range(L):
            v = row[s]
            neg[s] = -v
            if v > -np.inf:
                n_vis += 1
        kk = min(k, n_vis)
        thr = -np.inf                                 # every visible token when they are k or fewer
        need = 0
        if 0 < kk < n_vis:
            thr = -np.partition(neg, kk - 1)[kk - 1]  # the kk-th highest score
            above = 0
            for s in range(L):
                if row[s] > thr:
                    above += 1
            need = kk - above                         # ties at the threshold to take, lowest positions first
        j = 0
        for s in range(L):
            v = row[s]
            if v > thr or (need > 0 and v == thr):
                if v == thr:
                    need -= 1
                out[b, j] = s
                j += 1
        for i in range(j, k):
            out[b, i] = -1


def topk_positions(scores, k, out) -> None:
    _topk(scores, k, scratch("topk_negated", (scores.shape[1],), scores.dtype), out)
