"""Sparse attention of one decode step over the entries it selected, computed so that the result does not depend on
where the entries were when the step began: bit for bit the same whether every entry was resident, or some were
copied in while attention had started on the others (the DA schedule).

Per request ``b`` the step reads ``K + 1`` **columns**: columns ``0 .. K - 1`` the selected cache entries in top-K
order (position order; padding: empty columns at the end), column ``K`` the request's own new entry (computed this
step, never read from the cache). Work per column is independent of every other column:

* :meth:`StepAttention.load` gathers entries from the device pool (any rows, any subset of columns) into their
  columns of a work buffer and computes their scores ``q_h . k / sqrt(hd)`` with an element-wise product and a sum
  over the head dimension, whose result for a column does not depend on which other columns are computed with it
  (a matrix product's does: its blocking depends on the shape);
* :meth:`StepAttention.combine` then, per request, the softmax over all ``K + 1`` columns and the weighted sum of
  the values, always over the same shapes.

So DA's "attention over the hits" is the hits' gather and scores, its "attention over the misses" the misses', and
its merge the softmax and weighted sum over both; the serial schedule loads every column at once. The arithmetic
is float32 and equals dense attention over the same entries to rounding (a test checks both). The same torch code
runs on the CPU and on CUDA.

One :class:`StepAttention` serves a whole decode run (its buffers are allocated once and reused by every layer of
every step: :meth:`StepAttention.begin` starts a layer).
"""
from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["StepAttention"]


class StepAttention:
    """The attention work buffers of a decode run of ``batch`` requests reading up to ``width`` (K) entries each.

    Parameters
    ----------
    batch, width : int
        B and K.
    n_heads, n_kv_heads, head_dim : int
        H, Hkv, hd.
    device : torch device
    """

    def __init__(self, batch: int, width: int, n_heads: int, n_kv_heads: int, head_dim: int, device="cpu"):
        B, K, H, Hkv, hd = batch, int(width), n_heads, n_kv_heads, head_dim
        self.B, self.K, self.H, self.Hkv, self.hd, self.G = B, K, H, Hkv, hd, H // Hkv
        self.scale = 1.0 / math.sqrt(hd)
        self.device = torch.device(device)
        # the gathered entries; columns past a request's valid entries are never written and stay zero (their
        # weight is exactly 0), and a column that is valid once stays valid (contexts only grow)
        self.kv = torch.zeros((B, K, 2, Hkv, hd), dtype=torch.float32, device=self.device)
        self.scores = torch.empty((B, K + 1, H), dtype=torch.float32, device=self.device)
        self.out = torch.empty((B, H, hd), dtype=torch.float32, device=self.device)
        self.q = self.own_v = None

    def begin(self, q: torch.Tensor, k_own: torch.Tensor, v_own: torch.Tensor) -> None:
        """Start one layer: the new token's queries ``q`` (B, H, hd) and its own key and value ``k_own``, ``v_own``
        (B, Hkv, hd); every cache column unscored (``-inf``) until :meth:`load` scores it."""
        self.q = q
        self.own_v = v_own
        self.scores.fill_(-math.inf)
        self.scores[:, self.K] = self._score(q, k_own)

    def _score(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Scores (n, H) of n keys ``k`` (n, Hkv, hd) for the queries ``q`` (n, H, hd): a product and a sum over hd
        per column (the same bits whatever else is computed with it)."""
        qg = q.view(-1, self.Hkv, self.G, self.hd)                                        # (n, Hkv, G, hd)
        return (qg * k[:, :, None, :]).sum(-1).view(-1, self.H) * self.scale            # (n, H)

    def load(self, b: np.ndarray, cols: np.ndarray, pool: torch.Tensor, rows: np.ndarray) -> None:
        """Gather the entries ``pool[rows]`` into columns ``cols`` of requests ``b`` and score them.

        ``pool`` the device pool seen as ``(slots, 2, Hkv, hd)`` float32 (a view of its bytes); ``b``, ``cols``,
        ``rows`` (n,) int arrays; ``cols`` in ``0 .. K - 1``."""
        if len(rows) == 0:
            return
        dev = self.device
        rows_t = torch.from_numpy(np.ascontiguousarray(rows, np.int64)).to(dev)
        b_t = torch.from_numpy(np.ascontiguousarray(b, np.int64)).to(dev)
        cols_t = torch.from_numpy(np.ascontiguousarray(cols, np.int64)).to(dev)
        kv = pool.index_select(0, rows_t)                                                   # (n, 2, Hkv, hd)
        self.kv[b_t, cols_t] = kv
        self.scores[b_t, cols_t] = self._score(self.q.index_select(0, b_t), kv[:, 0])      # (n, H)

    def combine(self, rows) -> None:
        """Softmax over all columns and the weighted sum of the values, for each request in ``rows``."""
        for b in np.asarray(rows, np.int64).tolist():
            p = torch.softmax(self.scores[b], dim=0)                                        # (K+1, H)
            p = p.T.reshape(self.Hkv, self.G, self.K + 1)                                   # (Hkv, G, K+1)
            v = torch.cat([self.kv[b, :, 1], self.own_v[b, None]], 0).transpose(0, 1)       # (Hkv, K+1, hd)
            self.out[b] = torch.matmul(p, v).reshape(self.H, self.hd)

    def output(self) -> torch.Tensor:
        """(B, H, 1, hd): what :meth:`ess.llm.LlamaModel.attention_output` takes."""
        return self.out[:, :, None, :]
