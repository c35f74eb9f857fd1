"""The real model against transformers' LlamaForCausalLM loaded from the same GGUF file (float32, offline).

Measured on the 37-token chat prompt below (this machine, torch 2.13 CPU, transformers 5.24): weights identical
after undoing GGUF's Q/K row permutation; logits max |diff| 7.1e-5 with logits up to 37.6 in magnitude (1.9e-6
relative to the largest). Tolerance: 5e-4 absolute on every logit, i.e. float32 rounding through 30 layers
with headroom, and far below what a wrong RoPE layout, norm or head grouping gives (differences of order 1-10).
"""
import os

import numpy as np
import pytest
import torch

from ess.llm import generate, load_model, model_path
from llm_helpers import torch_threads

os.environ["HF_HUB_OFFLINE"] = "1"          # transformers reads the local GGUF file only; never the hub

pytestmark = pytest.mark.slow
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
ATOL = 5e-4


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def ours():
    return load_model()


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoModelForCausalLM
    path = model_path()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model.eval()


def test_weights_equal_after_unpermuting(ours, hf):
    sd = hf.state_dict()
    for layer in (0, 17, 29):
        p = f"model.layers.{layer}."
        lw = ours.weights.layers[layer]
        for name, mine in (("self_attn.q_proj", lw.wq), ("self_attn.k_proj", lw.wk), ("self_attn.v_proj", lw.wv),
                           ("self_attn.o_proj", lw.wo), ("mlp.gate_proj", lw.w_gate), ("mlp.down_proj", lw.w_down)):
            np.testing.assert_array_equal(sd[p + name + ".weight"].numpy(), mine, err_msg=p + name)
    np.testing.assert_array_equal(sd["model.embed_tokens.weight"].numpy(), ours.weights.embedding)


def test_logits_match(ours, hf):
    ids = ours.tokenizer.encode_chat(QUESTION)
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0]                       # (T, V)
    got = ours.model.forward(ids)[0]
    diff = (got - want).abs()
    assert diff.max().item() < ATOL, f"max |diff| {diff.max().item():.3g}"
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_greedy_tokens_match(ours, hf):
    """20 greedy tokens (EOS not stopping) from the chat prompt: identical token ids."""
    ids = ours.tokenizer.encode_chat([{"role": "user", "content": "Write a sentence about the sea."}])
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          max_new_tokens=20, min_new_tokens=20, do_sample=False)
    want = out[0, len(ids):].tolist()
    got = generate(ours.model, ours.tokenizer, ids, max_new_tokens=20, stop_at_eos=False)
    assert got.token_ids == want


def test_answers_paris(ours):
    g = generate(ours.model, ours.tokenizer, QUESTION, max_new_tokens=20)
    assert "Paris" in g.text and g.stopped_at_eos
    assert g.token_ids[-1] == ours.tokenizer.eos_id
