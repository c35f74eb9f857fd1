"""Shared helpers of the engine tests: a small random Llama model (fast enough for property tests) and its engine."""
from __future__ import annotations

import numpy as np
import torch

from ess.engine import DecodeEngine
from ess.llm import LlamaConfig, LlamaModel, LlamaWeights

# small but with the real model's structure: grouped query heads (6 share 2 KV heads), RoPE, a context long enough
# for prompts of a few hundred tokens
SMALL = LlamaConfig(n_layers=3, d_model=48, d_ffn=64, n_heads=6, n_kv_heads=2, head_dim=8, rope_base=10000.0,
                    rms_eps=1e-5, context_length=512, vocab_size=97)


def small_engine(seed: int = 0) -> DecodeEngine:
    w = LlamaWeights.random(SMALL, seed=seed, dtype=np.float32)
    return DecodeEngine(LlamaModel(w, SMALL, dtype=torch.float32))


def prompts(lengths, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, SMALL.vocab_size, n).tolist() for n in lengths]
