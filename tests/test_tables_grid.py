"""The grid's tables, records, figures and widget (notebook 10), on the fake miss tables of test_sim_grid: every
record carries its configuration, source and bands; the paper's cell is compared with notebook 07's predictions;
the figures show the frame's numbers; the widget's controls redraw what the pure view function gives."""
import numpy as np
import pandas as pd
import pytest

from ess.results import Recorder
from ess.sim import grid as sgrid
from ess.tables import grid as tgrid
from ess.viz import grid as vgrid
from ess.widgets.grid import grid_view, grid_widget, summary_text, widget_links
from test_sim_grid import FakeTable, inputs  # noqa: F401  (the fixture)


@pytest.fixture(scope="module")
def frame(inputs):  # noqa: F811
    cells = sgrid.grid_cells(["deepseek-v3.2", "deepseek-v4-flash"], ["H200", "GB200"], [32768, 131072],
                             links=["pcie5-flashtrans", "pcie5", "c2c-gb300"], long_contexts=[1048576])
    found = sgrid.grid_search(cells, inputs)
    be, below = sgrid.break_even_link(found, inputs)
    sp = sgrid.overlap_links(found, inputs)
    return sgrid.grid_bands(found, inputs).assign(break_even_GB_per_s=be, break_even_below_span=below,
                                                  serial_GB_per_s=sp.serial_GB_per_s,
                                                  hidden_GB_per_s=sp.hidden_GB_per_s)


def test_every_record_has_configuration_source_and_band(frame, inputs):  # noqa: F811
    rec = Recorder("10_test")
    for r in tgrid.grid_records(frame, inputs, {"bands": inputs.describe()}):
        rec.record(**r)
    gains = [r for r in rec.records if r.name.startswith("gain_")]
    assert len(gains) == len(frame)
    for r in gains:
        assert r.source and r.status == "predicted"
        assert {"model", "gpu", "link", "context_len", "calibrated", "extrapolated", "bands"} <= set(r.config)
        if r.value is not None:
            assert r.low <= r.value <= r.high
            lo, hi = r.config["band_calibration"]
            assert r.low <= lo and hi <= r.high
    cal = [r for r in gains if r.config["calibrated_cell"]]
    assert cal and all(not r.config["extrapolated"] for r in cal)
    links = [r for r in rec.records if r.name.startswith(("break_even_link_", "serial_link_", "hidden_link_"))]
    assert len(links) == 3 * len(frame) and all(r.unit == "GB/s" for r in links)


def test_reference_cells_take_each_gpus_reference_link(frame):
    ref = tgrid.reference_cells(frame)
    assert set(ref[ref.gpu == "H200"].link) == {"pcie5-flashtrans"}
    assert set(ref[ref.gpu == "GB200"].link) == {"c2c-gb300"}
    f = tgrid.findings(frame)
    assert set(f.model) == {"deepseek-v3.2", "deepseek-v4-flash"} and (f.gpus == 2).all()


def test_the_paper_cell_compares_row_by_row():
    t2 = pd.DataFrame({"row": ["a", "b"], "setting": ["paper", "ess"], "batch": [64, 96], "ratio": [0.82, 0.45],
                       "throughput": [10000.0, 13000.0]})
    same = tgrid.paper_cell(pd.DataFrame({"throughput": [10000.0, 13000.0]}), t2)
    assert same.equal.all()
    off = tgrid.paper_cell(pd.DataFrame({"throughput": [10000.0, 13000.1]}), t2)
    assert list(off.equal) == [True, False]
    with pytest.raises(ValueError, match="one evaluation per row"):
        tgrid.paper_cell(pd.DataFrame({"throughput": [1.0]}), t2)


def test_notebook07_record_reads_a_run_of_the_same_size(tmp_path):
    assert tgrid.notebook07_record("", "x", True) is None
    rec = Recorder("07_table_32k", tmp_path / "07_table_32k.json", smoke=True)
    rec.record("t2_x_throughput", 123.0, "tokens/s per node")
    rec.save()
    here = tmp_path / "10_beyond_the_paper.json"
    assert tgrid.notebook07_record(here, "t2_x_throughput", True) == 123.0
    assert tgrid.notebook07_record(here, "t2_x_throughput", False) is None      # another size: not comparable
    assert tgrid.notebook07_record(here, "missing", True) is None


def test_the_scope_table_is_in_the_findings_and_the_book():
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    readme = (root / "docs" / "findings.md").read_text(encoding="utf-8")
    page = (root / "book" / "pages" / "07_beyond_the_paper.md").read_text(encoding="utf-8")
    for part, models, leaves, _ in tgrid.SCOPE:
        assert f"| {part} |" in readme and f"| {part} |" in page, part
    assert len(tgrid.model_scope()) == len(tgrid.SCOPE)


def test_model_cache_table_by_hand():
    t = tgrid.model_cache_table(["deepseek-v3.2", "glm-5", "deepseek-v4-flash"]).set_index("model")
    assert t.loc["glm-5", "cache_B_per_token"] == 61464
    assert t.loc["deepseek-v4-flash", "offloaded_share"] == pytest.approx(3066 / 3850.25)
    assert t.loc["deepseek-v4-flash", "step_read_per_layer_B"] == 299008


def test_heatmap_shows_the_gain_and_its_band(frame):
    ref = tgrid.reference_cells(frame)
    fig = vgrid.fig_gain_heatmap(ref, paper=("deepseek-v3.2", "H200", 32768))
    assert len(fig.data) == 2 and len(fig.layout.shapes) == 1
    r = ref[(ref.model == "deepseek-v3.2") & (ref.gpu == "H200") & (ref.context_len == 32768)].iloc[0]
    hm = fig.data[0]
    j, i = list(hm.x).index("32K"), list(hm.y).index("H200")
    assert hm.z[i][j] == r.gain_pct and f"{r.gain_pct:+.0f}" in hm.text[i][j]
    be = vgrid.fig_break_even(ref, links={"PCIe 5": 37.0})
    assert {t.name for t in be.data} == {"H200", "GB200"}


def test_grid_view_and_its_figure(inputs):  # noqa: F811
    fig, s = grid_view(inputs, "deepseek-v3.2", "H200", "pcie5-flashtrans", 32768, 2, "best")
    assert s["gain_pct"] == pytest.approx((s["throughput"] / s["throughput_no_offload"] - 1) * 100)
    assert f"{s['gain_pct']:+.1f} %" in fig.layout.title.text and len(fig.data) == 4
    assert "offload: ratio" in summary_text(s)
    fig2, s2 = grid_view(inputs, "deepseek-v3.2", "H200", "pcie5-flashtrans", 32768, 2, 0.01)
    assert fig2.layout.title.text.startswith("infeasible") and "infeasible" in summary_text(s2)
    with pytest.raises(ValueError, match="does not serve"):
        grid_view(inputs, "deepseek-v3.2", "H200", "c2c-gh200", 32768)
    assert widget_links("GB200") == ["c2c-gh200", "c2c-gb300"]


def test_the_widget_redraws_what_the_view_gives(inputs):  # noqa: F811
    tables = {(m, t): FakeTable(m) for m in ("deepseek-v3.2", "deepseek-v4-flash") for t in (1, 2, 4)}
    w = grid_widget(inputs, tables, ["deepseek-v3.2", "deepseek-v4-flash"], ["H200", "GB200"],
                    [32768, 131072, 1048576], context_len=32768)
    c = w.controls
    assert c["link"].value == "pcie5-flashtrans" and c["ratio"].value == "best"

    def same():
        _, s = grid_view(inputs, c["model"].value, c["gpu"].value, c["link"].value, c["context_len"].value,
                         c["mtp"].value, c["ratio"].value, tables=tables)
        assert w.summary_label.value == summary_text(s)

    same()
    c["gpu"].value = "GB200"                              # the link follows: the GPU's reference link
    assert c["link"].value == "c2c-gb300" and [v for _, v in c["link"].options] == ["c2c-gh200", "c2c-gb300"]
    same()
    c["model"].value = "deepseek-v4-flash"                # the contexts follow: V4 reaches 1M
    assert 1048576 in [v for _, v in c["context_len"].options]
    c["context_len"].value = 1048576
    c["mtp"].value = 4
    c["ratio"].value = 0.2
    same()
    c["model"].value = "deepseek-v3.2"                    # 1M is beyond V3.2: the widget moves to its longest
    assert c["context_len"].value == 131072
    same()
