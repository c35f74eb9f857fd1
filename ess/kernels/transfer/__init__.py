"""Transfer kernels: move many small rows (656-byte latent entries) in one pass (the FlashTrans idea).

The whole latent cache lives in host memory and each decode step copies the misses among the top-K entries into
device slots; one copy call per 656-byte row is slow (the paper's baseline, 0.79 GB/s host to device), one pass that
gathers every row is fast ([BLOG]: 37 GB/s). The public functions validate, allocate and dispatch:

* :func:`copy_rows` ``dst[dst_idx[i]] = src[src_idx[i]]`` (the general form: host rows into device slots);
* :func:`gather_rows` ``out[i] = src[idx[i]]``;
* :func:`scatter_rows` ``dst[idx[i]] = rows[i]`` (write-back).

Indices are int64 with ``-1`` meaning "skip this pair" (the top-K padding). Arrays are NumPy arrays or torch
tensors (uint8, 2-D, C-contiguous, same row width); ``backend`` is ``"auto" | "reference" | "numba" | "torch"``
(see :func:`ess.kernels.resolve_backend`); CUDA tensors need ``backend="torch"`` (what ``"auto"`` picks).
"""
from __future__ import annotations

import numpy as np

from ...validate import int_array
from .. import device_of as _device_of
from .. import is_tensor as _is_torch
from .. import resolve_backend

__all__ = ["copy_rows", "copy_rows_unchecked", "gather_rows", "scatter_rows", "TransferError"]


class TransferError(RuntimeError):
    """A transfer failed part-way; the destination rows it names may hold partly written data."""


def _check_rows(name: str, a) -> tuple[int, int]:
    if _is_torch(a):
        import torch
        if a.dtype != torch.uint8:
            raise TypeError(f"{name} must hold uint8 rows, got {a.dtype}")
        contiguous = a.is_contiguous()
    elif isinstance(a, np.ndarray):
        if a.dtype != np.uint8:
            raise TypeError(f"{name} must hold uint8 rows, got dtype {a.dtype}")
        contiguous = a.flags.c_contiguous
        if not a.flags.writeable and name in ("dst", "out"):
            raise ValueError(f"{name} must be writeable")
    else:
        raise TypeError(f"{name} must be a NumPy array or torch tensor, got {type(a).__name__}")
    if a.ndim != 2:
        raise ValueError(f"{name} must be 2-D (rows, row_bytes), got shape {tuple(a.shape)}")
    if not contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    return int(a.shape[0]), int(a.shape[1])


def _check_index(name: str, idx, n_rows: int) -> np.ndarray:
    if _is_torch(idx):
        idx = idx.detach().cpu().numpy()
    return int_array(name, idx, ndim=1, lo=-1, below=n_rows, shape_doc="(n,), -1 = padding")


def _check_mode(mode) -> str:
    from .torch_ops import MODES
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


def _span(a) -> tuple[str, int, int]:
    """``(device kind, first byte address, end address)`` of a contiguous array or tensor."""
    if _is_torch(a):
        start = a.data_ptr()
        return a.device.type, start, start + a.numel() * a.element_size()
    start = a.__array_interface__["data"][0]
    return "cpu", start, start + a.nbytes


def _unaliased(src, s_idx: np.ndarray, dst) -> tuple:
    """``(src, s_idx)`` to copy from: as given when ``src`` and ``dst`` do not share memory; otherwise the rows the
    copy reads, taken out of ``src`` first (indices renumbered), so that every backend reads every source row
    before it writes any -- as the torch kernel's gather does, and as if ``src`` were a separate array (row by row,
    the NumPy reference and Numba would read rows the same call had already overwritten)."""
    (kind_s, lo_s, hi_s), (kind_d, lo_d, hi_d) = _span(src), _span(dst)
    if kind_s != kind_d or hi_s <= lo_d or hi_d <= lo_s or lo_s == hi_s:
        return src, s_idx
    keep = np.flatnonzero(s_idx >= 0)
    picked = src[s_idx[keep]] if not _is_torch(src) else src[_torch_index(s_idx[keep], src.device)]
    new_idx = np.full(s_idx.shape, -1, np.int64)
    new_idx[keep] = np.arange(keep.size)
    return picked, new_idx                              # a fancy index copies: picked shares nothing with dst


def _torch_index(idx: np.ndarray, device):
    import torch
    return torch.from_numpy(np.ascontiguousarray(idx, np.int64)).to(device)


def _dispatch(src, s_idx, dst, d_idx, backend: str, mode: str):
    cuda = next((d for d in (_device_of(src), _device_of(dst)) if d.startswith("cuda")), None)
    backend = resolve_backend(backend, device=cuda)
    if backend != "torch" and (_is_torch(src) or _is_torch(dst)):
        src = src.numpy() if _is_torch(src) else src
        dst = dst.numpy() if _is_torch(dst) else dst
    if backend == "reference":
        from .reference import copy_rows as k
        k(src, s_idx, dst, d_idx)
    elif backend == "numba":
        from .numba_cpu import copy_rows as k
        k(src, s_idx, dst, d_idx)
    else:
        import torch
        from .torch_ops import copy_rows as k
        t = lambda a: a if _is_torch(a) else torch.from_numpy(a)          # noqa: E731 (zero-copy view)
        k(t(src), torch.from_numpy(s_idx), t(dst), torch.from_numpy(d_idx), mode=mode)


def copy_rows(src, src_idx, dst, dst_idx, *, backend: str = "auto", mode: str = "auto"):
    """``dst[dst_idx[i]] = src[src_idx[i]]`` for every ``i`` where both indices are >= 0; returns ``dst``.

    Raises ``ValueError`` for indices outside ``[-1, rows)``, a destination row named twice, or rows of different
    widths; ``TypeError`` for non-uint8 rows or non-integer indices. When ``src`` and ``dst`` share memory (one
    array, or overlapping views), every source row is read before any row is written, on every backend. ``mode``
    applies to the torch backend (``"auto" | "zero_copy" | "staged" | "per_row"``, see :mod:`ess.kernels.transfer.torch_ops`); the other backends
    have one way to copy and ignore a valid ``mode``, but any other value is a ``ValueError`` on every backend."""
    mode = _check_mode(mode)
    n_src, w_src = _check_rows("src", src)
    n_dst, w_dst = _check_rows("dst", dst)
    if w_src != w_dst:
        raise ValueError(f"src rows are {w_src} B but dst rows are {w_dst} B")
    s_idx = _check_index("src_idx", src_idx, n_src)
    d_idx = _check_index("dst_idx", dst_idx, n_dst)
    if s_idx.shape != d_idx.shape:
        raise ValueError(f"src_idx and dst_idx must have the same length, got {s_idx.shape[0]} and {d_idx.shape[0]}")
    valid = d_idx[(s_idx >= 0) & (d_idx >= 0)]
    if valid.size > 1:
        v = np.sort(valid)
        if (v[1:] == v[:-1]).any():
            raise ValueError(f"dst_idx names destination row {int(v[1:][v[1:] == v[:-1]][0])} more than once")
    src, s_idx = _unaliased(src, s_idx, dst)
    _dispatch(src, s_idx, dst, d_idx, backend, mode)
    return dst


def copy_rows_unchecked(src, src_idx, dst, dst_idx, *, backend: str = "auto", mode: str = "auto"):
    """:func:`copy_rows` without validation, for callers that built the indices themselves (the storage step):
    ``src_idx``/``dst_idx`` int64, in range, distinct destinations."""
    _dispatch(src, src_idx, dst, dst_idx, backend, mode)
    return dst


def gather_rows(src, idx, *, out=None, backend: str = "auto", mode: str = "auto"):
    """``out[i] = src[idx[i]]`` (rows where ``idx[i] == -1`` stay as they are: zero when ``out`` is allocated here).

    ``out`` defaults to a NumPy array, or a torch tensor on ``src``'s device."""
    mode = _check_mode(mode)
    n, w = _check_rows("src", src)
    idx = _check_index("idx", idx, n)
    if out is None:
        if _is_torch(src):
            import torch
            out = torch.zeros((idx.shape[0], w), dtype=torch.uint8, device=src.device)
        else:
            out = np.zeros((idx.shape[0], w), dtype=np.uint8)
    k, w_out = _check_rows("out", out)
    if (k, w_out) != (idx.shape[0], w):
        raise ValueError(f"out must have shape ({idx.shape[0]}, {w}), got {tuple(out.shape)}")
    src, idx = _unaliased(src, idx, out)
    _dispatch(src, idx, out, np.arange(k, dtype=np.int64), backend, mode)       # distinct destinations by design
    return out


def scatter_rows(rows, idx, dst, *, backend: str = "auto", mode: str = "auto"):
    """``dst[idx[i]] = rows[i]`` for ``idx[i] >= 0``; a destination row named twice is a ``ValueError``."""
    k, _ = _check_rows("rows", rows)
    return copy_rows(rows, np.arange(k, dtype=np.int64), dst, idx, backend=backend, mode=mode)
