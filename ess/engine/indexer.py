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
(:func:`selection_mass` recomputes it). The kernels are the family :mod:`ess.kernels.gqa_indexer` (a NumPy float64
oracle, Numba for the CPU, torch for CPU and CUDA), chosen by ``backend``.

**Top-K**: :func:`ess.kernels.topk.topk_positions` (what :func:`ess.attention.topk_indices` checks and calls), the
library's one rule -- the ``min(K, n)`` best-scored cached tokens in position order, ties to the lower position,
``-1`` padded.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .. import validate
from ..kernels import as_kernel_array, resolve_backend
from ..kernels.gqa_indexer import get as _indexer_kernels
from ..kernels.gqa_indexer import gqa_indexer_scores
from ..kernels.topk import topk_positions
from ..quant import FP8_E4M3_MAX

__all__ = ["indexer_key_bytes", "quantize_keys", "IndexerCache", "selection_mass"]


def indexer_key_bytes(n_kv_heads: int, head_dim: int) -> int:
    """Bytes of one indexer key: ``Hkv x hd`` FP8 codes plus ``Hkv`` float32 scales (204 B for SmolLM2-135M)."""
    from ..validate import positive_int
    n_kv_heads, head_dim = positive_int("n_kv_heads", n_kv_heads), positive_int("head_dim", head_dim)
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


class IndexerCache:
    """The device-resident indexer keys of a batch: for ``max_requests`` requests of up to ``capacity`` tokens,
    per layer one block of codes ``(n_layers, max_requests, capacity, Hkv hd)`` uint8 and one of scales
    ``(n_layers, max_requests, capacity, Hkv)`` float32, torch tensors on ``device`` (the first ``n_tokens`` of a
    request's row are valid). ``backend`` picks the kernels (:mod:`ess.kernels.gqa_indexer`, top-K), resolved once:
    :meth:`select` calls the scoring kernel directly on buffers whose shapes are fixed here (the public function's
    checks would cost, per layer, more than a short context's scan)."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, *, max_requests: int, capacity: int,
                 device="cpu", backend: str = "auto"):
        self.n_layers = validate.positive_int("n_layers", n_layers)
        self.n_kv_heads = validate.positive_int("n_kv_heads", n_kv_heads)
        self.head_dim = validate.positive_int("head_dim", head_dim)
        self.max_requests = validate.positive_int("max_requests", max_requests)
        self.capacity = validate.positive_int("capacity", capacity)
        self.device = torch.device(device)
        self.backend = backend
        D = n_kv_heads * head_dim
        self.codes = torch.zeros((n_layers, max_requests, capacity, D), dtype=torch.uint8, device=self.device)
        self.scales = torch.ones((n_layers, max_requests, capacity, n_kv_heads), dtype=torch.float32,
                                 device=self.device)
        self.lengths = torch.zeros(max_requests, dtype=torch.int64, device=self.device)   # tokens per row
        self._row: dict = {}                      # request id -> row
        self._n: list = [0] * max_requests        # tokens per row, on the host
        self.resolved = resolve_backend(backend, device=str(self.device))
        self._kernel = _indexer_kernels(self.resolved)
        self._scores = torch.empty((max_requests, capacity), dtype=torch.float32, device=self.device)
        self._k = {name: as_kernel_array(getattr(self, name), self.resolved)
                   for name in ("codes", "scales", "lengths", "_scores")}

    @property
    def key_bytes(self) -> int:
        return indexer_key_bytes(self.n_kv_heads, self.head_dim)

    def row(self, request_id) -> int:
        try:
            return self._row[request_id]
        except (KeyError, TypeError):
            raise ValueError(f"unknown request_id {request_id!r}") from None

    def add_request(self, request_id, codes: torch.Tensor, scales: torch.Tensor) -> None:
        """A prefilled request's keys as :func:`quantize_keys` gives them -- codes ``(n_layers, L, Hkv hd)``,
        scales ``(n_layers, L, Hkv)`` -- into the next free row."""
        if request_id in self._row:
            raise ValueError(f"request_id {request_id!r} already exists")
        if len(self._row) == self.max_requests:
            raise ValueError(f"the indexer cache holds max_requests={self.max_requests} requests, all in use")
        n_layers, L = codes.shape[:2]
        if (n_layers != self.n_layers or codes.shape[2] != self.n_kv_heads * self.head_dim
                or tuple(scales.shape) != (n_layers, L, self.n_kv_heads)):
            raise ValueError(f"codes and scales must have shapes (n_layers={self.n_layers}, L, "
                             f"{self.n_kv_heads * self.head_dim}) and (n_layers, L, {self.n_kv_heads}), got "
                             f"{tuple(codes.shape)} and {tuple(scales.shape)}")
        if L > self.capacity:
            raise ValueError(f"codes hold {L} tokens, more than the capacity={self.capacity}")
        r = len(self._row)
        self.codes[:, r, :L] = codes.to(self.device)
        self.scales[:, r, :L] = scales.to(self.device)
        self.lengths[r] = L
        self._row[request_id], self._n[r] = r, L

    def append_tokens(self, request_ids, keys: torch.Tensor) -> None:
        """One new token per request, every layer: ``keys`` ``(n_layers, B, Hkv, hd)`` float32 on the device, in the
        order of ``request_ids`` (quantised once for the batch, written in one call)."""
        rows = [self.row(r) for r in request_ids]
        for r in rows:
            if self._n[r] >= self.capacity:
                raise ValueError(f"request row {r}: the indexer cache holds {self._n[r]} tokens, its capacity")
        codes, scales = quantize_keys(keys)                                          # (n_layers, B, D), (.., Hkv)
        r_t = torch.as_tensor(rows, device=self.device)
        n_t = torch.as_tensor([self._n[r] for r in rows], device=self.device)
        self.codes[:, r_t, n_t] = codes
        self.scales[:, r_t, n_t] = scales
        self.lengths[r_t] += 1
        for r in rows:
            self._n[r] += 1

    def n_tokens(self, request_id) -> int:
        return self._n[self.row(request_id)]

    def keys(self, request_id, layer: int):
        """``(codes (n, Hkv hd) uint8, scales (n, Hkv) float32)`` of the valid tokens of one layer (views)."""
        layer = validate.integer("layer", layer, lo=0, below=self.n_layers)
        r, n = self.row(request_id), self.n_tokens(request_id)
        return self.codes[layer, r, :n], self.scales[layer, r, :n]

    def scores(self, layer: int, q: torch.Tensor, rows: slice) -> torch.Tensor:
        """Scores ``(n, capacity)`` float32 of the requests in ``rows`` (consecutive rows, a slice) against their
        queries ``q`` ``(n, H, hd)``; ``-inf`` past each request's tokens (the public kernel function, checked)."""
        layer = validate.integer("layer", layer, lo=0, below=self.n_layers)
        return gqa_indexer_scores(q.contiguous(), self.codes[layer, rows], self.scales[layer, rows],
                                  self.lengths[rows], backend=self.backend)

    def select(self, layer: int, q: torch.Tensor, rows: slice, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The top-``k`` of requests ``rows`` (a slice of consecutive rows) for their queries ``q`` ``(n, H, hd)``
        float32 (contiguous, on the device): positions ``(n, k)`` int64 in position order, ``-1`` padded, and their
        scores ``(n, k)`` float64 (0 at padding), NumPy arrays on the host."""
        layer = validate.integer("layer", layer, lo=0, below=self.n_layers)   # ~0.2 us: an index, not a slice
        K = self._k
        self._kernel.indexer_scores(as_kernel_array(q, self.resolved), K["codes"][layer, rows],
                                    K["scales"][layer, rows], K["lengths"][rows], K["_scores"][rows])
        scores = self._scores[rows]                                                  # (n, capacity)
        idx = topk_positions(scores, k, backend=self.resolved)                        # (n, k) on the device
        picked = scores.gather(1, idx.clamp(min=0)).masked_fill_(idx < 0, 0.0)
        return idx.cpu().numpy(), picked.cpu().numpy().astype(np.float64)

    @property
    def nbytes(self) -> int:
        """Bytes of valid keys, all requests and layers."""
        return sum(self._n) * self.n_layers * self.key_bytes


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
    k8 = codes.cpu().view(torch.float8_e4m3fn).float().view(n, Hkv, hd) * scales.cpu()[:, :, None]
    approx = torch.einsum("ngd,gjd->ngj", k8, q.cpu().view(Hkv, G, hd)).reshape(n, H) / math.sqrt(hd)
    rules = {"probability_sum": torch.softmax(approx, 0).sum(1), "logit_sum": approx.sum(1),
             "relu_sum": torch.relu(approx).sum(1), "exact": probs.sum(1)}
    K = min(K, n)
    return {name: float(probs[torch.topk(s, K).indices].sum(0).mean()) for name, s in rules.items()}
