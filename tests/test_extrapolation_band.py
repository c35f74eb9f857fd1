"""The extrapolation band of notebooks 06-08: what a prediction extrapolates, the public MTP growth rule worked by
hand, and the band's envelope (it contains the calibration band; a calibrated row keeps the calibration band)."""
import numpy as np
import pandas as pd
import pytest

from ess.sim import predictions as P
from ess.sim import simulate
from ess.tables import sim as tsim


def test_the_calibrated_range_is_the_calibration_points():
    c = P.calibrated_range()
    assert c == {"mtp": 2, "context_len": 32768, "batch_max": c["batch_max"], "ratio": 1.0}
    assert c["batch_max"] >= 52                                     # Table 2 row 1 is a calibration point


def test_what_a_prediction_extrapolates():
    assert P.extrapolated_parts(52, 32768, 1.0, 2) == []
    parts = P.extrapolated_parts(52, 32768, 1.0, 4)
    assert len(parts) == 1 and parts[0].startswith("MTP 4") and "mtp_growth.yaml" in parts[0]
    assert [p.split(":")[0] for p in P.extrapolated_parts(10_000, 131072, 0.1, 2)] == [
        "context 128K", "batch 10000", "ratio 0.1"]


def test_the_public_rule_by_hand():
    """s(m)/s(2) = (1 + a (m - 1)) / (1 + a): a = 0.5 gives s(4)/s(2) = 2.5 / 1.5 and s(1)/s(2) = 1 / 1.5; a = 0 a
    fixed step; the evidence's own ends as the data file tabulates them (0.17: 1.29, 0.66: 1.80 at MTP 4)."""
    assert P.mtp_step_ratio(4, 0.5) == pytest.approx(2.5 / 1.5)
    assert P.mtp_step_ratio(1, 0.5) == pytest.approx(1 / 1.5)
    assert P.mtp_step_ratio(np.array([1, 2, 4]), 0.0).tolist() == [1.0, 1.0, 1.0]
    g = P.mtp_growth()
    assert g["low"] < g["central"] < g["high"] and g["source"]
    assert P.mtp_step_ratio(4, g["low"]) == pytest.approx(1.29, abs=0.005)
    assert P.mtp_step_ratio(4, g["high"]) == pytest.approx(1.80, abs=0.005)
    with pytest.raises((TypeError, ValueError), match="mtp"):
        P.mtp_step_ratio(2.5, 0.3)
    with pytest.raises(ValueError, match="a must"):
        P.mtp_step_ratio(4, -0.1)


def test_the_public_growth_replaces_the_models_by_hand():
    """One MTP 4 row and one MTP 2 row (the reference of gain_pct). The model's own no-offload step at MTP 4 over
    MTP 2 is g; with the public ratio p = mtp_step_ratio(4, a), the MTP 4 row's step is scaled by p / g, its
    throughput by g / p, its gain recomputed against the unchanged MTP 2 row; the MTP 2 row is untouched."""
    B, L = 52, 32768
    s2 = float(simulate(B, L, 1.0, mtp=2, accept_ratio=1.0).step_no_offload_s[0] * 1e3)
    s4 = float(simulate(B, L, 1.0, mtp=4, accept_ratio=1.0).step_no_offload_s[0] * 1e3)
    frame = pd.DataFrame({"batch": [B, B], "context_len": [L, L], "mtp": [2, 4], "accept_ratio": [1.7, 3.0],
                          "step_ms": [s2, s4 + 1.0], "step_ms_no_offload": [s2, s4], "stall_ms": [0.0, 1.0],
                          "throughput": [1000.0, 2000.0], "otps": [10.0, 20.0], "throughput_no_miss": [1000.0, 2100.0],
                          "gain_pct": [0.0, 100.0], "gain_no_miss_pct": [0.0, 110.0]})
    a = 0.5
    got = P.mtp_growth_frame(frame, a)
    f = P.mtp_step_ratio(4, a) / (s4 / s2)
    assert got.iloc[0].to_dict() == frame.iloc[0].to_dict()
    r = got.iloc[1]
    assert r.step_ms == pytest.approx((s4 + 1.0) * f) and r.stall_ms == pytest.approx(f)
    assert r.throughput == pytest.approx(2000.0 / f) and r.otps == pytest.approx(20.0 / f)
    assert r.gain_pct == pytest.approx((2000.0 / f / 1000.0 - 1) * 100)
    assert r.gain_no_miss_pct == pytest.approx((2100.0 / f / 1000.0 - 1) * 100)
    # at the a whose public ratio equals the model's, nothing moves
    a_same = (s4 / s2 - 1) / (3 - (s4 / s2))          # (1 + 3a) / (1 + a) = g  =>  a = (g - 1) / (3 - g)
    assert P.mtp_growth_frame(frame, a_same).throughput.tolist() == pytest.approx(frame.throughput.tolist())


def test_the_extrapolation_band_envelopes_the_calibration_band():
    """Calibration frames (central, a second) and extrapolation frames (one higher): the ext band spans all; the
    calibrated row (MTP 2, 32K, batch 52, no offload) keeps its calibration band; each row lists what it
    extrapolates."""
    base = pd.DataFrame({"batch": [52, 160], "context_len": [32768, 32768], "ratio": [1.0, 0.2], "mtp": [2, 4],
                         "throughput": [100.0, 200.0]})
    frames = {"central": base, "other": base.assign(throughput=[95.0, 180.0])}
    t2 = P.band_frames(frames, ("throughput",))
    x = {"variant": base.assign(throughput=[130.0, 260.0])}
    got = tsim.extrapolation_band(t2, frames, x, columns=("throughput",))
    assert got.throughput_ext_low.tolist() == [95.0, 180.0]
    assert got.throughput_ext_high.tolist() == [100.0, 260.0]          # row 0 calibrated: its calibration band
    assert got.extrapolated.iloc[0] == [] and len(got.extrapolated.iloc[1]) == 2
