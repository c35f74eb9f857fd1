"""Public attention wrappers: top-k rule, sparse = dense when K >= L, split-and-merge = one pass, bad inputs, and the
decode step through a tiered cache equal, bit for bit, to attention over an all-resident cache."""
import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ess import attention as A
from ess import quant
from ess.specs import model_spec

TINY = model_spec("tiny")
FULL = model_spec("deepseek-v3.2-exp")
BACKENDS = ["reference", "numba", "torch"]


def _latents(rng, B, L, H, model=TINY, dtype="fp8"):
    lat = quant.encode_latent(rng.standard_normal((B, L, model.kv_lora_rank)),
                              rng.standard_normal((B, L, model.qk_rope_head_dim)), model, dtype)
    return rng.standard_normal((B, H, model.latent_dim)).astype(np.float32), lat


def test_softmax_scale_sources():
    assert A.softmax_scale(FULL) == pytest.approx(192 ** -0.5 * (0.1 * math.log(40) + 1) ** 2)
    assert A.softmax_scale(FULL) == pytest.approx(0.1352, abs=1e-4)
    assert A.softmax_scale(TINY) == pytest.approx(48 ** -0.5)


def test_topk_tie_rule_order_and_padding():
    s = np.array([[1.0, 3.0, 3.0, -np.inf, 2.0, 3.0],
                  [-np.inf, 5.0, -np.inf, -np.inf, -np.inf, -np.inf]], dtype=np.float32)
    np.testing.assert_array_equal(A.topk_indices(s, 4), [[1, 2, 5, 4], [1, -1, -1, -1]])
    np.testing.assert_array_equal(A.topk_indices(s, 8)[0], [1, 2, 5, 4, 0, -1, -1, -1])
    assert A.topk_indices(s, 1).shape == (2, 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sparse_with_k_at_least_l_equals_dense(backend):
    rng = np.random.default_rng(0)
    q, lat = _latents(rng, 3, 41, 5)
    lengths = np.array([41, 17, 1])
    keys = quant.encode_indexer_keys(rng.standard_normal((3, 41, TINY.index_head_dim)), TINY)
    scores = A.indexer_scores(rng.standard_normal((3, 4, 32)), rng.random((3, 4)), keys, lengths, backend=backend)
    idx = A.topk_indices(scores, 64)                                   # K = 64 > L: everything visible, -1 after
    assert ((idx >= 0).sum(axis=1) == lengths).all()
    sparse = A.sparse_mla_decode(q, lat, idx, TINY, backend=backend)
    dense = A.dense_mla_decode(q, lat, TINY, lengths)
    np.testing.assert_allclose(sparse.out, dense.out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(sparse.lse, dense.lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_split_and_merge_equals_one_pass(backend):
    rng = np.random.default_rng(1)
    q, lat = _latents(rng, 2, 60, 3)
    idx = np.stack([rng.permutation(60)[:25] for _ in range(2)])
    cut = rng.random(idx.shape) < 0.4
    i0, i1 = np.where(cut, idx, -1), np.where(cut, -1, idx)
    i1[1] = -1                                                         # one request with an empty second part
    i0[1] = idx[1]
    whole = A.sparse_mla_decode(q, lat, idx, TINY, backend=backend)
    merged = A.split_attention(q, lat, i0, i1, TINY, backend=backend)
    np.testing.assert_allclose(merged.out, whole.out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(merged.lse, whole.lse, rtol=1e-6, atol=1e-6)


def test_split_rejects_overlapping_sets():
    rng = np.random.default_rng(2)
    q, lat = _latents(rng, 1, 10, 2)
    with pytest.raises(ValueError, match="disjoint"):
        A.split_attention(q, lat, np.array([[1, 2]]), np.array([[2, 3]]), TINY)


def test_prepared_queries_keep_scores_close():
    rng = np.random.default_rng(3)
    m = dataclasses.replace(TINY, index_head_dim=128)
    k = rng.standard_normal((1, 50, 128))
    q = rng.standard_normal((1, 4, 128))
    exact = np.maximum(q[0] @ k[0].T, 0).sum(axis=0)
    keys = quant.encode_indexer_keys(quant.hadamard_rotate(k), m)
    got = A.indexer_scores(A.prepare_index_queries(q), np.ones((1, 4)), keys, backend="reference")[0]
    assert np.abs(got - exact).max() < 0.1 * np.abs(exact).max()


# ---------------------------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------------------------

def test_bad_inputs_name_the_argument():
    rng = np.random.default_rng(4)
    q, lat = _latents(rng, 2, 10, 3)
    idx = np.tile(np.arange(4, dtype=np.int64), (2, 1))
    keys = quant.encode_indexer_keys(rng.standard_normal((2, 10, 32)), TINY)
    qi, w = rng.standard_normal((2, 4, 32)), rng.random((2, 4))
    with pytest.raises(ValueError, match="k must be a positive integer, got 0"):
        A.topk_indices(np.zeros((1, 3)), 0)
    with pytest.raises(TypeError, match="k must be an integer, got float 2.5"):
        A.topk_indices(np.zeros((1, 3)), 2.5)
    with pytest.raises(ValueError, match="weights must have shape"):
        A.indexer_scores(qi, w[:, :3], keys)
    with pytest.raises(ValueError, match="keys must have shape"):
        A.indexer_scores(qi[:, :, :16], w, keys)
    with pytest.raises(ValueError, match="q must hold finite"):
        A.indexer_scores(np.where(qi > 1, np.nan, qi), w, keys)
    with pytest.raises(ValueError, match=r"lengths holds 0, outside \[1, 11\)"):
        A.indexer_scores(qi, w, keys, np.array([0, 3]))
    with pytest.raises(ValueError, match="q: last axis must be"):
        A.sparse_mla_decode(q[..., :100], lat, idx, TINY)
    with pytest.raises(ValueError, match="latents: entries must be 164 bytes"):
        A.sparse_mla_decode(q, lat[..., :100], idx, TINY)
    with pytest.raises(ValueError, match="latents must have shape \\(B=2"):
        A.sparse_mla_decode(q, lat[:1], idx, TINY)
    with pytest.raises(ValueError, match="indices must be in \\[-1, 10\\)"):
        A.sparse_mla_decode(q, lat, idx + 10, TINY)
    with pytest.raises(ValueError, match="indices must select K >= 1"):
        A.sparse_mla_decode(q, lat, idx[:, :0], TINY)
    with pytest.raises(ValueError, match="q must hold finite"):
        A.sparse_mla_decode(np.full_like(q, np.inf), lat, idx, TINY)
    with pytest.raises(ValueError, match="sm_scale must be > 0, got -1"):
        A.sparse_mla_decode(q, lat, idx, TINY, sm_scale=-1.0)
    with pytest.raises(TypeError, match="latents must be uint8"):
        A.sparse_mla_decode(q, lat.astype(np.int16), idx, TINY)
    with pytest.raises(ValueError, match="backend must be"):
        A.sparse_mla_decode(q, lat, idx, TINY, backend="cuda-magic")
    with pytest.raises(ValueError, match="indices must not repeat a valid entry.*request 1 repeats 2"):
        A.sparse_mla_decode(q, lat, np.array([[0, 1, -1, -1], [2, -1, 5, 2]]), TINY)
    A.sparse_mla_decode(q, lat, np.array([[0, -1, -1, 1], [2, -1, -1, 5]]), TINY)      # repeated padding is fine
    with pytest.raises(TypeError, match="lengths must hold integers"):
        A.indexer_scores(qi, w, keys, np.array([3.0, 4.0]))
    with pytest.raises(ValueError, match="lengths must be 2 integers"):
        A.indexer_scores(qi, w, keys, np.array([3, 4, 5]))
    with pytest.raises(TypeError, match="scores must be a float array"):
        A.topk_indices(np.zeros((1, 3), np.int64), 2)
    with pytest.raises(ValueError, match="scores must be a float array \\(B, L\\), got shape"):
        A.topk_indices(np.zeros(3), 2)
    with pytest.raises(TypeError, match="merge_attention: a must be an AttentionOutput"):
        A.merge_attention(1, 2)
    out = A.sparse_mla_decode(q, lat, idx, TINY)
    with pytest.raises(TypeError, match="merge_attention: b must be an AttentionOutput .*got tuple"):
        A.merge_attention(out, (out.out, out.lse))


@pytest.mark.parametrize("backend", BACKENDS)
def test_indexer_rejects_negative_or_non_finite_key_scales(backend):
    rng = np.random.default_rng(11)
    qi, w = rng.standard_normal((1, 4, 32)), rng.random((1, 4))
    keys = quant.encode_indexer_keys(rng.standard_normal((1, 10, 32)), TINY)
    # a negative scale: the reference (scale before the ReLU) and numba/torch (after) would disagree
    for bad in (-0.5, np.inf, np.nan):
        k = keys.copy()
        k[0, 4, 32:36] = np.frombuffer(np.float32(bad).tobytes(), np.uint8)
        with pytest.raises(ValueError, match="keys: the float32 scale of every visible entry must be finite and >= 0"):
            A.indexer_scores(qi, w, k, backend=backend)
        # the same entry outside the visible range is never read: no error
        got = A.indexer_scores(qi, w, k, np.array([4]), backend=backend)
        assert np.isneginf(got[0, 4:]).all()
    # zero is allowed (an all-zero key): its score is 0 on every backend
    k = keys.copy()
    k[0, 4, 32:36] = 0
    got = A.indexer_scores(qi, w, k, backend=backend)
    assert got[0, 4] == 0.0
    ref = A.indexer_scores(qi, w, k, backend="reference")
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_prepare_index_queries_is_the_fp8_tile_quantiser():
    rng = np.random.default_rng(12)
    q = rng.standard_normal((2, 3, 256)).astype(np.float32)
    got = A.prepare_index_queries(q, rotate=False)
    codes, scales = quant.quantize_fp8_tiles(q, quant.FP8_BLOCK)
    np.testing.assert_array_equal(got, quant.dequantize_fp8_tiles(codes, scales, quant.FP8_BLOCK))
    # each 128-value block keeps its largest magnitude exactly (it maps to the e4m3 maximum)
    blocks = q.reshape(2, 3, 2, 128)
    amax = np.abs(blocks).max(axis=-1)
    np.testing.assert_allclose(np.abs(got.reshape(2, 3, 2, 128)).max(axis=-1), amax, rtol=1e-6)
    assert not np.array_equal(got, q)                                   # really rounded
    with pytest.raises(ValueError, match="q: head dim 192 must be a multiple of 128"):
        A.prepare_index_queries(rng.standard_normal((1, 192)), rotate=False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_finite_stored_bytes_are_reported(backend):
    rng = np.random.default_rng(6)
    q, lat = _latents(rng, 1, 10, 2)
    bad = lat.copy()
    bad[0, 3, 5] = 0x7F                                                # an FP8 NaN code in a selected entry
    with pytest.raises(ValueError, match="latents: the selected entries decode to non-finite"):
        A.sparse_mla_decode(q, bad, np.array([[1, 3, 4]]), TINY, backend=backend)
    A.sparse_mla_decode(q, bad, np.array([[1, 2, 4]]), TINY, backend=backend)    # entry 3 not selected: fine
    keys = quant.encode_indexer_keys(rng.standard_normal((1, 10, 32)), TINY)
    keys[0, 2, 7] = 0xFF                                                         # an FP8 NaN code in a key
    with pytest.raises(ValueError, match="keys: visible entries decode to non-finite"):
        A.indexer_scores(rng.standard_normal((1, 4, 32)), np.ones((1, 4)), keys, backend=backend)


def test_decode_step_checks_q_before_touching_the_cache():
    rng = np.random.default_rng(7)
    lat, keys, qi, w, q = _decode_inputs(rng, TINY, 1, [100])
    cache = _ScatterCache(capacity=TINY.index_topk, entry_bytes=lat[0].shape[-1], seed=0)
    cache.add_request("r", lat[0])
    with pytest.raises(ValueError, match="q must hold finite"):
        A.decode_step(cache, 0, ["r"], qi, w, keys, np.full_like(q, np.nan), TINY)
    assert not cache.where                                             # nothing was loaded


def _tiered(lens, capacity, seed):
    from ess.storage import TieredCache
    rng = np.random.default_rng(seed)
    lat, keys, qi, w, q = _decode_inputs(rng, TINY, len(lens), lens)
    cache = TieredCache(TINY, capacity=capacity, backend="numba")
    for b, e in enumerate(lat):
        cache.add_request(f"r{b}", e)
    return cache, lat, keys, qi, w, q


def _same_snapshot(a, b):
    assert a.keys() == b.keys()
    np.testing.assert_array_equal(a["device"], b["device"])
    assert a["free_blocks"] == b["free_blocks"] and a["n_metrics"] == b["n_metrics"]
    for rid, pools in a["pools"].items():
        for pa, pb in zip(pools, b["pools"][rid]):
            np.testing.assert_array_equal(pa["token_of"], pb["token_of"])
            np.testing.assert_array_equal(pa["slot_of"], pb["slot_of"])
            assert pa["steps"] == pb["steps"]
            for key in pa["policy"]:
                np.testing.assert_array_equal(pa["policy"][key], pb["policy"][key])


@pytest.mark.parametrize("bad_at", [0, 1, 2])
@pytest.mark.parametrize("kind", ["unknown_id", "indices_past_tokens"])
def test_decode_step_checks_every_request_before_any_step(bad_at, kind):
    lens = [120, 100, 90]
    K = TINY.index_topk
    cache, lat, keys, qi, w, q = _tiered(lens, K + 5, seed=20 + bad_at)
    ids = ["r0", "r1", "r2"]
    A.decode_step(cache, 1, ids, qi, w, keys, q, TINY)                     # some residents to disturb
    before = cache.snapshot()
    good = (qi, w, keys)
    if kind == "unknown_id":
        ids[bad_at] = "nobody"
        err, match = ValueError, "unknown request_id 'nobody'"
    elif kind == "indices_past_tokens":                                    # the indexer cache is longer than the
        rng = np.random.default_rng(1)                                     # request's latent cache: top-K picks a
        extra = quant.encode_indexer_keys(rng.standard_normal((30, TINY.index_head_dim)), TINY)  # token past it
        keys = list(keys)
        keys[bad_at] = np.concatenate([keys[bad_at], extra])
        qi = qi.copy()
        w = w.copy()
        w[bad_at] = 1.0
        qi[bad_at] = quant.decode_indexer_keys(extra[-1], TINY)[None] * 10    # so the new last token scores high
        err, match = ValueError, "outside \\[-1, " + str(lens[bad_at]) + "\\)"
    with pytest.raises(err, match=match):
        A.decode_step(cache, 1, ids, qi, w, keys, q, TINY)
    _same_snapshot(before, cache.snapshot())
    qi, w, keys = good
    with pytest.raises(ValueError, match=f"capacity={K + 5}"):                 # more than the pool holds
        A.decode_step(cache, 1, ["r0", "r1", "r2"], qi, w, keys, q, TINY, topk=K + 6)
    with pytest.raises(ValueError, match="layer must be in \\[0, 4\\)"):
        A.decode_step(cache, 4, ["r0", "r1", "r2"], qi, w, keys, q, TINY)
    with pytest.raises(ValueError, match="request_ids must be distinct"):
        A.decode_step(cache, 0, ["r0", "r1", "r0"], qi, w, keys, q, TINY)
    _same_snapshot(before, cache.snapshot())


def test_decode_step_needs_the_cache_contract():
    rng = np.random.default_rng(13)
    lat, keys, qi, w, q = _decode_inputs(rng, TINY, 1, [50])
    with pytest.raises(TypeError, match="cache must provide plan"):
        A.decode_step(SimpleNamespace(step=None), 0, ["r"], qi, w, keys, q, TINY)


# ---------------------------------------------------------------------------------------------------------------
# decode step through a tiered cache
# ---------------------------------------------------------------------------------------------------------------

class _ScatterCache:
    """A minimal cache with the storage contract (step / device_rows) that scatters entries over random device
    slots and evicts at random: decode_step must not depend on where the rows live."""

    def __init__(self, capacity, entry_bytes, seed):
        self.rng = np.random.default_rng(seed)
        self.pool = np.zeros((capacity, entry_bytes), np.uint8)
        self.where = {}                                                # (rid, layer, token) -> slot
        self.host = {}

    def add_request(self, rid, entries):
        self.host[rid] = entries

    def plan(self, rid, layer, indices, **_):
        if rid not in self.host:
            raise ValueError(f"unknown request_id {rid!r}")
        if not 0 <= layer < self.host[rid].shape[0] or indices.max() >= self.host[rid].shape[1]:
            raise ValueError("layer or indices out of range")

    def step(self, rid, layer, indices, **_):
        slots = np.full(indices.shape, -1, np.int64)
        hit = np.zeros(indices.shape, bool)
        needed = {(rid, layer, int(t)) for t in indices if t >= 0}
        for j, t in enumerate(indices):
            if t < 0:
                continue
            key = (rid, layer, int(t))
            if key in self.where:
                slots[j], hit[j] = self.where[key], True
                continue
            used = set(self.where.values())
            free = [s for s in range(len(self.pool)) if s not in used]
            if not free:
                victims = [k for k in self.where if k not in needed]
                del self.where[victims[self.rng.integers(len(victims))]]
                used = set(self.where.values())
                free = [s for s in range(len(self.pool)) if s not in used]
            s = free[self.rng.integers(len(free))]
            self.pool[s] = self.host[rid][layer, t]
            self.where[key] = slots[j] = s
        return SimpleNamespace(slots=slots, hit=hit)

    def device_rows(self, slots):
        return self.pool[slots]


def _decode_inputs(rng, model, B, lens):
    lat = [quant.encode_latent(rng.standard_normal((model.n_layers, L, model.kv_lora_rank)),
                               rng.standard_normal((model.n_layers, L, model.qk_rope_head_dim)), model)
           for L in lens]
    keys = [quant.encode_indexer_keys(rng.standard_normal((L, model.index_head_dim)), model) for L in lens]
    qi = rng.standard_normal((B, model.index_n_heads, model.index_head_dim))
    w = rng.random((B, model.index_n_heads))
    q = rng.standard_normal((B, model.n_heads, model.latent_dim)).astype(np.float32)
    return lat, keys, qi, w, q


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_step_through_a_scattering_cache_is_bitwise_lossless(backend):
    rng = np.random.default_rng(5)
    lens = [150, 90, 40]
    lat, keys, qi, w, q = _decode_inputs(rng, TINY, 3, lens)
    cache = _ScatterCache(capacity=TINY.index_topk + 7, entry_bytes=lat[0].shape[-1], seed=1)
    for r, entries in enumerate(lat):
        cache.add_request(f"r{r}", entries)
    for layer in (0, 2, 0):                                            # repeat layer 0: hits and evictions
        step = A.decode_step(cache, layer, ["r0", "r1", "r2"], qi, w, keys, q, TINY, backend=backend)
        base = A.resident_attention(q, [e[layer] for e in lat], step.indices, TINY, backend=backend)
        np.testing.assert_array_equal(step.out, base.out)
        np.testing.assert_array_equal(step.lse, base.lse)
        assert (step.indices[2] >= 0).sum() == 40 and (step.indices[0] >= 0).all()


@settings(max_examples=12, deadline=None)
@given(ratio=st.floats(0.05, 1.0), policy=st.sampled_from(["lru", "fifo", "heat"]), B=st.integers(1, 3),
       backend=st.sampled_from(BACKENDS), seed=st.integers(0, 2 ** 16))
def test_decode_step_through_tiered_cache_is_bitwise_lossless(ratio, policy, B, backend, seed):
    from ess.storage import TieredCache
    rng = np.random.default_rng(seed)
    K = TINY.index_topk
    lens = [int(x) for x in rng.integers(K + 1, 6 * K, size=B)]
    lat, keys, qi, w, q = _decode_inputs(rng, TINY, B, lens)
    capacity = max(K, math.ceil(ratio * max(lens)))                   # slots per (request, layer); at least one K
    cache = TieredCache(TINY, capacity=capacity, dtype="fp8", policy=policy, backend="numba" if backend != "torch"
                        else "torch")
    ids = [f"req{b}" for b in range(B)]
    for rid, e in zip(ids, lat):
        cache.add_request(rid, e)
    misses = 0
    for layer in rng.integers(0, TINY.n_layers, size=3):
        step = A.decode_step(cache, int(layer), ids, qi, w, keys, q, TINY, backend=backend)
        base = A.resident_attention(q, [e[int(layer)] for e in lat], step.indices, TINY, backend=backend)
        np.testing.assert_array_equal(step.out, base.out)
        np.testing.assert_array_equal(step.lse, base.lse)
        misses += sum(int(r.miss_pos.size) for r in step.steps)
        qi = qi + rng.standard_normal(qi.shape) * 0.3                  # the next step selects a shifted set
    assert misses > 0                                                  # rows really came in through the cache


def test_lossless_check_sizes_pools_by_the_ratio_rule():
    from ess.layout import pool_slots
    from ess.studies.attention import lossless_check
    df = lossless_check(TINY, ratios=(0.1, 1.0), policies=("lru",), batch=1, steps=3, backend="numba")
    L = df.attrs["config"]["L"]
    assert L == 640                                   # 64 / 0.1 tokens, whole 64-token pages, >= 4 K = 256
    assert df.capacity.tolist() == [pool_slots(TINY, 0.1, L), pool_slots(TINY, 1.0, L)] == [64, 640]
    assert df.bitwise_equal.all() and (df.misses > 0).all()
    assert df.misses.iloc[0] > df.misses.iloc[1]      # step 3 returns to step 1's topic: only the big pool kept it
    with pytest.raises(ValueError, match="fewer than the 64 entries"):
        lossless_check(TINY, ratios=(0.1,), policies=("lru",), n_tokens=256, steps=1)
