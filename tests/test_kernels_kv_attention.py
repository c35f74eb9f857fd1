"""The real model's sparse attention over its K/V pool (ess.kernels.kv_attention): every fast path against the
float64 reference over odd shapes, the combination against dense attention worked out independently, and the
property the lossless offload rests on: a column's score is the same bits whichever columns are scored with it."""
import math

import numpy as np
import pytest
import torch

from ess.kernels.kv_attention import combine_columns, score_columns

FAST = ["numba", "torch"]


def _case(rng, B, K, H, Hkv, hd, N):
    q = rng.standard_normal((B, H, hd)).astype(np.float32)
    pool = rng.standard_normal((N, 2, Hkv, hd)).astype(np.float32)
    own_v = rng.standard_normal((B, Hkv, hd)).astype(np.float32)
    n_valid = rng.integers(1, K + 1, B)
    slots = np.full((B, K), -1, np.int64)
    for b in range(B):
        slots[b, :n_valid[b]] = rng.choice(N, n_valid[b], replace=False)
    return q, pool, own_v, slots


def _all(q, pool, own_v, slots, backend, split=1):
    """Score every valid column (in ``split`` calls, columns dealt round robin), then combine every request."""
    B, K = slots.shape
    H = q.shape[1]
    scores = np.full((B, H, K + 1), -np.inf, np.float32)
    scale = 1 / math.sqrt(q.shape[2])
    own = np.einsum("bgjd,bgd->bgj", q.reshape(B, pool.shape[2], -1, q.shape[2]), own_v)  # any own score
    scores[:, :, K] = (own.reshape(B, H) * scale).astype(np.float32)
    b, c = np.nonzero(slots >= 0)
    for part in range(split):
        pick = np.arange(part, b.size, split)
        score_columns(q, pool, b[pick], c[pick], slots[b[pick], c[pick]], scale, scores, backend=backend)
    out = np.zeros((B, H, q.shape[2]), np.float32)
    combine_columns(scores, pool, slots, own_v, np.arange(B), out, backend=backend)
    return scores, out


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("B,K,H,Hkv,hd,N", [(1, 1, 1, 1, 1, 3), (2, 37, 6, 2, 8, 100), (3, 64, 9, 3, 64, 500),
                                            (2, 129, 4, 4, 7, 300), (4, 5, 12, 3, 24, 9)])
def test_fast_paths_match_the_reference(backend, B, K, H, Hkv, hd, N):
    rng = np.random.default_rng(K * 7 + H)
    case = _case(rng, B, K, H, Hkv, hd, N)
    ref_s, ref_o = _all(*case, "reference")
    got_s, got_o = _all(*case, backend)
    np.testing.assert_array_equal(np.isneginf(got_s), np.isneginf(ref_s))
    fin = np.isfinite(ref_s)
    np.testing.assert_allclose(got_s[fin], ref_s[fin], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_o, ref_o, rtol=1e-4, atol=1e-5)
    t = [torch.from_numpy(a) for a in case]                                # tensors in, the same bits
    _, got_t = _all(*[a.numpy() for a in t], backend)
    np.testing.assert_array_equal(got_t, got_o)


@pytest.mark.parametrize("backend", ["reference"] + FAST)
def test_a_column_s_score_does_not_depend_on_the_others(backend):
    # what makes DA bit for bit equal to the serial schedule: columns scored in 1, 2 or 3 calls give the same bits
    rng = np.random.default_rng(3)
    case = _case(rng, 3, 50, 9, 3, 64, 400)
    s1, o1 = _all(*case, backend)
    for split in (2, 3):
        s, o = _all(*case, backend, split=split)
        np.testing.assert_array_equal(s, s1)
        np.testing.assert_array_equal(o, o1)


def test_the_combination_is_dense_attention_over_the_columns():
    # worked out without the kernels: softmax over the selected keys and the own key, weights times values
    rng = np.random.default_rng(5)
    q, pool, own_v, slots = _case(rng, 2, 6, 4, 2, 8, 20)
    own_k = rng.standard_normal(own_v.shape).astype(np.float32)
    scale = 1 / math.sqrt(8)
    scores = np.full((2, 4, 7), -np.inf, np.float32)
    b, c = (np.ascontiguousarray(x) for x in np.nonzero(slots >= 0))
    score_columns(q, pool, b, c, slots[b, c], scale, scores, backend="reference")
    for r in range(2):
        for h in range(4):
            scores[r, h, 6] = scale * q[r, h] @ own_k[r, h // 2]
    out = np.zeros((2, 4, 8), np.float32)
    combine_columns(scores, pool, slots, own_v, np.arange(2), out, backend="reference")
    for r in range(2):
        keys = np.concatenate([pool[slots[r][slots[r] >= 0], 0], own_k[r][None]])          # (n + 1, Hkv, hd)
        vals = np.concatenate([pool[slots[r][slots[r] >= 0], 1], own_v[r][None]])
        for h in range(4):
            logit = keys[:, h // 2].astype(float) @ q[r, h].astype(float) * scale
            w = np.exp(logit - logit.max())
            np.testing.assert_allclose(out[r, h], (w / w.sum()) @ vals[:, h // 2], rtol=1e-6, atol=1e-7)


def test_bad_arguments_name_what_is_wrong():
    rng = np.random.default_rng(0)
    q, pool, own_v, slots = _case(rng, 2, 5, 4, 2, 8, 20)
    scores = np.zeros((2, 4, 6), np.float32)
    with pytest.raises(ValueError, match="b, cols and rows must have one length"):
        score_columns(q, pool, np.zeros(2, np.int64), np.zeros(3, np.int64), np.zeros(3, np.int64), 1.0, scores)
    with pytest.raises(ValueError, match="pool must be a 4-D float32"):
        score_columns(q, pool.astype(np.float64), np.zeros(1, np.int64), np.zeros(1, np.int64),
                      np.zeros(1, np.int64), 1.0, scores)
    with pytest.raises(ValueError, match="slots \\(B, C - 1\\)"):
        combine_columns(scores, pool, slots[:, :3].copy(), own_v, np.arange(2), np.zeros((2, 4, 8), np.float32))
    with pytest.raises(TypeError, match="all NumPy arrays or all torch tensors"):
        combine_columns(torch.from_numpy(scores), pool, slots, own_v, np.arange(2), np.zeros((2, 4, 8), np.float32))


@pytest.mark.cuda
def test_cuda_matches_the_reference():
    rng = np.random.default_rng(11)
    case = _case(rng, 3, 129, 9, 3, 64, 700)
    ref_s, ref_o = _all(*case, "reference")
    q, pool, own_v, slots = (torch.from_numpy(a).cuda() for a in case)
    B, K = slots.shape
    scores = torch.full((B, 9, K + 1), float("-inf"), device="cuda")
    scores[:, :, K] = torch.from_numpy(ref_s[:, :, K]).cuda()
    b, c = (x.contiguous() for x in torch.nonzero(slots >= 0, as_tuple=True))
    score_columns(q, pool, b, c, slots[b, c].contiguous(), 1 / 8, scores)
    out = torch.zeros((B, 9, 64), device="cuda")
    combine_columns(scores, pool, slots, own_v, torch.arange(B, device="cuda"), out)
    np.testing.assert_allclose(out.cpu().numpy(), ref_o, rtol=1e-4, atol=1e-5)
