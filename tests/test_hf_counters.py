"""The counters (cache_hits, cache_misses, host_to_device_bytes per step, layer and request) against a hand count, the
monitor rows they feed, the trace recorder (a transformers model's top-K sets as an ess trace, replayed by the cache
simulation to the same misses), and the latent byte layout against ess's NumPy encoder."""
import numpy as np
import pytest
import torch

import ess.hf as H
from engine_helpers import SMALL, prompts
from ess.cachesim import trace_misses
from ess.llm import LlamaWeights
from ess.monitor import StepSeries
from ess.quant import decode_latent, encode_latent
from ess.specs import model_spec
from ess.traces import Trace
from llm_helpers import torch_threads

MODEL = H.transformers_llama(LlamaWeights.random(SMALL, seed=0, dtype=np.float32), SMALL)
E = 2 * SMALL.n_kv_heads * SMALL.head_dim * 4


@pytest.fixture(autouse=True)
def one_thread():
    with torch_threads(1):
        yield


def test_counters_against_a_hand_count():
    # a pool that never evicts (ratio 1), cold (no warmup): an entry misses the first step it is selected and hits
    # every later one; the hand count is set arithmetic over the recorded selections
    L, K, steps = 40, 6, 5
    run = H.decode(MODEL, torch.tensor(prompts([L, L], 7)), steps, ratio=1.0, topk=K, warmup=False,
                   record_trace=True)
    tr = run.cache.trace()
    c = run.counters
    assert c["cache_hits"].shape == (steps, SMALL.n_layers, 2)
    for b in range(2):
        for layer in range(SMALL.n_layers):
            seen: set = set()
            for t in range(steps):
                s = {int(x) for x in tr.indices[b, layer, t] if x >= 0}
                assert len(s) == K
                assert c["cache_misses"][t, layer, b] == len(s - seen)
                assert c["cache_hits"][t, layer, b] == len(s & seen)
                assert c["host_to_device_bytes"][t, layer, b] == len(s - seen) * E
                seen |= s
    assert c["cache_misses"].sum() > c["cache_misses"][0].sum() > 0        # new tokens and shifts miss later too


@pytest.mark.parametrize("policy", ["lru", "fifo"])
def test_the_recorded_trace_replays_to_the_same_misses(policy):
    # the trace recorder's sets, replayed by ess's cache simulation (its own kernels) through a pool of the same
    # size with the same warmup windows, miss exactly where the transformers path missed
    run = H.decode(MODEL, torch.tensor(prompts([120, 120], 8)), 6, ratio=0.15, topk=8, policy=policy,
                   record_trace=True)
    tr = run.cache.trace()
    assert isinstance(tr, Trace) and tr.windows is not None
    assert (tr.batch, tr.n_layers, tr.steps, tr.k, tr.context_len) == (2, SMALL.n_layers, 6, 8, 120)
    sim = trace_misses(tr, policy, capacity=run.cache.capacity, warmup=True)      # (B, layers, steps)
    np.testing.assert_array_equal(sim, run.counters["cache_misses"].transpose(2, 1, 0))


def test_the_counters_feed_the_monitor():
    series = StepSeries(total_steps=4)
    run = H.decode(MODEL, torch.tensor(prompts([80], 9)), 4, ratio=0.2, topk=8, schedule="da", on_step=series.add)
    c = run.counters
    assert len(series) == 4
    np.testing.assert_array_equal(series.misses_by_layer(), c["cache_misses"].sum(2).T)
    tot = series.totals()
    assert tot["bytes_h2d"] == c["host_to_device_bytes"].sum()
    assert tot["bytes_d2h"] == 4 * SMALL.n_layers * E                               # one new entry per layer
    frame = run.cache.frame()
    assert len(frame) == 4 * SMALL.n_layers
    assert frame.cache_misses.sum() == c["cache_misses"].sum()


def test_record_trace_of_a_dsa_model():
    model = H.tiny_dsa_model("deepseek_v32", index_topk=16, seed=2)
    ids = torch.randint(0, 97, (1, 50), generator=torch.Generator().manual_seed(0))
    tr = H.record_trace(model, ids, 4)
    assert (tr.batch, tr.n_layers, tr.steps, tr.k) == (1, 3, 4, 16)
    valid = (tr.indices >= 0).sum(-1)
    assert ((valid == 16) | (valid == 15)).all()              # K cached entries, or K - 1 and the token itself
    assert tr.windows.shape[:3] == (1, 3, 32)                 # the last 32 prompt positions' top-K


@pytest.mark.parametrize("dtype", ["fp8", "bf16"])
def test_latent_bytes_are_ess_layout(dtype):
    tiny = model_spec("tiny")                                 # kv_lora_rank 128, rope 16: the tiny DSA dims
    rng = np.random.default_rng(0)
    ckv = (rng.normal(size=(5, 128)) * np.linspace(0.1, 3, 5)[:, None]).astype(np.float32)
    rope = rng.normal(size=(5, 16)).astype(np.float32)
    fmt = H.LatentFormat(128, 16, dtype)
    ours = fmt.encode(torch.from_numpy(ckv), torch.from_numpy(rope)).numpy()
    np.testing.assert_array_equal(ours, encode_latent(ckv, rope, tiny, dtype))
    # the NumPy oracle multiplies code by scale in float64; the torch decoder in float32 (one rounding)
    np.testing.assert_allclose(fmt.decode(torch.from_numpy(ours)).numpy(), decode_latent(ours, tiny, dtype),
                               rtol=2 ** -22, atol=0)
    exact = H.LatentFormat(128, 16, "float32")
    back = exact.decode(exact.encode(torch.from_numpy(ckv), torch.from_numpy(rope))).numpy()
    np.testing.assert_array_equal(back, np.concatenate([ckv, rope], -1))
