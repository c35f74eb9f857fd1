"""The prefetch pool: one pool (one request, one layer) over a trace's steps with the three prefetch classes of
:mod:`ess.prefetch` (immediate misses, speculative loads, the delayed warmup queue) on one link.

Two files with one signature (:mod:`.reference`): ``reference`` (NumPy on :class:`ess.policies.SlotPool`, any
predictor and eviction; the oracle) and ``numba_cpu`` (LRU eviction with no predictor or the heat one,
:func:`.numba_cpu.applies`). No torch kernel: a pool is a chain of dependent steps. The public wrapper is
:func:`ess.prefetch.simulate_prefetch`: it validates, sums the pools and picks the backend with
:func:`ess.kernels.resolve_backend`.
"""
from __future__ import annotations

from .. import family_module

__all__ = ["get"]


def get(backend: str):
    """The kernel module of a resolved backend name (``"reference"`` or ``"numba"``)."""
    if backend == "torch":
        raise ValueError("the prefetch pool has no torch kernel; use backend 'numba' or 'reference'")
    return family_module(__name__, backend)
