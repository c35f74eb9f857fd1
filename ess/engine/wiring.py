"""The real model's part of one layer of a decode step (:func:`ess.decode.run_layer`): its indexer selects, its
attention reads the K/V entries where they lie in the device pool, its output projection and MLP finish the layer.

The model-specific wiring only; the order of the stages and the copies is :mod:`ess.decode`'s.
"""
from __future__ import annotations

import numpy as np
import torch

from .attention import StepAttention
from .indexer import IndexerCache, indexer_scores, topk_positions
from .kv import kv_entries

__all__ = ["KVWiring"]


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
        The device-resident indexer keys of every cached token (the new token's are not there yet).
    request_ids : list
    topk : int
        K, the entries each request selects (fewer while its context is shorter).
    pool : (slots, 2, Hkv, hd) float32
        The cache's device pool seen through :func:`ess.engine.kv.kv_view` (read in place).

    After :meth:`finish`, ``hidden_out`` (B, 1, D) is the residual stream leaving the layer."""

    def __init__(self, model, layer: int, hidden: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 indexer: IndexerCache, request_ids: list, topk: int, pool: torch.Tensor):
        self.model, self.layer, self.hidden = model, layer, hidden
        self.indexer, self.request_ids, self.topk, self.pool = indexer, request_ids, int(topk), pool
        self.q = q[:, :, 0]                                                            # (B, H, hd)
        self.att = StepAttention(self.q, torch.stack([k[:, :, 0], v[:, :, 0]], dim=1), self.topk)
        self._new = kv_entries(k, v)[:, 0]                                             # (B, entry_bytes)
        self.hidden_out = None

    def select(self, rows):
        """Top-K of the indexer for requests ``rows``: positions (n, K) int64 in position order, -1 padded, and
        their scores (n, K) float64 (the heat policy's weights)."""
        idx = np.full((len(rows), self.topk), -1, np.int64)
        scores = np.zeros((len(rows), self.topk), np.float64)
        for i, r in enumerate(np.asarray(rows).tolist()):
            codes, sc = self.indexer.keys(self.request_ids[r], self.layer)
            s = indexer_scores(self.q[r], codes, sc)                                   # (n,)
            top = topk_positions(s, self.topk)
            if isinstance(top, torch.Tensor):
                s, top = s[top].cpu().numpy(), top.cpu().numpy()
            else:
                s = s[top]
            idx[i, :top.size], scores[i, :top.size] = top, s
        return idx, scores

    def attend(self, plans, rows, part):
        """Gather the ``part`` (``"all"``, ``"hits"``, ``"misses"``) of each plan's entries from the device pool
        into the attention's columns (a selected entry at top-K position ``j`` goes to column ``j + 1``)."""
        bs, cols, slots = [], [], []
        for plan, r in zip(plans, np.asarray(rows).tolist()):
            if part == "all":
                pos = np.flatnonzero(plan.indices >= 0)
            else:
                pos = plan.hit_pos if part == "hits" else plan.miss_pos
            bs.append(np.full(pos.size, r, np.int64))
            cols.append(pos + 1)
            slots.append(np.asarray(plan.slots)[pos])
        self.att.load(np.concatenate(bs), np.concatenate(cols), self.pool, np.concatenate(slots))

    def merge(self, rows):
        self.att.combine(rows)

    def finish(self):
        self.hidden_out = self.model.attention_output(self.layer, self.hidden, self.att.output())

    def new_entries(self) -> torch.Tensor:
        """This layer's entry of each request's new token, (B, entry_bytes) uint8."""
        return self._new
