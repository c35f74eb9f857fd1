"""Public attention wrappers: top-k rule, sparse = dense when K >= L, split-and-merge = one pass, bad inputs, and the
decode step through a tiered cache equal, bit for bit, to attention over an all-resident cache."""
import dataclasses
import importlib.util
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
    idx = np.zeros((2, 4), dtype=np.int64)
    keys = quant.encode_indexer_keys(rng.standard_normal((2, 10, 32)), TINY)
    qi, w = rng.standard_normal((2, 4, 32)), rng.random((2, 4))
    with pytest.raises(ValueError, match="k must be > 0"):
        A.topk_indices(np.zeros((1, 3)), 0)
    with pytest.raises(TypeError, match="k must be a positive integer"):
        A.topk_indices(np.zeros((1, 3)), 2.5)
    with pytest.raises(ValueError, match="weights must have shape"):
        A.indexer_scores(qi, w[:, :3], keys)
    with pytest.raises(ValueError, match="keys must have shape"):
        A.indexer_scores(qi[:, :, :16], w, keys)
    with pytest.raises(ValueError, match="q must hold finite"):
        A.indexer_scores(np.where(qi > 1, np.nan, qi), w, keys)
    with pytest.raises(ValueError, match="lengths must be in"):
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
    with pytest.raises(ValueError, match="sm_scale must be finite and > 0"):
        A.sparse_mla_decode(q, lat, idx, TINY, sm_scale=-1.0)
    with pytest.raises(TypeError, match="latents must be uint8"):
        A.sparse_mla_decode(q, lat.astype(np.int16), idx, TINY)
    with pytest.raises(ValueError, match="backend must be"):
        A.sparse_mla_decode(q, lat, idx, TINY, backend="cuda-magic")


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
    keys[0, 2, 32:36] = np.frombuffer(np.float32(np.inf).tobytes(), np.uint8)    # an infinite scale
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


_HAS_STORAGE = importlib.util.find_spec("ess.storage") is not None


@pytest.mark.skipif(not _HAS_STORAGE, reason="ess.storage (the tiered cache) is not in this checkout yet")
@settings(max_examples=12, deadline=None)
@given(ratio=st.floats(0.05, 1.0), policy=st.sampled_from(["lru", "fifo", "importance"]), B=st.integers(1, 3),
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
