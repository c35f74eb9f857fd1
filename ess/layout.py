"""Byte layouts of the two per-token caches and the size of one request's cache.

Two caches per token and layer (DeepSeek-V3.2-Exp, FlashMLA / DeepGEMM formats):

* **latent entry** (MLA cache, read by sparse attention for the K selected tokens), FP8 layout, 656 B::

      [0, 512)    c_KV, 512 x float8_e4m3            (kv_lora_rank values)
      [512, 528)  4 x float32 scales, one per 128-value tile of c_KV
      [528, 656)  rope key, 64 x bfloat16            (qk_rope_head_dim values, unquantised)

  or the BF16 layout, 576 x bfloat16 = 1,152 B.
* **indexer key** (lightning-indexer cache, scanned for every token each step), 132 B::

      [0, 128)    key, 128 x float8_e4m3             (index_head_dim values)
      [128, 132)  1 x float32 scale

Every size is computed from a :class:`~ess.specs.ModelSpec`, never typed in.

The tiered storage and the pool-sizing rule see an entry only as bytes: an :class:`EntryFormat` (layers, bytes per
entry, page, context limit). :func:`entry_format` derives DeepSeek's from a ``ModelSpec``; another model (the real
model's K/V entries, :mod:`ess.engine.kv`) builds its own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .specs import ModelSpec
from . import validate

__all__ = [
    "EntryFormat", "entry_format", "LatentLayout", "latent_layout", "latent_entry_bytes", "indexer_entry_bytes",
    "token_bytes", "RequestCache", "request_cache", "padded_tokens", "pool_slots", "layer_pool_slots", "step_entries",
    "check_context_len", "check_model", "KV_DTYPES", "capacity_from_ratio", "capacity_from_budget",
]

KV_DTYPES = ("fp8", "bf16")


@dataclass(frozen=True)
class LatentLayout:
    """Byte offsets of the fields of one latent entry (``None`` for fields a layout lacks)."""

    dtype: str
    entry_bytes: int
    ckv_offset: int
    ckv_bytes: int
    scale_offset: int | None
    n_scales: int
    rope_offset: int
    rope_bytes: int

    def __post_init__(self):
        from .validate import integer
        for name in ("entry_bytes", "ckv_offset", "ckv_bytes", "scale_offset", "n_scales", "rope_offset",
                     "rope_bytes"):
            if getattr(self, name) is not None or name != "scale_offset":
                integer(f"LatentLayout.{name}", getattr(self, name), lo=0)


@dataclass(frozen=True)
class EntryFormat:
    """What the tiered storage needs to know of one cache entry (one token, one layer): ``entry_bytes`` per entry,
    ``n_layers`` entries per token, ``page_tokens`` (the allocation unit a pool's context is rounded up to, and the
    disk tier's block), ``max_context`` tokens, ``name`` (for messages) and ``dtype`` (a label of the encoding)."""

    name: str
    n_layers: int
    entry_bytes: int
    page_tokens: int
    max_context: int
    dtype: str = ""

    def __post_init__(self):
        for field_name in ("name", "dtype"):
            if not isinstance(getattr(self, field_name), str):
                raise TypeError(f"EntryFormat.{field_name} must be a str, got {type(getattr(self, field_name)).__name__}")
        for field_name in ("n_layers", "entry_bytes", "page_tokens", "max_context"):
            validate.positive_int(f"EntryFormat.{field_name}", getattr(self, field_name))


def entry_format(model, dtype: str = "fp8") -> EntryFormat:
    """The latent-entry format of a DeepSeek-style ``model`` (a :class:`~ess.specs.ModelSpec`) in ``dtype``; an
    :class:`EntryFormat` is returned as it is."""
    if isinstance(model, EntryFormat):
        return model
    if not isinstance(model, ModelSpec):
        raise TypeError(f"model must be a ModelSpec or an EntryFormat, got {type(model).__name__}")
    return EntryFormat(f"{model.name} {dtype} latent", model.n_layers, latent_entry_bytes(model, dtype),
                       model.cache_page_tokens, model.max_position_embeddings, dtype)


def check_model(model, *, entry_format_ok: bool = False):
    """``model`` when it is a :class:`~ess.specs.ModelSpec` (or, with ``entry_format_ok``, an :class:`EntryFormat`);
    a ``TypeError`` naming ``model`` otherwise (a preset name is resolved by :func:`ess.specs.model_spec`)."""
    from .validate import boolean
    boolean("entry_format_ok", entry_format_ok)
    if isinstance(model, ModelSpec) or (entry_format_ok and isinstance(model, EntryFormat)):
        return model
    want = "a ModelSpec or an EntryFormat" if entry_format_ok else "a ModelSpec"
    raise TypeError(f"model must be {want}, got {type(model).__name__}")


def _paging(model) -> tuple[str, int, int]:
    """``(name, page_tokens, max_context)`` of a ModelSpec or an EntryFormat."""
    if isinstance(check_model(model, entry_format_ok=True), EntryFormat):
        return model.name, model.page_tokens, model.max_context
    return model.name, model.cache_page_tokens, model.max_position_embeddings


def _check_dtype(dtype: str) -> None:
    validate.one_of("dtype", dtype, KV_DTYPES)


def latent_layout(model: ModelSpec, dtype: str = "fp8") -> LatentLayout:
    """The field offsets of one latent entry in the ``"fp8"`` (656 B) or ``"bf16"`` (1,152 B) layout."""
    check_model(model)
    _check_dtype(dtype)
    if dtype == "bf16":
        ckv = model.kv_lora_rank * model.cache_bf16_bytes
        rope = model.qk_rope_head_dim * model.cache_bf16_bytes
        return LatentLayout("bf16", ckv + rope, 0, ckv, None, 0, ckv, rope)
    ckv = model.kv_lora_rank * model.cache_fp8_bytes
    n_scales = model.kv_lora_rank // model.latent_fp8_tile
    scales = n_scales * model.cache_scale_bytes
    rope = model.qk_rope_head_dim * model.cache_rope_bytes
    # latent_pad_bytes: DeepSeek-V4's row pads its 7 one-byte scales to 8 (584 B); 0 for the V3.2 layout
    return LatentLayout("fp8", ckv + scales + rope + model.latent_pad_bytes, 0, ckv, ckv, n_scales, ckv + scales,
                        rope)


def latent_entry_bytes(model: ModelSpec, dtype: str = "fp8") -> int:
    """Bytes of one latent entry (one token, one layer): 656 (FP8) or 1,152 (BF16) for DeepSeek-V3.2-Exp."""
    return latent_layout(model, dtype).entry_bytes


def indexer_entry_bytes(model: ModelSpec) -> int:
    """Bytes of one indexer key (one token -- one compressed row of a compressed model -- and layer): FP8 key plus
    one scale (132 B: a float32 scale, ``indexer_scale_bytes``, or the cache's scale size when that is not given)."""
    check_model(model)
    scale = model.cache_scale_bytes if model.indexer_scale_bytes is None else model.indexer_scale_bytes
    return model.index_head_dim * model.cache_fp8_bytes + scale


def token_bytes(model: ModelSpec, dtype: str = "fp8"):
    """Latent plus indexer bytes one token adds over all layers, on a long context (48,068 B for DeepSeek-V3.2-Exp,
    FP8). A compressed model's rows share their bytes among the tokens they hold (DeepSeek-V4-Flash: 21 C4 layers x
    (584 + 132) B / 4 + 20 C128 layers x 584 B / 128 = 3,850.25 B); its sliding windows, a constant per request,
    are left out (:func:`request_cache` counts them)."""
    per = latent_entry_bytes(model, dtype) + indexer_entry_bytes(model)
    if model.layer_compress_ratios is None:
        return per * model.n_layers
    latent = latent_entry_bytes(model, dtype)
    return (model.n_sparse_layers * per / model.sparse_compress_ratio
            + sum(latent / r for r in model.dense_compress_ratios))


def check_context_len(model: ModelSpec | EntryFormat, context_len: int, name: str = "context_len") -> int:
    """``context_len`` as an int: a positive integer number of tokens within the model's maximum context."""
    context_len = validate.integer(name, context_len, lo=1)
    label, _, max_context = _paging(model)
    if context_len > max_context:
        raise ValueError(f"{name}={context_len} exceeds the maximum context of {label} ({max_context} tokens)")
    return context_len


def _padded_rows(model: ModelSpec, context_len: int) -> int:
    """The sparse layers' allocated rows for a context (tokens for a DSA model; a compressed model's rows, none
    while the context is shorter than one row), rounded up to whole cache pages."""
    rows = model.sparse_rows(context_len)
    return padded_tokens(model, rows) if rows else 0


def padded_tokens(model: ModelSpec | EntryFormat, context_len: int) -> int:
    """Tokens actually allocated for a context: rounded up to whole cache pages (64 tokens)."""
    context_len = check_context_len(model, context_len)
    page = _paging(model)[1]
    return -(-context_len // page) * page


def step_entries(model: ModelSpec, context_len: int, mtp: int = 1, *, overlap=None, k: int | None = None):
    """The entries one decode step selects per request and layer: the union of its ``mtp`` query tokens' top-K
    sets (``k`` overrides the model's K).

    Without ``overlap`` (locality unknown) the most it can be, ``min(context_len, mtp x K)``. With ``overlap``, the
    adjacent-token overlap fraction ``r`` of the layer (a number, or one per layer: then an array), each further
    query token adds at most the ``(1 - r) K`` entries the previous one lacked:
    ``min(context_len, K + (mtp - 1) x ceil((1 - r) K))`` -- the union's size when no entry returns within the step,
    the pool-size need of a step with MTP (``data/locality/README.md``, "MTP")."""
    context_len = check_context_len(check_model(model), context_len)
    # a step decodes at most as many tokens as the model's context holds (and mtp x K stays an int64)
    mtp = validate.integer("mtp", mtp, lo=1, below=model.max_position_embeddings + 1)
    k = validate.integer("k", model.index_topk if k is None else k, lo=1)
    if overlap is None:
        return min(context_len, mtp * k)
    r = validate.number_array("overlap", overlap, positive=False)
    if not np.all((r >= 0) & (r <= 1)):
        raise ValueError(f"overlap must lie in [0, 1] (a fraction of K), got {overlap!r}")
    sel = min(k, context_len)
    out = np.minimum(context_len, sel + (mtp - 1) * np.ceil((1 - r) * sel - 1e-9).astype(np.int64))
    return int(out) if out.ndim == 0 else out


def pool_slots(model: ModelSpec | EntryFormat, ratio: float, context_len: int, *, need: int | None = None) -> int:
    """GPU-pool slots per (request, layer) for sparse-memory ``ratio`` and a request of ``context_len`` tokens:
    ``floor(ratio x padded_tokens(model, context_len))``, the context rounded up to whole cache pages (64 tokens for
    DeepSeek-V3.2-Exp). The one rule of the memory model, the storage, the cache simulator and the throughput
    simulator, so that their pools agree slot for slot. ``model`` may also be an :class:`EntryFormat` (its page).

    ``need`` (e.g. :func:`step_entries`): raise a ``ValueError`` when the pool has fewer slots than that."""
    ratio = validate.ratio("ratio", ratio)
    context_len = check_context_len(model, context_len)
    if need is not None:
        need = validate.non_negative_int("need", need)
    # a compressed model's pool holds rows, one per sparse_compress_ratio tokens (ModelSpec.sparse_rows)
    tokens = padded_tokens(model, context_len) if isinstance(model, EntryFormat) else _padded_rows(model, context_len)
    slots = int(math.floor(ratio * tokens + 1e-9))     # 1e-9: 0.3 * 960 is 287.99999999999997
    if need is not None and slots < need:
        raise ValueError(f"ratio {ratio} of context_len={context_len} ({tokens} allocated tokens) gives {slots} GPU "
                         f"slots per request and layer, fewer than the {need} entries one step selects (K); raise the "
                         f"ratio (or lower need)")
    return slots


def capacity_from_ratio(model: ModelSpec, ratio: float, context_len: int) -> int:
    """The capacity of a tiered cache (:class:`ess.storage.TieredCache`) at sparse-memory ``ratio``: the pool rule
    :func:`pool_slots`, refused (``ValueError``) when it gives fewer slots than the K entries one step selects
    (:func:`step_entries`)."""
    if not isinstance(model, ModelSpec):
        raise TypeError(f"model must be a ModelSpec (its top-K sizes one step), got {type(model).__name__}")
    context_len = check_context_len(model, context_len)
    return pool_slots(model, ratio, context_len, need=step_entries(model, context_len))


def capacity_from_budget(model: ModelSpec, budget_bytes: float, n_requests: int, context_len: int,
                         dtype: str = "fp8") -> int:
    """The capacity of a tiered cache whose device pool holds ``n_requests`` requests within ``budget_bytes`` (all
    layers): ``floor(budget / (n_requests x n_layers x entry_bytes))`` slots per (request, layer). A ``ValueError``
    when that is fewer than one step's K = min(index_topk, context) entries. Allocate the pool once for those
    requests (``TieredCache(..., capacity=..., max_requests=n_requests)``) to hold to the budget.

    >>> from ess.specs import model_spec
    >>> capacity_from_budget(model_spec("tiny"), 3 * 4 * 164 * 100, 3, 1000)    # 3 requests x 4 layers x 164 B
    100
    """
    if not isinstance(model, ModelSpec):
        raise TypeError(f"model must be a ModelSpec (its top-K sizes one step), got {type(model).__name__}")
    n_requests = validate.positive_int("n_requests", n_requests)
    context_len = check_context_len(model, context_len)
    budget = validate.real("budget_bytes", budget_bytes, lo=0.0, lo_open=True)
    entry = latent_entry_bytes(model, dtype)
    per_slot = n_requests * model.n_layers * entry
    capacity = int(budget) // per_slot                  # in integers: a float quotient can round up past the budget
    k = step_entries(model, context_len)
    if capacity < k:
        raise ValueError(f"budget_bytes={budget:.0f} gives {capacity} slots per request and layer for "
                         f"n_requests={n_requests} requests x {model.n_layers} layers x {entry} B; one step needs K = "
                         f"{k} slots ({k * per_slot:.0f} B)")
    return capacity


def layer_pool_slots(model: ModelSpec, ratio: float, context_len: int, need) -> np.ndarray:
    """GPU-pool slots of each layer (one request) for sparse-memory ``ratio`` when the layers need different
    amounts: the ratio is the GPU-resident share of **all** the request's latent entries (paper-facts.md, "Sparse
    Memory Ratio"), so the request has ``n x pool_slots(model, ratio, context_len)`` slots for its ``n = len(need)``
    layers, and each layer gets ``max(need[l], level)``, ``level`` the largest whole number of slots at which the
    layers still fit in that total (a layer whose step needs more than the even share takes it from the others,
    which share the rest evenly). When no layer needs more than the even share, every layer gets ``pool_slots``
    (the uniform rule, slot for slot). ``need``: per layer, e.g. :func:`step_entries` with the layers' overlaps.
    Raises ``ValueError`` when the needs exceed the total. Returns int64 (n,)."""
    slots = pool_slots(model, ratio, context_len)
    need = np.atleast_1d(validate.number_array("need", need, whole=True))
    if need.size == 0:
        raise ValueError("need must be one positive number of entries per layer, got none")
    total = need.size * slots
    if need.sum() > total:
        raise ValueError(f"ratio {ratio} of context_len={context_len} gives {slots} GPU slots per request and layer "
                         f"({total} over {need.size} layers), fewer than the {need.sum():.0f} entries the layers' "
                         f"steps select together (need: mean {need.mean():.0f} per layer); raise the ratio")
    need = need.astype(np.int64)
    if need.max() <= slots:
        return np.full(need.size, slots, dtype=np.int64)
    lo, hi = 0, slots                              # the largest level with sum(max(need, level)) <= total
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if np.maximum(need, mid).sum() <= total:
            lo = mid
        else:
            hi = mid - 1
    return np.maximum(need, lo)


@dataclass(frozen=True)
class RequestCache:
    """Where one request's cache bytes live for a sparse-memory ratio (all layers).

    ``indexer_bytes`` always sit on the GPU; ``latent_bytes`` is what offload moves (the sparse layers' entries);
    ``latent_gpu_bytes`` is the ratio's share of it held in the GPU pool; ``latent_host_bytes`` is all of it in host
    memory when offloading (ratio < 1), and 0 without offload (ratio == 1, everything on the GPU, as in the
    no-offload baseline). ``resident_bytes`` is cache that never leaves the GPU besides the indexer keys: a
    compressed model's densely attended rows and sliding windows (0 for a DSA model). ``tokens`` counts the entries
    of one sparse layer, page-padded: tokens for a DSA model, compressed rows for a compressed one."""

    context_len: int
    ratio: float
    dtype: str
    tokens: int
    indexer_bytes: int
    latent_bytes: int
    latent_gpu_bytes: float
    latent_host_bytes: int
    resident_bytes: int = 0

    @property
    def gpu_bytes(self) -> float:
        return self.indexer_bytes + self.resident_bytes + self.latent_gpu_bytes

    @property
    def total_bytes(self) -> int:
        return self.indexer_bytes + self.resident_bytes + self.latent_bytes


def request_cache(model: ModelSpec, context_len: int, ratio: float = 1.0, dtype: str = "fp8") -> RequestCache:
    """Cache bytes of one request of ``context_len`` tokens, split into GPU and host parts for ``ratio``.

    >>> from ess.specs import model_spec
    >>> rc = request_cache(model_spec("deepseek-v3.2-exp"), 32768)
    >>> round(rc.total_bytes / 1e9, 3)
    1.575
    """
    check_model(model)
    context_len = check_context_len(model, context_len)
    ratio = validate.ratio("ratio", ratio)
    _check_dtype(dtype)
    tokens = _padded_rows(model, context_len)
    entry = latent_entry_bytes(model, dtype)
    indexer = tokens * indexer_entry_bytes(model) * model.n_sparse_layers
    latent = tokens * entry * model.n_sparse_layers
    # a compressed model: densely attended rows (page-padded) and every layer's window stay on the GPU
    # (no rows yet where the context is shorter than one row)
    resident = sum(padded_tokens(model, context_len // r) for r in model.dense_compress_ratios
                   if context_len >= r) * entry
    if model.sliding_window:
        resident += model.n_layers * min(model.sliding_window, context_len) * entry
    offload = ratio < 1.0
    return RequestCache(context_len, ratio, dtype, tokens, indexer, latent,
                        latent * ratio, latent if offload else 0, int(resident))
