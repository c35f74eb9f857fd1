"""torch kernels for the CPU and CUDA (torch imported lazily).

Same signature as :func:`ess.kernels.transfer.reference.copy_rows`, on torch tensors, plus ``mode``, which says how
rows cross between host and device when one side is a CUDA tensor and the other a host tensor:

* ``"zero_copy"`` (FlashTrans): one CUDA kernel reads (or writes) the pinned host rows directly through Unified
  Virtual Addressing; the host tensor must be pinned (``pin_memory=True``). Rows cross PCIe once, no staging.
* ``"staged"``: the rows are gathered on the source side into one contiguous buffer, copied across in one transfer,
  and scattered on the destination side.
* ``"per_row"``: one copy (one ``cudaMemcpyAsync``) per row, the baseline the paper measured at 0.79 GB/s H2D
  ([BLOG], data/hardware/links.yaml ``flashtrans.memcpy_per_entry_h2d_GB_per_s``).

When both tensors are on the same device all modes give the same result; ``"per_row"`` still loops.
"""
from __future__ import annotations

__all__ = ["copy_rows", "cuda_alias", "MODES"]

MODES = ("auto", "zero_copy", "staged", "per_row")


class _CudaArrayInterface:
    """Minimal ``__cuda_array_interface__`` (version 3) around a raw pointer."""

    def __init__(self, ptr: int, shape: tuple, typestr: str):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "strides": None, "version": 3}


def cuda_alias(host):
    """A CUDA tensor that aliases the pinned host tensor ``host`` (no copy): kernels that read or write it go
    over PCIe to host memory (UVA). ``host`` must be a contiguous, pinned CPU uint8 tensor."""
    import torch

    if host.device.type != "cpu" or not host.is_pinned():
        raise ValueError("zero-copy needs a pinned host tensor (torch.empty(..., pin_memory=True))")
    if not host.is_contiguous():
        raise ValueError("zero-copy needs a contiguous host tensor")
    return torch.as_tensor(_CudaArrayInterface(host.data_ptr(), tuple(host.shape), "|u1"), device="cuda")


def _valid_pairs(src_idx, dst_idx):
    keep = (src_idx >= 0) & (dst_idx >= 0)
    return src_idx[keep], dst_idx[keep]


def copy_rows(src, src_idx, dst, dst_idx, *, mode: str = "auto"):
    """``dst[dst_idx[i]] = src[src_idx[i]]`` for every pair where both indices are >= 0; returns ``dst``.

    ``src``/``dst``: (N, W) / (M, W) uint8 tensors (CPU or CUDA); ``src_idx``/``dst_idx``: (K,) int64 CPU
    tensors. ``mode="auto"`` is ``"zero_copy"`` when exactly one side is on CUDA, the host side is pinned and
    torch accepts the alias (:func:`cuda_alias`), ``"staged"`` otherwise."""
    import torch

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    s_idx, d_idx = _valid_pairs(src_idx, dst_idx)
    for name, idx, n in (("src_idx", s_idx, src.shape[0]), ("dst_idx", d_idx, dst.shape[0])):
        if idx.numel() and int(idx.max()) >= n:          # on CUDA an index past the end is a device-side assert
            raise ValueError(f"{name} must be < {n} (the rows), got {int(idx.max())}")
    if mode == "per_row":
        s_list, d_list = s_idx.tolist(), d_idx.tolist()
        non_blocking = src.device != dst.device
        for s, d in zip(s_list, d_list):
            dst[d].copy_(src[s], non_blocking=non_blocking)        # one copy per row: the baseline
        return dst
    if (src.device == dst.device and d_idx.numel() == dst.shape[0] == src_idx.numel()
            and src.untyped_storage().data_ptr() != dst.untyped_storage().data_ptr()
            and bool((d_idx == torch.arange(d_idx.numel(), device=d_idx.device)).all())):
        # a whole gather on one device into separate memory (out[i] = src[idx[i]], no pair skipped): one pass into
        # dst, not a gather into a temporary and a copy (benchmarks/README.md: 1.3 -> 5.1 GB/s on one CPU thread)
        torch.index_select(src, 0, s_idx.to(src.device), out=dst)
        return dst
    cross = src.device.type != dst.device.type
    host_side = (dst if src.device.type == "cuda" else src) if cross else None
    alias = None
    if mode == "auto":
        mode = "staged"
        if cross and host_side.is_pinned() and host_side.is_contiguous():
            try:                                  # zero-copy where this torch/driver lets us alias pinned memory
                alias, mode = cuda_alias(host_side), "zero_copy"
            except (RuntimeError, ValueError, TypeError):
                pass
    if mode == "zero_copy" and cross:
        dev = src.device if src.device.type == "cuda" else dst.device
        s_idx = s_idx.to(dev, non_blocking=True)
        d_idx = d_idx.to(dev, non_blocking=True)
        alias = cuda_alias(host_side) if alias is None else alias
        if src.device.type == "cpu":                             # H2D: the kernel reads pinned host rows
            dst.index_copy_(0, d_idx, alias.index_select(0, s_idx))
        else:                                                    # D2H: the kernel writes pinned host rows
            alias.index_copy_(0, d_idx, src.index_select(0, s_idx))
        return dst
    # staged (or both tensors on one device): gather where the source is, one copy, scatter where dst is
    rows = src.index_select(0, s_idx.to(src.device))           # (K', W) contiguous
    if rows.device != dst.device:
        rows = rows.to(dst.device, non_blocking=False)
    dst.index_copy_(0, d_idx.to(dst.device), rows)
    return dst
