"""torch kernel of the real model's indexer (CPU and CUDA): same signature as :mod:`.reference`, on tensors of one
device. Per request, over its own tokens only (so that a request's scores do not depend on the other requests of
the batch or on the buffer's length, as with the other kernels): the FP8 keys widened to float32 by torch's own
``float8_e4m3fn`` conversion (exact), one matrix product per KV head group, the softmax over the tokens and the sum
over the heads; float32 throughout.
"""
from __future__ import annotations

import math

__all__ = ["indexer_scores"]


def indexer_scores(q, codes, scales, lengths, out) -> None:
    import torch
    B, H, hd = q.shape
    L, Hkv = scales.shape[1], scales.shape[2]
    G = H // Hkv
    out.fill_(float("-inf"))
    for b, n in enumerate(lengths.tolist()):                       # one host read of the lengths
        n = min(int(n), L)
        if n == 0:
            continue
        k = codes[b, :n].view(torch.float8_e4m3fn).to(torch.float32).view(n, Hkv, hd)           # (n, Hkv, hd)
        logits = torch.matmul(k.transpose(0, 1), q[b].view(Hkv, G, hd).transpose(1, 2))       # (Hkv, n, G)
        logits = logits * (scales[b, :n].T[:, :, None] * (1.0 / math.sqrt(hd)))
        logits = logits.permute(0, 2, 1).reshape(H, n)                                         # (H, n)
        out[b, :n] = torch.softmax(logits, dim=-1).sum(dim=0)
