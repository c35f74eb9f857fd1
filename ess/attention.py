"""DeepSeek Sparse Attention at decode time: the lightning indexer, top-K selection, sparse MLA attention in MQA mode,
split attention merged by log-sum-exp, and one decode step that reads its latents through the tiered cache.

The maths [DS ``inference/model.py``; paper-facts.md "DeepSeek-V3.2-Exp geometry"]:

* **Lightning indexer**: ``I(t, s) = sum_j w(t, j) * ReLU(q(t, j) . k(s))`` over the indexer heads ``j``; one key per
  token, shared by all heads; causal (token ``s`` is visible to a query at position ``t`` when ``s <= t``). Any
  constant factors of the model (``n_heads**-0.5``, ``head_dim**-0.5``) are folded into ``w`` by the caller. Keys are
  read from the 132-byte indexer entries (FP8 plus one float32 scale, :mod:`ess.quant`); queries may be FP8-rounded
  and Hadamard-rotated with :func:`prepare_index_queries`, as in the model.
* **Top-K**: the ``min(K, L)`` highest scores; ties go to the **lower token index**; the result is ordered by score
  (highest first) and padded with ``-1`` to width K when fewer than K tokens are visible.
* **Sparse MLA, MQA mode**: each latent (``kv_lora_rank`` c_KV values + ``qk_rope_head_dim`` rope values, 576 for
  the full model) is shared by all H query heads; ``softmax(sm_scale * q . latent)`` over the selected entries; the
  value is the c_KV part (absorbed MLA: the output is 512-d per head, before the up-projection). Returns the output
  and the log-sum-exp ``lse = log sum exp(sm_scale * q . latent)``.
* **Softmax scale** (:func:`softmax_scale`): ``(qk_nope_head_dim + qk_rope_head_dim)**-0.5 * mscale**2`` with
  ``mscale = 0.1 ln(rope_factor) + 1`` (YaRN): ``192**-0.5 * (0.1 ln 40 + 1)**2 = 0.1352`` for DeepSeek-V3.2-Exp
  (paper-facts.md, [DS] ``inference/model.py``); ``32 + 16 = 48`` and factor 1 give ``48**-0.5`` for ``tiny``.
* **Split attention**: attention over two disjoint index sets (the DA overlap's Attn0 over hits, Attn1 over misses)
  merged exactly by their log-sum-exps: ``o = (e^{lse0} o0 + e^{lse1} o1) / (e^{lse0} + e^{lse1})``.

Arrays are NumPy on the host; ``backend`` is ``"auto" | "reference" | "numba" | "torch"`` and ``device`` picks where
torch runs (``"cpu"`` or ``"cuda"``), both resolved by :func:`ess.kernels.resolve_backend`.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .kernels import resolve_backend
from .kernels.attention import get as _kernels
from .layout import indexer_entry_bytes, latent_layout
from .quant import FP8_BLOCK, dequantize_fp8_tiles, hadamard_rotate, quantize_fp8_tiles
from .specs import ModelSpec, model_spec

__all__ = [
    "softmax_scale", "prepare_index_queries", "indexer_scores", "topk_indices", "sparse_mla_decode",
    "dense_mla_decode", "merge_attention", "split_attention", "AttentionOutput", "DecodeStep", "decode_step",
    "resident_attention", "latent_format", "indexer_selection_example", "storage_precision",
    "attention_cost_scan", "lossless_check", "record_indexer_trace",
]


@dataclass(frozen=True)
class AttentionOutput:
    """``out`` (B, H, kv_lora_rank) float32 and ``lse`` (B, H) float32 (``-inf`` where no entry was attended)."""

    out: np.ndarray
    lse: np.ndarray


def softmax_scale(model: ModelSpec) -> float:
    """``(qk_nope + qk_rope)**-0.5 * mscale**2``, ``mscale = 0.1 ln(rope_factor) + 1`` ([DS] ``inference/model.py``
    with ``mscale = 1``; 0.1352 for DeepSeek-V3.2-Exp)."""
    mscale = 0.1 * math.log(model.rope_factor) + 1.0 if model.rope_factor > 1 else 1.0
    return (model.qk_nope_head_dim + model.qk_rope_head_dim) ** -0.5 * mscale * mscale


def latent_format(model: ModelSpec, dtype: str = "fp8") -> tuple[bool, int, int, int]:
    """The ``(fp8, kv_rank, rope_dim, tile)`` description kernels take, checked against :func:`latent_layout`."""
    lay = latent_layout(model, dtype)
    fp8 = dtype == "fp8"
    kv, rope, tile = model.kv_lora_rank, model.qk_rope_head_dim, model.latent_fp8_tile
    expected = (kv + 4 * (kv // tile) + 2 * rope) if fp8 else 2 * (kv + rope)
    if lay.entry_bytes != expected or lay.ckv_offset != 0 or lay.rope_offset != expected - 2 * rope:
        raise ValueError(f"{model.name}: latent layout {lay} is not one the attention kernels read")
    return fp8, kv, rope, tile


# ----------------------------------------------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------------------------------------------

def _float_array(x: Any, name: str, ndim: int, shape_doc: str) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    x = np.asarray(x)
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)) or x.dtype == bool:
        raise TypeError(f"{name} must be a float array {shape_doc}, got dtype {x.dtype}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have shape {shape_doc}, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} must hold finite values only (found NaN or inf)")
    return np.ascontiguousarray(x, dtype=np.float32)


def _byte_array(x: Any, name: str, ndims: tuple[int, ...], shape_doc: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.uint8:
        raise TypeError(f"{name} must be uint8 cache entries {shape_doc}, got dtype {x.dtype}")
    if x.ndim not in ndims:
        raise ValueError(f"{name} must have shape {shape_doc}, got shape {x.shape}")
    return np.ascontiguousarray(x)


def _positive_int(k: Any, name: str) -> int:
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"{name} must be a positive integer, got {k!r}")
    if k <= 0:
        raise ValueError(f"{name} must be > 0, got {k}")
    return int(k)


def _check_scale(sm_scale: Any) -> float:
    try:
        s = float(sm_scale)
    except (TypeError, ValueError):
        raise TypeError(f"sm_scale must be a number, got {sm_scale!r}") from None
    if not math.isfinite(s) or s <= 0:
        raise ValueError(f"sm_scale must be finite and > 0, got {sm_scale!r}")
    return s


def _lengths(lengths: Any, B: int, L: int) -> np.ndarray:
    if lengths is None:
        return np.full(B, L, dtype=np.int64)
    arr = np.asarray(lengths)
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"lengths must be an integer array ({B},) (one per request), got dtype {arr.dtype}")
    if arr.shape != (B,):
        raise ValueError(f"lengths must be {B} integers (one per request), got shape {arr.shape}")
    if arr.min(initial=1) < 1 or arr.max(initial=1) > L:
        raise ValueError(f"lengths must be in [1, L={L}], got min {arr.min()} max {arr.max()}")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _run(backend: str, device: str | None, name: str, *args) -> None:
    be = resolve_backend(backend, device=device)
    fn = getattr(_kernels(be), name)
    if be == "torch":
        fn(*args, device=device or "cpu")
    else:
        fn(*args)


# ----------------------------------------------------------------------------------------------------------------
# indexer and top-k
# ----------------------------------------------------------------------------------------------------------------

def prepare_index_queries(q, *, rotate: bool = True, fp8: bool = True) -> np.ndarray:
    """Indexer queries as the model feeds them to the FP8 kernel: Hadamard-rotated over the head dim, then rounded
    to FP8 e4m3 with one scale per :data:`ess.quant.FP8_BLOCK`-value block (per query head;
:func:`ess.quant.quantize_fp8_tiles`). Rotate the keys too (before
    :func:`ess.quant.encode_indexer_keys`) so that dot products are preserved."""
    q = _float_array(q, "q", np.ndim(q), "(..., D)")
    if rotate:
        q = hadamard_rotate(q)
    if fp8:
        d = q.shape[-1]
        tile = min(d, FP8_BLOCK)
        if d % tile:
            raise ValueError(f"q: head dim {d} must be a multiple of {FP8_BLOCK} (or at most {FP8_BLOCK}) for FP8 "
                             f"blocks")
        codes, scales = quantize_fp8_tiles(q, tile)
        q = dequantize_fp8_tiles(codes, scales, tile)
    return q


def indexer_scores(q, weights, keys, lengths=None, *, backend: str = "auto", device: str | None = None) -> np.ndarray:
    """Lightning-indexer scores of the decoding query of each request against every cached token.

    q: (B, Hi, D) float indexer queries; weights: (B, Hi) float head weights; keys: (B, L, D + 4) uint8 indexer
    entries (:func:`ess.quant.encode_indexer_keys`); lengths: (B,) visible tokens per request (default L; the
    query sits at position ``lengths[b] - 1`` and sees tokens ``s < lengths[b]``). Returns (B, L) float32 with
    ``-inf`` at invisible tokens.

    The float32 scale of every visible key must be finite and >= 0 (the quantiser writes ``amax / FP8_E4M3_MAX`` or 1; zero
    is an all-zero key): the backends apply it before (reference) or after (numba, torch) the ReLU, which agree
    only for non-negative scales, so a negative or non-finite scale is a ``ValueError`` naming ``keys``.
    """
    q = _float_array(q, "q", 3, "(B, Hi, D)")
    B, Hi, D = q.shape
    weights = _float_array(weights, "weights", 2, "(B, Hi)")
    if weights.shape != (B, Hi):
        raise ValueError(f"weights must have shape (B, Hi) = {(B, Hi)} to match q, got {weights.shape}")
    keys = _byte_array(keys, "keys", (3,), "(B, L, D + 4)")
    if keys.shape[0] != B or keys.shape[2] != D + 4:
        raise ValueError(f"keys must have shape (B={B}, L, D + 4 = {D + 4}) to match q, got {keys.shape}")
    if keys.shape[1] == 0:
        raise ValueError("keys must hold at least one token (L >= 1)")
    L = keys.shape[1]
    lengths = _lengths(lengths, B, L)
    visible = np.arange(L)[None, :] < lengths[:, None]
    scales = np.ascontiguousarray(keys[..., D:D + 4]).view("<f4")[..., 0][visible]
    if scales.size and not (np.isfinite(scales).all() and (scales >= 0).all()):
        bad = scales[~(np.isfinite(scales) & (scales >= 0))][0]
        raise ValueError(f"keys: the float32 scale of every visible entry must be finite and >= 0 (found {bad}); "
                         f"ReLU(s * x) = s * ReLU(x) holds only for s >= 0")
    out = np.empty((B, L), dtype=np.float32)
    _run(backend, device, "indexer_scores", q, weights, keys, lengths, out)
    if not np.isfinite(out[visible]).all():
        raise ValueError("keys: visible entries decode to non-finite values (an FP8 NaN byte 0x7f/0xff), or q . k "
                         "overflowed")
    return out


def topk_indices(scores, k: int) -> np.ndarray:
    """The top-``k`` token indices of each row of ``scores`` (B, L): (B, k) int64, highest score first, ties to the
    lower token index, ``-inf`` (invisible) tokens never chosen, padded with ``-1`` when fewer than ``k`` remain."""
    k = _positive_int(k, "k")
    s = np.asarray(scores)
    if not np.issubdtype(s.dtype, np.floating):
        raise TypeError(f"scores must be a float array (B, L), got dtype {s.dtype}")
    if s.ndim != 2:
        raise ValueError(f"scores must be a float array (B, L), got shape {s.shape}")
    if np.isnan(s).any() or np.isposinf(s).any():
        raise ValueError("scores must not hold NaN or +inf (-inf marks an invisible token)")
    B, L = s.shape
    order = np.argsort(-s.astype(np.float64), axis=1, kind="stable")[:, :k]     # stable: ties keep index order
    picked = np.take_along_axis(s, order, axis=1)
    order = np.where(np.isneginf(picked), -1, order).astype(np.int64)
    if k > L:
        order = np.concatenate([order, np.full((B, k - L), -1, dtype=np.int64)], axis=1)
    return order


# ----------------------------------------------------------------------------------------------------------------
# sparse MLA
# ----------------------------------------------------------------------------------------------------------------

def _pool_and_indices(latents: np.ndarray, indices: np.ndarray, B: int) -> tuple[np.ndarray, np.ndarray]:
    """(B, L, E) per-request caches -> a (B * L, E) pool with indices shifted by ``b * L``; a (N, E) pool as is."""
    idx = np.asarray(indices)
    if not np.issubdtype(idx.dtype, np.integer) or idx.ndim != 2 or idx.shape[0] != B:
        raise ValueError(f"indices must be an integer array (B={B}, K), got dtype {idx.dtype} shape {idx.shape}")
    if idx.shape[1] == 0:
        raise ValueError("indices must select K >= 1 entries per request (use -1 for padding)")
    idx = idx.astype(np.int64)
    n_rows = latents.shape[-2]
    if idx.size and (idx.min() < -1 or idx.max() >= n_rows):
        raise ValueError(f"indices must be in [-1, {n_rows}) (-1 = padding), got min {idx.min()} max {idx.max()}")
    srt = np.sort(idx, axis=1)
    dup = (srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)
    if dup.any():
        r, c = np.argwhere(dup)[0]
        raise ValueError(f"indices must not repeat a valid entry within a request (each selected entry is attended "
                         f"once); request {r} repeats {srt[r, c + 1]}")
    if latents.ndim == 2:
        return latents, np.ascontiguousarray(idx)
    if latents.shape[0] != B:
        raise ValueError(f"latents must have shape (B={B}, L, E) to match q, got {latents.shape}")
    shifted = np.where(idx >= 0, idx + np.arange(B, dtype=np.int64)[:, None] * n_rows, -1)
    return latents.reshape(-1, latents.shape[-1]), np.ascontiguousarray(shifted)


def sparse_mla_decode(q, latents, indices, model: ModelSpec, *, dtype: str = "fp8", sm_scale: float | None = None,
                      backend: str = "auto", device: str | None = None) -> AttentionOutput:
    """Sparse MLA decode attention (MQA mode) over the selected latent entries.

    q: (B, H, kv_lora_rank + qk_rope_head_dim) float queries (absorbed: c_KV part then rope part);
    latents: (B, L, E) uint8 per-request caches, or (N, E) uint8 rows of a shared pool; E = 656 (``"fp8"``) or
    1,152 (``"bf16"``) bytes for DeepSeek-V3.2-Exp; indices: (B, K) token indices (rows of the pool for a 2-D
    ``latents``), -1 = padding; sm_scale: default :func:`softmax_scale`.
    """
    fmt = latent_format(model, dtype)
    q = _float_array(q, "q", 3, "(B, H, kv_lora_rank + qk_rope_head_dim)")
    B, H, Dqk = q.shape
    if Dqk != model.latent_dim:
        raise ValueError(f"q: last axis must be kv_lora_rank + qk_rope_head_dim = {model.latent_dim} for "
                         f"{model.name}, got {Dqk}")
    E = latent_layout(model, dtype).entry_bytes
    latents = _byte_array(latents, "latents", (2, 3), f"(B, L, {E}) or (N, {E})")
    if latents.shape[-1] != E:
        raise ValueError(f"latents: entries must be {E} bytes ({dtype} layout of {model.name}), got "
                         f"{latents.shape[-1]}")
    pool, idx = _pool_and_indices(latents, indices, B)
    scale = softmax_scale(model) if sm_scale is None else _check_scale(sm_scale)
    out = np.empty((B, H, model.kv_lora_rank), dtype=np.float32)
    lse = np.empty((B, H), dtype=np.float32)
    _run(backend, device, "sparse_mla_decode", q, pool, idx, scale, *fmt, out, lse)
    if not (np.isfinite(out).all() and not np.isnan(lse).any() and not np.isposinf(lse).any()):
        raise ValueError("latents: the selected entries decode to non-finite values (an FP8 NaN byte 0x7f/0xff or "
                         "a non-finite scale), or the logits overflowed")
    return AttentionOutput(out, lse)


def dense_mla_decode(q, latents, model: ModelSpec, lengths=None, *, dtype: str = "fp8",
                     sm_scale: float | None = None) -> AttentionOutput:
    """Dense attention over every visible token, float64, written independently of the sparse kernels (the oracle
    for "sparse with K >= L equals dense"). latents: (B, L, E) uint8; lengths: (B,) visible tokens (default L)."""
    from .kernels.attention.reference import decode_latent_rows
    fp8, kv, rope, tile = latent_format(model, dtype)
    q = _float_array(q, "q", 3, "(B, H, Dqk)")
    E = latent_layout(model, dtype).entry_bytes
    latents = _byte_array(latents, "latents", (3,), f"(B, L, {E})")
    if latents.shape[0] != q.shape[0] or latents.shape[2] != E or q.shape[2] != kv + rope:
        raise ValueError(f"q (B, H, {kv + rope}) and latents (B, L, {E}) do not match: {q.shape}, {latents.shape}")
    B, L = latents.shape[:2]
    lengths = _lengths(lengths, B, L)
    scale = softmax_scale(model) if sm_scale is None else _check_scale(sm_scale)
    out = np.empty((B, q.shape[1], kv), np.float32)
    lse = np.empty((B, q.shape[1]), np.float32)
    for b in range(B):
        lat = decode_latent_rows(latents[b, :lengths[b]], fp8, kv, rope, tile)      # (n, Dqk) float64
        s = scale * (q[b].astype(np.float64) @ lat.T)
        m = s.max(axis=1, keepdims=True)
        p = np.exp(s - m)
        out[b] = (p @ lat[:, :kv]) / p.sum(axis=1, keepdims=True)
        lse[b] = (m + np.log(p.sum(axis=1, keepdims=True)))[:, 0]
    return AttentionOutput(out, lse)


def merge_attention(a: AttentionOutput, b: AttentionOutput) -> AttentionOutput:
    """Exact merge of attention over two disjoint entry sets from their outputs and log-sum-exps."""
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, AttentionOutput):
            raise TypeError(f"merge_attention: {name} must be an AttentionOutput (out, lse), got {type(x).__name__}")
    if a.out.shape != b.out.shape or a.lse.shape != b.lse.shape:
        raise ValueError(f"merge_attention: shapes differ: out {a.out.shape} vs {b.out.shape}, "
                         f"lse {a.lse.shape} vs {b.lse.shape}")
    la, lb = a.lse.astype(np.float64), b.lse.astype(np.float64)
    m = np.maximum(la, lb)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    wa, wb = np.exp(la - m_safe), np.exp(lb - m_safe)                     # 0 for an empty part
    tot = wa + wb
    safe = np.where(tot > 0, tot, 1.0)
    out = (wa[..., None] * a.out + wb[..., None] * b.out) / safe[..., None]
    lse = np.where(tot > 0, m_safe + np.log(safe), -np.inf)
    return AttentionOutput(out.astype(np.float32), lse.astype(np.float32))


def split_attention(q, latents, indices0, indices1, model: ModelSpec, **kw) -> AttentionOutput:
    """Attention over ``indices0`` (e.g. the hits) and ``indices1`` (the misses) separately, merged by log-sum-exp;
    equal to one pass over their union. The two sets must be disjoint per request."""
    i0, i1 = np.asarray(indices0), np.asarray(indices1)
    if i0.ndim != 2 or i1.ndim != 2 or i0.shape[0] != i1.shape[0]:
        raise ValueError(f"indices0 and indices1 must be (B, K0) and (B, K1), got {i0.shape} and {i1.shape}")
    for r in range(i0.shape[0]):
        a, b = i0[r][i0[r] >= 0], i1[r][i1[r] >= 0]
        if np.intersect1d(a, b).size or np.unique(a).size != a.size or np.unique(b).size != b.size:
            raise ValueError(f"indices0 and indices1 must be disjoint sets without repeats (request {r})")
    return merge_attention(sparse_mla_decode(q, latents, i0, model, **kw), sparse_mla_decode(q, latents, i1, model, **kw))


# ----------------------------------------------------------------------------------------------------------------
# one decode step through the tiered cache
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DecodeStep:
    """Result of :func:`decode_step`: attention ``out``/``lse``, the top-K ``indices`` (B, K) and the storage
    ``steps`` (one ``StepResult`` per request)."""

    out: np.ndarray
    lse: np.ndarray
    indices: np.ndarray
    steps: tuple


def _ragged(arrays: Sequence, name: str, width: int) -> tuple[np.ndarray, np.ndarray]:
    rows = [_byte_array(a, f"{name}[{i}]", (2,), f"(L, {width})") for i, a in enumerate(arrays)]
    for i, a in enumerate(rows):
        if a.shape[1] != width or a.shape[0] == 0:
            raise ValueError(f"{name}[{i}] must have shape (L >= 1, {width}), got {a.shape}")
    L = max(a.shape[0] for a in rows)
    out = np.zeros((len(rows), L, width), dtype=np.uint8)
    for i, a in enumerate(rows):
        out[i, :a.shape[0]] = a
    return out, np.array([a.shape[0] for a in rows], dtype=np.int64)


def decode_step(cache, layer: int, request_ids: Sequence, q_index, index_weights, index_keys: Sequence, q,
                model: ModelSpec, *, topk: int | None = None, sm_scale: float | None = None,
                backend: str = "auto", device: str | None = None) -> DecodeStep:
    """One layer of one decode step for a batch, reading the latents through ``cache`` (an
    :class:`ess.storage.TieredCache`): indexer over the device-resident indexer caches -> top-K -> ``cache.step``
    (hits resolved, misses brought in; the selected tokens' indexer scores are passed along for score-aware policies)
    -> sparse MLA over the rows of the resident slots, gathered in top-K order.

    index_keys: one (L_b, D + 4) uint8 indexer cache per request; q_index (B, Hi, D), index_weights (B, Hi), q
    (B, H, Dqk) as in :func:`indexer_scores` and :func:`sparse_mla_decode`. ``topk`` defaults to the model's.

    The cache contract: ``check_step(request_id, layer, indices, scores=...)`` raises on bad input and changes
    nothing, ``step(...)`` with the same arguments, ``device_rows(slots)``. Every request id, the layer and every
    request's top-K set (against that request's token count and the pool capacity) are checked with ``check_step``
    before the first ``step``, so bad input leaves every pool as it was. A transfer that fails part-way through the
    batch (``TransferError``) leaves the earlier requests' steps done.
    """
    request_ids = list(request_ids)
    B = len(request_ids)
    if B == 0:
        raise ValueError("request_ids must name at least one request")
    try:
        distinct = len(set(request_ids)) == B
    except TypeError:
        raise TypeError("request_ids must be hashable request ids") from None
    if not distinct:
        raise ValueError(f"request_ids must be distinct (one top-K set per request), got {request_ids!r}")
    for attr in ("check_step", "step", "device_rows"):
        if not callable(getattr(cache, attr, None)):
            raise TypeError(f"cache must provide check_step(), step() and device_rows() (an ess.storage.TieredCache);"
                            f" {type(cache).__name__} has no {attr}()")
    keys, lengths = _ragged(index_keys, "index_keys", indexer_entry_bytes(model))
    if keys.shape[0] != B:
        raise ValueError(f"index_keys must hold one cache per request ({B}), got {keys.shape[0]}")
    k = model.index_topk if topk is None else _positive_int(topk, "topk")
    q = _float_array(q, "q", 3, "(B, H, kv_lora_rank + qk_rope_head_dim)")        # checked before the cache moves
    if q.shape[0] != B or q.shape[2] != model.latent_dim:
        raise ValueError(f"q must have shape (B={B}, H, {model.latent_dim}), got {q.shape}")
    scores = indexer_scores(q_index, index_weights, keys, lengths, backend=backend, device=device)
    indices = topk_indices(scores, k)                                                # (B, K)
    sel = np.take_along_axis(scores, np.maximum(indices, 0), axis=1).astype(np.float64)
    sel = np.where(indices >= 0, sel, 0.0)                                           # (B, K) scores of the picks
    for b, rid in enumerate(request_ids):                                            # all checks before any step
        cache.check_step(rid, layer, indices[b], scores=sel[b])
    dtype = getattr(cache, "dtype", "fp8")
    E = latent_layout(model, dtype).entry_bytes
    pool = np.zeros((B * k, E), dtype=np.uint8)
    local = np.full((B, k), -1, dtype=np.int64)
    steps = []
    for b, rid in enumerate(request_ids):
        res = cache.step(rid, layer, indices[b], scores=sel[b])                      # scores feed "importance"
        slots = np.asarray(res.slots, dtype=np.int64)
        valid = indices[b] >= 0
        if slots.shape != (k,) or np.any(slots[valid] < 0):
            raise RuntimeError(f"cache.step returned slots {slots.shape} with unresolved entries for request {rid!r}")
        rows = np.asarray(cache.device_rows(slots[valid]), dtype=np.uint8)           # (n_valid, E)
        pos = np.flatnonzero(valid)
        pool[b * k + pos] = rows
        local[b, pos] = b * k + pos
        steps.append(res)
    att = sparse_mla_decode(q, pool, local, model, dtype=dtype, sm_scale=sm_scale, backend=backend, device=device)
    return DecodeStep(att.out, att.lse, indices, tuple(steps))


def resident_attention(q, latents: Sequence, indices, model: ModelSpec, *, dtype: str = "fp8",
                       sm_scale: float | None = None, backend: str = "auto",
                       device: str | None = None) -> AttentionOutput:
    """Attention over all-resident latent caches (one (L_b, E) uint8 array per request) for the same ``indices``:
    the no-offload baseline that :func:`decode_step` must equal bit for bit."""
    E = latent_layout(model, dtype).entry_bytes
    lat, _ = _ragged(latents, "latents", E)
    return sparse_mla_decode(q, lat, indices, model, dtype=dtype, sm_scale=sm_scale, backend=backend, device=device)


# ----------------------------------------------------------------------------------------------------------------
# experiments used by notebook 03 (synthetic inputs, stated as such)
# ----------------------------------------------------------------------------------------------------------------

def indexer_selection_example(model: ModelSpec, n_tokens: int = 96, *, topk: int | None = None, lag: int = 8,
                              seed: int = 0, backend: str = "auto") -> dict:
    """What the indexer picks on a small synthetic prefill: every position ``t`` queries with the key of token
    ``t - lag`` plus noise (a "look back" pattern), and token 0 has a large key (an attention sink). Returns
    ``scores`` (T, T) (row t = query at position t, -inf where s > t) and ``indices`` (T, K)."""
    n_tokens = _positive_int(n_tokens, "n_tokens")
    rng = np.random.default_rng(seed)
    D, Hi = model.index_head_dim, model.index_n_heads
    k = rng.standard_normal((n_tokens, D))
    k[0] *= 3.0                                                            # the sink
    q = np.stack([k[max(t - lag, 0)] for t in range(n_tokens)])[:, None, :] + 0.5 * rng.standard_normal(
        (n_tokens, Hi, D))
    from .quant import encode_indexer_keys
    keys = np.broadcast_to(encode_indexer_keys(k, model), (n_tokens, n_tokens, D + 4))
    w = np.full((n_tokens, Hi), 1.0 / Hi)
    scores = indexer_scores(q, w, keys, np.arange(1, n_tokens + 1), backend=backend)
    return {"scores": scores, "indices": topk_indices(scores, topk or model.index_topk), "lag": lag}


def _random_latents(rng, model: ModelSpec, shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    return (rng.standard_normal(shape + (model.kv_lora_rank,)).astype(np.float32),
            rng.standard_normal(shape + (model.qk_rope_head_dim,)).astype(np.float32))


def storage_precision(model: ModelSpec, n_tokens: int = 4096, *, topk: int | None = None, n_heads: int | None = None,
                      batch: int = 2, seed: int = 0, backend: str = "reference"):
    """FP8 (656 B) against BF16 (1,152 B) latent storage on the same inputs: bytes per entry and the error of the
    attention output against float64 attention over the unquantised latents.

    Inputs are synthetic (standard-normal c_KV, rope and queries; top-K chosen at random), not model activations;
    the error is an **output** error of one attention layer, not a task-accuracy loss. Returns a DataFrame with one
    row per format: ``entry_bytes``, ``rel_rms_error`` (||o - o*|| / ||o*|| over all heads), ``max_abs_error``,
    ``lse_max_abs_error``.
    """
    import pandas as pd
    from .quant import encode_latent
    rng = np.random.default_rng(seed)
    H = n_heads or model.n_heads
    K = min(topk or model.index_topk, n_tokens)
    ckv, rope = _random_latents(rng, model, (batch, n_tokens))
    q = rng.standard_normal((batch, H, model.latent_dim)).astype(np.float32)
    idx = np.stack([rng.choice(n_tokens, K, replace=False) for _ in range(batch)]).astype(np.int64)
    scale = softmax_scale(model)
    exact_o = np.empty((batch, H, model.kv_lora_rank))
    exact_l = np.empty((batch, H))
    for b in range(batch):
        lat = np.concatenate([ckv[b, idx[b]], rope[b, idx[b]]], axis=1).astype(np.float64)      # (K, Dqk)
        s = scale * (q[b].astype(np.float64) @ lat.T)
        m = s.max(axis=1, keepdims=True)
        p = np.exp(s - m)
        exact_o[b] = p @ lat[:, :model.kv_lora_rank] / p.sum(axis=1, keepdims=True)
        exact_l[b] = (m + np.log(p.sum(axis=1, keepdims=True)))[:, 0]
    rows = []
    for dtype in ("fp8", "bf16"):
        res = sparse_mla_decode(q, encode_latent(ckv, rope, model, dtype), idx, model, dtype=dtype, backend=backend)
        err = res.out - exact_o
        rows.append({"dtype": dtype, "entry_bytes": latent_layout(model, dtype).entry_bytes,
                     "rel_rms_error": float(np.linalg.norm(err) / np.linalg.norm(exact_o)),
                     "max_abs_error": float(np.abs(err).max()),
                     "lse_max_abs_error": float(np.abs(res.lse - exact_l).max()),
                     "config": {"model": model.name, "L": n_tokens, "K": K, "H": H, "batch": batch, "seed": seed,
                                "inputs": "standard normal, random top-K", "backend": backend}})
    return pd.DataFrame(rows)


def attention_cost_scan(model: ModelSpec, context_lens: Sequence[int], *, topk: int | None = None,
                        n_heads: int | None = None, backend: str = "numba", repeats: int = 3, seed: int = 0,
                        threads: int | None = None):
    """Measured time of one decode step (one request, one layer) against context length L: dense MLA over all L
    entries, sparse MLA over K entries, and the indexer over L keys, all read from stored FP8 entries with the same
    kernels. ``cumulative_*`` columns integrate the per-step cost over a whole sequence of L decode steps
    (trapezoid between the measured L, linear from 0 to the first): O(L^2) dense against O(L K) sparse attention
    (plus the indexer's O(L^2) at a much smaller constant). Every (L, kernel) pair is warmed up, then the pairs are
    timed in turn ``repeats`` times (interleaved, so that a busy spell of the machine hits all of them) and the
    minimum is kept. ``threads`` sets the Numba / torch thread count for the scan (restored afterwards)."""
    import time

    import pandas as pd
    from .quant import encode_indexer_keys, encode_latent
    rng = np.random.default_rng(seed)
    H = n_heads or model.n_heads
    K = topk or model.index_topk
    Lmax = max(context_lens)
    ckv, rope = _random_latents(rng, model, (Lmax,))
    lat = encode_latent(ckv, rope, model)[None]                                               # (1, Lmax, E)
    keys = encode_indexer_keys(rng.standard_normal((1, Lmax, model.index_head_dim)), model)
    q = rng.standard_normal((1, H, model.latent_dim)).astype(np.float32)
    qi = rng.standard_normal((1, model.index_n_heads, model.index_head_dim)).astype(np.float32)
    w = rng.random((1, model.index_n_heads)).astype(np.float32)

    cases = {}
    for L in sorted(context_lens):
        dense_idx = np.arange(L, dtype=np.int64)[None]
        sparse_idx = rng.choice(L, min(K, L), replace=False)[None].astype(np.int64)
        lat_L, keys_L = lat[:, :L], keys[:, :L]
        cases[(L, "dense_s")] = (lambda lat_L=lat_L, i=dense_idx:
                                 sparse_mla_decode(q, lat_L, i, model, backend=backend))
        cases[(L, "sparse_s")] = (lambda lat_L=lat_L, i=sparse_idx:
                                  sparse_mla_decode(q, lat_L, i, model, backend=backend))
        cases[(L, "indexer_s")] = lambda keys_L=keys_L: indexer_scores(qi, w, keys_L, backend=backend)
    import numba
    import torch
    old_threads = numba.get_num_threads(), torch.get_num_threads()
    try:
        if threads is not None:
            numba.set_num_threads(_positive_int(threads, "threads"))
            torch.set_num_threads(threads)
        for fn in cases.values():
            fn()
        best = {key: math.inf for key in cases}
        for _ in range(repeats):
            for key, fn in cases.items():
                t0 = time.perf_counter()
                fn()
                best[key] = min(best[key], time.perf_counter() - t0)
    finally:
        numba.set_num_threads(old_threads[0])
        torch.set_num_threads(old_threads[1])
    rows = [{"context_len": L, **{kind: best[(L, kind)] for kind in ("dense_s", "sparse_s", "indexer_s")}}
            for L in sorted(context_lens)]
    df = pd.DataFrame(rows)
    df["sparse_total_s"] = df.sparse_s + df.indexer_s
    Ls = np.concatenate([[0], df.context_len.to_numpy()])
    for col in ("dense_s", "sparse_total_s", "sparse_s", "indexer_s"):
        per_step = np.concatenate([[0.0], df[col].to_numpy()])
        df["cumulative_" + col] = np.cumsum(np.diff(Ls) * (per_step[1:] + per_step[:-1]) / 2)[:]
    df.attrs["config"] = {"model": model.name, "H": H, "K": K, "backend": backend, "repeats": repeats,
                          "batch": 1, "dtype": "fp8", "threads": threads or old_threads[0]}
    return df


def lossless_check(model: ModelSpec, *, ratios: Sequence[float] = (0.1, 0.3, 1.0),
                   policies: Sequence[str] = ("lru", "fifo"), batch: int = 2, n_tokens: int | None = None,
                   steps: int = 4, backend: str = "auto", seed: int = 0):
    """Decode steps through :class:`ess.storage.TieredCache` against attention over all-resident caches, for each
    ratio and policy: returns a DataFrame with the misses served and whether every output and log-sum-exp was
    bit-for-bit equal.

    The pool of each ratio has :func:`ess.layout.pool_slots` slots (``floor(ratio x page-padded tokens)``);
    ``n_tokens=None`` takes the shortest whole-page context, and at least
    4 K tokens, at which the smallest ratio's pool holds one step's K entries. A given ``n_tokens`` too short for a
    ratio is a ``ValueError``."""
    import pandas as pd
    from .layout import padded_tokens, pool_slots, step_entries
    from .quant import encode_indexer_keys, encode_latent
    from .storage import TieredCache
    K = model.index_topk
    ratios = list(ratios)
    if not ratios:
        raise ValueError("ratios must name at least one sparse-memory ratio")
    if n_tokens is None:
        L = max(4 * K, padded_tokens(model, math.ceil(K / min(float(r) for r in ratios))))
    else:
        L = _positive_int(n_tokens, "n_tokens")
    capacities = {r: pool_slots(model, r, L, need=step_entries(model, L)) for r in ratios}              # all checked before running
    rows = []
    for ratio in ratios:
        for policy in policies:
            rng = np.random.default_rng(seed)
            ckv, rope = _random_latents(rng, model, (batch, model.n_layers, L))
            lat = encode_latent(ckv, rope, model)
            keys = [encode_indexer_keys(rng.standard_normal((L, model.index_head_dim)), model) for _ in range(batch)]
            cache = TieredCache(model, capacity=capacities[ratio], policy=policy)
            ids = [f"r{b}" for b in range(batch)]
            for rid, e in zip(ids, lat):
                cache.add_request(rid, e)
            # two query "topics" taken in turn: entries picked two steps ago come back, and hit only if the pool
            # kept them (so the ratio shows in the miss count)
            topics = rng.standard_normal((2, batch, model.index_n_heads, model.index_head_dim))
            w = rng.random((batch, model.index_n_heads))
            equal, misses, hits = True, 0, 0
            for step in range(steps):
                qi = topics[step % 2] + 0.2 * rng.standard_normal(topics.shape[1:])
                for layer in range(model.n_layers):
                    q = rng.standard_normal((batch, model.n_heads, model.latent_dim)).astype(np.float32)
                    res = decode_step(cache, layer, ids, qi, w, keys, q, model, backend=backend)
                    base = resident_attention(q, [e[layer] for e in lat], res.indices, model, backend=backend)
                    equal &= bool(np.array_equal(res.out, base.out) and np.array_equal(res.lse, base.lse))
                    misses += sum(int(r.miss_pos.size) for r in res.steps)
                    hits += sum(int(r.hit_pos.size) for r in res.steps)
            rows.append({"ratio": ratio, "policy": policy, "capacity": cache.capacity, "misses": misses,
                         "hits": hits, "bitwise_equal": equal})
    df = pd.DataFrame(rows)
    df.attrs["config"] = {"model": model.name, "batch": batch, "L": L, "K": K, "steps": steps,
                          "layers": model.n_layers, "backend": resolve_backend(backend)}
    return df


# ----------------------------------------------------------------------------------------------------------------
# Recording index sets (the trace recorder of ess.traces, fed by the real indexer)
# ----------------------------------------------------------------------------------------------------------------

def record_indexer_trace(model: Any = "tiny", *, context_len: int = 1024, steps: int = 16, batch: int = 2,
                         mtp: int = 1, warmup_windows: int = 4, query_correlation: float = 0.9, seed: int = 0,
                         backend: str = "auto") -> Trace:
    """Record a trace from the real lightning indexer and top-K of :mod:`ess.attention` with synthetic activations.

    Keys are random (one FP8 indexer entry per token, :func:`ess.quant.encode_indexer_keys`); each layer's query
    follows an AR(1) walk ``q <- c q + sqrt(1 - c^2) e`` from one query token to the next (``c`` =
    ``query_correlation``, a design choice: there is no trained model here), so adjacent steps select overlapping
    sets for the indexer's own reasons. Every step, the indexer scores the cache that exists before the step
    (``context_len + t * mtp`` tokens) for each of the ``mtp`` query tokens, :func:`ess.attention.topk_indices`
    picks the model's top-K, and a :class:`TraceRecorder` stores the union. The warmup windows are the top-K of the
    last ``warmup_windows`` prefill positions.
    """
    from .quant import encode_indexer_keys
    from .traces import Trace, TraceRecorder, _check_generator_args

    model = model_spec(model) if isinstance(model, str) else model
    if not isinstance(model, ModelSpec):
        raise TypeError(f"model must be a ModelSpec or preset name, got {type(model).__name__}")
    k = model.index_topk
    context_len, k, mtp, steps, batch, n_layers, warmup_windows, seed = _check_generator_args(
        context_len, k, mtp, steps, batch, model.n_layers, warmup_windows, seed)
    if not 0 <= query_correlation < 1:
        raise ValueError(f"query_correlation must lie in [0, 1), got {query_correlation!r}")
    rng = np.random.default_rng(seed)
    Hi, D = model.index_n_heads, model.index_head_dim
    n_pos = context_len + steps * mtp
    c = float(query_correlation)
    rec = TraceRecorder(context_len=context_len, k=k, n_layers=n_layers, batch=batch, mtp=mtp,
                        meta={"recorded_from": "ess.attention.indexer_scores + topk_indices", "model": model.name,
                              "activations": "synthetic: random keys, AR(1) queries",
                              "query_correlation": c, "seed": seed})
    keys = [encode_indexer_keys(rng.standard_normal((batch, n_pos, D)).astype(np.float32), model)
            for _ in range(n_layers)]                                            # per layer (B, n_pos, D + 4)
    weights = [np.abs(rng.standard_normal((batch, Hi))).astype(np.float32) for _ in range(n_layers)]
    q = [rng.standard_normal((batch, Hi, D)).astype(np.float32) for _ in range(n_layers)]

    def advance(layer):
        q[layer] = (c * q[layer] + np.sqrt(1 - c * c) * rng.standard_normal((batch, Hi, D))).astype(np.float32)
        return q[layer]

    def select(layer, length):
        s = indexer_scores(advance(layer), weights[layer], keys[layer], np.full(batch, length, np.int64),
                           backend=backend)
        return topk_indices(s, k)                                                # (B, k)

    if warmup_windows:
        for layer in range(n_layers):
            wins = [select(layer, context_len - warmup_windows + i + 1) for i in range(warmup_windows)]
            rec.observe_warmup(layer, np.stack(wins, axis=1))                    # (B, W, k)
    for t in range(steps):
        length = context_len + t * mtp
        for layer in range(n_layers):
            rec.observe(layer, np.stack([select(layer, length) for _ in range(mtp)], axis=1))
        rec.end_step()
    tr = rec.to_trace()
    return Trace(tr.indices, tr.context_len, tr.k, tr.mtp, seed, tr.warmup, tr.meta)
