"""Simulator tables: Table 2 predictions, the article's table, the 128K claim, sections 3.3 and 1.2, widgets."""
import numpy as np
import pandas as pd
import pytest

from ess.published import published
from ess.sim.costs import CostParams
from ess.tables import sim as ts
from ess.widgets.sim import sim_budget_view

P = CostParams(0.58, 1.17, 48.4)                    # about the calibrated values (tests stay fast)
NL = 61


def flat_misses(level):
    return lambda L, r, T: np.full(NL, float(level))


@pytest.fixture(scope="module")
def t2_zero():
    return ts.table2_predictions(P, flat_misses(0.0))


def test_table2_has_every_held_back_configuration_and_no_published_value(t2_zero):
    pub = published("paper_table2")
    n = sum(len(e["batches"]) for e in pub.values() if "batches" in e) + len(pub["t2_128k_mtp2"]["ratios"]) + 1
    assert len(t2_zero) == n
    held = t2_zero[t2_zero.role == "held_back"]
    assert held.published.isna().all()
    assert (t2_zero[t2_zero.role == "calibration"].published == 9647.71).all()


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


def test_article_table_rows_and_percentages(t2_zero):
    art = ts.article_table_32k(t2_zero, mtp4_accept=3.4)
    assert list(art.row) == ["Baseline", "MTP=4", "ESS Architecture", "Offload contribution"]
    assert list(art.article_pct.iloc[1:]) == [53.0, 123.4, 70.2]
    assert list(art.paper_pct.iloc[1:]) == [53.1, 123.4, 70.3]
    assert art.ours_pct.iloc[3] == pytest.approx(art.ours_pct.iloc[2] - art.ours_pct.iloc[1])
    assert art.ours_pct.iloc[2] > art.ours_pct.iloc[1]        # offload with no misses adds to MTP alone


def test_claim_128k(t2_zero):
    c = ts.claim_128k(t2_zero)
    assert c["published_pct"] == 123 and c["baseline_batch"] == 13 and c["ours_pct"] > 0


def test_deployment_benefits_state_assumptions():
    d = ts.deployment_benefits(P, flat_misses(0.0), context_len=32768, ratio=0.2)
    assert list(d.claim[:3]) == ["GPUs per task", "energy per token", "sessions per node"]
    assert d.assumption.str.len().min() > 40
    assert d.ours_before.iloc[2] == 8 * 52
    assert d.article_ratio.iloc[0] == pytest.approx(3 / 8)
    assert d.ours_ratio.iloc[0] == pytest.approx(d.ours_ratio.iloc[1])   # both scale with 1 / throughput gain


def test_section12_claims():
    s = ts.section12_claims(P)
    assert s.ours.iloc[0] == pytest.approx(43.1)
    assert s.status.iloc[0] == "not reproduced" and 0 < s.ours.iloc[1] < 100


def test_overlap_vs_misses_and_break_even():
    o = ts.overlap_vs_misses(P, [0, 200, 800])
    piv = o.pivot(index="misses_per_layer", columns="strategy", values="overhead_pct")
    assert (piv["best"] <= piv[["none", "da", "dba"]].min(axis=1) + 1e-9).all()
    cfg = pd.DataFrame({"batch": [160], "context_len": [32768], "ratio": [0.19], "mtp": [2], "accept_ratio": [1.7]})
    be = ts.break_even_misses(P, cfg, 9500.0)
    assert 0 < be.break_even_misses_per_layer.iloc[0] < 4096


def test_widget_view_reports_batch_and_infeasible():
    fig, s = sim_budget_view("H200", 1.0, 32768, params=P)
    assert s["batch"] == 52 and s["throughput"] > 0
    fig, s = sim_budget_view("H200", 0.01, 32768, params=P)
    assert s["throughput"] is None and "slots" in s["reason"]


def test_widget_hbm_override_and_controls():
    _, small = sim_budget_view("H200", 1.0, 32768, hbm_GiB=120, params=P)
    _, big = sim_budget_view("H200", 1.0, 32768, hbm_GiB=160, params=P)
    assert small["batch"] < 52 < big["batch"]
    from ess.widgets.sim import sim_budget_widget
    w = sim_budget_widget(params=P)
    w.controls["ratio"].value = 0.5
    assert "batch" in w.summary_label.value
    w.controls["gpu"].value = "H100"
    assert w.controls["hbm_GiB"].value == 80
