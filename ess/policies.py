"""Eviction policies of the GPU pool: one readable reference per policy -- LRU, FIFO, heat and Belady -- and the slot
bookkeeping of one pool (:class:`SlotPool`), shared by the storage (:class:`ess.storage.TieredCache`), the plain
miss count (:func:`simulate_misses`) and the prefetch simulator (:mod:`ess.prefetch`). The Numba kernels of
:mod:`ess.cachesim` are the fast path of :func:`simulate_misses`, tested against it miss for miss.

A pool of ``capacity`` slots belongs to one (request, layer). One decode step selects a set S of tokens (the valid
top-K indices, in array order); hits are S ∩ pool, misses S \\ pool. The misses go to free slots first, then to
victims chosen by the policy among the resident entries **not in S** (an entry selected this step is never
evicted by the same step). A policy sees slots only; the pool keeps the token map.

Ranking (lowest evicted first; ties by LRU order, which is unique among resident entries):

* ``"lru"``: last use. After a step the entries of S are the most recent, ordered by their position in the indices
  array (a later position is more recent), hits and misses alike. This is the paper's policy ([ARX] "managed by
  LRU per layer"); the order inside one step is ours (the paper does not say).
* ``"fifo"``: insertion time; a hit does not refresh it.
* ``"heat"``: a decayed access weight since the entry was loaded. After each step every resident entry's heat is
  multiplied by ``decay`` (in [0, 1]; :data:`DEFAULT_HEAT_DECAY`), then each entry of S adds its weight for this
  step: the indexer score of the selected token when the caller passes ``weights`` (aligned with S), else 1 (a
  decayed access count). An evicted entry's heat is forgotten. ``decay = 0`` keeps the last step's weight only,
  ``decay = 1`` sums all weights since the load.
* ``"clock"``: CLOCK, the second-chance approximation of LRU (Corbató 1968, "A paging experiment with the Multics
  system", MIT Project MAC report MAC-M-384, published in *In Honor of Philip M. Morse*, MIT Press 1969; the form
  taught in Arpaci-Dusseau, *Operating Systems: Three Easy Pieces*, ch. 22 "Beyond Physical Memory: Policies",
  section "Approximating LRU"). The slots form a ring with a hand (at slot 0 in a new pool) and one reference bit
  each. Every entry a step selects, hit or loaded, gets its bit set (the hardware sets the use bit on every
  reference, the one that faulted included). A miss that needs a victim moves the hand round the ring: a slot
  whose bit is set loses it (its second chance) and is passed, a slot selected by this step is passed, and the
  first unselected slot with a clear bit is the victim; the hand stops just past it, so the new entry in that slot
  is the last the hand reaches again. Free slots are filled first, lowest first, without moving the hand (the
  pool's rule for every policy). The reference bit is step-granular: what the step selects counts as one use.
* ``"sampled_clock"``: the replacement of SGLang's HiSparse multi-step (MTP) swap kernel, the "CLOCK" production
  sparse-KV offload uses when one call covers several speculative steps (``sgl-project/sglang``,
  ``python/sglang/kernels/jit/csrc/kvcacheio/hisparse_spec.cuh``, ``load_cache_to_device_buffer_spec_commit_kernel``,
  read at commit 98807b55; added by sgl-project/sglang PR 32162). Not CLOCK with a persistent bit: each slot keeps
  the step (call epoch ``e``) at which it was last selected or filled, and its "bit" is set only during that step.
  A step's ``M`` victims are chosen in miss order ``i = 0 .. M-1``: miss ``i`` owns the ring stripe
  ``(cursor + i + j M) mod capacity`` for ``j = 0 .. P_i - 1``, ``P_i = (capacity - 1 - i) // M + 1``, looks at
  ``n = min(P_i, 6)`` evenly spaced stripe positions ``j = s P_i // n`` (``CLOCK_VICTIM_SAMPLES = 6``), skips those
  selected by this step or already claimed, and takes the one selected longest ago (ties: the first looked at).
  Misses whose samples are all taken probe ``(cursor + i K + a K) mod capacity`` (``K = 2654435761``, uint32
  arithmetic, ``a = 0, 1, ...``) for a free-to-claim slot; the kernel handles its misses 512 at a time (the commit
  kernel's 512 threads per request), sampling for all of a block before the block's probes. Afterwards
  ``cursor += M`` (mod capacity). Where ess differs: free slots are filled first (the pool's rule) and ``M``
  counts the misses that need a victim, which is HiSparse's miss count once the pool is full (steady decoding);
  a probe that finds no slot in ``capacity`` tries (possible only when the capacity is not a power of two; HiSparse's
  buffer is 2 x top-k = 4,096 slots) takes the first claimable slot from the cursor on; step ages are exact
  (HiSparse's epochs wrap after 2**17 - 1 calls or more, far beyond a trace here); HiSparse's overflow rule (a
  call whose union exceeds the buffer) never applies, because a step larger than the pool is an error here.
* ``"belady"``: the entry whose next use lies farthest in the future goes first (Belady 1966, "A study of
  replacement algorithms for a virtual-storage computer", IBM Syst. J. 5(2)); entries never used again first.
  It needs the future, so it runs offline only, over a whole sequence (:func:`simulate_misses`,
  :mod:`ess.cachesim`); with no warmup it is the bound no online policy beats. The storage runs the online
  policies, :data:`ONLINE_POLICIES`.

**LRU-Warmup** ([ARX]): before decoding, the top-K sets of the last W prefill positions are fed to the pool in order,
each like one step (weight 1), so that the first decode steps find the hot entries resident.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .validate import fraction, int_array, integer, non_negative_int, one_of, positive_int

__all__ = ["POLICIES", "ONLINE_POLICIES", "DEFAULT_HEAT_DECAY", "SAMPLED_CLOCK_SAMPLES", "SAMPLED_CLOCK_BLOCK",
           "SAMPLED_CLOCK_PROBE", "EvictionPolicy", "LRUPolicy", "FIFOPolicy", "HeatPolicy", "ClockPolicy",
           "SampledClockPolicy", "BeladyPolicy", "make_policy", "SlotPlan", "SlotPool", "check_step_indices",
           "simulate_misses", "next_uses", "first_in_order"]

POLICIES = ("lru", "fifo", "heat", "clock", "sampled_clock", "belady")
ONLINE_POLICIES = ("lru", "fifo", "heat", "clock", "sampled_clock")   # Belady needs the future: offline only
DEFAULT_HEAT_DECAY = 0.5   # design choice: a step's access weighs half the one after it (heat halves every step)
POLICY_OPTIONS = {"lru": (), "fifo": (), "heat": ("decay",), "clock": (), "sampled_clock": (),
                  "belady": ()}                                       # what make_policy passes on
# SGLang HiSparse, python/sglang/kernels/jit/csrc/kvcacheio/hisparse_spec.cuh (commit 98807b55):
SAMPLED_CLOCK_SAMPLES = 6             # CLOCK_VICTIM_SAMPLES: stripe positions each miss looks at
SAMPLED_CLOCK_BLOCK = 512             # the commit kernel's threads per request (its launch): misses per round
SAMPLED_CLOCK_PROBE = 2654435761      # the fallback probe's multiplier (uint32; Knuth's multiplicative hash)


def _array(name: str, value, kinds: str, what: str) -> np.ndarray:
    """``value`` as a NumPy array whose dtype kind is one of ``kinds`` (a ``TypeError`` naming ``name`` otherwise)."""
    try:
        arr = value if isinstance(value, np.ndarray) else np.asarray(value)
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.dtype.kind not in kinds or isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}"
                        f"{' of dtype ' + str(arr.dtype) if arr is not None else ''}")
    return arr


def _full(name: str, n: int, fill, dtype) -> np.ndarray:
    """``np.full(n, fill, dtype)``, a ``ValueError`` naming ``name`` when it is too large to allocate."""
    try:
        return np.full(n, fill, dtype)
    except (MemoryError, ValueError):
        raise ValueError(f"{name}={n:,} is too large to allocate") from None


def first_in_order(keys: tuple, n: int) -> np.ndarray:
    """``np.lexsort(keys)[:n]`` (the last key most significant, ties by the keys before it, then by position)
    without sorting everything: the first ``n`` all have a most significant key at most its ``n``-th smallest
    value, so only those are sorted (every tie at that value included, so their order is the full sort's).
    ``keys``: a non-empty tuple of 1-D arrays of numbers of one length; ``n``: an integer >= 0."""
    if not isinstance(keys, tuple) or not keys:
        raise TypeError(f"keys must be a non-empty tuple of 1-D arrays, got {type(keys).__name__}")
    keys = tuple(_array(f"keys[{i}]", k, "iuf", "a 1-D array of numbers") for i, k in enumerate(keys))
    if any(k.ndim != 1 or k.shape != keys[0].shape for k in keys):
        raise ValueError(f"keys must be 1-D arrays of one length, got shapes {[k.shape for k in keys]}")
    top = keys[-1]
    n = min(non_negative_int("n", n), top.size)
    if 0 < n < top.size // 2:
        kth = np.partition(top, n - 1)[n - 1]
        if kth == kth:                                          # not NaN (NaN sorts last; then sort everything)
            near = np.flatnonzero(top <= kth)
            return near[np.lexsort(tuple(np.asarray(k)[near] for k in keys))[:n]]
    return np.lexsort(keys)[:n]


# ----------------------------------------------------------------------------------------------------------------
# The policies (state per slot)
# ----------------------------------------------------------------------------------------------------------------

class EvictionPolicy:
    """Per-pool eviction state over ``capacity`` slots. Subclasses define :meth:`_keys` and may extend
    :meth:`update`; their per-slot arrays (``_slot_arrays``) and counters (``_counters``) are cleared, saved and
    restored here. :meth:`choose_victims` never changes the state; :meth:`update` records a step once its transfers
    succeeded."""

    name = "base"
    _slot_arrays: tuple[str, ...] = ("stamp",)        # per-slot state, zero for a free slot
    _counters: tuple[str, ...] = ("clock",)           # scalar state

    def __init__(self, capacity: int):
        self.capacity = positive_int("capacity", capacity)
        self.clock = 0                                       # counts entry touches, for recency order
        self.stamp = _full("capacity", self.capacity, 0, np.int64)   # last use (LRU order, also the tie-breaker)

    def _keys(self) -> tuple[np.ndarray, ...]:
        """Sort keys per slot, most significant last (``np.lexsort`` order); lowest is evicted first."""
        raise NotImplementedError

    # The public methods check their arguments and call the private ones, which :class:`SlotPool` calls directly
    # with arguments it built itself.
    def _check_slots(self, name: str, slots, *, increasing: bool = False) -> np.ndarray:
        """Distinct slots of this pool, a 1-D integer array (in increasing order when ``increasing``)."""
        slots = int_array(name, slots, ndim=1, lo=0, below=self.capacity, shape_doc="(n,) slots")
        if increasing:
            if (np.diff(slots) <= 0).any():
                raise ValueError(f"{name} must be distinct slots in increasing order (as np.flatnonzero gives them)")
        elif np.unique(slots).size != slots.size:
            raise ValueError(f"{name} must be distinct slots")
        return slots

    def choose_victims(self, candidates: np.ndarray, n: int) -> np.ndarray:
        """The ``n`` slots among ``candidates`` (resident, not selected this step; distinct, in increasing order) to
        evict, first victim first."""
        candidates = self._check_slots("candidates", candidates, increasing=True)
        return self._choose_victims(candidates, non_negative_int("n", n))

    def _choose_victims(self, candidates: np.ndarray, n: int) -> np.ndarray:
        if n == 0:
            return np.empty(0, np.int64)
        if n > candidates.size:
            raise ValueError(f"{n} victims needed but only {candidates.size} evictable slots (n={n} > the "
                             f"{candidates.size} candidates)")
        keys = tuple(k[candidates] for k in self._keys())
        return candidates[first_in_order((candidates,) + keys, n)].astype(np.int64)

    def touch(self, slots: np.ndarray) -> None:
        """Make ``slots`` the most recent, in array order (a later position is more recent)."""
        self._touch(self._check_slots("slots", slots))

    def _touch(self, slots: np.ndarray) -> None:
        self.stamp[slots] = self.clock + 1 + np.arange(slots.size)
        self.clock += int(slots.size)

    def touch_cold(self, slots: np.ndarray) -> None:
        """Make ``slots`` the least recent, below every other entry, the first of them the warmest (a background
        load that should go first)."""
        self._touch_cold(self._check_slots("slots", slots))

    def _touch_cold(self, slots: np.ndarray) -> None:
        low = min(int(self.stamp.min(initial=0)), 0)
        self.stamp[slots] = low - 1 - np.arange(slots.size)

    def update(self, slots: np.ndarray, inserted: np.ndarray, weights: np.ndarray | None) -> None:
        """After a step: ``slots`` of S in indices order, ``inserted`` (bool, aligned) marks the ones loaded by this
        step, ``weights`` (finite numbers, aligned with ``slots``) what the policy weighs them by (``None``: 1
        each)."""
        slots = self._check_slots("slots", slots)
        inserted = _array("inserted", inserted, "b", "a bool array aligned with slots")
        if inserted.shape != slots.shape:
            raise ValueError(f"inserted must have the shape of slots {slots.shape}, got {inserted.shape}")
        self._update(slots, inserted, _check_weights(weights, slots.shape, self))

    def _update(self, slots: np.ndarray, inserted: np.ndarray, weights: np.ndarray | None) -> None:
        self._touch(slots)

    def clear(self, slots: np.ndarray) -> None:
        """Forget the entries of ``slots`` (evicted or freed)."""
        self._clear(int_array("slots", slots, ndim=1, lo=0, below=self.capacity, shape_doc="(n,) slots"))

    def _clear(self, slots: np.ndarray) -> None:
        for name in self._slot_arrays:
            getattr(self, name)[slots] = 0

    def _evict(self, victims: np.ndarray) -> None:
        """The policy's part of a step's evictions (:meth:`SlotPool.commit`, before :meth:`update`): ``victims`` the
        slots whose entries the misses replace, first victim first, as :meth:`choose_victims` (or a caller's
        ranking) gave them. Forgets their state; a policy with a hand also moves it."""
        self._clear(victims)

    def state(self) -> dict:
        return {**{n: getattr(self, n) for n in self._counters}, **{n: getattr(self, n).copy() for n in
                                                                     self._slot_arrays}}

    def set_state(self, state: dict) -> None:
        """Take back what :meth:`state` gave: the counters (integers) and the per-slot arrays ``(capacity,)``;
        everything is checked before anything changes."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict (EvictionPolicy.state), got {type(state).__name__}")
        want = set(self._counters) | set(self._slot_arrays)
        if set(state) != want:
            raise ValueError(f"state of a {self.name} policy must hold {sorted(want)}, got {sorted(map(str, state))}")
        counters = {n: integer(f"state[{n!r}]", state[n]) for n in self._counters}
        arrays = {}
        for n in self._slot_arrays:
            ref = getattr(self, n)
            arr = _array(f"state[{n!r}]", state[n], "iu" if ref.dtype.kind in "iu" else "iuf", f"a {ref.dtype} array")
            if arr.shape != ref.shape or not np.isfinite(arr).all():
                raise ValueError(f"state[{n!r}] must be finite with shape {ref.shape}, got {arr.shape}")
            arrays[n] = arr
        self._check_state(counters, arrays)
        for n, v in counters.items():
            setattr(self, n, v)
        for n, arr in arrays.items():
            getattr(self, n)[:] = arr

    def _check_state(self, counters: dict, arrays: dict) -> None:
        """Refuse (``ValueError``) a state this policy cannot be in, beyond types and shapes (checked already)."""


class LRUPolicy(EvictionPolicy):
    name = "lru"

    def _keys(self):
        return (self.stamp,)


class FIFOPolicy(EvictionPolicy):
    name = "fifo"
    _slot_arrays = ("stamp", "inserted_at")
    _counters = ("clock", "n_inserted")

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.inserted_at = np.zeros(self.capacity, np.int64)
        self.n_inserted = 0

    def _keys(self):
        return (self.stamp, self.inserted_at)          # insertion decides; LRU order breaks (impossible) ties

    def _update(self, slots, inserted, weights):
        new = slots[inserted]
        self.inserted_at[new] = self.n_inserted + 1 + np.arange(new.size)
        self.n_inserted += int(new.size)
        self._touch(slots)


class HeatPolicy(EvictionPolicy):
    name = "heat"
    _slot_arrays = ("stamp", "heat")

    def __init__(self, capacity: int, decay: float = DEFAULT_HEAT_DECAY):
        super().__init__(capacity)
        self.decay = fraction("decay", decay)
        self.heat = np.zeros(self.capacity, np.float64)

    def _keys(self):
        return (self.stamp, self.heat)                 # heat decides, LRU order breaks ties

    def _update(self, slots, inserted, weights):
        self.heat *= self.decay
        self.heat[slots] += np.ones(slots.size) if weights is None else np.asarray(weights, np.float64)
        self._touch(slots)


class ClockPolicy(EvictionPolicy):
    """CLOCK (second chance): a hand over the ring of slots and a reference bit per slot (module docstring).
    ``ref`` (capacity,) the bits (0 or 1), ``hand`` the slot the hand points at. :meth:`touch` sets the bits of its
    slots (a use), :meth:`touch_cold` clears them (the hand takes them at its next pass)."""

    name = "clock"
    _slot_arrays = ("stamp", "ref")
    _counters = ("clock", "hand")

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.ref = np.zeros(self.capacity, np.int64)       # the reference bit of each slot
        self.hand = 0

    def _sweep(self, evictable: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, int]:
        """The hand's way round the ring until it evicted ``n`` slots of ``evictable`` (bool (capacity,), at least
        ``n`` set): from the hand, a slot whose bit is set loses it and is passed, an evictable slot with a clear
        bit is evicted, any other slot is passed; the hand stops just past the last victim. Returns ``(victims in
        order, the bits after, the hand after)``; changes nothing."""
        ref, evictable, hand = self.ref.copy(), evictable.copy(), self.hand
        victims: list[int] = []
        while len(victims) < n:                  # ends: after one turn every bit is clear
            slot, hand = hand, (hand + 1) % self.capacity
            if ref[slot]:
                ref[slot] = 0                    # its second chance
            elif evictable[slot]:
                victims.append(slot)
                evictable[slot] = False          # the slot now holds one of the step's misses
        return np.asarray(victims, np.int64), ref, hand

    def _choose_victims(self, candidates, n):
        if n > candidates.size:
            return super()._choose_victims(candidates, n)           # the common error
        evictable = np.zeros(self.capacity, bool)
        evictable[candidates] = True
        return self._sweep(evictable, n)[0]

    def _evict(self, victims):
        # the sweep that chose these victims, again: every reached slot whose bit was set is cleared; a slot it
        # passes with a clear bit is a victim or a slot of the step (whose bit the step sets anyway)
        chosen = np.zeros(self.capacity, bool)
        chosen[victims] = True
        _, self.ref[:], self.hand = self._sweep(chosen, int(victims.size))
        self._clear(victims)

    def _touch(self, slots):
        super()._touch(slots)
        self.ref[slots] = 1

    def _touch_cold(self, slots):
        super()._touch_cold(slots)
        self.ref[slots] = 0

    def _check_state(self, counters, arrays):
        if not 0 <= counters["hand"] < self.capacity:
            raise ValueError(f"state['hand'] must be a slot in [0, {self.capacity}), got {counters['hand']}")
        if not np.isin(arrays["ref"], (0, 1)).all():
            raise ValueError("state['ref'] must hold reference bits (0 or 1)")


def _stripe_probe(cursor: int, i: int, capacity: int):
    """The slots HiSparse's fallback probes for miss ``i`` (all its stripe's samples taken), in order:
    ``(start + a K) mod 2**32 mod capacity`` with ``start = (cursor + i K) mod 2**32 mod capacity`` and
    ``K = SAMPLED_CLOCK_PROBE``, ``a = 0 .. capacity - 1`` (uint32 arithmetic as in the kernel); then, where those
    did not cover the ring (a capacity that is not a power of two), every slot from the cursor on (ess's end)."""
    wrap = 1 << 32
    start = (cursor + i * SAMPLED_CLOCK_PROBE % wrap) % wrap % capacity
    for a in range(capacity):
        yield (start + a * SAMPLED_CLOCK_PROBE % wrap) % wrap % capacity
    for a in range(capacity):
        yield (cursor + a) % capacity


class SampledClockPolicy(EvictionPolicy):
    """SGLang HiSparse's multi-step "CLOCK" (module docstring): ``ref_epoch`` (capacity,) the step at which each
    slot was last selected or filled (0: never), ``epoch`` the steps seen, ``cursor`` where the stripes start.
    :meth:`touch` stamps its slots with the last step (a use), :meth:`touch_cold` with 0 (the oldest)."""

    name = "sampled_clock"
    _slot_arrays = ("stamp", "ref_epoch")
    _counters = ("clock", "epoch", "cursor")

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.ref_epoch = np.zeros(self.capacity, np.int64)
        self.epoch = 0
        self.cursor = 0

    def _choose_victims(self, candidates, n):
        if n == 0 or n > candidates.size:
            return super()._choose_victims(candidates, n)           # empty, or the common error
        cap, e = self.capacity, self.epoch + 1                      # e: this step's epoch
        ref = self.ref_epoch.copy()
        taken = np.ones(cap, bool)                                  # "bit set": selected or filled this step
        taken[candidates] = False
        victims = np.full(n, -1, np.int64)
        for first in range(0, n, SAMPLED_CLOCK_BLOCK):              # the kernel's rounds of 512 misses
            block = range(first, min(n, first + SAMPLED_CLOCK_BLOCK))
            for i in block:                                         # each miss samples its own stripe
                stripe = (cap - 1 - i) // n + 1
                looks = min(stripe, SAMPLED_CLOCK_SAMPLES)
                for s in range(looks):
                    slot = (self.cursor + i + (s * stripe // looks) * n) % cap
                    if not taken[slot] and (victims[i] < 0 or e - ref[slot] > e - ref[victims[i]]):
                        victims[i] = slot                           # the oldest; the first looked at on ties
                if victims[i] >= 0:
                    taken[victims[i]] = True
            for i in block:                                         # then the misses whose samples were all taken
                if victims[i] < 0:
                    victims[i] = next(s for s in _stripe_probe(self.cursor, i, cap) if not taken[s])
                    taken[victims[i]] = True
        return victims

    def _evict(self, victims):
        if victims.size:
            self.cursor = (self.cursor + min(int(victims.size), self.capacity)) % self.capacity
        self._clear(victims)

    def _update(self, slots, inserted, weights):
        self.epoch += 1
        self._touch(slots)

    def _touch(self, slots):
        super()._touch(slots)
        self.ref_epoch[slots] = self.epoch

    def _touch_cold(self, slots):
        super()._touch_cold(slots)
        self.ref_epoch[slots] = 0

    def _check_state(self, counters, arrays):
        if not 0 <= counters["cursor"] < self.capacity:
            raise ValueError(f"state['cursor'] must be a slot in [0, {self.capacity}), got {counters['cursor']}")
        if counters["epoch"] < 0:
            raise ValueError(f"state['epoch'] must be >= 0, got {counters['epoch']}")
        if ((arrays["ref_epoch"] < 0) | (arrays["ref_epoch"] > counters["epoch"])).any():
            raise ValueError(f"state['ref_epoch'] must hold steps in [0, epoch={counters['epoch']}]")


class BeladyPolicy(EvictionPolicy):
    """Offline: :meth:`update` takes, as ``weights``, the step at which each selected entry is used next (a step
    past the end for "never"); the farthest goes first."""

    name = "belady"
    _slot_arrays = ("stamp", "next_use")

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.next_use = np.zeros(self.capacity, np.int64)

    def _keys(self):
        return (self.stamp, -self.next_use)

    def _update(self, slots, inserted, weights):
        if weights is None:
            raise ValueError("weights: the belady policy needs each selected entry's next use")
        self.next_use[slots] = np.asarray(weights, np.int64)
        self._touch(slots)


_CLASSES = {"lru": LRUPolicy, "fifo": FIFOPolicy, "heat": HeatPolicy, "clock": ClockPolicy,
            "sampled_clock": SampledClockPolicy, "belady": BeladyPolicy}


def _check_weights(weights, shape: tuple, policy: "EvictionPolicy") -> np.ndarray | None:
    """A step's weights for ``policy``: ``None``, or finite numbers of the selection's ``shape`` (Belady's: the steps
    of the next uses, integers >= 0)."""
    if weights is None:
        return None
    if policy.name == "belady":
        w = int_array("weights", _array("weights", weights, "iu", "the next uses' steps (integers)"), lo=0)
    else:
        w = _array("weights", weights, "iuf", "an array of numbers aligned with the selected entries")
    if w.shape != shape:
        raise ValueError(f"weights must have the shape of the selection {shape}, got {w.shape}")
    if not np.isfinite(w).all():
        raise ValueError("weights must be finite (no NaN or inf)")
    return w


def make_policy(name: str, capacity: int, **options) -> EvictionPolicy:
    """A policy by name: one of :data:`POLICIES`, with its options (:data:`POLICY_OPTIONS`: ``"heat"`` takes
    ``decay``; an option another policy does not take is a ``TypeError``)."""
    one_of("policy", name, POLICIES)
    extra = sorted(set(options) - set(POLICY_OPTIONS[name]))
    if extra:
        allowed = POLICY_OPTIONS[name]
        raise TypeError(f"policy_options: the {name} policy takes "
                        f"{'only ' + str(list(allowed)) if allowed else 'no options'}, got {extra}")
    return _CLASSES[name](capacity, **options)


# ----------------------------------------------------------------------------------------------------------------
# One pool's slots
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SlotPlan:
    """Where one step's selected tokens will be, computed without changing anything (:meth:`SlotPool.plan`).

    ``tokens`` (K',) the valid selected tokens in array order; ``slots`` (K',) the local slot of each after the step
    (hits: where they are; misses: a free slot or a victim's); ``miss`` (K',) bool; ``victims`` the slots whose
    entries the misses replace (a subset of ``slots[miss]``); ``version`` the pool version it was made against."""

    tokens: np.ndarray
    slots: np.ndarray
    miss: np.ndarray
    victims: np.ndarray
    version: int

    @property
    def n_misses(self) -> int:
        return int(self.miss.sum())


class SlotPool:
    """The token <-> slot map of one pool and its eviction policy. A step is :meth:`plan` (no change), the caller's
    copy of the missed rows into ``plan.slots[plan.miss]``, then :meth:`commit`; a copy that fails calls
    :meth:`drop` with the victims' slots, whose old entries are no longer whole."""

    def __init__(self, capacity: int, policy: str = "lru", n_tokens: int = 1, **policy_options):
        self.policy = make_policy(policy, capacity, **policy_options)
        self.capacity = self.policy.capacity
        n_tokens = non_negative_int("n_tokens", n_tokens)
        self.token_of = np.full(self.capacity, -1, np.int64)     # token in each slot, -1 = free
        self.slot_of = _full("n_tokens", max(n_tokens, 1), -1, np.int64)   # slot of each token, -1 = not resident
        self.version = 0                                          # bumped by every change

    def grow(self, n_tokens: int) -> None:
        """Make room in the token map for tokens ``0 .. n_tokens - 1`` (at least doubling)."""
        n_tokens = non_negative_int("n_tokens", n_tokens)
        if n_tokens > self.slot_of.size:
            extra = max(n_tokens, 2 * self.slot_of.size) - self.slot_of.size
            self.slot_of = np.concatenate([self.slot_of, _full("n_tokens", extra, -1, np.int64)])

    def plan(self, tokens: np.ndarray, rank=None) -> SlotPlan:
        """The plan for selecting ``tokens`` (a 1-D integer array of distinct tokens >= 0, at most ``capacity``, in
        array order). ``rank`` (optional) replaces the policy's choice of victims: a function of the candidate
        tokens returning one finite key each, lowest evicted first, ties by token."""
        tokens = int_array("tokens", tokens, ndim=1, lo=0, shape_doc="(K,) distinct tokens")
        if tokens.size > self.capacity:
            raise ValueError(f"tokens selects {tokens.size} entries but the pool has only capacity={self.capacity} "
                             f"slots")
        if np.unique(tokens).size != tokens.size:
            raise ValueError("tokens must be distinct")
        if rank is not None and not callable(rank):
            raise TypeError(f"rank must be a function of the candidate tokens (or None), got {type(rank).__name__}")
        return self.plan_unchecked(tokens, rank)

    def plan_unchecked(self, tokens: np.ndarray, rank=None) -> SlotPlan:
        """:meth:`plan` for ``tokens`` already checked (contiguous int64; what :class:`ess.storage.TieredCache` passes
        after :func:`check_step_indices`)."""
        slots = np.full(tokens.size, -1, np.int64)                  # (K',) -1 = miss
        known = tokens < self.slot_of.size                          # a token past the map was never resident
        slots[known] = self.slot_of[tokens[known]]
        miss = slots < 0
        n_miss = int(miss.sum())
        free = np.flatnonzero(self.token_of < 0)[:n_miss]
        in_s = np.zeros(self.capacity, bool)
        in_s[slots[~miss]] = True
        candidates = np.flatnonzero((self.token_of >= 0) & ~in_s)
        n_victims = n_miss - free.size
        if rank is None or n_victims <= 0:
            victims = self.policy._choose_victims(candidates, max(n_victims, 0))
        else:
            candidates = candidates[np.argsort(self.token_of[candidates], kind="stable")]
            key = _array("rank(...)", rank(self.token_of[candidates]), "iuf", "one number per candidate token")
            if key.shape != candidates.shape or not np.isfinite(key).all():
                raise ValueError(f"rank must return one finite key per candidate token {candidates.shape}, got "
                                 f"{key.shape}")
            victims = candidates[np.argsort(key, kind="stable")[:n_victims]].astype(np.int64)
            if victims.size < n_victims:
                raise ValueError(f"{n_victims} victims needed but only {candidates.size} evictable slots")
        slots = slots.copy()
        slots[miss] = np.concatenate([free, victims])
        return SlotPlan(tokens, slots, miss, victims, self.version)

    def _check_current(self, plan: SlotPlan) -> None:
        if plan.version != self.version:
            raise ValueError(f"the plan was made against version {plan.version} of this pool, which is now at "
                             f"{self.version}: plan again")

    def commit(self, plan: SlotPlan, weights: np.ndarray | None = None) -> np.ndarray:
        """Apply ``plan`` once the missed rows are in place: the victims' tokens leave, the missed tokens take their
        slots and the policy sees the step (``weights`` aligned with ``plan.tokens``). Returns the evicted tokens."""
        if not isinstance(plan, SlotPlan):
            raise TypeError(f"plan must be a SlotPlan from SlotPool.plan, got {type(plan).__name__}")
        self._check_current(plan)
        weights = _check_weights(weights, plan.tokens.shape, self.policy)
        self.grow(int(plan.tokens.max(initial=-1)) + 1)
        evicted = self.token_of[plan.victims].copy()
        self.slot_of[evicted] = -1
        self.policy._evict(plan.victims)
        new_slots, new_tokens = plan.slots[plan.miss], plan.tokens[plan.miss]
        self.token_of[new_slots] = new_tokens
        self.slot_of[new_tokens] = new_slots
        self.policy._update(plan.slots, plan.miss, weights)
        self.version += 1
        return evicted

    def drop(self, slots: np.ndarray) -> None:
        """Forget the entries in ``slots`` (their rows may be half overwritten); free slots stay free."""
        slots = int_array("slots", slots, ndim=1, lo=0, below=self.capacity, shape_doc="(n,) slots")
        held = slots[self.token_of[slots] >= 0]
        self.slot_of[self.token_of[held]] = -1
        self.token_of[held] = -1
        self.policy._clear(held)
        self.version += 1

    def resident(self) -> np.ndarray:
        """Resident tokens in eviction order (first to go first)."""
        slots = np.flatnonzero(self.token_of >= 0)
        return self.token_of[self.policy._choose_victims(slots, slots.size)]

    def state(self) -> dict:
        """A copy of the map and the policy state (for snapshots and the disk tier)."""
        return {"token_of": self.token_of.copy(), "slot_of": self.slot_of.copy(), "policy": self.policy.state()}

    def set_token_map(self, token_of: np.ndarray) -> None:
        """Replace the map by ``token_of`` (capacity,) (a restored pool: distinct tokens >= 0, -1 for a free slot);
        the policy state is set separately."""
        token_of = int_array("token_of", token_of, ndim=1, lo=-1, shape_doc=f"({self.capacity},)")
        held = token_of[token_of >= 0]
        if token_of.shape != (self.capacity,) or np.unique(held).size != held.size:
            raise ValueError(f"token_of must hold ({self.capacity},) distinct tokens or -1, got shape {token_of.shape}")
        self.token_of[:] = token_of
        self.slot_of[:] = -1
        held = np.flatnonzero(self.token_of >= 0)
        self.grow(int(self.token_of.max(initial=-1)) + 1)
        self.slot_of[self.token_of[held]] = held
        self.version += 1


# ----------------------------------------------------------------------------------------------------------------
# Checking one step's indices, and the plain miss count
# ----------------------------------------------------------------------------------------------------------------

def check_step_indices(indices, n_tokens: int, capacity: int, name: str = "indices") -> np.ndarray:
    """Validate one step's top-K indices: a 1-D NumPy integer array in ``[-1, n_tokens)``, no repeated valid index,
    at most ``capacity`` valid ones. Returns them as a contiguous int64 array."""
    n_tokens, capacity = non_negative_int("n_tokens", n_tokens), positive_int("capacity", capacity)
    try:
        idx = int_array(name, indices, ndim=1, lo=-1, below=n_tokens, shape_doc="(K,), -1 = padding")
    except ValueError as exc:
        raise ValueError(f"{exc} (the request holds n_tokens={n_tokens})") from None
    valid = idx[idx >= 0]
    if valid.size > capacity:
        raise ValueError(f"{name} selects {valid.size} entries but the pool has only capacity={capacity} slots "
                         f"(the budget must hold one step's K entries)")
    if valid.size > 1 and not (valid[1:] > valid[:-1]).all() and np.unique(valid).size != valid.size:
        u, c = np.unique(valid, return_counts=True)      # (ascending, as top-K gives them: distinct, no hashing)
        raise ValueError(f"{name} repeats token {int(u[c > 1][0])}; valid top-K indices must be distinct")
    return idx


def _rows(name: str, rows) -> list[np.ndarray]:
    """A sequence of 1-D integer index arrays (``-1`` padding), as a list of arrays."""
    if isinstance(rows, np.ndarray) and rows.ndim == 2:
        rows = list(rows)
    if not isinstance(rows, (list, tuple)):
        raise TypeError(f"{name} must be a list of 1-D integer index arrays, got {type(rows).__name__}")
    return [int_array(f"{name}[{t}]", _array(f"{name}[{t}]", r, "iu", "a 1-D integer index array"), ndim=1)
            for t, r in enumerate(rows)]


def next_uses(rows: Sequence[np.ndarray]) -> list[np.ndarray]:
    """For each row ``t`` of a sequence of index sets, the next row at which each valid entry is selected again
    (``len(rows)`` when never): Belady's key. Each row is a 1-D integer array (``-1`` padding)."""
    rows = _rows("rows", rows)
    never = len(rows)
    nxt: dict[int, int] = {}
    out: list[np.ndarray] = [np.empty(0, np.int64)] * never
    for t in range(never - 1, -1, -1):
        valid = [int(x) for x in rows[t] if x >= 0]
        out[t] = np.array([nxt.get(x, never) for x in valid], np.int64)
        for x in valid:
            nxt[x] = t
    return out


def simulate_misses(steps: Sequence[np.ndarray], capacity: int, *, policy: str = "lru",
                    windows: Sequence[np.ndarray] = (), weights: Sequence[np.ndarray] | None = None,
                    decay: float = DEFAULT_HEAT_DECAY) -> np.ndarray:
    """Misses per step of one pool over ``steps`` (a sequence of index arrays, ``-1`` padding), without bytes: the
    readable reference of every policy. The slot bookkeeping is :class:`SlotPool`, the storage's; the warmup
    ``windows`` are applied first, each like a step, and not counted. ``weights`` (one array per step, aligned with its
    indices, padding included, as :meth:`ess.storage.TieredCache.step` takes them) feed the heat policy (default 1
    each; windows always 1); ``decay`` is the heat decay (checked for every policy, used by heat only)."""
    one_of("policy", policy, POLICIES)
    capacity = positive_int("capacity", capacity)
    decay = fraction("decay", decay)
    steps, windows = _rows("steps", steps), _rows("windows", windows)
    rows = windows + steps
    n_warm = len(windows)
    if weights is not None:
        if isinstance(weights, np.ndarray) and weights.ndim == 2:
            weights = list(weights)
        if not isinstance(weights, (list, tuple)):
            raise TypeError(f"weights must be a list of arrays, one per step, got {type(weights).__name__}")
        if len(weights) != len(steps):
            raise ValueError(f"weights must give one array per entry of steps ({len(steps)}), got {len(weights)}")
        checked_w = []
        for t, w in enumerate(weights):
            w = _array(f"weights[{t}]", w, "iuf", "an array of numbers aligned with the step's indices")
            if w.shape != steps[t].shape:
                raise ValueError(f"weights[{t}] must have the shape of steps[{t}] {steps[t].shape}, got {w.shape}")
            if not np.isfinite(w[steps[t] >= 0]).all():
                raise ValueError(f"weights[{t}] must be finite where steps[{t}] is not padding")
            checked_w.append(w)
        weights = checked_w
    checked = [check_step_indices(row, max(int(row.max(initial=-1)) + 1, 1), capacity,
                                  name=f"windows[{t}]" if t < n_warm else f"steps[{t - n_warm}]")
               for t, row in enumerate(rows)]
    options = {"decay": decay} if policy == "heat" else {}
    pool = SlotPool(capacity, policy, **options)
    future = next_uses(rows) if policy == "belady" else None
    misses = []
    for t, idx in enumerate(checked):
        tokens = idx[idx >= 0]
        plan = pool.plan_unchecked(tokens)
        w = None
        if future is not None:
            w = future[t]
        elif weights is not None and t >= n_warm:
            w = np.asarray(weights[t - n_warm], np.float64)[idx >= 0]
        pool.commit(plan, w)
        if t >= n_warm:
            misses.append(plan.n_misses)
    return np.asarray(misses, np.int64)
