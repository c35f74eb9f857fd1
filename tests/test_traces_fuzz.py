"""Fuzz tests (hypothesis) of the access traces: ess.traces (the format, its file I/O, the statistics, the recorder)
and ess.tracegen (the synthetic generators, the locality profile and models, the drift calibration). One argument
of one public call at a time gets a meaningless value (fuzz_helpers.BAD, plus numbers too large for any trace); the
call returns a valid result or raises a TypeError/ValueError naming the argument, never another exception (a
NumPy, Numba, JSON or zip error), a refused call leaves a recorder as it was, and a result stays in range (overlaps
and shares in [0, 1], every generated set within its step's context).

Cases per test (times ESS_FUZZ_SCALE): the trace format and statistics 300, file I/O 100, the recorder 300, the
generators 200 (small geometries: K 16, 2 layers), the locality functions 300; about 1,200 calls, ~10 s."""
import math
from itertools import islice

import numpy as np
import pytest
from hypothesis import given, strategies as st

from ess import locality as LM
from ess import tracegen as G
from ess.traces import (Trace, TraceRecorder, adjacent_overlap, check_trace, index_rows, load_trace, return_share,
                        union_share, validate_trace_arrays)
from fuzz_helpers import BAD, call_one, finite, fuzz_settings, outcome, same

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")
HUGE = st.one_of(BAD, st.sampled_from([2 ** 31, 2 ** 40, 10 ** 400, 1e300, math.inf]))


def _trace(steps=10, mtp=1):
    rng = np.random.default_rng(3)
    idx = np.stack([rng.permutation(40)[:8] for _ in range(2 * 3 * steps)]).reshape(2, 3, steps, 8).astype(np.int32)
    win = np.stack([rng.permutation(40)[:8] for _ in range(2 * 3 * 2)]).reshape(2, 3, 2, 8).astype(np.int32)
    return Trace(idx, 40, 8, mtp, 1, win, {"made": "by hand"})


TR = _trace()
FORMAT = {
    "Trace": (lambda **a: Trace(**a), {"indices": TR.indices, "context_len": 40, "k": 8, "mtp": 1, "seed": 0,
                                       "windows": TR.windows, "meta": {}}),
    "validate_trace_arrays": (lambda **a: validate_trace_arrays(**a),
                              {"indices": TR.indices, "windows": TR.windows, "context_len": 40, "k": 8, "mtp": 1}),
    "index_rows": (lambda **a: index_rows(**a), {"name": "rows", "rows": TR.indices[0, 0], "n_positions": 40,
                                                 "shape_doc": "(T, width)"}),
    "check_trace": (lambda **a: check_trace(**a), {"trace": TR, "name": "trace"}),
    "adjacent_overlap": (lambda **a: adjacent_overlap(**a), {"trace": TR}),
    "union_share": (lambda **a: union_share(**a), {"trace": TR, "window": 4}),
    "return_share": (lambda **a: return_share(**a), {"trace": TR, "within": 3}),
}


@fuzz_settings(300)
@given(data=st.data())
def test_trace_format_and_statistics_refuse_meaningless_arguments(data):
    fn, name, args, ok, out = call_one(data, FORMAT, HUGE, {"rows": ("rows",), "shape_doc": ("rows",),
                                                           "name": ("name", "rows")})
    if not ok:
        return
    if fn in ("adjacent_overlap", "union_share"):
        assert out.shape == (TR.n_layers,) and finite(out) and ((out >= 0) & (out <= 1)).all()
    elif fn == "return_share":
        assert ((out >= 0) & (out <= 1) | np.isnan(out)).all()
    elif fn == "Trace":
        assert not out.indices.flags.writeable and out.indices.dtype == np.int32
    elif fn == "index_rows":
        rows, n = out
        assert rows.dtype == np.int32 and (rows < n).all() and (rows >= -1).all()


# a path that is not one (never a random str: it would name a file in the working directory)
BAD_PATHS = st.one_of(st.none(), st.integers(-3, 3), st.floats(allow_nan=True), st.binary(max_size=3),
                      st.lists(st.integers(), max_size=2), st.sampled_from(["", "\x00bad", "x.txt"]))


@fuzz_settings(100)
@given(data=st.data(), meta=st.one_of(st.just({}), st.dictionaries(st.text(max_size=3), BAD, max_size=2)))
def test_trace_files_refuse_meaningless_paths_and_metadata(tmp_path_factory, data, meta):
    folder = tmp_path_factory.mktemp("traces")
    path = data.draw(st.one_of(BAD_PATHS, st.just(folder / "t.npz")), label="path")
    tr = Trace(TR.indices, 40, 8, 1, 1, TR.windows, meta)
    ok, out = outcome(lambda: tr.save(path), "path", "meta")
    if ok:
        back = load_trace(out)
        assert np.array_equal(back.indices, tr.indices) and same(back.meta, json_round_trip(meta))
    else:
        assert not (folder / "t.npz").exists()
    outcome(lambda: load_trace(data.draw(BAD, label="load path")), "path", "trace")


def json_round_trip(meta):
    import json
    return json.loads(json.dumps(meta))


def recorder_state(rec):
    return rec.steps, sorted(rec._pending), sorted(rec._windows), [s.copy() for s in rec._steps]


RECORDER = {
    "observe": (lambda rec, **a: rec.observe(**a), {"layer": 1, "indices": np.array([[0, 5], [7, -1]])}),
    "observe_windows": (lambda rec, **a: rec.observe_windows(**a),
                        {"layer": 0, "indices": np.array([[[0, 1]], [[2, 3]]])}),
    "end_step": (lambda rec, **a: rec.end_step(), {}),
    "to_trace": (lambda rec, **a: rec.to_trace(), {}),
    "__init__": (lambda rec, **a: TraceRecorder(**a), {"context_len": 8, "k": 2, "n_layers": 2, "batch": 2, "mtp": 1,
                                                       "meta": None}),
}


@fuzz_settings(300)
@given(method=st.sampled_from(sorted(RECORDER)), data=st.data())
def test_trace_recorder_refuses_meaningless_arguments_and_records_nothing_half(method, data):
    rec = TraceRecorder(context_len=8, k=2, n_layers=2, batch=2)
    for layer in range(2):
        rec.observe(layer, np.array([[1, 2], [3, 4]]))
    rec.end_step()
    rec.observe(0, np.array([[1, 8], [3, 4]]))                    # step 1 reads position 8 (context 8 + 1)
    call, good = RECORDER[method]
    if good:
        name = data.draw(st.sampled_from(sorted(good)), label="argument")
        args = {**good, name: data.draw(HUGE, label=name)}
    else:
        name, args = "", {}
    before = recorder_state(rec)
    ok, out = outcome(lambda: call(rec, **args), name or "step", "observe", "end_step", "indices", "layer")
    if not ok and method != "end_step":                        # end_step drops an incomplete step, as documented
        assert same(before, recorder_state(rec))
    if method != "__init__" and rec.steps:
        rec._pending.clear()
        ok, tr = outcome(rec.to_trace, "observe_windows")      # what was recorded is a valid trace, or windows
        assert tr.steps == rec.steps if ok else len(rec._windows) == 1       # were observed for one layer of two


# the fields of a Workload (ess.tracegen.Workload): a wrong one is refused when the workload is made
GEN = {"context_len": 256, "n_layers": 2, "k": 16, "mtp": 2, "steps": 4, "batch": 1, "warmup_windows": 2,
       "profile": "paper", "seed": 0, "n_sinks": None, "local_window": 4, "popularity_sigma": None,
       "locality": LM.LocalityModel.of("uniform"), "drift_cutoff_sigmas": None}


def _drift_trace(trace_model, reading, drift_rho, **a):
    """The drift model's parts (LocalityModel.of) fuzzed with the workload's fields."""
    return G.synthetic_trace(G.Workload(locality=LM.LocalityModel.of(trace_model, reading, drift_rho), **a))


GENERATORS = {
    "synthetic_trace (uniform)": (lambda **a: G.synthetic_trace(G.Workload(**a)), GEN),
    "synthetic_trace (drift)": (_drift_trace, {**{k: v for k, v in GEN.items() if k != "locality"},
                                               "trace_model": "drift", "reading": None, "drift_rho": 0.5}),
    # the streams come one at a time (a batch of 2**31 is a valid, endless source): the first three
    "synthetic_streams": (lambda **a: list(islice(G.synthetic_streams(G.Workload(**a)), 3)),
                          {**GEN, "popularity_sigma": 1.5}),
    # anything but a Workload is refused by name
    "synthetic_trace (the workload)": (lambda **a: G.synthetic_trace(**a), {"workload": G.Workload(
        256, n_layers=2, k=16, steps=4, batch=1, warmup_windows=2, local_window=4)}),
}


@fuzz_settings(200)
@given(data=st.data())
def test_generators_refuse_meaningless_arguments_and_stay_in_the_context(data):
    fn, name, args, ok, out = call_one(data, GENERATORS, HUGE, {"drift_rho": ("drift_rho",),
                                                               "drift_cutoff_sigmas": ("drift_cutoff_sigmas",),
                                                               "profile": ("profile",), "k": ("k",)})
    if not ok:
        return
    if fn == "synthetic_streams":
        assert len(out) == min(3, int(args["batch"]) * int(args["n_layers"] or 61))   # a 0-d int8 array is a count
        for _, _, warm, steps in out:
            assert warm.shape[0] == args["warmup_windows"] and steps.shape[0] == args["steps"]
    else:
        steps, mtp = (args["workload"].steps, args["workload"].mtp) if "workload" in args else \
            (args["steps"], args["mtp"])
        assert isinstance(out, Trace) and out.steps == steps and out.mtp == mtp
        assert (out.set_sizes() >= 1).all()


LOCALITY = {
    "locality_profile": (lambda **a: G.locality_profile(**a), {"profile": "paper", "n_layers": 7, "reading": None}),
    "locality_profile (given)": (lambda **a: G.locality_profile(**a), {"profile": [0.2, 0.5], "n_layers": 2,
                                                                       "reading": None}),
    "check_trace_model": (lambda **a: LM.check_trace_model(**a), {"trace_model": "drift"}),
    "check_reading": (lambda **a: LM.check_reading(**a), {"reading": "jaccard"}),
    "geometry": (lambda **a: G.geometry(**a), {"n_layers": 4, "k": None}),
    "fitted_drift_rho": (lambda **a: LM.fitted_drift_rho(**a), {"reading": "fraction", "at": "at_80"}),
    "LocalityModel": (lambda **a: LM.LocalityModel(**a), {"name": "m", "trace_model": "drift", "reading": "fraction",
                                                         "drift_rho": 0.4, "rests_on": ""}),
    "LocalityModel.of": (lambda **a: LM.LocalityModel.of(**a), {"trace_model": "drift", "reading": None,
                                                               "drift_rho": 0.4, "name": None}),
    "locality_named": (lambda **a: LM.locality_named(**a), {"name": "central"}),
    "locality_names": (lambda **a: LM.locality_names(), {}),
    "drift_calibration": (lambda **a: LM.drift_calibration(**a), {"r": 0.6, "context_len": 256, "k": 16, "n_sinks": 1,
                                                                "local_window": 2, "rho": 0.5}),
    "generator_defaults": (lambda **a: G.generator_defaults(), {}),
    "default_locality": (lambda **a: LM.default_locality(), {}),
    "locality_alternatives": (lambda **a: LM.locality_alternatives(), {}),
}
LOCALITY_ALIASES = {"r": ("r (the target overlap)",), "rho": ("drift_rho",),
                    **{f: (f"LocalityModel.{f}",) for f in ("reading", "drift_rho", "rests_on")},
                    "name": ("LocalityModel.name", "locality must be one of")}     # locality_named(name)


@fuzz_settings(300)
@given(data=st.data())
def test_locality_functions_refuse_meaningless_arguments(data):
    fn, name, args, ok, out = call_one(data, LOCALITY, HUGE, LOCALITY_ALIASES)
    if not ok:
        return
    if fn.startswith("locality_profile"):
        assert out.shape == (args["n_layers"] or 61,) and ((out >= 0) & (out <= 1)).all()
    elif fn == "drift_calibration":
        assert 0 <= out["c"] <= 1 and 0 <= out["overlap"] <= 1 and finite(out)
    elif fn == "geometry":
        assert all(type(v) is int and v >= 1 for v in out)


def test_the_meaningless_trace_inputs_found_by_probing_are_refused(tmp_path):
    """Each once gave a raw NumPy/JSON/TypeError traceback, a silent wrap, or a run without end."""
    with pytest.raises(ValueError, match="windows must have shape"):       # min() of an empty array
        Trace(TR.indices, 40, 8, windows=np.zeros((2, 3, 2, 0), np.int32))
    with pytest.raises(ValueError, match="meta must hold JSON data"):      # a raw TypeError from json
        Trace(TR.indices, 40, 8, meta={"x": object()}).save(tmp_path / "t.npz")
    with pytest.raises(ValueError, match="meta must hold JSON data"):      # saved as NaN, which is not JSON
        Trace(TR.indices, 40, 8, meta={"x": float("nan")}).save(tmp_path / "t.npz")
    rec = TraceRecorder(context_len=8, k=2, n_layers=1, batch=1)
    with pytest.raises(ValueError, match=r"observe: indices must be < 8"):
        rec.observe(0, np.array([[2 ** 40, 1]]))                            # wrapped to int32 0
    with pytest.raises(ValueError, match="repeat a position within a window"):
        rec.observe_windows(0, np.array([[[1, 1]]]))                         # to_trace failed ever after
    with pytest.raises(TypeError, match="trace must be an ess.traces.Trace"):
        adjacent_overlap(np.zeros((1, 1, 2, 2)))                             # AttributeError
    with pytest.raises(TypeError, match="profile must be a number"):
        G.locality_profile(["a", "b"], 2)                                    # a raw NumPy ValueError
    with pytest.raises(ValueError, match="at must be one of"):
        LM.fitted_drift_rho("fraction", [])                                   # unhashable: a raw TypeError
    with pytest.raises(TypeError, match="context_len must be an integer"):
        LM.drift_calibration(0.5, [256])                                      # unhashable in the cache
    uniform, drift = LM.LocalityModel.of("uniform"), LM.LocalityModel.of("drift")
    with pytest.raises(TypeError, match="drift_cutoff_sigmas"):
        G.Workload(256, k=16, n_layers=1, steps=2, batch=1, locality=drift, drift_cutoff_sigmas="6")
    with pytest.raises(ValueError, match="exceeds the maximum context of deepseek"):
        G.Workload(200_000, n_layers=1, steps=1, batch=1)                   # DeepSeek's K past its context
    with pytest.raises(ValueError, match="popularity_sigma=10 is too skewed"):   # ran without end
        G.synthetic_trace(G.Workload(4096, n_layers=1, k=256, steps=8, batch=1, locality=uniform,
                                     popularity_sigma=10.0, warmup_windows=0))
    with pytest.raises(ValueError, match="popularity_sigma=1000 overflows"):
        G.synthetic_trace(G.Workload(4096, n_layers=1, k=256, steps=1, batch=1, locality=uniform,
                                     popularity_sigma=1000.0))
    with pytest.raises(ValueError, match="n_layers is too large"):       # a MemoryError, or the process killed
        G.locality_profile(0.5, 2 ** 40)
    with pytest.raises(ValueError, match=r"n_layers is too large: .* 1.60e\+392 GB"):   # OverflowError in the message
        G.locality_profile(0.5, 10 ** 400)
    with pytest.raises(ValueError, match=r"this trace would take 1.02e\+394 GB \(batch="):  # OverflowError
        G.synthetic_trace(G.Workload(256, n_layers=2, k=16, steps=4, batch=10 ** 400))
    with pytest.raises(ValueError, match="LocalityModel.drift_rho must be finite"):
        LM.LocalityModel("m", "drift", "fraction", float("nan"))
