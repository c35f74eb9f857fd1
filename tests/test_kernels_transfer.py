"""Transfer kernels against the NumPy reference on odd sizes, -1 padding, and validation."""
import numpy as np
import pytest

from ess.kernels import cuda_available
from ess.kernels.transfer import copy_rows, gather_rows, scatter_rows
from ess.kernels.transfer import reference

CPU_BACKENDS = ["numba", "torch"]
SHAPES = [  # (pool rows N, row bytes W, pairs K)
    (37, 656, 23),      # K not a power of two
    (5, 656, 11),       # L < K: rows repeat in a gather
    (1000, 164, 129),   # tiny model's 164-byte entry
    (64, 1152, 63),     # BF16 layout
    (3, 13, 7),         # width not a multiple of 8 (byte path)
    (2048, 656, 2048),  # big enough for the parallel path
]


def _case(n, w, k, seed, pad=0.2):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 256, (n, w), dtype=np.uint8)
    idx = rng.integers(0, n, k).astype(np.int64)
    idx[rng.random(k) < pad] = -1
    return src, idx


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("n,w,k", SHAPES)
def test_gather_matches_reference(backend, n, w, k):
    src, idx = _case(n, w, k, seed=n + k)
    want = reference.copy_rows(src, idx, np.zeros((k, w), np.uint8), np.arange(k))
    got = gather_rows(src, idx, backend=backend)
    np.testing.assert_array_equal(got, want)
    assert (got[idx < 0] == 0).all() and (got[idx >= 0] == src[idx[idx >= 0]]).all()


@pytest.mark.parametrize("backend", CPU_BACKENDS + ["reference"])
@pytest.mark.parametrize("n,w,k", SHAPES)
def test_copy_rows_into_slots(backend, n, w, k):
    rng = np.random.default_rng(k)
    src, s_idx = _case(n, w, k, seed=k)
    m = k + 17
    dst0 = rng.integers(0, 256, (m, w), dtype=np.uint8)
    d_idx = rng.permutation(m)[:k].astype(np.int64)         # distinct destinations
    d_idx[rng.random(k) < 0.1] = -1
    want = reference.copy_rows(src, s_idx, dst0.copy(), d_idx)
    got = copy_rows(src, s_idx, dst0.copy(), d_idx, backend=backend)
    np.testing.assert_array_equal(got, want)
    untouched = np.setdiff1d(np.arange(m), d_idx[(d_idx >= 0) & (s_idx >= 0)])
    np.testing.assert_array_equal(got[untouched], dst0[untouched])


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_scatter_and_per_row_torch(backend):
    rng = np.random.default_rng(3)
    rows = rng.integers(0, 256, (9, 656), dtype=np.uint8)
    idx = np.array([4, -1, 0, 11, 2, 7, -1, 3, 5], np.int64)
    dst = np.zeros((12, 656), np.uint8)
    scatter_rows(rows, idx, dst, backend=backend)
    np.testing.assert_array_equal(dst[idx[idx >= 0]], rows[idx >= 0])
    dst2 = np.zeros_like(dst)
    scatter_rows(rows, idx, dst2, backend="torch", mode="per_row")
    np.testing.assert_array_equal(dst2, dst)


def test_numba_sequential_and_parallel_agree():
    from ess.kernels.transfer import numba_cpu
    src, idx = _case(300, 656, 257, seed=1)
    a = numba_cpu.copy_rows(src, idx, np.zeros((257, 656), np.uint8), np.arange(257), parallel=True)
    b = numba_cpu.copy_rows(src, idx, np.zeros((257, 656), np.uint8), np.arange(257), parallel=False)
    np.testing.assert_array_equal(a, b)


def test_empty_and_all_padding():
    src, _ = _case(4, 656, 1, seed=0)
    for backend in CPU_BACKENDS:
        assert gather_rows(src, np.empty(0, np.int64), backend=backend).shape == (0, 656)
        out = gather_rows(src, np.full(5, -1, np.int64), backend=backend)
        assert (out == 0).all()


@pytest.mark.parametrize("bad,err,match", [
    (np.array([0, 4], np.int64), ValueError, r"idx holds 4, outside \[-1, 4\)"),
    (np.array([0, -2], np.int64), ValueError, "outside"),
    (np.array([0.0, 1.0]), TypeError, "integers"),
    (np.zeros((2, 2), np.int64), ValueError, "1-D"),
    ([0, 1], TypeError, "NumPy integer array"),
])
def test_gather_rejects_bad_indices(bad, err, match):
    src, _ = _case(4, 656, 1, seed=0)
    with pytest.raises(err, match=match):
        gather_rows(src, bad)


def test_validation_of_rows():
    src, idx = _case(4, 656, 3, seed=0)
    with pytest.raises(TypeError, match="uint8"):
        gather_rows(src.astype(np.int16), idx)
    with pytest.raises(ValueError, match="C-contiguous"):
        gather_rows(np.asfortranarray(src), idx)
    with pytest.raises(ValueError, match="2-D"):
        gather_rows(src.reshape(-1), idx)
    with pytest.raises(ValueError, match="rows are 656 B but dst rows are 600 B"):
        copy_rows(src, idx, np.zeros((3, 600), np.uint8), np.arange(3))
    with pytest.raises(ValueError, match="more than once"):
        copy_rows(src, np.array([0, 1]), np.zeros((3, 656), np.uint8), np.array([2, 2]))
    with pytest.raises(ValueError, match="same length"):
        copy_rows(src, np.array([0, 1]), np.zeros((3, 656), np.uint8), np.array([2]))
    with pytest.raises(ValueError, match="out must have shape"):
        gather_rows(src, idx, out=np.zeros((2, 656), np.uint8))
    with pytest.raises(ValueError, match="backend must be"):
        gather_rows(src, idx, backend="cupy")


@pytest.mark.parametrize("backend", ["reference", "numba", "torch"])
def test_unknown_mode_is_rejected_on_every_backend(backend):
    src, idx = _case(6, 656, 3, seed=1)
    dst = np.zeros((3, 656), np.uint8)
    for call in (lambda m: copy_rows(src, idx, dst, np.arange(3), backend=backend, mode=m),
                 lambda m: gather_rows(src, idx, backend=backend, mode=m),
                 lambda m: scatter_rows(src[:3], np.arange(3), dst, backend=backend, mode=m)):
        with pytest.raises(ValueError, match="mode must be one of .*got 'bogus'"):
            call("bogus")
        with pytest.raises(ValueError, match="mode must be one of"):
            call(None)
    assert not dst.any()                                                   # nothing was copied
    copy_rows(src, idx, dst, np.arange(3), backend=backend, mode="staged")  # a valid mode works everywhere
    np.testing.assert_array_equal(dst, reference.copy_rows(src, idx, np.zeros_like(dst), np.arange(3)))


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["zero_copy", "staged", "per_row"])
def test_cuda_modes_match_reference(mode):
    import torch
    n, w, k = 1000, 656, 333
    src, idx = _case(n, w, k, seed=5)
    host = torch.from_numpy(src).pin_memory()
    dev = torch.zeros((k + 5, w), dtype=torch.uint8, device="cuda")
    d_idx = np.random.default_rng(0).permutation(k + 5)[:k].astype(np.int64)
    copy_rows(host, idx, dev, d_idx, backend="torch", mode=mode)
    torch.cuda.synchronize()
    want = reference.copy_rows(src, idx, np.zeros((k + 5, w), np.uint8), d_idx)
    np.testing.assert_array_equal(dev.cpu().numpy(), want)
    back = torch.zeros((n, w), dtype=torch.uint8).pin_memory()            # device -> host (write-back path)
    copy_rows(dev, d_idx, back, np.where(idx >= 0, np.arange(k), -1), backend="torch", mode=mode)
    torch.cuda.synchronize()
    ok = (idx >= 0) & (d_idx >= 0)
    np.testing.assert_array_equal(back.numpy()[np.arange(k)[ok]], src[idx[ok]])


@pytest.mark.parametrize("prefetch_ok", [True, False])
def test_numba_with_and_without_prefetch(monkeypatch, prefetch_ok):
    from ess.kernels.transfer import numba_cpu
    monkeypatch.setattr(numba_cpu, "_PREFETCH_OK", prefetch_ok)
    src, idx = _case(500, 656, 301, seed=11)
    for parallel in (True, False):
        got = numba_cpu.copy_rows(src, idx, np.zeros((301, 656), np.uint8), np.arange(301), parallel=parallel)
        np.testing.assert_array_equal(got, reference.copy_rows(src, idx, np.zeros((301, 656), np.uint8),
                                                               np.arange(301)))
