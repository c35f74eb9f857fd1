"""Numba kernels of the sparse attention over the K/V pool for the CPU, same signatures as :mod:`.reference`. They
read the selected entries where they lie in the pool (no gathered copy): a column's score is one dot product per
query head in a fixed order, the same bits whichever columns are scored with it; the combination runs request by
request (softmax with the vectorised exponential of :mod:`ess.kernels.gqa_indexer.numba_cpu`, then the values read
from their slots). float32 arithmetic."""
from __future__ import annotations

import numpy as np
from numba import njit

from ..gqa_indexer.numba_cpu import _FAST, _exp_nonpositive

__all__ = ["score_columns", "combine_columns"]


@njit(fastmath=_FAST, nogil=True, cache=True, error_model="numpy")
def _score(q, pool, b, cols, rows, scale, scores):
    H, hd = q.shape[1], q.shape[2]
    Hkv = pool.shape[2]
    G = H // Hkv
    for i in range(rows.shape[0]):
        bi = b[i]
        kr = pool[rows[i], 0]                        # (Hkv, hd), read in place
        for h in range(H):
            qh = q[bi, h]
            kg = kr[h // G]
            acc = np.float32(0.0)
            for d in range(hd):
                acc += qh[d] * kg[d]
            scores[bi, cols[i], h] = acc * scale


@njit(fastmath=_FAST, nogil=True, cache=True, error_model="numpy")
def _combine(scores, pool, slots, own_v, rows, out):
    C, H = scores.shape[1], scores.shape[2]
    Hkv, hd = pool.shape[2], pool.shape[3]
    G = H // Hkv
    p = np.empty((C, H), np.float32)
    mx = np.empty(H, np.float32)
    z = np.empty(H, np.float32)
    for r in range(rows.shape[0]):
        b = rows[r]
        sb = scores[b]
        for h in range(H):
            mx[h] = -np.inf
            z[h] = 0.0
        for c in range(C):
            for h in range(H):
                if sb[c, h] > mx[h]:
                    mx[h] = sb[c, h]
        for c in range(C):
            for h in range(H):
                e = _exp_nonpositive(sb[c, h] - mx[h]) if sb[c, h] > -np.inf else np.float32(0.0)
                p[c, h] = e
                z[h] += e
        ob = out[b]
        for h in range(H):
            for d in range(hd):
                ob[h, d] = 0.0
        for c in range(C):
            if c < C - 1:
                if slots[b, c] < 0:
                    continue
                v = pool[slots[b, c], 1]             # (Hkv, hd), read in place
            else:
                v = own_v[b]
            for h in range(H):
                w = p[c, h] / z[h]
                vg = v[h // G]
                for d in range(hd):
                    ob[h, d] += w * vg[d]


def score_columns(q, pool, b, cols, rows, scale, scores) -> None:
    _score(q, pool, b, cols, rows, np.float32(scale), scores)


def combine_columns(scores, pool, slots, own_v, rows, out) -> None:
    _combine(scores, pool, slots, own_v, rows, out)
