"""NumPy oracle of the real model's sparse attention over its K/V pool, column by column (float64, loops, written to
be read).

Shapes (B requests, C columns = K selected entries + 1 own, H query heads, Hkv KV heads, hd head dim, G = H / Hkv,
N pool slots)::

    score_columns(q (B, H, hd) f32, pool (N, 2, Hkv, hd) f32, b (n,) i64, cols (n,) i64, rows (n,) i64, scale,
                  scores (B, H, C) f32)
    combine_columns(scores (B, H, C) f32, pool (N, 2, Hkv, hd) f32, slots (B, C - 1) i64, own_v (B, Hkv, hd) f32,
                    rows (m,) i64, out (B, H, hd) f32)

``score_columns`` writes, for every ``i``, the scores of entry ``pool[rows[i]]`` (its key, ``[..., 0, :, :]``) in
column ``cols[i]`` of request ``b[i]``: ``scores[b, h, c] = scale * q[b, h] . k[h // G]``; other columns are left as
they are. ``combine_columns`` then, for each request in ``rows``: the softmax over its ``C`` columns (a column at
``-inf`` weighs 0) and the weighted sum of their values -- column ``c < C - 1`` reads the value of pool slot
``slots[b, c]`` (``-1``: an empty column, which must score ``-inf``), column ``C - 1`` the request's own value
``own_v[b]``. Kernels write into ``scores`` / ``out`` and return nothing.
"""
from __future__ import annotations

import numpy as np

__all__ = ["score_columns", "combine_columns"]


def score_columns(q, pool, b, cols, rows, scale, scores) -> None:
    H, hd = q.shape[1], q.shape[2]
    Hkv = pool.shape[2]
    G = H // Hkv
    for i in range(len(rows)):
        k = pool[rows[i], 0].astype(np.float64)                                      # (Hkv, hd)
        qb = q[b[i]].astype(np.float64).reshape(Hkv, G, hd)
        scores[b[i], :, cols[i]] = (scale * np.einsum("gjd,gd->gj", qb, k)).reshape(H)


def combine_columns(scores, pool, slots, own_v, rows, out) -> None:
    H, C = scores.shape[1], scores.shape[2]
    Hkv, hd = pool.shape[2], pool.shape[3]
    G = H // Hkv
    for b in rows:
        s = scores[b].T.astype(np.float64)                                           # (C, H)
        p = np.exp(s - s.max(axis=0))
        p /= p.sum(axis=0)
        v = np.zeros((C, Hkv, hd))
        for c in range(C - 1):
            if slots[b, c] >= 0:
                v[c] = pool[slots[b, c], 1]
        v[C - 1] = own_v[b]
        out[b] = np.einsum("cgj,cgd->gjd", p.reshape(C, Hkv, G), v).reshape(H, hd)
