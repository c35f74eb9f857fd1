"""The torch forward pass against the NumPy float64 reference on a tiny random model with odd sizes; the pieces a
decode engine drives; ragged batches; incremental decoding; bad input."""
import numpy as np
import pytest
import torch

from ess.llm import KVCache, LlamaConfig, LlamaModel, LlamaWeights, dense_attention, load_model, reference
from llm_helpers import TINY, torch_threads, write_tiny_gguf

UNTIED = LlamaConfig(n_layers=3, d_model=22, d_ffn=15, n_heads=4, n_kv_heads=4, head_dim=8, rope_base=500.0,
                     rms_eps=1e-6, context_length=40, vocab_size=29, tied_output=False)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with torch_threads(1):
        yield


def _model(config, dtype=torch.float64, seed=0, **kw):
    w = LlamaWeights.random(config, seed=seed)
    return w, LlamaModel(w, config, dtype=dtype, **kw)


# ---- the reference's pieces, by hand -----------------------------------------------------------------------------
def test_reference_rope_worked_example():
    """head_dim 4, base 100: frequencies 100^0 = 1 and 100^(-2/4) = 0.1. At position 2 the angles are 2 and 0.2;
    x = (1, 0, 0, 0) pairs dim 0 with dim 2 (rotate half), so it becomes (cos 2, 0, sin 2, 0)."""
    angles = reference.rope_angles(np.array([2]), 4, 100.0)
    np.testing.assert_allclose(angles, [[2.0, 0.2]])
    out = reference.apply_rope(np.array([[[1.0, 0, 0, 0]]]), angles)
    np.testing.assert_allclose(out, [[[np.cos(2), 0, np.sin(2), 0]]])


def test_reference_attention_worked_example():
    """Two tokens, one head, hd = 1 (scale 1): q = k = (0, ln 3), v = (1, 5). Token 0 sees only itself -> 1;
    token 1 scores k * q1 = (0, ln3 * ln3)... use q1 = 1: scores (0, ln 3), weights (1/4, 3/4) -> 1/4 + 15/4 = 4."""
    q = np.array([[[0.0], [1.0]]])
    k = np.array([[[0.0], [np.log(3.0)]]])
    v = np.array([[[1.0], [5.0]]])
    np.testing.assert_allclose(reference.causal_attention(q, k, v), [[[1.0], [4.0]]])


def test_reference_rms_norm_worked_example():
    """x = (3, 4): mean square 12.5, so x / sqrt(12.5) = (0.8485..., 1.1313...), times w = (1, 2)."""
    np.testing.assert_allclose(reference.rms_norm(np.array([3.0, 4.0]), np.array([1.0, 2.0]), 0.0),
                               [3 / np.sqrt(12.5), 8 / np.sqrt(12.5)])


# ---- torch against the reference ---------------------------------------------------------------------------------
@pytest.mark.parametrize("config", [TINY, UNTIED], ids=["gqa-tied", "mha-untied"])
@pytest.mark.parametrize("T", [1, 7, 23])
def test_forward_matches_reference(config, T):
    w, m = _model(config)
    ids = np.random.default_rng(T).integers(0, config.vocab_size, T)
    want = reference.forward(w, config, ids)
    got = m.forward(ids)[0].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_forward_float32_close_to_reference():
    """Float32 compute: relative RMS error of the logits below 1e-5 (float32 epsilon is 1.2e-7; 2 layers)."""
    w, m = _model(TINY, dtype=torch.float32)
    ids = np.arange(31) % TINY.vocab_size
    want = reference.forward(w, TINY, ids)
    got = m.forward(ids)[0].double().numpy()
    assert np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2)) < 1e-5


@pytest.mark.parametrize("impl", ["matmul", "sdpa"])
def test_ragged_batch_equals_each_sequence_alone(impl):
    """Three prompts of lengths 5, 17, 1 in one batch: each one's last logits equal the reference on it alone,
    and decoding two more tokens each continues each sequence independently."""
    w, m = _model(TINY, attention_impl=impl)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, TINY.vocab_size, n) for n in (5, 17, 1)]
    logits, cache = m.prefill(prompts)
    assert cache.lengths.tolist() == [5, 17, 1]
    for b, p in enumerate(prompts):
        np.testing.assert_allclose(logits[b].numpy(), reference.forward(w, TINY, p)[-1], rtol=1e-9, atol=1e-9)
    for step in range(2):
        nxt = [int(x) for x in rng.integers(0, TINY.vocab_size, 3)]
        logits = m.decode(nxt, cache)
        prompts = [np.append(p, t) for p, t in zip(prompts, nxt)]
        for b, p in enumerate(prompts):
            np.testing.assert_allclose(logits[b].numpy(), reference.forward(w, TINY, p)[-1], rtol=1e-9, atol=1e-9)


def test_incremental_decode_equals_full_forward():
    """Prefill 6 tokens, then 10 single-token steps (the cache grows past its first capacity): every step's
    logits equal the full forward pass's logits at that position."""
    w, m = _model(UNTIED)
    ids = np.random.default_rng(5).integers(0, UNTIED.vocab_size, 16)
    full = m.forward(ids)[0]
    logits, cache = m.prefill(ids[:6], capacity=6)
    torch.testing.assert_close(logits[0], full[5], rtol=1e-12, atol=1e-12)
    for t in range(6, 16):
        torch.testing.assert_close(m.decode([int(ids[t])], cache)[0], full[t], rtol=1e-12, atol=1e-12)
    assert cache.capacity >= 16 and int(cache.lengths[0]) == 16


def test_layer_by_layer_with_own_attention_equals_extend():
    """What a decode engine does: embed, then per layer attention_inputs -> its own K/V storage and attention ->
    attention_output, then logits. Here the engine keeps K/V in plain Python lists and attends with a loop over
    heads; the step's logits equal the dense model's decode."""
    w, m = _model(TINY)
    ids = [4, 200, 17, 99, 3]
    _, cache = m.prefill(ids[:-1])
    want = m.decode([ids[-1]], cache)

    G = TINY.n_heads // TINY.n_kv_heads
    keys = [[] for _ in range(TINY.n_layers)]
    vals = [[] for _ in range(TINY.n_layers)]
    for t, tok in enumerate(ids):                         # token by token: T = 1 each step
        h = m.embed(torch.tensor([[tok]]))                                     # (1, 1, D)
        for layer in range(TINY.n_layers):
            q, k, v = m.attention_inputs(layer, h, torch.tensor([[t]]))      # (1, H, 1, hd), (1, Hkv, 1, hd)
            assert q.shape == (1, TINY.n_heads, 1, TINY.head_dim) and k.shape == (1, TINY.n_kv_heads, 1, 6)
            keys[layer].append(k[0, :, 0])
            vals[layer].append(v[0, :, 0])
            K, V = torch.stack(keys[layer], 1), torch.stack(vals[layer], 1)  # (Hkv, t+1, hd)
            attn = torch.stack([torch.softmax(K[hh // G] @ q[0, hh, 0] / np.sqrt(TINY.head_dim), 0) @ V[hh // G]
                                for hh in range(TINY.n_heads)])[None, :, None]   # (1, H, 1, hd)
            h = m.attention_output(layer, h, attn)
        got = m.logits(h)[0, 0]
    torch.testing.assert_close(got, want[0], rtol=1e-12, atol=1e-12)


def test_next_token_logprobs_equal_log_softmax_of_the_reference():
    """Chunked scoring (chunk 4 over 18 targets: chunks of 4, 4, 4, 4, 2) equals the reference's logits at each
    position, log-softmaxed and read at the next token."""
    w, m = _model(TINY)
    ids = np.random.default_rng(9).integers(0, TINY.vocab_size, 19)
    logits = reference.forward(w, TINY, ids)[:-1]                                   # (18, V)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    want = logp[np.arange(18), ids[1:]]
    np.testing.assert_allclose(m.next_token_logprobs(ids, chunk=4).numpy(), want, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        m.next_token_logprobs([5])


def _naive_attention(q, k, v, pos, lengths):
    """The masking rule spelled out per sequence, head and query (float64 loops)."""
    B, H, T, hd = q.shape
    G = H // k.shape[1]
    out = torch.zeros_like(q)
    for b in range(B):
        for h in range(H):
            for t in range(T):
                n = min(int(pos[b, t]) + 1, int(lengths[b]))              # keys 0 .. n-1 are visible
                w = torch.softmax(k[b, h // G, :n] @ q[b, h, t] / np.sqrt(hd), 0)
                out[b, h, t] = w @ v[b, h // G, :n]
    return out


@pytest.mark.parametrize("case", ["decode-full", "prefill-causal", "ragged", "chunk-after-cache"])
@pytest.mark.parametrize("impl", ["matmul", "sdpa"])
def test_dense_attention_against_naive_loops(case, impl, monkeypatch):
    """Odd shapes (B 3, H 6, Hkv 2, hd 7) in the four situations the model creates: a decode step with every
    sequence full (no mask needed), a plain prefill (causal, no mask), ragged lengths (explicit mask) and new
    tokens appended after cached ones; the matmul path also with a tiny chunk budget (rows in chunks of 2)."""
    import ess.llm.attention as att
    g = torch.Generator().manual_seed(0)
    B, H, Hkv, hd, S = 3, 6, 2, 7, 13
    T, lengths = {"decode-full": (1, [13, 13, 13]), "prefill-causal": (13, [13, 13, 13]),
                  "ragged": (1, [13, 9, 5]), "chunk-after-cache": (5, [13, 13, 13])}[case]
    lengths = torch.tensor(lengths)
    pos = lengths[:, None] - T + torch.arange(T)[None]
    q = torch.randn(B, H, T, hd, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, S, hd, generator=g, dtype=torch.float64) for _ in range(2))
    want = _naive_attention(q, k, v, pos, lengths)
    torch.testing.assert_close(dense_attention(q, k, v, pos, lengths, impl), want, rtol=1e-10, atol=1e-10)
    if impl == "matmul":
        monkeypatch.setattr(att, "_SCORE_BYTES", 2 * B * H * S * 8)
        torch.testing.assert_close(att.dense_attention(q, k, v, pos, lengths), want, rtol=1e-10, atol=1e-10)


def test_dense_attention_ignores_entries_past_each_length():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(3, 6, 1, 7, generator=g)
    k, v = torch.randn(3, 2, 13, 7, generator=g), torch.randn(3, 2, 13, 7, generator=g)
    lengths = torch.tensor([13, 9, 5])
    a = dense_attention(q, k, v, lengths[:, None] - 1, lengths)
    k[1, :, 9:], v[2, :, 5:] = 1e6, -1e6                 # stale values in unused slots (finite: the store is zeroed)
    torch.testing.assert_close(dense_attention(q, k, v, lengths[:, None] - 1, lengths), a, rtol=0, atol=0)
    with pytest.raises(ValueError, match="impl"):
        dense_attention(q, k, v, lengths[:, None] - 1, lengths, "flash")


def test_chunked_attention_equals_unchunked(monkeypatch):
    """Long prefills process query rows in chunks; a tiny chunk budget (one row at a time) gives the same output."""
    import ess.llm.attention as att
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 9, 8, generator=g)
    k, v = torch.randn(2, 2, 9, 8, generator=g), torch.randn(2, 2, 9, 8, generator=g)
    pos, lengths = torch.arange(9).expand(2, 9), torch.tensor([9, 9])
    whole = att.dense_attention(q, k, v, pos, lengths)
    monkeypatch.setattr(att, "_SCORE_BYTES", 1)
    torch.testing.assert_close(att.dense_attention(q, k, v, pos, lengths), whole, rtol=1e-6, atol=1e-6)


def test_load_model_from_a_tiny_gguf_file(tmp_path):
    """The whole loading path on a file llama.cpp-style (permuted Q/K rows), through the cache: the loaded
    model's logits equal the reference on the weights as written."""
    path = tmp_path / "tiny.gguf"
    written = write_tiny_gguf(path)
    for expect in ("built", "hit"):
        lm = load_model(path, cache_dir=tmp_path / "cache", dtype=torch.float64)
        assert lm.cache_status.startswith(expect) and lm.config == TINY
        ids = [5, 258, 77, 1, 0]
        np.testing.assert_allclose(lm.model.forward(ids)[0].numpy(), reference.forward(written, TINY, ids),
                                   rtol=1e-6, atol=1e-6)   # float32 weights in the file


# ---- bad input ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, err, msg", [
    ([], ValueError, "empty"),
    ([[1, 2], []], ValueError, "empty"),
    (np.array([1.0, 2.0]), TypeError, "integer token ids"),
    (torch.tensor([1.5]), TypeError, "integer token ids"),
    ([1, 2.0], TypeError, "integer token ids"),
    ([True, 1], TypeError, "integer token ids"),
    ("hello", TypeError, "tokenize text first"),
    ([1, 259], ValueError, "outside the vocabulary"),
    ([-1], ValueError, "outside the vocabulary"),
    (list(range(65)), ValueError, "65 tokens, more than the 64"),
    ([[1], 2], TypeError, "mixes"),
    (np.zeros((2, 2, 2), dtype=np.int64), ValueError, "one sequence"),
])
def test_bad_token_ids(bad, err, msg):
    _, m = _model(TINY)
    with pytest.raises(err, match=msg):
        m.prefill([x % 250 for x in bad] if msg.startswith("65") else bad)


def test_rejected_step_leaves_the_cache_unchanged():
    _, m = _model(TINY)
    _, cache = m.prefill(list(range(60)))
    k_before = [t.clone() for t in cache.k]
    with pytest.raises(ValueError, match="exceed the model's context of 64"):
        m.extend([list(range(5))], cache)
    with pytest.raises(ValueError, match="one id per sequence"):
        m.decode([1, 2], cache)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        m.decode([300], cache)
    assert int(cache.lengths[0]) == 60
    assert all(torch.equal(a, b) for a, b in zip(k_before, cache.k))


def test_cache_and_model_argument_errors():
    with pytest.raises(ValueError, match="capacity"):
        KVCache(TINY, 1, capacity=65)
    with pytest.raises(ValueError, match="batch"):
        KVCache(TINY, 0)
    w = LlamaWeights.random(TINY)
    with pytest.raises(ValueError, match=r"weights.layers\[0\].wq has shape"):
        LlamaModel(w, LlamaConfig(**{**TINY.__dict__, "head_dim": 4}))
    _, m = _model(TINY)
    _, cache = m.prefill([[1, 2], [3]])
    with pytest.raises(ValueError, match="cache holds 2"):
        m.extend([[1]], cache)
