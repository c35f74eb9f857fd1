"""torch kernel of top-K selection (CPU and CUDA), same signature as :mod:`.reference` on tensors of one device:
``torch.topk`` finds the K-th highest score of each row; every score above it is kept and, of those equal to it,
the first ones by a running count (ties to the lower position); the kept positions are listed in ascending order."""
from __future__ import annotations

__all__ = ["topk_positions"]


def topk_positions(scores, k, out) -> None:
    import torch
    B, L = scores.shape
    kk = min(k, L)
    if L == 0 or B == 0:
        out.fill_(-1)
        return
    thr = torch.topk(scores, kk, dim=1, sorted=False).values.amin(dim=1, keepdim=True)       # (B, 1)
    visible = scores > float("-inf")
    above = scores > thr
    ties = (scores == thr) & visible
    need = kk - above.sum(dim=1, keepdim=True)                                                # (B, 1)
    keep = above | (ties & (ties.cumsum(dim=1) <= need))                                      # (B, L)
    pos = torch.arange(L, device=scores.device).expand(B, L)
    key = torch.where(keep, pos, L)                                                           # L: not kept
    first = torch.topk(key, kk, dim=1, largest=False, sorted=True).values                     # (B, kk) ascending
    out.fill_(-1)
    out[:, :kk] = torch.where(first < L, first, -1)
