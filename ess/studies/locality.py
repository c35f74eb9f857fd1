"""Locality studies of notebook 04: a trace recorded from the real lightning indexer on synthetic activations, and the
rule that chose the default synthetic trace model (the LRU hit rate with a buffer of 2 x K against vLLM's figure)."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..attention import indexer_scores, topk_indices
from ..cachesim import misses_per_step
from ..quant import encode_indexer_keys
from ..specs import ModelSpec, model_spec
from ..tracegen import _check_generator_args, geometry
from ..traces import Trace, TraceRecorder
from ..validate import real

__all__ = ["record_indexer_trace", "VLLM_BUFFER_2K_HIT_RATE", "buffer_hit_rate", "choose_trace_model"]


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


# vLLM RFC #48203 via paper-facts.md: 80-90 % hit rate on DeepSeek-V3.2 with a GPU buffer of 2 x top-k per request
# (an independent figure, not calibration data: nothing is fitted to it)
VLLM_BUFFER_2K_HIT_RATE = (0.80, 0.90)


def buffer_hit_rate(context_len: int, *, buffer_k: int = 2, steps: int = 128, batch: int = 2, seed: int = 0,
                    trace_model: str | None = None, **generator: Any) -> float:
    """LRU hit rate of a synthetic trace with a pool of ``buffer_k`` x K entries per (request, layer): 1 - misses / K
    over the second half of ``steps`` decode steps, MTP 1 (one top-K selection per step), LRU with the warmup
    windows, every layer of the model (:func:`ess.tracegen.geometry`), mean over layers and ``batch`` requests.
    ``generator`` keywords go to :func:`ess.tracegen.synthetic_streams` (e.g. ``drift_rho``)."""
    k = geometry()[1]
    m = misses_per_step(context_len, buffer_k * k / context_len, mtp=1, steps=steps, batch=batch, seed=seed,
                        trace_model=trace_model, **generator)                         # (n_layers, steps)
    return float(1 - m[:, steps // 2:].mean() / k)


def choose_trace_model(hit_rates: Mapping[str, float],
                       band: tuple[float, float] = VLLM_BUFFER_2K_HIT_RATE) -> tuple[str, dict]:
    """The selection rule of ``data/locality/README.md``, fixed before either model was measured: the default trace
    model is the one whose 2 x K hit rate (:func:`buffer_hit_rate`) is closer to ``band`` (distance 0 inside it, else
    to the nearer end); a tie keeps ``"uniform"``. Returns ``(chosen, {model: distance})``."""
    low, high = band
    distance = {m: max(low - h, h - high, 0.0) for m, h in hit_rates.items()}
    return ("drift" if distance["drift"] < distance["uniform"] else "uniform"), distance
