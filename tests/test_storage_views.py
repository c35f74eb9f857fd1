"""Tier placement, the storage figures and the budget widget."""
import numpy as np
import pytest

from ess.layout import padded_tokens, request_cache
from ess.memory import largest_batch
from ess.metrics import LinkModel, MetricsLog, StepMetrics, link_model
from ess.specs import model_spec
from ess.memory import tier_placement
from ess.viz.storage import fig_layer_misses, fig_policy_misses, fig_step_traffic, fig_tier_bytes
from ess.widgets.storage import storage_budget_view, storage_budget_widget

DS = model_spec("deepseek-v3.2-exp")


@pytest.mark.parametrize("ratio", [0.2, 0.1, 1.0])
def test_tier_placement_agrees_with_memory_model(ratio):
    df = tier_placement(32768, ratio)
    a = df.attrs
    lim = largest_batch(32768, ratio)
    assert a["batch"] == lim.batch
    rc = request_cache(DS, 32768, ratio)
    gpu = df[df.tier == "GPU"].set_index("part").bytes
    assert gpu["indexer cache"] == lim.batch * rc.indexer_bytes
    if ratio < 1:
        assert a["capacity"] == int(ratio * padded_tokens(DS, 32768))
        # the slot-based pool is the memory model's ratio share, less at most one slot per request and layer
        assert 0 <= lim.batch * rc.latent_gpu_bytes - gpu["latent pool"] <= lim.batch * DS.n_layers * 656
        assert df[(df.tier == "host") & (df.part == "latent cache (all)")].bytes.item() == lim.batch * rc.latent_bytes
    else:
        assert gpu["latent cache (all)"] == lim.batch * rc.latent_bytes
        assert df[(df.tier == "host") & (df.part == "latent cache (all)")].bytes.item() == 0
    assert (df.bytes >= 0).all()


def test_tier_placement_errors():
    with pytest.raises(ValueError, match="fewer than the 2048 entries"):
        tier_placement(32768, 0.05)
    with pytest.raises(ValueError, match="batch must be"):
        tier_placement(32768, 0.2, batch=-1)
    df = tier_placement(32768, 0.2, batch=3, n_spilled=2)
    assert df.attrs["batch"] == 3
    assert df[df.tier == "disk"].bytes.item() == 2 * request_cache(DS, 32768).latent_bytes


def test_metrics_and_links():
    log = MetricsLog()
    log.add(StepMetrics("step", 0, 1, 1, 3, 2, 2 * 656, 0))
    log.add(StepMetrics("step", 0, 2, 1, 1, 4, 4 * 656, 0))
    log.add(StepMetrics("append", 0, -1, 1, 0, 0, 0, 656 * 2))
    ps = log.per_step()
    assert ps.misses.tolist() == [6] and ps.bytes_d2h.tolist() == [1312]
    assert log.totals()["step"]["bytes_h2d"] == 6 * 656
    ft = link_model("flashtrans_h2d")
    assert ft.bandwidth_GB_per_s == 37.0 and ft.transfer_s(37e9) == pytest.approx(1.0)
    assert LinkModel("x", 10.0).utilisation(5e9, 1.0) == pytest.approx(0.5)
    u = log.link_utilisation(LinkModel("x", 1e-6), 1e-3)          # 1,000 B/s for 1 ms: 1 B/step, share = bytes
    assert u.h2d_utilisation.tolist() == pytest.approx([6 * 656 / 1.0]) and u.d2h_utilisation.tolist() == [1312.0]
    with pytest.raises(ValueError, match="link must be one of"):
        link_model("nvlink")
    with pytest.raises(ValueError, match="bandwidth_GB_per_s must be > 0"):
        LinkModel("x", 0.0)


def test_figures_and_widget():
    import pandas as pd
    fig = fig_tier_bytes(tier_placement(32768, 0.2))
    assert len(fig.data) == 8 and "batch" in fig.layout.title.text
    ps = pd.DataFrame({"step": [1, 2], "hits": [0, 5], "misses": [9, 4], "bytes_h2d": [9 * 656, 4 * 656],
                       "bytes_d2h": [656, 656]})
    assert len(fig_step_traffic({"a": ps, "b": ps}, entry_bytes=656, k=9).data) == 2
    by_layer = pd.DataFrame({"run": ["a", "a"], "layer": [0, 3], "overlap": [0.0, 0.9], "misses": [9.0, 1.0]})
    assert list(fig_layer_misses(by_layer).data[0].y) == [9.0, 1.0]
    assert len(fig_policy_misses(pd.DataFrame({"policy": ["lru"], "misses": [3]})).data) == 1
    fig, s = storage_budget_view("H200", 32768, 0.2)
    assert s["feasible"] and s["batch"] == largest_batch(32768, 0.2).batch
    fig, s = storage_budget_view("H200", 32768, 0.05)
    assert not s["feasible"] and "fewer than" in s["reason"]
    w = storage_budget_widget()
    before = w.summary_label.value
    w.controls["ratio"].value = 0.1
    assert w.summary_label.value != before and "batch" in w.summary_label.value


def test_figures_and_widget_refuse_what_they_cannot_draw():
    import pandas as pd
    ps = pd.DataFrame({"step": [1], "misses": [3], "bytes_h2d": [3 * 656]})
    for call, err, match in [
        (lambda: fig_tier_bytes([1, 2]), TypeError, "df must be a pandas DataFrame, got list"),
        (lambda: fig_tier_bytes(pd.DataFrame({"tier": ["GPU"], "bytes": [1]})), ValueError,
         r"lacks the columns \['part'\]"),
        (lambda: fig_step_traffic(ps, entry_bytes=656, k=9), TypeError, "runs must be a dict"),
        (lambda: fig_step_traffic({"a": ps.drop(columns="step")}, entry_bytes=656, k=9), ValueError,
         r"runs\['a'\] lacks"),
        (lambda: fig_step_traffic({"a": ps}, entry_bytes=0, k=9), ValueError, "entry_bytes must be a positive integer"),
        (lambda: fig_layer_misses(pd.DataFrame({"run": ["a"]})), ValueError, "lacks the columns"),
        (lambda: fig_policy_misses(None), TypeError, "df must be a pandas DataFrame"),
        (lambda: storage_budget_widget("Z100"), ValueError, "gpu must be one of"),
        (lambda: storage_budget_widget(context_len=1000), ValueError, "context_len must be one of"),
        (lambda: storage_budget_widget(ratio="0.2"), TypeError, "ratio must be a number"),
    ]:
        with pytest.raises(err, match=match):
            call()
