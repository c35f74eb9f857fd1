"""The prefetching notebook's frames and records (ess.studies.prefetching): each is the library's computation, its
band the lowest and highest over the locality models, its records named and configured once."""
import inspect

import numpy as np
import pytest

from ess import cachesim, locality
from ess.results import Recorder
from ess.tracegen import Workload
from ess.studies import prefetching as tp

CENTRAL = locality.default_locality()
ALTS = locality.locality_alternatives()
UNIFORM = locality.LocalityModel("uniform", "uniform", CENTRAL.reading)
# what ess.results.Recorder.record accepts: a record builder must produce nothing else
RECORD_KEYS = set(inspect.signature(Recorder.record).parameters) - {"self"}


def _check_records(records):
    names = [r["name"] for r in records]
    assert len(set(names)) == len(names)                       # unique names: the Recorder refuses repeats
    for r in records:
        assert set(r) <= RECORD_KEYS and {"name", "value", "unit"} <= set(r), r


@pytest.fixture(scope="module")
def p1():
    return tp.misses_by_ratio(32768, [0.3, 0.6], ALTS, UNIFORM, mtp=2, steps=4, seed=0, batch=2, band_batch=1)


def test_misses_by_ratio_is_the_sweep_with_its_band(p1):
    direct = cachesim.sweep_synthetic(Workload(32768, mtp=2, steps=4, seed=0, batch=2, locality=CENTRAL), [0.3, 0.6])
    for r in (0.3, 0.6):
        np.testing.assert_array_equal(p1.per_ratio[CENTRAL.name][r], direct[(r, "lru", True)].mean(axis=1))
        stack = np.stack([p1.per_ratio[m.name][r] for m in ALTS])
        np.testing.assert_array_equal(p1.band[r][0], stack.min(axis=0))
        np.testing.assert_array_equal(p1.band[r][1], stack.max(axis=0))
    _check_records(p1.records)
    by = {r["name"]: r for r in p1.records}
    mean = by["misses_mean_32k_ratio0.3"]
    assert mean["value"] == pytest.approx(p1.per_ratio[CENTRAL.name][0.3].mean())
    assert mean["low"] <= mean["value"] <= mean["high"]
    cfg = mean["config"]
    assert (cfg["ratio"], cfg["mtp"], cfg["steps"], cfg["batch"], cfg["capacity"]) == (0.3, 2, 4, 2, 9830)
    assert cfg["band"] == [m.config() for m in ALTS] and cfg["band_batch"] == 1 and cfg["locality"] == CENTRAL.name
    assert by["misses_mean_32k_ratio0.3_uniform"]["config"]["trace_model"] == "uniform"
    assert list(p1.frame.columns[:3]) == ["ratio", "pool slots", "mean misses (central)"]


def test_warmup_curves_band_and_settle():
    w = tp.warmup_curves(32768, 0.2, ALTS, steps=8, seed=0, batch=1, band_batch=1)
    _check_records(w.records)
    by = {r["name"]: r for r in w.records}
    without = by["warmup_curve_without"]["value"]
    assert without[0] >= 0.99 * 2048 and by["warmup_curve_with"]["value"][0] < without[0]
    curves, bands = w.series()
    lo, hi = bands["LRU, without warmup"]
    assert (lo <= curves["LRU, without warmup"]).all() and (curves["LRU, without warmup"] <= hi).all()
    assert by["steps_to_settle_without_warmup"]["value"] == w.settle[CENTRAL.name]
    assert by["steady_misses_mtp1_ratio0.2"]["config"]["window"] == "steps 4..7"


def test_context_and_pool_records_name_the_second_model():
    by_ctx, records = tp.misses_by_context([32768], 0.2, (CENTRAL, UNIFORM), mtp=2, steps=4, batch=1, seed=0)
    assert [r["name"] for r in records] == ["misses_mean_ratio0.2_32k", "misses_mean_ratio0.2_32k_uniform"]
    assert records[0]["value"] == by_ctx[CENTRAL.name][0]
    found, records = tp.smallest_pools(32768, 1.0, (CENTRAL,), resolution=4096, mtp=2, steps=4, batch=1, seed=0)
    assert isinstance(found[CENTRAL.name], str) and records[0]["value"] is None      # 1 miss: out of reach


def test_policies_rows_and_records():
    rows, records = tp.policies_against_belady([(UNIFORM, 0.0)], 32768, mtp=2, steps=4, batch=1, seed=0,
                                               layers=[0, 30])
    _check_records(records)
    (row,) = rows
    assert row["belady"] <= min(row["lru"], row["fifo"], row["heat"])
    assert {r["config"]["policy"] for r in records} == {"lru", "fifo", "heat", "clock", "sampled_clock", "belady"}
    assert records[0]["name"] == "policy_lru_cold_uniform_sigma0"


def test_mtp_unions_stay_under_the_bound_plus_the_slack():
    frame, records = tp.mtp_unions(32768, [2], steps=2, seed=0, locality=CENTRAL)
    assert frame["largest step over its bound"].iloc[0] <= cachesim.STEP_SLACK
    assert records[0]["name"] == "mtp2_union_mean" and records[0]["value"] == frame["mean union"].iloc[0]


def test_drift_rho_fit_records_every_reading_and_end():
    frame, records = tp.drift_rho_fit(locality.locality_fit())
    assert len(records) == 3 * len(locality.READINGS) and list(frame.columns) == list(locality.READINGS)
    _check_records(records)


@pytest.fixture(scope="module")
def comparison():
    real = {"smollm2_1k": tp.recorded_traces()["smollm2_1k"]}
    return real, tp.policy_comparison(real, ALTS, context_len=32768, ratios=[0.2], real_ratios=[0.125, 0.5], mtp=2,
                                      steps=3, batch=1, band_batch=1, seed=0, layers=[0, 30])


def test_policy_comparison_is_the_cache_simulation_on_both_sources(comparison):
    from ess.tracegen import locality_profile
    real, c = comparison
    f = c.frame
    assert set(f.source) == {"smollm2_1k", "deepseek_32k"}
    assert set(f[f.policy == "belady"].warmup) == {False}                  # Belady only where it is a bound
    assert len(f) == 3 * 9 and set(f.policy) == set(tp.COMPARED_POLICIES)
    tr = real["smollm2_1k"]
    for (ratio, warm, pol), per_layer in c.per_layer["smollm2_1k"].items():
        m = cachesim.trace_misses(tr, pol, ratio=ratio, warmup=warm)
        np.testing.assert_array_equal(per_layer, m.mean(axis=(0, 2)))
        row = f[(f.source == "smollm2_1k") & (f.ratio == ratio) & (f.warmup == warm) & (f.policy == pol)].iloc[0]
        assert row.misses == pytest.approx(m.mean())
        assert row["hit rate"] == pytest.approx(1 - m.sum() / tr.set_sizes().sum())
        lru = cachesim.trace_misses(tr, "lru", ratio=ratio, warmup=warm).sum()
        assert row["vs LRU (%)"] == pytest.approx(100 * (m.sum() - lru) / lru)
    # the synthetic source: the central model's sweep over the layers chosen; its band spans the models
    profile = locality_profile("paper", 61, CENTRAL.reading)[[0, 30]]
    direct = cachesim.sweep_synthetic(Workload(32768, n_layers=2, profile=profile, mtp=2, steps=3, batch=1, seed=0,
                                               locality=CENTRAL), [0.2], policies=("clock",), warmups=(True,))
    np.testing.assert_array_equal(c.per_layer["deepseek_32k"][(0.2, True, "clock")],
                                  direct[(0.2, "clock", True)].mean(axis=1))
    syn = f[f.source == "deepseek_32k"]
    assert ((syn["misses low"] <= syn.misses) & (syn.misses <= syn["misses high"])).all()
    cold = syn[~syn.warmup].set_index("policy").misses
    assert (cold["belady"] <= cold).all()


def test_policy_comparison_records_and_series(comparison):
    _, c = comparison
    _check_records(c.records)
    by = {r["name"]: r for r in c.records}
    syn = by["policy_vs_lru_deepseek_32k_clock_warm_ratio0.2"]
    assert syn["status"] == "predicted" and syn["low"] <= syn["value"] <= syn["high"]
    assert syn["config"]["layers"] == [0, 30] and syn["config"]["band"] == [m.config() for m in ALTS]
    real = by["policy_misses_smollm2_1k_sampled_clock_cold_ratio0.125"]
    assert "status" not in real and real["config"]["capacity"] == 128 and real["config"]["trace"].endswith(".npz")
    assert "policy_vs_lru_smollm2_1k_lru_cold_ratio0.5" not in by                # LRU is the baseline
    ratios, values, bands = c.series("smollm2_1k", True)
    assert ratios == [0.125, 0.5] and list(values) == ["lru", "clock", "sampled_clock", "heat"] and bands == {}
    assert (values["lru"] == 0).all()
    ratios, values, bands = c.series("deepseek_32k", False, "misses")
    assert ratios == [0.2] and set(bands) == set(tp.COMPARED_POLICIES)
    from ess.viz.prefetch import fig_policies_by_ratio
    fig = fig_policies_by_ratio(ratios, values, bands=bands)
    lines = [t for t in fig.data if t.mode == "lines+markers"]
    assert [t.name for t in lines] == list(values) and len(fig.data) == 2 * len(values)     # a band per line
    assert all(list(t.y) == list(values[t.name]) for t in lines)
    with pytest.raises(ValueError, match="start with 'lru'"):
        tp.policy_comparison({}, ALTS, context_len=32768, ratios=[0.2], real_ratios=[], mtp=2, steps=3, batch=1,
                             band_batch=1, seed=0, layers=[0], policies=("clock", "lru"))
