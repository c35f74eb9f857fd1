"""Locality studies: a trace recorded from the real lightning indexer on synthetic activations (notebook 04)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..attention import indexer_scores, topk_indices
from ..quant import encode_indexer_keys
from ..specs import ModelSpec, model_spec
from ..tracegen import _check_generator_args
from ..traces import Trace, TraceRecorder
from ..validate import real

__all__ = ["record_indexer_trace"]


def record_indexer_trace(model: Any = "tiny", *, context_len: int = 1024, steps: int = 16, batch: int = 2,
                         mtp: int = 1, warmup_windows: int = 4, query_correlation: float = 0.9, seed: int = 0,
                         backend: str = "auto") -> Trace:
    """Record a trace from the real lightning indexer and top-K of :mod:`ess.attention` with synthetic activations.

    Keys are random (one FP8 indexer entry per token, :func:`ess.quant.encode_indexer_keys`); each layer's query
    follows an AR(1) walk ``q <- c q + sqrt(1 - c^2) e`` from one query token to the next (``c`` =
    ``query_correlation``, a design choice: there is no trained model here), so adjacent steps select overlapping
    sets for the indexer's own reasons. Every step, the indexer scores the cache that exists before the step
    (``context_len + t * mtp`` tokens) for each of the ``mtp`` query tokens, :func:`ess.attention.topk_indices`
    picks the model's top-K, and a :class:`TraceRecorder` stores the union. The warmup windows are the top-K of the
    last ``warmup_windows`` prefill positions.
    """
    model = model_spec(model) if isinstance(model, str) else model
    if not isinstance(model, ModelSpec):
        raise TypeError(f"model must be a ModelSpec or preset name, got {type(model).__name__}")
    k = model.index_topk
    context_len, k, mtp, steps, batch, n_layers, warmup_windows, seed = _check_generator_args(
        context_len, k, mtp, steps, batch, model.n_layers, warmup_windows, seed)
    query_correlation = real("query_correlation", query_correlation, lo=0.0, hi=1.0, hi_open=True)
    rng = np.random.default_rng(seed)
    Hi, D = model.index_n_heads, model.index_head_dim
    n_pos = context_len + steps * mtp
    c = float(query_correlation)
    rec = TraceRecorder(context_len=context_len, k=k, n_layers=n_layers, batch=batch, mtp=mtp,
                        meta={"recorded_from": "ess.attention.indexer_scores + topk_indices", "model": model.name,
                              "activations": "synthetic: random keys, AR(1) queries",
                              "query_correlation": c, "seed": seed})
    keys = [encode_indexer_keys(rng.standard_normal((batch, n_pos, D)).astype(np.float32), model)
            for _ in range(n_layers)]                                            # per layer (B, n_pos, D + 4)
    weights = [np.abs(rng.standard_normal((batch, Hi))).astype(np.float32) for _ in range(n_layers)]
    q = [rng.standard_normal((batch, Hi, D)).astype(np.float32) for _ in range(n_layers)]

    def advance(layer):
        q[layer] = (c * q[layer] + np.sqrt(1 - c * c) * rng.standard_normal((batch, Hi, D))).astype(np.float32)
        return q[layer]

    def select(layer, length):
        s = indexer_scores(advance(layer), weights[layer], keys[layer], np.full(batch, length, np.int64),
                           backend=backend)
        return topk_indices(s, k)                                                # (B, k)

    if warmup_windows:
        for layer in range(n_layers):
            wins = [select(layer, context_len - warmup_windows + i + 1) for i in range(warmup_windows)]
            rec.observe_windows(layer, np.stack(wins, axis=1))                    # (B, W, k)
    for t in range(steps):
        length = context_len + t * mtp
        for layer in range(n_layers):
            rec.observe(layer, np.stack([select(layer, length) for _ in range(mtp)], axis=1))
        rec.end_step()
    tr = rec.to_trace()
    return Trace(tr.indices, tr.context_len, tr.k, tr.mtp, seed, tr.windows, tr.meta)
