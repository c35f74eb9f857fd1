"""The real model's indexer kernels (ess.kernels.gqa_indexer): every fast path against the float64 reference over
odd shapes, the reference against the formula worked by hand, the FP8 decoding of every byte, and the arguments."""
import math

import numpy as np
import pytest
import torch

from ess.kernels.gqa_indexer import gqa_indexer_scores
from ess.quant import FP8_E4M3_VALUES

FAST = ["numba", "torch"]


def _case(rng, B, L, H, Hkv, hd, nan_free=True):
    q = rng.standard_normal((B, H, hd)).astype(np.float32)
    codes = rng.integers(0, 256, (B, L, Hkv * hd)).astype(np.uint8)
    if nan_free:
        codes[(codes & 0x7F) == 0x7F] = 0x7E                     # 0x7f / 0xff are FP8 NaN
    scales = (rng.random((B, L, Hkv)) * 0.05).astype(np.float32)
    lengths = rng.integers(0, L + 1, B).astype(np.int64)
    lengths[0] = L
    return q, codes, scales, lengths


def test_reference_is_the_formula_by_hand():
    # one request, two tokens, H = 2 heads on one KV head (hd = 1): keys 1.0 (code 0x38) and 2.0 (code 0x40) times
    # scale 0.5 -> 0.5 and 1.0; q = (2, -2). Head 0 logits 1, 2 -> softmax (1/(1+e), e/(1+e)); head 1 logits -1, -2 ->
    # (e/(1+e), 1/(1+e)); the sum over heads is 1 for both tokens
    assert FP8_E4M3_VALUES[0x38] == 1.0 and FP8_E4M3_VALUES[0x40] == 2.0
    q = np.array([[[2.0], [-2.0]]], np.float32)
    codes = np.array([[[0x38], [0x40]]], np.uint8)
    scales = np.full((1, 2, 1), 0.5, np.float32)
    got = gqa_indexer_scores(q, codes, scales, np.array([2]), backend="reference")
    np.testing.assert_allclose(got, [[1.0, 1.0]], rtol=1e-12)
    # three heads on two KV heads would not divide; with H = 1, hd = 2 and sqrt(hd) scaling: logits (1 x 1 + 1 x 1)
    # / sqrt(2) and 0 -> softmax (e^a / (e^a + 1), 1 / (e^a + 1)), a = sqrt(2)
    q = np.array([[[1.0, 1.0]]], np.float32)
    codes = np.array([[[0x38, 0x38], [0x00, 0x00]], [[0, 0], [0, 0]]], np.uint8)[:1]
    got = gqa_indexer_scores(q, codes, np.ones((1, 2, 1), np.float32), np.array([2]), backend="reference")
    a = math.sqrt(2.0)
    np.testing.assert_allclose(got, [[math.exp(a) / (math.exp(a) + 1), 1 / (math.exp(a) + 1)]], rtol=1e-7)


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("B,L,H,Hkv,hd", [(1, 1, 1, 1, 1), (2, 37, 6, 2, 8), (3, 301, 9, 3, 64), (2, 1029, 4, 4, 7),
                                          (1, 5, 3, 1, 5), (4, 63, 12, 3, 24)])
def test_fast_paths_match_the_reference(backend, B, L, H, Hkv, hd):
    rng = np.random.default_rng(L * 31 + H)
    q, codes, scales, lengths = _case(rng, B, L, H, Hkv, hd)
    ref = gqa_indexer_scores(q, codes, scales, lengths, backend="reference")
    got = gqa_indexer_scores(q, codes, scales, lengths, backend=backend)
    tensors = gqa_indexer_scores(*map(torch.from_numpy, (q, codes, scales, lengths)), backend=backend)
    assert isinstance(tensors, torch.Tensor) and np.array_equal(tensors.numpy(), got)
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref))
    for b in range(B):                                   # -inf exactly past each request's tokens
        assert np.isneginf(ref[b, lengths[b]:]).all() and np.isfinite(ref[b, :lengths[b]]).all()
        if lengths[b]:
            assert ref[b, :lengths[b]].astype(float).sum() == pytest.approx(H, rel=1e-6)   # each head sums to 1
    vis = np.isfinite(ref)
    np.testing.assert_allclose(got[vis], ref[vis], rtol=2e-5, atol=1e-6 * max(1.0, np.abs(ref[vis]).max()))


@pytest.mark.parametrize("backend", ["reference"] + FAST)
def test_a_request_s_scores_do_not_depend_on_the_batch(backend):
    # what makes DBA's halves select what the whole batch selects: request b's scores, bit for bit, alone or batched
    rng = np.random.default_rng(9)
    q, codes, scales, lengths = _case(rng, 3, 200, 9, 3, 64)
    lengths[:] = [200, 77, 150]
    whole = gqa_indexer_scores(q, codes, scales, lengths, backend=backend)
    for b in range(3):
        alone = gqa_indexer_scores(q[b:b + 1], codes[b:b + 1], scales[b:b + 1], lengths[b:b + 1], backend=backend)
        np.testing.assert_array_equal(alone[0], whole[b])
        short = gqa_indexer_scores(q[b:b + 1], np.ascontiguousarray(codes[b:b + 1, :lengths[b]]),
                                   np.ascontiguousarray(scales[b:b + 1, :lengths[b]]), lengths[b:b + 1],
                                   backend=backend)
        np.testing.assert_array_equal(short[0], whole[b, :lengths[b]])       # nor on the buffer's length


@pytest.mark.parametrize("backend", ["reference"] + FAST)
def test_every_fp8_byte_is_read_as_its_value(backend):
    # token s holds byte s on its only dimension, the query picks it out with weight 1 and a second head sees zeros:
    # the logits are the byte values, so each token's score reveals the value read; NaN bytes make the request NaN
    codes = np.arange(256, dtype=np.uint8).reshape(1, 256, 1)
    finite = (np.arange(256) & 0x7F) != 0x7F
    q = np.array([[[1e-3]]], np.float32)
    scales = np.ones((1, 256, 1), np.float32)
    keep = np.ascontiguousarray(codes[:, finite])
    got = gqa_indexer_scores(q, keep, scales[:, finite], np.array([keep.shape[1]]), backend=backend)[0]
    v = FP8_E4M3_VALUES[finite].astype(np.float64) * 1e-3
    want = np.exp(v - v.max()) / np.exp(v - v.max()).sum()
    np.testing.assert_allclose(got, want, rtol=2e-5)
    bad = gqa_indexer_scores(q, codes, scales, np.array([256]), backend=backend)[0]
    assert np.isnan(bad).all()


def test_bad_arguments_name_what_is_wrong():
    rng = np.random.default_rng(0)
    q, codes, scales, lengths = _case(rng, 2, 10, 6, 2, 4)
    with pytest.raises(ValueError, match="codes must be a 3-D uint8"):
        gqa_indexer_scores(q, codes.astype(np.int16), scales, lengths)
    with pytest.raises(ValueError, match="multiple of Hkv"):
        gqa_indexer_scores(np.ascontiguousarray(q[:, :5]), codes, scales, lengths)
    with pytest.raises(ValueError, match="lengths must have shape"):
        gqa_indexer_scores(q, codes, scales, lengths[:1])
    with pytest.raises(ValueError, match="C-contiguous"):
        gqa_indexer_scores(q, codes[:, ::2], scales[:, ::2], lengths)
    with pytest.raises(TypeError, match="all NumPy arrays or all torch tensors"):
        gqa_indexer_scores(torch.from_numpy(q), codes, scales, lengths)
    with pytest.raises(ValueError, match="backend"):
        gqa_indexer_scores(q, codes, scales, lengths, backend="cupy")


@pytest.mark.cuda
def test_cuda_matches_the_reference():
    rng = np.random.default_rng(3)
    q, codes, scales, lengths = _case(rng, 3, 1029, 9, 3, 64)
    ref = gqa_indexer_scores(q, codes, scales, lengths, backend="reference")
    got = gqa_indexer_scores(*(torch.from_numpy(a).cuda() for a in (q, codes, scales, lengths)))
    assert got.is_cuda
    got = got.cpu().numpy()
    vis = np.isfinite(ref)
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref))
    np.testing.assert_allclose(got[vis], ref[vis], rtol=2e-5, atol=1e-6)
