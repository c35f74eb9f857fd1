"""Public attention wrappers: top-k rule, sparse = dense when K >= L, split-and-merge = one pass, bad inputs; the
lossless study's pool sizes."""
import dataclasses
import math

import numpy as np
import torch
import pytest

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


@pytest.mark.parametrize("backend", BACKENDS)
def test_topk_tie_rule_order_and_padding(backend):
    # by hand: row 0's best four are the three 3.0s and the 2.0 (position order: 1, 2, 4, 5); with k = 2 the tie
    # at 3.0 goes to the lower positions 1 and 2, not 5; -inf is never chosen, -1 pads
    s = np.array([[1.0, 3.0, 3.0, -np.inf, 2.0, 3.0],
                  [-np.inf, 5.0, -np.inf, -np.inf, -np.inf, -np.inf]], dtype=np.float32)
    np.testing.assert_array_equal(A.topk_indices(s, 4, backend=backend), [[1, 2, 4, 5], [1, -1, -1, -1]])
    np.testing.assert_array_equal(A.topk_indices(s, 2, backend=backend), [[1, 2], [1, -1]])
    np.testing.assert_array_equal(A.topk_indices(s, 8, backend=backend)[0], [0, 1, 2, 4, 5, -1, -1, -1])
    assert A.topk_indices(s, 1, backend=backend).shape == (2, 1)
    t = A.topk_indices(torch.from_numpy(s), 2, backend=backend if backend != "reference" else "torch")
    assert isinstance(t, torch.Tensor) and t.tolist() == [[1, 2], [1, -1]]


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
