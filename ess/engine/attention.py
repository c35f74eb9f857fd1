"""Sparse attention of one decode step over the entries it selected, computed so that the result does not depend on
where the entries were when the step began: bit for bit the same whether every entry was resident, or some were
copied in while attention had started on the others (the DA schedule).

Per request ``b`` the step reads ``K + 1`` **columns**: columns ``0 .. K - 1`` the selected cache entries in top-K
order (position order; padding: empty columns at the end), column ``K`` the request's own new entry (computed this
step, never read from the cache). The work is the kernel family :mod:`ess.kernels.kv_attention`, per column
independent of every other column:

* :meth:`StepAttention.load` scores entries where they lie in the device pool (any rows, any subset of columns):
  ``q_h . k / sqrt(hd)`` per column, whose bits do not depend on which other columns are scored with it, and notes
  each column's slot;
* :meth:`StepAttention.combine` then, per request, the softmax over all ``K + 1`` columns and the weighted sum of
  the values, read from their slots, always over the same shapes.

So DA's "attention over the hits" is the hits' scores, its "attention over the misses" the misses', and its merge
the softmax and weighted sum over both; the serial schedule scores every column at once. The arithmetic is float32
and equals dense attention over the same entries to rounding (a test checks both). The same code runs on the CPU
and on CUDA (``backend``: Numba reads a CPU pool in place; torch gathers on the pool's device).

One :class:`StepAttention` serves a whole decode run (its buffers are allocated once and reused by every layer of
every step: :meth:`StepAttention.begin` starts a layer).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..kernels import as_kernel_array, resolve_backend
from ..kernels.kv_attention import get as _kernels

__all__ = ["StepAttention"]


class StepAttention:
    """The attention buffers of a decode run of ``batch`` requests reading up to ``width`` (K) entries each.

    Parameters
    ----------
    batch, width : int
        B and K.
    n_heads, n_kv_heads, head_dim : int
        H, Hkv, hd.
    device : torch device
    backend : the kernels' backend (:func:`ess.kernels.resolve_backend`)

    The kernels (:mod:`ess.kernels.kv_attention`) are called directly, their backend resolved once: the buffers'
    shapes are fixed here, and the public functions' checks would cost, per layer, more than the kernels at a short
    context."""

    def __init__(self, batch: int, width: int, n_heads: int, n_kv_heads: int, head_dim: int, device="cpu",
                 backend: str = "auto"):
        from ..validate import positive_int
        batch, width, n_heads, n_kv_heads, head_dim = (positive_int(n, v) for n, v in (
            ("batch", batch), ("width", width), ("n_heads", n_heads), ("n_kv_heads", n_kv_heads),
            ("head_dim", head_dim)))
        B, K, H = batch, width, n_heads
        self.B, self.K, self.H, self.Hkv, self.hd, self.G = B, K, H, n_kv_heads, head_dim, H // n_kv_heads
        self.scale = 1.0 / math.sqrt(head_dim)
        self.device = torch.device(device)
        self.backend = resolve_backend(backend, device=str(self.device))
        self._kernel = _kernels(self.backend)
        self.scores = torch.empty((B, H, K + 1), dtype=torch.float32, device=self.device)   # (B, H, columns)
        self.slots = np.full((B, K), -1, np.int64)                    # each column's pool slot (host: the plans')
        self.out = torch.zeros((B, H, head_dim), dtype=torch.float32, device=self.device)
        self._scores_k = as_kernel_array(self.scores, self.backend)
        self._out_k = as_kernel_array(self.out, self.backend)
        self.q = self.own_v = self.pool = None

    def begin(self, q: torch.Tensor, k_own: torch.Tensor, v_own: torch.Tensor, pool: torch.Tensor) -> None:
        """Start one layer: the new token's queries ``q`` (B, H, hd), its own key and value ``k_own``, ``v_own``
        (B, Hkv, hd), and the layer's device pool seen as ``(slots, 2, Hkv, hd)`` float32 (a view of its bytes,
        read in place); every cache column empty (``-inf``, no slot) until :meth:`load` scores it."""
        self.q, self.own_v, self.pool = q.contiguous(), v_own.contiguous(), pool
        self._q_k, self._own_k, self._pool_k = (as_kernel_array(a, self.backend) for a in (self.q, self.own_v, pool))
        self.scores.fill_(-math.inf)
        self.slots.fill(-1)
        qg = self.q.view(-1, self.Hkv, self.G, self.hd)
        self.scores[:, :, self.K] = (qg * k_own[:, :, None, :]).sum(-1).view(-1, self.H) * self.scale

    def _index(self, a):
        a = np.ascontiguousarray(a, np.int64)
        return torch.from_numpy(a).to(self.device) if self.backend == "torch" else a

    def load(self, b: np.ndarray, cols: np.ndarray, rows: np.ndarray) -> None:
        """Score the entries in pool slots ``rows`` in columns ``cols`` of requests ``b`` (``(n,)`` int arrays;
        ``cols`` in ``0 .. K - 1``)."""
        if len(rows) == 0:
            return
        self.slots[b, cols] = rows
        self._kernel.score_columns(self._q_k, self._pool_k, self._index(b), self._index(cols), self._index(rows),
                                   self.scale, self._scores_k)

    def combine(self, rows) -> None:
        """Softmax over all columns and the weighted sum of the values, for each request in ``rows``."""
        self._kernel.combine_columns(self._scores_k, self._pool_k, self._index(self.slots), self._own_k,
                                     self._index(rows), self._out_k)

    def output(self) -> torch.Tensor:
        """(B, H, 1, hd): what :meth:`ess.llm.LlamaModel.attention_output` takes."""
        return self.out[:, :, None, :]
