"""The latent (MLA) entry of a transformers DSA model as the bytes the tiered cache moves, and sparse MLA over the
entries one step selected, computed column by column so that the result does not depend on which entries were
resident.

**Entry** (one token, one layer; ``kv`` = ``kv_lora_rank``, ``rope`` = ``qk_rope_head_dim``), ``dtype``:

* ``"fp8"`` -- ess's DeepSeek layout (:func:`ess.layout.latent_layout`): ``kv`` FP8 e4m3 codes, ``kv / tile``
  float32 scales (one per tile of ``tile`` values, ``amax / 448``), ``rope`` bf16 values: 656 B at DeepSeek-V3.2's
  dims (512, 64, tile 128), 164 B at the tiny test dims (128, 16). Needs ``kv`` a multiple of the tile;
* ``"bf16"`` -- ``kv + rope`` bf16 values (1,152 B at DeepSeek's dims);
* ``"float32"`` -- ``kv + rope`` float32 values, exact (what the model computed).

The FP8 scales are computed as :func:`ess.quant.quantize_fp8_tiles` computes them (a test keeps the bytes equal to
:func:`ess.quant.encode_latent`); decoding is :func:`ess.kernels.attention.torch_ops.dequant_rows_t`.

**Attention** (absorbed MLA, as FlashMLA computes it; DeepSeek-V3 paper, "Multi-Head Latent Attention"): with the
key up-projection absorbed into the query, head ``h``'s score of entry ``s`` is
``(W_UK_h^T q_nope_h) . c_s + q_rope_h . k_rope_s``, and its output ``W_UV_h sum_s p_hs c_s``: the latent entries
are read, never expanded per head. :class:`LatentStepAttention` scores each selected column apart (an element-wise
product and a sum, whose bits do not depend on the other columns) and combines them per request -- as
:class:`ess.engine.attention.StepAttention` does for K/V entries -- so that offloaded and all-resident decoding, and
every schedule, give the same bits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .. import validate
from ..engine.indexer import quantize_keys
from ..kernels.attention.torch_ops import dequant_rows_t
from ..specs import model_spec

__all__ = ["LATENT_DTYPES", "LatentFormat", "LatentStepAttention", "fp8_tile"]

LATENT_DTYPES = ("fp8", "bf16", "float32")


def fp8_tile() -> int:
    """Values per FP8 scale in ess's latent layout: DeepSeek-V3.2-Exp's (data/models, ``latent_fp8_tile``: 128)."""
    return model_spec("deepseek-v3.2-exp").latent_fp8_tile


@dataclass(frozen=True)
class LatentFormat:
    """One latent entry's encoding (module docstring): ``kv_rank`` and ``rope_dim`` values in ``dtype``."""

    kv_rank: int
    rope_dim: int
    dtype: str = "fp8"

    def __post_init__(self):
        validate.positive_int("kv_rank", self.kv_rank)
        validate.positive_int("rope_dim", self.rope_dim)
        validate.one_of("dtype", self.dtype, LATENT_DTYPES)
        if self.dtype == "fp8" and self.kv_rank % fp8_tile():
            raise ValueError(f"dtype 'fp8' needs kv_lora_rank a multiple of the {fp8_tile()}-value scale tile, got "
                             f"{self.kv_rank}: use dtype 'bf16' or 'float32'")

    @property
    def tile(self) -> int:
        return fp8_tile()

    @property
    def entry_bytes(self) -> int:
        kv, rope = self.kv_rank, self.rope_dim
        if self.dtype == "fp8":
            return kv + 4 * (kv // self.tile) + 2 * rope
        return (2 if self.dtype == "bf16" else 4) * (kv + rope)

    def encode(self, ckv: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        """Entries ``(..., entry_bytes)`` uint8 of latents ``ckv (..., kv_rank)`` and ``rope (..., rope_dim)``."""
        ckv, rope = ckv.float(), rope.float()
        if self.dtype == "float32":
            return torch.cat([ckv, rope], -1).contiguous().view(torch.uint8)
        rope_b = rope.to(torch.bfloat16).contiguous().view(torch.uint8)
        if self.dtype == "bf16":
            return torch.cat([ckv.to(torch.bfloat16).contiguous().view(torch.uint8), rope_b], -1)
        codes, scales = quantize_keys(ckv.unflatten(-1, (self.kv_rank // self.tile, self.tile)))
        return torch.cat([codes, scales.contiguous().view(torch.uint8), rope_b], -1)

    def decode(self, rows: torch.Tensor) -> torch.Tensor:
        """Latents ``(..., kv_rank + rope_dim)`` float32 of entries ``(..., entry_bytes)`` uint8."""
        if self.dtype == "float32":
            return rows.contiguous().view(torch.float32)
        return dequant_rows_t(rows, self.dtype == "fp8", self.kv_rank, self.rope_dim, self.tile)


class LatentStepAttention:
    """The attention buffers of a decode run of ``batch`` requests reading up to ``width`` (K) latent entries each
    from a device pool of ``fmt`` entries, with ``n_heads`` query heads. Columns ``0 .. K - 1`` are the selected
    cache entries, column ``K`` the request's own new entry (when the indexer selected it). ``rows_read`` counts the
    pool rows scored (each selected entry once per step and layer)."""

    def __init__(self, batch: int, width: int, n_heads: int, fmt: LatentFormat, device="cpu"):
        self.B, self.K, self.H, self.fmt = batch, int(width), n_heads, fmt
        self.device = torch.device(device)
        self.scores = torch.empty((batch, n_heads, self.K + 1), dtype=torch.float32, device=self.device)
        self.slots = np.full((batch, self.K), -1, np.int64)
        self.out = torch.zeros((batch, n_heads, fmt.kv_rank), dtype=torch.float32, device=self.device)
        self.rows_read = 0

    def begin(self, q: torch.Tensor, own: torch.Tensor, own_selected: torch.Tensor, pool: torch.Tensor,
              scale: float) -> None:
        """Start one layer: absorbed queries ``q`` (B, H, kv_rank + rope_dim), the new token's decoded latent
        ``own`` (B, kv_rank + rope_dim), ``own_selected`` (B,) bool, the device pool (slots, entry_bytes) uint8."""
        self.q, self.own, self.pool, self.scale = q.contiguous(), own, pool, float(scale)
        self.scores.fill_(-math.inf)
        self.slots.fill(-1)
        own_s = (self.q * own[:, None, :]).sum(-1) * self.scale                       # (B, H)
        self.scores[:, :, self.K] = torch.where(own_selected[:, None], own_s, -math.inf)

    def load(self, b: np.ndarray, cols: np.ndarray, rows: np.ndarray) -> None:
        """Score the entries in pool slots ``rows`` in columns ``cols`` of requests ``b`` (``(n,)`` int arrays)."""
        if len(rows) == 0:
            return
        self.slots[b, cols] = rows
        dev = self.device
        lat = self.fmt.decode(self.pool.index_select(0, torch.from_numpy(np.asarray(rows, np.int64)).to(dev)))
        bt = torch.from_numpy(np.asarray(b, np.int64)).to(dev)
        ct = torch.from_numpy(np.asarray(cols, np.int64)).to(dev)
        self.scores.transpose(1, 2)[bt, ct] = (self.q.index_select(0, bt) * lat[:, None, :]).sum(-1) * self.scale
        self.rows_read += len(rows)

    def combine(self, rows) -> None:
        """Softmax over all columns and the weighted sum of the latents, for each request in ``rows``."""
        kv = self.fmt.kv_rank
        for b in np.asarray(rows).tolist():
            p = torch.softmax(self.scores[b], dim=1)                                   # (H, K + 1)
            sl = torch.from_numpy(self.slots[b]).to(self.device)
            lat = self.fmt.decode(self.pool.index_select(0, sl.clamp(min=0)))[:, :kv]   # (K, kv)
            lat = torch.where((sl >= 0)[:, None], lat, 0.0)
            v = torch.cat([lat, self.own[b, None, :kv]], 0)                            # (K + 1, kv)
            self.out[b] = torch.matmul(p, v)
