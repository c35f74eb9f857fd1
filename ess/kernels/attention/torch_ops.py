"""torch kernels (CPU and CUDA), same signatures as :mod:`.reference` plus ``device``; inputs and outputs are NumPy
arrays on the host, the work runs on ``device``. The building blocks (``*_t``) take and return tensors, for callers
that keep data on the device (the benchmark, the GPU check).

Dequantisation is a table lookup (256 FP8 values) and a per-tile scale multiply, then batched matrix products;
float32 throughout.
"""
from __future__ import annotations

import numpy as np

from ...quant import FP8_E4M3_VALUES

__all__ = ["indexer_scores", "sparse_mla_decode", "indexer_scores_t", "sparse_mla_decode_t", "to_device"]

# one copy of the (immutable) FP8 value table per device, built on first use and only ever read: sharing it between
# threads is safe (two threads racing on first use both build the same table; either copy is correct)
_LUTS: dict = {}


def _torch():
    import torch
    return torch


def _lut(device):
    torch = _torch()
    key = str(device)
    if key not in _LUTS:
        _LUTS[key] = torch.from_numpy(np.array(FP8_E4M3_VALUES)).to(device)
    return _LUTS[key]


def to_device(a, device):
    torch = _torch()
    return torch.from_numpy(np.ascontiguousarray(a)).to(device)


def _f32_at(raw):
    """(..., 4) uint8 -> (...,) float32 (little-endian bytes)."""
    torch = _torch()
    return raw.contiguous().view(torch.float32)[..., 0]


def _bf16_at(raw):
    torch = _torch()
    return raw.contiguous().view(torch.bfloat16).float()


def indexer_scores_t(q, w, keys, lengths):
    """Tensors: q (B, Hi, D) f32, w (B, Hi) f32, keys (B, L, D + 4) u8, lengths (B,) i64 -> (B, L) f32."""
    torch = _torch()
    D = q.shape[-1]
    k = _lut(keys.device)[keys[..., :D].long()]                        # (B, L, D), without the scale
    scale = _f32_at(keys[..., D:D + 4])                                  # (B, L)
    logits = torch.bmm(q, k.transpose(1, 2))                            # (B, Hi, L)
    score = (torch.relu(logits) * w[:, :, None]).sum(dim=1) * scale     # (B, L)
    pos = torch.arange(keys.shape[1], device=keys.device)
    return score.masked_fill(pos[None, :] >= lengths[:, None], float("-inf"))


def dequant_rows_t(rows, fp8, kv_rank, rope_dim, tile):
    """(..., E) u8 latent entries -> (..., kv_rank + rope_dim) f32."""
    torch = _torch()
    if fp8:
        n_scales = kv_rank // tile
        ckv = _lut(rows.device)[rows[..., :kv_rank].long()]
        scales = rows[..., kv_rank:kv_rank + 4 * n_scales].contiguous().view(torch.float32)   # (..., n_scales)
        ckv = (ckv.unflatten(-1, (n_scales, tile)) * scales[..., None]).flatten(-2)
        ro = kv_rank + 4 * n_scales
    else:
        ckv = _bf16_at(rows[..., :2 * kv_rank])
        ro = 2 * kv_rank
    rope = _bf16_at(rows[..., ro:ro + 2 * rope_dim])
    return torch.cat([ckv, rope], dim=-1)


def sparse_mla_decode_t(q, pool, indices, sm_scale, fp8, kv_rank, rope_dim, tile):
    """Tensors: q (B, H, Dqk) f32, pool (N, E) u8, indices (B, K) i64 -> (out (B, H, Dv) f32, lse (B, H) f32)."""
    torch = _torch()
    valid = indices >= 0                                                 # (B, K)
    rows = pool[indices.clamp(min=0)]                                    # (B, K, E)
    kv = dequant_rows_t(rows, fp8, kv_rank, rope_dim, tile)             # (B, K, Dqk)
    s = torch.bmm(q, kv.transpose(1, 2)) * sm_scale                      # (B, H, K)
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    denom = p.sum(dim=-1, keepdim=True)                                  # (B, H, 1)
    o = torch.bmm(p, kv[..., :kv_rank])                                  # (B, H, Dv)
    empty = denom == 0
    out = torch.where(empty, torch.zeros_like(o), o / torch.where(empty, torch.ones_like(denom), denom))
    lse = (m + torch.log(denom))[..., 0]                                 # -inf for an empty row
    return out, lse


def indexer_scores(q, w, keys, lengths, out, device="cpu") -> None:
    res = indexer_scores_t(to_device(q, device), to_device(w, device), to_device(keys, device),
                           to_device(lengths, device))
    out[...] = res.cpu().numpy()


def sparse_mla_decode(q, pool, indices, sm_scale, fp8, kv_rank, rope_dim, tile, out, lse, device="cpu") -> None:
    o, l = sparse_mla_decode_t(to_device(q, device), to_device(pool, device), to_device(indices, device),
                               float(sm_scale), fp8, kv_rank, rope_dim, tile)
    out[...] = o.cpu().numpy()
    lse[...] = l.cpu().numpy()
