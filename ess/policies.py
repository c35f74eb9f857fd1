"""Eviction policies of the GPU pool: LRU (the paper's), FIFO and importance; LRU-Warmup seeding.

A pool of ``capacity`` slots belongs to one (request, layer). One decode step selects a set S of tokens (the valid
top-K indices, in array order); hits are S ∩ pool, misses S \\ pool. The misses go to free slots first, then to
victims chosen by the policy among the resident entries **not in S** (an entry selected this step is never
evicted by the same step). The policy sees slots only; :class:`ess.storage.TieredCache` keeps the token map.

Ranking (lowest evicted first, ties broken by the lower slot number):

* ``"lru"``: last use. After a step the entries of S are the most recent, ordered by their position in the indices
  array (a later position is more recent), hits and misses alike. This is the paper's policy ([ARX] "managed by
  LRU per layer"); the exact order inside one step is ours (the paper does not say), and
  :func:`simulate_misses` and ``ess.cachesim`` use the same rule.
* ``"fifo"``: insertion time; a hit does not refresh it.
* ``"importance"``: a decayed indexer score. Each step every resident entry's score is multiplied by ``decay``
  (default 0.5, a design choice), then each entry of S adds its score for this step (the indexer score passed as
  ``scores``, aligned with the indices; 1.0 each when no scores are given, which makes it a decayed access count).
  The lowest score is evicted first, ties by LRU order.

**LRU-Warmup** ([ARX]): before decoding, the top-K sets of the last W prefill positions are fed to the pool in order,
each like one step, so that the first decode steps find the hot entries resident (:meth:`TieredCache.warmup`).
"""
from __future__ import annotations

import numpy as np

from .validate import fraction, int_array, one_of, positive_int

__all__ = ["POLICIES", "EvictionPolicy", "LRUPolicy", "FIFOPolicy", "ImportancePolicy", "make_policy",
           "simulate_misses", "check_step_indices", "plan_slots", "commit_slots"]

POLICIES = ("lru", "fifo", "importance")


class EvictionPolicy:
    """Per-pool eviction state over ``capacity`` slots. Subclasses define :meth:`_keys` and :meth:`update`.

    :meth:`choose_victims` never changes the state; :meth:`update` is called once the step's transfers succeeded."""

    name = "base"

    def __init__(self, capacity: int):
        self.capacity = positive_int("capacity", capacity)
        self.clock = 0                                       # counts entry touches, for recency order
        self.stamp = np.zeros(self.capacity, np.int64)       # last use (LRU order, also the tie-breaker)

    # -- ranking ---------------------------------------------------------------------------------------------
    def _keys(self) -> tuple[np.ndarray, ...]:
        """Sort keys per slot, most significant last (``np.lexsort`` order); lowest is evicted first."""
        raise NotImplementedError

    def choose_victims(self, candidates: np.ndarray, n: int) -> np.ndarray:
        """The ``n`` slots among ``candidates`` (resident, not selected this step) to evict, first victim first."""
        if n == 0:
            return np.empty(0, np.int64)
        if n > candidates.size:
            raise ValueError(f"{n} victims needed but only {candidates.size} evictable slots")
        keys = tuple(k[candidates] for k in self._keys())
        order = np.lexsort((candidates,) + keys)
        return candidates[order[:n]].astype(np.int64)

    # -- state changes ---------------------------------------------------------------------------------------
    def _touch(self, slots: np.ndarray) -> None:
        self.stamp[slots] = self.clock + 1 + np.arange(slots.size)
        self.clock += int(slots.size)

    def update(self, slots: np.ndarray, inserted: np.ndarray, scores: np.ndarray | None) -> None:
        """After a step: ``slots`` of S in indices order, ``inserted`` marks the ones loaded by this step."""
        self._touch(slots)

    def clear(self, slots: np.ndarray) -> None:
        """Forget the entries of ``slots`` (evicted or freed)."""
        self.stamp[slots] = 0

    def state(self) -> dict:
        return {"clock": self.clock, "stamp": self.stamp.copy()}

    def set_state(self, state: dict) -> None:
        self.clock = int(state["clock"])
        self.stamp[:] = state["stamp"]


class LRUPolicy(EvictionPolicy):
    name = "lru"

    def _keys(self):
        return (self.stamp,)


class FIFOPolicy(EvictionPolicy):
    name = "fifo"

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.inserted_at = np.zeros(self.capacity, np.int64)
        self.n_inserted = 0

    def _keys(self):
        return (self.inserted_at,)

    def update(self, slots, inserted, scores):
        new = slots[inserted]
        self.inserted_at[new] = self.n_inserted + 1 + np.arange(new.size)
        self.n_inserted += int(new.size)
        self._touch(slots)

    def clear(self, slots):
        super().clear(slots)
        self.inserted_at[slots] = 0

    def state(self):
        return {**super().state(), "inserted_at": self.inserted_at.copy(), "n_inserted": self.n_inserted}

    def set_state(self, state):
        super().set_state(state)
        self.inserted_at[:] = state["inserted_at"]
        self.n_inserted = int(state["n_inserted"])


class ImportancePolicy(EvictionPolicy):
    name = "importance"

    def __init__(self, capacity: int, decay: float = 0.5):
        super().__init__(capacity)
        self.decay = fraction("decay", decay)
        self.score = np.zeros(self.capacity, np.float64)

    def _keys(self):
        return (self.stamp, self.score)            # score decides, LRU order breaks ties

    def update(self, slots, inserted, scores):
        self.score *= self.decay
        add = np.ones(slots.size) if scores is None else np.asarray(scores, np.float64)
        self.score[slots] += add
        self._touch(slots)

    def clear(self, slots):
        super().clear(slots)
        self.score[slots] = 0.0

    def state(self):
        return {**super().state(), "score": self.score.copy()}

    def set_state(self, state):
        super().set_state(state)
        self.score[:] = state["score"]


def make_policy(name: str, capacity: int, **options) -> EvictionPolicy:
    """A policy by name: ``"lru"``, ``"fifo"`` or ``"importance"`` (option ``decay``)."""
    one_of("policy", name, POLICIES)
    if name == "lru":
        return LRUPolicy(capacity, **options)
    if name == "fifo":
        return FIFOPolicy(capacity, **options)
    return ImportancePolicy(capacity, **options)


def check_step_indices(indices, n_tokens: int, capacity: int, name: str = "indices") -> np.ndarray:
    """Validate one step's top-K indices: 1-D integers in ``[-1, n_tokens)``, no repeated valid index, at most
    ``capacity`` valid ones. Returns them as a contiguous int64 array."""
    idx = int_array(name, indices, ndim=1, lo=-1, below=n_tokens, shape_doc="(K,), -1 = padding")
    valid = idx[idx >= 0]
    if valid.size > capacity:
        raise ValueError(f"{name} selects {valid.size} entries but the pool has only capacity={capacity} slots "
                         f"(the budget must hold one step's K entries)")
    if np.unique(valid).size != valid.size:
        u, c = np.unique(valid, return_counts=True)
        raise ValueError(f"{name} repeats token {int(u[c > 1][0])}; valid top-K indices must be distinct")
    return idx


def plan_slots(local: np.ndarray, token_of: np.ndarray, policy: EvictionPolicy) -> tuple:
    """Where one step's misses go, without changing anything. ``local`` (K',) is the pool slot of each valid index
    (-1 = miss), ``token_of`` (capacity,) the token in each slot (-1 = free). Returns ``(miss, new_slots, victims)``:
    the miss mask, the slot of each miss (free slots first, then the policy's victims among the resident entries not
    selected this step) and the victims."""
    miss = local < 0
    n_miss = int(miss.sum())
    free = np.flatnonzero(token_of < 0)[:n_miss]
    in_s = np.zeros(token_of.size, bool)
    in_s[local[~miss]] = True
    candidates = np.flatnonzero((token_of >= 0) & ~in_s)
    victims = policy.choose_victims(candidates, n_miss - free.size)
    return miss, np.concatenate([free, victims]).astype(np.int64), victims


def commit_slots(token_of: np.ndarray, slot_of: np.ndarray, policy: EvictionPolicy, local: np.ndarray,
                 miss: np.ndarray, new_slots: np.ndarray, victims: np.ndarray, tokens: np.ndarray,
                 scores: np.ndarray | None) -> np.ndarray:
    """Apply a :func:`plan_slots` plan once the misses' rows are in place: the victims' tokens leave, the missed
    ``tokens`` take ``new_slots``, ``local`` is filled in and the policy sees the step. ``slot_of`` maps token ->
    slot (-1 = not resident). Returns the evicted tokens."""
    evicted = token_of[victims].copy()
    slot_of[evicted] = -1
    policy.clear(victims)
    token_of[new_slots] = tokens
    slot_of[tokens] = new_slots
    local[miss] = new_slots
    policy.update(local, miss, scores)
    return evicted


def simulate_misses(trace, capacity: int, *, policy: str = "lru", warmup=(), scores=None) -> np.ndarray:
    """Misses per step of one pool over ``trace`` (a sequence of index arrays, -1 padding), without bytes.

    The same slot bookkeeping as :class:`ess.storage.TieredCache` (:func:`plan_slots` and :func:`commit_slots`,
    shared with it); ``warmup`` windows are applied first and not counted."""
    pol = make_policy(policy, capacity)
    slot_of = np.full(1, -1, np.int64)
    token_of = np.full(capacity, -1, np.int64)
    misses = []
    for t, idx in enumerate(list(warmup) + list(trace)):
        n_tok = max(int(np.max(idx)) + 1, 1) if len(idx) else 1
        idx = check_step_indices(np.asarray(idx), n_tok, capacity)
        if n_tok > slot_of.size:
            slot_of = np.concatenate([slot_of, np.full(max(n_tok, 2 * slot_of.size) - slot_of.size, -1, np.int64)])
        valid = idx[idx >= 0]
        local = slot_of[valid]
        miss, new_slots, victims = plan_slots(local, token_of, pol)
        sc = None
        if scores is not None and t >= len(warmup):
            sc = np.asarray(scores[t - len(warmup)], np.float64)[idx >= 0]
        commit_slots(token_of, slot_of, pol, local, miss, new_slots, victims, valid[miss], sc)
        if t >= len(warmup):
            misses.append(int(miss.sum()))
    return np.asarray(misses, np.int64)
