"""Fuzz tests (hypothesis) of ess.monitor and ess.metrics: one field of a monitor row, or one argument of a public
call, gets a meaningless value (fuzz_helpers.BAD); the call returns a valid result or raises a TypeError/ValueError
naming the field or argument (never another exception), a refused row leaves the series as it was, and what the
series derives from finite rows stays in range (hit rate in [0, 1], link utilisation >= 0, no NaN).

Cases per test: monitor rows 300, StepSeries 150, the metrics records and link model 300, the timer and decode log
150 (about 900 calls, a few seconds)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ess.metrics import (DecodeMetricsLog, DecodeStepMetrics, LinkModel, MetricsLog, OpTimer, StepMetrics, StepRow,
                         link_model)
from ess.monitor import ROW_FIELDS, StepSeries, check_row
from fuzz_helpers import BAD, finite, mutate, outcome

# a NumPy RuntimeWarning (an invalid cast, a NaN from finite numbers) is a failure here
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")
FAST = dict(deadline=None)
GOOD_ROW = dict(step=3, step_s=0.02, stall_s=0.001, link_busy_s=0.005, bytes_h2d=1312, bytes_d2h=656, hits=(3, 1),
                misses=(1, 3))


def series_state(s):
    return [tuple(r.__dict__.items()) for r in s.rows], s.n_layers


@settings(max_examples=300, **FAST)
@given(field=st.sampled_from(ROW_FIELDS), data=st.data(), layer_value=st.booleans())
def test_a_row_with_a_meaningless_field_is_refused_by_name(field, data, layer_value):
    value = data.draw(BAD, label=field)
    if field in ("hits", "misses") and layer_value:             # a sequence with one bad count, or of the wrong length
        value = data.draw(st.sampled_from([(1, value), [value, 2], (1, 2, 3), ()]), label=f"{field} as a sequence")
    row = StepRow(**{**GOOD_ROW, field: value})
    s = StepSeries(total_steps=10, n_layers=2)
    s.add(StepRow(**{**GOOD_ROW, "step": 1}))
    before = series_state(s)
    ok, out = outcome(lambda: s.add(row), field, "layers" if field in ("hits", "misses") else field)
    if not ok:
        assert series_state(s) == before
    t = s.totals()
    assert 0 <= t["hit_rate"] <= 1 and t["link_utilisation"] >= 0 and finite(t)
    assert finite(s.frame()) and s.misses_by_layer().shape == (2, len(s))


SERIES = {
    "__init__": (lambda s, a: StepSeries(a["total_steps"], a["n_layers"]), {"total_steps": 5, "n_layers": 2}),
    "follow": (lambda s, a: list(s.follow(a["rows"])), {"rows": [StepRow(**{**GOOD_ROW, "step": 9})]}),
    "check_row": (lambda s, a: check_row(a["row"], a["n_layers"]), {"row": StepRow(**GOOD_ROW), "n_layers": 2}),
}


@settings(max_examples=150, **FAST)
@given(method=st.sampled_from(sorted(SERIES)), data=st.data())
def test_step_series_calls_refuse_meaningless_arguments(method, data):
    s = StepSeries()
    call, good = SERIES[method]
    name, args = mutate(data, good)
    names = {"rows": ("rows", "metrics row"), "row": ("metrics row",), "n_layers": ("n_layers", "layers")}
    ok, out = outcome(lambda: call(s, args), *names.get(name, (name,)))
    if ok and method != "__init__":
        assert finite(s.totals()) and 0 <= s.totals()["hit_rate"] <= 1


METRICS = {
    "StepMetrics": (lambda a: StepMetrics(**a), dict(kind="step", request_id="r", layer=2, step=1, hits=3, misses=1,
                                                     bytes_h2d=656, bytes_d2h=0)),
    "MetricsLog.add": (lambda a: MetricsLog().add(a["record"]),
                       {"record": StepMetrics("append", 0, -1, 1, 0, 0, 0, 4)}),
    "MetricsLog.to_frame": (lambda a: LOG.to_frame(a["start"]), {"start": 1}),
    "MetricsLog.link_utilisation": (lambda a: LOG.link_utilisation(a["link"], a["step_time_s"]),
                                    {"link": LinkModel("x", 10.0), "step_time_s": 1e-3}),
    "LinkModel": (lambda a: LinkModel(a["name"], a["bandwidth_GB_per_s"], a["source"]),
                  {"name": "x", "bandwidth_GB_per_s": 37.0, "source": "here"}),
    "transfer_s": (lambda a: LinkModel("x", 37.0).transfer_s(a["n_bytes"]), {"n_bytes": 1e6}),
    "utilisation": (lambda a: LinkModel("x", 37.0).utilisation(a["n_bytes"], a["interval_s"]),
                    {"n_bytes": 1e6, "interval_s": 1e-3}),
    "link_model": (lambda a: link_model(a["link"]), {"link": "pcie5_x16"}),
}
LOG = MetricsLog()
for _r in (StepMetrics("step", "r", 0, 1, 3, 1, 656, 0), StepMetrics("step", "r", 1, 1, 2, 2, 1312, 0),
           StepMetrics("append", "r", -1, 1, 0, 0, 0, 328)):
    LOG.add(_r)


@settings(max_examples=300, **FAST)
@given(what=st.sampled_from(sorted(METRICS)), data=st.data())
def test_metrics_records_and_link_model_refuse_meaningless_arguments(what, data):
    call, good = METRICS[what]
    name, args = mutate(data, good)
    ok, out = outcome(lambda: call(args), name, "LinkModel." + name)
    if not ok:
        assert len(LOG) == 3
    elif what in ("transfer_s", "utilisation"):
        assert finite(out) and out >= 0
    elif what == "MetricsLog.link_utilisation":
        assert finite(out) and (out[["h2d_utilisation", "d2h_utilisation"]] >= 0).all().all()


TIMER = {
    "OpTimer": (lambda a: OpTimer(a["enabled"], a["clock"]), {"enabled": True, "clock": lambda: 1.0}),
    "span": (lambda a: _span(a["op"], a["layer"]), {"op": "plan", "layer": 3}),
    "add": (lambda a: OpTimer().add(a["op"], a["layer"], a["start_s"], a["end_s"]),
            {"op": "wait", "layer": 0, "start_s": 1.0, "end_s": 2.5}),
    "DecodeMetricsLog.add": (lambda a: DecodeMetricsLog().add(a["record"]),
                             {"record": DecodeStepMetrics(**GOOD_ROW, schedule="da")}),
    "DecodeMetricsLog.subscribe": (lambda a: DecodeMetricsLog().subscribe(a["callback"]), {"callback": print}),
}


def _span(op, layer):
    t = OpTimer()
    with t.span(op, layer):
        pass
    return t.records


@settings(max_examples=150, **FAST)
@given(what=st.sampled_from(sorted(TIMER)), data=st.data())
def test_timer_and_decode_log_refuse_meaningless_arguments(what, data):
    call, good = TIMER[what]
    name, args = mutate(data, good)
    outcome(lambda: call(args), name)


def test_a_row_of_floats_for_counts_is_refused_not_truncated():
    """The fuzz contract by hand: 1.7 hits was silently 1, "12" as hits was two layers (1, 2), -0.5 B was 0."""
    s = StepSeries()
    for field, value in (("hits", (1.7, 2)), ("hits", "12"), ("bytes_h2d", -0.5), ("step", 2.5)):
        ok, exc = outcome(lambda: s.add(StepRow(**{**GOOD_ROW, field: value})), field)
        assert not ok and isinstance(exc, TypeError), (field, value)
    assert len(s) == 0
    np.testing.assert_array_equal(StepSeries().misses_by_layer(), np.zeros((0, 0)))
