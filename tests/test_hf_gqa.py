"""A transformers Llama decoding through ess.hf: offloaded equals all-resident bit for bit (any ratio, policy,
schedule, link); K covering the context equals transformers' own attention; K < L equals ess's own engine on the
same weights; ``model.generate`` runs unchanged; every step reads K cache rows, not L."""
import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings, strategies as st

import ess.hf as H
from engine_helpers import SMALL, prompts, small_engine
from ess.layout import pool_slots
from ess.llm import LlamaWeights
from ess.policies import ONLINE_POLICIES
from llm_helpers import torch_threads

WEIGHTS = LlamaWeights.random(SMALL, seed=0, dtype=np.float32)
MODEL = H.transformers_llama(WEIGHTS, SMALL)
ENGINE = small_engine(0)                       # ess's own engine on the same weights (seed 0)
E = 2 * SMALL.n_kv_heads * SMALL.head_dim * 4  # bytes of one K/V entry (float32 K and V)


@pytest.fixture(autouse=True)
def one_thread():
    with torch_threads(1):
        yield


def _same(a, b):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert torch.equal(a.logits, b.logits)


@settings(max_examples=10, deadline=None)
@given(B=st.integers(1, 3), L=st.integers(24, 120), topk=st.integers(2, 16), ratio=st.floats(0.05, 1.0),
       policy=st.sampled_from(ONLINE_POLICIES), schedule=st.sampled_from(["none", "da", "dba"]),
       link=st.sampled_from(["sync", "unpaced", "paced"]), warmup=st.booleans(), steps=st.integers(2, 4),
       seed=st.integers(0, 2 ** 16))
def test_offload_on_and_off_give_the_same_tokens_and_logits(B, L, topk, ratio, policy, schedule, link, warmup, steps,
                                                            seed):
    assume(not (schedule == "dba" and B < 2))
    from ess.layout import EntryFormat
    fmt = EntryFormat("k/v", SMALL.n_layers, E, 64, SMALL.context_length)
    assume(pool_slots(fmt, ratio, L) >= min(topk, L + steps - 1))
    ids = torch.tensor(prompts([L] * B, seed))
    base = H.decode(MODEL, ids, steps, offload=False, topk=topk)
    kw = {"sync": {"emulate_link": False}, "unpaced": {}, "paced": {"link_GB_per_s": 0.5}}[link]
    run = H.decode(MODEL, ids, steps, ratio=ratio, policy=policy, schedule=schedule, topk=topk, warmup=warmup, **kw)
    _same(run, base)
    assert run.counters["cache_misses"].sum() + run.cache.store.metrics.totals().get("warmup", {}).get("misses", 0) > 0


def test_k_covering_the_context_is_transformers_own_attention():
    # measured: max |logit diff| 7.6e-6 (float32 rounding of a different summation order)
    ids = torch.tensor(prompts([60, 60], 1))
    dense = H.dense_decode(MODEL, ids, 6)
    full = H.decode(MODEL, ids, 6, ratio=1.0, topk=80, schedule="da")
    np.testing.assert_array_equal(full.tokens, dense.tokens)
    torch.testing.assert_close(full.logits, dense.logits, rtol=0, atol=1e-4)


def test_k_below_the_context_is_ess_own_engine_on_the_same_weights():
    ids = prompts([90, 90], 2)
    pre = ENGINE.prefill(ids, max_new_tokens=6)
    for kw in ({"offload": False}, {"ratio": 0.3, "schedule": "da", "policy": "lru"}):
        ours = ENGINE.decode(pre, 6, topk=8, keep_logits=True, **kw)
        hf = H.decode(MODEL, torch.tensor(ids), 6, topk=8, **kw)
        np.testing.assert_array_equal(hf.tokens, ours.tokens)
        torch.testing.assert_close(hf.logits, ours.logits, rtol=0, atol=1e-4)
        if kw.get("offload", True):            # the same selections through the same cache: the same counts
            np.testing.assert_array_equal(hf.counters["cache_misses"], ours.misses)
            np.testing.assert_array_equal(hf.counters["cache_hits"], ours.hits)
    sparse = H.decode(MODEL, torch.tensor(ids), 6, topk=8, offload=False)
    dense = H.dense_decode(MODEL, torch.tensor(ids), 6)
    assert not torch.equal(sparse.logits, dense.logits)     # K < L is an approximation, not dense attention


def test_generate_runs_unchanged_and_decodes_the_same_tokens():
    ids = torch.tensor(prompts([50], 3))
    run = H.decode(MODEL, ids, 5, ratio=0.5, topk=6)
    cache = H.SparseCache(MODEL, max_new_tokens=5, ratio=0.5, topk=6)
    out = MODEL.generate(ids, attention_mask=torch.ones_like(ids), cache=cache, max_new_tokens=5, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    cache.close()
    np.testing.assert_array_equal(out[:, 50:].numpy(), run.tokens[:, :5])
    assert cache.counters()["cache_misses"].shape == (4, SMALL.n_layers, 1)   # the last token is not decoded


def test_without_a_sparse_cache_the_model_computes_sdpa():
    ids = torch.tensor(prompts([40], 4))
    H.enable(MODEL)
    with torch.no_grad():
        ours = MODEL(ids).logits
        MODEL.set_attn_implementation("sdpa")
        theirs = MODEL(ids).logits
    assert torch.equal(ours, theirs)


def test_each_step_reads_k_rows_not_the_context():
    # the device pool holds a fifth of the context, yet sparse decoding equals the all-resident run: each step
    # reads only its K selected rows, every one of them accounted for as a hit or a miss
    L, K, steps = 200, 12, 4
    ids = torch.tensor(prompts([L, L], 5))
    run = H.decode(MODEL, ids, steps, ratio=0.2, topk=K, warmup=False)
    base = H.decode(MODEL, ids, steps, offload=False, topk=K)
    _same(run, base)
    assert run.cache.capacity < L
    c = run.counters
    read = c["cache_hits"] + c["cache_misses"]                                 # (steps, layers, B)
    assert (read == K).all()
    assert (c["cache_misses"][0] == K).all()                                   # a cold pool: the first step misses
    np.testing.assert_array_equal(c["host_to_device_bytes"], c["cache_misses"] * E)


def test_a_sparse_cache_continues_from_transformers_own_prefill():
    # one dense prefill into transformers' DynamicCache, taken over by a SparseCache: the same steps as a
    # SparseCache that prefilled itself (without LRU-Warmup, whose windows a DynamicCache does not keep)
    from transformers import DynamicCache
    ids = torch.tensor(prompts([70, 70], 6))
    want = H.decode(MODEL, ids, 3, ratio=0.3, topk=6, warmup=False)
    dyn = DynamicCache(config=MODEL.config)
    H.enable(MODEL)
    first, _ = H.prefill(MODEL, ids, dyn)
    cache = H.SparseCache.from_cache(MODEL, dyn, max_new_tokens=3, ratio=0.3, topk=6, warmup=False)
    tok = first.argmax(-1)
    with torch.no_grad():
        for t in range(3):
            lg = MODEL(input_ids=tok[:, None], cache=cache).logits[:, -1]
            assert torch.equal(lg, want.logits[:, t])
            tok = lg.argmax(-1)
    cache.close()
    np.testing.assert_array_equal(cache.counters()["cache_misses"], want.counters["cache_misses"])
    with pytest.raises(TypeError, match="cache must be a transformers cache"):
        H.SparseCache.from_cache(MODEL, object(), max_new_tokens=3)


@pytest.mark.cuda
def test_cuda_is_lossless_and_matches_the_cpu():
    gpu = H.transformers_llama(WEIGHTS, SMALL).to("cuda")
    ids = torch.tensor(prompts([150, 150], 1))
    base = H.decode(gpu, ids, 4, offload=False, topk=10)
    for schedule in ("none", "da", "dba"):
        _same(H.decode(gpu, ids, 4, ratio=0.2, schedule=schedule, topk=10), base)
    cpu = H.decode(MODEL, ids, 4, offload=False, topk=10)
    torch.testing.assert_close(base.logits, cpu.logits, rtol=0, atol=1e-3)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "mistral"])
def test_other_gqa_families_decode_as_their_own_attention(arch):
    # tiny random models of the other supported families (transformers' config classes, no download): K covering
    # the context equals transformers' own attention; offloaded equals all-resident
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.for_model(arch, vocab_size=97, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=6, num_key_value_heads=2, head_dim=8, max_position_embeddings=512)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    ids = torch.tensor(prompts([40, 40], 11))
    dense = H.dense_decode(model, ids, 4)
    full = H.decode(model, ids, 4, topk=64, ratio=1.0)
    np.testing.assert_array_equal(full.tokens, dense.tokens)
    torch.testing.assert_close(full.logits, dense.logits, rtol=0, atol=1e-4)
    _same(H.decode(model, ids, 4, topk=6, ratio=0.3, schedule="dba"), H.decode(model, ids, 4, topk=6, offload=False))
