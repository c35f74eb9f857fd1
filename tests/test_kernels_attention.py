"""Every attention backend against the float64 reference, on odd shapes, from the same stored bytes."""
import dataclasses

import numpy as np
import pytest

from ess import attention as A
from ess import quant
from ess.kernels.attention import reference
from ess.specs import model_spec

TINY = model_spec("tiny")
# a second geometry with two FP8 tiles and an odd rope width (kernels must not assume the real sizes)
WIDE = dataclasses.replace(model_spec("tiny"), kv_lora_rank=256, qk_rope_head_dim=24, index_head_dim=24,
                           index_n_heads=3)
CPU_BACKENDS = ["numba", "torch"]


def _index_case(rng, B, L, Hi, D):
    keys = quant.encode_indexer_keys(rng.standard_normal((B, L, D)), dataclasses.replace(TINY, index_head_dim=D))
    q = rng.standard_normal((B, Hi, D)).astype(np.float32)
    w = rng.random((B, Hi)).astype(np.float32)
    lengths = rng.integers(1, L + 1, size=B)
    lengths[0] = L
    return q, w, keys, lengths


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("B,L,Hi,D", [(1, 1, 1, 8), (2, 37, 1, 24), (3, 301, 7, 32), (1, 1029, 4, 128),
                                      (2, 5, 3, 4)])
def test_indexer_backends_match_reference(backend, B, L, Hi, D):
    rng = np.random.default_rng(L * 7 + Hi)
    q, w, keys, lengths = _index_case(rng, B, L, Hi, D)
    ref = A.indexer_scores(q, w, keys, lengths, backend="reference")
    got = A.indexer_scores(q, w, keys, lengths, backend=backend)
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref))
    vis = np.isfinite(ref)
    np.testing.assert_allclose(got[vis], ref[vis], rtol=1e-4, atol=1e-4 * np.abs(ref[vis]).max())
    # causal: invisible exactly beyond each request's length
    for b in range(B):
        assert np.isfinite(ref[b, :lengths[b]]).all() and np.isneginf(ref[b, lengths[b]:]).all()


def test_indexer_reference_is_the_formula():
    rng = np.random.default_rng(0)
    q, w, keys, lengths = _index_case(rng, 1, 9, 3, 8)
    k = quant.decode_indexer_keys(keys, dataclasses.replace(TINY, index_head_dim=8)).astype(np.float64)[0]
    want = np.array([sum(w[0, j] * max(q[0, j] @ k[s], 0.0) for j in range(3)) for s in range(9)])
    np.testing.assert_allclose(A.indexer_scores(q, w, keys, backend="reference")[0], want, rtol=1e-6)


def _latent_case(rng, model, B, L, H, dtype):
    lat = quant.encode_latent(rng.standard_normal((B, L, model.kv_lora_rank)),
                              rng.standard_normal((B, L, model.qk_rope_head_dim)), model, dtype)
    q = rng.standard_normal((B, H, model.latent_dim)).astype(np.float32)
    return q, lat


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("dtype", ["fp8", "bf16"])
@pytest.mark.parametrize("model,B,L,H,K", [(TINY, 1, 1, 1, 1), (TINY, 2, 37, 5, 11), (TINY, 3, 50, 17, 64),
                                           (WIDE, 2, 101, 3, 33), (WIDE, 1, 7, 4, 3), (TINY, 2, 513, 19, 129)])
def test_sparse_mla_backends_match_reference(backend, dtype, model, B, L, H, K):
    rng = np.random.default_rng(L + H + K)
    q, lat = _latent_case(rng, model, B, L, H, dtype)
    idx = np.stack([rng.permutation(L)[:K] for _ in range(B)]) if K <= L else None
    if idx is None:                                                   # K > L: padded with -1 in random places
        idx = np.full((B, K), -1)
        for b in range(B):
            idx[b, rng.choice(K, L, replace=False)] = rng.permutation(L)
    if B > 1:
        idx[-1, ::3] = -1                                             # padding in the middle of a row
    ref = A.sparse_mla_decode(q, lat, idx, model, dtype=dtype, backend="reference")
    got = A.sparse_mla_decode(q, lat, idx, model, dtype=dtype, backend=backend)
    np.testing.assert_allclose(got.out, ref.out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got.lse, ref.lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["reference"] + CPU_BACKENDS)
def test_empty_selection_gives_zero_and_minus_inf(backend):
    rng = np.random.default_rng(1)
    q, lat = _latent_case(rng, TINY, 2, 10, 3, "fp8")
    idx = np.array([[-1, -1, -1], [4, -1, 2]])
    res = A.sparse_mla_decode(q, lat, idx, TINY, backend=backend)
    assert np.all(res.out[0] == 0) and np.all(np.isneginf(res.lse[0]))
    assert np.all(np.isfinite(res.lse[1]))


def test_reference_latent_decoding_equals_quant_module():
    rng = np.random.default_rng(2)
    for dtype in ("fp8", "bf16"):
        _, lat = _latent_case(rng, WIDE, 1, 9, 1, dtype)
        ours = reference.decode_latent_rows(lat[0], dtype == "fp8", 256, 24, 128)
        # fp8 (4 significant bits) x float32 scale is exact in float64, so rounding it to float32 gives the float32
        # product of quant.decode_latent exactly
        np.testing.assert_array_equal(ours.astype(np.float32), quant.decode_latent(lat[0], WIDE, dtype))


@pytest.mark.cuda
def test_torch_cuda_matches_reference():
    rng = np.random.default_rng(3)
    q, w, keys, lengths = _index_case(rng, 2, 300, 5, 32)
    ref = A.indexer_scores(q, w, keys, lengths, backend="reference")
    got = A.indexer_scores(q, w, keys, lengths, backend="torch", device="cuda")
    vis = np.isfinite(ref)
    np.testing.assert_allclose(got[vis], ref[vis], rtol=1e-3, atol=1e-3 * np.abs(ref[vis]).max())
    q, lat = _latent_case(rng, TINY, 2, 100, 7, "fp8")
    idx = np.stack([rng.permutation(100)[:40] for _ in range(2)])
    r = A.sparse_mla_decode(q, lat, idx, TINY, backend="reference")
    g = A.sparse_mla_decode(q, lat, idx, TINY, backend="torch", device="cuda")
    np.testing.assert_allclose(g.out, r.out, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(g.lse, r.lse, rtol=1e-4, atol=1e-4)


def test_numba_workspace_is_per_thread():
    """Two threads decoding different inputs of the same shape at once each get their own result (the scratch
    buffer of the dequantised entries is per thread), and one thread reuses its buffer between calls."""
    import threading

    from ess.kernels.attention import numba_cpu, reference
    rng = np.random.default_rng(3)
    m = TINY
    fmt = (True, m.kv_lora_rank, m.qk_rope_head_dim, m.latent_fp8_tile)
    cases = []
    for _ in range(2):
        pool = quant.encode_latent(rng.standard_normal((300, m.kv_lora_rank)),
                                   rng.standard_normal((300, m.qk_rope_head_dim)), m)
        q = rng.standard_normal((2, 4, m.latent_dim)).astype(np.float32)
        idx = np.stack([rng.permutation(300)[:64] for _ in range(2)]).astype(np.int64)
        want_o, want_l = np.empty((2, 4, m.kv_lora_rank), np.float32), np.empty((2, 4), np.float32)
        reference.sparse_mla_decode(q, pool, idx, 0.1, *fmt, want_o, want_l)
        cases.append((q, pool, idx, want_o))
    numba_cpu.sparse_mla_decode(*cases[0][:3], 0.1, *fmt, np.empty((2, 4, m.kv_lora_rank), np.float32),
                                np.empty((2, 4), np.float32))                  # compile outside the threads
    errors, buffers = [], {}
    start = threading.Barrier(2)

    def run(i):
        q, pool, idx, want = cases[i]
        start.wait()
        for _ in range(30):
            out, lse = np.empty((2, 4, m.kv_lora_rank), np.float32), np.empty((2, 4), np.float32)
            numba_cpu.sparse_mla_decode(q, pool, idx, 0.1, *fmt, out, lse)
            if not np.allclose(out, want, rtol=1e-4, atol=1e-5):
                errors.append(i)
        buffers[i] = numba_cpu._workspace((2, 64, m.latent_dim))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert not np.shares_memory(buffers[0], buffers[1])                   # one buffer per thread
    here = numba_cpu._workspace((2, 64, m.latent_dim))
    assert np.shares_memory(here, numba_cpu._workspace((2, 64, m.latent_dim)))     # reused by the same thread
    assert np.shares_memory(here, numba_cpu._workspace((1, 64, m.latent_dim)))     # a smaller shape: the same memory
