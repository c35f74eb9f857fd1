"""Fuzz tests (hypothesis) of the decode-step simulator, ess.sim: the scenario and cost parameters, the kernel costs,
the timeline (simulate, best_batch), the grid and sweep, the calibration and the misses table. One argument of one
public call at a time gets a meaningless value (fuzz_helpers.BAD, plus contexts past the model's maximum, huge
batches, NaN and infinite speeds); the call returns a valid result or raises a TypeError/ValueError naming the
argument, never another exception, and finite inputs never give NaN: a feasible configuration's step time is finite
and > 0, an infeasible one says why, kernel times are finite and >= 0, a calibration fits something (parameters
within its range, finite residuals).

Cases per test (times ESS_FUZZ_SCALE): the timeline 250, the costs 250, the calibration 60, the misses table and
the grid 150; about 700 calls, ~10 s (the calibration is run on 4 points with a 3-point grid)."""
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from ess.sim import calibrate as C
from ess.sim import costs as K
from ess.sim.config import Scenario
from ess.sim.misses import MissesTable
from ess.sim.sweep import grid, sweep
from ess.sim.timeline import best_batch, simulate
from ess.specs import deployment_spec, gpu_spec, model_spec
from fuzz_helpers import BAD, call_one, finite, fuzz_settings

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")
MODEL, GPU, DEP = model_spec(), gpu_spec("H800"), deployment_spec()
NL = MODEL.n_layers
HUGE = st.one_of(BAD, st.sampled_from([10 ** 6, 2 ** 40, 10 ** 400, 1e300, math.inf, -math.inf, math.nan,
                                       MODEL.max_position_embeddings + 1, np.full(NL, np.nan), np.full(NL, 1e300),
                                       np.zeros(NL), [1.0, math.nan]]))
SC = Scenario(check_memory=True)


def _valid_sim(res):
    ok = res.feasible
    assert finite(res.step_s[ok]) and (res.step_s[ok] > 0).all() and (res.step_s[ok] >= res.step_no_offload_s[ok]
                                                                       * (1 - 1e-12)).all()
    assert np.isnan(res.step_s[~ok]).all() and all(r for r in res.reason[~ok])
    assert finite(res.layer_overhead_s) and (res.layer_overhead_s >= 0).all()


TIMELINE = {
    "simulate": (lambda **a: simulate(**a), {"batch": 8, "context_len": 4096, "ratio": 0.5,
                                             "misses": np.full(NL, 20.0), "scenario": SC, "mtp": 2,
                                             "accept_ratio": 1.7, "h2d_GB_per_s": 40.0, "d2h_GB_per_s": None}),
    "simulate (no offload)": (lambda **a: simulate(**a), {"batch": [1, 40], "context_len": 32768, "ratio": 1.0,
                                                          "misses": None, "scenario": None}),
    "best_batch": (lambda **a: best_batch(**a), {"context_len": 65536, "ratios": [1.0, 0.5],
                                                 "misses_by_ratio": {0.5: np.full(NL, 30.0)}, "otps_floor": 20.0,
                                                 "scenario": None}),
    "Scenario": (lambda **a: Scenario(**a), {"model": "deepseek-v3.2-exp", "gpu": None, "mtp": 2, "accept_ratio": 1.5,
                                             "h2d_GB_per_s": 30.0, "strategy": "da", "check_memory": False,
                                             "host_memory_cap": True}),
    "CostParams": (lambda **a: K.CostParams(**a), {"compute_scale": 1.2, "comm_scale": 0.8, "fixed_ms": 1.0,
                                                   "fitted_on": "x", "part_batch": "low"}),
}
SIM_ALIASES = {"misses": ("misses",), "accept_ratio": ("accept_ratio",), "ratios": ("ratios", "ratio"),
               "misses_by_ratio": ("misses_by_ratio", "misses"), "scenario": ("scenario",),
               **{f: (f"Scenario.{f}", f"CostParams.{f}") for f in ("model", "gpu", "mtp", "h2d_GB_per_s",
                                                                    "strategy", "check_memory", "host_memory_cap",
                                                                    "compute_scale", "comm_scale", "fixed_ms",
                                                                    "fitted_on", "part_batch")}}
SIM_ALIASES["accept_ratio"] += ("Scenario.accept_ratio",)
SIM_ALIASES["mtp"] += ("mtp",)
SIM_ALIASES["h2d_GB_per_s"] += ("h2d_GB_per_s",)


@fuzz_settings(250)
@given(data=st.data())
def test_timeline_refuses_meaningless_arguments_and_never_gives_nan(data):
    fn, name, args, ok, out = call_one(data, TIMELINE, HUGE, SIM_ALIASES)
    if not ok:
        return
    if fn.startswith("simulate"):
        _valid_sim(out)
    elif fn == "best_batch":
        assert out["batch"] is None and out["reason"] or (out["batch"] >= 1 and math.isfinite(out["throughput"])
                                                          and out["throughput"] > 0)


COSTS = {
    "layer_costs": (lambda **a: K.layer_costs(**a), {"model": MODEL, "gpu": GPU, "deployment": DEP,
                                                     "micro_batch": 16, "context_len": 32768, "mtp": 2,
                                                     "part_batch_variant": "central"}),
    "gemm_time_s": (lambda **a: K.gemm_time_s(**a), {"m": 64, "n": 2048, "k": 7168, "gpu": GPU, "model": MODEL,
                                                     "groups": 2, "dtype": "fp8"}),
    "memory_time_s": (lambda **a: K.memory_time_s(**a), {"nbytes": 1e9, "gpu": GPU}),
    "lm_head_time_s": (lambda **a: K.lm_head_time_s(**a), {"tokens": 32, "model": MODEL, "gpu": GPU}),
    "part_batch": (lambda **a: K.part_batch(**a), {"variant": "high"}),
    "fp8_weight_bytes_per_param": (lambda **a: K.fp8_weight_bytes_per_param(**a), {"model": MODEL}),
}


@fuzz_settings(250)
@given(data=st.data())
def test_costs_refuse_meaningless_arguments_and_stay_finite(data):
    fn, name, args, ok, out = call_one(data, COSTS, HUGE, {"part_batch_variant": ("part_batch_variant", "variant")})
    if not ok:
        return
    if fn == "layer_costs":
        for field in ("attn", "moe", "dispatch", "combine", "indexer_split"):
            v = np.asarray(getattr(out, field))
            assert finite(v) and (v >= 0).all(), field
    elif fn in ("gemm_time_s", "memory_time_s", "lm_head_time_s"):
        assert finite(out) and (np.asarray(out) >= 0).all()


POINTS = C.calibration_points()[:4]
CALIBRATION = {
    "calibrate": (lambda **a: C.calibrate(**a), {"points": POINTS, "table2_weight": 5.0, "scale_range": (0.2, 4.0),
                                                 "grid": 3, "refine": 0, "compute_scale": None, "scenario": None}),
    "compute_scale_from_cost": (lambda **a: C.compute_scale_from_cost(**a), {"target_ms": 0.05, "lo": 0.05,
                                                                              "hi": 5.0, "scenario": None}),
    "predict_points": (lambda **a: C.predict_points(**a), {"points": POINTS, "params": K.CostParams(),
                                                           "scenario": None}),
}


def _slow_search_left_out(name):
    """HUGE, less the valid grids and refinements past the default's size: they run, for seconds to minutes."""
    if name in ("grid", "refine"):
        return HUGE.filter(lambda v: not (isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
                                          and 4 <= v <= 64))
    return HUGE


@fuzz_settings(60)
@given(data=st.data())
def test_calibration_refuses_options_under_which_nothing_is_fitted(data):
    fn, name, args, ok, out = call_one(data, CALIBRATION, _slow_search_left_out, {"points": ("points",)})
    if not ok:
        return
    if fn == "calibrate":
        lo, hi = args["scale_range"]
        p = out.params
        assert lo * 0.99 <= p.comm_scale <= hi * 1.01 and math.isfinite(out.rms_rel_error) and finite(out.residuals)
    elif fn == "compute_scale_from_cost":
        assert args["lo"] <= out <= args["hi"]
    elif fn == "predict_points":
        assert finite(out) and (out > 0).all()


TABLE = {
    "MissesTable": (lambda **a: MissesTable(**a), {"ratios": (0.5, 0.25), "steps": 8, "batch": 2, "seed": 0,
                                                   "warmup": True, "policy": "lru", "locality": None,
                                                   "trace_model": None}),
    "MissesTable.with_ratios": (lambda **a: MissesTable((0.5,), steps=4).with_ratios(**a), {"ratios": [0.1, 0.3]}),
    "MissesTable.has_row": (lambda **a: MissesTable((0.5,), steps=4).has_row(**a), {"context_len": 4096, "mtp": 2}),
    "grid": (lambda **a: grid(**a), {"axes": {"batch": [1, 2], "context_len": [4096]}}),
    # in this process (workers 0), no scheduler (an address is a connection to make): both are checked by hand
    "sweep": (lambda **a: sweep(**a, workers=0, scheduler=None), {"axes": {"batch": [4], "context_len": [4096, 8192]},
                                                                  "scenario": None, "misses": None, "chunk_size": 1,
                                                                  "progress": False}),
}


@fuzz_settings(150)
@given(data=st.data())
def test_misses_table_and_grid_refuse_meaningless_arguments(data):
    fn, name, args, ok, out = call_one(data, TABLE, HUGE, {"axes": ("axes", "axis")})
    if not ok:
        return
    if fn == "MissesTable":
        assert all(0 < r <= 1 for r in out.ratios)
    elif fn == "sweep":
        assert finite(out["step_ms"][out["feasible"]])


def test_the_meaningless_simulator_inputs_found_by_probing_are_refused():
    """Each once gave a silent answer, a raw NumPy/Python error, or an overflow to inf or NaN."""
    pts = C.calibration_points()[:4]
    for kw, match in [({"grid": 0}, "grid must be in"),                       # nothing fitted: the defaults returned
                      ({"refine": -1}, "refine must be in"),                  # nothing fitted
                      ({"grid": 1}, "grid must be in"),                       # a division by zero (grid - 1)
                      ({"table2_weight": math.nan}, "table2_weight must be finite"),   # NaN loss: nothing fitted
                      ({"scale_range": (2.0, 2.0)}, "scale_range must be"),   # nothing to search
                      ({"scale_range": (-1.0, 2.0)}, r"scale_range\[0\] must be"),     # log of a negative
                      ({"compute_scale": -1.0}, "compute_scale must be")]:
        with pytest.raises((TypeError, ValueError), match=match):
            C.calibrate(pts, **kw)
    with pytest.raises(TypeError, match="points must be a list of CalibrationPoint"):   # AttributeError
        C.calibrate(["a", "b", "c"])
    with pytest.raises(TypeError, match="points must be a list of CalibrationPoint"):   # AttributeError
        C.predict_points([1.0], K.CostParams())
    with pytest.raises(ValueError, match="target_ms must be finite"):         # bisected to an arbitrary answer
        C.compute_scale_from_cost(math.nan)
    with pytest.raises(ValueError, match="lo must be below hi"):              # returned sqrt(lo x hi)
        C.compute_scale_from_cost(0.05, lo=5.0, hi=0.05)
    with pytest.raises(TypeError, match="context_len must be an integer"):    # int(NaN): a raw ValueError
        best_batch(math.nan, [1.0])
    with pytest.raises(TypeError, match="misses_by_ratio must be None or a mapping"):   # 'in' of a bool
        best_batch(65536, [0.5], misses_by_ratio=False)
    with pytest.raises(ValueError, match="otps_floor must be finite"):        # NaN: "no configuration reaches"
        best_batch(65536, [1.0], otps_floor=math.nan)
    with pytest.raises(ValueError, match=r"batch must be <= 54,975,581,388"):   # overflow to inf
        simulate(np.full(3, 1e300), 4096)
    with pytest.raises(ValueError, match="mtp must be <= 163,840"):           # NaN cast to int64
        simulate(8, 4096, mtp=2 ** 63)
    with pytest.raises(ValueError, match="context_len must be <= 163,840"):   # the model's maximum
        K.layer_costs(MODEL, GPU, DEP, 16, 10 ** 6, 2)
    with pytest.raises(ValueError, match="groups must be a positive integer <= 2"):   # OverflowError
        K.gemm_time_s(64, 2048, 7168, GPU, model=MODEL, groups=10 ** 400)
    with pytest.raises(TypeError, match="model must be a ModelSpec"):         # AttributeError
        K.lm_head_time_s(32, None, GPU)
    with pytest.raises(ValueError, match="part_batch_variant must be one of"):   # unhashable in the cache
        K.layer_costs(MODEL, GPU, DEP, 16, 4096, 2, part_batch_variant=[])
    with pytest.raises(ValueError, match="CostParams.part_batch must be one of"):   # truth of an array
        K.CostParams(part_batch=np.zeros(2))
    with pytest.raises(TypeError, match=r"ratios\[1\] must be a number"):      # a raw float('') error
        MissesTable((0.5, ""))
    with pytest.raises(ValueError, match=r"ratios\[0\] must be"):             # NaN kept as a ratio
        MissesTable((math.nan,))
    with pytest.raises(TypeError, match="context_len must be an integer"):    # int(None)
        MissesTable((0.5,)).has_row(None, 2)
    with pytest.raises(ValueError, match="trace_model must be one of"):       # named LocalityModel.name
        MissesTable((0.5,), trace_model=False)
    with pytest.raises(TypeError, match="scheduler must be None"):            # Dask's own error, or a connection
        sweep({"batch": [4], "context_len": [4096]}, scheduler=False, progress=False)
    with pytest.raises(ValueError, match="workers must be"):                  # ProcessPoolExecutor's error
        sweep({"batch": [4], "context_len": [4096, 8192]}, chunk_size=1, workers=-1, progress=False)
    with pytest.raises(TypeError, match="progress must be True or False"):    # 'no' showed the bar
        sweep({"batch": [4], "context_len": [4096]}, progress="no")
    with pytest.raises(ValueError, match="h2d_GB_per_s must be finite"):      # OverflowError in math.isinf
        Scenario(h2d_GB_per_s=10 ** 400)
    assert Scenario(h2d_GB_per_s=np.float32("inf")).h2d_GB_per_s == math.inf   # an infinite link stays a bound
    with pytest.raises(ValueError, match="micro_batch x mtp must be <="):     # the product named "m" deep inside
        K.layer_costs(MODEL, GPU, DEP, 4503599627370497.0, 4096, 2)
    with pytest.raises(ValueError, match="with compute_scale .* held fixed"):   # an overflow warning in the loss
        C.calibrate(pts, grid=2, refine=0, compute_scale=2.2e154)
