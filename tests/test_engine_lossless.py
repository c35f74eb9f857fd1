"""Offload is lossless: the same tokens and bit-for-bit the same logits with the K/V entries in the tiered cache (any
ratio, policy, schedule, link) as with every entry resident; and sparse decoding with K covering the whole context
equals the model's dense decoding."""
import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings, strategies as st

from engine_helpers import SMALL, prompts, small_engine
from ess.engine.kv import kv_entry_format
from ess.layout import pool_slots
from ess.policies import ONLINE_POLICIES
from llm_helpers import torch_threads

ENGINE = small_engine()


@pytest.fixture(autouse=True)
def one_thread():
    with torch_threads(1):
        yield


def _same(a, b):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert torch.equal(a.logits, b.logits)


@settings(max_examples=12, deadline=None)
@given(lens=st.lists(st.integers(24, 160), min_size=1, max_size=3), topk=st.integers(2, 20),
       ratio=st.floats(0.05, 1.0), policy=st.sampled_from(ONLINE_POLICIES),
       schedule=st.sampled_from(["none", "da", "dba"]), link=st.sampled_from(["sync", "unpaced", "paced"]),
       warmup=st.booleans(), steps=st.integers(2, 5), seed=st.integers(0, 2 ** 16),
       backend=st.sampled_from(["auto", "torch"]))
def test_offload_on_and_off_give_the_same_tokens_and_logits(lens, topk, ratio, policy, schedule, link, warmup, steps,
                                                            seed, backend):
    assume(not (schedule == "dba" and len(lens) < 2))
    assume(pool_slots(kv_entry_format(SMALL), ratio, max(lens)) >= min(topk, max(lens)))
    pre = ENGINE.prefill(prompts(lens, seed), max_new_tokens=steps)
    base = ENGINE.decode(pre, steps, offload=False, topk=topk, keep_logits=True, backend=backend)
    kw = {"sync": {"emulate_link": False}, "unpaced": {}, "paced": {"link_GB_per_s": 0.5}}[link]
    run = ENGINE.decode(pre, steps, offload=True, ratio=ratio, policy=policy, schedule=schedule, topk=topk,
                        warmup=warmup, keep_logits=True, backend=backend, **kw)
    _same(run, base)
    loaded = run.misses.sum() + run.cache_metrics.totals().get("warmup", {}).get("misses", 0)
    assert loaded > 0                                   # entries really came in through the host pool
    if not warmup:
        assert run.misses[0].sum() == run.hits[0].sum() + run.misses[0].sum()   # a cold pool: all misses at first


def test_every_schedule_and_policy_on_one_batch():
    pre = ENGINE.prefill(prompts([150, 90, 200], 3), max_new_tokens=6)
    base = ENGINE.decode(pre, 6, offload=False, topk=12, keep_logits=True)
    for schedule in ("none", "da", "dba"):
        for policy in ONLINE_POLICIES:
            run = ENGINE.decode(pre, 6, ratio=0.2, policy=policy, schedule=schedule, topk=12, keep_logits=True,
                                link_GB_per_s=0.2)
            _same(run, base)


def test_the_torch_kernels_on_the_cpu_are_lossless_too():
    # what a GPU runs (backend "torch"), run here: every schedule against all-resident, bit for bit
    pre = ENGINE.prefill(prompts([150, 90, 200], 4), max_new_tokens=5)
    base = ENGINE.decode(pre, 5, offload=False, topk=12, keep_logits=True, backend="torch")
    for schedule in ("none", "da", "dba"):
        run = ENGINE.decode(pre, 5, ratio=0.2, schedule=schedule, topk=12, keep_logits=True, backend="torch",
                            link_GB_per_s=0.2)
        _same(run, base)
        assert run.misses.sum() > 0
    numba = ENGINE.decode(pre, 5, offload=False, topk=12, keep_logits=True, backend="numba")
    torch.testing.assert_close(numba.logits, base.logits, rtol=1e-4, atol=1e-4)   # the kernels agree to rounding


def test_sparse_with_k_covering_the_context_is_dense_decoding():
    pre = ENGINE.prefill(prompts([40, 70], 5), max_new_tokens=8, keep_dense=True)
    dense = ENGINE.decode_dense(pre, 8, keep_logits=True)
    sparse = ENGINE.decode(pre, 8, offload=True, ratio=1.0, topk=80, keep_logits=True)
    np.testing.assert_array_equal(sparse.tokens, dense.tokens)
    torch.testing.assert_close(sparse.logits, dense.logits, rtol=1e-4, atol=1e-4)


def test_sparse_reads_fewer_entries_and_still_tracks_dense():
    # with K < context the logits differ from dense (an approximation), but not arbitrarily: the attention keeps the
    # K best-scored entries and the new token's own
    pre = ENGINE.prefill(prompts([120], 6), max_new_tokens=4, keep_dense=True)
    dense = ENGINE.decode_dense(pre, 4, keep_logits=True)
    sparse = ENGINE.decode(pre, 4, offload=False, topk=30, keep_logits=True)
    assert not torch.equal(sparse.logits, dense.logits)
    sel = sparse.hits.sum(axis=2)                           # entries read per (step, layer): K each
    assert (sel == 30).all()


@pytest.mark.slow
def test_the_real_model_is_lossless_through_the_tiered_cache():
    from ess.engine import DecodeEngine
    from ess.llm import load_model, reference_text_ids
    lm = load_model()
    eng = DecodeEngine(lm.model, lm.tokenizer)
    ids = [reference_text_ids(lm.tokenizer, n, skip_tokens=s) for n, s in ((96, 500), (80, 4000))]
    pre = eng.prefill(ids, max_new_tokens=4)
    base = eng.decode(pre, 4, offload=False, topk=8, keep_logits=True)
    for kw in ({"ratio": 0.25, "policy": "lru", "schedule": "da", "link_GB_per_s": 0.05},
               {"ratio": 0.5, "policy": "fifo", "schedule": "dba"},
               {"ratio": 0.15, "policy": "heat", "schedule": "none", "emulate_link": False}):
        run = eng.decode(pre, 4, topk=8, keep_logits=True, **kw)
        _same(run, base)
        assert run.misses.sum() > 0


@pytest.mark.cuda
def test_cuda_engine_is_lossless_and_matches_the_cpu_selection():
    from ess.engine import DecodeEngine
    from ess.llm import LlamaModel, LlamaWeights
    w = LlamaWeights.random(SMALL, seed=0, dtype=np.float32)
    eng = DecodeEngine(LlamaModel(w, SMALL, dtype=torch.float32, device="cuda"))
    pre = eng.prefill(prompts([150, 90], 1), max_new_tokens=5)
    base = eng.decode(pre, 5, offload=False, topk=10, keep_logits=True)
    for schedule in ("none", "da", "dba"):
        run = eng.decode(pre, 5, ratio=0.2, schedule=schedule, topk=10, keep_logits=True)
        _same(run, base)
        assert run.misses.sum() > 0
    cpu = ENGINE.decode(ENGINE.prefill(prompts([150, 90], 1), max_new_tokens=5), 5, offload=False, topk=10,
                        keep_logits=True)
    torch.testing.assert_close(base.logits, cpu.logits, rtol=1e-3, atol=1e-3)
