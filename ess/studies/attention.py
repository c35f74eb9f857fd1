"""Attention studies of notebook 03, on synthetic inputs (stated as such): what the indexer selects on a small
example, FP8 against BF16 latent storage, and the lossless check (attention read through the tiered cache against
attention over all-resident caches)."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..attention import (indexer_scores, resident_attention, softmax_scale,
                         sparse_mla_decode, topk_indices)
from ..decode import decode_layer
from ..kernels import resolve_backend
from ..layout import latent_layout, padded_tokens, pool_slots, step_entries
from ..quant import encode_indexer_keys, encode_latent
from ..specs import ModelSpec
from ..storage import TieredCache
from ..validate import positive_int

__all__ = ["indexer_selection_example", "storage_precision", "lossless_check"]


def indexer_selection_example(model: ModelSpec, n_tokens: int = 96, *, topk: int | None = None, lag: int = 8,
                              seed: int = 0, backend: str = "auto") -> dict:
    """What the indexer picks on a small synthetic prefill: every position ``t`` queries with the key of token
    ``t - lag`` plus noise (a "look back" pattern), and token 0 has a large key (an attention sink). Returns
    ``scores`` (T, T) (row t = query at position t, -inf where s > t) and ``indices`` (T, K)."""
    from ..validate import integer, non_negative_int
    n_tokens, lag, seed = positive_int("n_tokens", n_tokens), non_negative_int("lag", lag), integer("seed", seed)
    topk = None if topk is None else positive_int("topk", topk)
    n_tokens = positive_int("n_tokens", n_tokens)
    rng = np.random.default_rng(seed)
    D, Hi = model.index_head_dim, model.index_n_heads
    k = rng.standard_normal((n_tokens, D))
    k[0] *= 3.0                                                            # the sink
    q = np.stack([k[max(t - lag, 0)] for t in range(n_tokens)])[:, None, :] + 0.5 * rng.standard_normal(
        (n_tokens, Hi, D))
    keys = np.broadcast_to(encode_indexer_keys(k, model), (n_tokens, n_tokens, D + 4))
    w = np.full((n_tokens, Hi), 1.0 / Hi)
    scores = indexer_scores(q, w, keys, np.arange(1, n_tokens + 1), backend=backend)
    return {"scores": scores, "indices": topk_indices(scores, topk or model.index_topk), "lag": lag}


def _random_latents(rng, model: ModelSpec, shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    return (rng.standard_normal(shape + (model.kv_lora_rank,)).astype(np.float32),
            rng.standard_normal(shape + (model.qk_rope_head_dim,)).astype(np.float32))


def storage_precision(model: ModelSpec, n_tokens: int = 4096, *, topk: int | None = None, n_heads: int | None = None,
                      batch: int = 2, seed: int = 0, backend: str = "reference"):
    """FP8 (656 B) against BF16 (1,152 B) latent storage on the same inputs: bytes per entry and the error of the
    attention output against float64 attention over the unquantised latents.

    Inputs are synthetic (standard-normal c_KV, rope and queries; top-K chosen at random), not model activations;
    the error is an **output** error of one attention layer, not a task-accuracy loss. Returns a DataFrame with one
    row per format: ``entry_bytes``, ``rel_rms_error`` (||o - o*|| / ||o*|| over all heads), ``max_abs_error``,
    ``lse_max_abs_error``.
    """
    from ..validate import integer
    n_tokens, batch, seed = positive_int("n_tokens", n_tokens), positive_int("batch", batch), integer("seed", seed)
    topk = None if topk is None else positive_int("topk", topk)
    n_heads = None if n_heads is None else positive_int("n_heads", n_heads)
    import pandas as pd
    rng = np.random.default_rng(seed)
    H = n_heads or model.n_heads
    K = min(topk or model.index_topk, n_tokens)
    ckv, rope = _random_latents(rng, model, (batch, n_tokens))
    q = rng.standard_normal((batch, H, model.latent_dim)).astype(np.float32)
    idx = np.stack([rng.choice(n_tokens, K, replace=False) for _ in range(batch)]).astype(np.int64)
    scale = softmax_scale(model)
    exact_o = np.empty((batch, H, model.kv_lora_rank))
    exact_l = np.empty((batch, H))
    for b in range(batch):
        lat = np.concatenate([ckv[b, idx[b]], rope[b, idx[b]]], axis=1).astype(np.float64)      # (K, Dqk)
        s = scale * (q[b].astype(np.float64) @ lat.T)
        m = s.max(axis=1, keepdims=True)
        p = np.exp(s - m)
        exact_o[b] = p @ lat[:, :model.kv_lora_rank] / p.sum(axis=1, keepdims=True)
        exact_l[b] = (m + np.log(p.sum(axis=1, keepdims=True)))[:, 0]
    rows = []
    for dtype in ("fp8", "bf16"):
        res = sparse_mla_decode(q, encode_latent(ckv, rope, model, dtype), idx, model, dtype=dtype, backend=backend)
        err = res.out - exact_o
        rows.append({"dtype": dtype, "entry_bytes": latent_layout(model, dtype).entry_bytes,
                     "rel_rms_error": float(np.linalg.norm(err) / np.linalg.norm(exact_o)),
                     "max_abs_error": float(np.abs(err).max()),
                     "lse_max_abs_error": float(np.abs(res.lse - exact_l).max()),
                     "config": {"model": model.name, "L": n_tokens, "K": K, "H": H, "batch": batch, "seed": seed,
                                "inputs": "standard normal, random top-K", "backend": backend}})
    return pd.DataFrame(rows)


def lossless_check(model: ModelSpec, *, ratios: Sequence[float] = (0.1, 0.3, 1.0),
                   policies: Sequence[str] = ("lru", "fifo"), batch: int = 2, n_tokens: int | None = None,
                   steps: int = 4, backend: str = "auto", seed: int = 0):
    """Decode steps through :class:`ess.storage.TieredCache` against attention over all-resident caches, for each
    ratio and policy: returns a DataFrame with the misses served and whether every output and log-sum-exp was
    bit-for-bit equal.

    The pool of each ratio has :func:`ess.layout.pool_slots` slots (``floor(ratio x page-padded tokens)``);
    ``n_tokens=None`` takes the shortest whole-page context, and at least
    4 K tokens, at which the smallest ratio's pool holds one step's K entries. A given ``n_tokens`` too short for a
    ratio is a ``ValueError``."""
    from ..validate import integer
    batch, steps, seed = positive_int("batch", batch), positive_int("steps", steps), integer("seed", seed)
    n_tokens = None if n_tokens is None else positive_int("n_tokens", n_tokens)
    import pandas as pd
    K = model.index_topk
    ratios = list(ratios)
    if not ratios:
        raise ValueError("ratios must name at least one sparse-memory ratio")
    if n_tokens is None:
        L = max(4 * K, padded_tokens(model, math.ceil(K / min(float(r) for r in ratios))))
    else:
        L = positive_int("n_tokens", n_tokens)
    capacities = {r: pool_slots(model, r, L, need=step_entries(model, L)) for r in ratios}              # all checked before running
    rows = []
    for ratio in ratios:
        for policy in policies:
            rng = np.random.default_rng(seed)
            ckv, rope = _random_latents(rng, model, (batch, model.n_layers, L))
            lat = encode_latent(ckv, rope, model)
            keys = [encode_indexer_keys(rng.standard_normal((L, model.index_head_dim)), model) for _ in range(batch)]
            cache = TieredCache(model, capacity=capacities[ratio], policy=policy)
            ids = [f"r{b}" for b in range(batch)]
            for rid, e in zip(ids, lat):
                cache.add_request(rid, e)
            # two query "topics" taken in turn: entries picked two steps ago come back, and hit only if the pool
            # kept them (so the ratio shows in the miss count)
            topics = rng.standard_normal((2, batch, model.index_n_heads, model.index_head_dim))
            w = rng.random((batch, model.index_n_heads))
            equal, misses, hits = True, 0, 0
            for step in range(steps):
                qi = topics[step % 2] + 0.2 * rng.standard_normal(topics.shape[1:])
                for layer in range(model.n_layers):
                    q = rng.standard_normal((batch, model.n_heads, model.latent_dim)).astype(np.float32)
                    res = decode_layer(cache, layer, ids, qi, w, keys, q, model, backend=backend)
                    base = resident_attention(q, [e[layer] for e in lat], res.indices, model, backend=backend)
                    equal &= bool(np.array_equal(res.out, base.out) and np.array_equal(res.lse, base.lse))
                    misses += sum(int(r.miss_pos.size) for r in res.steps)
                    hits += sum(int(r.hit_pos.size) for r in res.steps)
            rows.append({"ratio": ratio, "policy": policy, "capacity": cache.capacity, "misses": misses,
                         "hits": hits, "bitwise_equal": equal})
    df = pd.DataFrame(rows)
    df.attrs["config"] = {"model": model.name, "batch": batch, "L": L, "K": K, "steps": steps,
                          "layers": model.n_layers, "backend": resolve_backend(backend)}
    return df
