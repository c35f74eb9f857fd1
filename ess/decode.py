"""One decode step of a batch through the tiered cache: the one place where a whole step is written down, read top
to bottom, each stage a call down the layers (the model's operations, the storage, the link) and never back.

For one layer (an engine decoding a model calls :func:`run_layer` once per layer, then writes the step's new tokens
back):

1. **select** -- an indexer scores every cached token of each request (its keys are resident on the device) and
   top-K picks the entries to read;
2. **plan** -- per request: hits resolved to their device slots, victims chosen by the eviction policy, the misses'
   slots reserved; nothing changes yet (:meth:`ess.storage.TieredCache.plan`);
3. **copy** -- the misses host -> device into their slots (:meth:`ess.storage.TieredCache.copy`), submitted to
   the link (:mod:`ess.link`);
4. **attend** -- attention over the device slots of the selected entries, read where they lie in the device pool;
5. **commit** -- the plans applied: token maps and policies change, the metrics log hits, misses and bytes;
6. **finish** -- the rest of the layer (output projection, MLP); the layer's entry of each new token goes device ->
   host on the link (D2H) into a staging buffer,

and once per step, after the last layer, **write back** -- the staged new tokens appended to the host pool
(:func:`write_back`).

**Schedules** (the paper's overlap strategies, paper-facts.md "Overlap strategies"; :func:`run_layer`):

* ``"none"``: select -> plan -> [D2H, H2D] -> attend -> commit -> finish, fully serial;
* ``"da"`` (dual attention): select -> plan -> H2D issued -> attend over the hits while the misses cross ->
  wait -> attend over the misses -> merge -> commit -> D2H issued -> finish while it crosses -> wait;
* ``"dba"`` (dual-batch attention): the batch in halves B0, B1: select + plan B0 -> H2D(B0) issued -> select +
  plan B1 (overlapping H2D(B0)) -> H2D(B1) queued -> wait B0 -> attend B0 (overlapping H2D(B1)) -> wait B1 ->
  D2H issued -> attend B1 (overlapping it) -> wait -> commit -> finish.

:mod:`ess.sim.timeline` prices the same orders (:func:`ess.sim.timeline.overlap_overhead_s`), and
:mod:`ess.studies.real_model.check` checks the prices against these schedules run for real.

What a model does at each stage is its **wiring** (the :class:`Wiring` protocol: ``select(rows)``,
``attend(plans, rows, part)``, ``merge(rows)``, ``finish()``, ``new_entries()``). Two wirings exist:
:class:`LatentWiring` here, DeepSeek's (the lightning indexer over 132-byte keys, sparse MLA over 656-byte latent
entries, split attention merged by log-sum-exp), used by :func:`decode_layer`; and the real model's K/V wiring in
:mod:`ess.engine.wiring`.

The cache is anything that follows the :class:`StepCache` protocol (``plan``, ``copy``, ``commit``,
``entry_bytes``), as :class:`ess.storage.TieredCache` does; :class:`ess.storage.ResidentCache` is the all-resident
one (every entry a hit: offload off). :class:`LatentWiring` also reads the cache's ``device_pool`` (a torch tensor on
the device, the :class:`LatentCache` protocol) in place: device rows never go back to the host.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from . import validate
from .attention import (AttentionOutput, indexer_scores, latent_format, merge_attention, softmax_scale,
                        sparse_mla_decode, stack_ragged, topk_indices)
from .kernels import resolve_backend
from .layout import indexer_entry_bytes, latent_layout
from .specs import ModelSpec

__all__ = ["SCHEDULES", "StepCache", "LatentCache", "Wiring", "LayerRun", "run_layer", "DecodeStep",
           "LatentWiring", "select", "attend", "decode_layer", "write_back"]


@runtime_checkable
class StepCache(Protocol):
    """What :func:`run_layer` needs from a cache (:class:`ess.storage.TieredCache`, :class:`ess.storage.ResidentCache`):
    ``plan`` returns a plan with ``n_misses``, ``hit_pos``, ``miss_pos``, ``slots``, ``indices`` (as
    :class:`ess.storage.StepPlan`); ``copy`` moves its misses into their device slots; ``commit`` applies it and
    returns a result with ``request_id``, ``n_hits``, ``n_misses`` (as :class:`ess.storage.PoolStep`)."""

    entry_bytes: int

    def plan(self, request_id, layer: int, indices: np.ndarray, *, scores: np.ndarray | None = None) -> Any: ...

    def copy(self, plan) -> None: ...

    def commit(self, plan) -> Any: ...


@runtime_checkable
class LatentCache(StepCache, Protocol):
    """What :class:`LatentWiring` needs besides :class:`StepCache`: the latent layout (``dtype``, ``"fp8"`` or
    ``"bf16"``) and the device pool, a ``(slots, entry_bytes)`` uint8 torch tensor on the device, read in place."""

    dtype: str
    device_pool: Any


@runtime_checkable
class Wiring(Protocol):
    """A model's part of one layer of a decode step (:func:`run_layer`); ``rows`` are positions in the batch."""

    def select(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(indices (n, K) int64 -1 padded, scores (n, K) float)`` of requests ``rows``, NumPy on the host."""

    def attend(self, plans: list, rows: np.ndarray, part: str) -> None:
        """Attention work over the device slots of ``plans`` for ``part``: ``"all"``, ``"hits"``, ``"misses"``."""

    def merge(self, rows: np.ndarray) -> None:
        """Combine what :meth:`attend` did into the rows' attention outputs."""

    def finish(self) -> None:
        """The rest of the layer, once for the whole batch."""

    def new_entries(self) -> Any:
        """This layer's entry of each request's new token, ``(B, entry_bytes)`` uint8 tensor, or ``None``."""


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


# ----------------------------------------------------------------------------------------------------------------
# One layer, any model, any schedule
# ----------------------------------------------------------------------------------------------------------------

SCHEDULES = ("none", "da", "dba")


@dataclass(frozen=True)
class LayerRun:
    """What one layer of one step did: ``indices`` (B, K) the selection, ``steps`` one result of
    ``cache.commit`` per request (:class:`~ess.storage.PoolStep` for the tiered cache), ``stall_s`` the seconds the
    compute lane waited for the link."""

    indices: np.ndarray
    steps: tuple
    stall_s: float


class _NullTimer:
    step = 0
    clock = staticmethod(time.perf_counter)

    @contextmanager
    def span(self, op, layer=-1):
        yield

    def add(self, op, layer, start_s, end_s):
        pass


def _protocol_members(protocol) -> list:
    """The attributes and methods a protocol asks for (its own and its bases')."""
    names: list = []
    for base in reversed(protocol.__mro__):
        if base is object or base is Protocol or base.__module__ != __name__:
            continue
        for n in list(base.__dict__.get("__annotations__", {})) + [k for k, v in base.__dict__.items()
                                                                   if callable(v) and not k.startswith("_")]:
            if n not in names:
                names.append(n)
    return names


_FOLLOWS: dict = {}          # (type, protocol) -> whether instances of the type follow it (checked once per type)


def _check_protocol(name: str, value, protocol) -> None:
    """A ``TypeError`` naming ``name`` and what it lacks unless ``value`` follows ``protocol``."""
    key = (type(value), protocol)
    ok = _FOLLOWS.get(key)
    if ok is None:
        ok = isinstance(value, protocol)
        if type(value).__module__ != "types":           # a SimpleNamespace's members vary from object to object
            _FOLLOWS[key] = ok
    if not ok:
        want = _protocol_members(protocol)
        missing = [m for m in want if not hasattr(value, m)]
        raise TypeError(f"{name} must follow ess.decode.{protocol.__name__} ({', '.join(want)}); "
                        f"{type(value).__name__} has no {', '.join(missing) or 'matching members'}")


def run_layer(cache, layer: int, request_ids: Sequence, wiring, *, schedule: str = "none", link=None,
              timer=None, staging=None) -> LayerRun:
    """One layer of one decode step for a batch, in the order of ``schedule`` (module docstring).

    ``wiring`` is the model's part of the step:

    * ``select(rows) -> (indices (n, K) int64, scores (n, K) float)`` the top-K of requests ``rows`` (positions in
      ``request_ids``, an int array), ``-1`` padded;
    * ``attend(plans, rows, part)`` attention work over the device slots of ``plans`` (one per row) for ``part``
      ``"all"``, ``"hits"`` or ``"misses"`` (reading the device pool where the rows lie);
    * ``merge(rows)`` combine what ``attend`` did into the rows' attention outputs;
    * ``finish()`` the rest of the layer (once, for the whole batch);
    * ``new_entries()`` this layer's entry of each request's new token, ``(B, entry_bytes)`` uint8 (NumPy or torch),
      or ``None`` (nothing to write back).

    ``link`` (:mod:`ess.link`; default :class:`~ess.link.SyncLink`) carries the copies; ``timer`` an
    :class:`ess.metrics.OpTimer`; ``staging`` a host tensor ``(n_layers, B, entry_bytes)`` uint8 (pinned for a CUDA
    device) the D2H lands in (row ``layer``), for :func:`write_back` after the last layer (``None``: no
    write-back).

    Every request is planned before anything moves, except B1's under ``"dba"`` (planned after B0's copy is
    issued). A copy that fails (``TransferError`` from the cache, re-raised by the wait) leaves the requests whose
    copy finished committed; the plans whose copy finished are committed whatever attention does."""
    from .link import SyncLink
    request_ids = _request_ids(request_ids)
    B = len(request_ids)
    validate.one_of("schedule", schedule, SCHEDULES)
    if schedule == "dba" and B < 2:
        raise ValueError("schedule 'dba' splits the batch in two halves and needs at least 2 requests")
    _check_protocol("cache", cache, StepCache)
    _check_protocol("wiring", wiring, Wiring)
    link = SyncLink() if link is None else link
    timer = _NullTimer() if timer is None else timer
    entry_bytes = cache.entry_bytes
    plans: list = [None] * B
    copied = [False] * B
    stall = [0.0]

    def select_and_plan(rows, tag=""):
        with timer.span("indexer" + tag, layer):
            idx, scores = wiring.select(rows)
        with timer.span("plan" + tag, layer):
            out = [cache.plan(request_ids[r], layer, idx[i], scores=scores[i]) for i, r in enumerate(rows)]
        for i, r in enumerate(rows):
            plans[r] = out[i]
        return idx

    submitted = []

    def h2d(rows):
        if not any(plans[r].n_misses for r in rows):   # nothing misses: nothing to copy, no job on the link
            for r in rows:
                copied[r] = True
            return None

        def chunk(r):
            def fn():
                cache.copy(plans[r])
                copied[r] = True
            return fn, int(plans[r].n_misses) * entry_bytes
        job = link.submit("h2d", layer, [chunk(r) for r in rows])
        submitted.append(job)
        return job

    def d2h():
        if staging is None:
            return None
        entries = wiring.new_entries()
        if entries is None:
            return None
        def fn():
            staging[layer].copy_(entries, non_blocking=True)       # device -> host (pinned: asynchronous on CUDA)
        return link.submit("d2h", layer, [(fn, int(entries.shape[0]) * int(entries.shape[1]))])

    def wait(job, what):
        if job is None:
            return
        t0 = timer.clock()
        try:
            job.wait()
        finally:
            t1 = timer.clock()
            stall[0] += t1 - t0
            timer.add("wait_" + what, layer, t0, t1)

    def attend(rows, part, tag=""):
        with timer.span(("attn" if part == "all" else "attn_" + part) + tag, layer):
            wiring.attend([plans[r] for r in rows], rows, part)

    def merge(rows, tag=""):
        with timer.span("merge" + tag, layer):
            wiring.merge(rows)

    every = np.arange(B)
    idx_parts = []
    finished = False
    try:
        if schedule == "none":
            idx_parts.append(select_and_plan(every))
            wait(d2h(), "d2h")
            wait(h2d(every), "h2d")
            attend(every, "all")
            merge(every)
        elif schedule == "da":
            idx_parts.append(select_and_plan(every))
            job = h2d(every)
            attend(every, "hits")
            wait(job, "h2d")
            attend(every, "misses")
            merge(every)
        else:
            half = (B + 1) // 2
            b0, b1 = every[:half], every[half:]
            idx_parts.append(select_and_plan(b0, "_b0"))
            job0 = h2d(b0)
            idx_parts.append(select_and_plan(b1, "_b1"))
            job1 = h2d(b1)
            wait(job0, "h2d")
            attend(b0, "all", "_b0")
            merge(b0, "_b0")
            wait(job1, "h2d")
            job_d = d2h()
            attend(b1, "all", "_b1")
            merge(b1, "_b1")
            wait(job_d, "d2h")
        finished = True
    finally:
        for job in submitted if not finished else ():   # after a failure, let every copy under way land before
            try:                                        # deciding what to commit: a copy that wrote its slots
                job.wait()                              # must be committed
            except Exception:                           # noqa: BLE001 - its own failure is raised by the cache
                pass
        with timer.span("commit", layer):
            steps = tuple(cache.commit(plans[r]) for r in range(B) if copied[r])
    if schedule == "da":
        job_d = d2h()
        with timer.span("finish", layer):
            wiring.finish()
        wait(job_d, "d2h")
    else:
        with timer.span("finish", layer):
            wiring.finish()
    width = max(p.shape[1] for p in idx_parts)
    indices = np.full((B, width), -1, np.int64)
    row = 0
    for p in idx_parts:
        indices[row:row + p.shape[0], :p.shape[1]] = p
        row += p.shape[0]
    return LayerRun(indices, steps, stall[0])


# ----------------------------------------------------------------------------------------------------------------
# DeepSeek's wiring: the lightning indexer and sparse MLA over latent entries
# ----------------------------------------------------------------------------------------------------------------

def select(q_index, index_weights, index_keys: Sequence, model: ModelSpec, *, topk: int | None = None,
           backend: str = "auto", device: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The entries each request reads this step: ``(indices (B, K) int64, scores (B, K) float64)``, the top-K of
    the lightning indexer over each request's indexer cache (``index_keys``: one (L_b, D + 4) uint8 cache per
    request) and the indexer score of each pick (0 at padding). ``topk`` defaults to the model's."""
    keys, lengths = stack_ragged(index_keys, "index_keys", indexer_entry_bytes(model))
    k = model.index_topk if topk is None else validate.positive_int("topk", topk)
    scores = indexer_scores(q_index, index_weights, keys, lengths, backend=backend, device=device)   # (B, L)
    indices = topk_indices(scores, k)                                                                # (B, K)
    picked = np.take_along_axis(scores, np.maximum(indices, 0), axis=1).astype(np.float64)
    return indices, np.where(indices >= 0, picked, 0.0)


def attend(cache, plans: Sequence, q: np.ndarray, model: ModelSpec, *, positions: Sequence | None = None,
           sm_scale: float | None = None, backend: str = "auto") -> AttentionOutput:
    """Sparse MLA over the device rows of every plan's selected entries, in top-K order, read where they lie in the
    cache's device pool (:class:`LatentCache`): request ``b`` reads slots ``plans[b].slots`` (after the copy).
    ``positions`` (one index array per plan, into its top-K) restricts each request to those entries (DA's hits or
    misses); default all. The torch kernel gathers the rows on the pool's device (CPU or CUDA); the NumPy and Numba
    kernels read a CPU pool's memory in place. Only the output (B, H, kv_lora_rank) comes to the host."""
    pool = cache.device_pool
    B, K = len(plans), plans[0].indices.shape[0]
    slots = np.full((B, K), -1, dtype=np.int64)                 # (B, K) device slot of each attended entry
    for b, plan in enumerate(plans):
        pos = np.flatnonzero(plan.indices >= 0) if positions is None else np.asarray(positions[b], np.int64)
        slots[b, pos] = np.asarray(plan.slots, np.int64)[pos]
        if np.any(slots[b, pos] < 0):
            raise RuntimeError(f"the plan of request {plan.request_id!r} leaves selected entries without a slot")
    be = resolve_backend(backend, device=str(pool.device))
    if be != "torch":
        return sparse_mla_decode(q, pool.numpy(), slots, model, dtype=cache.dtype, sm_scale=sm_scale, backend=be)
    import torch
    from .kernels.attention.torch_ops import sparse_mla_decode_t
    fmt = latent_format(model, cache.dtype)
    scale = softmax_scale(model) if sm_scale is None else validate.real("sm_scale", sm_scale, lo=0.0, lo_open=True)
    q = validate.float_array("q", q, 3, "(B, H, kv_lora_rank + qk_rope_head_dim)")
    out, lse = sparse_mla_decode_t(torch.from_numpy(q).to(pool.device), pool,
                                   torch.from_numpy(slots).to(pool.device), scale, *fmt)
    out, lse = out.cpu().numpy(), lse.cpu().numpy()
    if not (np.isfinite(out).all() and not np.isnan(lse).any() and not np.isposinf(lse).any()):
        raise ValueError("latents: the selected entries decode to non-finite values (an FP8 NaN byte 0x7f/0xff or "
                         "a non-finite scale), or the logits overflowed")
    return AttentionOutput(out, lse)


class LatentWiring:
    """DeepSeek-V3.2-Exp's part of a decode step (:func:`run_layer`): the lightning indexer over each request's
    indexer cache, sparse MLA over the latent entries in the device pool; under ``"da"`` the hits and the misses
    are attended apart and merged by their log-sum-exps (exact, not bitwise). Inputs as in :func:`decode_layer`;
    the cache follows :class:`LatentCache` (attention reads its device pool in place). After the step ``out`` and
    ``lse`` hold the attention of every request."""

    def __init__(self, cache, q_index, index_weights, index_keys, q, model: ModelSpec, *, topk=None, sm_scale=None,
                 backend="auto", device=None):
        self.cache, self.model = cache, model
        self.q_index, self.index_weights, self.index_keys, self.q = q_index, index_weights, list(index_keys), q
        self.kw = {"sm_scale": sm_scale, "backend": backend}
        self.topk, self.backend, self.device = topk, backend, device
        B, H, kv = q.shape[0], q.shape[1], model.kv_lora_rank
        self.out = np.zeros((B, H, kv), np.float32)
        self.lse = np.full((B, H), -np.inf, np.float32)
        self._parts: dict = {}

    def select(self, rows):
        return select(self.q_index[rows], self.index_weights[rows], [self.index_keys[r] for r in rows], self.model,
                      topk=self.topk, backend=self.backend, device=self.device)

    def attend(self, plans, rows, part):
        where = None if part == "all" else [p.hit_pos if part == "hits" else p.miss_pos for p in plans]
        self._parts[part] = (rows, attend(self.cache, plans, self.q[rows], self.model, positions=where, **self.kw))

    def merge(self, rows):
        if "all" in self._parts:
            res = self._parts.pop("all")[1]
        else:
            res = merge_attention(self._parts.pop("hits")[1], self._parts.pop("misses")[1])
        self.out[rows], self.lse[rows] = res.out, res.lse

    def finish(self):
        pass

    def new_entries(self):
        return None


def decode_layer(cache, layer: int, request_ids: Sequence, q_index, index_weights, index_keys: Sequence, q,
                 model: ModelSpec, *, topk: int | None = None, sm_scale: float | None = None,
                 backend: str = "auto", device: str | None = None, schedule: str = "none", link=None,
                 timer=None) -> DecodeStep:
    """One layer of one decode step for a batch of DeepSeek requests, stages 1-5 of the module docstring, through
    :func:`run_layer` with :class:`LatentWiring`.

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
    _check_protocol("cache", cache, LatentCache)
    if len(index_keys) != B:
        raise ValueError(f"index_keys must hold one cache per request ({B}), got {len(index_keys)}")
    q = validate.float_array("q", q, 3, "(B, H, kv_lora_rank + qk_rope_head_dim)")
    if q.shape[0] != B or q.shape[2] != model.latent_dim:
        raise ValueError(f"q must have shape (B={B}, H, {model.latent_dim}), got {q.shape}")
    wiring = LatentWiring(cache, np.asarray(q_index), np.asarray(index_weights), index_keys, q, model, topk=topk,
                          sm_scale=sm_scale, backend=backend, device=device)
    run = run_layer(cache, layer, request_ids, wiring, schedule=schedule, link=link, timer=timer)
    return DecodeStep(wiring.out, wiring.lse, run.indices, run.steps)


def write_back(cache, request_ids: Sequence, new_entries) -> list[int]:
    """Write back, once per step after the last layer: each request's new token entry ``new_entries[b]`` (n_layers, entry_bytes) uint8, all layers, written
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
