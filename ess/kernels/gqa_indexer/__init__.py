"""The real model's indexer (:mod:`ess.engine.indexer`): the score of every cached token of a batch of requests,
from FP8 e4m3 copies of the keys of a grouped-query-attention model (``Hkv`` KV heads, ``H = G Hkv`` query heads)::

    score(b, s) = sum_h softmax_s( q[b, h] . k8[b, s, h // G] / sqrt(hd) )       for s < lengths[b], else -inf

Three files with one signature (shapes in :mod:`.reference`): ``reference`` (NumPy float64, the oracle),
``numba_cpu`` (one pass over the FP8 bytes in place, vectorised) and ``torch_ops`` (CPU and CUDA). The public
function :func:`gqa_indexer_scores` validates, allocates and picks the backend with
:func:`ess.kernels.resolve_backend` (``"auto"``: ``"torch"`` for CUDA tensors, ``"numba"`` otherwise). DeepSeek's
lightning indexer (a ReLU sum over 132-byte keys) is another operation: :mod:`ess.kernels.attention`.
"""
from __future__ import annotations

import numpy as np

from .. import as_kernel_array, device_of, family_module, is_tensor, resolve_backend

__all__ = ["gqa_indexer_scores", "get"]


def get(backend: str):
    """The kernel module of a resolved backend name (``"reference"``, ``"numba"`` or ``"torch"``)."""
    return family_module(__name__, backend)


def _check(name, a, dtype: str, ndim: int, tensors: bool):
    if is_tensor(a) != tensors:
        kind = "torch tensors" if tensors else "NumPy arrays"
        raise TypeError(f"{name} must be a {kind[:-1]} like codes (all NumPy arrays or all torch tensors), got "
                        f"{type(a).__name__}")
    if not tensors and not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array or a torch tensor, got {type(a).__name__}")
    got = str(a.dtype)
    if (got[6:] if tensors else got) != dtype or a.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-D {dtype} array, got {got} of shape {tuple(a.shape)}")
    if not (a.is_contiguous() if tensors else a.flags.c_contiguous):
        raise ValueError(f"{name} must be C-contiguous")


def gqa_indexer_scores(q, codes, scales, lengths, *, backend: str = "auto", out=None):
    """Scores ``(B, L)`` float32 of every token slot of every request (module docstring; ``-inf`` at
    ``s >= lengths[b]``).

    ``q`` (B, H, hd) float32 the new token's queries (after RoPE); ``codes`` (B, L, Hkv hd) uint8 and ``scales``
    (B, L, Hkv) float32 the cached keys (:func:`ess.engine.indexer.quantize_keys`); ``lengths`` (B,) int64, the
    cached tokens of each request (<= L). All NumPy arrays, or all torch tensors on one device (the result is then
    a tensor there). ``out`` an optional (B, L) float32 destination of the same kind. Shapes, dtypes and
    contiguity are checked; the bytes are not (a NaN byte gives NaN scores for its request)."""
    tensors = is_tensor(codes)
    _check("codes", codes, "uint8", 3, tensors)
    B, L, D = codes.shape
    _check("q", q, "float32", 3, tensors)
    _check("scales", scales, "float32", 3, tensors)
    _check("lengths", lengths, "int64", 1, tensors)
    H, hd = q.shape[1], q.shape[2]
    Hkv = scales.shape[2]
    if q.shape[0] != B or Hkv == 0 or H % Hkv or D != Hkv * hd or tuple(scales.shape[:2]) != (B, L):
        raise ValueError(f"q (B, H, hd), codes (B, L, Hkv hd) and scales (B, L, Hkv) do not fit: q "
                         f"{tuple(q.shape)}, codes {tuple(codes.shape)}, scales {tuple(scales.shape)} (H must be a "
                         f"multiple of Hkv)")
    if tuple(lengths.shape) != (B,):
        raise ValueError(f"lengths must have shape ({B},), got {tuple(lengths.shape)}")
    devices = {str(a.device) for a in (q, codes, scales, lengths)} if tensors else ()
    if len(devices) > 1:
        raise ValueError(f"q, codes, scales and lengths must be on one device, got {sorted(devices)}")
    if out is None:
        if tensors:
            import torch
            out = torch.empty((B, L), dtype=torch.float32, device=codes.device)
        else:
            out = np.empty((B, L), np.float32)
    else:
        _check("out", out, "float32", 2, tensors)
        if tuple(out.shape) != (B, L) or device_of(out) != device_of(codes):
            raise ValueError(f"out must have shape ({B}, {L}) on {device_of(codes)}, got {tuple(out.shape)}")
    be = resolve_backend(backend, device=device_of(codes))
    get(be).indexer_scores(*(as_kernel_array(a, be) for a in (q, codes, scales, lengths, out)))
    return out
