"""Tiered latent-cache storage: the GPU pool, the host pool and the disk tier, holding and moving real bytes.

ESS keeps the whole latent cache in (pinned) host memory and a bounded hot subset on the GPU ([ARX]). Here:

* :class:`HostPool` every latent entry of every request and layer, ``(n_layers, tokens, entry_bytes)`` uint8 per
  request (656-byte FP8 or 1,152-byte BF16 layout, :mod:`ess.layout`; or any :class:`~ess.layout.EntryFormat`, such
  as the real model's 1,536-byte K/V entries of :mod:`ess.engine`), grown one token per decode step
  (write-back of the new token only); pinned when the device is CUDA.
* the device pool: ``capacity`` slots per (request, layer), one uint8 torch tensor ``(slots, entry_bytes)`` on the
  cache's device (``"cpu"`` or ``"cuda[:n]"``: the same code on both). Slot numbers are global: request block ``b``
  holds layer ``l``'s pool in slots ``[(b * n_layers + l) * capacity, ... + capacity)``.
* the disk tier (:class:`ess.disk.DiskTier`, optional): spill, restore and crash recovery of whole requests.
* :class:`TieredCache` the three together.

One step of one (request, layer) with the valid top-K indices S (array order, ``-1`` padding ignored) is three
calls, so that a caller can overlap them with attention (:mod:`ess.decode`):

1. :meth:`TieredCache.plan` -- hits are S ∩ pool; misses S \\ pool get free slots first, then the slots of victims
   chosen by the eviction policy among resident entries **not** in S (:mod:`ess.policies`). Nothing changes; bad
   input (indices out of range or repeated, more valid indices than ``capacity``, wrong dtype or shape) raises here.
2. :meth:`TieredCache.copy` -- the missed rows are copied host -> device into their slots by a transfer kernel
   (:mod:`ess.kernels.transfer`). A copy that fails part-way frees the slots it was writing (their old entries are
   dropped, never left half-written) and raises :class:`~ess.kernels.transfer.TransferError`.
3. :meth:`TieredCache.commit` -- only now does the token map change; the policy sees the step, the metrics log it.

:meth:`TieredCache.step` runs the three in order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import validate
from .disk import CorruptBlockError, DiskTier, request_stem
from .kernels import resolve_backend
from .kernels.transfer import TransferError, copy_rows_unchecked
from .layout import (KV_DTYPES, EntryFormat, check_context_len, entry_format, latent_entry_bytes, pool_slots,
                     step_entries)
from .metrics import MetricsLog, StepMetrics
from .policies import ONLINE_POLICIES, SlotPlan, SlotPool, check_step_indices, make_policy
from .specs import ModelSpec, model_spec

__all__ = ["StepPlan", "PoolStep", "HostPool", "TieredCache", "ResidentCache", "Recovery", "TransferError",
           "capacity_from_budget"]


# ----------------------------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------------------------

class _Counts:
    """``n_hits`` and ``n_misses`` of a step that has ``hit_pos`` and ``miss_pos``."""

    @property
    def n_hits(self) -> int:
        return int(self.hit_pos.size)

    @property
    def n_misses(self) -> int:
        return int(self.miss_pos.size)


@dataclass(frozen=True)
class StepPlan(_Counts):
    """What one step of one (request, layer) will do, computed by :meth:`TieredCache.plan` without changing
    anything: the hits resolved to their device slots, the victims chosen by the policy and the misses' slots
    reserved.

    ``indices`` (K,) int64 as given (-1 = padding); ``slots`` (K,) the global device slot of each index after the
    step (-1 where the index is -1); ``hit`` (K,) bool; ``hit_pos`` / ``miss_pos`` positions into ``indices`` of the
    hits and of the misses, so that attention can run over the hits while the misses are copied; ``scores`` the
    weights the heat policy adds (aligned with the valid indices; ``None``: 1 each); ``pool`` the plan of the
    pool's slot map (:class:`ess.policies.SlotPlan`)."""

    request_id: object
    layer: int
    indices: np.ndarray
    slots: np.ndarray
    hit: np.ndarray
    hit_pos: np.ndarray
    miss_pos: np.ndarray
    scores: np.ndarray | None
    pool: SlotPlan


@dataclass(frozen=True)
class PoolStep(_Counts):
    """What one step did to one (request, layer) pool (:meth:`TieredCache.commit`, :meth:`TieredCache.step`).

    ``step`` the pool's decode-step count after it; ``slots``, ``hit``, ``hit_pos``, ``miss_pos`` as in
    :class:`StepPlan`; ``evicted`` the tokens pushed out; ``bytes_h2d`` the bytes copied host -> device."""

    request_id: object
    layer: int
    step: int
    indices: np.ndarray
    slots: np.ndarray
    hit: np.ndarray
    hit_pos: np.ndarray
    miss_pos: np.ndarray
    evicted: np.ndarray
    bytes_h2d: int


# ----------------------------------------------------------------------------------------------------------------
# Host pool
# ----------------------------------------------------------------------------------------------------------------

class HostPool:
    """Every latent entry of every request: per request one ``(n_layers, capacity_tokens, entry_bytes)`` uint8
    array of which the first ``n_tokens`` token rows are valid; the capacity doubles when full.

    ``pinned=True`` allocates page-locked memory through torch (needed for zero-copy CUDA reads)."""

    def __init__(self, n_layers: int, entry_bytes: int, *, pinned: bool = False):
        self.n_layers = int(n_layers)
        self.entry_bytes = int(entry_bytes)
        self.pinned = bool(pinned)
        self._arrays: dict = {}       # request_id -> np.ndarray (n_layers, cap, W)
        self._tensors: dict = {}      # request_id -> pinned torch tensor sharing the array's memory
        self._n_tokens: dict = {}

    def _alloc(self, cap: int):
        shape = (self.n_layers, cap, self.entry_bytes)
        if self.pinned:
            import torch
            t = torch.zeros(shape, dtype=torch.uint8, pin_memory=True)
            return t.numpy(), t
        return np.zeros(shape, np.uint8), None

    def __contains__(self, request_id) -> bool:
        return request_id in self._arrays

    def requests(self) -> list:
        return list(self._arrays)

    def n_tokens(self, request_id) -> int:
        return self._n_tokens[request_id]

    def add(self, request_id, entries: np.ndarray, capacity: int | None = None) -> None:
        """Hold a request's entries ``(n_layers, n, entry_bytes)`` with room for ``capacity`` tokens (default n)."""
        n = entries.shape[1]
        arr, t = self._alloc(max(n, 1, capacity or 0))
        arr[:, :n] = entries
        self._arrays[request_id], self._tensors[request_id], self._n_tokens[request_id] = arr, t, n

    def append(self, request_id, entries: np.ndarray) -> int:
        """Write one token's entries ``(n_layers, entry_bytes)``; returns its token index."""
        arr, n = self._arrays[request_id], self._n_tokens[request_id]
        if n == arr.shape[1]:                       # full: double the capacity, keep the valid rows
            new, t = self._alloc(2 * arr.shape[1])
            new[:, :n] = arr[:, :n]
            self._arrays[request_id], self._tensors[request_id] = new, t
            arr = new
        arr[:, n] = entries
        self._n_tokens[request_id] = n + 1
        return n

    def remove(self, request_id) -> None:
        for d in (self._arrays, self._tensors, self._n_tokens):
            d.pop(request_id, None)

    def entries(self, request_id) -> np.ndarray:
        """The valid entries ``(n_layers, n_tokens, entry_bytes)`` (a view: do not write)."""
        return self._arrays[request_id][:, :self._n_tokens[request_id]]

    def layer_rows(self, request_id, layer: int, *, as_torch: bool = False):
        """All rows of one layer ``(capacity_tokens, entry_bytes)``, contiguous: a transfer source."""
        layer = validate.integer("layer", layer, lo=0, below=self.n_layers)
        if as_torch and self.pinned:
            return self._tensors[request_id][layer]
        return self._arrays[request_id][layer]

    @property
    def nbytes(self) -> int:
        """Bytes of valid entries (not counting spare capacity)."""
        return sum(n * self.n_layers * self.entry_bytes for n in self._n_tokens.values())

    @property
    def allocated_bytes(self) -> int:
        return sum(a.nbytes for a in self._arrays.values())


# ----------------------------------------------------------------------------------------------------------------
# Budgets
# ----------------------------------------------------------------------------------------------------------------

def capacity_from_budget(model: ModelSpec, budget_bytes: float, n_requests: int, context_len: int,
                         dtype: str = "fp8") -> int:
    """GPU slots per (request, layer) that ``budget_bytes`` of device pool gives ``n_requests`` requests:
    ``floor(budget / (n_requests x n_layers x entry_bytes))``. A ``ValueError`` when that is fewer than one
    step's K = min(index_topk, context) entries."""
    n_requests = validate.positive_int("n_requests", n_requests)
    context_len = check_context_len(model, context_len)
    budget = validate.real("budget_bytes", budget_bytes, lo=0.0, lo_open=True)
    per_slot = n_requests * model.n_layers * latent_entry_bytes(model, dtype)
    capacity = int(budget // per_slot)
    k = step_entries(model, context_len)
    if capacity < k:
        raise ValueError(f"budget_bytes={budget:.0f} gives {capacity} slots per request and layer for "
                         f"{n_requests} requests x {model.n_layers} layers x {per_slot // n_requests // model.n_layers}"
                         f" B; one step needs K = {k} slots ({k * per_slot:.0f} B)")
    return capacity


# ----------------------------------------------------------------------------------------------------------------
# The tiered cache
# ----------------------------------------------------------------------------------------------------------------

@dataclass
class _Pool:
    """One (request, layer) pool: its first global slot, its slot map with the eviction policy, and its decode-step
    count."""

    base: int
    slots: SlotPool
    steps: int = 0

    def copy_state(self) -> dict:
        return {**self.slots.state(), "steps": self.steps}


@dataclass
class _Request:
    block: int
    pools: list = field(default_factory=list)


@dataclass
class Recovery:
    """What :meth:`TieredCache.recover` did: ``cache`` the rebuilt cache; ``recovered`` the request ids restored
    (as of their last completed checkpoint); ``failed`` ``{request id: reason}`` for the requests left out;
    ``degraded`` ``{request id: reason}`` for recovered requests whose device pool could not be refilled (their
    entries are whole); ``orphans`` the disk tier's files that no checkpoint names (left in place)."""

    cache: "TieredCache"
    recovered: list
    failed: dict
    degraded: dict
    orphans: list

    def __str__(self) -> str:
        lines = [f"recovered {len(self.recovered)} request(s): {self.recovered}"]
        lines += [f"failed {rid!r}: {why}" for rid, why in self.failed.items()]
        lines += [f"degraded {rid!r}: {why}" for rid, why in self.degraded.items()]
        if self.orphans:
            lines.append(f"orphan files (no checkpoint names them): {[p.name for p in self.orphans]}")
        return "\n".join(lines)


class TieredCache:
    """Cache entries in three tiers for one entry format (DeepSeek's latent entries, or any
    :class:`~ess.layout.EntryFormat`): host pool (all entries), GPU pool (``capacity`` slots per request and layer),
    optional disk tier (``disk_dir``).

    Parameters
    ----------
    model : ModelSpec, preset name, or :class:`ess.layout.EntryFormat`
        What one entry is: a DeepSeek-style model's latent entry in ``dtype``, or any entry format (layers, bytes
        per entry, page), e.g. a real model's K/V entries (:func:`ess.engine.kv.kv_entry_format`).
    capacity : int
        GPU slots per (request, layer). See :meth:`from_budget` and :meth:`from_ratio` for the other ways to size it.
    dtype : ``"fp8"`` (656-byte entries) or ``"bf16"`` (1,152 B); for a ModelSpec only (an EntryFormat carries its
        own)
    policy : ``"lru"`` (default, the paper's), ``"fifo"`` or ``"heat"`` (:data:`ess.policies.ONLINE_POLICIES`;
        Belady needs the future and runs in the simulations only)
    backend : transfer backend, ``"auto" | "reference" | "numba" | "torch"``
    device : ``"cpu"`` or ``"cuda[:n]"``: where the device pool lives (a torch tensor on either; on CUDA the host
        pool is pinned and misses are read zero-copy)
    disk_dir : folder of the disk tier (``None``: no disk tier)
    max_requests : when given, the device pool is allocated once for that many requests (a fixed budget) and
        :meth:`add_request` refuses more; otherwise it grows by whole requests.
    policy_options : passed to the policy (``decay`` for heat)
    block_tokens : tokens per disk block (default: the format's page, 64 for DeepSeek-V3.2-Exp)

    >>> import numpy as np
    >>> c = TieredCache("tiny", capacity=4)                  # 4 layers, 164-byte FP8 entries
    >>> c.add_request("r", np.zeros((4, 10, c.entry_bytes), np.uint8))
    >>> r = c.step("r", 0, np.array([3, -1, 7], np.int64))
    >>> r.n_misses, r.bytes_h2d, r.slots.tolist()
    (2, 328, [0, -1, 1])
    """

    def __init__(self, model, *, capacity: int, dtype: str = "fp8", policy: str = "lru", backend: str = "auto",
                 device: str = "cpu", disk_dir=None, max_requests: int | None = None,
                 policy_options: dict | None = None, block_tokens: int | None = None):
        model = model_spec(model) if isinstance(model, str) else model
        if not isinstance(model, (ModelSpec, EntryFormat)):
            raise TypeError(f"model must be a ModelSpec, a preset name or an EntryFormat, got {type(model).__name__}")
        self.capacity = validate.positive_int("capacity", capacity)
        if isinstance(model, EntryFormat):
            if dtype != "fp8":
                raise ValueError(f"dtype is part of the EntryFormat {model.name!r}; do not pass dtype={dtype!r}")
            dtype = model.dtype
        else:
            validate.one_of("dtype", dtype, KV_DTYPES)
        self.model = model if isinstance(model, ModelSpec) else None
        self.format = entry_format(model, dtype)
        validate.one_of("policy", policy, ONLINE_POLICIES)
        self.device = str(device)
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device must be 'cpu' or 'cuda[:n]', got {device!r}")
        self.backend = resolve_backend(backend, device=self.device)
        self.dtype, self.policy_name = dtype, policy
        self.policy_options = dict(policy_options or {})
        make_policy(policy, 1, **self.policy_options)           # check the options now
        self.entry_bytes = self.format.entry_bytes
        self.n_layers = self.format.n_layers
        self.on_cuda = self.device.startswith("cuda")
        self.host = HostPool(self.n_layers, self.entry_bytes, pinned=self.on_cuda)
        self.max_requests = None if max_requests is None else validate.positive_int("max_requests", max_requests)
        self._block_slots = self.n_layers * self.capacity
        self._device = self._alloc_device(self.max_requests or 1)
        self._free_blocks = list(range(self._n_blocks()))
        self._requests: dict = {}
        self._spilled: set = set()
        self.metrics = MetricsLog()
        self.disk = None
        if disk_dir is not None:
            bt = self.format.page_tokens if block_tokens is None else block_tokens
            self.disk = DiskTier(disk_dir, self.n_layers, self.entry_bytes, bt)
        self._disk_clean_tokens: dict = {}            # request -> tokens already on disk and unchanged since

    # -- constructors from budgets ---------------------------------------------------------------------------
    @classmethod
    def from_budget(cls, model, budget_bytes: float, n_requests: int, context_len: int, **kwargs) -> "TieredCache":
        """A cache whose device pool holds ``n_requests`` requests within ``budget_bytes`` (all layers): capacity
        from :func:`capacity_from_budget`, allocated once (``max_requests = n_requests``)."""
        model = model_spec(model) if isinstance(model, str) else model
        cap = capacity_from_budget(model, budget_bytes, n_requests, context_len, kwargs.get("dtype", "fp8"))
        return cls(model, capacity=cap, max_requests=n_requests, **kwargs)

    @classmethod
    def from_ratio(cls, model, ratio: float, context_len: int, **kwargs) -> "TieredCache":
        """A cache with :func:`ess.layout.pool_slots` slots per request and layer (``floor(ratio x page-padded
        context)``); a ``ValueError`` when that is fewer than one step's K entries."""
        model = model_spec(model) if isinstance(model, str) else model
        need = step_entries(model, context_len)
        return cls(model, capacity=pool_slots(model, ratio, context_len, need=need), **kwargs)

    @classmethod
    def recover(cls, model, disk_dir, **kwargs) -> "Recovery":
        """A new cache rebuilt after a crash from every request archived in ``disk_dir``, request by request:
        each intact request gets its host and device pools back as of its last completed checkpoint or spill; a
        request whose archive cannot be read (missing or garbage manifest, damaged blocks) is left out and
        reported with the reason, and so are the files no checkpoint names (orphans, nothing is deleted).
        Returns a :class:`Recovery` (``.cache``, ``.recovered``, ``.failed``, ``.degraded``, ``.orphans``)."""
        cache = cls(model, disk_dir=disk_dir, **kwargs)
        scan = cache.disk.scan()
        out = Recovery(cache, [], dict(scan.failed), {}, list(scan.orphans))
        for rid in scan.readable:
            cache._spilled.add(rid)
            try:
                info = cache.restore(rid)
            except TransferError as exc:                # entries back, one layer's device pool empty
                out.recovered.append(rid)
                out.degraded[rid] = str(exc)
                continue
            except (CorruptBlockError, ValueError) as exc:
                cache._spilled.discard(rid)
                out.failed[rid] = str(exc)
                continue
            out.recovered.append(rid)
            if not info["pool_state_restored"]:
                out.degraded[rid] = "the pool-state file is damaged or missing: the device pool starts empty"
        return out

    # -- device pool memory ----------------------------------------------------------------------------------
    def _alloc_device(self, n_blocks: int):
        import torch
        shape = (n_blocks * self._block_slots, self.entry_bytes)
        try:
            return torch.zeros(shape, dtype=torch.uint8, device=self.device)
        except (MemoryError, ValueError, RuntimeError, TypeError) as exc:   # too large (a size past int64 too)
            raise ValueError(f"a device pool of {n_blocks} request(s) x {self.n_layers} layers x capacity="
                             f"{self.capacity} slots x {self.entry_bytes} B = {shape[0] * shape[1]:,} B cannot be "
                             f"allocated on {self.device} ({type(exc).__name__}); use a smaller capacity or "
                             f"budget") from None

    def _n_blocks(self) -> int:
        return int(self._device.shape[0]) // self._block_slots

    def _take_block(self) -> int:
        if not self._free_blocks:
            if self.max_requests is not None:
                raise ValueError(f"the device pool is sized for max_requests={self.max_requests} requests and all "
                                 f"are in use; remove or spill one first")
            old = self._device
            n = self._n_blocks()
            self._device = self._alloc_device(2 * n)
            self._device[:old.shape[0]] = old
            self._free_blocks = list(range(n, 2 * n))
        return self._free_blocks.pop(0)

    @property
    def device_pool(self):
        """The device pool ``(slots, entry_bytes)`` uint8, a torch tensor on the cache's device (what a decode step
        reads in place)."""
        return self._device

    @property
    def device_allocated_bytes(self) -> int:
        return int(self._device.shape[0]) * self.entry_bytes

    @property
    def device_resident_bytes(self) -> int:
        """Bytes of entries resident in the device pool now."""
        n = sum(int((p.slots.token_of >= 0).sum()) for r in self._requests.values() for p in r.pools)
        return n * self.entry_bytes

    @property
    def budget_bytes(self) -> int | None:
        """The device-pool budget when one was fixed (``max_requests``), else ``None``."""
        return None if self.max_requests is None else self.max_requests * self._block_slots * self.entry_bytes

    # -- requests --------------------------------------------------------------------------------------------
    def requests(self) -> list:
        return list(self._requests)

    def n_tokens(self, request_id) -> int:
        self._check_active(request_id)
        return self.host.n_tokens(request_id)

    def _check_active(self, request_id) -> _Request:
        if request_id in self._spilled:
            raise ValueError(f"request {request_id!r} is spilled to disk; restore() it first")
        try:
            return self._requests[request_id]
        except (KeyError, TypeError):
            raise ValueError(f"unknown request_id {request_id!r}") from None

    def _check_layer(self, layer) -> int:
        return validate.integer("layer", layer, lo=0, below=self.n_layers)

    def _new_pools(self, block: int, n_tokens: int) -> list:
        return [_Pool((block * self.n_layers + l) * self.capacity,
                      SlotPool(self.capacity, self.policy_name, n_tokens, **self.policy_options))
                for l in range(self.n_layers)]

    def add_request(self, request_id, latent_entries: np.ndarray, *, reserve_tokens: int | None = None) -> None:
        """Register a request with its prefill entries ``(n_layers, L, entry_bytes)`` uint8 (host pool only; the
        device pool starts empty: use :meth:`warmup` to seed it). ``reserve_tokens``: host room for that many
        tokens in all, so that decoding appends without growing the host array."""
        try:
            hash(request_id)
        except TypeError:
            raise TypeError(f"request_id must be hashable, got {type(request_id).__name__}") from None
        if request_id in self._requests or request_id in self._spilled:
            raise ValueError(f"request_id {request_id!r} already exists")
        latent_entries = validate.entries("latent_entries", latent_entries, (self.entry_bytes,), ndim=3,
                                          shape_doc=f"(n_layers={self.n_layers}, L, {self.entry_bytes})")
        if latent_entries.shape[0] != self.n_layers:
            raise ValueError(f"latent_entries must have shape (n_layers={self.n_layers}, L, {self.entry_bytes}), "
                             f"got {latent_entries.shape}")
        if self.disk is not None:
            request_stem(request_id)
        if reserve_tokens is not None:
            validate.integer("reserve_tokens", reserve_tokens, lo=latent_entries.shape[1])
        block = self._take_block()
        self.host.add(request_id, latent_entries, reserve_tokens)
        self._requests[request_id] = _Request(block, self._new_pools(block, latent_entries.shape[1]))
        self._disk_clean_tokens[request_id] = 0

    def append_token(self, request_id, entries: np.ndarray) -> int:
        """Write back one new token's entries ``(n_layers, entry_bytes)`` to the host pool (only that token's
        bytes move device -> host); returns the new token's index. The new token is not put in the GPU pool."""
        req = self._check_active(request_id)
        entries = validate.entries("entries", entries, (self.n_layers, self.entry_bytes), ndim=2)
        tok = self.host.append(request_id, entries)
        for p in req.pools:
            p.slots.grow(tok + 1)
        step = max(p.steps for p in req.pools)
        self.metrics.add(StepMetrics("append", request_id, -1, step, 0, 0, 0, self.n_layers * self.entry_bytes))
        return tok

    def remove_request(self, request_id) -> None:
        """Forget a request in host and device memory (its disk archive, if any, stays)."""
        if request_id in self._spilled:
            self._spilled.discard(request_id)
            return
        req = self._check_active(request_id)
        self.host.remove(request_id)
        self._free_blocks.append(req.block)
        self._free_blocks.sort()
        del self._requests[request_id]
        self._disk_clean_tokens.pop(request_id, None)

    # -- the step: plan, copy, commit ----------------------------------------------------------------------------
    def _copy_rows(self, src, src_idx, dst, dst_idx) -> None:
        """The one place where bytes move (tests replace it to inject a failure). The indices were built by the
        plan itself (in range, distinct slots), so the kernel is called without re-validation."""
        copy_rows_unchecked(src, np.ascontiguousarray(src_idx, np.int64), dst,
                            np.ascontiguousarray(dst_idx, np.int64), backend=self.backend)

    def _h2d(self, request_id, layer: int, tokens: np.ndarray, slots: np.ndarray) -> None:
        src = self.host.layer_rows(request_id, layer, as_torch=self.on_cuda)
        self._copy_rows(src, tokens, self._device, slots)

    def _check_scores(self, scores, idx):
        if scores is None:
            return None
        if not isinstance(scores, np.ndarray) or scores.dtype.kind != "f":
            raise TypeError(f"scores must be a NumPy float array aligned with indices, got {type(scores).__name__}")
        if scores.shape != idx.shape:
            raise ValueError(f"scores must have the shape of indices {idx.shape}, got {scores.shape}")
        if not np.isfinite(scores[idx >= 0]).all():
            raise ValueError("scores must be finite where indices are valid")
        return scores.astype(np.float64)

    def _plan(self, request_id, layer: int, idx: np.ndarray, scores) -> StepPlan:
        pool = self._requests[request_id].pools[layer]
        valid_pos = np.flatnonzero(idx >= 0)
        sp = pool.slots.plan(idx[valid_pos])
        slots = np.full(idx.shape, -1, np.int64)
        slots[valid_pos] = pool.base + sp.slots
        hit = np.zeros(idx.shape, bool)
        hit[valid_pos[~sp.miss]] = True
        return StepPlan(request_id, layer, idx, slots, hit, valid_pos[~sp.miss], valid_pos[sp.miss],
                        None if scores is None else scores[valid_pos], sp)

    def plan(self, request_id, layer: int, indices: np.ndarray, *, scores: np.ndarray | None = None) -> StepPlan:
        """The plan for making the top-K entries ``indices`` (K,) int64 (-1 = padding) of one (request, layer)
        resident: hits resolved to their slots, victims chosen by the policy, the misses' slots reserved. Changes
        nothing; raises ``ValueError``/``TypeError`` on bad input (so a caller can plan a whole batch before the
        first row moves). ``scores`` (K,) float, the indexer scores of the selected tokens, are the heat policy's
        weights."""
        self._check_active(request_id)
        layer = self._check_layer(layer)
        idx = check_step_indices(indices, self.host.n_tokens(request_id), self.capacity)
        return self._plan(request_id, layer, idx, self._check_scores(scores, idx))

    def _current_pool(self, plan: StepPlan) -> _Pool:
        if not isinstance(plan, StepPlan):
            raise TypeError(f"plan must be a StepPlan from TieredCache.plan, got {type(plan).__name__}")
        req = self._check_active(plan.request_id)
        pool = req.pools[plan.layer]
        if plan.pool.version != pool.slots.version:
            raise ValueError(f"the plan for request {plan.request_id!r} layer {plan.layer} is stale (its pool "
                             f"changed since it was made): plan again")
        return pool

    def copy(self, plan: StepPlan) -> None:
        """Copy the plan's misses host -> device into their reserved slots. A copy that fails part-way frees the
        victims' slots it was writing (their old entries are dropped, never left half-written) and raises
        :class:`~ess.kernels.transfer.TransferError`; the plan is then stale."""
        pool = self._current_pool(plan)
        sp = plan.pool
        if not sp.n_misses:
            return
        try:
            self._h2d(plan.request_id, plan.layer, sp.tokens[sp.miss], pool.base + sp.slots[sp.miss])
        except Exception as exc:
            pool.slots.drop(sp.victims)
            raise TransferError(f"request {plan.request_id!r} layer {plan.layer}: host->device copy of "
                                f"{sp.n_misses} rows failed ({exc}); the {sp.victims.size} slots being overwritten "
                                f"were freed") from exc

    def _commit(self, plan: StepPlan, kind: str) -> PoolStep:
        pool = self._current_pool(plan)
        evicted = pool.slots.commit(plan.pool, plan.scores)
        n_miss = plan.n_misses
        if kind == "step":
            pool.steps += 1
        res = PoolStep(plan.request_id, plan.layer, pool.steps, plan.indices, plan.slots, plan.hit, plan.hit_pos,
                       plan.miss_pos, evicted, n_miss * self.entry_bytes)
        self.metrics.add(StepMetrics(kind, plan.request_id, plan.layer, pool.steps, res.n_hits, n_miss,
                                     res.bytes_h2d, 0))
        return res

    def commit(self, plan: StepPlan) -> PoolStep:
        """Apply a plan whose misses were copied (:meth:`copy`): the token map and the policy change, the decode
        step is counted and logged. Returns the :class:`PoolStep`."""
        return self._commit(plan, "step")

    def step(self, request_id, layer: int, indices: np.ndarray, *, scores: np.ndarray | None = None) -> PoolStep:
        """:meth:`plan`, :meth:`copy` and :meth:`commit` in one call. On bad input raises ``ValueError``/
        ``TypeError`` with every pool unchanged; a failed copy frees the slots it was writing."""
        plan = self.plan(request_id, layer, indices, scores=scores)
        self.copy(plan)
        return self.commit(plan)

    def warmup(self, request_id, layer: int, windows) -> int:
        """LRU-Warmup: feed the top-K sets of the last W prefill positions, in order, to the pool of one layer (each
        like a step; the loads are logged as ``"warmup"``, not as decode misses). All windows are validated
        before any is applied. Returns the number of entries loaded."""
        self._check_active(request_id)
        layer = self._check_layer(layer)
        if isinstance(windows, np.ndarray) and windows.ndim == 2:
            windows = list(windows)
        if not isinstance(windows, (list, tuple)):
            raise TypeError(f"windows must be a list of index arrays, got {type(windows).__name__}")
        n_tok = self.host.n_tokens(request_id)
        checked = [check_step_indices(w, n_tok, self.capacity, name=f"windows[{i}]") for i, w in enumerate(windows)]
        loaded = 0
        for w in checked:
            plan = self._plan(request_id, layer, w, None)
            self.copy(plan)
            loaded += self._commit(plan, "warmup").n_misses
        return loaded

    def run_trace(self, trace, request_id, *, batch_index: int = 0, warmup: bool = True, new_tokens=None,
                  verify: bool = False):
        """Replay one request of an :class:`ess.traces.Trace` through this cache (:meth:`replay_trace`, to the end)
        and return the metrics records the replay added (a DataFrame with the columns of
        :meth:`ess.metrics.MetricsLog.to_frame`)."""
        start = len(self.metrics)
        for _ in self.replay_trace(trace, request_id, batch_index=batch_index, warmup=warmup, new_tokens=new_tokens,
                                   verify=verify):
            pass
        return self.metrics.to_frame(start)

    def replay_trace(self, trace, request_id, *, batch_index: int = 0, warmup: bool = True, new_tokens=None,
                     verify: bool = False):
        """Replay one request of an :class:`ess.traces.Trace` through this cache, one decode step at a time: an
        iterator that yields, after each step, the :class:`ess.metrics.StepMetrics` records that step added (one
        ``"step"`` record per layer, then the ``"append"`` records of its new tokens), so that a caller can follow
        the replay while it runs.

        Layer ``l`` of the trace drives layer ``l`` of the cache; the trace's request ``batch_index`` drives
        ``request_id``, whose token count must be the trace's ``context_len``. With ``warmup`` the trace's LRU-Warmup
        windows are fed first (:meth:`warmup`; their records are logged, not yielded). Then every decode step calls
        :meth:`step` on every layer and writes back the step's ``trace.mtp`` new tokens (:meth:`append_token`) from
        ``new_tokens`` ``(steps * mtp, n_layers, entry_bytes)`` uint8 (``None``: nothing is appended, then no step
        may select a token past the prefill). ``verify=True`` compares the rows each step loaded with their host
        copies and raises ``RuntimeError`` on a difference.

        Every argument is checked here, before anything changes (and before the first step is asked for); a transfer
        that fails part-way (``TransferError``) leaves the steps before it done."""
        from .traces import Trace
        if not isinstance(trace, Trace):
            raise TypeError(f"trace must be an ess.traces.Trace, got {type(trace).__name__}")
        self._check_active(request_id)
        batch_index = validate.integer("batch_index", batch_index, lo=0, below=trace.batch)
        if trace.n_layers != self.n_layers:
            raise ValueError(f"trace has {trace.n_layers} layers, the cache {self.n_layers}: one trace layer drives "
                             f"one cache layer")
        n_tok = self.host.n_tokens(request_id)
        if trace.context_len != n_tok:
            raise ValueError(f"trace starts at context_len={trace.context_len} tokens but request {request_id!r} "
                             f"holds {n_tok}")
        steps = trace.indices[batch_index]                                 # (n_layers, steps, width)
        windows = trace.windows[batch_index] if trace.windows is not None else None
        if warmup and windows is None:
            raise ValueError("warmup=True but the trace has no warmup windows (pass warmup=False)")
        sizes = [int((steps >= 0).sum(axis=-1).max())] + ([windows.shape[-1]] if warmup else [])
        if max(sizes) > self.capacity:
            raise ValueError(f"trace selects up to {max(sizes)} entries per step but the pool has capacity="
                             f"{self.capacity} slots")
        n_new = trace.steps * trace.mtp
        if new_tokens is None:
            if steps.max(initial=-1) >= n_tok:
                raise ValueError(f"new_tokens is None but the trace selects token {int(steps.max())}, past the "
                                 f"{n_tok} tokens of the prefill: pass the decoded tokens' entries")
        else:
            new_tokens = validate.entries("new_tokens", new_tokens, (self.n_layers, self.entry_bytes), ndim=3,
                                          shape_doc=f"(steps * mtp, {self.n_layers}, {self.entry_bytes})")
            if new_tokens.shape[0] != n_new:
                raise ValueError(f"new_tokens must hold steps * mtp = {n_new} tokens, got {new_tokens.shape[0]}")
        if not isinstance(verify, bool) or not isinstance(warmup, bool):
            raise TypeError("warmup and verify must be True or False")
        return self._replay(request_id, steps, windows if warmup else None, trace, new_tokens, verify)

    def _replay(self, request_id, steps, windows, trace, new_tokens, verify):
        """The steps of :meth:`replay_trace`, its arguments checked (``windows`` None: no warmup)."""
        if windows is not None:
            for layer in range(self.n_layers):
                self.warmup(request_id, layer, windows[layer])
        for t in range(trace.steps):
            n0 = len(self.metrics)
            for layer in range(self.n_layers):
                res = self.step(request_id, layer, steps[layer, t])
                if verify and res.n_misses:
                    got = self.device_rows(res.slots[res.miss_pos])
                    want = self.host.entries(request_id)[layer][res.indices[res.miss_pos]]
                    if not np.array_equal(got, want):
                        raise RuntimeError(f"request {request_id!r} layer {layer} step {t}: rows loaded into the "
                                           f"device pool differ from their host copies")
            if new_tokens is not None:
                for j in range(trace.mtp):
                    self.append_token(request_id, new_tokens[t * trace.mtp + j])
            yield self.metrics.records[n0:]

    # -- reading ---------------------------------------------------------------------------------------------
    def device_rows(self, slots: np.ndarray) -> np.ndarray:
        """The uint8 rows ``(n, entry_bytes)`` in device ``slots`` (global slot numbers, as in
        :attr:`PoolStep.slots`), copied to a host NumPy array; rows for slot ``-1`` are zero. For checks and
        inspection: a decode step reads :attr:`device_pool` in place and copies nothing back."""
        if not isinstance(slots, np.ndarray) or slots.ndim != 1 or slots.dtype.kind not in "iu":
            raise TypeError("slots must be a 1-D NumPy integer array")
        n = int(self._device.shape[0])
        if slots.size and (slots.min() < -1 or slots.max() >= n):
            raise ValueError(f"slots must be in [-1, {n}), got values in [{slots.min()}, {slots.max()}]")
        return _rows_to_host(self._device, slots.astype(np.int64))

    def resident(self, request_id, layer: int) -> np.ndarray:
        """Tokens resident in the pool of one (request, layer), in eviction order (first to go first)."""
        return self._check_active(request_id).pools[self._check_layer(layer)].slots.resident()

    def slot_map(self, request_id, layer: int) -> dict:
        """``{token: global slot}`` of one (request, layer) pool."""
        pool = self._check_active(request_id).pools[self._check_layer(layer)]
        token_of = pool.slots.token_of
        return {int(token_of[i]): int(pool.base + i) for i in np.flatnonzero(token_of >= 0)}

    def snapshot(self) -> dict:
        """A deep copy of all bookkeeping and bytes (for tests that check a failed call changed nothing)."""
        dev = self._device.cpu().numpy().copy()
        return {"device": dev, "free_blocks": list(self._free_blocks), "spilled": set(self._spilled),
                "host": {r: self.host.entries(r).copy() for r in self.host.requests()},
                "pools": {r: [p.copy_state() for p in q.pools] for r, q in self._requests.items()},
                "n_metrics": len(self.metrics)}

    # -- disk tier -------------------------------------------------------------------------------------------
    def _need_disk(self) -> DiskTier:
        if self.disk is None:
            raise ValueError("this cache has no disk tier: pass disk_dir= when constructing it")
        return self.disk

    def _pool_state(self, req: _Request) -> dict:
        states = [p.slots.policy.state() for p in req.pools]
        out = {"token_of": np.stack([p.slots.token_of for p in req.pools]),
               "steps": np.array([p.steps for p in req.pools], np.int64)}
        for key in states[0]:
            out[f"policy_{key}"] = np.stack([np.asarray(s[key]) for s in states])
        return out

    def checkpoint(self, request_id) -> int:
        """Write the request to disk (blocks changed since the last checkpoint, the device-pool state and the
        manifest), keeping it in memory. Returns the number of blocks written."""
        disk = self._need_disk()
        req = self._check_active(request_id)
        n = disk.write(request_id, self.host.entries(request_id), self._pool_state(req),
                       from_token=self._disk_clean_tokens.get(request_id, 0))
        self._disk_clean_tokens[request_id] = self.host.n_tokens(request_id)
        return n

    def spill(self, request_id) -> None:
        """Pause a request: checkpoint it to disk, then free its host and device memory."""
        self.checkpoint(request_id)
        self.remove_request(request_id)
        self._spilled.add(request_id)

    def verify_disk(self, request_id) -> list[int]:
        """Disk blocks of a request that fail their CRC-32 (``-1``: the pool-state file)."""
        return self._need_disk().verify(request_id)

    def repair_disk(self, request_id) -> list[int]:
        """Rewrite the damaged disk blocks of a request held in memory from its host copy; returns the blocks."""
        disk = self._need_disk()
        bad = disk.verify(request_id)
        if bad:
            req = self._check_active(request_id)
            first = min(b for b in bad if b >= 0) * disk.block_tokens if any(b >= 0 for b in bad) else \
                self.host.n_tokens(request_id)
            disk.write(request_id, self.host.entries(request_id), self._pool_state(req), from_token=first)
            self._disk_clean_tokens[request_id] = self.host.n_tokens(request_id)
        return bad

    def restore(self, request_id) -> dict:
        """Bring a spilled request (or one found on disk after a crash) back: host pool from the disk blocks, each
        checked against its CRC-32, then the device pool refilled with the resident entries it held at the
        checkpoint. Raises :class:`CorruptBlockError` (and restores nothing) when a block of entries is damaged;
        when only the pool-state file is damaged (or missing), the entries are restored and the device pool starts
        empty. Returns ``{"tokens", "resident", "bytes_h2d", "pool_state_restored"}``."""
        disk = self._need_disk()
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already in memory")
        if not disk.has(request_id):
            raise ValueError(f"request {request_id!r} is not on disk in {disk.dir}")
        entries, pool_state, bad = disk.read(request_id)
        if [b for b in bad if b >= 0]:
            raise CorruptBlockError(request_id, bad, str(disk.dir))
        pool_ok = -1 not in bad
        token_of = pool_state["token_of"] if pool_ok else np.full((self.n_layers, self.capacity), -1, np.int64)
        if token_of.shape != (self.n_layers, self.capacity):
            raise ValueError(f"request {request_id!r} was archived with capacity {token_of.shape[1]}, this cache "
                             f"has capacity {self.capacity}")
        block = self._take_block()
        self._spilled.discard(request_id)
        self.host.add(request_id, entries)
        pools = self._new_pools(block, entries.shape[1])
        self._requests[request_id] = _Request(block, pools)
        self._disk_clean_tokens[request_id] = entries.shape[1]
        moved = 0
        for l, p in enumerate(pools):
            p.slots.set_token_map(token_of[l])
            slots = np.flatnonzero(p.slots.token_of >= 0)
            if pool_ok:
                p.steps = int(pool_state["steps"][l])
                p.slots.policy.set_state({k[len("policy_"):]: v[l] for k, v in pool_state.items()
                                          if k.startswith("policy_")})
            if slots.size:
                try:
                    self._h2d(request_id, l, p.slots.token_of[slots], p.base + slots)
                except Exception as exc:        # this layer's slots may be half written: empty its pool
                    p.slots.drop(np.arange(self.capacity))
                    raise TransferError(f"request {request_id!r}: refilling layer {l}'s device pool failed ({exc}); "
                                        f"the host entries are restored, that layer's pool is empty") from exc
                moved += slots.size
                self.metrics.add(StepMetrics("restore", request_id, l, p.steps, 0, int(slots.size),
                                             int(slots.size) * self.entry_bytes, 0))
        return {"tokens": int(entries.shape[1]), "resident": moved, "bytes_h2d": moved * self.entry_bytes,
                "pool_state_restored": pool_ok}


# ----------------------------------------------------------------------------------------------------------------
# Offload off: every entry resident
# ----------------------------------------------------------------------------------------------------------------

class ResidentCache:
    """Every entry of every request held in the device pool -- offload off, the baseline a tiered run must equal.
    It speaks the tiered cache's step protocol (:meth:`plan`, :meth:`copy`, :meth:`commit`, :meth:`append_token`),
    so that the same decode step (:mod:`ess.decode`) runs over it: every selected entry is a hit, nothing is copied.

    The pool is allocated once for ``max_requests`` requests of up to ``max_tokens`` tokens each: request block
    ``b`` holds layer ``l``'s entries in slots ``[(b * n_layers + l) * max_tokens, ... + max_tokens)``, token ``t``
    at offset ``t``. ``device`` ``"cpu"`` or ``"cuda[:n]"``: where the pool lives (a torch tensor on either)."""

    def __init__(self, model, *, max_requests: int, max_tokens: int, device: str = "cpu"):
        self.format = entry_format(model_spec(model) if isinstance(model, str) else model)
        self.n_layers, self.entry_bytes = self.format.n_layers, self.format.entry_bytes
        self.dtype = self.format.dtype
        self.max_requests = validate.positive_int("max_requests", max_requests)
        self.max_tokens = check_context_len(self.format, max_tokens, "max_tokens")
        import torch
        self.device = str(device)
        self.on_cuda = self.device.startswith("cuda")
        shape = (self.max_requests * self.n_layers * self.max_tokens, self.entry_bytes)
        self._device = torch.zeros(shape, dtype=torch.uint8, device=self.device)
        self._layer_base = torch.arange(self.n_layers, device=self.device) * self.max_tokens   # (n_layers,)
        self._requests: dict = {}                      # request_id -> [block, n_tokens, steps]
        self.metrics = MetricsLog()

    @property
    def device_pool(self):
        """The pool ``(slots, entry_bytes)`` uint8, a torch tensor on the cache's device."""
        return self._device

    def _req(self, request_id) -> list:
        try:
            return self._requests[request_id]
        except (KeyError, TypeError):
            raise ValueError(f"unknown request_id {request_id!r}") from None

    def _base(self, block: int, layer: int) -> int:
        return (block * self.n_layers + layer) * self.max_tokens

    def requests(self) -> list:
        return list(self._requests)

    def n_tokens(self, request_id) -> int:
        return self._req(request_id)[1]

    def add_request(self, request_id, entries) -> None:
        """Register a request with its prefill entries ``(n_layers, L, entry_bytes)`` uint8 (NumPy or torch)."""
        if request_id in self._requests:
            raise ValueError(f"request_id {request_id!r} already exists")
        if len(self._requests) == self.max_requests:
            raise ValueError(f"the pool is sized for max_requests={self.max_requests} requests and all are in use")
        shape = tuple(entries.shape)
        if len(shape) != 3 or shape[0] != self.n_layers or shape[2] != self.entry_bytes:
            raise ValueError(f"entries must have shape (n_layers={self.n_layers}, L, {self.entry_bytes}), got {shape}")
        if not 1 <= shape[1] <= self.max_tokens:
            raise ValueError(f"entries hold {shape[1]} tokens; the pool holds 1 .. max_tokens={self.max_tokens}")
        block = min(set(range(self.max_requests)) - {r[0] for r in self._requests.values()})
        for layer in range(self.n_layers):
            b = self._base(block, layer)
            self._device[b:b + shape[1]] = self._as_pool(entries[layer])
        self._requests[request_id] = [block, shape[1], np.zeros(self.n_layers, np.int64)]

    def _as_pool(self, rows):
        import torch
        return torch.as_tensor(rows).to(self._device.device)

    def append_token(self, request_id, entries) -> int:
        """The new token's entries ``(n_layers, entry_bytes)`` written into the pool; returns its index."""
        req = self._req(request_id)
        if tuple(entries.shape) != (self.n_layers, self.entry_bytes):
            raise ValueError(f"entries must have shape ({self.n_layers}, {self.entry_bytes}), got "
                             f"{tuple(entries.shape)}")
        tok = req[1]
        if tok >= self.max_tokens:
            raise ValueError(f"request {request_id!r} is full: max_tokens={self.max_tokens}")
        self._device[self._base(req[0], 0) + tok + self._layer_base] = self._as_pool(entries)   # every layer at once
        req[1] = tok + 1
        self.metrics.add(StepMetrics("append", request_id, -1, int(req[2].max()), 0, 0, 0,
                                     self.n_layers * self.entry_bytes))
        return tok

    def plan(self, request_id, layer: int, indices: np.ndarray, *, scores: np.ndarray | None = None) -> StepPlan:
        """Every valid index a hit at its own slot (checked as the tiered cache checks them)."""
        block, n_tok, _ = self._req(request_id)
        layer = validate.integer("layer", layer, lo=0, below=self.n_layers)
        idx = check_step_indices(indices, n_tok, self.max_tokens)
        valid = np.flatnonzero(idx >= 0)
        slots = np.where(idx >= 0, self._base(block, layer) + idx, -1)
        tokens = idx[valid]
        sp = SlotPlan(tokens, slots[valid], np.zeros(tokens.size, bool), np.empty(0, np.int64), 0)
        return StepPlan(request_id, layer, idx, slots, idx >= 0, valid, np.empty(0, np.int64), None, sp)

    def copy(self, plan: StepPlan) -> None:
        """Nothing to copy: every entry is resident."""

    def device_rows(self, slots: np.ndarray) -> np.ndarray:
        """The rows in ``slots`` copied to a host NumPy array (zero for ``-1``), as :meth:`TieredCache.device_rows`."""
        return _rows_to_host(self._device, np.asarray(slots, np.int64))

    def commit(self, plan: StepPlan) -> PoolStep:
        req = self._req(plan.request_id)
        req[2][plan.layer] += 1
        step = int(req[2][plan.layer])
        res = PoolStep(plan.request_id, plan.layer, step, plan.indices, plan.slots, plan.hit, plan.hit_pos,
                       plan.miss_pos, np.empty(0, np.int64), 0)
        self.metrics.add(StepMetrics("step", plan.request_id, plan.layer, step, res.n_hits, 0, 0, 0))
        return res


def _rows_to_host(pool, slots: np.ndarray) -> np.ndarray:
    """Rows ``pool[slots]`` of a device pool (a torch tensor) copied to a NumPy array, zero where a slot is -1."""
    import torch
    out = torch.zeros((slots.size, pool.shape[1]), dtype=torch.uint8, device=pool.device)
    ok = np.flatnonzero(slots >= 0)
    if ok.size:
        out[torch.from_numpy(ok).to(pool.device)] = pool.index_select(0, torch.from_numpy(slots[ok]).to(pool.device))
    return out.cpu().numpy()
