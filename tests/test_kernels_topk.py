"""Top-K selection (ess.kernels.topk), the library's one rule: every backend against the reference over odd shapes
and heavy ties, the rule worked by hand, and its public face ess.attention.topk_indices on arrays and tensors."""
import numpy as np
import pytest
import torch

from ess.attention import topk_indices
from ess.kernels.topk import topk_positions

BACKENDS = ["reference", "numba", "torch"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_rule_by_hand(backend):
    # row 0: scores by position 0.5 0.9 0.9 -inf 0.2 0.9 0.1; the best 3 are the three 0.9s (1, 2, 5); the best 4 add
    # 0.5 (0); the best 2 take the tie at 0.9 by the lower positions (1, 2). Row 1 has two visible tokens: padded.
    s = np.array([[0.5, 0.9, 0.9, -np.inf, 0.2, 0.9, 0.1],
                  [-np.inf, -np.inf, 3.0, -np.inf, 1.0, -np.inf, -np.inf]])
    assert topk_positions(s, 3, backend=backend).tolist() == [[1, 2, 5], [2, 4, -1]]
    assert topk_positions(s, 4, backend=backend).tolist() == [[0, 1, 2, 5], [2, 4, -1, -1]]
    assert topk_positions(s, 2, backend=backend).tolist() == [[1, 2], [2, 4]]
    assert topk_positions(s, 9, backend=backend).tolist()[0] == [0, 1, 2, 4, 5, 6, -1, -1, -1]
    assert topk_positions(np.full((1, 4), -np.inf), 2, backend=backend).tolist() == [[-1, -1]]


@pytest.mark.parametrize("backend", ["numba", "torch"])
@pytest.mark.parametrize("B,L,k", [(1, 1, 1), (3, 37, 5), (2, 1029, 64), (4, 300, 299), (2, 63, 100), (5, 8, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fast_paths_match_the_reference(backend, B, L, k, dtype):
    rng = np.random.default_rng(L + k)
    s = np.round(rng.standard_normal((B, L)), 1).astype(dtype)       # rounded: many ties at the boundary
    s[rng.random((B, L)) < 0.2] = -np.inf
    ref = topk_positions(s, k, backend="reference")
    np.testing.assert_array_equal(topk_positions(s, k, backend=backend), ref)
    np.testing.assert_array_equal(topk_positions(torch.from_numpy(s), k, backend=backend).numpy(), ref)
    for b in range(B):                                    # sorted, distinct, the best ones
        row = ref[b][ref[b] >= 0]
        assert (np.diff(row) > 0).all()
        vis = np.isfinite(s[b])
        assert row.size == min(k, vis.sum())
        if row.size and row.size < vis.sum():
            assert s[b, row].min() >= np.max(np.delete(s[b], row)[np.isfinite(np.delete(s[b], row))])


def test_topk_indices_takes_arrays_and_tensors_and_checks_the_scores():
    s = np.array([[0.1, 0.9, 0.3, 0.8, 0.05, 0.7]])
    assert topk_indices(s, 3).tolist() == [[1, 3, 5]]
    t = topk_indices(torch.tensor(s, dtype=torch.float32), 3)
    assert isinstance(t, torch.Tensor) and t.tolist() == [[1, 3, 5]]
    for bad in (np.array([[0.1, np.nan]]), torch.tensor([[np.inf, 0.0]])):
        with pytest.raises(ValueError, match="NaN or \\+inf"):
            topk_indices(bad, 1)
    with pytest.raises(ValueError, match="k must be a positive"):
        topk_indices(s, 0)
    with pytest.raises(TypeError, match="float"):
        topk_indices(torch.tensor([[1, 2]]), 1)


@pytest.mark.cuda
def test_cuda_matches_the_reference():
    rng = np.random.default_rng(1)
    s = np.round(rng.standard_normal((3, 2049)), 1).astype(np.float32)
    np.testing.assert_array_equal(topk_positions(torch.from_numpy(s).cuda(), 128).cpu().numpy(),
                                  topk_positions(s, 128, backend="reference"))
