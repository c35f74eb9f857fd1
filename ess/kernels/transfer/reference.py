"""NumPy oracle of the transfer kernels: move many small rows (latent entries) between two row arrays.

One operation, written to be read. Every fast kernel (``numba_cpu``, ``torch_ops``) has the same signature and
is tested against this one::

    copy_rows(src, src_idx, dst, dst_idx)      dst[dst_idx[i]] = src[src_idx[i]]  for every i with both >= 0

    src      (N, W) uint8    rows to read (the host pool of one layer, or the device pool)
    src_idx  (K,)   int64    row of ``src`` for each pair, -1 = skip the pair (top-K padding)
    dst      (M, W) uint8    rows to write (device slots, a staging buffer, or the host pool)
    dst_idx  (K,)   int64    row of ``dst`` for each pair, -1 = skip the pair

A gather (``out[i] = src[idx[i]]``) is ``copy_rows(src, idx, out, arange(K))``; a scatter
(``dst[idx[i]] = rows[i]``) is ``copy_rows(rows, arange(K), dst, idx)``. The kernels assume validated arguments
(in range, no repeated destination row); :mod:`ess.kernels.transfer` validates.
"""
from __future__ import annotations

import numpy as np

__all__ = ["copy_rows"]


def copy_rows(src: np.ndarray, src_idx: np.ndarray, dst: np.ndarray, dst_idx: np.ndarray) -> np.ndarray:
    """``dst[dst_idx[i]] = src[src_idx[i]]`` for every pair where both indices are >= 0; returns ``dst``."""
    for i in range(src_idx.shape[0]):
        s, d = int(src_idx[i]), int(dst_idx[i])
        if s < 0 or d < 0:
            continue
        dst[d, :] = src[s, :]
    return dst
