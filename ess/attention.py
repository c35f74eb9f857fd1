"""DeepSeek Sparse Attention at decode time, the operations: the lightning indexer, top-K selection, sparse MLA
attention in MQA mode, and split attention merged by log-sum-exp. A whole decode step through the tiered cache is
:mod:`ess.decode`.

The maths [DS ``inference/model.py``; paper-facts.md "DeepSeek-V3.2-Exp geometry"]:

* **Lightning indexer**: ``I(t, s) = sum_j w(t, j) * ReLU(q(t, j) . k(s))`` over the indexer heads ``j``; one key per
  token, shared by all heads; causal (token ``s`` is visible to a query at position ``t`` when ``s <= t``). Any
  constant factors of the model (``n_heads**-0.5``, ``head_dim**-0.5``) are folded into ``w`` by the caller. Keys are
  read from the 132-byte indexer entries (FP8 plus one float32 scale, :mod:`ess.quant`); queries may be FP8-rounded
  and Hadamard-rotated with :func:`prepare_index_queries`, as in the model.
* **Top-K**: the ``min(K, L)`` highest scores; ties go to the **lower token index**; the result is in **position
  order** (ascending token index) and padded with ``-1`` to width K when fewer than K tokens are visible -- the one
  top-K rule of the library (:mod:`ess.kernels.topk` says why position order), also the real model's
  (:mod:`ess.engine`).
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
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from . import validate
from .kernels import resolve_backend
from .kernels.attention import get as _kernels
from .layout import check_model, latent_layout
from .quant import FP8_BLOCK, dequantize_fp8_tiles, hadamard_rotate, quantize_fp8_tiles
from .specs import ModelSpec

__all__ = [
    "softmax_scale", "prepare_index_queries", "indexer_scores", "topk_indices", "sparse_mla_decode",
    "dense_mla_decode", "merge_attention", "split_attention", "AttentionOutput", "resident_attention", "stack_ragged",
    "latent_format",
]


@dataclass(frozen=True)
class AttentionOutput:
    """``out`` (B, H, kv_lora_rank) float32 and ``lse`` (B, H) float32 (``-inf`` where no entry was attended)."""

    out: np.ndarray
    lse: np.ndarray


def softmax_scale(model: ModelSpec) -> float:
    """``(qk_nope + qk_rope)**-0.5 * mscale**2``, ``mscale = 0.1 ln(rope_factor) + 1`` ([DS] ``inference/model.py``
    with ``mscale = 1``; 0.1352 for DeepSeek-V3.2-Exp)."""
    check_model(model)
    mscale = 0.1 * math.log(model.rope_factor) + 1.0 if model.rope_factor > 1 else 1.0
    return (model.qk_nope_head_dim + model.qk_rope_head_dim) ** -0.5 * mscale * mscale


def latent_format(model: ModelSpec, dtype: str = "fp8") -> tuple[bool, int, int, int]:
    """The ``(fp8, kv_rank, rope_dim, tile)`` description kernels take, checked against :func:`latent_layout`."""
    check_model(model)
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

def _lengths(lengths: Any, B: int, L: int) -> np.ndarray:
    if lengths is None:
        return np.full(B, L, dtype=np.int64)
    arr = validate.int_array("lengths", np.asarray(lengths), ndim=1, lo=1, below=L + 1,
                             shape_doc=f"({B},), one visible-token count per request in [1, L={L}]")
    if arr.shape != (B,):
        raise ValueError(f"lengths must be {B} integers (one per request), got shape {arr.shape}")
    return arr


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
    q = validate.float_array("q", q, np.ndim(q), "(..., D)")
    rotate, fp8 = validate.boolean("rotate", rotate), validate.boolean("fp8", fp8)
    d = q.shape[-1] if q.ndim else 0
    if d == 0 or (rotate and d & (d - 1)):
        raise ValueError(f"q must have a head dim (last axis) of at least 1{', a power of two (Hadamard rotation)' if rotate else ''}, "
                         f"got shape {q.shape}")
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
    q = validate.float_array("q", q, 3, "(B, Hi, D)")
    B, Hi, D = q.shape
    weights = validate.float_array("weights", weights, 2, "(B, Hi)")
    if weights.shape != (B, Hi):
        raise ValueError(f"weights must have shape (B, Hi) = {(B, Hi)} to match q, got {weights.shape}")
    keys = validate.entries("keys", keys, (), ndim=3, shape_doc="(B, L, D + 4)")
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


def topk_indices(scores, k: int, *, backend: str = "auto"):
    """The top-``k`` token indices of each row of ``scores`` (B, L): (B, k) int64 in position order (ascending),
    ties to the lower token index, ``-inf`` (invisible) tokens never chosen, padded with ``-1`` when fewer than
    ``k`` remain. ``scores`` a NumPy float array (the result is NumPy) or a float32/float64 torch tensor (the result
    is a tensor on its device); ``backend`` as in :func:`ess.kernels.resolve_backend`
    (:mod:`ess.kernels.topk`)."""
    from .kernels import is_tensor
    from .kernels.topk import topk_positions
    k = validate.positive_int("k", k)
    if is_tensor(scores):
        import torch
        if not scores.is_floating_point():
            raise TypeError(f"scores must be a float tensor (B, L), got dtype {scores.dtype}")
        if scores.ndim != 2:
            raise ValueError(f"scores must be a float tensor (B, L), got shape {tuple(scores.shape)}")
        s = scores if scores.dtype in (torch.float32, torch.float64) else scores.float()
        top = float(s.max()) if s.numel() else 0.0                 # one reduction: NaN propagates to the max
        if math.isnan(top) or top == math.inf:
            raise ValueError("scores must not hold NaN or +inf (-inf marks an invisible token)")
        return topk_positions(s.contiguous(), k, backend=backend)
    s = np.asarray(scores)
    if not np.issubdtype(s.dtype, np.floating):
        raise TypeError(f"scores must be a float array (B, L), got dtype {s.dtype}")
    if s.ndim != 2:
        raise ValueError(f"scores must be a float array (B, L), got shape {s.shape}")
    if np.isnan(s).any() or np.isposinf(s).any():
        raise ValueError("scores must not hold NaN or +inf (-inf marks an invisible token)")
    if s.dtype not in (np.float32, np.float64):
        s = s.astype(np.float64)
    return topk_positions(np.ascontiguousarray(s), k, backend=backend)


# ----------------------------------------------------------------------------------------------------------------
# sparse MLA
# ----------------------------------------------------------------------------------------------------------------

def _pool_and_indices(latents: np.ndarray, indices: np.ndarray, B: int,
                      name: str = "indices") -> tuple[np.ndarray, np.ndarray]:
    """(B, L, E) per-request caches -> a (B * L, E) pool with indices shifted by ``b * L``; a (N, E) pool as is."""
    idx = np.asarray(indices)
    if not np.issubdtype(idx.dtype, np.integer) or idx.ndim != 2 or idx.shape[0] != B:
        raise ValueError(f"{name} must be an integer array (B={B}, K), got dtype {idx.dtype} shape {idx.shape}")
    if idx.shape[1] == 0:
        raise ValueError(f"{name} must select K >= 1 entries per request (use -1 for padding)")
    idx = idx.astype(np.int64)
    n_rows = latents.shape[-2]
    if idx.size and (idx.min() < -1 or idx.max() >= n_rows):
        raise ValueError(f"{name} must be in [-1, {n_rows}) (-1 = padding), got min {idx.min()} max {idx.max()}")
    srt = np.sort(idx, axis=1)
    dup = (srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)
    if dup.any():
        r, c = np.argwhere(dup)[0]
        raise ValueError(f"{name} must not repeat a valid entry within a request (each selected entry is attended "
                         f"once); request {r} repeats {srt[r, c + 1]}")
    if latents.ndim == 2:
        return latents, np.ascontiguousarray(idx)
    if latents.shape[0] != B:
        raise ValueError(f"latents must have shape (B={B}, L, E) to match q, got {latents.shape}")
    shifted = np.where(idx >= 0, idx + np.arange(B, dtype=np.int64)[:, None] * n_rows, -1)
    return latents.reshape(-1, latents.shape[-1]), np.ascontiguousarray(shifted)


_F32_MAX = float(np.finfo(np.float32).max)
_NON_FINITE = ("latents: the selected entries decode to non-finite values (an FP8 NaN byte 0x7f/0xff or a non-finite "
               "scale), or the logits sm_scale * q . latent overflowed float32 (sm_scale or q too large)")


def _sm_scale(model: ModelSpec, sm_scale: Any) -> float:
    """``sm_scale`` (``None``: :func:`softmax_scale`), > 0 and within float32, the kernels' precision."""
    if sm_scale is None:
        return softmax_scale(model)
    scale = validate.real("sm_scale", sm_scale, lo=0.0, lo_open=True)
    if scale > _F32_MAX:
        raise ValueError(f"sm_scale must be at most float32's largest value {_F32_MAX:.6g}, got {scale:g}")
    return scale


def sparse_mla_decode(q, latents, indices, model: ModelSpec, *, dtype: str = "fp8", sm_scale: float | None = None,
                      backend: str = "auto", device: str | None = None,
                      _indices_name: str = "indices") -> AttentionOutput:
    """Sparse MLA decode attention (MQA mode) over the selected latent entries.

    q: (B, H, kv_lora_rank + qk_rope_head_dim) float queries (absorbed: c_KV part then rope part);
    latents: (B, L, E) uint8 per-request caches, or (N, E) uint8 rows of a shared pool; E = 656 (``"fp8"``) or
    1,152 (``"bf16"``) bytes for DeepSeek-V3.2-Exp; indices: (B, K) token indices (rows of the pool for a 2-D
    ``latents``), -1 = padding; sm_scale: default :func:`softmax_scale`.
    """
    fmt = latent_format(model, dtype)
    q = validate.float_array("q", q, 3, "(B, H, kv_lora_rank + qk_rope_head_dim)")
    B, H, Dqk = q.shape
    if Dqk != model.latent_dim:
        raise ValueError(f"q: last axis must be kv_lora_rank + qk_rope_head_dim = {model.latent_dim} for "
                         f"{model.name}, got {Dqk}")
    E = latent_layout(model, dtype).entry_bytes
    latents = validate.entries("latents", latents, (), ndim=(2, 3), shape_doc=f"(B, L, {E}) or (N, {E})")
    if latents.shape[-1] != E:
        raise ValueError(f"latents: entries must be {E} bytes ({dtype} layout of {model.name}), got "
                         f"{latents.shape[-1]}")
    pool, idx = _pool_and_indices(latents, indices, B, _indices_name)
    scale = _sm_scale(model, sm_scale)
    out = np.empty((B, H, model.kv_lora_rank), dtype=np.float32)
    lse = np.empty((B, H), dtype=np.float32)
    _run(backend, device, "sparse_mla_decode", q, pool, idx, scale, *fmt, out, lse)
    if not (np.isfinite(out).all() and not np.isnan(lse).any() and not np.isposinf(lse).any()):
        raise ValueError(_NON_FINITE)
    return AttentionOutput(out, lse)


def dense_mla_decode(q, latents, model: ModelSpec, lengths=None, *, dtype: str = "fp8",
                     sm_scale: float | None = None) -> AttentionOutput:
    """Dense attention over every visible token, float64, written independently of the sparse kernels (the oracle
    for "sparse with K >= L equals dense"). latents: (B, L, E) uint8; lengths: (B,) visible tokens (default L)."""
    from .kernels.attention.reference import decode_latent_rows
    fp8, kv, rope, tile = latent_format(model, dtype)
    q = validate.float_array("q", q, 3, "(B, H, Dqk)")
    E = latent_layout(model, dtype).entry_bytes
    latents = validate.entries("latents", latents, (), ndim=3, shape_doc=f"(B, L, {E})")
    if latents.shape[0] != q.shape[0] or latents.shape[2] != E or q.shape[2] != kv + rope:
        raise ValueError(f"q (B, H, {kv + rope}) and latents (B, L, {E}) do not match: {q.shape}, {latents.shape}")
    B, L = latents.shape[:2]
    lengths = _lengths(lengths, B, L)
    scale = _sm_scale(model, sm_scale)
    out = np.empty((B, q.shape[1], kv), np.float32)
    lse = np.empty((B, q.shape[1]), np.float32)
    for b in range(B):
        lat = decode_latent_rows(latents[b, :lengths[b]], fp8, kv, rope, tile)      # (n, Dqk) float64
        with np.errstate(over="ignore", invalid="ignore"):
            s = scale * (q[b].astype(np.float64) @ lat.T)
        m = s.max(axis=1, keepdims=True)
        if not (np.isfinite(lat).all() and np.isfinite(s).all() and np.abs(m).max() < _F32_MAX / 2):
            raise ValueError(_NON_FINITE)
        p = np.exp(s - m)
        out[b] = (p @ lat[:, :kv]) / p.sum(axis=1, keepdims=True)
        lse[b] = (m + np.log(p.sum(axis=1, keepdims=True)))[:, 0]
    return AttentionOutput(out, lse)


def _check_output(name: str, x: Any) -> None:
    """An :class:`AttentionOutput` of float arrays, ``out`` (..., R) finite, ``lse`` (...) finite or ``-inf`` (an
    empty part): NaN or ``+inf`` would turn the merge's weights into NaN."""
    if not isinstance(x, AttentionOutput):
        raise TypeError(f"merge_attention: {name} must be an AttentionOutput (out, lse), got {type(x).__name__}")
    for field in ("out", "lse"):
        v = getattr(x, field)
        if not isinstance(v, np.ndarray) or v.dtype.kind != "f":
            raise TypeError(f"merge_attention: {name}.{field} must be a NumPy float array, got "
                            f"{type(v).__name__}{'' if not isinstance(v, np.ndarray) else ' of dtype ' + str(v.dtype)}")
    if x.out.ndim < 1 or x.lse.shape != x.out.shape[:-1]:
        raise ValueError(f"merge_attention: {name}.lse must have the shape of {name}.out without its last axis, got "
                         f"out {x.out.shape}, lse {x.lse.shape}")
    if not np.isfinite(x.out).all():
        raise ValueError(f"merge_attention: {name}.out must be finite (found NaN or inf)")
    if np.isnan(x.lse).any() or np.isposinf(x.lse).any():
        raise ValueError(f"merge_attention: {name}.lse must be finite or -inf (nothing attended), found NaN or +inf")


def merge_attention(a: AttentionOutput, b: AttentionOutput) -> AttentionOutput:
    """Exact merge of attention over two disjoint entry sets from their outputs and log-sum-exps."""
    for name, x in (("a", a), ("b", b)):
        _check_output(name, x)
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


def _index_array(name: str, value: Any) -> np.ndarray:
    """``value`` as a (B, K) int64 array of entry indices (-1: padding), a ``TypeError``/``ValueError`` naming
    ``name`` otherwise."""
    try:
        arr = value if isinstance(value, np.ndarray) else np.asarray(value)
    except (TypeError, ValueError):                      # ragged nesting
        raise TypeError(f"{name} must be a (B, K) integer array, got {type(value).__name__}") from None
    arr = validate.int_array(name, arr, ndim=2, lo=-1, shape_doc="(B, K), -1 for padding")
    if arr.shape[1] == 0:
        raise ValueError(f"{name} must select K >= 1 entries per request (use -1 for padding), got shape {arr.shape}")
    return arr


def split_attention(q, latents, indices0, indices1, model: ModelSpec, **kw) -> AttentionOutput:
    """Attention over ``indices0`` (e.g. the hits) and ``indices1`` (the misses) separately, merged by log-sum-exp;
    equal to one pass over their union. The two sets must be disjoint per request."""
    i0, i1 = (_index_array(name, v) for name, v in (("indices0", indices0), ("indices1", indices1)))
    if i0.shape[0] != i1.shape[0]:
        raise ValueError(f"indices0 and indices1 must be (B, K0) and (B, K1), got {i0.shape} and {i1.shape}")
    for r in range(i0.shape[0]):
        a, b = i0[r][i0[r] >= 0], i1[r][i1[r] >= 0]
        if np.intersect1d(a, b).size or np.unique(a).size != a.size or np.unique(b).size != b.size:
            raise ValueError(f"indices0 and indices1 must be disjoint sets without repeats (request {r})")
    return merge_attention(sparse_mla_decode(q, latents, i0, model, _indices_name="indices0", **kw),
                           sparse_mla_decode(q, latents, i1, model, _indices_name="indices1", **kw))


# ----------------------------------------------------------------------------------------------------------------
# per-request caches of different lengths
# ----------------------------------------------------------------------------------------------------------------

def stack_ragged(arrays: Sequence, name: str, width: int) -> tuple[np.ndarray, np.ndarray]:
    """One (L_b, width) uint8 cache per request -> ``(caches (B, max L_b, width) zero-padded, lengths (B,))``."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str (the argument's name in messages), got {type(name).__name__}")
    width = validate.positive_int("width", width)
    if isinstance(arrays, (str, bytes, np.ndarray)) or not isinstance(arrays, Sequence) or not arrays:
        raise TypeError(f"{name} must be a non-empty list of (L, {width}) uint8 caches, one per request, got "
                        f"{'an empty ' if isinstance(arrays, Sequence) else ''}{type(arrays).__name__}")
    rows = [validate.entries(f"{name}[{i}]", a, (), ndim=2, shape_doc=f"(L, {width})") for i, a in enumerate(arrays)]
    for i, a in enumerate(rows):
        if a.shape[1] != width or a.shape[0] == 0:
            raise ValueError(f"{name}[{i}] must have shape (L >= 1, width={width}), got {a.shape}")
    L = max(a.shape[0] for a in rows)
    out = np.zeros((len(rows), L, width), dtype=np.uint8)
    for i, a in enumerate(rows):
        out[i, :a.shape[0]] = a
    return out, np.array([a.shape[0] for a in rows], dtype=np.int64)


def resident_attention(q, latents: Sequence, indices, model: ModelSpec, *, dtype: str = "fp8",
                       sm_scale: float | None = None, backend: str = "auto",
                       device: str | None = None) -> AttentionOutput:
    """Attention over all-resident latent caches (one (L_b, E) uint8 array per request) for the same ``indices``:
    the no-offload baseline that :func:`ess.decode.decode_layer` must equal bit for bit."""
    E = latent_layout(model, dtype).entry_bytes
    lat, _ = stack_ragged(latents, "latents", E)
    return sparse_mla_decode(q, lat, indices, model, dtype=dtype, sm_scale=sm_scale, backend=backend, device=device)
