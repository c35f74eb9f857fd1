"""The prefetch-pool kernel family (ess.kernels.prefetch): the Numba pool against the reference pool (NumPy on
ess.policies.SlotPool) on random steps -- positions from a small range so that hits, equal heat scores and full
pools are common --, every class on and off, each warmup mode; and the edge cases: no step, one step, a pool
exactly one step wide, no warmup windows."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ess.heat_predictor import HeatScorer
from ess.kernels import prefetch as K
from ess.prefetch import PrefetchConfig

REF, FAST = K.get("reference"), K.get("numba")
INTS = ("accesses", "hits", "bytes_immediate", "bytes_speculative", "bytes_delayed", "bytes_prefetched_unused")
FLOATS = ("stall_s", "elapsed_s", "link_busy_s")


def _rows(rng, T, W, n_pos):
    rows = np.full((T, W), -1, np.int64)
    for t in range(T):
        n = int(rng.integers(1, W + 1))
        rows[t, rng.choice(W, n, replace=False)] = rng.choice(n_pos, n, replace=False)
    return rows


def _both(steps, windows, n_pos, cfg):
    scorer = HeatScorer() if cfg.predictor == "heat" else None
    return REF.pool(steps, windows, n_pos, cfg, scorer), FAST.pool(steps, windows, n_pos, cfg, scorer)


def _assert_same(ref, fast):
    np.testing.assert_array_equal(fast["misses"], ref["misses"])
    np.testing.assert_array_equal(fast["stalls"], ref["stalls"])
    for k in INTS:
        assert fast[k] == ref[k], k
    for k in FLOATS:
        assert fast[k] == pytest.approx(ref[k], rel=1e-12), k


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), T=st.integers(1, 14), W=st.integers(1, 8), spread=st.integers(0, 20),
       extra=st.integers(0, 10), n_win=st.integers(0, 4), speculative=st.booleans(), delayed=st.booleans(),
       warmup=st.sampled_from(["none", "before", "delayed"]), budget=st.sampled_from([0.5, 2.0, 8.0, 40.0]),
       frac=st.sampled_from([1.0, 0.5, 0.2]), history=st.integers(1, 4), decay=st.sampled_from([0.5, 0.9, 1.0]))
def test_the_kernel_matches_the_reference(seed, T, W, spread, extra, n_win, speculative, delayed, warmup, budget,
                                          frac, history, decay):
    rng = np.random.default_rng(seed)
    n_pos = W + spread
    steps = _rows(rng, T, W, n_pos)
    windows = _rows(rng, n_win, W, n_pos) if n_win else None
    if windows is None and warmup != "none":
        warmup = "none"
    # the link moves `budget` entries of 656 B in one step's compute time (37 GB/s x step_time_us)
    cfg = PrefetchConfig(W + extra, speculative=speculative, delayed=delayed,
                         predictor="heat" if speculative or seed % 2 else "none", warmup_mode=warmup,
                         step_time_us=budget * 656 / 37e3, spec_fraction=frac, history=history, decay=decay)
    _assert_same(*_both(steps, windows, n_pos, cfg))


@pytest.mark.parametrize("mod", [REF, FAST], ids=["reference", "numba"])
def test_edge_cases(mod):
    cfg = PrefetchConfig(3, predictor="heat", warmup_mode="delayed")
    # no step: nothing accessed; the delayed class never runs, its queue is never sent
    r = mod.pool(np.empty((0, 2), np.int64), np.array([[0, 1]]), 4, cfg, HeatScorer())
    assert r["accesses"] == r["hits"] == r["bytes_delayed"] == 0 and r["misses"].size == 0
    # one step: every entry misses, and nothing is speculated after the last step
    r = mod.pool(np.array([[2, 0, -1]]), None, 4, PrefetchConfig(3, predictor="heat", warmup_mode="none"), HeatScorer())
    assert r["misses"].tolist() == [2] and r["bytes_speculative"] == 0 and r["bytes_immediate"] == 2 * 656
    # a pool exactly one step wide: no free slot for the background classes; the next step's misses are its own
    cfg = PrefetchConfig(2, predictor="heat", warmup_mode="delayed")
    r = mod.pool(np.array([[0, 1], [2, 3], [0, 1]]), np.array([[0, 5]]), 6, cfg, HeatScorer())
    assert r["misses"].tolist() == [2, 2, 2] and r["bytes_delayed"] == 0


@pytest.mark.parametrize("mod", [REF, FAST], ids=["reference", "numba"])
def test_the_delayed_class_sends_the_latest_windows_first_at_the_cold_end(mod):
    """Windows [0, 1] then [2, 3]: the queue is sent from its end, one entry per step here (3, then 2), into free
    slots only, each entering at the cold end of the LRU order."""
    cfg = PrefetchConfig(4, speculative=False, predictor="heat", warmup_mode="delayed", step_time_us=656 / 37e3)
    assert cfg.budget_entries == 1
    windows = np.array([[0, 1], [2, 3]])
    # 3 and 2 were sent during steps 0 and 1: step 2 hits them and misses 0 (sent from the front: 2 misses)
    r = mod.pool(np.array([[5, -1, -1], [6, -1, -1], [3, 2, 0]]), windows, 8, cfg, HeatScorer())
    assert r["misses"].tolist() == [1, 1, 1] and r["bytes_delayed"] == 2 * 656
    # two slots: 3 enters colder than 5, so step 1's miss evicts 3 and step 2 hits 5 (at the hot end: 5 evicted)
    cfg = PrefetchConfig(2, speculative=False, predictor="heat", warmup_mode="delayed", step_time_us=656 / 37e3)
    r = mod.pool(np.array([[5], [6], [5]]), windows, 8, cfg, HeatScorer())
    assert r["misses"].tolist() == [1, 1, 0] and r["bytes_delayed"] == 656 and r["bytes_prefetched_unused"] == 656


@pytest.mark.parametrize("mod", [REF, FAST], ids=["reference", "numba"])
def test_a_speculative_candidate_replaces_a_resident_only_when_it_scores_higher(mod):
    """Two slots, no decay (decay 1): after [0, 1] then [2, 3] all four have heat 1. The candidates 0 and 1 do not
    beat the residents 2 and 3 (a tie keeps the resident), so step 2 hits both; with decay 0.5 they are colder."""
    steps = np.array([[0, 1], [2, 3], [2, 3]])
    for decay in (1.0, 0.5):
        cfg = PrefetchConfig(2, predictor="heat", warmup_mode="none", delayed=False, decay=decay)
        r = mod.pool(steps, None, 4, cfg, HeatScorer())
        assert r["misses"].tolist() == [2, 2, 0] and r["bytes_speculative"] == 0


def test_the_kernel_refuses_what_it_does_not_simulate():
    steps = np.array([[0, 1]])
    with pytest.raises(ValueError, match="LRU eviction"):
        FAST.pool(steps, None, 2, PrefetchConfig(4, predictor="heat", eviction="predictor", warmup_mode="none"), None)
    with pytest.raises(ValueError, match="step 0 selects 2 entries but the pool has 1 slots"):
        FAST.pool(steps, None, 2, PrefetchConfig(1, predictor="heat", warmup_mode="none"), None)
    with pytest.raises(ValueError, match="no torch kernel"):
        K.get("torch")
