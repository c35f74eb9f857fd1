"""The extrapolation band of notebooks 06-08: what a prediction extrapolates, the public MTP growth rule worked by
hand, and the band's envelope (it contains the calibration band; a calibrated row keeps the calibration band)."""
import numpy as np
import pandas as pd
import pytest

from ess.sim import predictions as P
from ess.sim import simulate
from ess.sim.misses import BandSizes
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


# --- the bands of one number (adaptive batch sizing, the deployment claims) ------------------------------------------

def _fake_band(values):
    """A band whose combinations are the plain numbers of ``values`` ({name: (kind, number)}), central first."""
    import types
    return types.SimpleNamespace(variants=lambda sc, vf: {n: (k, v, None) for n, (k, v) in values.items()})


def test_value_band_by_hand():
    """Calibration band over the calibration combinations only; extrapolation band over all; a combination without
    a value counts in neither; widening moves the calibration band's ends by the stored share."""
    from ess.sim.calibrate import band_widening
    b = _fake_band({"central": ("calibration", 10.0), "cal2": ("calibration", 12.0), "cal3": ("calibration", None),
                    "x1": ("extrapolation", 7.0), "x2": ("extrapolation", float("nan"))})
    got = P.value_band(b, lambda sc, m: sc)
    assert got == {"value": 10.0, "low": 10.0, "high": 12.0, "ext_low": 7.0, "ext_high": 12.0, "band_size": 2,
                   "ext_band_size": 3}
    w = band_widening()
    wide = P.value_band(b, lambda sc, m: sc, widen=True)
    assert (wide["low"], wide["high"]) == pytest.approx((10.0 * (1 - w), 12.0 * (1 + w)))
    assert wide["ext_high"] == pytest.approx(12.0 * (1 + w)) and wide["ext_low"] == 7.0   # contains the widened band
    keyed = P.value_band(b, lambda sc, m: {"a": sc, "b": None if sc is None else -sc})
    assert keyed["b"]["low"] == -12.0 and keyed["b"]["ext_high"] == -7.0


def test_value_band_refuses_another_mtp_and_a_non_callable():
    band = P.BandInputs(None, {"c": None}, [], {}, BandSizes(band_batch=1))
    with pytest.raises(TypeError, match="fn"):
        P.value_band(band, 3.0)
    import types
    fake = types.SimpleNamespace(variants=lambda sc, vf: {"c": ("calibration", types.SimpleNamespace(mtp=4), None)})
    with pytest.raises(ValueError, match="MTP 4"):
        P.value_band(fake, lambda sc, m: 1.0)


@pytest.fixture(scope="module")
def small_band():
    """A real BandInputs: the project's calibration and a 20 % slower one, two miss profiles (flat, doubled)."""
    import types
    from ess.sim.config import as_scenario
    from ess.sim.costs import CostParams
    from ess.specs import model_spec
    p0 = as_scenario(None).params
    assert isinstance(p0, CostParams)
    slow = CostParams(**{**p0.__dict__, "compute_scale": p0.compute_scale * 1.2})
    nl = model_spec("deepseek-v3.2-exp").n_sparse_layers
    flat = lambda L, r, mtp: np.full(nl, 40.0 * (1 - r))                 # noqa: E731
    double = lambda L, r, mtp: np.full(nl, 80.0 * (1 - r))               # noqa: E731
    models = [types.SimpleNamespace(name="flat"), types.SimpleNamespace(name="double")]
    return P.BandInputs(p0, {"central": p0, "slower": slow}, models, {"flat": flat, "double": double},
        BandSizes(band_batch=1))


def test_adaptive_batch_central_is_best_batch_and_band_holds_every_choice(small_band):
    from ess.sim.timeline import best_batch
    sc = small_band.scenario()
    L, ratios = 32768, [1.0, 0.5]
    got = tsim.adaptive_batch(small_band, L, ratios, scenario=sc)
    plain = best_batch(L, ratios, misses_by_ratio={0.5: small_band.central_misses(L, 0.5, 2)}, scenario=sc)
    assert {k: got[k] for k in plain} == plain
    # each combination chooses anew: the band's ends are the best throughputs of the slowest and fastest combination
    every = [best_batch(L, ratios, misses_by_ratio={0.5: m(L, 0.5, 2)}, scenario=s)["throughput"]
             for _, s, m in small_band.variants(sc).values()]
    cal = every[:4]
    assert got["band"]["ext_low"] <= min(every) + 1e-9 and got["band"]["ext_high"] >= max(every) - 1e-9
    assert got["band"]["low"] < min(cal) and got["band"]["high"] > max(cal)           # widened
    assert got["band"]["band_size"] == 4 and got["band"]["ext_band_size"] == len(every)
    assert got["extrapolated"] == P.extrapolated_parts(got["batch"], L, got["ratio"], 2)
    none = tsim.adaptive_batch(small_band, L, ratios, otps_floor=1e9, scenario=sc)
    assert none["throughput"] is None and none["band"]["value"] is None and none["band"]["low"] is None


def test_deployment_bands_vary_the_throughputs_not_the_memory(small_band):
    """At the central frame's context and ratio: the central combination gives the frame's own ratios; the
    sessions (memory only) have a band of zero width, and so are judged by the tolerance; a throughput ratio's band
    is wider, and a target inside it is reproduced."""
    sc = small_band.scenario()
    dep_df = tsim.deployment_benefits(small_band.central_misses, scenario=sc, context_len=32768, ratio=0.5)
    bands = tsim.deployment_bands(small_band, dep_df, scenario=sc)
    for _, r in dep_df.iterrows():
        b = bands[r.claim]
        assert b["value"] == pytest.approx(r.ours_ratio)
        assert b["low"] <= r.ours_ratio <= b["high"]
    s = bands["sessions per node"]
    assert s["low"] == s["high"] == s["ext_low"] == s["ext_high"]
    g = bands["GPUs per task"]
    assert g["ext_high"] > g["ext_low"]
    assert any("ratio 0.5" in p for p in g["extrapolated"])
    recs = {r["name"]: r for r in tsim.deployment_records(dep_df, "t", {}, bands)}
    gr = recs["deploy_t_GPUs_per_task_ratio"]
    assert gr["low"] == g["low"] and gr["config"]["extrapolation_band"] == {"low": g["ext_low"], "high": g["ext_high"]}
    assert "band" in gr["config"]["tolerance"]
    assert "within" in recs["deploy_t_sessions_per_node_ratio"]["config"]["tolerance"]
    # a published ratio inside the band: reproduced (the band decides, not the 10 % tolerance)
    inside = dep_df.assign(article_ratio=np.where(dep_df.claim == "GPUs per task", g["ext_high"], dep_df.article_ratio))
    r2 = {r["name"]: r for r in tsim.deployment_records(inside, "t", {}, bands)}
    assert r2["deploy_t_GPUs_per_task_ratio"]["status"] == "reproduced"


def test_mtp_growth_check_by_hand():
    """The implied a puts the model's own ratio back through the public rule; the public columns are the rule at the
    evidence's ends; ``inside`` says whether the model's ratio lies between them. Worked example: calibrated at
    MTP 2, a model ratio of 1.4 at MTP 4 means (1 + 3a) / (1 + a) = 1.4, so a = 0.4 / 1.6 = 0.25."""
    assert P.mtp_step_ratio(4, 0.25) == pytest.approx(1.4)
    got = P.mtp_growth_check(52, 32768)
    assert got.mtp.tolist() == [1, 4]
    growth = P.mtp_growth()
    for r in got.itertuples():
        assert P.mtp_step_ratio(r.mtp, r.model_a) == pytest.approx(r.model_ratio)
        assert r.public_central == pytest.approx(P.mtp_step_ratio(r.mtp, growth["central"]))
        ends = sorted(P.mtp_step_ratio(r.mtp, growth[e]) for e in ("low", "high"))
        assert [r.public_low, r.public_high] == pytest.approx(ends)
        assert r.inside == (ends[0] <= r.model_ratio <= ends[1])
    s = lambda m: simulate(52, 32768, 1.0, mtp=m, accept_ratio=1.0).step_no_offload_s[0]    # noqa: E731
    assert got.model_ratio.iloc[1] == pytest.approx(s(4) / s(2))
    with pytest.raises(ValueError, match="batch"):
        P.mtp_growth_check(0, 32768)
