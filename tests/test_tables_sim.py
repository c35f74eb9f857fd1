"""Simulator tables: Table 2 predictions, the article's table, the 128K claim, sections 3.3 and 1.2, widgets."""
import numpy as np
import pandas as pd
import pytest

from ess.layout import pool_slots, step_entries
from ess.sim.misses import BandSizes
from ess.memory import largest_batch
from ess.published import published
from ess.sim import Scenario
from ess.sim.calibrate import calibrated_params
from ess.sim.predictions import BandInputs
from ess.sim.timeline import simulate
from ess.specs import deployment_spec, model_spec
from ess.tables import sim as ts
from ess.widgets.sim import sim_budget_view

P = calibrated_params()                             # the calibration, re-run once per test process (about 1 s)
S = Scenario(params=P)
MODEL = model_spec("deepseek-v3.2-exp")
DEP = deployment_spec("paper-table1")
NL = MODEL.n_layers


def flat_misses(level):
    return lambda L, r, T: np.full(NL, float(level))


@pytest.fixture(scope="module")
def t2_zero():
    return ts.table2_predictions(flat_misses(0.0), scenario=S)


def test_table2_has_every_held_back_configuration_and_no_published_value(t2_zero):
    """Every (batch, ratio) pair of the paper's Table 2, at each MTP 4 accept ratio, once at the paper's ratio and,
    for the offload rows, once more at ess's; plus the calibration row."""
    pub = published("paper_table2")
    held = [e for e in pub.values() if e["role"] == "held_back" and "rows" in e]
    n_paper = sum(len(e["rows"]) * len(e.get("accept_ratios", [0])) for e in held) + 1
    n_ess = sum(sum(r < 1 for _, r in e["rows"]) * len(e.get("accept_ratios", [0])) for e in held)
    assert (t2_zero.setting == "paper").sum() == n_paper and (t2_zero.setting == "ess").sum() == n_ess
    assert t2_zero.row.is_unique
    held_rows = t2_zero[t2_zero.role == "held_back"]
    assert held_rows.published.isna().all()
    paper = t2_zero[t2_zero.setting == "paper"]
    for e in held:                                        # the paper's pairs, as given
        got = paper[(paper.context_len == e["context_len"]) & (paper.mtp == e["mtp"]) & (paper.role == "held_back")]
        assert sorted({(int(b), round(float(r), 2)) for b, r in zip(got.batch, got.ratio)}) == \
            sorted({(int(b), float(r)) for b, r in e["rows"]})
    # none infeasible at the paper's ratio (memory as the paper ran it); at ess's ratio only where the host binds
    assert (paper.status != "infeasible").all()
    bad = t2_zero[t2_zero.status == "infeasible"]
    assert (bad.setting == "ess").all() and bad.limit_binds.str.contains("host memory").all(), bad


def test_mtp4_is_a_sweep_over_accept_ratios_never_a_published_fact(t2_zero):
    m4 = t2_zero[t2_zero.mtp == 4]
    per_acc = m4.groupby("accept_ratio").batch.apply(sorted)
    assert len(per_acc) >= 2 and all(b == per_acc.iloc[0] for b in per_acc)    # every batch at every accept ratio
    assert m4.accept_ratio_source.str.contains("not results").all()
    assert m4.published.isna().all()


def test_zero_misses_equal_the_bound_and_larger_batches_never_lose(t2_zero):
    ok = t2_zero[t2_zero.status.isin(["predicted", "calibration (fitted)"])]
    assert np.allclose(ok.throughput, ok.throughput_no_miss)
    for _, part in t2_zero[t2_zero.context_len == 32768].groupby(["mtp", "accept_ratio"]):
        tp = part.sort_values("batch").throughput_no_miss.to_numpy()
        assert np.all(np.diff(tp) >= -1e-6 * tp[:-1])


def test_more_misses_lower_every_offload_row(t2_zero):
    t2_many = ts.table2_predictions(flat_misses(600.0), scenario=S, contexts=("32k",))
    a = t2_zero[t2_zero.context_len == 32768].set_index("row")
    b = t2_many.set_index("row")
    off = b.index[(b.ratio < 1) & (b.status == "predicted")]
    assert len(off) and (b.loc[off, "throughput"] < a.loc[off, "throughput"]).all()


def test_blocked_without_miss_counts():
    t = ts.table2_predictions(None, scenario=S, contexts=("128k",))
    assert set(t[t.ratio < 1].status) == {"blocked"}
    assert t[t.ratio < 1].throughput_no_miss.notna().all()


def test_cachesim_errors_become_infeasible_rows():
    def small_pool(L, r, T):
        raise ValueError("the pool is smaller than one step's entries")
    t = ts.table2_predictions(small_pool, scenario=S, contexts=("128k",))
    assert set(t[t.ratio < 1].status) == {"infeasible"}
    assert t[t.ratio < 1].reason.str.contains("cache simulation").all()


def test_article_table_mtp4_rows_agree_with_a_direct_simulation(t2_zero):
    """The MTP=4 percentage is recomputed here straight from simulate (not through predict_configs); since the
    step does not depend on the accept ratio, the two accept ratios' gains differ exactly by their ratio."""
    art = ts.article_table_32k(t2_zero)
    assert list(art.row) == ["Baseline"] + ["MTP=4", "ESS Architecture", "Offload contribution"] * 2
    assert art.mtp4_accept_ratio.iloc[0] != art.mtp4_accept_ratio.iloc[0]            # NaN for the baseline
    assert art.iloc[1:].accept_ratio_status.str.contains("not a result").all()
    base = simulate(52, 32768, 1.0, scenario=S)
    gains = {}
    for acc in art.mtp4_accept_ratio.dropna().unique():
        rows = art[art.mtp4_accept_ratio == acc].set_index("row")
        direct = simulate(52, 32768, 1.0, mtp=4, accept_ratio=acc, scenario=S)
        assert rows.loc["MTP=4", "ours_pct"] == pytest.approx((direct.throughput[0] / base.throughput[0] - 1) * 100)
        assert rows.loc["Offload contribution", "ours_pct"] == pytest.approx(
            rows.loc["ESS Architecture", "ours_pct"] - rows.loc["MTP=4", "ours_pct"])
        assert rows.loc["ESS Architecture", "ours_pct"] > rows.loc["MTP=4", "ours_pct"]   # zero misses: offload adds
        gains[acc] = 1 + rows.loc["MTP=4", "ours_pct"] / 100
    (a1, g1), (a2, g2) = sorted(gains.items())
    assert g2 / g1 == pytest.approx(a2 / a1)
    with pytest.raises(ValueError, match="mtp4_accepts"):
        ts.article_table_32k(t2_zero, mtp4_accepts=[3.0])


def test_claim_128k(t2_zero):
    """Our 128K gain, recomputed from simulate at the paper's (batch, ratio) rows (memory as the paper ran them):
    zero misses, so the best row is the one with the largest batch, (54, 0.1)."""
    c = ts.claim_128k(t2_zero)
    assert c["baseline_batch"] == largest_batch(131072, 1.0).batch == 13          # the paper's 128K limit
    r = simulate([c["baseline_batch"], c["batch"]], 131072, [1.0, c["ratio"]], misses=np.zeros(NL),
                 scenario=S.replace(check_memory=False))
    assert c["ours_pct"] == pytest.approx((r.throughput[1] / r.throughput[0] - 1) * 100)
    assert c["ours_pct"] > 0 and (c["batch"], c["ratio"]) == (54, 0.1)


def test_deployment_benefits_state_assumptions():
    d = ts.deployment_benefits(flat_misses(0.0), scenario=S, context_len=32768, ratio=0.2)
    assert list(d.claim[:3]) == ["GPUs per task", "energy per token", "sessions per node"]
    assert d.assumption.str.len().min() > 40
    assert d.ours_before.iloc[2] == DEP.gpus_per_node * largest_batch(32768, 1.0).batch
    assert d.ours_after.iloc[2] == DEP.gpus_per_node * largest_batch(32768, 0.2).batch
    assert d.ours_ratio.iloc[0] == pytest.approx(d.ours_ratio.iloc[1])   # both scale with 1 / throughput gain
    assert d.ours_ratio.iloc[0] == pytest.approx(1 / d.ours_ratio.iloc[3])
    assert "fitted by construction" not in set(d.status_before)          # the context was given, not chosen


def test_deployment_benefits_mark_the_fitted_before_value():
    """With the context chosen to hold about 1,200 sessions, that 'before' value is fitted by construction and
    says so; no row calls itself reproduced. The default ratio is the smallest on the 0.01 grid whose pools hold
    one step's union of MTP top-K sets on average over the layers."""
    d = ts.deployment_benefits(flat_misses(0.0), scenario=S)
    row = d.set_index("claim").loc["sessions per node"]
    assert row.status_before == "fitted by construction" and "by construction" in row.assumption
    assert not (d.status_before.str.contains("reproduced") | d.status_after.str.contains("reproduced")).any()
    cfg = d.config.iloc[0]
    from ess.tracegen import locality_profile
    L = cfg["context_len"]
    need = np.ceil(step_entries(MODEL, L, cfg["mtp"], overlap=locality_profile("paper", NL)).mean())
    assert pool_slots(MODEL, cfg["ratio"], L) >= need > pool_slots(MODEL, round(cfg["ratio"] - 0.01, 6), L)


def test_section12_claims():
    s = ts.section12_claims(S)
    assert s.ours.iloc[0] == pytest.approx(43.1)
    assert s.status.iloc[0] == "not reproduced" and 0 < s.ours.iloc[1] < 100


def test_widget_view_reports_batch_and_infeasible():
    fig, s = sim_budget_view(S, 1.0, 32768)
    assert s["batch"] == 52 and s["throughput"] > 0
    fig, s = sim_budget_view(S, 0.01, 32768)
    assert s["throughput"] is None and "slots" in s["reason"]


def test_widget_hbm_override():
    _, small = sim_budget_view(S, 1.0, 32768, hbm_GiB=120)
    _, big = sim_budget_view(S, 1.0, 32768, hbm_GiB=160)
    assert small["batch"] < 52 < big["batch"]           # the widget's controls: tests/test_tables_and_widgets.py


def test_table2_figure_labels_configured_accept_ratios(t2_zero):
    from ess.viz import sim as vs
    names = [t.name for t in vs.fig_table2(t2_zero, 32768).data]
    for acc in published("paper_table2")["t2_32k_mtp4"]["accept_ratios"]:
        assert any(n.startswith(f"MTP 4, accept {acc:g} (a configuration)") for n in names)
    assert not any(n.startswith("MTP 2") and "configuration" in n for n in names)
    assert hasattr(vs, "fig_sim_misses_per_layer") and not hasattr(vs, "fig_misses_per_layer")


def test_128k_rows_name_the_limit_that_binds(t2_zero):
    """ess keeps batch x (indexer + ratio x latent) within its KV budget and the whole latent cache in host memory
    (256 GB per GPU on the assumed DGX H200). A 128K request takes 1.055 + ratio x 5.245 GB of GPU memory and
    5.245 GB of host memory: the paper's (40, 0.2) takes 40 x 2.104 = 84.2 GB, 1.8 % over the budget (39 fit), and
    ess's rule gives batch 40 a slightly smaller ratio; (54, 0.1) needs 54 x 5.245 = 283 GB of host memory, more than
    256 (48 fit): no ratio holds 54 requests there, so its ess row is infeasible, the host named."""
    t = t2_zero[t2_zero.context_len == 131072].set_index("row")
    r40 = t.loc["t2_128k_mtp2_b40_r0.2"]
    assert r40.batch_gpu_rule == largest_batch(131072, 0.2).batch_gpu == 39
    assert 1.0 < r40.kv_budget_use < 1.03 and "GPU memory" in r40.limit_binds
    e40 = t.loc["t2_128k_mtp2_b40_ess"]
    assert e40.ratio < 0.2 and e40.limit_binds == "" and e40.status == "predicted"
    r54 = t.loc["t2_128k_mtp2_b54_r0.1"]
    assert r54.batch_host_limit == largest_batch(131072, 0.1).batch_host == 48 and "host memory" in r54.limit_binds
    e54 = t.loc["t2_128k_mtp2_b54_ess"]
    assert e54.status == "infeasible" and "host memory" in e54.reason
    assert t.loc["t2_128k_mtp2_b13_r1"].limit_binds == ""
    # the records say which rows were predicted without the memory check (the paper's rows)
    t128, _ = ts.table2_bands(BandInputs(P, {"c": P}, [], {"z": flat_misses(0.0)},
        BandSizes(band_batch=1)), contexts=("128k",))
    recs = {r["name"]: r for r in ts.table2_128k_records(t128, {"check_memory": True, "strategy": "best"})}
    assert recs["t2_128k_mtp2_b54_r0.1_throughput"]["config"]["check_memory"] is False
    assert recs["t2_128k_mtp2_b40_ess_throughput"]["config"]["check_memory"] is True
    assert recs["t2_128k_mtp2_b54_ess_throughput"]["value"] is None


def test_table2_bands_are_the_lowest_and_highest_over_the_combinations():
    from ess.sim.calibrate import band_widening
    fns = {"few": flat_misses(50.0), "many": flat_misses(400.0)}
    P2 = P.__class__(P.compute_scale * 1.1, P.comm_scale, P.fixed_ms, "a second calibration")
    band = BandInputs(P, {"central": P, "other": P2}, [], fns, BandSizes(band_batch=1))
    t2, frames = ts.table2_bands(band, contexts=("32k",))
    assert len(frames) == 4 and (t2.band_size == 4).all()
    stack = np.stack([f.throughput.to_numpy(dtype=float) for f in frames.values()])
    np.testing.assert_allclose(t2.throughput, frames[("central", "few")].throughput)     # the central combination
    w = band_widening()                                      # throughput's band widened to its measured coverage
    assert 0 < w < 0.2
    np.testing.assert_allclose(t2.throughput_low, stack.min(axis=0) * (1 - w))
    np.testing.assert_allclose(t2.throughput_high, stack.max(axis=0) * (1 + w))
    gains = np.stack([f.gain_pct.to_numpy(dtype=float) for f in frames.values()])
    np.testing.assert_allclose(t2.gain_pct_low, np.nanmin(gains, axis=0))      # a gain's band is not widened
    off = t2.ratio < 1                                       # more misses lower the offload rows: the "many" frames
    np.testing.assert_allclose(t2.throughput_low[off], np.minimum(frames[("central", "many")].throughput,
                                                                  frames[("other", "many")].throughput)[off] * (1 - w))
    assert ts.band_over({"a": 3.0, "b": None, "c": 1.0, "d": np.nan}) == (3.0, 1.0, 3.0)
    assert ts.band_over({"a": None}) == (None, None, None)


def test_figures_draw_the_band_around_the_central_line():
    """A band is one filled trace per series, between low and high, in the series' colour, not in the legend twice;
    the central line is drawn on top of it."""
    import plotly.graph_objects as go
    from ess.viz import prefetch as vp, sim as vs
    from ess.viz._style import add_band
    fig = add_band(go.Figure(), [0, 1, 2], [1, 2, np.nan], [3, 4, 5], name="b", color="#636efa")
    (tr,) = fig.data
    assert tr.fill == "toself" and list(tr.x) == [0, 1, 1, 0] and list(tr.y) == [3, 4, 2, 1]   # NaN point skipped
    assert "99, 110, 250" in tr.fillcolor and tr.showlegend is False
    t2, _ = ts.table2_bands(BandInputs(P, {"c": P}, [], {"few": flat_misses(50.0), "many": flat_misses(400.0)},
        BandSizes(band_batch=1)),
                            contexts=("32k",))
    data = vs.fig_table2(t2, 32768).data
    bands = [t for t in data if t.fill == "toself"]
    assert len(bands) == t2.groupby(["mtp", "accept_ratio"]).ngroups
    mtp2 = next(t for t in bands if t.name.startswith("MTP 2"))
    part = t2[(t2.mtp == 2)].sort_values("batch")
    assert max(mtp2.y) == pytest.approx(part.throughput_high.max()) and min(mtp2.y) == pytest.approx(
        part.throughput_low.min())
    curve = vp.fig_warmup_curve({"w": [3.0, 2.0]}, bands={"w": ([2.0, 1.0], [4.0, 3.0])})
    assert [t.fill for t in curve.data] == ["toself", None]
