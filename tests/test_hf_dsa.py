"""The real DSA architectures (transformers' deepseek_v32 and glm_moe_dsa, tiny random configurations) decoding
through ess.hf: their own lightning indexer, the latent entries in the tiered cache. Float32 entries equal
transformers' own dense-masked implementation; FP8 entries (ess's layout) differ from it by the quantisation only;
offloaded equals all-resident bit for bit; each step reads at most K latent rows."""
import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings, strategies as st

import ess.hf as H
from ess.layout import EntryFormat, pool_slots
from ess.policies import ONLINE_POLICIES
from llm_helpers import torch_threads

TOPK = 16
MODELS = {mt: H.tiny_dsa_model(mt, index_topk=TOPK, seed=1) for mt in H.DSA_TYPES}


@pytest.fixture(autouse=True)
def one_thread():
    with torch_threads(1):
        yield


def _ids(B, L, seed):
    return torch.randint(0, 97, (B, L), generator=torch.Generator().manual_seed(seed))


def _same(a, b):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert torch.equal(a.logits, b.logits)


@pytest.mark.parametrize("model_type", H.DSA_TYPES)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_float32_entries_equal_transformers_dense_masked_attention(model_type, attn):
    # transformers applies the indexer's top-K as a mask over every key; ess reads the K selected latent rows (the
    # key and value up-projections absorbed into the query and the output). Measured: max |logit diff| 1.8e-7
    # (deepseek_v32), 1.2e-7 (glm_moe_dsa) -- float32 rounding; contexts past index_topk, so K < L is exercised
    model = MODELS[model_type]
    ids = _ids(2, 40, 0)
    model.set_attn_implementation(attn)
    dense = H.dense_decode(model, ids, 5)          # sdpa: transformers' own path (dense_decode switches to it)
    if attn == "eager":
        from transformers import DynamicCache
        with torch.no_grad():                      # the eager path once more by hand, for its first step
            c = DynamicCache(config=model.config)
            first = model(ids, cache=c).logits[:, -1]
            step = model(torch.as_tensor(dense.tokens[:, :1]), cache=c).logits[:, -1]
        torch.testing.assert_close(first, dense.first_logits, rtol=0, atol=1e-5)
        torch.testing.assert_close(step, dense.logits[:, 0], rtol=0, atol=1e-5)
    for kw in ({"offload": False}, {"ratio": 0.5, "schedule": "da"}):
        run = H.decode(model, ids, 5, entry_dtype="float32", **kw)
        np.testing.assert_array_equal(run.tokens, dense.tokens)
        torch.testing.assert_close(run.logits, dense.logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("model_type", H.DSA_TYPES)
def test_fp8_entries_differ_from_transformers_by_the_quantisation_only(model_type):
    # the first decode step's attention output of layer 0 (whose inputs and top-K do not depend on the entries'
    # format) with FP8 latents (ess's 164-byte layout at these dims) and with bf16 ones, against float32: FP8 e4m3
    # keeps 3 mantissa bits, bf16 7. Measured relative RMS errors: FP8 0.024 / 0.026, bf16 0.0016 / 0.0015
    # (deepseek_v32 / glm_moe_dsa). Later layers and steps may route to other experts or select other entries
    # (discrete choices), so only this output is held to a tolerance
    model = MODELS[model_type]
    ids = _ids(2, 40, 1)
    outs = {}
    for dtype in H.LATENT_DTYPES:
        got = []
        hook = model.model.layers[0].self_attn.register_forward_hook(lambda m, i, o: got.append(o[0].clone()))
        try:
            H.decode(model, ids, 1, entry_dtype=dtype, offload=False)
        finally:
            hook.remove()
        outs[dtype] = got[-1]                                                      # the decode step's call
    rms = lambda a: float(a.pow(2).mean().sqrt())                                   # noqa: E731
    err8 = rms(outs["fp8"] - outs["float32"]) / rms(outs["float32"])
    err16 = rms(outs["bf16"] - outs["float32"]) / rms(outs["float32"])
    assert 0.0005 < err16 < 0.005 and 0.01 < err8 < 0.05, (err16, err8)


@settings(max_examples=8, deadline=None)
@given(model_type=st.sampled_from(H.DSA_TYPES), B=st.integers(1, 3), L=st.integers(12, 60),
       ratio=st.floats(0.1, 1.0), policy=st.sampled_from(ONLINE_POLICIES),
       schedule=st.sampled_from(["none", "da", "dba"]), link=st.sampled_from(["sync", "unpaced", "paced"]),
       warmup=st.booleans(), entry_dtype=st.sampled_from(H.LATENT_DTYPES), steps=st.integers(2, 4),
       seed=st.integers(0, 2 ** 16))
def test_offload_on_and_off_give_the_same_tokens_and_logits(model_type, B, L, ratio, policy, schedule, link, warmup,
                                                            entry_dtype, steps, seed):
    assume(not (schedule == "dba" and B < 2))
    fmt = EntryFormat("latent", 3, H.LatentFormat(128, 16, entry_dtype).entry_bytes, 64, 4096)
    longest = L + steps - 1
    assume(pool_slots(fmt, ratio, longest) >= min(TOPK, longest))
    model = MODELS[model_type]
    ids = _ids(B, L, seed)
    base = H.decode(model, ids, steps, offload=False, entry_dtype=entry_dtype)
    kw = {"sync": {"emulate_link": False}, "unpaced": {}, "paced": {"link_GB_per_s": 0.5}}[link]
    run = H.decode(model, ids, steps, ratio=ratio, policy=policy, schedule=schedule, warmup=warmup,
                   entry_dtype=entry_dtype, **kw)
    _same(run, base)


@pytest.mark.parametrize("model_type", H.DSA_TYPES)
def test_each_step_reads_k_latent_rows_not_the_context(model_type):
    # a context of 150 tokens, K = 16, a device pool of a fifth of the context: the output equals all-resident
    # decoding, each layer of each step scores K rows (the model's top-K: the cached entries it selected plus,
    # when selected, the new token's own), and the attention gathered exactly the cached ones from the pool
    model = MODELS[model_type]
    L, steps = 150, 3
    ids = _ids(2, L, 2)
    run = H.decode(model, ids, steps, ratio=0.2, warmup=False)
    base = H.decode(model, ids, steps, offload=False)
    _same(run, base)
    assert run.cache.capacity < L
    c = run.counters
    cached = c["cache_hits"] + c["cache_misses"]                                   # (steps, layers, B)
    assert ((cached == TOPK) | (cached == TOPK - 1)).all()                         # K, or K - 1 and itself
    assert run.cache.att.rows_read == cached.sum()                                 # rows gathered from the pool
    assert (c["cache_misses"][0] == cached[0]).all()                               # a cold pool
    E = H.LatentFormat(128, 16, "fp8").entry_bytes
    assert E == 164                                                                # 128 FP8 + 1 scale + 16 bf16
    np.testing.assert_array_equal(c["host_to_device_bytes"], c["cache_misses"] * E)


def test_glm_shared_layers_reuse_the_previous_selection():
    # GLM-5's odd layers reuse the previous full layer's top-K (cross-layer sharing): their reads are the same set
    model = MODELS["glm_moe_dsa"]
    run = H.decode(model, _ids(1, 60, 3), 3, offload=False, record_trace=True)
    tr = run.cache.trace()
    np.testing.assert_array_equal(tr.indices[:, 1], tr.indices[:, 0])
    assert not np.array_equal(tr.indices[:, 2], tr.indices[:, 0])


def test_a_dsa_model_selects_with_its_own_index_topk():
    with pytest.raises(ValueError, match="topk=8.*index_topk"):
        H.SparseCache(MODELS["deepseek_v32"], max_new_tokens=4, topk=8)


@pytest.mark.cuda
@pytest.mark.parametrize("model_type", H.DSA_TYPES)
def test_cuda_is_lossless_and_matches_the_cpu(model_type):
    cpu = MODELS[model_type]
    ids = _ids(2, 60, 4)
    want = H.decode(cpu, ids, 3, entry_dtype="float32", offload=False)
    gpu = H.tiny_dsa_model(model_type, index_topk=TOPK, seed=1).to("cuda")
    base = H.decode(gpu, ids, 3, offload=False)
    for schedule in ("none", "da", "dba"):
        _same(H.decode(gpu, ids, 3, ratio=0.3, schedule=schedule), base)
    f32 = H.decode(gpu, ids, 3, entry_dtype="float32", ratio=0.3)
    np.testing.assert_array_equal(f32.tokens, want.tokens)
    torch.testing.assert_close(f32.logits, want.logits, rtol=0, atol=1e-3)


@pytest.mark.parametrize("model_type", H.DSA_TYPES)
def test_a_prompt_prefilled_in_chunks_decodes_as_transformers_does(model_type):
    # a long prompt is prefilled in chunks (a progress bar per chunk). transformers' own DSA prefill in chunks
    # differs from its one-pass prefill (its indexer selects among the keys present when a chunk runs); the sparse
    # cache, prefilled in the same chunks, decodes as transformers' own attention does from its chunked prefill
    from transformers import DynamicCache
    model = MODELS[model_type]
    ids = _ids(2, 70, 5)
    caches = {"dense": DynamicCache(config=model.config),
              "ess": H.SparseCache(model, max_new_tokens=3, entry_dtype="float32", ratio=0.5)}
    logits = {}
    for name, cache in caches.items():
        model.set_attn_implementation("sdpa" if name == "dense" else H.ATTENTION_NAME)
        first, _ = H.prefill(model, ids, cache, chunk=16)
        tok, out = first.argmax(-1), []
        with torch.no_grad():
            for _ in range(3):
                lg = model(input_ids=tok[:, None], cache=cache).logits[:, -1]
                out.append(lg)
                tok = lg.argmax(-1)
        logits[name] = torch.stack(out, 1)
    caches["ess"].close()
    torch.testing.assert_close(logits["ess"], logits["dense"], rtol=0, atol=1e-5)
    assert caches["ess"].counters()["cache_misses"].sum() > 0
