"""Kernel arguments a careless caller passes (ess.kernels). Before:

* a copy whose source and destination share memory gave one answer on the torch backend (every row read before
  any is written) and another on the NumPy reference and Numba (rows written earlier in the call read later);
  every backend now reads every source row before writing any, as if the source were a separate array;
* a top-K width near 2**31 allocated a (B, k) position table of gigabytes, all of it -1 padding past the row's
  length; it is now refused beyond :data:`ess.kernels.topk.MAX_PADDED_K`.
"""
import numpy as np
import pytest
import torch

from ess.kernels.topk import MAX_PADDED_K, topk_positions
from ess.kernels.transfer import copy_rows, gather_rows, scatter_rows

BACKENDS = ["reference", "numba", "torch"]


def rows(n, w=16, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, w), dtype=np.uint8)


def expected_copy(src, s_idx, dst, d_idx):
    """The answer as if ``src`` were read whole before ``dst`` is written."""
    src, out = src.copy(), dst.copy()
    for s, d in zip(s_idx, d_idx):
        if s >= 0 and d >= 0:
            out[d] = src[s]
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("as_torch", [False, True], ids=["numpy", "torch"])
def test_a_gather_into_its_own_source_reads_every_row_first(backend, as_torch):
    a = rows(8)
    idx = np.array([1, 0, 3, 2, -1, 5, 4, 0], np.int64)          # row i's new value is row idx[i]'s old value
    want = a.copy()
    for i, j in enumerate(idx):
        if j >= 0:
            want[i] = a[j]
    arr = torch.from_numpy(a.copy()) if as_torch else a.copy()
    gather_rows(arr, idx, out=arr, backend=backend)
    np.testing.assert_array_equal(np.asarray(arr), want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_copy_between_overlapping_views_reads_every_row_first(backend):
    base = rows(12)
    s_idx = np.array([0, 1, 2, 3, 4, 5], np.int64)
    d_idx = np.array([0, 1, 2, 3, 4, 5], np.int64)
    src, dst = base[0:8], base[2:10]                             # dst row i is src row i + 2
    want = expected_copy(src, s_idx, dst, d_idx)
    copy_rows(src, s_idx, dst, d_idx, backend=backend)
    np.testing.assert_array_equal(dst, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_scatter_from_its_own_destination_reads_every_row_first(backend):
    a = rows(6)
    idx = np.array([5, 4, 3, 2, 1, 0], np.int64)
    want = a[::-1].copy()
    scatter_rows(a, idx, a, backend=backend)
    np.testing.assert_array_equal(a, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_separate_arrays_are_copied_as_before(backend):
    src, dst = rows(8), rows(8, seed=1)
    s_idx, d_idx = np.array([7, -1, 2], np.int64), np.array([0, 1, 5], np.int64)
    want = expected_copy(src, s_idx, dst, d_idx)
    copy_rows(src, s_idx, dst, d_idx, backend=backend)
    np.testing.assert_array_equal(dst, want)


@pytest.mark.parametrize("k", [MAX_PADDED_K + 1, 2 ** 30, 2 ** 31 - 1])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_top_k_past_the_row_and_the_padding_bound_is_refused(k, backend):
    with pytest.raises(ValueError, match=r"\bk\b"):
        topk_positions(np.zeros((1, 8), np.float32), k, backend=backend)


def test_a_top_k_up_to_the_bound_or_the_row_length_is_answered():
    s = np.arange(8, dtype=np.float32)[None]
    out = topk_positions(s, 12)
    assert out.tolist() == [[0, 1, 2, 3, 4, 5, 6, 7, -1, -1, -1, -1]]
    assert topk_positions(s, MAX_PADDED_K).shape == (1, MAX_PADDED_K)
    wide = np.zeros((1, MAX_PADDED_K + 5), np.float32)
    assert topk_positions(wide, MAX_PADDED_K + 5).shape == (1, MAX_PADDED_K + 5)   # k <= L: no padding at all
