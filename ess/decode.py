"""One decode step of a batch through the tiered cache: the one place where a whole step is written down, read top
to bottom, each stage a call down the layers (attention operations, the storage, the kernels) and never back.

For one layer (an engine decoding a real model calls it once per layer, then writes the step's new tokens back):

1. **select** -- the lightning indexer scores every cached token of each request (the indexer cache is resident on
   the device) and top-K picks the entries to read (:func:`select`; :mod:`ess.attention`);
2. **plan** -- per request: hits resolved to their device slots, victims chosen by the eviction policy, the misses'
   slots reserved; nothing changes yet, so bad input for any request fails here, before anything moves
   (:meth:`ess.storage.TieredCache.plan`);
3. **copy** -- the misses gathered host -> device into their slots by the transfer kernel
   (:meth:`ess.storage.TieredCache.copy`);
4. **attend** -- sparse MLA over the device slots of the selected entries (:func:`attend`);
5. **commit** -- the plans applied: token maps and policies change, the metrics log hits, misses and bytes
   (:meth:`ess.storage.TieredCache.commit`);

and once per step, after the last layer:

6. **write back** -- each request's new token entry (all layers) to the host pool (:func:`write_back`), logged as
   device -> host bytes.

Schedules: here the stages run one after the other (the paper's "no overlap"). The overlap strategies slot into the
same stages: DA attends over the hits (``plan.hit_pos``) while the misses are copied, then over the misses once they
land, and merges the two exactly (:func:`ess.attention.merge_attention`); DBA also splits the batch in two; a CUDA
engine issues :meth:`~ess.storage.TieredCache.copy` on a copy stream. The simulator prices the same stages
(:mod:`ess.sim.timeline`).

The cache is anything with ``plan``, ``copy``, ``commit`` and ``device_rows`` as :class:`ess.storage.TieredCache`
has them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from . import validate
from .attention import AttentionOutput, indexer_scores, sparse_mla_decode, stack_ragged, topk_indices
from .layout import indexer_entry_bytes, latent_layout
from .specs import ModelSpec

__all__ = ["DecodeStep", "select", "attend", "decode_layer", "write_back", "CACHE_CALLS"]

#: What :func:`decode_layer` calls on the cache.
CACHE_CALLS = ("plan", "copy", "commit", "device_rows")


@dataclass(frozen=True)
class DecodeStep:
    """One layer of one decode step for a batch: attention ``out`` (B, H, kv_lora_rank) and ``lse`` (B, H), the
    top-K ``indices`` (B, K) and what each request's pool did (``steps``, one
    :class:`~ess.storage.PoolStep` per request)."""

    out: np.ndarray
    lse: np.ndarray
    indices: np.ndarray
    steps: tuple


def _request_ids(request_ids: Sequence) -> list:
    request_ids = list(request_ids)
    if not request_ids:
        raise ValueError("request_ids must name at least one request")
    try:
        distinct = len(set(request_ids)) == len(request_ids)
    except TypeError:
        raise TypeError("request_ids must be hashable request ids") from None
    if not distinct:
        raise ValueError(f"request_ids must be distinct (one top-K set per request), got {request_ids!r}")
    return request_ids


def select(q_index, index_weights, index_keys: Sequence, model: ModelSpec, *, topk: int | None = None,
           backend: str = "auto", device: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The entries each request reads this step: ``(indices (B, K) int64, scores (B, K) float64)``, the top-K of the
    lightning indexer over each request's indexer cache (``index_keys``: one (L_b, D + 4) uint8 cache per request)
    and the indexer score of each pick (0 at padding). ``topk`` defaults to the model's."""
    keys, lengths = stack_ragged(index_keys, "index_keys", indexer_entry_bytes(model))
    k = model.index_topk if topk is None else validate.positive_int("topk", topk)
    scores = indexer_scores(q_index, index_weights, keys, lengths, backend=backend, device=device)   # (B, L)
    indices = topk_indices(scores, k)                                                                # (B, K)
    picked = np.take_along_axis(scores, np.maximum(indices, 0), axis=1).astype(np.float64)
    return indices, np.where(indices >= 0, picked, 0.0)


def attend(cache, plans: Sequence, q: np.ndarray, model: ModelSpec, *, sm_scale: float | None = None,
           backend: str = "auto", device: str | None = None) -> AttentionOutput:
    """Sparse MLA over the device rows of every plan's selected entries (hits and copied misses), in top-K order:
    the rows of request ``b`` are gathered from ``plans[b].slots`` (the device pool, read after the copy)."""
    dtype = getattr(cache, "dtype", "fp8")
    E = latent_layout(model, dtype).entry_bytes
    B, K = len(plans), plans[0].indices.shape[0]
    rows = np.zeros((B * K, E), dtype=np.uint8)                 # (B * K, E) the selected rows, request by request
    local = np.full((B, K), -1, dtype=np.int64)                 # (B, K) row of each selected entry
    for b, plan in enumerate(plans):
        pos = np.flatnonzero(plan.indices >= 0)
        slots = np.asarray(plan.slots, np.int64)[pos]
        if np.any(slots < 0):
            raise RuntimeError(f"the plan of request {plan.request_id!r} leaves selected entries without a slot")
        rows[b * K + pos] = np.asarray(cache.device_rows(slots), dtype=np.uint8)
        local[b, pos] = b * K + pos
    return sparse_mla_decode(q, rows, local, model, dtype=dtype, sm_scale=sm_scale, backend=backend, device=device)


def decode_layer(cache, layer: int, request_ids: Sequence, q_index, index_weights, index_keys: Sequence, q,
                 model: ModelSpec, *, topk: int | None = None, sm_scale: float | None = None,
                 backend: str = "auto", device: str | None = None) -> DecodeStep:
    """One layer of one decode step for a batch, stages 1-5 of the module docstring: select, plan every request,
    copy every request's misses, attend over the device slots, commit every plan.

    q_index (B, Hi, D) and index_weights (B, Hi) are the indexer's queries and head weights, index_keys one
    (L_b, D + 4) uint8 indexer cache per request, q (B, H, kv_lora_rank + qk_rope_head_dim) the attention queries
    (as in :func:`ess.attention.indexer_scores` and :func:`ess.attention.sparse_mla_decode`). The picks' indexer
    scores are the plans' scores (the heat policy's weights).

    Bad input (a request id, the layer, a top-K set too large for the pool or past a request's tokens, a query
    shape) raises before anything moves. A copy that fails part-way through the batch (``TransferError``) leaves
    the requests copied before it committed and frees the slots it was writing. The plans are committed whatever
    attention does: the rows are in place once copied."""
    request_ids = _request_ids(request_ids)
    B = len(request_ids)
    missing = [c for c in CACHE_CALLS if not callable(getattr(cache, c, None))]
    if missing:
        raise TypeError(f"cache must provide {', '.join(c + '()' for c in CACHE_CALLS)} (an "
                        f"ess.storage.TieredCache); {type(cache).__name__} has no {missing[0]}()")
    if len(index_keys) != B:
        raise ValueError(f"index_keys must hold one cache per request ({B}), got {len(index_keys)}")
    q = validate.float_array("q", q, 3, "(B, H, kv_lora_rank + qk_rope_head_dim)")
    if q.shape[0] != B or q.shape[2] != model.latent_dim:
        raise ValueError(f"q must have shape (B={B}, H, {model.latent_dim}), got {q.shape}")
    indices, scores = select(q_index, index_weights, index_keys, model, topk=topk, backend=backend, device=device)
    plans = [cache.plan(rid, layer, indices[b], scores=scores[b]) for b, rid in enumerate(request_ids)]
    copied = 0
    try:
        for plan in plans:
            cache.copy(plan)
            copied += 1
        att = attend(cache, plans, q, model, sm_scale=sm_scale, backend=backend, device=device)
    finally:
        steps = tuple(cache.commit(plan) for plan in plans[:copied])
    return DecodeStep(att.out, att.lse, indices, steps)


def write_back(cache, request_ids: Sequence, new_entries) -> list[int]:
    """Stage 6: each request's new token entry ``new_entries[b]`` (n_layers, entry_bytes) uint8, all layers, written
    to the host pool (only that token's bytes move device -> host). Every entry is checked before the first write.
    Returns the new tokens' indices."""
    request_ids = _request_ids(request_ids)
    n_layers, E = cache.n_layers, cache.entry_bytes
    new_entries = validate.entries("new_entries", new_entries, (n_layers, E), ndim=3,
                                   shape_doc=f"(B={len(request_ids)}, n_layers={n_layers}, {E})")
    if new_entries.shape[0] != len(request_ids):
        raise ValueError(f"new_entries must hold one token per request ({len(request_ids)}), got "
                         f"{new_entries.shape[0]}")
    for rid in request_ids:
        cache.n_tokens(rid)                                      # an unknown request fails before any write
    return [cache.append_token(rid, e) for rid, e in zip(request_ids, new_entries)]
