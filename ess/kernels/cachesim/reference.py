"""The oracle of the cache-simulation kernels: the policy references of :mod:`ess.policies` (one readable class
per policy on :class:`ess.policies.SlotPool`, run by :func:`ess.policies.simulate_misses`), behind the kernels'
signature (:mod:`.numba_cpu`)::

    simulate(seq, n_free, capacity, policy, n_pos, decay, out) -> int

No third implementation: this module only adapts the arguments (the first ``n_free`` rows become the uncounted
warmup windows; heat counts one per access, as the kernels do) and reports the first row larger than the pool
instead of raising, as the kernels do.
"""
from __future__ import annotations

import numpy as np

from ...policies import simulate_misses

__all__ = ["simulate"]


def simulate(seq, n_free, capacity, policy, n_pos, decay, out) -> int:
    """Misses of each row after the first ``n_free`` into ``out``; -1, or the first row with more valid entries
    than ``capacity`` slots (then ``out`` is left as it was)."""
    sizes = (np.asarray(seq) >= 0).sum(axis=1)
    too_big = np.flatnonzero(sizes > capacity)
    if too_big.size:
        return int(too_big[0])
    rows = [np.asarray(row) for row in seq]
    out[:] = simulate_misses(rows[n_free:], capacity, policy=policy, windows=rows[:n_free], decay=decay)
    return -1
