"""NumPy oracle of top-K selection, written to be read::

    topk_positions(scores (B, L) float, k, out (B, k) int64)

Per row: sort the positions by score, highest first, ties to the lower position (a stable sort of ``-scores``);
keep the first ``k`` that are not ``-inf``; write them in ascending position order, then ``-1`` to width ``k``.
"""
from __future__ import annotations

import numpy as np

__all__ = ["topk_positions"]


def topk_positions(scores, k, out) -> None:
    B = scores.shape[0]
    out[...] = -1
    for b in range(B):
        row = np.asarray(scores[b], np.float64)
        order = np.argsort(-row, kind="stable")[:k]                       # stable: ties keep position order
        chosen = np.sort(order[~np.isneginf(row[order])])
        out[b, :chosen.size] = chosen
