import numpy as np
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
    assert set(df.gpu) == {"H800", "H100", "H200", "H20", "A100-80G", "B200", "B300", "GH200", "GB200"}
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


# -- shared pieces -----------------------------------------------------------------------------------------------

def test_numbers_never_show_a_signed_zero():
    from ess.widgets._controls import num
    assert num(-0.001) == "0.00" and num(-0.0) == "0.00" and num(0.004) == "0.00"
    assert num(-0.006) == "-0.01" and num(2.345, 1) == "2.3" and num(-0.0004, 3) == "0.000"


def test_message_figure_wraps_its_text_and_draws_no_axes():
    text = "infeasible: " + "a long reason that goes on " * 8
    fig = viz.fig_message(text)
    lines = fig.layout.title.text.split("<br>")
    assert len(lines) >= 3 and max(len(l) for l in lines) <= 90
    assert " ".join(lines) == text.strip()                    # nothing dropped
    assert fig.layout.xaxis.visible is False and fig.layout.yaxis.visible is False
    assert fig.layout.margin.t >= 24 * len(lines) and fig.layout.height < 200   # room for the lines, no empty plot


def test_memory_wall_figure_draws_no_zero_batch_on_its_log_axis():
    df = tables.batch_limits_by_gpu([4096, 32768, 131072], [1.0, 0.1])
    assert (df[(df.gpu == "H200") & (df.ratio == 0.1)].batch == 0).any()       # 4K at ratio 0.1: no request fits
    fig = viz.fig_batch_vs_context(df, "H200", {"paper limit (32K)": (32768, 52)})
    lines = {t.name: t for t in fig.data}
    low = lines["ratio 0.1 (no request fits at 4K)"]
    assert 0 not in list(low.y) and list(low.x) == [32768, 131072]
    assert list(lines["no offload"].x) == [4096, 32768, 131072]
    assert list(fig.layout.xaxis.ticktext) == ["4K", "32K", "128K"]
    ticks = list(fig.layout.yaxis.tickvals)                    # 1-2-5 steps spanning the batches, nothing between
    assert all(str(t)[0] in "125" and set(str(t)[1:]) <= {"0"} for t in ticks)
    assert min(ticks) <= df[df.gpu == "H200"].query("batch > 0").batch.min() and max(ticks) >= 420


def test_memory_widget_says_when_no_request_fits():
    w = memory_budget_widget("H200", 4096, 0.1)
    assert "batch 0</b>" in w.summary_label.value and "no request fits" in w.summary_label.value
    w.controls["ratio"].value = 0.5
    assert "no request fits" not in w.summary_label.value


# -- prefetch ----------------------------------------------------------------------------------------------------

SMALL = {"n_layers": 2, "steps": 6}


def test_prefetch_view_each_setting_does_what_it_says():
    from ess.widgets.prefetch import prefetch_view
    _, off = prefetch_view("off", "before", 0.2, **SMALL)
    _, heat = prefetch_view("heat", "before", 0.2, **SMALL)
    assert off["bytes_speculative"] == 0 < heat["bytes_speculative"]
    _, before = prefetch_view("off", "before", 0.2, **SMALL)
    _, delayed = prefetch_view("off", "delayed", 0.2, **SMALL)
    _, none = prefetch_view("off", "none", 0.2, **SMALL)
    assert before["bytes_delayed"] == none["bytes_delayed"] == 0 < delayed["bytes_delayed"]
    # why the delayed class lowers the hit rate: its pool starts empty, so step 0 misses everything it selects;
    # warmed up before decoding (free, in prefill) it does not
    assert delayed["first_step_misses"] == none["first_step_misses"] == delayed["first_step_entries"]
    assert before["first_step_misses"] < before["first_step_entries"]
    assert before["hit_rate"] > delayed["hit_rate"] >= none["hit_rate"]
    assert f"step 0 misses {delayed['first_step_misses']:,} of the {delayed['first_step_entries']:,}" in \
        delayed["explain"] and "pool starts empty" in delayed["explain"]
    _, slow = prefetch_view("off", "before", 0.2, 10.0, **SMALL)
    assert slow["stall_s"] == pytest.approx(before["stall_s"] * 37.0 / 10.0)     # same misses, a 3.7x slower link
    for bad in ({"speculative": "oracle"}, {"warmup": "later"}):
        with pytest.raises(ValueError, match=list(bad)[0]):
            prefetch_view(**bad)


def test_prefetch_view_keeps_each_simulation():
    from ess.widgets import prefetch as P
    P._simulate.cache_clear()
    a = P.prefetch_view("heat", "delayed", 0.3, 20.0, **SMALL)[1]
    b = P.prefetch_view("heat", "delayed", 0.3, 20.0, **SMALL)[1]
    assert a == b and P._simulate.cache_info().hits == 1
    c = P.prefetch_view("heat", "delayed", 0.3, 21.0, **SMALL)[1]        # another link: simulated again
    assert P._simulate.cache_info().misses == 2 and c["link_use"] != a["link_use"]


def test_prefetch_widget_follows_its_controls():
    from ess.widgets.prefetch import prefetch_widget
    box = prefetch_widget(**SMALL)
    c = box.controls
    assert (c["speculative"].value, c["warmup"].value, c["ratio"].value, c["link_GB_per_s"].value) == \
        ("heat", "before", 0.2, 37.0)
    c["speculative"].value = "off"
    low = box.summary
    assert low["bytes_speculative"] == 0 and "warmup windows were loaded before decoding" in box.note.value
    c["ratio"].value = 0.6
    mid = box.summary
    assert mid["hit_rate"] > low["hit_rate"]
    c["link_GB_per_s"].value = 10.0
    assert box.summary["stall_s"] > mid["stall_s"] and box.summary["hit_rate"] == mid["hit_rate"]
    c["warmup"].value = "delayed"
    assert box.summary["bytes_delayed"] > 0 and "pool starts empty" in box.note.value
    c["ratio"].value = 0.2
    c["speculative"].value = "heat"
    assert box.summary["bytes_speculative"] > 0 and "hit rate" in box.summary_label.value
    with pytest.raises(ValueError, match="unknown control"):
        prefetch_widget(bandwidth=3)


# -- the simulator widget ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def quick_misses():
    from ess.sim.misses import MissesTable
    from ess.widgets.sim import RATIOS
    return MissesTable(steps=4, batch=1).with_ratios(RATIOS)


@pytest.fixture(scope="module")
def scenario():
    from ess.sim import Scenario
    from ess.sim.calibrate import calibrated_params
    return Scenario(params=calibrated_params())


def test_simulator_view_takes_the_misses_it_is_told(quick_misses, scenario):
    from ess.widgets.sim import sim_budget_view
    at = lambda link: scenario.replace(gpu="H200", mtp=2, accept_ratio=1.7, h2d_GB_per_s=link)     # noqa: E731
    _, zero = sim_budget_view(at(37.0), 0.25, 32768, misses="zero", table=quick_misses)
    _, sim = sim_budget_view(at(37.0), 0.25, 32768, misses="cachesim", table=quick_misses)
    _, slow = sim_budget_view(at(5.0), 0.25, 32768, misses="cachesim", table=quick_misses)
    _, zero_slow = sim_budget_view(at(5.0), 0.25, 32768, misses="zero", table=quick_misses)
    assert zero["misses_mean"] == 0 and sim["misses_mean"] == pytest.approx(quick_misses(32768, 0.25, 2).mean())
    # the link speed matters exactly when entries miss
    assert slow["throughput"] < sim["throughput"] < zero["throughput"] == zero_slow["throughput"]
    # 2,621 slots hold K but not the union of two top-K sets: the memory rule says so before any simulation
    fig, bad = sim_budget_view(at(37.0), 0.08, 32768, misses="cachesim", table=quick_misses)
    assert bad["batch"] == 0 and "union of 2 top-K sets" in fig.layout.title.text

    class Refusing(type(quick_misses)):
        def __call__(self, context_len, ratio, mtp):
            raise ValueError("the pool is smaller than one step's entries")
    fig, bad = sim_budget_view(at(37.0), 0.25, 32768, misses="cachesim", table=Refusing())
    assert bad["throughput"] is None and fig.layout.title.text.startswith("infeasible: the cache simulation")
    fig, bad = sim_budget_view(at(37.0), 0.05, 32768, misses="cachesim", table=quick_misses)
    assert bad["batch"] == 0 and "infeasible" in fig.layout.title.text and not fig.data
    with pytest.raises(ValueError, match="accept_ratio"):
        sim_budget_view(scenario.replace(mtp=1), 0.25, 32768)      # the deployment's accept ratio 1.7 > MTP 1
    with pytest.raises(TypeError, match="table="):
        sim_budget_view(scenario, 0.25, 32768, misses="cachesim")


def test_simulator_view_sizes_the_batch_for_the_mtp_union(scenario):
    """The batch range is the memory rule at the scenario's MTP: ratio 0.0625 of 32K holds one token's K = 2,048
    entries but not the union of two top-K sets on average over the layers."""
    from ess.widgets.sim import sim_budget_view
    _, one = sim_budget_view(scenario.replace(mtp=1, accept_ratio=1.0), 0.0625, 32768)
    _, two = sim_budget_view(scenario.replace(mtp=2), 0.0625, 32768)
    assert one["batch"] > 0 and two["batch"] == 0 and "union of 2 top-K sets" in two["reason"]


def test_simulator_link_choices_are_the_sourced_speeds():
    from ess.specs import link_figures
    from ess.widgets.sim import link_choices
    figs, choices = link_figures(), link_choices()
    for v in (figs["flashtrans"]["h2d_GB_per_s"], figs["pcie"]["gen4_x16_GB_per_s_per_direction"],
              figs["pcie"]["gen5_x16_GB_per_s_per_direction"], figs["flashtrans"]["memcpy_per_entry_h2d_GB_per_s"]):
        assert "links.yaml" in choices[v]
    assert choices[37.0].startswith("FlashTrans") and list(choices) == sorted(choices)


def test_simulator_widget_controls_are_honest(quick_misses, scenario):
    from ess.widgets.sim import sim_budget_widget
    w = sim_budget_widget(scenario, misses=quick_misses)
    c = w.controls
    assert c["h2d_GB_per_s"].value == 37.0 and c["accept_ratio"].value == 1.7 and c["accept_ratio"].max == 2
    assert c["misses"].value == "cachesim" and w.summary["misses_mean"] > 0
    assert "misses from the cache simulation" in w.note.value and "FlashTrans" in w.note.value
    c["ratio"].value = 0.25
    fast = w.summary["throughput"]
    c["h2d_GB_per_s"].value = 5.0
    assert w.summary["throughput"] < fast                       # the link slider now changes the prediction
    c["misses"].value = "zero"
    assert w.summary["misses_mean"] == 0 and c["h2d_GB_per_s"].disabled and "does not matter" in w.note.value
    c["misses"].value = "cachesim"
    assert not c["h2d_GB_per_s"].disabled
    # MTP below the accept ratio: the slider ends at MTP, the value comes down with it and the summary says so
    c["mtp"].value = 1
    assert c["accept_ratio"].value == 1.0 and c["accept_ratio"].max == 1 and c["accept_ratio"].disabled
    assert "accept ratio lowered from 1.7 to 1" in w.note.value
    c["mtp"].value = 3
    assert c["accept_ratio"].max == 3 and not c["accept_ratio"].disabled and "lowered" not in w.note.value
    c["accept_ratio"].value = 2.5
    assert w.summary["throughput"] is not None                  # accepted as given, never replaced
    c["ratio"].value = 0.05
    assert "<b>infeasible</b>" in w.summary_label.value
    c["ratio"].value = 1.0
    assert c["h2d_GB_per_s"].disabled and "no offload" in w.note.value
    before = w.summary
    c["gpu"].value = "H800"                                    # the same 141 -> 80 GiB step as H100 ...
    c["gpu"].value = "H100"                                    # ... and H100 has H800's 80 GiB: still redrawn
    assert c["hbm_GiB"].value == 80 and w.summary is not before
    assert w.table.has_row(32768, 3) and quick_misses.has_row(32768, 3)     # the notebook's table keeps the row
    with pytest.raises(TypeError, match="MissesTable"):
        sim_budget_widget(scenario, misses=lambda L, r, t: None)
