"""The real SmolLM2-135M-Instruct loaded *through transformers* from the GGUF file ess installs, decoding through
ess.hf: K covering the context equals transformers' own attention; K < L equals ess's own engine at the same
settings; offloaded equals all-resident bit for bit; the trace command writes a trace."""
import os

import numpy as np
import pytest
import torch

import ess.hf as H
from llm_helpers import torch_threads

pytestmark = pytest.mark.slow
os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture(scope="module")
def hf():
    return H.load_smollm2()


@pytest.fixture(scope="module")
def engine():
    from ess.engine import DecodeEngine
    return DecodeEngine.load()


@pytest.fixture(scope="module")
def ids(hf):
    from ess.llm import reference_text_ids
    return torch.tensor([reference_text_ids(hf[1], 96, skip_tokens=s) for s in (500, 4000)])


@pytest.fixture(autouse=True)
def two_threads():
    with torch_threads(2):
        yield


def test_k_covering_the_context_is_transformers_own_attention(hf, ids):
    # measured: max |logit diff| about 1e-4 over logits of magnitude ~20 (float32, 30 layers)
    model, _ = hf
    dense = H.dense_decode(model, ids, 6)
    full = H.decode(model, ids, 6, topk=128, ratio=1.0, schedule="da")
    np.testing.assert_array_equal(full.tokens, dense.tokens)
    torch.testing.assert_close(full.logits, dense.logits, rtol=0, atol=2e-3)


def test_k_below_the_context_is_ess_own_engine(hf, ids, engine):
    model, _ = hf
    pre = engine.prefill([r.tolist() for r in ids], max_new_tokens=6)
    ours = engine.decode(pre, 6, topk=8, ratio=0.25, schedule="da", keep_logits=True)
    theirs = H.decode(model, ids, 6, topk=8, ratio=0.25, schedule="da")
    np.testing.assert_array_equal(theirs.tokens, ours.tokens)
    torch.testing.assert_close(theirs.logits, ours.logits, rtol=0, atol=2e-3)
    resident = H.decode(model, ids, 6, topk=8, offload=False)
    np.testing.assert_array_equal(resident.tokens, theirs.tokens)
    assert torch.equal(resident.logits, theirs.logits)
    assert theirs.counters["cache_misses"].sum() > 0


def test_offload_is_lossless_under_every_schedule_and_policy(hf, ids):
    model, _ = hf
    base = H.decode(model, ids, 4, topk=8, offload=False)
    for kw in ({"ratio": 0.25, "policy": "lru", "schedule": "da", "link_GB_per_s": 0.05},
               {"ratio": 0.5, "policy": "fifo", "schedule": "dba"},
               {"ratio": 0.15, "policy": "heat", "schedule": "none", "emulate_link": False}):
        run = H.decode(model, ids, 4, topk=8, **kw)
        np.testing.assert_array_equal(run.tokens, base.tokens)
        assert torch.equal(run.logits, base.logits)


def test_the_record_trace_command(tmp_path):
    from ess.__main__ import main
    from ess.traces import load_trace
    out = tmp_path / "smollm2.npz"
    assert main(["record-trace", "--model", "smollm2", "--context", "128", "--steps", "3", "--out", str(out)]) == 0
    tr = load_trace(out)
    assert (tr.context_len, tr.steps, tr.k, tr.n_layers, tr.batch) == (128, 3, 8, 30, 1)


def test_both_loaders_give_the_same_weights(hf):
    # transformers' own reading of the GGUF file, and ess's cached decoding put into transformers' model
    theirs = hf[0].state_dict()
    ours = H.load_smollm2(source="ess")[0].state_dict()
    assert set(ours) == set(theirs)
    for k in theirs:
        assert torch.equal(ours[k], theirs[k]), k
