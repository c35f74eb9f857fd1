"""Top-K selection, the one rule of the library (DeepSeek's lightning indexer in :mod:`ess.attention`, the real
model's indexer in :mod:`ess.engine`): per row of scores ``(B, L)``, the positions of the ``min(K, visible)``
highest scores, **in position order** (ascending), padded with ``-1`` to width K; ties at the boundary go to the
lower position; ``-inf`` marks an invisible token, never chosen.

Why position order (not score order): a top-K result is a set, and ascending positions are its one canonical
order, the same whatever sort or selection algorithm found it (``torch.topk``, a partition, an argsort) and
whatever the backend; attention sums its entries in that order, so a backend change cannot change the result's
rounding; a copy of the misses walks the host pool upward; and the cache's policies see the entries of a step in
the order of the tokens, so under LRU the older of two entries read in the same step goes first. Selection costs
O(L) (a partition), not the O(L log L) of a full sort by score.

Three files with one signature (:mod:`.reference`): ``reference`` (NumPy, a stable sort, the oracle), ``numba_cpu``
(a partition for the threshold, then one scan) and ``torch_ops`` (CPU and CUDA: ``torch.topk`` for the threshold,
ties resolved by a running count). :func:`topk_positions` validates, allocates and picks the backend with
:func:`ess.kernels.resolve_backend`.
"""
from __future__ import annotations

import numpy as np

from ...validate import fits_in_memory, positive_int
from .. import as_kernel_array, device_of, family_module, is_tensor, resolve_backend

__all__ = ["MAX_PADDED_K", "topk_positions", "get"]

#: the widest top-K result that pads past its rows' length L: a ``k`` above both L and this is refused (its columns
#: past L are all -1, and a width near 2**31 would take gigabytes). Design choice: 64 x DeepSeek-V3.2's K of 2,048
#: (paper-facts.md "DeepSeek-V3.2-Exp geometry"), wide enough for any real top-K.
MAX_PADDED_K = 1 << 17


def get(backend: str):
    """The kernel module of a resolved backend name (``"reference"``, ``"numba"`` or ``"torch"``)."""
    return family_module(__name__, backend)


def topk_positions(scores, k: int, *, backend: str = "auto", out=None):
    """``(B, k)`` int64 positions of the top-``k`` scores of each row (module docstring): a NumPy array for a NumPy
    ``scores``, a tensor on its device for a tensor (into ``out`` when given: a C-contiguous (B, k) int64 array of
    the same kind). ``scores`` (B, L) float32 or float64, C-contiguous; a ``k`` above both L and
    :data:`MAX_PADDED_K` is a ``ValueError``; the values of ``scores`` are not checked here
    (:func:`ess.attention.topk_indices` checks them: NaN and ``+inf`` are refused)."""
    k = positive_int("k", k)
    tensors = is_tensor(scores)
    if not tensors and not isinstance(scores, np.ndarray):
        raise TypeError(f"scores must be a NumPy array or a torch tensor, got {type(scores).__name__}")
    dtype = str(scores.dtype).replace("torch.", "")
    if dtype not in ("float32", "float64") or scores.ndim != 2:
        raise ValueError(f"scores must be a 2-D float32 or float64 array (B, L), got {dtype} of shape "
                         f"{tuple(scores.shape)}")
    if not (scores.is_contiguous() if tensors else scores.flags.c_contiguous):
        raise ValueError("scores must be C-contiguous")
    B, L = scores.shape
    if k > max(L, MAX_PADDED_K):
        raise ValueError(f"k is too large: k={k:,} is wider than the rows (L={L:,}) and than "
                         f"MAX_PADDED_K={MAX_PADDED_K:,}; its columns past L would all be -1 padding")
    fits_in_memory("k", B * k * 8, f"the ({B}, k) int64 result")
    if out is None:
        if tensors:
            import torch
            out = torch.empty((B, k), dtype=torch.int64, device=scores.device)
        else:
            out = np.empty((B, k), np.int64)
    elif not (is_tensor(out) or isinstance(out, np.ndarray)):
        raise TypeError(f"out must be None or a ({B}, {k}) int64 array like scores, got {type(out).__name__}")
    elif (is_tensor(out) != tensors or tuple(out.shape) != (B, k) or str(out.dtype).replace("torch.", "") != "int64"
          or device_of(out) != device_of(scores)):
        raise ValueError(f"out must be a ({B}, {k}) int64 array like scores, got {type(out).__name__} "
                         f"{tuple(out.shape)}")
    be = resolve_backend(backend, device=device_of(scores))
    get(be).topk_positions(as_kernel_array(scores, be), k, as_kernel_array(out, be))
    return out
