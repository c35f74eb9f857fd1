"""The real model's sparse attention over its K/V pool (:mod:`ess.engine.attention`), in two operations that make
its result independent of when each entry arrived: :func:`score_columns` scores any subset of a step's columns (the
hits while the misses cross, then the misses), :func:`combine_columns` takes the softmax over every column and the
weighted sum of the values. Columns and shapes: :mod:`.reference`.

Three files with one signature: ``reference`` (NumPy float64, the oracle), ``numba_cpu`` (reads the entries in the
pool in place) and ``torch_ops`` (CPU and CUDA). The public functions check shapes and dtypes (not values: the
engine calls them per layer), and pick the backend with :func:`ess.kernels.resolve_backend`; the arrays are all
NumPy or all torch tensors on the pool's device.
"""
from __future__ import annotations

import numpy as np

from ...validate import real
from .. import as_kernel_array, device_of, family_module, is_tensor, resolve_backend

__all__ = ["score_columns", "combine_columns", "get"]


def _in_range(name: str, a, lo: int, below: int) -> None:
    """Every index of ``a`` in ``[lo, below)``: a kernel reads and writes where they point, unchecked (past the
    array in Numba). One reduction each way (on a CUDA tensor, a synchronisation: the engine calls the kernels
    directly, without this wrapper)."""
    if a.numel() if is_tensor(a) else a.size:
        low, high = int(a.min()), int(a.max())
        if low < lo or high >= below:
            raise ValueError(f"{name} must hold indices in [{lo}, {below}), found {low if low < lo else high}")


def get(backend: str):
    """The kernel module of a resolved backend name (``"reference"``, ``"numba"`` or ``"torch"``)."""
    return family_module(__name__, backend)


def _check(**arrays):
    tensors = is_tensor(next(iter(arrays.values()))[0])
    for name, (a, dtype, ndim) in arrays.items():
        if not (is_tensor(a) or isinstance(a, np.ndarray)):
            raise TypeError(f"{name} must be a NumPy array or a torch tensor, got {type(a).__name__}")
        if is_tensor(a) != tensors:
            raise TypeError(f"the arrays must be all NumPy arrays or all torch tensors; {name} is "
                            f"{type(a).__name__}")
        got = str(a.dtype).replace("torch.", "")
        if got != dtype or a.ndim != ndim:
            raise ValueError(f"{name} must be a {ndim}-D {dtype} array, got {got} of shape {tuple(a.shape)}")
        if not (a.is_contiguous() if tensors else a.flags.c_contiguous):
            raise ValueError(f"{name} must be C-contiguous")
    devices = {str(a.device) for a, _, _ in arrays.values()} if tensors else set()
    if len(devices) > 1:
        raise ValueError(f"the arrays must be on one device, got {sorted(devices)}")


def score_columns(q, pool, b, cols, rows, scale: float, scores, *, backend: str = "auto") -> None:
    """Score entries ``pool[rows]`` into columns ``cols`` of requests ``b`` (:mod:`.reference`), in ``scores``."""
    _check(q=(q, "float32", 3), pool=(pool, "float32", 4), b=(b, "int64", 1), cols=(cols, "int64", 1),
           rows=(rows, "int64", 1), scores=(scores, "float32", 3))
    n = b.shape[0]
    if cols.shape[0] != n or rows.shape[0] != n:
        raise ValueError(f"b, cols and rows must have one length, got {n}, {cols.shape[0]}, {rows.shape[0]}")
    if q.shape[1] % pool.shape[2] or q.shape[2] != pool.shape[3] or scores.shape[0] != q.shape[0] or \
            scores.shape[1] != q.shape[1] or pool.shape[1] != 2:
        raise ValueError(f"q (B, H, hd), pool (N, 2, Hkv, hd) and scores (B, H, C) do not fit: {tuple(q.shape)}, "
                         f"{tuple(pool.shape)}, {tuple(scores.shape)}")
    _in_range("b", b, 0, scores.shape[0])
    _in_range("cols", cols, 0, scores.shape[2])
    _in_range("rows", rows, 0, pool.shape[0])
    scale = real("scale", scale, lo=0.0, lo_open=True, hi=float(np.finfo(np.float32).max))   # the kernels' float32
    be = resolve_backend(backend, device=device_of(pool))
    get(be).score_columns(*(as_kernel_array(a, be) for a in (q, pool, b, cols, rows)), float(scale),
                          as_kernel_array(scores, be))


def combine_columns(scores, pool, slots, own_v, rows, out, *, backend: str = "auto") -> None:
    """Softmax over the columns and the weighted sum of their values for requests ``rows``, into ``out``."""
    _check(scores=(scores, "float32", 3), pool=(pool, "float32", 4), slots=(slots, "int64", 2),
           own_v=(own_v, "float32", 3), rows=(rows, "int64", 1), out=(out, "float32", 3))
    B, H, C = scores.shape
    if tuple(slots.shape) != (B, C - 1) or tuple(own_v.shape) != (B,) + tuple(pool.shape[2:]) or \
            tuple(out.shape) != (B, H, pool.shape[3]):
        raise ValueError(f"slots (B, C - 1), own_v (B, Hkv, hd) and out (B, H, hd) do not fit scores {(B, H, C)} "
                         f"and pool {tuple(pool.shape)}: {tuple(slots.shape)}, {tuple(own_v.shape)}, "
                         f"{tuple(out.shape)}")
    _in_range("slots", slots, -1, pool.shape[0])
    _in_range("rows", rows, 0, B)
    be = resolve_backend(backend, device=device_of(pool))
    get(be).combine_columns(*(as_kernel_array(a, be) for a in (scores, pool, slots, own_v, rows, out)))
