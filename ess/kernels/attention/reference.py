"""NumPy oracle of the attention kernels: float64 arithmetic, loops over the batch, written to be read.

Shapes (B batch, Hi indexer heads, D indexer head dim, L tokens, H query heads, K selected entries, N pool rows,
E entry bytes, Dqk = kv_rank + rope_dim, Dv = kv_rank)::

    indexer_scores(q (B, Hi, D) f32, w (B, Hi) f32, keys (B, L, D + 4) u8, lengths (B,) i64, out (B, L) f32)
    sparse_mla_decode(q (B, H, Dqk) f32, pool (N, E) u8, indices (B, K) i64, sm_scale, fp8, kv_rank, rope_dim,
                      tile, out (B, H, Dv) f32, lse (B, H) f32)

Every kernel writes into ``out`` (and ``lse``) and returns nothing. Conventions: token ``s`` of request ``b`` is
visible to the indexer when ``s < lengths[b]`` (a decoding query at position ``lengths[b] - 1`` sees itself and
everything before: the causal mask); invisible tokens score ``-inf``. An index of ``-1`` is padding and is skipped.
A row with no entry gives ``out = 0`` and ``lse = -inf``. ``lse[b, h] = log(sum_k exp(sm_scale * q . k))``.
"""
from __future__ import annotations

import numpy as np

from ...quant import FP8_E4M3_VALUES

__all__ = ["indexer_scores", "sparse_mla_decode", "decode_latent_rows", "decode_index_rows"]


def decode_index_rows(keys: np.ndarray) -> np.ndarray:
    """(..., D + 4) indexer entries -> (..., D) float64 keys: FP8 value times the row's float32 scale."""
    d = keys.shape[-1] - 4
    scale = np.ascontiguousarray(keys[..., d:]).view("<f4").astype(np.float64)       # (..., 1)
    return FP8_E4M3_VALUES[keys[..., :d]].astype(np.float64) * scale


def decode_latent_rows(rows: np.ndarray, fp8: bool, kv_rank: int, rope_dim: int, tile: int) -> np.ndarray:
    """(n, E) latent entries -> (n, kv_rank + rope_dim) float64 latents (c_KV, then the rope key)."""
    from ...validate import boolean, positive_int
    fp8 = boolean("fp8", fp8)
    kv_rank, rope_dim, tile = (positive_int(n, v) for n, v in (("kv_rank", kv_rank), ("rope_dim", rope_dim),
                                                                ("tile", tile)))

    def bf16(raw):
        return (np.ascontiguousarray(raw).view("<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)

    if fp8:
        n_scales = kv_rank // tile
        codes = rows[:, :kv_rank]
        scales = np.ascontiguousarray(rows[:, kv_rank:kv_rank + 4 * n_scales]).view("<f4").astype(np.float64)
        ckv = FP8_E4M3_VALUES[codes].astype(np.float64) * np.repeat(scales, tile, axis=1)
        rope = bf16(rows[:, kv_rank + 4 * n_scales:kv_rank + 4 * n_scales + 2 * rope_dim])
    else:
        ckv = bf16(rows[:, :2 * kv_rank])
        rope = bf16(rows[:, 2 * kv_rank:2 * kv_rank + 2 * rope_dim])
    return np.concatenate([ckv, rope], axis=1)


def indexer_scores(q, w, keys, lengths, out) -> None:
    """I(b, s) = sum_j w[b, j] * ReLU(q[b, j] . k[b, s]) for s < lengths[b], -inf otherwise."""
    B, L = out.shape
    with np.errstate(invalid="ignore", over="ignore"):     # non-finite stored values are reported by the wrapper
        _indexer(q, w, keys, lengths, out)


def _indexer(q, w, keys, lengths, out) -> None:
    B, L = out.shape
    for b in range(B):
        n = int(lengths[b])
        k = decode_index_rows(keys[b, :n])                               # (n, D)
        logits = q[b].astype(np.float64) @ k.T                           # (Hi, n)
        score = (w[b].astype(np.float64)[:, None] * np.maximum(logits, 0.0)).sum(axis=0)
        out[b, :n] = score
        out[b, n:] = -np.inf


def sparse_mla_decode(q, pool, indices, sm_scale, fp8, kv_rank, rope_dim, tile, out, lse) -> None:
    """Softmax attention of every head of q[b] over the latents pool[indices[b]] (MQA: one latent per token for all
    heads); the value is the c_KV part of the latent (absorbed MLA)."""
    with np.errstate(invalid="ignore", over="ignore"):     # non-finite stored values are reported by the wrapper
        _mla(q, pool, indices, sm_scale, fp8, kv_rank, rope_dim, tile, out, lse)


def _mla(q, pool, indices, sm_scale, fp8, kv_rank, rope_dim, tile, out, lse) -> None:
    B = q.shape[0]
    for b in range(B):
        idx = indices[b][indices[b] >= 0]
        if idx.size == 0:
            out[b] = 0.0
            lse[b] = -np.inf
            continue
        kv = decode_latent_rows(pool[idx], fp8, kv_rank, rope_dim, tile)  # (n, Dqk)
        s = sm_scale * (q[b].astype(np.float64) @ kv.T)                   # (H, n)
        m = s.max(axis=1, keepdims=True)
        p = np.exp(s - m)
        denom = p.sum(axis=1, keepdims=True)
        out[b] = (p @ kv[:, :kv_rank]) / denom                             # (H, Dv)
        lse[b] = (m + np.log(denom))[:, 0]
