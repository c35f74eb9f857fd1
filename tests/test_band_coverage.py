"""The calibration band's coverage measured by leave-one-out, and the one rule that widens it (notebook 05)."""
import json

import numpy as np
import pandas as pd
import pytest

from ess.sim import calibrate as C
from ess.sim import store


def test_the_widening_rule_by_hand():
    """Ten points, four inside; outside by 1, 2, 3, 4, 5, 6 %. Nominal 0.8: ceil(0.8 x 11) = 9 points must be
    inside, so the margin is the 5th smallest outside distance among the six (the 9th of all ten): 5 %; then 9 of
    10 are inside. Nominal 0.3 is already covered (0.4): no widening."""
    d = [0, 0, 0, 0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06]
    loo = pd.DataFrame({"inside": [x == 0 for x in d], "outside_rel": d})
    got = C.band_coverage(loo, 0.8)
    assert got["coverage"] == 0.4 and got["widen"] == pytest.approx(0.05) and got["coverage_widened"] == 0.9
    assert C.band_coverage(loo, 0.3)["widen"] == 0.0
    assert C.widen_band(np.array([100.0]), np.array([200.0]), 0.05)[1].tolist() == [210.0]
    with pytest.raises(ValueError, match="nominal"):
        C.band_coverage(loo, 1.0)
    with pytest.raises(TypeError, match="loo"):
        C.band_coverage(loo.drop(columns="inside"), 0.8)


def test_leave_one_out_refits_without_the_point():
    """On a coarse grid (fast): one row per calibration point; the band holds the central prediction; a point is
    inside exactly when its published value lies between the ends, and its distance outside is relative to the
    nearer end."""
    loo = C.leave_one_out(grid=4, refine=0, part_batch_band=False)
    pts = C.calibration_points()
    assert loo.name.tolist() == [p.name for p in pts]
    assert ((loo.low <= loo.predicted + 1e-9) & (loo.predicted <= loo.high + 1e-9)).all()
    inside = (loo.low <= loo.published) & (loo.published <= loo.high)
    assert (loo.inside == inside).all()
    out = loo[~loo.inside]
    far = np.where(out.published < out.low, (out.low - out.published) / out.low,
                   (out.published - out.high) / out.high)
    np.testing.assert_allclose(out.outside_rel, far)


def test_the_shipped_coverage_is_todays_and_its_own_rule():
    """data/generated/coverage.json was made from today's inputs (else `ess calibrate` must run again), and its
    margin is the rule applied to its own rows: nothing typed in."""
    shipped = json.loads((store.GENERATED_DIR / "coverage.json").read_text())
    assert shipped["inputs_sha256"] == store.inputs_digest(), "data/ changed since `ess calibrate`: run it again"
    again = C.band_coverage(pd.DataFrame(shipped["rows"]), shipped["nominal"])
    assert again["widen"] == pytest.approx(shipped["widen"]) and again["coverage"] == shipped["coverage"]
    assert shipped["nominal"] == C.BAND_NOMINAL and C.band_widening() == pytest.approx(shipped["widen"])
