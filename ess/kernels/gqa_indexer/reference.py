"""NumPy oracle of the real model's indexer (float64, a loop over the batch, written to be read).

Shapes (B requests, L token slots, H query heads, Hkv KV heads, hd head dim, G = H / Hkv query heads per KV head)::

    indexer_scores(q (B, H, hd) f32, codes (B, L, Hkv hd) u8, scales (B, L, Hkv) f32, lengths (B,) i64,
                   out (B, L) f32)

Token ``s`` of request ``b`` is cached when ``s < lengths[b]``; its FP8 e4m3 key of KV head ``g`` is
``codes[b, s, g hd:(g + 1) hd]`` times ``scales[b, s, g]``. Query head ``h`` reads KV head ``h // G``. The score::

    out[b, s] = sum_h softmax_s( q[b, h] . k8[b, s, h // G] / sqrt(hd) )      (s < lengths[b]; the softmax over them)
    out[b, s] = -inf                                                          (s >= lengths[b])

the attention weight each query head would give ``s`` with the FP8 keys, summed over the heads (one score per token
shared by all heads: one top-K set per token and layer). A request with ``lengths[b] == 0`` scores ``-inf``
everywhere. Every kernel writes into ``out`` and returns nothing.
"""
from __future__ import annotations

import math

import numpy as np

from ...quant import FP8_E4M3_VALUES

__all__ = ["indexer_scores"]


def indexer_scores(q, codes, scales, lengths, out) -> None:
    """The score of every cached token of every request (module docstring)."""
    B, H, hd = q.shape
    Hkv = scales.shape[2]
    for b in range(B):
        n = int(lengths[b])
        out[b, n:] = -np.inf
        if n == 0:
            continue
        k = FP8_E4M3_VALUES[codes[b, :n]].astype(np.float64).reshape(n, Hkv, hd)       # (n, Hkv, hd)
        k *= scales[b, :n].astype(np.float64)[:, :, None]
        qg = q[b].astype(np.float64).reshape(Hkv, H // Hkv, hd)                         # (Hkv, G, hd)
        logits = np.einsum("ngd,gjd->ngj", k, qg).reshape(n, H) / math.sqrt(hd)        # (n, H)
        p = np.exp(logits - logits.max(axis=0))
        out[b, :n] = (p / p.sum(axis=0)).sum(axis=1)
