"""The Llama forward pass in plain NumPy float64, written to be read: the oracle for :mod:`ess.llm.llama`.

One sequence, no cache, every step spelled out. The maths is Hugging Face ``transformers``' ``LlamaForCausalLM``
(the architecture of SmolLM2, model card ``HuggingFaceTB/SmolLM2-135M-Instruct``):

* RMSNorm: ``x / sqrt(mean(x^2) + eps) * w``;
* RoPE (rotate half): for head dimension pair ``(i, i + hd/2)`` at position ``p`` the angle is
  ``p * base^(-2i/hd)``, and ``x' = x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = (-x2, x1)``;
* grouped-query attention: query head ``h`` reads KV head ``h // (H / Hkv)``, scores scaled by ``1/sqrt(hd)``,
  causal (a token sees itself and the tokens before it);
* SwiGLU MLP: ``w_down (silu(w_gate x) * (w_up x))``;
* pre-norm residual blocks, a final RMSNorm, and the output head (tied to the embedding for SmolLM2).
"""
from __future__ import annotations

import numpy as np

from .config import LlamaConfig
from .weights import LlamaWeights

__all__ = ["rms_norm", "rope_angles", "apply_rope", "causal_attention", "swiglu", "forward"]


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """``x``: (..., D), ``w``: (D,) -> (..., D)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_angles(positions: np.ndarray, head_dim: int, base: float) -> np.ndarray:
    """Rotation angles, ``positions``: (T,) -> (T, head_dim/2), angle[t, i] = positions[t] * base^(-2i/head_dim)."""
    from ..validate import positive_int
    head_dim = positive_int("head_dim", head_dim)
    inv_freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)      # (hd/2,)
    return np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]


def apply_rope(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE. ``x``: (heads, T, hd), ``angles``: (T, hd/2) -> (heads, T, hd)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = np.cos(angles), np.sin(angles)                                         # (T, hd/2)
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Causal grouped-query attention over one sequence.

    ``q``: (H, T, hd); ``k``, ``v``: (Hkv, T, hd) -> (H, T, hd). Query head ``h`` uses KV head ``h // (H/Hkv)``.
    """
    H, T, hd = q.shape
    group = H // k.shape[0]
    out = np.empty_like(q)
    for h in range(H):
        kh, vh = k[h // group], v[h // group]                                         # (T, hd)
        scores = q[h] @ kh.T / np.sqrt(hd)                                            # (T, T)
        scores = np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf)
        p = np.exp(scores - scores.max(axis=-1, keepdims=True))
        out[h] = (p / p.sum(axis=-1, keepdims=True)) @ vh
    return out


def swiglu(x: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray) -> np.ndarray:
    """``x``: (T, D) -> (T, D); ``w_gate``, ``w_up``: (F, D), ``w_down``: (D, F)."""
    g = x @ w_gate.T
    return ((g / (1.0 + np.exp(-g))) * (x @ w_up.T)) @ w_down.T


def forward(weights: LlamaWeights, config: LlamaConfig, token_ids) -> np.ndarray:
    """Logits of every position of one sequence.

    Parameters
    ----------
    weights : LlamaWeights
        Any float dtype; everything is computed in float64.
    config : LlamaConfig
    token_ids : (T,) ints

    Returns
    -------
    (T, V) float64
    """
    ids = np.asarray(token_ids, dtype=np.int64)
    T, H, Hkv, hd = len(ids), config.n_heads, config.n_kv_heads, config.head_dim
    f64 = lambda a: np.asarray(a, dtype=np.float64)  # noqa: E731
    x = f64(weights.embedding)[ids]                                                   # (T, D)
    angles = rope_angles(np.arange(T), hd, config.rope_base)                          # (T, hd/2)
    for lw in weights.layers:
        h = rms_norm(x, f64(lw.attn_norm), config.rms_eps)
        q = (h @ f64(lw.wq).T).reshape(T, H, hd).transpose(1, 0, 2)                   # (H, T, hd)
        k = (h @ f64(lw.wk).T).reshape(T, Hkv, hd).transpose(1, 0, 2)                 # (Hkv, T, hd)
        v = (h @ f64(lw.wv).T).reshape(T, Hkv, hd).transpose(1, 0, 2)
        a = causal_attention(apply_rope(q, angles), apply_rope(k, angles), v)          # (H, T, hd)
        x = x + a.transpose(1, 0, 2).reshape(T, H * hd) @ f64(lw.wo).T
        x = x + swiglu(rms_norm(x, f64(lw.ffn_norm), config.rms_eps), f64(lw.w_gate), f64(lw.w_up), f64(lw.w_down))
    return rms_norm(x, f64(weights.final_norm), config.rms_eps) @ f64(weights.output).T
