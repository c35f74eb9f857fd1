"""Attention kernels: the lightning-indexer scores and sparse MLA decode attention (MQA mode), read straight from the
stored cache bytes so that dequantisation is part of every kernel.

Three files with the same signatures (see :mod:`.reference` for the shapes): ``reference`` (NumPy, float64, the
oracle), ``numba_cpu`` (parallel over batch and heads / key chunks, dequantisation fused with the dot products) and
``torch_ops`` (CPU and CUDA). The public wrappers live in :mod:`ess.attention`.

Latent layouts are described to a kernel by ``(fp8, kv_rank, rope_dim, tile)``: FP8 entries are
``[kv_rank fp8 | kv_rank // tile float32 scales | rope_dim bf16]``, BF16 entries ``[kv_rank bf16 | rope_dim bf16]``
(the layouts of :mod:`ess.layout`). Indexer entries are ``[D fp8 | 1 float32 scale]``.
"""
from __future__ import annotations

from .. import family_module

__all__ = ["get"]


def get(backend: str):
    """The kernel module of a resolved backend name (``"reference"``, ``"numba"`` or ``"torch"``)."""
    return family_module(__name__, backend)
