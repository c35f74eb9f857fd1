"""Dense causal grouped-query attention over a per-sequence K/V store (torch, CPU or CUDA).

This is the attention a dense model runs; a decode engine that keeps K/V elsewhere (tiered, sparse) replaces it
and keeps everything else of :class:`ess.llm.llama.LlamaModel`. Masking rule, per sequence ``b``: query ``t`` at
position ``q_positions[b, t]`` sees key ``j`` iff ``j <= q_positions[b, t]`` and ``j < kv_lengths[b]``.
"""
from __future__ import annotations

import math

import torch

__all__ = ["dense_attention", "IMPLS"]

IMPLS = ("matmul", "sdpa")
# query rows go in chunks whose scores stay below this many bytes; measured on a 2,048-token prefill here:
# 8 MiB took 8.3 s, 128 MiB 22.1 s (the scores then no longer stay in the CPU's caches)
_SCORE_BYTES = 8 * 2 ** 20


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor,
                    kv_lengths: torch.Tensor, impl: str = "matmul") -> torch.Tensor:
    """Causal GQA attention of new queries over stored keys and values.

    Parameters
    ----------
    q : (B, H, T, hd) float
        Queries after RoPE.
    k, v : (B, Hkv, S, hd) float
        Stored keys (after RoPE) and values, token ``j`` of sequence ``b`` at ``[b, :, j]``; ``H % Hkv == 0``,
        query head ``h`` reads KV head ``h // (H / Hkv)``.
    q_positions : (B, T) int64
        Position of each query token (its index in its sequence).
    kv_lengths : (B,) int64
        Valid stored tokens per sequence (entries at ``j >= kv_lengths[b]`` are ignored).
    impl : {"matmul", "sdpa"}
        ``"matmul"``: explicit scores, softmax and weighted sum, in query chunks of bounded memory (the
        reference-like path); ``"sdpa"``: ``torch.nn.functional.scaled_dot_product_attention`` with the same
        mask, or ``is_causal`` / no mask where those say the same (the baseline the benchmark compares with).

    Returns
    -------
    (B, H, T, hd), the dtype of ``q``
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    B, H, T, hd = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    if H % Hkv:
        raise ValueError(f"query heads ({H}) must be a multiple of KV heads ({Hkv})")
    # two common cases need no mask: every sequence holds all S entries and either one query at the last
    # position sees them all (a decode step), or T = S queries at positions 0..T-1 (a prefill) are plainly causal
    full = bool((kv_lengths == S).all())
    last_only = full and T == 1 and bool((q_positions[:, 0] == S - 1).all())
    causal = full and T == S and bool((q_positions == torch.arange(T, device=q.device)).all())
    mask = None
    if not (last_only or causal):
        keys = torch.arange(S, device=q.device)
        mask = (keys[None, None, :] <= q_positions[:, :, None]) & (keys[None, None, :] < kv_lengths[:, None, None])
    if impl == "sdpa":
        sdpa = torch.nn.functional.scaled_dot_product_attention
        if mask is None:
            return sdpa(q, k, v, is_causal=causal, enable_gqa=True)
        return sdpa(q, k, v, attn_mask=mask[:, None], enable_gqa=True)       # mask (B, 1, T, S)
    G = H // Hkv
    qg = q.reshape(B, Hkv, G, T, hd)                                        # query head h -> KV head h // G
    out = torch.empty_like(qg)
    scale = 1.0 / math.sqrt(hd)
    chunk = max(1, _SCORE_BYTES // max(1, B * H * S * q.element_size()))
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        n = t1 - t0
        s_hi = min(S, int(q_positions[:, t0:t1].max()) + 1)                 # keys past every query: skipped
        rows = qg[:, :, :, t0:t1].reshape(B, Hkv, G * n, hd)                 # a group's queries stacked
        scores = torch.matmul(rows, k[:, :, :s_hi].transpose(-1, -2)) * scale   # (B, Hkv, G n, s_hi)
        if mask is not None:
            scores.view(B, Hkv, G, n, s_hi).masked_fill_(~mask[:, None, None, t0:t1, :s_hi], float("-inf"))
        elif causal:
            future = torch.arange(s_hi, device=q.device)[None] > torch.arange(t0, t1, device=q.device)[:, None]
            scores.view(B, Hkv, G, n, s_hi).masked_fill_(future, float("-inf"))
        out[:, :, :, t0:t1] = torch.matmul(torch.softmax(scores, dim=-1), v[:, :, :s_hi]).view(B, Hkv, G, n, hd)
    return out.reshape(B, H, T, hd)
