"""How sparse decoding differs from dense decoding for the real model: reported, never asserted (top-K attention is
an approximation; the offload of its entries is not).

* **teacher forced** on held text: both read the same tokens; the share of steps whose most likely next token is the
  same, and the perplexity of the held text under each (``exp(-mean log p)``);
* **free running**: both generate greedily from the same prompt; how many tokens they share before they first
  differ.
"""
from __future__ import annotations

import numpy as np

from .engine import DecodeEngine, Prefilled

__all__ = ["compare_teacher_forced", "compare_greedy"]


def compare_teacher_forced(engine: DecodeEngine, pre: Prefilled, held, *, topk: int | None = None) -> dict:
    """Sparse (all resident) and dense decoding of the held tokens ``held`` (B, steps + 1) after the prompts of
    ``pre`` (prefilled with ``keep_dense=True``). Returns ``agreement`` (share of steps with the same argmax),
    ``perplexity_sparse``, ``perplexity_dense``, ``steps``, ``topk``."""
    held = np.asarray(held)
    if held.ndim != 2 or held.shape[0] != pre.batch:
        raise ValueError(f"held must be (B={pre.batch}, steps + 1) token ids, got shape {held.shape}")
    steps = held.shape[1] - 1
    sparse = engine.decode(pre, steps, offload=False, feed=held, keep_logits=True, topk=topk, timing=False)
    dense = engine.decode_dense(pre, steps, feed=held, keep_logits=True)
    same = (sparse.logits.argmax(-1) == dense.logits.argmax(-1)).float().mean().item()
    return {"agreement": same, "perplexity_sparse": float(np.exp(-sparse.logprobs.mean())),
            "perplexity_dense": float(np.exp(-dense.logprobs.mean())), "steps": steps,
            "topk": sparse.config["topk"]}


def compare_greedy(engine: DecodeEngine, pre: Prefilled, steps: int, *, topk: int | None = None) -> dict:
    """Greedy sparse (all resident) and dense generation of ``steps`` tokens from the same prefill. Returns
    ``common_prefix`` per request (tokens equal before the first difference), ``agreement`` (share of equal
    tokens position by position) and both token arrays."""
    sparse = engine.decode(pre, steps, offload=False, topk=topk, timing=False)
    dense = engine.decode_dense(pre, steps)
    eq = sparse.tokens == dense.tokens
    prefix = [int(np.argmin(row)) if not row.all() else row.size for row in eq]
    return {"common_prefix": prefix, "agreement": float(eq.mean()), "sparse_tokens": sparse.tokens,
            "dense_tokens": dense.tokens, "topk": sparse.config["topk"]}
