"""A plain dense K/V cache for the dense model: per layer, every token's keys (after RoPE) and values.

The tiered decode engine keeps K/V in its own storage instead; this one exists so that the dense model can
prefill and decode, and as the "all resident" baseline.
"""
from __future__ import annotations

import torch

from ..validate import integer, positive_int
from .config import LlamaConfig

__all__ = ["KVCache"]


class KVCache:
    """Dense per-layer K/V store for a batch of sequences of different lengths.

    Attributes
    ----------
    k, v : list of (B, Hkv, capacity, hd) tensors, one per layer
        Token ``j`` of sequence ``b`` is at ``[b, :, j]``; entries at ``j >= lengths[b]`` are meaningless.
    lengths : (B,) int64 tensor
        Tokens stored per sequence (the position the next token of sequence ``b`` takes).
    """

    def __init__(self, config: LlamaConfig, batch: int, capacity: int = 256, dtype=torch.float32,
                 device="cpu"):
        if not isinstance(batch, int) or batch <= 0:
            raise ValueError(f"batch must be a positive int, got {batch!r}")
        if not isinstance(capacity, int) or not 0 < capacity <= config.context_length:
            raise ValueError(f"capacity must be an int in 1..{config.context_length}, got {capacity!r}")
        self.config = config
        shape = (batch, config.n_kv_heads, capacity, config.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layers)]
        self.lengths = torch.zeros(batch, dtype=torch.int64, device=device)

    @property
    def batch(self) -> int:
        return self.lengths.shape[0]

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    def nbytes(self) -> int:
        """Bytes held (all layers, the whole capacity)."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def reserve(self, capacity: int) -> None:
        """Grow every layer's store to hold ``capacity`` tokens per sequence (copying what is stored)."""
        capacity = positive_int("capacity", capacity)
        if capacity <= self.capacity:
            return
        if capacity > self.config.context_length:
            raise ValueError(f"capacity {capacity} exceeds the model's context of {self.config.context_length}")
        new = max(capacity, min(2 * self.capacity, self.config.context_length))
        for store in (self.k, self.v):
            for i, t in enumerate(store):
                grown = t.new_zeros(t.shape[:2] + (new,) + t.shape[3:])
                grown[:, :, : t.shape[2]] = t
                store[i] = grown

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
              valid: torch.Tensor | None = None) -> None:
        """Store new tokens' keys and values.

        Parameters
        ----------
        layer : int
        k, v : (B, Hkv, T, hd)
        positions : (B, T) int64, each < capacity where valid
        valid : (B, T) bool, optional
            Which tokens to store (padding of a ragged batch is not); all by default.
        """
        layer = integer("layer", layer, lo=0, below=len(self.k))
        b = torch.arange(self.batch, device=positions.device)[:, None].expand_as(positions)     # (B, T)
        k, v = k.transpose(1, 2), v.transpose(1, 2)                                            # (B, T, Hkv, hd)
        if valid is not None:
            b, positions, k, v = b[valid], positions[valid], k[valid], v[valid]                # (N,), (N, Hkv, hd)
        self.k[layer][b, :, positions] = k.to(self.k[layer].dtype)
        self.v[layer][b, :, positions] = v.to(self.v[layer].dtype)
