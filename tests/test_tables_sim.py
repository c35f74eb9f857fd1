"""Simulator tables: Table 2 predictions, the article's table, the 128K claim, sections 3.3 and 1.2, widgets."""
import numpy as np
import pandas as pd
import pytest

from ess.layout import pool_slots, step_entries
from ess.memory import largest_batch
from ess.published import published
from ess.sim.calibrate import calibrated_params
from ess.sim.timeline import simulate
from ess.specs import deployment_spec, model_spec
from ess.sim import scenarios as sc
from ess.tables import sim as ts
from ess.widgets.sim import sim_budget_view

P = calibrated_params()                             # the calibration, re-run once per test process (about 1 s)
MODEL = model_spec("deepseek-v3.2-exp")
DEP = deployment_spec("paper-table1")
NL = MODEL.n_layers


def flat_misses(level):
    return lambda L, r, T: np.full(NL, float(level))


@pytest.fixture(scope="module")
def t2_zero():
    return ts.table2_predictions(P, flat_misses(0.0))


def test_table2_has_every_held_back_configuration_and_no_published_value(t2_zero):
    pub = published("paper_table2")
    n = (sum(len(e["batches"]) * len(e.get("accept_ratios", [0])) for e in pub.values() if "batches" in e)
         + len(pub["t2_128k_mtp2"]["ratios"]) + 1)
    assert len(t2_zero) == n and t2_zero.row.is_unique
    held = t2_zero[t2_zero.role == "held_back"]
    assert held.published.isna().all()


def test_mtp4_is_a_sweep_over_accept_ratios_never_a_published_fact(t2_zero):
    m4 = t2_zero[t2_zero.mtp == 4]
    per_acc = m4.groupby("accept_ratio").batch.apply(sorted)
    assert len(per_acc) >= 2 and all(b == per_acc.iloc[0] for b in per_acc)    # every batch at every accept ratio
    assert m4.accept_ratio_source.str.contains("not a published value").all()
    assert m4.published.isna().all()


def test_zero_misses_equal_the_bound_and_larger_batches_never_lose(t2_zero):
    ok = t2_zero[t2_zero.status.isin(["predicted", "calibration (fitted)"])]
    assert np.allclose(ok.throughput, ok.throughput_no_miss)
    for _, part in t2_zero[t2_zero.context_len == 32768].groupby(["mtp", "accept_ratio"]):
        tp = part.sort_values("batch").throughput_no_miss.to_numpy()
        assert np.all(np.diff(tp) >= -1e-6 * tp[:-1])


def test_more_misses_lower_every_offload_row(t2_zero):
    t2_many = ts.table2_predictions(P, flat_misses(600.0), contexts=("32k",))
    a = t2_zero[t2_zero.context_len == 32768].set_index("row")
    b = t2_many.set_index("row")
    off = b.index[(b.ratio < 1) & (b.status == "predicted")]
    assert len(off) and (b.loc[off, "throughput"] < a.loc[off, "throughput"]).all()


def test_blocked_without_miss_counts():
    t = ts.table2_predictions(P, None, contexts=("128k",))
    assert set(t[t.ratio < 1].status) == {"blocked"}
    assert t[t.ratio < 1].throughput_no_miss.notna().all()


def test_cachesim_errors_become_infeasible_rows():
    def small_pool(L, r, T):
        raise ValueError("the pool is smaller than one step's entries")
    t = ts.table2_predictions(P, small_pool, contexts=("128k",))
    assert set(t[t.ratio < 1].status) == {"infeasible"}
    assert t[t.ratio < 1].reason.str.contains("cache simulation").all()


def test_article_table_mtp4_rows_agree_with_a_direct_simulation(t2_zero):
    """The MTP=4 percentage is recomputed here straight from simulate (not through predict_configs); since the
    step does not depend on the accept ratio, the two accept ratios' gains differ exactly by their ratio."""
    art = ts.article_table_32k(t2_zero)
    assert list(art.row) == ["Baseline"] + ["MTP=4", "ESS Architecture", "Offload contribution"] * 2
    assert art.mtp4_accept_ratio.iloc[0] != art.mtp4_accept_ratio.iloc[0]            # NaN for the baseline
    assert art.iloc[1:].accept_ratio_status.str.contains("not published").all()
    base = simulate(52, 32768, 1.0, params=P)
    gains = {}
    for acc in art.mtp4_accept_ratio.dropna().unique():
        rows = art[art.mtp4_accept_ratio == acc].set_index("row")
        direct = simulate(52, 32768, 1.0, mtp=4, accept_ratio=acc, params=P)
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
    """Our 128K gain, recomputed from simulate at the memory-limited batches: zero misses, so the best ratio is the
    one with the largest batch."""
    c = ts.claim_128k(t2_zero)
    assert c["baseline_batch"] == largest_batch(131072, 1.0).batch == 13          # the paper's 128K limit
    r = simulate([c["baseline_batch"], c["batch"]], 131072, [1.0, c["ratio"]], misses=np.zeros(NL), params=P)
    assert c["ours_pct"] == pytest.approx((r.throughput[1] / r.throughput[0] - 1) * 100)
    assert c["ours_pct"] > 0 and c["batch"] == max(largest_batch(131072, q).batch for q in (0.2, 0.1))


def test_deployment_benefits_state_assumptions():
    d = ts.deployment_benefits(P, flat_misses(0.0), context_len=32768, ratio=0.2)
    assert list(d.claim[:3]) == ["GPUs per task", "energy per token", "sessions per node"]
    assert d.assumption.str.len().min() > 40
    assert d.ours_before.iloc[2] == DEP.gpus_per_node * largest_batch(32768, 1.0).batch
    assert d.ours_after.iloc[2] == DEP.gpus_per_node * largest_batch(32768, 0.2).batch
    assert d.ours_ratio.iloc[0] == pytest.approx(d.ours_ratio.iloc[1])   # both scale with 1 / throughput gain
    assert d.ours_ratio.iloc[0] == pytest.approx(1 / d.ours_ratio.iloc[3])
    assert "fitted by construction" not in set(d.status_before)          # the context was given, not chosen


def test_deployment_benefits_mark_the_fitted_before_value():
    """With the context chosen to hold about 1,200 sessions, that 'before' value is fitted by construction and
    says so; no row calls itself reproduced. The default ratio is the smallest on the 0.01 grid whose pool holds
    one step's MTP x K entries."""
    d = ts.deployment_benefits(P, flat_misses(0.0))
    row = d.set_index("claim").loc["sessions per node"]
    assert row.status_before == "fitted by construction" and "by construction" in row.assumption
    assert not (d.status_before.str.contains("reproduced") | d.status_after.str.contains("reproduced")).any()
    cfg = d.config.iloc[0]
    L, need = cfg["context_len"], step_entries(MODEL, cfg["context_len"], cfg["mtp"])
    assert pool_slots(MODEL, cfg["ratio"], L) >= need > pool_slots(MODEL, round(cfg["ratio"] - 0.01, 6), L)


def test_section12_claims():
    s = ts.section12_claims(P)
    assert s.ours.iloc[0] == pytest.approx(43.1)
    assert s.status.iloc[0] == "not reproduced" and 0 < s.ours.iloc[1] < 100


def test_overlap_vs_misses_and_break_even():
    o = sc.overlap_vs_misses(P, [0, 200, 800])
    piv = o.pivot(index="misses_per_layer", columns="strategy", values="overhead_pct")
    assert (piv["best"] <= piv[["none", "da", "dba"]].min(axis=1) + 1e-9).all()
    assert (piv.diff().dropna() >= -1e-9).all().all()                   # more misses never cost less
    slow = sc.overlap_vs_misses(P, [800], h2d_GB_per_s=8.0)
    assert (slow.set_index("strategy").overhead_pct >= o[o.misses_per_layer == 800].set_index("strategy").overhead_pct
            - 1e-9).all()
    with pytest.raises(ValueError, match="ratio"):
        sc.overlap_vs_misses(P, [0], ratio=1.0)


def test_break_even_is_where_throughput_crosses_the_baseline():
    cfg = pd.DataFrame({"batch": [160], "context_len": [32768], "ratio": [0.19], "mtp": [2], "accept_ratio": [1.7]})
    baseline = float(simulate(52, 32768, 1.0, params=P).throughput[0])
    be = sc.break_even_misses(P, cfg, baseline, resolution=200).break_even_misses_per_layer.iloc[0]
    ksel = 2 * MODEL.index_topk
    assert 0 < be < ksel
    step = ksel / 199
    at, above = simulate([160, 160], 32768, 0.19, misses=np.stack([np.full(NL, be), np.full(NL, be + step)]),
                         params=P).throughput
    assert at >= baseline > above


def test_widget_view_reports_batch_and_infeasible():
    fig, s = sim_budget_view("H200", 1.0, 32768, params=P)
    assert s["batch"] == 52 and s["throughput"] > 0
    fig, s = sim_budget_view("H200", 0.01, 32768, params=P)
    assert s["throughput"] is None and "slots" in s["reason"]


def test_widget_hbm_override():
    _, small = sim_budget_view("H200", 1.0, 32768, hbm_GiB=120, params=P)
    _, big = sim_budget_view("H200", 1.0, 32768, hbm_GiB=160, params=P)
    assert small["batch"] < 52 < big["batch"]           # the widget's controls: tests/test_tables_and_widgets.py


def test_table2_figure_labels_configured_accept_ratios(t2_zero):
    from ess.viz import sim as vs
    names = [t.name for t in vs.fig_table2(t2_zero, 32768).data]
    for acc in published("paper_table2")["t2_32k_mtp4"]["accept_ratios"]:
        assert any(n.startswith(f"MTP 4, accept {acc:g} (a configuration)") for n in names)
    assert not any(n.startswith("MTP 2") and "configuration" in n for n in names)
    assert hasattr(vs, "fig_sim_misses_per_layer") and not hasattr(vs, "fig_misses_per_layer")
