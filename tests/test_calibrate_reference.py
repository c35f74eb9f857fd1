"""calibrate() against a plain reference: with the compute scale pinned, a dense search over the communication scale
with the fixed time in closed form finds no better fit than calibrate's coarse-to-fine search (the fast path), and
calibrate's fixed time is the closed form at its own scales."""
import numpy as np
import pytest

from ess.sim import calibrate as C
from ess.sim.config import Scenario
from ess.sim.costs import CostParams


def _loss_and_fixed(points, sc, sm, scen, table2_weight=5.0):
    """The weighted squared relative step error and its best fixed time (seconds) at scales (sc, sm), plainly."""
    dep = scen.specs()[1]
    obs = np.array([p.batch * dep.gpus_per_node * p.accept_ratio / p.throughput for p in points])
    w = np.array([1.0 if p.read_from_chart else table2_weight for p in points])
    s = C._step_without_fixed(points, sc, sm, scen)
    # d/df sum w ((s + f - obs) / obs)^2 = 0  =>  f = sum (w / obs^2) (obs - s) / sum (w / obs^2)
    f = max(float(np.sum(w / obs ** 2 * (obs - s)) / np.sum(w / obs ** 2)), 0.0)
    return float(np.sum(w * ((s + f - obs) / obs) ** 2)), f


def test_calibrate_finds_the_dense_searchs_best_fit():
    points = C.calibration_points()
    scen = Scenario(params=CostParams())
    sc = 0.6
    got = C.calibrate(points, compute_scale=sc)
    q = got.params
    loss_got, f_got = _loss_and_fixed(points, sc, q.comm_scale, scen)
    assert q.fixed_ms == pytest.approx(f_got * 1e3, rel=1e-9)        # the closed form at its own scales
    ref = min(_loss_and_fixed(points, sc, sm, scen)[0] for sm in np.geomspace(0.1, 5.0, 300))
    assert loss_got <= ref * 1.002                                   # no dense-search scale fits better
    assert got.rms_rel_error == pytest.approx(np.sqrt(np.mean(got.residuals.rel_error ** 2)))
    assert got.max_abs_rel_error == pytest.approx(np.abs(got.residuals.rel_error).max())
    assert got.max_abs_rel_error > got.rms_rel_error                 # the worst point is worse than the RMS


def test_the_cost_growth_counterpart_by_its_definition():
    """cost_growth_ms: (step at the long position - step at the short) / (batch x accept ratio), in ms of GPU time per
    output token, at Table 2 row 1's batch, MTP and accept ratio on the evidence's machine (H800), no memory check."""
    from ess.published import published
    from ess.sim import simulate
    q = CostParams(compute_scale=0.6, comm_scale=1.2, fixed_ms=40.0)
    ev = C.cost_growth_evidence()
    row = published("paper_table2")["t2_32k_mtp2_b52_r1"]
    scen = Scenario(params=q, gpu=ev["machine"], check_memory=False)
    r = simulate(row["batch"], [ev["short_position"], ev["long_position"]], 1.0, mtp=row["mtp"],
                 accept_ratio=row["accept_ratio"], scenario=scen)
    want = (r.step_s[1] - r.step_s[0]) / (row["batch"] * row["accept_ratio"]) * 1e3
    assert C.cost_growth_ms(q) == pytest.approx(want) and 0.05 < want < 1.0


def test_each_fitting_choice_is_what_its_name_says():
    """The four fitting choices of calibration_variants fit with the Table 2 weight their names give (5, 1, 20) or
    on the chart points alone."""
    v = C.calibration_variants(grid=4, refine=0, compute_scale=0.6)
    for name, weight in (("default (Table 2 weight 5)", 5), ("Table 2 weight 1", 1), ("Table 2 weight 20", 20)):
        assert f"Table 2 weight {weight}; " in v[name].params.fitted_on
        assert "1 Table 2 rows" in v[name].params.fitted_on
    assert "0 Table 2 rows" in v["Fig. 1 only"].params.fitted_on


def test_the_central_fit_is_kept_beside_the_best(monkeypatch):
    """With no slack for 'equally good' only the best pinned fit qualifies; the central one is kept too, first,
    and the best stays in the set."""
    monkeypatch.setattr(C, "EQUALLY_GOOD_RMS_PP", 0.0)
    monkeypatch.setattr(C, "_CACHE", {})
    cs = C.calibration_set(grid=4, refine=0)
    best = min(cs.fits, key=lambda n: cs.fits[n].rms_rel_error)
    assert cs.kept[0] == cs.central and best in cs.kept


def test_three_points_are_enough_and_two_are_not():
    """Mistake: the least number of points off by one (three unknowns -- compute scale, communication scale, fixed
    time -- need three points; with the compute scale pinned three still fit)."""
    points = C.calibration_points()[:3]
    got = C.calibrate(points, compute_scale=0.6, grid=4, refine=0)
    assert len(got.residuals) == 3
    with pytest.raises(ValueError, match="at least 3"):
        C.calibrate(points[:2], compute_scale=0.6, grid=4, refine=0)


@pytest.mark.parametrize("scale_range", [(1.0, 1.0), (2.0, 1.0)])
def test_a_scale_range_of_no_width_or_reversed_is_refused(scale_range):
    """Mistake: ``low <= high`` accepted, so a range of one value passes as a search."""
    with pytest.raises(ValueError, match="scale_range"):
        C.calibrate(C.calibration_points()[:3], scale_range=scale_range, grid=4, refine=0)
