"""torch kernels of the sparse attention over the K/V pool (CPU and CUDA), same signatures as :mod:`.reference`, on
tensors of one device (the index arrays ``b``, ``cols``, ``rows``, ``slots`` as int64 tensors there). A column's
score is an element-wise product and a sum over the head dimension, whose bits do not depend on which other columns
are scored in the same call (a matrix product's would: its blocking depends on the shape); the combination runs per
request, always over the same shapes.
"""
from __future__ import annotations

__all__ = ["score_columns", "combine_columns"]


def score_columns(q, pool, b, cols, rows, scale, scores) -> None:
    H, hd = q.shape[1], q.shape[2]
    Hkv = pool.shape[2]
    k = pool.index_select(0, rows)[:, 0]                                              # (n, Hkv, hd)
    qg = q.index_select(0, b).view(-1, Hkv, H // Hkv, hd)                            # (n, Hkv, G, hd)
    scores.transpose(1, 2)[b, cols] = (qg * k[:, :, None, :]).sum(-1).view(-1, H) * scale   # (n, H)


def combine_columns(scores, pool, slots, own_v, rows, out) -> None:
    import torch
    H, C = scores.shape[1], scores.shape[2]
    Hkv, hd = pool.shape[2], pool.shape[3]
    G = H // Hkv
    for b in rows.tolist():
        p = torch.softmax(scores[b], dim=1).view(Hkv, G, C)                          # (Hkv, G, C)
        sl = slots[b]
        v = pool.index_select(0, sl.clamp(min=0))[:, 1]                              # (C - 1, Hkv, hd)
        v = torch.where((sl >= 0)[:, None, None], v, 0.0)                            # an empty column reads 0
        v = torch.cat([v, own_v[b, None]], 0).transpose(0, 1)                        # (Hkv, C, hd)
        out[b] = torch.matmul(p, v).reshape(H, hd)
