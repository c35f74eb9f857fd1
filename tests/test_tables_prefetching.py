"""The prefetching notebook's frames and records (ess.tables.prefetching): each is the library's computation, its
band the lowest and highest over the locality models, its records named and configured once."""
import inspect

import numpy as np
import pytest

from ess import cachesim, tracegen
from ess.results import Recorder
from ess.tables import prefetching as tp

CENTRAL = tracegen.default_locality()
ALTS = tracegen.locality_alternatives()
UNIFORM = tracegen.LocalityModel("uniform", "uniform", CENTRAL.reading)
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
    direct = cachesim.sweep_synthetic(32768, [0.3, 0.6], mtp=2, steps=4, seed=0, batch=2, **CENTRAL.kwargs())
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
    assert {r["config"]["policy"] for r in records} == {"lru", "fifo", "heat", "belady"}
    assert records[0]["name"] == "policy_lru_cold_uniform_sigma0"


def test_mtp_unions_stay_under_the_bound_plus_the_slack():
    frame, records = tp.mtp_unions(32768, [2], steps=2, seed=0, locality=CENTRAL)
    assert frame["largest step over its bound"].iloc[0] <= cachesim.STEP_SLACK
    assert records[0]["name"] == "mtp2_union_mean" and records[0]["value"] == frame["mean union"].iloc[0]


def test_drift_rho_fit_records_every_reading_and_end():
    frame, records = tp.drift_rho_fit(tracegen.locality_fit())
    assert len(records) == 3 * len(tracegen.READINGS) and list(frame.columns) == list(tracegen.READINGS)
    _check_records(records)
