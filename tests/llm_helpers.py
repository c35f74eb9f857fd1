"""Shared helpers of the tests of ess.llm: a tiny Llama GGUF file written the way llama.cpp's converter writes one
(Q and K rows permuted for llama.cpp's RoPE), a tiny byte-level vocabulary, and thread settings for torch."""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from ess.llm import LlamaConfig, LlamaWeights
from ess.llm.weights import permute_rope_rows

# odd sizes on purpose: 6 query heads share 2 KV heads (groups of 3), head_dim 6 (so H * hd = 36 != d_model 30),
# FFN 37; rms_eps as GGUF stores it (float32)
TINY = LlamaConfig(n_layers=2, d_model=30, d_ffn=37, n_heads=6, n_kv_heads=2, head_dim=6, rope_base=1000.0,
                   rms_eps=float(np.float32(1e-5)), context_length=64, vocab_size=0x100 + 3)


def byte_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode alphabet: the 256 one-character tokens of a byte-level BPE, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


def tiny_vocab():
    """259 tokens: ``<s>`` (0, control), ``</s>`` (1, control), the 256 byte symbols, and ``"ab"`` (one merge)."""
    tokens = ["<s>", "</s>"] + byte_alphabet() + ["ab"]
    types = [3, 3] + [1] * 257
    return tokens, ["a b"], types


def write_tiny_gguf(path, config: LlamaConfig = TINY, seed: int = 0, template: str | None = None):
    """Write a tiny random Llama model as a GGUF file (F32 tensors) and return its weights in HF layout.

    The file stores ``permute_rope_rows`` of the Q and K weights, as llama.cpp's converter does.
    """
    import gguf

    weights = LlamaWeights.random(config, seed=seed, dtype=np.float32)
    tokens, merges, types = tiny_vocab()
    assert len(tokens) == config.vocab_size
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_block_count(config.n_layers)
    w.add_context_length(config.context_length)
    w.add_embedding_length(config.d_model)
    w.add_feed_forward_length(config.d_ffn)
    w.add_head_count(config.n_heads)
    w.add_head_count_kv(config.n_kv_heads)
    w.add_rope_freq_base(config.rope_base)
    w.add_layer_norm_rms_eps(config.rms_eps)
    w.add_rope_dimension_count(config.head_dim)
    if config.head_dim * config.n_heads != config.d_model:
        w.add_key_length(config.head_dim)
        w.add_value_length(config.head_dim)
    w.add_vocab_size(config.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types(types)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_add_bos_token(False)
    if template:
        w.add_chat_template(template)
    w.add_tensor("token_embd.weight", weights.embedding)
    w.add_tensor("output_norm.weight", weights.final_norm)
    for i, lw in enumerate(weights.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", lw.attn_norm)
        w.add_tensor(p + "attn_q.weight", permute_rope_rows(lw.wq, config.n_heads))
        w.add_tensor(p + "attn_k.weight", permute_rope_rows(lw.wk, config.n_kv_heads))
        w.add_tensor(p + "attn_v.weight", lw.wv)
        w.add_tensor(p + "attn_output.weight", lw.wo)
        w.add_tensor(p + "ffn_norm.weight", lw.ffn_norm)
        w.add_tensor(p + "ffn_gate.weight", lw.w_gate)
        w.add_tensor(p + "ffn_up.weight", lw.w_up)
        w.add_tensor(p + "ffn_down.weight", lw.w_down)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return weights


@contextlib.contextmanager
def torch_threads(n: int):
    """Run with ``n`` torch threads (then restore). One thread keeps the many small ops of a 135M-parameter model
    from stalling on thread hand-offs when other processes load the two cores."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
