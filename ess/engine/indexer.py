"""The real model's indexer: a device-resident FP8 copy of every token's keys, scored against the new token's
queries, and the top-K each layer reads -- the analogue of DeepSeek Sparse Attention's lightning indexer.

**Indexer key** (one token, one layer): the token's keys after RoPE, ``Hkv x hd`` values, quantised to FP8 e4m3 with
one float32 scale per KV head (:func:`ess.quant.quantize_fp8_tiles`, tiles of ``hd``)::

    [0, Hkv hd)              FP8 e4m3 codes
    [Hkv hd, Hkv hd + 4 Hkv) Hkv x float32 scales

3 x 64 + 3 x 4 = **204 B** per token and layer for SmolLM2-135M, 13 % of its 1,536-byte K/V entry (DeepSeek's
indexer key is 132 B, 20 % of its 656-byte latent entry; paper-facts.md "Byte layouts"). Like DeepSeek's, it stays
on the device for every token, because the indexer scans the whole context at every step.

**Score** of cached token ``s`` for the new token's queries ``q_h`` (``H`` query heads; head ``h`` reads KV head
``h // (H / Hkv)``)::

    score(s) = sum_h softmax_s( q_h . k8_{g(h)}(s) / sqrt(hd) )

the attention weight each query head would give ``s`` with the FP8 keys ``k8``, summed over the heads: one score per
token shared by all heads, so one top-K set per token and layer (DSA's MQA mode). The sum of the heads'
probabilities was chosen over the sum of their logits and over DSA's ``sum_h ReLU(q_h . k)`` (unit head weights) as
the one whose top-K holds the most dense attention mass on real text: measured with SmolLM2-135M on tokens 5,000 ..
7,047 of :func:`ess.llm.reference_text_ids`, K = 128, the last 16 positions, all 30 layers, it keeps 0.851 of the
mass (exact keys and per-head probabilities: 0.851), the logit sum 0.833, the ReLU sum 0.822
(:func:`selection_mass` recomputes it).

**Top-K**: the ``min(K, n)`` best-scored cached tokens, returned in position order (ascending), the order attention
reads them in. Ties at the boundary fall the same way on every run (the same function on the same scores).

Kernels: :func:`indexer_scores_reference` (NumPy float64, the oracle), a Numba kernel (CPU) and a torch one
(CUDA) with its signature; :func:`indexer_scores` picks by where the keys are.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

from .. import validate
from ..quant import FP8_E4M3_MAX, FP8_E4M3_VALUES, fp8_e4m3_decode

__all__ = ["indexer_key_bytes", "quantize_keys", "IndexerCache", "indexer_scores", "indexer_scores_reference",
           "topk_positions", "selection_mass"]


def indexer_key_bytes(n_kv_heads: int, head_dim: int) -> int:
    """Bytes of one indexer key: ``Hkv x hd`` FP8 codes plus ``Hkv`` float32 scales (204 B for SmolLM2-135M)."""
    return n_kv_heads * head_dim + 4 * n_kv_heads


def quantize_keys(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 e4m3 codes ``(..., Hkv x hd)`` uint8 and scales ``(..., Hkv)`` float32 of keys ``(..., Hkv, hd)`` float32:
    per KV head ``s = amax / 448`` (1 for an all-zero head), codes of ``k / s`` rounded to nearest, ties to even --
    bit for bit what :func:`ess.quant.quantize_fp8_tiles` gives with tiles of ``hd`` (a test keeps them equal), on
    the keys' device."""
    amax = k.abs().amax(dim=-1)                                                      # (..., Hkv)
    scales = torch.where(amax > 0, amax / np.float32(FP8_E4M3_MAX), torch.ones_like(amax))
    codes = (k.double() / scales.double()[..., None]).to(torch.float8_e4m3fn).view(torch.uint8)
    return codes.flatten(-2), scales


@lru_cache(maxsize=None)
def _lut(device: str) -> torch.Tensor:
    return torch.tensor(FP8_E4M3_VALUES, device=device)


class IndexerCache:
    """The device-resident indexer keys of a batch: per request, per layer, ``capacity`` tokens of codes and scales
    (NumPy on the CPU, torch tensors on CUDA), of which the first ``n_tokens`` are valid."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, *, device: str = "cpu"):
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.device = str(device)
        self.on_cuda = self.device.startswith("cuda")
        self._codes: dict = {}
        self._scales: dict = {}
        self._n: dict = {}

    @property
    def key_bytes(self) -> int:
        return indexer_key_bytes(self.n_kv_heads, self.head_dim)

    def _store(self, t: torch.Tensor):
        return t.to(self.device) if self.on_cuda else t.cpu().numpy()

    def add_request(self, request_id, codes: torch.Tensor, scales: torch.Tensor, capacity: int) -> None:
        """A prefilled request's keys as :func:`quantize_keys` gives them -- codes ``(n_layers, L, Hkv hd)``,
        scales ``(n_layers, L, Hkv)`` -- with room for ``capacity`` tokens."""
        if request_id in self._n:
            raise ValueError(f"request_id {request_id!r} already exists")
        n_layers, L = codes.shape[:2]
        if (n_layers != self.n_layers or codes.shape[2] != self.n_kv_heads * self.head_dim
                or tuple(scales.shape) != (n_layers, L, self.n_kv_heads)):
            raise ValueError(f"codes and scales must have shapes (n_layers={self.n_layers}, L, "
                             f"{self.n_kv_heads * self.head_dim}) and (n_layers, L, {self.n_kv_heads}), got "
                             f"{tuple(codes.shape)} and {tuple(scales.shape)}")
        capacity = validate.integer("capacity", capacity, lo=L)
        c = torch.zeros((n_layers, capacity, codes.shape[-1]), dtype=torch.uint8)
        s = torch.ones((n_layers, capacity, self.n_kv_heads), dtype=torch.float32)
        c[:, :L], s[:, :L] = codes.cpu(), scales.cpu()
        self._codes[request_id], self._scales[request_id] = self._store(c), self._store(s)
        self._n[request_id] = L

    def append_token(self, request_id, keys: torch.Tensor) -> int:
        """One new token's keys ``(n_layers, Hkv, hd)`` float32, every layer; returns its index."""
        n = self.n_tokens(request_id)
        if n >= self._codes[request_id].shape[1]:
            raise ValueError(f"request {request_id!r}: the indexer cache holds {n} tokens, its capacity")
        codes, scales = quantize_keys(keys)
        if self.on_cuda:
            self._codes[request_id][:, n] = codes.to(self.device)
            self._scales[request_id][:, n] = scales.to(self.device)
        else:
            self._codes[request_id][:, n], self._scales[request_id][:, n] = codes.cpu().numpy(), scales.cpu().numpy()
        self._n[request_id] = n + 1
        return n

    def n_tokens(self, request_id) -> int:
        try:
            return self._n[request_id]
        except (KeyError, TypeError):
            raise ValueError(f"unknown request_id {request_id!r}") from None

    def keys(self, request_id, layer: int):
        """``(codes (n, Hkv hd) uint8, scales (n, Hkv) float32)`` of the valid tokens of one layer (views)."""
        n = self.n_tokens(request_id)
        return self._codes[request_id][layer, :n], self._scales[request_id][layer, :n]

    @property
    def nbytes(self) -> int:
        """Bytes of valid keys, all requests and layers."""
        return sum(self._n.values()) * self.n_layers * self.key_bytes


# ----------------------------------------------------------------------------------------------------------------
# scores
# ----------------------------------------------------------------------------------------------------------------

def indexer_scores_reference(q, codes, scales) -> np.ndarray:
    """The score of every cached token (module docstring), NumPy float64: q ``(H, hd)``, codes ``(n, Hkv hd)``
    uint8, scales ``(n, Hkv)`` float32 -> ``(n,)`` float64."""
    q = np.asarray(q, np.float64)
    H, hd = q.shape
    n, Hkv = np.shape(scales)
    k = fp8_e4m3_decode(np.asarray(codes)).astype(np.float64).reshape(n, Hkv, hd)
    k *= np.asarray(scales, np.float64)[:, :, None]
    logits = np.einsum("ngd,gjd->ngj", k, q.reshape(Hkv, H // Hkv, hd)).reshape(n, H) / math.sqrt(hd)
    p = np.exp(logits - logits.max(axis=0))
    return (p / p.sum(axis=0)).sum(axis=1)


@lru_cache(maxsize=None)
def _numba_kernel():
    from numba import njit

    @njit(nogil=True, fastmath=True, cache=True)
    def scores(q, codes, scales, lut, inv_sqrt, out):                   # (H, hd) (n, Hkv hd) (n, Hkv) (256,) (n,)
        H, hd = q.shape
        n, Hkv = scales.shape
        G = H // Hkv
        logits = np.empty((n, H), np.float32)
        kbuf = np.empty(hd, np.float32)
        mx = np.full(H, -np.inf, np.float32)
        for s in range(n):
            for g in range(Hkv):
                f = scales[s, g] * inv_sqrt
                for d in range(hd):
                    kbuf[d] = lut[codes[s, g * hd + d]]
                for j in range(G):
                    h = g * G + j
                    acc = np.float32(0.0)
                    for d in range(hd):
                        acc += q[h, d] * kbuf[d]
                    x = acc * f
                    logits[s, h] = x
                    if x > mx[h]:
                        mx[h] = x
        z = np.zeros(H, np.float32)
        for s in range(n):
            for h in range(H):
                e = np.exp(logits[s, h] - mx[h])
                logits[s, h] = e
                z[h] += e
        for s in range(n):
            acc = np.float32(0.0)
            for h in range(H):
                acc += logits[s, h] / z[h]
            out[s] = acc
    return scores


_LUT_NP = np.ascontiguousarray(FP8_E4M3_VALUES, dtype=np.float32)


def _torch_scores(q: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    H, hd = q.shape
    n, Hkv = scales.shape
    k = _lut(str(codes.device))[codes.long()].view(n, Hkv, hd) * scales[:, :, None]          # (n, Hkv, hd)
    logits = torch.einsum("ngd,gjd->ngj", k, q.view(Hkv, H // Hkv, hd)).reshape(n, H) / math.sqrt(hd)
    return torch.softmax(logits, dim=0).sum(dim=1)


def indexer_scores(q: torch.Tensor, codes, scales):
    """The score of every cached token: q ``(H, hd)`` float32 (a torch tensor on the keys' device), codes and
    scales from :meth:`IndexerCache.keys`. NumPy keys: the Numba kernel, a ``(n,)`` float32 array; CUDA keys: the
    torch kernel, a ``(n,)`` tensor. Arithmetic is float32 (compare with the reference with a tolerance)."""
    if isinstance(codes, np.ndarray):
        out = np.empty(codes.shape[0], np.float32)
        if codes.shape[0]:
            _numba_kernel()(np.ascontiguousarray(q.detach().cpu().numpy(), np.float32), codes, scales, _LUT_NP,
                            np.float32(1.0 / math.sqrt(q.shape[1])), out)
        return out
    return _torch_scores(q.to(codes.device, torch.float32), codes, scales)


def topk_positions(scores, k: int):
    """The ``min(k, n)`` best-scored tokens of ``scores`` ``(n,)``, in position order (int64; NumPy in, NumPy out;
    torch in, torch out)."""
    n = scores.shape[0]
    if isinstance(scores, np.ndarray):
        if k >= n:
            return np.arange(n, dtype=np.int64)
        return np.sort(np.argpartition(-scores, k - 1)[:k]).astype(np.int64)
    if k >= n:
        return torch.arange(n, device=scores.device)
    return torch.sort(torch.topk(scores, k, sorted=False).indices).values


def selection_mass(q: torch.Tensor, k: torch.Tensor, K: int) -> dict:
    """How much of dense attention each scoring rule's top-K keeps: q ``(H, hd)`` one query's heads, k
    ``(n, Hkv, hd)`` the keys it may read (float32). Returns, per rule (``"probability_sum"`` -- this module's --,
    ``"logit_sum"``, ``"relu_sum"``, and ``"exact"``: the probability sum with unquantised keys), the dense softmax
    mass of the chosen K tokens, averaged over the heads."""
    H, hd = q.shape
    n, Hkv = k.shape[:2]
    G = H // Hkv
    logits = torch.einsum("ngd,gjd->ngj", k, q.view(Hkv, G, hd)).reshape(n, H) / math.sqrt(hd)
    probs = torch.softmax(logits, dim=0)                                                   # (n, H) dense weights
    codes, scales = quantize_keys(k)
    k8 = _lut("cpu")[codes.long().cpu()].view(n, Hkv, hd) * scales.cpu()[:, :, None]
    approx = torch.einsum("ngd,gjd->ngj", k8, q.cpu().view(Hkv, G, hd)).reshape(n, H) / math.sqrt(hd)
    rules = {"probability_sum": torch.softmax(approx, 0).sum(1), "logit_sum": approx.sum(1),
             "relu_sum": torch.relu(approx).sum(1), "exact": probs.sum(1)}
    K = min(K, n)
    return {name: float(probs[torch.topk(s, K).indices].sum(0).mean()) for name, s in rules.items()}
