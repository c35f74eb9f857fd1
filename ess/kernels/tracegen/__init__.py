"""The synthetic trace generators' kernels: one (request, layer) stream of the uniform model or of the score-drift
model per call, its warmup windows and its decode steps (the union of each step's ``mtp`` query tokens' sets).

Two files with one signature (:mod:`.numba_cpu`'s docstring): ``reference`` (Python, query token by query token,
the oracle) and ``numba_cpu``; both draw the same random numbers in the same order and write the same streams.
No torch kernel: a stream is a chain of dependent draws. The public wrappers are
:func:`ess.tracegen.synthetic_streams` and :func:`ess.tracegen.synthetic_trace`: they validate, allocate and pick
the backend with :func:`ess.kernels.resolve_backend`.
"""
from __future__ import annotations

from .. import family_module

__all__ = ["get"]


def get(backend: str):
    """The kernel module of a resolved backend name (``"reference"`` or ``"numba"``)."""
    if backend == "torch":
        raise ValueError("the trace generators have no torch kernel; use backend 'numba' or 'reference'")
    return family_module(__name__, backend)
