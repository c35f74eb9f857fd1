"""What the engine shows: per-step metrics to subscribers while it decodes (the monitoring hook), the figures of
notebook 09, the widget's pure view and its controls, the sparse-vs-dense report, and DeepSeek's wiring under the
overlapping schedules."""
import numpy as np
import pandas as pd
import pytest

from engine_helpers import prompts, small_engine
from ess.studies.real_model import quality
from ess.metrics import DecodeMetricsLog
from ess.viz import engine as V
from ess.widgets.engine import engine_view, engine_widget

ENGINE = small_engine()


@pytest.fixture(scope="module")
def pre():
    return ENGINE.prefill(prompts([80, 60], 2), max_new_tokens=6, keep_dense=True)


def test_every_step_reaches_the_subscribers_as_it_is_decoded(pre):
    seen = []
    run = ENGINE.decode(pre, 4, ratio=0.25, schedule="da", link_GB_per_s=0.01, topk=8,
                        on_step=lambda m: seen.append(m.step))
    assert seen == [0, 1, 2, 3]
    df = run.metrics.to_frame()
    assert df.step.tolist() == [0, 1, 2, 3] and (df.schedule == "da").all()
    # the bytes are the misses' and the new tokens' entries, every layer
    E, nl = ENGINE.format.entry_bytes, ENGINE.config.n_layers
    assert (df.bytes_h2d == run.misses.sum(axis=(1, 2)) * E).all()
    assert (df.bytes_d2h == 2 * nl * E).all()
    assert (df.link_busy_s > 0).all() and ((df.link_utilisation > 0) & (df.link_utilisation < 1)).all()
    per_layer = run.metrics.per_layer()
    assert len(per_layer) == 4 * nl and per_layer.hits.sum() + per_layer.misses.sum() == 4 * nl * 2 * 8


def test_the_log_calls_subscribers_and_refuses_non_callables():
    log = DecodeMetricsLog()
    with pytest.raises(TypeError, match="callable"):
        log.subscribe("print")


def test_figures_draw_from_a_run(pre):
    run = ENGINE.decode(pre, 3, ratio=0.25, schedule="dba", link_GB_per_s=0.01, topk=8)
    assert len(V.fig_engine_steps(run.metrics.to_frame()).data) == 4
    layers = pd.DataFrame({"layer": range(3), "misses": run.misses.sum(axis=(0, 2))})
    assert len(V.fig_engine_layers(layers).data) == 1
    ops = run.timer.to_frame()
    link = pd.DataFrame(run.link_records)
    fig = V.fig_engine_timeline(ops[ops.step == 1], link)
    names = {t.name for t in fig.data}
    assert {"indexer_b0", "attn_b1", "finish", "h2d", "d2h"} <= names
    check = pd.DataFrame({"role": ["calibration", "held out"], "schedule": ["none", "da"], "batch": [1, 2],
                          "context_len": [64, 96], "ratio": [0.25, 0.5], "link_GB_per_s": [0.01, 0.02],
                          "predicted_ms": [10.0, 12.0], "measured_ms": [11.0, 12.5]})
    assert len(V.fig_engine_validation(check).data) == 3
    parts = pd.DataFrame({"config": ["a", "a", "b"], "part": ["x", "y", "x"], "ms": [1.0, 2.0, 3.0]})
    assert len(V.fig_engine_breakdown(parts).data) == 2


def test_the_view_decodes_and_says_whether_the_output_is_unchanged(pre):
    fig, s = engine_view(ENGINE, pre, 0.3, "fifo", "none", 0.05, steps=3)
    assert s["lossless"] is True and s["step_ms"] > 0 and s["misses_per_step"] >= 0
    _, bad = engine_view(ENGINE, pre, 0.01, "lru", "da", 0.05, steps=3)
    assert bad["step_ms"] is None and "fewer than" in bad["reason"]


def test_the_widget_redraws_on_every_control():
    pre = ENGINE.prefill(prompts([256, 200], 4), max_new_tokens=2)   # K = 256 / 16 = 16
    box = engine_widget(ENGINE, pre, steps=2)
    before = box.summary_label.value
    assert "identical to" in before
    assert box.controls["link_GB_per_s"].value == 0.02          # shown exactly, not snapped to a log step
    assert box.controls["link_GB_per_s"].label == "0.02"
    box.controls["schedule"].value = "dba"
    box.controls["ratio"].value = 0.05                    # 0.05 x 256 = 12 slots < K = 16: said so
    assert "not possible" in box.summary_label.value
    box.controls["ratio"].value = 0.5
    assert "identical to" in box.summary_label.value


def test_the_widget_says_why_dba_is_missing_for_one_request():
    one = ENGINE.prefill(prompts([256], 4), max_new_tokens=2)
    box = engine_widget(ENGINE, one, steps=2)
    assert "dba" not in box.controls["schedule"].options
    assert "needs a batch of 2 or more" in box.children[3].value


def test_sparse_against_dense_report(pre):
    held = np.array(prompts([5, 5], 9))
    full = quality.compare_teacher_forced(ENGINE, pre, held, topk=200)   # K covers the context: dense
    assert full["agreement"] == 1.0
    assert full["perplexity_sparse"] == pytest.approx(full["perplexity_dense"], rel=1e-4)
    sparse = quality.compare_teacher_forced(ENGINE, pre, held, topk=4)
    assert 0 <= sparse["agreement"] <= 1 and sparse["steps"] == 4 and sparse["topk"] == 4
    g = quality.compare_greedy(ENGINE, pre, 4, topk=200)
    assert g["common_prefix"] == [5, 5] and g["agreement"] == 1.0


def test_deepseek_wiring_under_overlapping_schedules_matches_the_serial_step():
    """DeepSeek's wiring splits attention into hits and misses under DA and merges them by log-sum-exp: the same
    result to float32 rounding (not bit for bit: the real model's wiring is the bitwise one)."""
    from ess import decode as D
    from ess.specs import model_spec
    from ess.storage import TieredCache
    from test_decode import _decode_inputs
    tiny = model_spec("tiny")
    rng = np.random.default_rng(3)
    lens = [150, 120, 90]
    lat, keys, qi, w, q = _decode_inputs(rng, tiny, 3, lens)
    outs = {}
    for schedule in ("none", "da", "dba"):
        cache = TieredCache(tiny, capacity=tiny.index_topk + 10, backend="numba")
        for b, e in enumerate(lat):
            cache.add_request(b, e)
        steps = [D.decode_layer(cache, 1, [0, 1, 2], qi + 0.3 * t, w, keys, q, tiny, schedule=schedule)
                 for t in range(3)]
        assert sum(s.n_misses for s in steps[-1].steps) > 0
        outs[schedule] = steps[-1]
    for schedule in ("da", "dba"):
        np.testing.assert_array_equal(outs[schedule].indices, outs["none"].indices)
        np.testing.assert_allclose(outs[schedule].out, outs["none"].out, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(outs[schedule].lse, outs["none"].lse, rtol=1e-5, atol=1e-6)
