"""The real model's cache entry: one token's keys and values of one layer, as the bytes the tiered storage moves.

Layout (float32, little-endian; ``Hkv`` KV heads of ``hd`` dims, keys after RoPE)::

    [0, 4 Hkv hd)          K, Hkv x hd float32
    [4 Hkv hd, 8 Hkv hd)   V, Hkv x hd float32

2 x 3 x 64 x 4 = **1,536 B** per token and layer for SmolLM2-135M (3 KV heads of 64 dims), full precision: the
engine computes in float32, so the entry is exactly what dense attention reads. (DeepSeek's latent entry is 656 B
in FP8, :mod:`ess.layout`.) An entry is stored as uint8 bytes and read as float32 through a view, never converted.
"""
from __future__ import annotations

import torch

from ..layout import EntryFormat
from ..llm.config import LlamaConfig

__all__ = ["KV_PAGE_TOKENS", "kv_entry_format", "kv_entries", "kv_view"]

# design choice: pools are sized on contexts rounded up to 64-token pages and the disk tier writes 64-token blocks,
# as for DeepSeek's cache (paper-facts.md "Byte layouts": pages of 64 tokens), so that a ratio means the same here
KV_PAGE_TOKENS = 64


def kv_entry_format(config: LlamaConfig, name: str = "llama") -> EntryFormat:
    """The K/V entry of a Llama-architecture model: ``2 x n_kv_heads x head_dim`` float32 (1,536 B for
    SmolLM2-135M), ``n_layers`` per token, up to ``context_length`` tokens."""
    if not isinstance(config, LlamaConfig):
        raise TypeError(f"config must be an ess.llm.LlamaConfig, got {type(config).__name__}")
    entry = 2 * config.n_kv_heads * config.head_dim * 4
    return EntryFormat(f"{name} K/V float32", config.n_layers, entry, KV_PAGE_TOKENS, config.context_length,
                       "float32")


def kv_entries(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Entries ``(B, T, entry_bytes)`` uint8 of keys and values ``(B, Hkv, T, hd)`` float32 (one copy, into the
    layout of the module docstring)."""
    if k.dtype != torch.float32 or v.dtype != torch.float32 or k.shape != v.shape or k.ndim != 4:
        raise ValueError(f"k and v must be float32 tensors of one shape (B, Hkv, T, hd), got {k.dtype} {tuple(k.shape)}"
                         f" and {v.dtype} {tuple(v.shape)}")
    kv = torch.stack([k.transpose(1, 2), v.transpose(1, 2)], dim=2)               # (B, T, 2, Hkv, hd)
    B, T = kv.shape[:2]
    return kv.contiguous().view(torch.uint8).reshape(B, T, -1)


def kv_view(rows: torch.Tensor, n_kv_heads: int, head_dim: int) -> torch.Tensor:
    """Entries ``(..., entry_bytes)`` uint8 seen as ``(..., 2, Hkv, hd)`` float32 (a view; K at ``[..., 0]``)."""
    return rows.view(torch.float32).unflatten(-1, (2, n_kv_heads, head_dim))
