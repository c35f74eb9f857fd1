import pytest

from ess import tables, viz
from ess.widgets import memory_budget_view, memory_budget_widget


def test_memory_wall_claims():
    df = tables.memory_wall_claims().set_index("claim")
    assert df.loc["no-offload batch limit at 32K", "status"] == "calibrated"      # fitted there: not evidence
    assert df.loc["no-offload batch limit at 128K", "status"] == "implied by the 32K fit"   # 4 x 32K = 128K
    assert df.loc["KV cache per sample at 32K", "status"] == "not reproduced"
    assert df.loc["batch 32 at 32K on dual Xeon 8380", "status"] == "reproduced"
    assert (df.reason.str.len() > 0).all() and (df.source.str.len() > 0).all()


def test_batch_limits_table_and_figures():
    df = tables.batch_limits_by_gpu([32768, 131072], [1.0, 0.2])
    assert set(df.gpu) == {"H800", "H100", "H200", "H20", "A100-80G"}
    assert len(viz.fig_batch_limits(df, 32768).data) == 2
    kv = tables.kv_bytes_by_context([4096, 32768])
    assert len(viz.fig_cache_bytes(kv).data) == 3


def test_memory_budget_view_adds_up():
    fig, s = memory_budget_view("H200", 32768, 0.2)
    assert s["batch"] > s["batch_no_offload"] == 52
    total = sum(bar.x[0] for bar in fig.data)
    assert total == pytest.approx(141 * 2 ** 30 / 1e9, rel=1e-6)


def test_widget_reacts_to_controls():
    w = memory_budget_widget()
    before = w.summary_label.value
    w.controls["ratio"].value = 1.0
    assert "batch 52</b>" in w.summary_label.value and w.summary_label.value != before
    w.controls["gpu"].value = "H100"
    assert "batch 52</b>" not in w.summary_label.value
