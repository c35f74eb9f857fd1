"""The trace-statistics kernel family (ess.kernels.trace_stats): each Numba kernel against the NumPy reference on
random rows (padding anywhere, positions from a small range so that consecutive rows share entries), the edge
cases (no row, one row, rows that select nothing), worked examples, and the one Fig. 2 overlap used by both
ess.traces.adjacent_overlap and the trace generator's calibration."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ess import tracegen as G
from ess.locality import LocalityModel
from ess import traces as T
from ess.kernels import trace_stats as K

REF, FAST = K.get("reference"), K.get("numba")
BOTH = pytest.mark.parametrize("mod", [REF, FAST], ids=["reference", "numba"])


def _rows(rng, n_rows, W, n_pos, dup=False):
    rows = np.full((n_rows, W), -1, np.int32)
    for t in range(n_rows):
        n = int(rng.integers(0, W + 1))
        rows[t, rng.choice(W, n, replace=False)] = rng.choice(n_pos, n, replace=False)
    if dup and n_rows and W > 1:                      # one row repeats a position
        t = int(rng.integers(n_rows))
        rows[t, :2] = int(rng.integers(n_pos))
    return rows


def _all(mod, rows, n_pos, window, within):
    over = np.full(max(rows.shape[0] - 1, 0), -5.0)
    sizes = np.full(max(rows.shape[0] - window + 1, 0), -5, np.int64)
    mod.adjacent_overlaps(rows, n_pos, over)
    mod.union_sizes(rows, n_pos, window, sizes)
    return over, sizes, tuple(int(v) for v in mod.leave_return(rows, n_pos, within))


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_rows=st.integers(0, 25), W=st.integers(1, 7), spread=st.integers(0, 10),
       window=st.integers(1, 5), within=st.integers(1, 5), dup=st.booleans())
def test_every_kernel_matches_the_reference(seed, n_rows, W, spread, window, within, dup):
    rng = np.random.default_rng(seed)
    n_pos = W + spread
    rows = _rows(rng, n_rows, W, n_pos, dup)
    assert FAST.first_duplicate_row(rows, n_pos) == REF.first_duplicate_row(rows, n_pos)
    if dup:
        rows = _rows(rng, n_rows, W, n_pos)
    over_r, sizes_r, lr_r = _all(REF, rows, n_pos, window, within)
    over, sizes, lr = _all(FAST, rows, n_pos, window, within)
    np.testing.assert_array_equal(over, over_r)           # NaN where a row selects nothing, in both
    np.testing.assert_array_equal(sizes, sizes_r)
    assert lr == lr_r


@BOTH
def test_worked_example(mod):
    rows = np.array([[0, 1, 2, -1],
                     [1, 2, 3, 4],
                     [-1, -1, -1, -1],
                     [4, 0, -1, -1],
                     [0, -1, 1, -1]], np.int32)
    over, sizes, lr = _all(mod, rows, 5, 2, 1)
    # |{1,2}| / 4; the empty row: NaN; |{}| / 2 (row 2 is empty); |{0}| / 2
    np.testing.assert_array_equal(over, [0.5, np.nan, 0.0, 0.5])
    assert sizes.tolist() == [5, 4, 2, 3]                 # unions of rows (0,1) (1,2) (2,3) (3,4)
    # s = 1: 0 leaves, back in row 2? no. s = 2: 1 2 3 4 leave, 4 back in row 3. s = 3: nothing was in row 2
    assert lr == (5, 1)
    assert mod.first_duplicate_row(rows, 5) == -1
    assert mod.first_duplicate_row(np.array([[0, 1], [2, -1], [3, 3], [1, 1]], np.int32), 5) == 2


@BOTH
def test_edge_cases(mod):
    none = np.empty((0, 3), np.int32)
    one = np.array([[2, -1, 0]], np.int32)
    assert mod.first_duplicate_row(none, 4) == -1 and mod.first_duplicate_row(one, 4) == -1
    for rows in (none, one):
        over, sizes, lr = _all(mod, rows, 4, 1, 1)
        assert over.size == 0 and lr == (0, 0)
    assert _all(mod, one, 4, 1, 1)[1].tolist() == [2]
    # rows that select nothing: every overlap NaN, unions empty, nothing leaves
    over, sizes, lr = _all(mod, np.full((4, 2), -1, np.int32), 3, 2, 1)
    assert np.isnan(over).all() and sizes.tolist() == [0, 0, 0] and lr == (0, 0)
    # the return window reaches the last row exactly: s = 1 only (T - 1 - within = 1); 5 comes back in row 3
    rows = np.array([[5, 6], [7, -1], [8, -1], [5, -1]], np.int32)
    assert mod.leave_return(rows, 9, 2) == (2, 1)


def test_one_overlap_for_the_traces_and_the_generator():
    """ess.traces.adjacent_overlap is the mean of the kernel's per-step overlaps over steps and requests, and the
    generator's calibration the mean over its stream: both equal the overlaps recomputed from the sets by hand."""
    tr = G.synthetic_trace(G.Workload(1024, n_layers=2, k=32, mtp=1, steps=9, batch=2, warmup_windows=0, seed=3,
                                      local_window=4, locality=LocalityModel.of("uniform")))
    by_hand = np.zeros(2)
    for layer in range(2):
        vals = []
        for b in range(2):
            rows = tr.indices[b, layer]
            for t in range(1, tr.steps):
                a, c = set(rows[t - 1][rows[t - 1] >= 0]), set(rows[t][rows[t] >= 0])
                vals.append(len(a & c) / len(c))
        by_hand[layer] = np.mean(vals)
    np.testing.assert_allclose(T.adjacent_overlap(tr), by_hand, rtol=1e-15)
    # the drift calibration's overlap is the mean of the same per-step overlaps over its calibration stream
    from ess.tracegen import _CALIB_QUERIES, _CALIB_SEED, _drift_overlap_at, _drift_params, _drift_run
    c, rho, L, k, sinks, window = 0.7, 0.5, 256, 16, 2, 4
    n_pos = L + _CALIB_QUERIES
    _, out, _ = _drift_run(_CALIB_SEED, n_pos, L, k, 1, _CALIB_QUERIES, 0, *_drift_params(c, rho), sinks, window,
                           np.inf)
    terms = np.empty(_CALIB_QUERIES - 1)
    REF.adjacent_overlaps(out, n_pos, terms)
    assert 0 < terms.mean() < 1
    assert _drift_overlap_at(c, rho, L, k, sinks, window) == pytest.approx(terms.mean(), rel=1e-14)


def test_no_torch_kernel():
    with pytest.raises(ValueError, match="no torch kernel"):
        K.get("torch")
