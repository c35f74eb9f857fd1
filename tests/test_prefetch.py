"""Prefetch classes over one link."""
import numpy as np
import pytest

from ess import cachesim as C
from ess.layout import pool_slots
from ess.specs import model_spec
from ess import prefetch as F
from ess import heat_predictor as P
from ess import tracegen as G


@pytest.fixture(scope="module")
def trace():
    return G.synthetic_trace(G.Workload(2048, n_layers=3, k=128, mtp=2, steps=16, batch=2, warmup_windows=6, seed=9,
                                        local_window=8))


@pytest.mark.parametrize("warmup", ["none", "before"])
def test_demand_only_equals_the_lru_simulation(trace, warmup):
    cap = pool_slots(model_spec(), 0.25, trace.context_len, need=trace.k)
    cfg = F.PrefetchConfig(cap, speculative=False, delayed=False, predictor="none", warmup_mode=warmup)
    r = F.simulate_prefetch(trace, cfg)
    want = C.trace_misses(trace, "lru", capacity=cap, warmup=warmup == "before")
    assert np.array_equal(r.misses_per_step, want.sum(axis=(0, 1)))
    assert r.bytes_immediate == want.sum() * 656 and r.bytes_speculative == r.bytes_delayed == 0
    assert r.hits == r.accesses - want.sum()
    np.testing.assert_allclose(r.stall_s, want.sum() * 656 / 37e9)


def test_classes_account_for_bytes_and_link_time(trace):
    cap = pool_slots(model_spec(), 0.25, trace.context_len, need=trace.k)
    cfg = F.PrefetchConfig(cap, speculative=True, delayed=True, predictor="heat", warmup_mode="delayed",
                           link_GB_per_s=20.0, step_time_us=10.0)
    r = F.simulate_prefetch(trace, cfg)
    assert r.bytes_moved == r.bytes_immediate + r.bytes_speculative + r.bytes_delayed
    assert r.bytes_speculative > 0
    only_delayed = F.simulate_prefetch(trace, F.PrefetchConfig(cap, speculative=False, predictor="heat",
                                                               warmup_mode="delayed", link_GB_per_s=20.0,
                                                               step_time_us=10.0))
    assert only_delayed.bytes_delayed > 0 and only_delayed.bytes_speculative == 0
    assert 0 <= r.bytes_prefetched_unused <= r.bytes_speculative + r.bytes_delayed
    np.testing.assert_allclose(r.link_busy_s, r.bytes_moved / 20e9)
    assert 0 < r.link_use <= 1
    # background classes never exceed the per-step budget
    per_pool_step = (r.bytes_speculative + r.bytes_delayed) / (r.pools * r.steps) / 656
    assert per_pool_step <= cfg.budget_entries
    # a zero-budget link for background work moves nothing in the background
    tiny = F.simulate_prefetch(trace, F.PrefetchConfig(cap, predictor="heat", warmup_mode="delayed",
                                                       link_GB_per_s=1e-3, step_time_us=1.0))
    assert tiny.bytes_speculative == tiny.bytes_delayed == 0


def test_lstm_predictor_drives_the_classes(trace):
    pred = P.LSTMHeatPredictor(history=4, hidden=8, seed=0).fit([trace.indices[0, 0]], epochs=2, max_samples=4000)
    cap = pool_slots(model_spec(), 0.25, trace.context_len, need=trace.k)
    cfg = F.PrefetchConfig(cap, predictor="lstm", eviction="predictor", history=4)
    r = F.simulate_prefetch(trace, cfg, predictor=pred, requests=[1], layers=[1, 2])
    assert r.pools == 2 and r.accesses > 0 and 0 <= r.hit_rate <= 1


def test_bad_config():
    with pytest.raises(ValueError, match="predictor"):
        F.PrefetchConfig(100, predictor="oracle")
    with pytest.raises(ValueError, match="speculative class needs a predictor"):
        F.PrefetchConfig(100, predictor="none")
    with pytest.raises(ValueError, match="link_GB_per_s"):
        F.PrefetchConfig(100, link_GB_per_s=0)
    with pytest.raises(ValueError, match="capacity"):
        F.PrefetchConfig(0)
    tr = G.synthetic_trace(G.Workload(512, n_layers=1, k=64, mtp=1, steps=2, batch=1, warmup_windows=2, seed=0,
                                      local_window=4))
    with pytest.raises(ValueError, match="smaller than K"):
        F.simulate_prefetch(tr, F.PrefetchConfig(32))
    with pytest.raises(ValueError, match="trained LSTMHeatPredictor"):
        F.simulate_prefetch(tr, F.PrefetchConfig(100, predictor="lstm"))


_KERNEL_CASES = [  # (ratio, speculative, delayed, warmup_mode, link GB/s, step us, spec_fraction, history)
    (0.25, False, False, "none", 37.0, 23.1, 1.0, 8),
    (0.25, False, False, "before", 37.0, 23.1, 1.0, 8),
    (0.25, True, False, "before", 37.0, 23.1, 1.0, 8),          # speculative over a full pool: swaps
    (0.25, False, True, "delayed", 20.0, 10.0, 1.0, 8),         # delayed only
    (0.25, True, True, "delayed", 20.0, 10.0, 0.5, 3),          # both classes share the budget
    (0.6, True, True, "delayed", 60.0, 40.0, 0.05, 8),          # a roomy pool: free slots for both classes
    (0.12, True, True, "delayed", 5.0, 23.1, 0.3, 2),           # a tight pool and a slow link
]


@pytest.mark.parametrize("case", _KERNEL_CASES)
@pytest.mark.parametrize("seed", [9, 4])
def test_numba_kernel_equals_the_reference_miss_for_miss(case, seed):
    """The Numba pool against :func:`ess.kernels.prefetch.reference.pool` (NumPy on SlotPool) on odd sizes: the
    same misses and stall at every step, the same bytes per class, hits and link time. A kernel that broke the LRU
    order, took candidates in another order, sent the delayed queue from the wrong end or counted unused
    prefetches differently would part from the reference here."""
    ratio, spec, delayed, warmup, link, step_us, frac, hist = case
    tr = G.synthetic_trace(G.Workload(3000, n_layers=3, k=111, mtp=2, steps=13, batch=2, warmup_windows=5,
                                      seed=seed, local_window=7))
    cap = max(2 * tr.k + 1, int(ratio * tr.context_len))
    cfg = F.PrefetchConfig(cap, speculative=spec, delayed=delayed, predictor="heat" if spec or delayed else "none",
                           warmup_mode=warmup, link_GB_per_s=link, step_time_us=step_us, spec_fraction=frac,
                           history=hist)
    ref = F.simulate_prefetch(tr, cfg, backend="reference")
    fast = F.simulate_prefetch(tr, cfg, backend="numba")
    assert ref.misses_per_step.sum() > 0                                 # the case exercises the miss path ...
    assert (ref.bytes_speculative > 0) == spec and (ref.bytes_delayed > 0) == delayed      # ... and its classes
    np.testing.assert_array_equal(fast.misses_per_step, ref.misses_per_step)
    np.testing.assert_allclose(fast.stall_per_step_s, ref.stall_per_step_s, rtol=1e-12)
    for k in ("accesses", "hits", "bytes_immediate", "bytes_speculative", "bytes_delayed", "bytes_prefetched_unused"):
        assert getattr(fast, k) == getattr(ref, k), k
    for k in ("stall_s", "elapsed_s", "link_busy_s"):
        assert getattr(fast, k) == pytest.approx(getattr(ref, k), rel=1e-12), k


def test_backend_choice():
    tr = G.synthetic_trace(G.Workload(1024, n_layers=1, k=64, mtp=1, steps=3, batch=1, warmup_windows=2, seed=1))
    with pytest.raises(ValueError, match="backend"):
        F.simulate_prefetch(tr, F.PrefetchConfig(200), backend="cuda")
    with pytest.raises(ValueError, match="use 'reference'"):     # the kernel has no predictor-ranked eviction
        F.simulate_prefetch(tr, F.PrefetchConfig(200, eviction="predictor"), backend="numba")
