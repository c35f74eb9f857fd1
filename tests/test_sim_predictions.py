"""Predictions over configurations (ess.sim.predictions): the banded inputs and their provenance, rows predicted with
miss counts, where a step goes, the overlap overhead against misses and the break-even miss counts."""
import numpy as np
import pandas as pd
import pytest

from ess.sim import CostParams, Scenario
from ess.sim import predictions as sc
from ess.sim.calibrate import calibrated_params
from ess.sim.misses import BandSizes, MissesTable
from ess.sim.timeline import simulate
from ess.specs import model_spec

P = calibrated_params()
S = Scenario(params=P)
MODEL = model_spec()
NL = MODEL.n_layers


def test_band_frames_by_hand():
    a = pd.DataFrame({"x": [1.0, 5.0, np.nan], "y": [0.0, 0.0, 0.0]})
    b = pd.DataFrame({"x": [3.0, 2.0, np.nan], "y": [1.0, -1.0, 0.0]})
    out = sc.band_frames({"central": a, "other": b}, ("x", "y"))
    assert out.x.tolist()[:2] == [1.0, 5.0]                                 # the central frame's values
    assert out.x_low.tolist()[:2] == [1.0, 2.0] and out.x_high.tolist()[:2] == [3.0, 5.0]
    assert np.isnan(out.x_low.iloc[2]) and out.y_low.tolist() == [0.0, -1.0, 0.0] and (out.band_size == 2).all()
    with pytest.raises(ValueError, match="at least one frame"):
        sc.band_frames([], ("x",))


def test_band_inputs_and_their_provenance():
    band = sc.BandInputs(P, {"central": P, "other": CostParams(1.0, 1.0, 40.0)}, [_central()],
                         {_central().name: MissesTable(steps=4, batch=1)}, BandSizes(steps=4, batch=1, band_batch=2))
    assert band.scenario().params == P and band.central_misses is band.misses[_central().name]
    prov = band.provenance(band.scenario(Scenario(strategy="dba")))
    assert prov["strategy"] == "dba" and prov["params"] == P.to_dict() and "mtp" not in prov
    from ess.sim.calibrate import band_widening
    widening = prov["band"].pop("widening")
    assert prov["band"] == {"calibrations": ["central", "other"], "locality": [_central().config()],
                            "band_batch": 2, "throughput_band_widened_by": band_widening()}
    assert "left out" in widening                       # the record says what the widening is
    assert prov["misses"] == band.central_misses.config and prov["deployment"] == "paper-table1"


def _central():
    from ess.locality import default_locality
    return default_locality()


def test_predict_configs_follows_each_rows_memory_rule():
    """A batch beyond the memory limit is infeasible unless the row says its batch was sized by a rule of its own
    (check_memory False); a ratio < 1 without miss counts is blocked, with its zero-miss bound."""
    cfg = pd.DataFrame({"batch": [53, 53, 100], "context_len": 32768, "ratio": [1.0, 1.0, 0.3], "mtp": 2,
                        "accept_ratio": 1.7, "check_memory": [True, False, True]})
    out = sc.predict_configs(cfg, None, scenario=S)
    assert out.status.tolist() == ["infeasible", "predicted", "blocked"]
    assert "memory limit of 52" in out.reason.iloc[0]
    direct = simulate(53, 32768, 1.0, scenario=S.replace(check_memory=False))
    assert out.throughput.iloc[1] == direct.throughput[0] and out.throughput_no_miss.iloc[1:].notna().all()
    flat = sc.predict_configs(cfg.iloc[2:], lambda L, r, t: np.full(NL, 100.0), scenario=S)
    assert flat.status.iloc[0] == "predicted" and flat.misses_per_step.iloc[0] == 100.0 * NL


def test_step_breakdown_adds_up_to_the_step():
    bd = sc.step_breakdown([13, 52], scenario=S)
    parts = bd.drop(columns=["comm_lane_total", "step"]).sum(axis=1)
    np.testing.assert_allclose(parts, bd.step, rtol=1e-12)
    r = simulate([13, 52], 32768, 1.0, scenario=S.replace(check_memory=False))
    np.testing.assert_allclose(bd.step, r.step_s * 1e3, rtol=1e-12)


def test_strategy_overheads_take_the_link_of_the_scenario():
    m = np.full(NL, 200.0)
    fast = sc.strategy_overheads(m, scenario=S, context_len=32768, batch=64, mtp=2, ratio=0.2).set_index("strategy")
    slow = sc.strategy_overheads(m, scenario=S.replace(h2d_GB_per_s=8.0), context_len=32768, batch=64, mtp=2,
                                 ratio=0.2).set_index("strategy")
    assert (slow.overhead_pct > fast.overhead_pct).all()
    assert fast.loc["best", "overhead_pct"] <= fast.overhead_pct.drop("best").min() + 1e-9
    assert (fast.layers_none + fast.layers_da + fast.layers_dba == NL).all()


def test_overlap_vs_misses_and_break_even():
    o = sc.overlap_vs_misses([0, 200, 800], scenario=S)
    piv = o.pivot(index="misses_per_layer", columns="strategy", values="overhead_pct")
    assert (piv["best"] <= piv[["none", "da", "dba"]].min(axis=1) + 1e-9).all()
    assert (piv.diff().dropna() >= -1e-9).all().all()                   # more misses never cost less
    slow = sc.overlap_vs_misses([800], scenario=S.replace(h2d_GB_per_s=8.0))
    assert (slow.set_index("strategy").overhead_pct >= o[o.misses_per_layer == 800].set_index("strategy").overhead_pct
            - 1e-9).all()
    with pytest.raises(ValueError, match="ratio"):
        sc.overlap_vs_misses([0], scenario=S, ratio=1.0)


def test_break_even_is_where_throughput_crosses_the_baseline():
    cfg = pd.DataFrame({"batch": [160], "context_len": [32768], "ratio": [0.19], "mtp": [2], "accept_ratio": [1.7]})
    baseline = float(simulate(52, 32768, 1.0, scenario=S).throughput[0])
    be = sc.break_even_misses(cfg, baseline, scenario=S).break_even_misses_per_layer.iloc[0]
    ksel = 2 * MODEL.index_topk
    assert 0 < be < ksel
    at, above = simulate([160, 160], 32768, 0.19, misses=np.stack([np.full(NL, be), np.full(NL, be * 1.001)]),
                         scenario=S).throughput
    assert at >= baseline > above
    # a baseline so low (batch 2) that batch 64 reaches it even when every layer misses all it selects: the
    # break-even mean is then the whole selection, mtp x K
    low = float(simulate(2, 32768, 1.0, scenario=S).throughput[0])
    cfg2 = cfg.assign(batch=[64], ratio=[0.78])
    assert sc.break_even_misses(cfg2, low, scenario=S).break_even_misses_per_layer.iloc[0] == pytest.approx(ksel)
