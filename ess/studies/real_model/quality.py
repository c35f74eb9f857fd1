"""How the real model's decoding compares: sparse against dense (reported, never asserted: top-K attention is an
approximation), and offloaded against all-resident (asserted: offload moves storage, not the maths).

* **lossless offload**: :func:`offload_settings` the grid of ratio x policy x schedule notebook 09 tries,
  :func:`compare_offload` each against the all-resident run, tokens and logits bit for bit;

* **teacher forced** on held text: both read the same tokens; the share of steps whose most likely next token is the
  same, and the perplexity of the held text under each (``exp(-mean log p)``);
* **free running**: both generate greedily from the same prompt; how many tokens they share before they first
  differ.
"""
from __future__ import annotations

import numpy as np

from ...engine import DecodeConfig, DecodeEngine, Prefilled

__all__ = ["offload_settings", "compare_offload", "compare_teacher_forced", "compare_greedy"]


def offload_settings(ratios, policies, schedules, *, at_ratio: float = 0.25, link_GB_per_s: float = 0.05) -> list:
    """The offload settings to check for losslessness: every policy x schedule at ``at_ratio``, then every other
    ratio of ``ratios`` under LRU and DA; each a :class:`~ess.engine.config.DecodeConfig` keeping its logits, on a
    ``link_GB_per_s`` link."""
    grid = [(at_ratio, p, s) for p in policies for s in schedules]
    grid += [(r, "lru", "da") for r in ratios if r != at_ratio]
    return [DecodeConfig(ratio=r, policy=p, schedule=s, link_GB_per_s=link_GB_per_s, keep_logits=True)
            for r, p, s in grid]


def compare_offload(engine: DecodeEngine, pre: Prefilled, steps: int, settings, *, baseline=None):
    """Decode ``steps`` steps of ``pre`` under every offload setting of ``settings`` (:class:`DecodeConfig`) and
    compare each with the all-resident run (``baseline``, decoded here when ``None``): a DataFrame with ``ratio``,
    ``policy``, ``schedule``, ``misses`` and ``identical`` (tokens and logits bit for bit the same)."""
    import pandas as pd
    import torch
    if baseline is None:
        baseline = engine.decode(pre, steps, offload=False, keep_logits=True)
    rows = []
    for cfg in settings:
        r = engine.decode(pre, steps, cfg.replace(offload=True, keep_logits=True))
        same = bool(np.array_equal(r.tokens, baseline.tokens) and torch.equal(r.logits, baseline.logits))
        rows.append({"ratio": cfg.ratio, "policy": cfg.policy, "schedule": cfg.schedule,
                     "misses": int(r.misses.sum()), "identical": same})
    return pd.DataFrame(rows, columns=["ratio", "policy", "schedule", "misses", "identical"])


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
