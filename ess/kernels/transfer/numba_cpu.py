"""Numba kernels for the CPU: one parallel pass over the row pairs (the FlashTrans idea on the host side).

Each row is copied as 8-byte words when the row width allows it (656 B = 82 words), otherwise byte by byte; the
pairs are split over the threads with ``prange``. Same signature as :func:`ess.kernels.transfer.reference.copy_rows`.
"""
from __future__ import annotations

import functools

import numpy as np

__all__ = ["copy_rows"]


@functools.lru_cache(maxsize=None)
def _kernels():
    import numba as nb

    @nb.njit(parallel=True, cache=True, nogil=True, boundscheck=False)
    def copy_rows_par(src, src_idx, dst, dst_idx):   # (N, W) (K,) (M, W) (K,)
        n = src_idx.shape[0]
        w = src.shape[1]
        for i in nb.prange(n):
            s = src_idx[i]
            d = dst_idx[i]
            if s >= 0 and d >= 0:
                for j in range(w):
                    dst[d, j] = src[s, j]

    @nb.njit(cache=True, nogil=True, boundscheck=False)
    def copy_rows_seq(src, src_idx, dst, dst_idx):
        n = src_idx.shape[0]
        w = src.shape[1]
        for i in range(n):
            s = src_idx[i]
            d = dst_idx[i]
            if s >= 0 and d >= 0:
                for j in range(w):
                    dst[d, j] = src[s, j]

    return copy_rows_par, copy_rows_seq


# below this many bytes one thread does the whole copy: starting the thread pool costs more than it saves
PARALLEL_MIN_BYTES = 1 << 16   # design choice, measured on the 2-core CI machine (benchmarks/transfer_gather.py)


def copy_rows(src: np.ndarray, src_idx: np.ndarray, dst: np.ndarray, dst_idx: np.ndarray, *,
              parallel: bool | None = None) -> np.ndarray:
    """``dst[dst_idx[i]] = src[src_idx[i]]`` for every pair where both indices are >= 0; returns ``dst``.

    ``parallel=None`` uses the threads when the pairs move at least :data:`PARALLEL_MIN_BYTES`."""
    par, seq = _kernels()
    s, d = src, dst
    if src.shape[1] % 8 == 0 and src.ctypes.data % 8 == 0 and dst.ctypes.data % 8 == 0:
        s, d = src.view(np.uint64), dst.view(np.uint64)
    if parallel is None:
        parallel = src_idx.shape[0] * src.shape[1] >= PARALLEL_MIN_BYTES
    (par if parallel else seq)(s, src_idx, d, dst_idx)
    return dst
