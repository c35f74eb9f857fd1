"""The miss table: the cache simulation's counts per (context, ratio, MTP), a row computed once and kept."""
import numpy as np
import pytest

from ess.cachesim import sweep_synthetic
from ess.sim.misses import MissesTable
from ess.locality import default_locality
from ess.tracegen import Workload

QUICK = dict(steps=4, batch=1)


@pytest.fixture(scope="module")
def table():
    return MissesTable([0.05, 0.08, 0.2, 0.5, 1.0], **QUICK)


def test_a_row_is_the_cache_simulation_and_says_why_a_pool_fails(table):
    row = table.row(32768, 2)
    assert table.has_row(32768, 2) and not table.has_row(32768, 3)
    direct = sweep_synthetic(Workload(32768, mtp=2, **QUICK, locality=default_locality()), [0.2, 0.5])
    for r in (0.2, 0.5):
        np.testing.assert_array_equal(row[r], direct[(r, "lru", True)].mean(axis=1))
    assert row[0.2].mean() > row[0.5].mean() > 0 and not row[1.0].any()      # ratio 1: no offload, no misses
    assert "fewer than the 2048 entries" in row[0.05]                        # below K: known without a trace
    # 2,621 slots hold K but not what the layers' steps select together (two top-K sets per step with MTP 2)
    assert "select together" in row[0.08]
    with pytest.raises(ValueError, match="select together"):
        table(32768, 0.08, 2)
    assert table(32768, 0.2, 2) is row[0.2]                                  # kept, not simulated again


def test_a_ratio_counts_the_same_alone_or_in_a_row(table):
    """The streams of a (context, MTP) are generated once for every ratio; each ratio's counts do not depend on
    which others share the sweep (the same numbers as a table that met the ratio alone)."""
    alone = MissesTable(**QUICK)
    np.testing.assert_array_equal(alone(32768, 0.5, 2), table(32768, 0.5, 2))
    assert list(alone.row(32768, 2)) == [0.5]                                # no grid: only what was asked for


def test_prefetch_fills_many_points_once(monkeypatch):
    t = MissesTable(**QUICK)
    calls = []
    import ess.cachesim as C
    real = C.sweep_synthetic

    def counting(workload, ratios, **kw):
        calls.append((workload.context_len, workload.mtp, tuple(ratios)))
        return real(workload, ratios, **kw)
    monkeypatch.setattr(C, "sweep_synthetic", counting)
    t.prefetch([(32768, 0.5, 1), (32768, 0.3, 1), (32768, 1.0, 1), (65536, 0.3, 1), (32768, 0.5, 1)])
    assert sorted(calls) == [(32768, 1, (0.3, 0.5)), (65536, 1, (0.3,))]   # one sweep per (context, MTP)
    t(32768, 0.3, 1)
    t.prefetch([(32768, 0.5, 1)])
    assert len(calls) == 2                                                   # every later call is a lookup


def test_with_ratios_shares_the_counts(table):
    table.row(32768, 2, (0.2, 0.5))             # computed here: another test's row may be on another test worker
    wide = table.with_ratios([0.2, 0.5])
    assert wide.has_row(32768, 2) and wide.config == table.config
    assert wide(32768, 0.2, 2) is table(32768, 0.2, 2)


def test_config_says_what_produced_the_counts():
    t = MissesTable(**QUICK, seed=3, warmup=False, policy="fifo")
    c = t.config
    assert {k: c[k] for k in ("steps", "batch", "seed", "warmup", "policy", "profile")} == {
        "steps": 4, "batch": 1, "seed": 3, "warmup": False, "policy": "fifo", "profile": "paper"}
    assert c["locality"] == default_locality().name and "FIFO" in t.describe() and "+ warmup" not in t.describe()
    uniform = MissesTable(trace_model="uniform", **QUICK)
    assert uniform.locality.trace_model == "uniform" and uniform.config["trace_model"] == "uniform"


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="not both"):
        MissesTable(locality=default_locality(), trace_model="uniform")
    with pytest.raises(TypeError, match="LocalityModel"):
        MissesTable(locality="drift")
    with pytest.raises(ValueError, match="policy"):
        MissesTable(policy="mru")
    with pytest.raises(ValueError, match="steps"):
        MissesTable(steps=0)
    with pytest.raises(TypeError, match="warmup"):
        MissesTable(warmup=1)


def test_the_simulator_can_price_a_clock_cache():
    """policy="clock" (and HiSparse's "sampled_clock") is the cache simulation of that policy, not LRU's."""
    lru = MissesTable(**QUICK)
    for policy in ("clock", "sampled_clock"):
        t = MissesTable(**QUICK, policy=policy)
        direct = sweep_synthetic(Workload(32768, mtp=2, **QUICK, locality=default_locality()), [0.2],
                                 policies=(policy,))
        np.testing.assert_array_equal(t(32768, 0.2, 2), direct[(0.2, policy, True)].mean(axis=1))
        assert not np.array_equal(t(32768, 0.2, 2), lru(32768, 0.2, 2))
        assert t.config["policy"] == policy and policy.upper() in t.describe()
