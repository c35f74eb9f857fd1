"""ess.monitor (the per-step row protocol, StepSeries), the trace replay as a source of rows (ess.replay), the
monitor figure and the live widget."""
import numpy as np
import pytest

from ess.layout import latent_entry_bytes
from ess.metrics import DecodeStepMetrics, LinkModel
from ess.metrics import StepRow
from ess.monitor import ROW_FIELDS, StepSeries, check_row
from ess.replay import replay_steps, replay_trace, run_trace
from ess.specs import model_spec
from ess.storage import TieredCache
from ess.tracegen import Workload, synthetic_trace

TINY = model_spec("tiny")
E = latent_entry_bytes(TINY)


def _replay_setup(steps=5, seed=0):
    trace = synthetic_trace(Workload(300, n_layers=TINY.n_layers, k=TINY.index_topk, mtp=1, steps=steps, batch=1,
                                     warmup_windows=3, profile=[0.0, 0.9, 0.5, 0.7], seed=seed))
    rng = np.random.default_rng(seed)
    prefill = rng.integers(0, 256, (TINY.n_layers, 300, E), dtype=np.uint8)
    new = rng.integers(0, 256, (steps, TINY.n_layers, E), dtype=np.uint8)
    cache = TieredCache(TINY, capacity=2 * TINY.index_topk, backend="numba")
    cache.add_request("q", prefill)
    return trace, cache, new


def test_a_row_is_any_object_with_the_fields_and_is_checked():
    r = check_row(DecodeStepMetrics(0, 0.02, 0.001, 0.005, 1312, 656, (3, 1), (1, 3), schedule="da", batch=2,
                                    context_len=100))
    assert r == StepRow(0, 0.02, 0.001, 0.005, 1312, 656, (3, 1), (1, 3))
    assert r.link_utilisation == pytest.approx(0.25) and r.hit_rate == 0.5           # 0.005 / 0.02, 4 of 8
    with pytest.raises(TypeError, match=r"lacks \['stall_s', 'link_busy_s'\]"):
        check_row(type("Partial", (), {f: 0 for f in ROW_FIELDS if f not in ("stall_s", "link_busy_s")})())
    good = dict(step=1, step_s=0.01, stall_s=0.0, link_busy_s=0.0, bytes_h2d=0, bytes_d2h=0, hits=(1,), misses=(0,))
    for bad, err in (({"step_s": 0.0}, ValueError), ({"stall_s": -1e-3}, ValueError), ({"bytes_h2d": -1}, ValueError),
                     ({"hits": (1, 2)}, ValueError), ({"misses": 3}, TypeError), ({"misses": (-1,)}, ValueError)):
        with pytest.raises(err):
            check_row(StepRow(**{**good, **bad}))
    with pytest.raises(ValueError, match="each of the 2 layers"):
        check_row(StepRow(**good), n_layers=2)


def test_step_series_worked_example():
    s = StepSeries(total_steps=3)
    # step 1: 6 hits, 2 misses in 10 ms, link busy 2 ms; step 2: 8 hits, 0 misses in 10 ms, idle link
    s.add(StepRow(1, 0.010, 0.002, 0.002, 2 * 656, 656, (4, 2), (0, 2)))
    s.add(StepRow(2, 0.010, 0.0, 0.0, 0, 656, (4, 4), (0, 0)))
    with pytest.raises(ValueError, match="does not follow"):
        s.add(StepRow(2, 0.010, 0.0, 0.0, 0, 656, (4, 4), (0, 0)))
    t = s.totals()
    assert t["hit_rate"] == pytest.approx(14 / 16) and t["link_utilisation"] == pytest.approx(0.002 / 0.020)
    assert (t["bytes_h2d"], t["bytes_d2h"], t["steps"]) == (1312, 1312, 2)
    df = s.frame()
    assert df.hit_rate.tolist() == [0.75, 1.0] and df.misses.tolist() == [2, 0]
    np.testing.assert_array_equal(s.misses_by_layer(), [[0, 0], [2, 0]])             # (layers, steps)
    rows = [StepRow(3, 0.01, 0.0, 0.0, 0, 0, (1, 1), (0, 0))]
    assert [r.step for r in s.follow(iter(rows))] == [3] and len(s) == 3


def test_replay_trace_yields_each_step_as_it_happens():
    trace, cache, new = _replay_setup()
    _, ref, _ = _replay_setup()
    whole = run_trace(ref, trace, "q", new_tokens=new)
    it = replay_trace(cache, trace, "q", new_tokens=new)
    assert len(cache.metrics) == 0                              # nothing runs before the first step is asked for
    seen = []
    for records in it:
        assert [r.kind for r in records] == ["step"] * TINY.n_layers + ["append"]
        assert len({r.step for r in records if r.kind == "step"}) == 1
        seen += records
    assert cache.metrics.to_frame().equals(whole)
    assert len(seen) == trace.steps * (TINY.n_layers + 1)       # every record but the warmup's
    with pytest.raises(TypeError, match="Trace"):               # checked at the call, before any step
        replay_trace(cache, "not a trace", "q")


def test_replay_steps_rows_are_the_caches_counts_timed_by_the_link():
    trace, cache, new = _replay_setup()
    h2d, d2h = LinkModel("h2d", 10.0), LinkModel("d2h", 20.0)
    rows = list(replay_steps(cache, trace, "q", h2d=h2d, d2h=d2h, compute_s_per_layer=1e-5, new_tokens=new))
    st = cache.metrics.to_frame().query("kind == 'step'")
    assert [r.step for r in rows] == list(range(1, trace.steps + 1))
    np.testing.assert_array_equal([r.misses for r in rows],
                                  st.pivot(index="step", columns="layer", values="misses").to_numpy())
    r = rows[0]
    # worked example: misses x 656 B over 10 GB/s stall the step; 4 layers x 10 us compute; one token's 4 x 656 B
    # written back over 20 GB/s
    assert r.bytes_h2d == sum(r.misses) * E and r.bytes_d2h == TINY.n_layers * E
    assert r.stall_s == pytest.approx(sum(r.misses) * E / 10e9) == r.link_busy_s
    assert r.step_s == pytest.approx(4 * 1e-5 + r.stall_s + 4 * E / 20e9)
    with pytest.raises(TypeError, match="h2d"):
        replay_steps(cache, trace, "q", h2d=37.0)
    with pytest.raises(ValueError, match="compute_s_per_layer"):
        replay_steps(cache, trace, "q", compute_s_per_layer=0)


def test_monitor_figure_and_live_widget():
    from ess.viz import fig_monitor
    from ess.widgets.monitor import LiveMonitor
    trace, cache, new = _replay_setup(steps=6)
    mon = LiveMonitor(6, layer_labels=["a", "b", "c", "d"])
    totals = mon.follow(replay_steps(cache, trace, "q", new_tokens=new))
    assert mon.progress.value == mon.progress.max == 6 and mon.redraws == 6 and "step 6 of 6" in mon.label.value
    assert totals == mon.series.totals() and totals["steps"] == 6
    with pytest.raises(ValueError, match="has them all"):
        mon.update(StepRow(7, 0.01, 0.0, 0.0, 0, 0, (1,) * 4, (0,) * 4))
    fig = mon.figure()
    assert [len(t.x) for t in fig.data] == [6, 6, 6, 6] and list(fig.data[3].y) == ["a", "b", "c", "d"]
    np.testing.assert_array_equal(np.asarray(fig.data[3].z), mon.series.misses_by_layer())
    half = fig_monitor(mon.series.frame().head(3), mon.series.misses_by_layer()[:, :3], total_steps=6)
    assert list(half.layout.xaxis.range) == [0.5, 6.5]            # a live view fills the axis from the left
    # a slow redraw budget: the figure is drawn for the first and the last step only; the progress every step
    _, cache2, _ = _replay_setup(steps=6)
    slow = LiveMonitor(6, min_redraw_s=3600)
    slow.follow(replay_steps(cache2, trace, "q", new_tokens=new))
    assert slow.redraws == 2 and slow.progress.value == 6
    with pytest.raises(ValueError, match="total_steps"):
        LiveMonitor(0)


def test_live_monitor_follows_the_engine_while_it_decodes():
    """The decode engine's per-step records (ess.metrics.DecodeStepMetrics) are rows of the protocol: the monitor
    subscribes with ``on_step`` and sees each step as it is decoded, the same counts the run logs."""
    from engine_helpers import prompts, small_engine
    from ess.widgets.monitor import LiveMonitor
    eng = small_engine()
    pre = eng.prefill(prompts([80, 60], 2), max_new_tokens=5)
    mon = LiveMonitor(4)
    progress = []
    run = eng.decode(pre, 4, ratio=0.25, schedule="da", link_GB_per_s=0.01, topk=8,
                     on_step=lambda row: (mon.update(row), progress.append(mon.progress.value)))
    assert progress == [1, 2, 3, 4]                              # one row per step, while the run went on
    df = run.metrics.to_frame()
    np.testing.assert_array_equal(mon.series.misses_by_layer(), np.array([r.misses for r in run.metrics.records]).T)
    t = mon.series.totals()
    assert t["bytes_h2d"] == df.bytes_h2d.sum() > 0 and t["stall_s"] == pytest.approx(df.stall_s.sum())
    assert t["link_utilisation"] == pytest.approx(df.link_busy_s.sum() / df.step_s.sum())
    fig = mon.figure()
    assert list(fig.data[0].x) == [0, 1, 2, 3] and list(fig.layout.xaxis.range) == [-0.5, 3.5]   # the engine counts from 0
    assert fig.data[3].z.shape == (eng.config.n_layers, 4)
