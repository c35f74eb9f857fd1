"""Sparse attention of one decode step over the entries it selected, computed so that the result does not depend on
where the entries were when the step began: bit for bit the same whether every entry was resident, or some were
copied in while attention had started on the others (the DA schedule).

Per request ``b`` the step reads a **work buffer** of ``K + 1`` columns: column 0 the request's own new entry
(computed this step, never read from the cache), columns ``1 .. K`` the selected cache entries in position order
(padding: empty columns). Work per column is independent of every other column:

* :meth:`StepAttention.load` gathers entries from the device pool (any rows, any subset of columns) into their
  columns and computes their scores ``q_h . k / sqrt(hd)`` with an element-wise product and a sum over the head
  dimension, whose result for a column does not depend on which other columns are computed with it (a matrix
  product's does: its blocking depends on the shape);
* :meth:`StepAttention.combine` then, per request, the softmax over all ``K + 1`` columns and the weighted sum of
  the values, always over the same shapes.

So DA's "attention over the hits" is the hits' gather and scores, its "attention over the misses" the misses', and
its merge the softmax and weighted sum over both; the serial schedule loads every column at once. The arithmetic
is float32 and equals dense attention over the same entries to rounding (a test checks both).
"""
from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["StepAttention"]


class StepAttention:
    """The attention of one layer of one decode step for a batch.

    Parameters
    ----------
    q : (B, H, hd) float32
        The new token's queries (after RoPE).
    own : (B, 2, Hkv, hd) float32
        The new token's key and value (column 0).
    width : int
        K, the most entries one request selects.
    """

    def __init__(self, q: torch.Tensor, own: torch.Tensor, width: int):
        B, H, hd = q.shape
        Hkv = own.shape[2]
        self.B, self.H, self.hd, self.Hkv, self.G, self.K = B, H, hd, Hkv, H // Hkv, int(width)
        self.scale = 1.0 / math.sqrt(hd)
        self.q = q.contiguous()
        self.buf = torch.zeros((B, self.K + 1, 2, Hkv, hd), dtype=q.dtype, device=q.device)
        self.buf[:, 0] = own
        self.scores = torch.full((B, self.K + 1, H), -math.inf, dtype=q.dtype, device=q.device)   # (B, K+1, H)
        self.out = torch.zeros((B, H, hd), dtype=q.dtype, device=q.device)

    def _score(self, b: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """Scores (n, H) of n entries ``kv`` (n, 2, Hkv, hd) for the queries of requests ``b`` (n,)."""
        q = self.q.index_select(0, b).view(-1, self.Hkv, self.G, self.hd)                 # (n, Hkv, G, hd)
        return (q * kv[:, 0, :, None, :]).sum(-1).view(-1, self.H) * self.scale           # (n, H)

    def load(self, b: np.ndarray, cols: np.ndarray, pool: torch.Tensor, rows: np.ndarray) -> None:
        """Gather the entries ``pool[rows]`` into columns ``cols`` of requests ``b`` and score them.

        ``pool`` the device pool seen as ``(slots, 2, Hkv, hd)`` float32 (a view of its bytes); ``b``, ``cols``,
        ``rows`` (n,) int arrays; ``cols`` in ``1 .. K``."""
        if len(rows) == 0:
            return
        dev = self.q.device
        rows_t = torch.as_tensor(np.asarray(rows, np.int64), device=dev)
        b_t = torch.as_tensor(np.asarray(b, np.int64), device=dev)
        flat = b_t * (self.K + 1) + torch.as_tensor(np.asarray(cols, np.int64), device=dev)
        kv = pool.index_select(0, rows_t)                                                   # (n, 2, Hkv, hd)
        self.buf.view(-1, 2, self.Hkv, self.hd)[flat] = kv
        self.scores.view(-1, self.H)[flat] = self._score(b_t, kv)

    def combine(self, rows) -> None:
        """Softmax over all columns and the weighted sum of the values, for each request in ``rows``."""
        for b in np.asarray(rows, np.int64).tolist():
            own = self.buf[b, 0:1]                                                         # (1, 2, Hkv, hd)
            self.scores[b, 0] = self._score(torch.tensor([b], device=self.q.device), own)[0]
            p = torch.softmax(self.scores[b], dim=0)                                        # (K+1, H)
            p = p.T.reshape(self.Hkv, self.G, self.K + 1)                                   # (Hkv, G, K+1)
            v = self.buf[b, :, 1].transpose(0, 1)                                           # (Hkv, K+1, hd)
            self.out[b] = torch.matmul(p, v).reshape(self.H, self.hd)

    def output(self) -> torch.Tensor:
        """(B, H, 1, hd): what :meth:`ess.llm.LlamaModel.attention_output` takes."""
        return self.out[:, :, None, :]
