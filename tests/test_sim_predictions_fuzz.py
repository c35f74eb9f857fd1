"""Fuzz tests (hypothesis) of the simulator's prediction helpers (ess.sim.predictions: step breakdown, overlap
against misses, split costs, strategy map and overheads) and of the overlap formulas' input (ess.sim.timeline:
LayerOps, overlap_overhead_s). One argument of one call at a time gets a meaningless value (fuzz_helpers.BAD, plus
huge, negative, NaN and infinite numbers); the call returns a valid result or raises a TypeError/ValueError naming
the argument, and finite inputs never give NaN: every time and overhead is finite and >= 0.

Cases per test (times ESS_FUZZ_SCALE): predictions 150, LayerOps 300; about 450 calls, ~10 s."""
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from ess.sim import predictions as P
from ess.sim.config import Scenario
from ess.sim.timeline import LayerOps, overlap_overhead_s
from ess.specs import model_spec
from fuzz_helpers import BAD, call_one, finite, fuzz_settings

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")
NL = model_spec().n_sparse_layers
HUGE = st.one_of(BAD, st.sampled_from([10 ** 6, 2 ** 40, 10 ** 400, 1e300, -1.0, math.inf, -math.inf, math.nan,
                                       np.full(3, np.nan), np.zeros(0), [1.0, math.nan]]))
SC = Scenario()

PREDICTIONS = {
    "step_breakdown": (lambda **a: P.step_breakdown(**a), {"batches": [16, 64], "context_len": 32768,
                                                           "scenario": SC}),
    "overlap_vs_misses": (lambda **a: P.overlap_vs_misses(**a), {"miss_counts": [0, 64, 256], "scenario": SC,
                                                                 "context_len": 131072, "batch": 160, "mtp": 2,
                                                                 "ratio": 0.2, "profile": None}),
    "split_costs": (lambda **a: P.split_costs(**a), {"batch": 52, "context_len": 32768, "scenario": SC, "mtp": 2}),
    "strategy_map": (lambda **a: P.strategy_map(**a), {"batches": [32, 160], "miss_counts": [0, 128],
                                                       "context_len": 65536, "scenario": SC, "mtp": 2}),
    "strategy_overheads": (lambda **a: P.strategy_overheads(**a), {"misses": np.full(NL, 40.0), "scenario": SC,
                                                                   "context_len": 32768, "batch": 64, "mtp": 2,
                                                                   "ratio": 0.5}),
}


def _numbers_finite(out) -> bool:
    if isinstance(out, dict):
        return all(math.isfinite(v) for v in out.values() if isinstance(v, (int, float)) and not isinstance(v, bool))
    return finite(out)


@fuzz_settings(150)
@given(data=st.data())
def test_predictions_refuse_meaningless_arguments_and_stay_finite(data):
    fn, name, args, ok, out = call_one(data, PREDICTIONS, HUGE, {"batches": ("batches", "batch")})
    if ok:
        assert _numbers_finite(out), (fn, name, args, out)


OPS = dict(indexer=4.0, indexer_b0=2.5, indexer_b1=2.5, pre_attn=1.0, attn=3.0, attn_b0=2.0, attn_b1=2.0,
           attn_hit=2.0, attn_miss=1.5, merge=0.2, o_proj=5.0, h2d=6.0, h2d_b0=3.0, h2d_b1=3.0, d2h=1.0)
LAYER_OPS = {"LayerOps": (lambda **a: overlap_overhead_s(LayerOps(**a)), OPS)}


@fuzz_settings(300)
@given(data=st.data())
def test_layer_ops_refuse_meaningless_times_and_the_formulas_stay_finite(data):
    fn, name, args, ok, out = call_one(data, LAYER_OPS, HUGE, {k: (f"LayerOps.{k}", "LayerOps fields")
                                                                for k in OPS})
    if ok:
        assert set(out) == {"none", "da", "dba"} and all(finite(v) for v in out.values()), (name, args, out)
        assert (np.asarray(out["none"]) >= 0).all()


def test_the_meaningless_layer_ops_found_by_probing_are_refused():
    """Each once gave a raw NumPy error (a string), NaN (a NaN time) or a meaningless negative overhead."""
    with pytest.raises(TypeError, match="LayerOps.h2d must be a number"):
        LayerOps(**{**OPS, "h2d": "6"})
    with pytest.raises(ValueError, match="LayerOps.attn must be finite"):
        LayerOps(**{**OPS, "attn": math.nan})
    with pytest.raises(ValueError, match="LayerOps.d2h must be >= 0"):
        LayerOps(**{**OPS, "d2h": -1.0})
    with pytest.raises(ValueError, match="LayerOps fields must broadcast together"):
        LayerOps(**{**OPS, "h2d": np.ones(3), "d2h": np.ones(2)})


def test_the_meaningless_prediction_inputs_found_by_probing_are_refused():
    """Each once gave a raw pandas or Python error (an Index of a scalar, int(NaN), int(None)) or an error naming
    another argument."""
    assert list(P.step_breakdown(64).index) == [64]                     # a scalar batch: once a raw pandas error
    with pytest.raises(TypeError, match="batches must be a number"):
        P.step_breakdown("")
    with pytest.raises(TypeError, match="mtp must be an integer"):       # int(NaN): a raw ValueError
        P.overlap_vs_misses([0, 64], mtp=math.nan)
    with pytest.raises(ValueError, match="miss_counts must be <= the entries selected"):   # named "misses"
        P.strategy_map([32], [10 ** 6], context_len=65536)
    with pytest.raises(TypeError, match="batch must be an integer"):     # None / 2: a raw TypeError
        P.split_costs(None, 32768)
    with pytest.raises(ValueError, match="profile must be"):              # all zero: a division by zero
        P.overlap_vs_misses([64], profile=np.zeros(NL))
