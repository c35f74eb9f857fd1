"""Tiered latent-cache storage: the GPU pool and the host pool, holding and moving real bytes.

ESS keeps the whole latent cache in (pinned) host memory and a bounded hot subset on the GPU ([ARX]). Here:

* :class:`HostPool` every latent entry of every request and layer, ``(n_layers, tokens, entry_bytes)`` uint8 per
  request (656-byte FP8 or 1,152-byte BF16 layout, :mod:`ess.layout`; or any :class:`~ess.layout.EntryFormat`, such
  as the real model's 1,536-byte K/V entries of :mod:`ess.engine`), grown one token per decode step
  (write-back of the new token only); pinned when the device is CUDA.
* the device pool: ``capacity`` slots per (request, layer), one uint8 torch tensor ``(slots, entry_bytes)`` on the
  cache's device (``"cpu"`` or ``"cuda[:n]"``: the same code on both). Slot numbers are global: request block ``b``
  holds layer ``l``'s pool in slots ``[(b * n_layers + l) * capacity, ... + capacity)``.
* :class:`TieredCache` the two pools, the requests' lifecycle (add, append, remove) and the step protocol below.

What is not here: replaying a trace through a cache (:mod:`ess.replay`), the disk tier's archive of a cache's
requests -- checkpoint, spill, restore, crash recovery (:mod:`ess.archive` over :mod:`ess.disk`; the device-pool
state it saves and loads back, :mod:`ess.archive_state`) -- and the rules
that size the device pool from a ratio or a byte budget (:func:`ess.layout.capacity_from_ratio`,
:func:`ess.layout.capacity_from_budget`, beside the one pool rule :func:`ess.layout.pool_slots`): the cache takes a
``capacity``.

One step of one (request, layer) with the valid top-K indices S (array order, ``-1`` padding ignored) is three
calls, so that a caller can overlap them with attention (:mod:`ess.decode`):

1. :meth:`TieredCache.plan` -- hits are S ∩ pool; misses S \\ pool get free slots first, then the slots of victims
   chosen by the eviction policy among resident entries **not** in S (:mod:`ess.policies`). Nothing changes; bad
   input (indices out of range or repeated, more valid indices than ``capacity``, wrong dtype or shape) raises here.
2. :meth:`TieredCache.copy` -- the missed rows are copied host -> device into their slots by a transfer kernel
   (:mod:`ess.kernels.transfer`). A copy that fails part-way frees the slots it was writing (their old entries are
   dropped, never left half-written) and raises :class:`~ess.kernels.transfer.TransferError`.
3. :meth:`TieredCache.commit` -- only now does the token map change; the policy sees the step, the metrics log it.
   A plan whose misses :meth:`~TieredCache.copy` did not move is refused (its slots would be marked present
   without their rows).

:meth:`TieredCache.step` runs the three in order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import validate
import weakref
from collections.abc import Mapping

from .kernels import check_device, is_tensor, resolve_backend
from .kernels.transfer import TransferError, copy_rows_unchecked
from .layout import KV_DTYPES, EntryFormat, check_context_len, entry_format
from .metrics import MetricsLog, StepMetrics
from .policies import ONLINE_POLICIES, SlotPlan, SlotPool, check_step_indices, make_policy
from .specs import ModelSpec, model_spec

__all__ = ["StepPlan", "PoolStep", "HostPool", "TieredCache", "ResidentCache", "TransferError"]


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
    cache: object = field(default=None, repr=False, compare=False)     # the cache that made it (None: not checked)


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

    ``pinned=True`` allocates page-locked memory through torch (needed for zero-copy CUDA reads). Request ids are
    ``int`` or ``str`` (:func:`ess.validate.request_id`); an unknown one is a ``ValueError``."""

    def __init__(self, n_layers: int, entry_bytes: int, *, pinned: bool = False):
        self.n_layers = validate.positive_int("n_layers", n_layers)
        self.entry_bytes = validate.positive_int("entry_bytes", entry_bytes)
        self.pinned = validate.boolean("pinned", pinned)
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

    def _alloc_checked(self, cap: int, name: str):
        try:
            return self._alloc(cap)
        except (MemoryError, ValueError, RuntimeError) as exc:   # too large to allocate (NumPy, torch)
            raise ValueError(f"{name}: a host array of {self.n_layers} layers x {cap:,} tokens x {self.entry_bytes} B "
                             f"cannot be allocated ({type(exc).__name__})") from None

    def _key(self, request_id):
        """A held request's id (``ValueError`` when it is not held, ``TypeError`` for an id of another type)."""
        request_id = validate.request_id("request_id", request_id)
        if request_id not in self._arrays:
            raise ValueError(f"unknown request_id {request_id!r} (the host pool holds {len(self._arrays)} request(s))")
        return request_id

    def __contains__(self, request_id) -> bool:
        return isinstance(request_id, (int, str, np.integer)) and request_id in self._arrays

    def requests(self) -> list:
        return list(self._arrays)

    def n_tokens(self, request_id) -> int:
        return self._n_tokens[self._key(request_id)]

    def _check_new(self, request_id, entries, capacity) -> tuple:
        """A new request's ``(request_id, entries, n_tokens)``, checked: an id not held yet, entries ``(n_layers, n,
        entry_bytes)`` uint8, a ``capacity`` of at least ``n`` tokens."""
        request_id = validate.request_id("request_id", request_id)
        if request_id in self._arrays:
            raise ValueError(f"request_id {request_id!r} is already in the host pool")
        entries = validate.entries("entries", entries, (self.n_layers, None, self.entry_bytes), ndim=3,
                                   shape_doc=f"(n_layers={self.n_layers}, n, {self.entry_bytes})")
        n = entries.shape[1]
        if capacity is not None:
            validate.integer("capacity", capacity, lo=n)
        return request_id, entries, n

    def add(self, request_id, entries: np.ndarray, capacity: int | None = None) -> None:
        """Hold a request's entries ``(n_layers, n, entry_bytes)`` uint8 with room for ``capacity`` tokens (default
        n)."""
        request_id, entries, n = self._check_new(request_id, entries, capacity)
        arr, t = self._alloc_checked(max(n, 1, capacity or 0), "capacity")
        arr[:, :n] = entries
        self._arrays[request_id], self._tensors[request_id], self._n_tokens[request_id] = arr, t, n

    def append(self, request_id, entries: np.ndarray) -> int:
        """Write one token's entries ``(n_layers, entry_bytes)`` uint8; returns its token index."""
        request_id = self._key(request_id)
        entries = validate.entries("entries", entries, (self.n_layers, self.entry_bytes), ndim=2)
        n = self._n_tokens[request_id]
        self._room(request_id, n)[:, n] = entries
        self._n_tokens[request_id] = n + 1
        return n

    def _room(self, request_id, used: int) -> np.ndarray:
        """The request's array with room for row ``used`` (its rows ``0 .. used-1`` valid): doubled, the valid rows
        kept, when it is full."""
        arr = self._arrays[request_id]
        if used == arr.shape[1]:
            new, t = self._alloc_checked(2 * arr.shape[1], f"request {request_id!r} growing")
            new[:, :used] = arr[:, :used]
            self._arrays[request_id], self._tensors[request_id] = new, t
            arr = new
        return arr

    def remove(self, request_id) -> None:
        request_id = self._key(request_id)
        for d in (self._arrays, self._tensors, self._n_tokens):
            d.pop(request_id, None)

    def entries(self, request_id) -> np.ndarray:
        """The valid entries ``(n_layers, n_tokens, entry_bytes)`` (a view: do not write)."""
        request_id = self._key(request_id)
        return self._arrays[request_id][:, :self._n_tokens[request_id]]

    def layer_rows(self, request_id, layer: int, *, as_torch: bool = False):
        """All rows of one layer ``(capacity_tokens, entry_bytes)``, contiguous: a transfer source."""
        request_id = self._key(request_id)
        layer = validate.integer("layer", layer, lo=0, below=self.n_layers)
        if validate.boolean("as_torch", as_torch) and self.pinned:
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
# The tiered cache
# ----------------------------------------------------------------------------------------------------------------

@dataclass
class _Pool:
    """One (request, layer) pool: its first global slot, its slot map with the eviction policy, and its decode-step
    count."""

    base: int
    slots: SlotPool
    steps: int = 0
    copied: object = None          # the plan whose misses copy() moved in (commit() needs it; None after a commit)

    def copy_state(self) -> dict:
        return {**self.slots.state(), "steps": self.steps}


@dataclass
class _Request:
    block: int
    pools: list = field(default_factory=list)


class TieredCache:
    """Cache entries in two tiers for one entry format (DeepSeek's latent entries, or any
    :class:`~ess.layout.EntryFormat`): host pool (all entries) and GPU pool (``capacity`` slots per request and
    layer). A disk tier is paired with it by :class:`ess.archive.Archive`. Request ids are ``int`` or ``str``
    (:func:`ess.validate.request_id`).

    Parameters
    ----------
    model : ModelSpec, preset name, or :class:`ess.layout.EntryFormat`
        What one entry is: a DeepSeek-style model's latent entry in ``dtype``, or any entry format (layers, bytes
        per entry, page), e.g. a real model's K/V entries (:func:`ess.engine.kv.kv_entry_format`).
    capacity : int
        GPU slots per (request, layer); from a sparse-memory ratio :func:`ess.layout.capacity_from_ratio`, from a
        byte budget :func:`ess.layout.capacity_from_budget` (with ``max_requests``).
    dtype : str
        ``"fp8"`` (656-byte entries) or ``"bf16"`` (1,152 B); for a ModelSpec only (an EntryFormat carries its own)
    policy : str
        ``"lru"`` (default, the paper's), ``"fifo"`` or ``"heat"`` (:data:`ess.policies.ONLINE_POLICIES`; Belady
        needs the future and runs in the simulations only)
    backend : str
        the transfer backend, ``"auto" | "reference" | "numba" | "torch"``
    device : str
        ``"cpu"`` or ``"cuda[:n]"``: where the device pool lives (a torch tensor on either; on CUDA the host pool is
        pinned and misses are read zero-copy)
    max_requests : int, optional
        when given, the device pool is allocated once for that many requests (a fixed budget) and
        :meth:`add_request` refuses more; otherwise it grows by whole requests.
    policy_options : dict, optional
        passed to the policy (``decay`` for heat)

    Examples
    --------
    >>> import numpy as np
    >>> c = TieredCache("tiny", capacity=4)                  # 4 layers, 164-byte FP8 entries
    >>> c.add_request("r", np.zeros((4, 10, c.entry_bytes), np.uint8))
    >>> r = c.step("r", 0, np.array([3, -1, 7], np.int64))
    >>> r.n_misses, r.bytes_h2d, r.slots.tolist()
    (2, 328, [0, -1, 1])
    """

    def __init__(self, model, *, capacity: int, dtype: str = "fp8", policy: str = "lru", backend: str = "auto",
                 device: str = "cpu", max_requests: int | None = None, policy_options: dict | None = None):
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
        self.device = check_device(device)
        if not isinstance(backend, str):
            raise TypeError(f"backend must be a str ('auto', 'reference', 'numba', 'torch'), got "
                            f"{type(backend).__name__}")
        self.backend = resolve_backend(backend, device=self.device)
        self.dtype, self.policy_name = dtype, policy
        if policy_options is not None and not isinstance(policy_options, Mapping):
            raise TypeError(f"policy_options must be a dict of the policy's options, got "
                            f"{type(policy_options).__name__}")
        self.policy_options = dict(policy_options or {})
        if not all(isinstance(k, str) for k in self.policy_options):
            raise TypeError(f"policy_options must name the options (str keys), got {list(self.policy_options)}")
        make_policy(policy, 1, **self.policy_options)           # check the options now
        self.entry_bytes = self.format.entry_bytes
        self.n_layers = self.format.n_layers
        self.on_cuda = self.device.startswith("cuda")
        self.host = HostPool(self.n_layers, self.entry_bytes, pinned=self.on_cuda)
        self.max_requests = None if max_requests is None else validate.positive_int("max_requests", max_requests)
        self._block_slots = self.n_layers * self.capacity
        try:
            self._device = self._alloc_device(self.max_requests or 1)
        except ValueError as exc:
            if self.max_requests is None:
                raise
            raise ValueError(f"max_requests={self.max_requests}: {exc}") from None
        self._free_blocks = list(range(self._n_blocks()))
        self._requests: dict = {}
        self.metrics = MetricsLog()
        self._archive = None                            # weak reference to the ess.archive.Archive open on it

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

    # -- the archive open on this cache (ess.archive) ----------------------------------------------------------
    @property
    def archive(self):
        """The :class:`ess.archive.Archive` open on this cache, or ``None``. While one is open, :meth:`add_request`
        refuses an id it holds (archived or spilled), so that a new request never replaces an archived one."""
        return None if self._archive is None else self._archive()

    def _attach_archive(self, archive) -> None:
        """Pair this cache with ``archive`` (``None``: unpair); called by :class:`ess.archive.Archive` only. The cache
        holds it weakly: an archive that is closed or collected guards nothing."""
        if archive is not None and self.archive is not None:
            raise ValueError(f"this cache already has an open archive in {self.archive.directory}; close it first")
        self._archive = None if archive is None else weakref.ref(archive)

    # -- requests --------------------------------------------------------------------------------------------
    def requests(self) -> list:
        return list(self._requests)

    def n_tokens(self, request_id) -> int:
        self._check_active(request_id)
        return self.host.n_tokens(request_id)

    def _check_active(self, request_id) -> _Request:
        request_id = validate.request_id("request_id", request_id)
        try:
            return self._requests[request_id]
        except KeyError:
            archive = self.archive
            if archive is not None and archive.is_spilled(request_id):
                raise ValueError(f"request_id {request_id!r} is spilled to disk; restore() it first") from None
            raise ValueError(f"unknown request_id {request_id!r}") from None

    def _check_layer(self, layer) -> int:
        return validate.integer("layer", layer, lo=0, below=self.n_layers)

    def _new_pools(self, block: int, n_tokens: int) -> list:
        return [_Pool((block * self.n_layers + l) * self.capacity,
                      SlotPool(self.capacity, self.policy_name, n_tokens, **self.policy_options))
                for l in range(self.n_layers)]

    def _check_new(self, request_id, latent_entries, reserve_tokens):
        """The checked id and entries of a request to add (nothing changes)."""
        request_id = validate.request_id("request_id", request_id)
        if request_id in self._requests:
            raise ValueError(f"request_id {request_id!r} already exists")
        latent_entries = validate.entries("latent_entries", latent_entries, (self.n_layers, None, self.entry_bytes),
                                          ndim=3, shape_doc=f"(n_layers={self.n_layers}, L, {self.entry_bytes})")
        n, most = latent_entries.shape[1], self.format.max_context
        if n > most:
            raise ValueError(f"latent_entries hold {n} tokens, more than the maximum context of {self.format.name} "
                             f"({most} tokens)")
        if reserve_tokens is not None:
            reserve = validate.integer("reserve_tokens", reserve_tokens, lo=n)
            if reserve > most:
                raise ValueError(f"reserve_tokens={reserve} exceeds the maximum context of {self.format.name} "
                                 f"({most} tokens)")
        if not self._free_blocks and self.max_requests is not None:
            self._take_block()                          # raises (nothing changes): every block is in use
        return request_id, latent_entries

    def _admit(self, request_id, latent_entries, reserve_tokens) -> _Request:
        """Host pool first, then a device block (given back if the host array cannot be allocated, and the other
        way round): a request is either added whole or not at all."""
        try:
            self.host.add(request_id, latent_entries, reserve_tokens)
        except ValueError as exc:                       # the host array cannot be allocated
            raise ValueError(f"reserve_tokens={reserve_tokens}: {exc}" if reserve_tokens is not None else str(exc)) \
                from None
        try:
            block = self._take_block()
        except BaseException:
            self.host.remove(request_id)
            raise
        req = self._requests[request_id] = _Request(block, self._new_pools(block, latent_entries.shape[1]))
        return req

    def add_request(self, request_id, latent_entries: np.ndarray, *, reserve_tokens: int | None = None) -> None:
        """Register a request with its prefill entries ``(n_layers, L, entry_bytes)`` uint8 (host pool only; the
        device pool starts empty: use :meth:`warmup` to seed it). ``reserve_tokens``: host room for that many
        tokens in all, so that decoding appends without growing the host array. While an archive is open on the
        cache (:attr:`archive`), an id it holds is refused: restore that request, or discard its archived copy."""
        request_id, latent_entries = self._check_new(request_id, latent_entries, reserve_tokens)
        archive = self.archive
        if archive is not None:
            archive.check_new(request_id)
        self._admit(request_id, latent_entries, reserve_tokens)

    def append_token(self, request_id, entries: np.ndarray) -> int:
        """Write back one new token's entries ``(n_layers, entry_bytes)`` to the host pool (only that token's
        bytes move device -> host); returns the new token's index. The new token is not put in the GPU pool."""
        req = self._check_active(request_id)
        entries = validate.entries("entries", entries, (self.n_layers, self.entry_bytes), ndim=2)
        n = self.host.n_tokens(request_id)
        if n >= self.format.max_context:
            raise ValueError(f"request {request_id!r} holds {n} tokens, the maximum context of {self.format.name}: "
                             f"no room for another token")
        tok = self.host.append(request_id, entries)
        for p in req.pools:
            p.slots.grow(tok + 1)
        step = max(p.steps for p in req.pools)
        self.metrics.add(StepMetrics("append", request_id, -1, step, 0, 0, 0, self.n_layers * self.entry_bytes))
        return tok

    def remove_request(self, request_id) -> None:
        """Forget a request in host and device memory (its archived copy, if any, stays)."""
        req = self._check_active(request_id)
        request_id = validate.request_id("request_id", request_id)
        self.host.remove(request_id)
        self._free_blocks.append(req.block)
        self._free_blocks.sort()
        del self._requests[request_id]

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
        sp = pool.slots.plan_unchecked(idx[valid_pos])
        slots = np.full(idx.shape, -1, np.int64)
        slots[valid_pos] = pool.base + sp.slots
        hit = np.zeros(idx.shape, bool)
        hit[valid_pos[~sp.miss]] = True
        return StepPlan(request_id, layer, idx, slots, hit, valid_pos[~sp.miss], valid_pos[sp.miss],
                        None if scores is None else scores[valid_pos], sp, self)

    def plan(self, request_id, layer: int, indices: np.ndarray, *, scores: np.ndarray | None = None) -> StepPlan:
        """The plan for making the top-K entries ``indices`` (K,) int64 (-1 = padding) of one (request, layer)
        resident: hits resolved to their slots, victims chosen by the policy, the misses' slots reserved. Changes
        nothing; raises ``ValueError``/``TypeError`` on bad input (so a caller can plan a whole batch before the
        first row moves). ``scores`` (K,) float, the indexer scores of the selected tokens, are the heat policy's
        weights."""
        self._check_active(request_id)
        request_id = validate.request_id("request_id", request_id)
        layer = self._check_layer(layer)
        idx = check_step_indices(indices, self.host.n_tokens(request_id), self.capacity)
        return self._plan(request_id, layer, idx, self._check_scores(scores, idx))

    def _current_pool(self, plan: StepPlan) -> _Pool:
        if not isinstance(plan, StepPlan):
            raise TypeError(f"plan must be a StepPlan from TieredCache.plan, got {type(plan).__name__}")
        if plan.cache is not self:
            raise ValueError("plan must come from this cache's plan() (it was made by another cache)")
        req = self._check_active(plan.request_id)
        pool = req.pools[self._check_layer(plan.layer)]
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
        pool.copied = plan

    def _commit(self, plan: StepPlan, kind: str) -> PoolStep:
        pool = self._current_pool(plan)
        if plan.n_misses and pool.copied is not plan:
            raise ValueError(f"the plan for request {plan.request_id!r} layer {plan.layer} has {plan.n_misses} "
                             f"misses that were not copied: call copy(plan) before commit(plan)")
        pool.copied = None
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
        step is counted and logged. Returns the :class:`PoolStep`. A plan with misses that :meth:`copy` did not
        move is a ``ValueError`` (nothing changes): its slots would be marked present without their rows."""
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
        return {"device": dev, "free_blocks": list(self._free_blocks),
                "host": {r: self.host.entries(r).copy() for r in self.host.requests()},
                "pools": {r: [p.copy_state() for p in q.pools] for r, q in self._requests.items()},
                "n_metrics": len(self.metrics)}


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
        self.device = check_device(device)
        self.on_cuda = self.device.startswith("cuda")
        shape = (self.max_requests * self.n_layers * self.max_tokens, self.entry_bytes)
        try:
            self._device = torch.zeros(shape, dtype=torch.uint8, device=self.device)
        except (MemoryError, ValueError, RuntimeError, TypeError) as exc:   # too large (a size past int64 too)
            raise ValueError(f"a pool of max_requests={self.max_requests} x {self.n_layers} layers x max_tokens="
                             f"{self.max_tokens} x {self.entry_bytes} B = {shape[0] * shape[1]:,} B cannot be "
                             f"allocated on {self.device} ({type(exc).__name__})") from None
        self._layer_base = torch.arange(self.n_layers, device=self.device) * self.max_tokens   # (n_layers,)
        self._requests: dict = {}                      # request_id -> [block, n_tokens, steps]
        self.metrics = MetricsLog()

    @property
    def device_pool(self):
        """The pool ``(slots, entry_bytes)`` uint8, a torch tensor on the cache's device."""
        return self._device

    def _req(self, request_id) -> list:
        request_id = validate.request_id("request_id", request_id)
        try:
            return self._requests[request_id]
        except KeyError:
            raise ValueError(f"unknown request_id {request_id!r}") from None

    def _entries(self, name: str, entries, tail: tuple, doc: str):
        """``entries`` checked as the tiered cache checks them (uint8 bytes of the trailing shape ``tail``; a float
        array is a ``TypeError``, never cast), a torch tensor (on any device) or anything NumPy takes."""
        if is_tensor(entries):
            import torch
            if entries.dtype != torch.uint8:
                raise TypeError(f"{name} must be uint8 cache entries {doc}, got dtype {entries.dtype}")
            if entries.ndim != len(tail) or any(t is not None and s != t for s, t in zip(entries.shape, tail)):
                raise ValueError(f"{name} must have shape {doc}, got {tuple(entries.shape)}")
            return entries
        return validate.entries(name, entries, tail, ndim=len(tail), shape_doc=doc)

    def _base(self, block: int, layer: int) -> int:
        return (block * self.n_layers + layer) * self.max_tokens

    def requests(self) -> list:
        return list(self._requests)

    def n_tokens(self, request_id) -> int:
        return self._req(request_id)[1]

    def add_request(self, request_id, entries) -> None:
        """Register a request with its prefill entries ``(n_layers, L, entry_bytes)`` uint8 (NumPy or torch)."""
        request_id = validate.request_id("request_id", request_id)
        if request_id in self._requests:
            raise ValueError(f"request_id {request_id!r} already exists")
        entries = self._entries("entries", entries, (self.n_layers, None, self.entry_bytes),
                                f"(n_layers={self.n_layers}, L, {self.entry_bytes})")
        if len(self._requests) == self.max_requests:
            raise ValueError(f"the pool is sized for max_requests={self.max_requests} requests and all are in use")
        shape = tuple(entries.shape)
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
        entries = self._entries("entries", entries, (self.n_layers, self.entry_bytes),
                                f"({self.n_layers}, {self.entry_bytes})")
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
