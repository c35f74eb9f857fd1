"""Statistics of index rows (one set of cache positions per row, ``-1`` padding), the kernels behind
:mod:`ess.traces` and the trace generator's calibration:

* ``first_duplicate_row(rows, n_pos) -> int``: the first row that repeats a position (-1: none);
* ``adjacent_overlaps(rows, n_pos, out)``: ``out[t - 1] = |S(t-1) & S(t)| / |S(t)|`` for t = 1 .. T-1, NaN where
  S(t) is empty -- **the** overlap of paper Fig. 2, written once: :func:`ess.traces.adjacent_overlap` averages it
  over a trace's steps and requests, :func:`ess.tracegen.drift_calibration` over its calibration stream;
* ``union_sizes(rows, n_pos, window, out)``: ``out[t]`` = distinct positions of rows t .. t+window-1;
* ``leave_return(rows, n_pos, within) -> (left, returned)``: positions of row s-1 missing from row s, and those of
  them found again in rows s+1 .. s+within, summed over s = 1 .. T-1-within.

``rows`` is (T, W) int32, C-contiguous, positions in ``[-1, n_pos)``; the callers check that first (the Numba
kernels index arrays of ``n_pos`` entries with the positions). Two files with these signatures: ``reference``
(NumPy sets, the oracle) and ``numba_cpu`` (one pass with a stamp array).
"""
from __future__ import annotations

from .. import family_module

__all__ = ["get"]


def get(backend: str):
    """The kernel module of a resolved backend name (``"reference"`` or ``"numba"``)."""
    if backend == "torch":
        raise ValueError("the trace statistics have no torch kernel; use backend 'numba' or 'reference'")
    return family_module(__name__, backend)
