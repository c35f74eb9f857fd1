"""The real model run by ess alone: incremental decoding equals the full forward pass, a ragged batch equals each
prompt alone, the layer-by-layer pieces, and bad input refused before any work."""
import time

import pytest
import torch

from ess.llm import generate, load_model, reference_text, reference_text_ids
from llm_helpers import torch_threads


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def lm():
    return load_model()


def test_kv_cache_decode_equals_full_forward(lm):
    """Prefill 12 tokens, decode 8 one at a time: each step's logits equal the full forward pass at that position
    (float32; the two paths sum in different orders, so equality is to 1e-4 on logits of size ~30)."""
    ids = lm.tokenizer.encode("The quick brown fox jumps over the lazy dog because it wanted to see what lies "
                              "beyond the old stone wall.")
    assert len(ids) >= 20
    ids = ids[:20]
    full = lm.model.forward(ids)[0]                                        # (20, V)
    logits, cache = lm.model.prefill(ids[:12])
    torch.testing.assert_close(logits[0], full[11], rtol=0, atol=1e-4)
    for t in range(12, 20):
        torch.testing.assert_close(lm.model.decode([ids[t]], cache)[0], full[t], rtol=0, atol=1e-4)


def test_ragged_batch_equals_each_alone(lm):
    prompts = [lm.tokenizer.encode(t) for t in ("Hello there, how", "One two three four five six seven", "Hi")]
    logits, cache = lm.model.prefill(prompts)
    for b, p in enumerate(prompts):
        alone, _ = lm.model.prefill(p)
        torch.testing.assert_close(logits[b], alone[0], rtol=0, atol=1e-4)
    step = lm.model.decode([11, 12, 13], cache)
    for b, p in enumerate(prompts):
        alone, c = lm.model.prefill(p)
        torch.testing.assert_close(step[b], lm.model.decode([11 + b], c)[0], rtol=0, atol=1e-4)


def test_reference_text_slices(lm):
    """Python's language reference topics are long enough for the full 8K context several times over, and slices
    are consecutive pieces of one token stream."""
    assert len(reference_text()) > 400_000
    a = reference_text_ids(lm.tokenizer, 100)
    b = reference_text_ids(lm.tokenizer, 50, skip_tokens=50)
    assert b == a[50:] and len(reference_text_ids(lm.tokenizer, 3 * 8192)) == 3 * 8192
    with pytest.raises(ValueError, match="fewer than"):
        reference_text_ids(lm.tokenizer, 10 ** 7)


def test_perplexity_of_real_text_is_low(lm):
    """A trained model predicts English prose far better than chance: over 256 tokens of the reference text its
    perplexity is below 100, where a uniform guess over 49,152 tokens has perplexity 49,152 (and random weights
    give thousands)."""
    logp = lm.model.next_token_logprobs(reference_text_ids(lm.tokenizer, 256, skip_tokens=1000))
    assert logp.shape == (255,) and float(torch.exp(-logp.mean())) < 100


def test_generate_returns_text_and_ids(lm):
    g = generate(lm.model, lm.tokenizer, "The capital of France is", max_new_tokens=3)
    assert len(g.token_ids) == 3 and g.prompt_ids == lm.tokenizer.encode("The capital of France is")
    assert g.text == lm.tokenizer.decode(g.token_ids) and "Paris" in g.text


def test_too_long_prompt_is_refused_before_any_work(lm):
    ctx = lm.config.context_length
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"8193 tokens, more than the 8192"):
        lm.model.prefill([17] * (ctx + 1))
    with pytest.raises(ValueError, match=r"prompt \(8190 tokens\) \+ max_new_tokens \(5\) exceed .* 8192"):
        generate(lm.model, lm.tokenizer, [17] * (ctx - 2), max_new_tokens=5)
    assert time.perf_counter() - t0 < 1.0    # no forward pass ran (an 8K prefill takes tens of seconds here)


@pytest.mark.parametrize("kw, err, msg", [
    ({"prompt": []}, ValueError, "empty"),
    ({"prompt": [1.5, 2.0]}, TypeError, "integer token ids"),
    ({"prompt": [[1, 2], [3]]}, ValueError, "one sequence"),
    ({"prompt": "hi", "max_new_tokens": 0}, ValueError, "max_new_tokens must be >= 1"),
    ({"prompt": "hi", "max_new_tokens": 2.0}, TypeError, "max_new_tokens must be an int"),
    ({"prompt": ""}, ValueError, "no tokens"),
])
def test_generate_bad_input(lm, kw, err, msg):
    with pytest.raises(err, match=msg):
        generate(lm.model, lm.tokenizer, **kw)


@pytest.mark.cuda
def test_cuda_matches_cpu(lm):
    """The same model on CUDA (float32): logits of a prompt and of one decode step within 1e-3 of the CPU's
    (different kernels sum in different orders; TF32 is off by default for matmuls in torch)."""
    gpu = load_model(device="cuda")
    ids = lm.tokenizer.encode("The capital of France is")
    want, cache = lm.model.prefill(ids)
    got, gcache = gpu.model.prefill(ids)
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=1e-3)
    torch.testing.assert_close(gpu.model.decode([7042], gcache).cpu(), lm.model.decode([7042], cache),
                               rtol=0, atol=1e-3)
