"""Trace-driven cache simulation: the misses of one pool (one request, one layer) over a sequence of steps under a
replacement policy of :data:`ess.policies.POLICIES`, the warmup windows first and not counted.

Two files with one signature (:mod:`.numba_cpu`'s docstring): ``reference`` (the policy references of
:mod:`ess.policies`, the oracle) and ``numba_cpu`` (one kernel per policy, miss for miss the same). There is no
torch kernel: the simulation is a chain of dependent steps over a few arrays, one core's work. The public wrappers
are :func:`ess.cachesim.sequence_misses` and its siblings: they validate, allocate ``out`` and pick the backend
with :func:`ess.kernels.resolve_backend`.
"""
from __future__ import annotations

from .. import family_module

__all__ = ["get"]


def get(backend: str):
    """The kernel module of a resolved backend name (``"reference"`` or ``"numba"``)."""
    if backend == "torch":
        raise ValueError("the cache simulation has no torch kernel; use backend 'numba' or 'reference'")
    return family_module(__name__, backend)
