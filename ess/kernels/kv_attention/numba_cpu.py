"""Numba kernels of the sparse attention over the K/V pool for the CPU, same signatures as :mod:`.reference`. They
read the selected entries where they lie in the pool (no gathered copy): a column's score is one dot product per
query head in a fixed order, the same bits whichever columns are scored with it; the combination runs request by
request (softmax with the vectorised exponential of :mod:`ess.kernels.gqa_indexer.numba_cpu`, then the values read
from their slots). float32 arithmetic."""
from __future__ import annotations

import numpy as np
from numba import njit

from .. import scratch
from ..gqa_indexer.numba_cpu import _FAST, _exp_nonpositive

__all__ = ["score_columns", "combine_columns"]


@njit(fastmath=_FAST, nogil=True, cache=True, error_model="numpy")
def _score(q, pool, b, cols, rows, scale, scores):
    H, hd = q.shape[1], q.shape[2]
    Hkv = pool.shape[2]
    G = H // Hkv
    for i in range(rows.shape[0]):
        bi = b[i]
        c = cols[i]
        kr = pool[rows[i], 0]                        # (Hkv, hd), read in place
        for h in range(H):
            qh = q[bi, h]
            kg = kr[h // G]
            acc = np.float32(0.0)
            for d in range(hd):
                acc += qh[d] * kg[d]
            scores[bi, h, c] = acc * scale


@njit(fastmath=_FAST, nogil=True, cache=True, error_model="numpy")
def _combine(scores, pool, slots, own_v, rows, p, out):
    H, C = scores.shape[1], scores.shape[2]
    Hkv, hd = pool.shape[2], pool.shape[3]
    G = H // Hkv
    for r in range(rows.shape[0]):
        b = rows[r]
        for h in range(H):                           # softmax over the columns, vectorised along them
            sh = scores[b, h]
            ph = p[h]
            m = -np.inf
            for c in range(C):
                m = max(m, sh[c])
            z = np.float32(0.0)
            for c in range(C):
                e = _exp_nonpositive(sh[c] - m) if sh[c] > -np.inf else np.float32(0.0)
                ph[c] = e
                z += e
            inv = np.float32(1.0) / z
            for c in range(C):
                ph[c] *= inv
        ob = out[b]
        for h in range(H):
            for d in range(hd):
                ob[h, d] = 0.0
        for c in range(C):                           # the values, each read once, where they lie
            if c < C - 1:
                if slots[b, c] < 0:
                    continue
                v = pool[slots[b, c], 1]             # (Hkv, hd)
            else:
                v = own_v[b]
            for h in range(H):
                w = p[h, c]
                vg = v[h // G]
                oh = ob[h]
                for d in range(hd):
                    oh[d] += w * vg[d]


def score_columns(q, pool, b, cols, rows, scale, scores) -> None:
    _score(q, pool, b, cols, rows, np.float32(scale), scores)


def combine_columns(scores, pool, slots, own_v, rows, out) -> None:
    _combine(scores, pool, slots, own_v, rows, scratch("kv_attention_weights", scores.shape[1:]), out)
