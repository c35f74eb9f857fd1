"""Numba kernels for the CPU: one parallel pass over the row pairs (the FlashTrans idea on the host side).

Each thread takes a contiguous share of the pairs and copies each row as 8-byte words when the row width allows it
(656 B = 82 words), byte by byte otherwise. Rows are scattered in a large host pool, so the copy is bound by memory
latency, not bandwidth: the kernel issues a software prefetch (``llvm.prefetch``) for every 64-byte line of the row
``PREFETCH_ROWS`` pairs ahead, to keep more loads in flight (what that gains is measured by
``benchmarks/transfer_gather.py``; see ``benchmarks/README.md``).
Same signature as :func:`ess.kernels.transfer.reference.copy_rows`.
"""
from __future__ import annotations

import functools

import numpy as np

__all__ = ["copy_rows", "check_bounds", "PREFETCH_ROWS", "PARALLEL_MIN_BYTES"]

# rows prefetched ahead of the copy: 2..16 gave the same rate on one thread of the CI machine (within 5 %); 8 is a
# design choice in that plateau
PREFETCH_ROWS = 8
# below this many bytes one thread does the whole copy: waking the thread pool costs more than it saves (design choice)
PARALLEL_MIN_BYTES = 1 << 16
LINE_BYTES = 64         # cache-line size of x86-64 and most AArch64 servers


@functools.lru_cache(maxsize=None)
def _prefetch_intrinsic():
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def prefetch(typingctx, arr, i, j):
        """Prefetch the line holding ``arr[i, j]`` for reading (no fault on any address)."""
        sig = types.void(arr, i, j)

        def codegen(context, builder, signature, args):
            aty = signature.args[0]
            ary = context.make_array(aty)(context, builder, args[0])
            ptr = cgutils.get_item_pointer(context, builder, aty, ary, [args[1], args[2]], wraparound=False)
            i8p = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
            # (address, rw = read, locality = 3 keep in all levels, cache type = data)
            builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
            return context.get_dummy_value()

        return sig, codegen

    return prefetch


@functools.lru_cache(maxsize=None)
def _kernels(with_prefetch: bool = True):
    import numba as nb

    if with_prefetch:
        prefetch = _prefetch_intrinsic()
    else:
        @nb.njit(inline="always")
        def prefetch(arr, i, j):       # no-op stand-in where the LLVM intrinsic does not compile
            pass

    @nb.njit(inline="always", boundscheck=False)
    def copy_share(src, src_idx, dst, dst_idx, lo, hi, ahead, step):   # pairs [lo, hi) of one thread
        w = src.shape[1]
        for i in range(lo, min(lo + ahead, hi)):
            if src_idx[i] >= 0:
                for j in range(0, w, step):
                    prefetch(src, src_idx[i], j)
        for i in range(lo, hi):
            if i + ahead < hi and src_idx[i + ahead] >= 0:
                t = src_idx[i + ahead]
                for j in range(0, w, step):
                    prefetch(src, t, j)
            s = src_idx[i]
            d = dst_idx[i]
            if s >= 0 and d >= 0:
                for j in range(w):
                    dst[d, j] = src[s, j]

    @nb.njit(parallel=True, nogil=True, boundscheck=False)      # not cached: the prefetch intrinsic is a dynamic global
    def copy_rows_par(src, src_idx, dst, dst_idx, ahead, step):   # (N, W) (K,) (M, W) (K,)
        n = src_idx.shape[0]
        nt = nb.get_num_threads()
        share = (n + nt - 1) // nt
        for t in nb.prange(nt):
            copy_share(src, src_idx, dst, dst_idx, t * share, min((t + 1) * share, n), ahead, step)

    @nb.njit(nogil=True, boundscheck=False)
    def copy_rows_seq(src, src_idx, dst, dst_idx, ahead, step):
        copy_share(src, src_idx, dst, dst_idx, 0, src_idx.shape[0], ahead, step)

    return copy_rows_par, copy_rows_seq


def check_bounds(src: np.ndarray, src_idx: np.ndarray, dst: np.ndarray, dst_idx: np.ndarray) -> None:
    """What the kernels need to stay inside their arrays (they run without bounds checks): 2-D uint8 ``src`` and
    writeable ``dst`` of one row width, 1-D integer indices of one length, ``src_idx`` in ``[-1, len(src))`` and
    ``dst_idx`` in ``[-1, len(dst))``. O(K) on the indices, negligible next to the rows moved; a ``ValueError`` or
    ``TypeError`` otherwise. (:func:`ess.kernels.transfer.copy_rows` also checks repeated destinations.)"""
    for name, a in (("src", src), ("dst", dst)):
        if not isinstance(a, np.ndarray) or a.dtype != np.uint8 or a.ndim != 2 or not a.flags.c_contiguous:
            raise TypeError(f"{name} must be a C-contiguous 2-D uint8 array")
    if src.shape[1] != dst.shape[1]:
        raise ValueError(f"src rows are {src.shape[1]} B but dst rows are {dst.shape[1]} B")
    if not dst.flags.writeable:
        raise ValueError("dst must be writeable")
    for name, idx, n in (("src_idx", src_idx, src.shape[0]), ("dst_idx", dst_idx, dst.shape[0])):
        if not isinstance(idx, np.ndarray) or idx.dtype.kind not in "iu" or idx.ndim != 1:
            raise TypeError(f"{name} must be a 1-D NumPy integer array")
        if idx.size and (int(idx.min()) < -1 or int(idx.max()) >= n):
            raise ValueError(f"{name} must lie in [-1, {n}), got [{int(idx.min())}, {int(idx.max())}]")
    if src_idx.shape != dst_idx.shape:
        raise ValueError(f"src_idx and dst_idx must have the same length, got {src_idx.size} and {dst_idx.size}")


def copy_rows(src: np.ndarray, src_idx: np.ndarray, dst: np.ndarray, dst_idx: np.ndarray, *,
              parallel: bool | None = None, prefetch_rows: int = PREFETCH_ROWS) -> np.ndarray:
    """``dst[dst_idx[i]] = src[src_idx[i]]`` for every pair where both indices are >= 0; returns ``dst``.

    ``parallel=None`` uses the threads when the pairs move at least :data:`PARALLEL_MIN_BYTES`;
    ``prefetch_rows=0`` turns the software prefetch off. The shapes and index ranges are checked first
    (:func:`check_bounds`): the kernels themselves run without bounds checks."""
    check_bounds(src, src_idx, dst, dst_idx)
    s, d = src, dst
    if src.shape[1] % 8 == 0 and src.ctypes.data % 8 == 0 and dst.ctypes.data % 8 == 0:
        s, d = src.view(np.uint64), dst.view(np.uint64)
    step = max(LINE_BYTES // s.itemsize, 1)
    if parallel is None:
        parallel = src_idx.shape[0] * src.shape[1] >= PARALLEL_MIN_BYTES
    global _PREFETCH_OK
    if _PREFETCH_OK:
        par, seq = _kernels(True)
        try:
            (par if parallel else seq)(s, src_idx, d, dst_idx, int(prefetch_rows), step)
            return dst
        except Exception as exc:       # the intrinsic failed to compile on this LLVM: fall back, say so once
            from numba.core.errors import NumbaError
            if not isinstance(exc, NumbaError):
                raise
            import warnings
            warnings.warn(f"software prefetch unavailable ({type(exc).__name__}); copying without it")
            _PREFETCH_OK = False
    par, seq = _kernels(False)
    (par if parallel else seq)(s, src_idx, d, dst_idx, 0, step)
    return dst


# whether the prefetch intrinsic compiles on this LLVM: a process-wide fact, set once from True to False (never back)
# when compiling fails; not scratch data, so sharing it between threads is safe (a race only repeats the fallback)
_PREFETCH_OK = True
