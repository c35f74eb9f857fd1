"""The real model's part of one layer of a decode step (:func:`ess.decode.run_layer`): its indexer selects, its
attention reads the K/V entries where they lie in the device pool, its output projection and MLP finish the layer.

The model-specific wiring only; the order of the stages and the copies is :mod:`ess.decode`'s. Everything stays on
the engine's device (CPU or CUDA, the same torch code): the only values that go to the host are the selected
positions and their scores, which the cache's plan needs.
"""
from __future__ import annotations

import numpy as np
import torch

from .attention import StepAttention
from .indexer import IndexerCache
from .kv import kv_entries

__all__ = ["KVWiring"]


def _span(rows) -> slice:
    """Consecutive rows (every schedule selects a whole batch or one of its halves) as a slice."""
    rows = np.asarray(rows)
    lo, hi = int(rows[0]), int(rows[-1]) + 1
    if hi - lo != rows.size:
        raise ValueError(f"rows must be consecutive, got {rows.tolist()}")
    return slice(lo, hi)


class KVWiring:
    """One layer of one decode step of a Llama-architecture model (:class:`ess.llm.LlamaModel`) over a cache of
    K/V entries (:mod:`ess.engine.kv`).

    Parameters
    ----------
    model : LlamaModel
    layer : int
    hidden : (B, 1, D)
        The residual stream entering the layer.
    q, k, v : (B, H, 1, hd), (B, Hkv, 1, hd), (B, Hkv, 1, hd)
        The new token's queries, keys and values (:meth:`ess.llm.LlamaModel.attention_inputs`).
    indexer : IndexerCache
        The device-resident indexer keys of every cached token (the new token's are not there yet); request ``b``
        of the batch is the indexer's row ``b``.
    topk : int
        K, the entries each request selects (fewer while its context is shorter).
    pool : (slots, 2, Hkv, hd) float32
        The cache's device pool seen through :func:`ess.engine.kv.kv_view` (read in place).
    att : StepAttention
        The run's attention buffers (this layer begins on them; their kernels' backend is theirs, the indexer's
        and top-K's the indexer cache's).

    After :meth:`finish`, ``hidden_out`` (B, 1, D) is the residual stream leaving the layer."""

    def __init__(self, model, layer: int, hidden: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 indexer: IndexerCache, topk: int, pool: torch.Tensor, att: StepAttention):
        self.model, self.layer, self.hidden = model, layer, hidden
        self.indexer, self.topk, self.pool = indexer, int(topk), pool
        self.q = q[:, :, 0].contiguous()                                              # (B, H, hd)
        self.att = att
        att.begin(self.q, k[:, :, 0], v[:, :, 0], pool)
        self._k, self._v = k, v
        self.hidden_out = None

    def select(self, rows):
        """Top-K of the indexer for requests ``rows``: positions (n, K) int64 in position order, -1 padded, and
        their scores (n, K) float64 (the heat policy's weights), NumPy arrays on the host (the plan's input)."""
        span = _span(rows)
        return self.indexer.select(self.layer, self.q[span], span, self.topk)

    def attend(self, plans, rows, part):
        """Score the ``part`` (``"all"``, ``"hits"``, ``"misses"``) of each plan's entries where they lie in the
        device pool, in the attention's columns (a selected entry at top-K position ``j`` is column ``j``)."""
        bs, cols, slots = [], [], []
        for plan, r in zip(plans, np.asarray(rows).tolist()):
            if part == "all":
                pos = np.flatnonzero(plan.indices >= 0)
            else:
                pos = plan.hit_pos if part == "hits" else plan.miss_pos
            bs.append(np.full(pos.size, r, np.int64))
            cols.append(pos)
            slots.append(np.asarray(plan.slots)[pos])
        self.att.load(np.concatenate(bs), np.concatenate(cols), np.concatenate(slots))

    def merge(self, rows):
        self.att.combine(rows)

    def finish(self):
        self.hidden_out = self.model.attention_output(self.layer, self.hidden, self.att.output())

    def new_entries(self) -> torch.Tensor:
        """This layer's entry of each request's new token, (B, entry_bytes) uint8 on the device."""
        return kv_entries(self._k, self._v)[:, 0]

    def new_keys(self) -> torch.Tensor:
        """This layer's keys of each request's new token, (B, Hkv, hd) float32 (for the indexer cache)."""
        return self._k[:, :, 0]
