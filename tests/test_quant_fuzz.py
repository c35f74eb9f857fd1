"""Fuzz tests (hypothesis) of ess.quant: one argument of one public call at a time gets a meaningless value
(fuzz_helpers.BAD, plus arrays of extreme finite values: subnormals, numbers near the float32 limit and beyond it);
the call returns a valid result or raises a TypeError/ValueError naming the argument, and an encoder given finite
numbers never writes a NaN or infinity: FP8 codes are never the NaN bytes 0x7f/0xff, a quantised tile decodes to
finite values within FP8's rounding of the input, a BF16 pattern is never an infinity.

Cases per test (times ESS_FUZZ_SCALE): the number codecs 400, the cache-entry codecs 300, valid extreme tiles 200;
about 900 calls, a few seconds."""
import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra.numpy import arrays

from ess import quant
from ess.specs import model_spec
from fuzz_helpers import BAD, call_one, finite, fuzz_settings, outcome

TINY = model_spec("tiny")
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")
F32_MAX = float(np.finfo(np.float32).max)
EXTREME = [0.0, -0.0, 1e-45, -1e-45, 1e-40, 1.2e-38, 1.0, -448.0, 449.0, 1e30, 3.0e38, -3.39e38, F32_MAX]
# finite arrays of extreme values, float32 and float64 (float64 may go past the float32 range: refused)
EXTREME_ARRAYS = st.one_of(
    arrays(np.float32, (2, 8), elements=st.sampled_from(EXTREME).map(np.float32)),
    arrays(np.float64, (2, 8), elements=st.sampled_from(EXTREME + [3.5e38, 1e300, -1e300])))
VALUES = st.one_of(BAD, EXTREME_ARRAYS)
X = np.linspace(-3, 3, 16).reshape(2, 8)


def _no_nan_code(codes):
    return not np.isin(codes, (0x7F, 0xFF)).any()


NUMBERS = {
    "fp8_e4m3_encode": (lambda **a: quant.fp8_e4m3_encode(**a), {"x": X}),
    "fp8_e4m3_decode": (lambda **a: quant.fp8_e4m3_decode(**a), {"codes": np.arange(10, dtype=np.uint8)}),
    "fp8_e4m3_round": (lambda **a: quant.fp8_e4m3_round(**a), {"x": X}),
    "bf16_encode": (lambda **a: quant.bf16_encode(**a), {"x": X}),
    "bf16_decode": (lambda **a: quant.bf16_decode(**a), {"bits": np.arange(10, dtype=np.uint16)}),
    "bf16_round": (lambda **a: quant.bf16_round(**a), {"x": X}),
    "quantize_fp8_tiles": (lambda **a: quant.quantize_fp8_tiles(**a), {"x": X, "tile": 4, "pow2_scale": False}),
    "dequantize_fp8_tiles": (lambda **a: quant.dequantize_fp8_tiles(**a),
                             {"codes": np.full((2, 8), 0x38, np.uint8), "scales": np.ones((2, 2)), "tile": 4}),
    "hadamard_rotate": (lambda **a: quant.hadamard_rotate(**a), {"x": X}),
}


@fuzz_settings(400)
@given(data=st.data())
def test_number_codecs_refuse_meaningless_arguments_and_never_write_nan(data):
    fn, name, args, ok, out = call_one(data, NUMBERS, VALUES)
    if not ok:
        return
    if fn in ("fp8_e4m3_encode",):
        assert out.dtype == np.uint8 and _no_nan_code(out)
    elif fn in ("fp8_e4m3_round", "bf16_round", "hadamard_rotate"):
        assert out.dtype == np.float32 and finite(out)
    elif fn == "bf16_encode":
        assert out.dtype == np.uint16 and ((out & 0x7F80) != 0x7F80).all()
    elif fn == "quantize_fp8_tiles":
        codes, scales = out
        x = np.asarray(args["x"], dtype=np.float64)
        assert _no_nan_code(codes) and finite(scales) and (scales > 0).all()
        back = quant.dequantize_fp8_tiles(codes, scales, args["tile"]).astype(np.float64)
        assert finite(back)
        # FP8 e4m3 keeps 3 mantissa bits (relative error <= 2^-4) down to its smallest normal 2^-6 of the scale
        s = np.repeat(scales.astype(np.float64), args["tile"], axis=-1)
        assert (np.abs(back - x) <= 2 ** -4 * np.abs(x) + s * 2 ** -9 + 1e-45).all()
    elif fn in ("dequantize_fp8_tiles",):
        codes = np.asarray(args["codes"])
        if codes.dtype == np.uint8 and _no_nan_code(codes):
            assert finite(out)


ENTRIES = {
    "encode_latent": (lambda **a: quant.encode_latent(**a),
                      {"ckv": np.ones((3, 128), np.float32), "rope": np.ones((3, 16), np.float32), "model": TINY,
                       "dtype": "fp8", "pow2_scale": False}),
    "decode_latent": (lambda **a: quant.decode_latent(**a),
                      {"entries": quant.encode_latent(np.ones((3, 128)), np.ones((3, 16)), TINY), "model": TINY,
                       "dtype": "fp8"}),
    "encode_indexer_keys": (lambda **a: quant.encode_indexer_keys(**a),
                            {"keys": np.ones((3, 32)), "model": TINY, "pow2_scale": True}),
    "decode_indexer_keys": (lambda **a: quant.decode_indexer_keys(**a),
                            {"entries": quant.encode_indexer_keys(np.ones((3, 32)), TINY), "model": TINY}),
}


@fuzz_settings(300)
@given(data=st.data())
def test_entry_codecs_refuse_meaningless_arguments(data):
    fn, name, args, ok, out = call_one(data, ENTRIES, VALUES)
    if not ok:
        return
    if fn.startswith("encode"):
        assert out.dtype == np.uint8 and out.shape[-1] in (656 // 656 * quant.latent_layout(TINY).entry_bytes,
                                                           quant.latent_layout(TINY, "bf16").entry_bytes, 36)
        back = (quant.decode_latent(out, TINY, args["dtype"]) if fn == "encode_latent"
                else quant.decode_indexer_keys(out, TINY))
        assert finite(back)


@fuzz_settings(200)
@given(x=EXTREME_ARRAYS.filter(lambda a: np.abs(a.astype(np.float64)).max() <= F32_MAX), pow2=st.booleans())
def test_tiles_of_extreme_finite_values_quantise_to_finite_values(x, pow2):
    """Subnormal tiles (whose amax / 448 underflows in float32) and tiles near the float32 limit round trip to
    finite values: the scale is never 0 and never infinite."""
    ok, out = outcome(lambda: quant.quantize_fp8_tiles(x, 4, pow2_scale=pow2), "x")
    if not ok:                          # refused only where FP8's rounding of the largest value passes float32's
        assert np.abs(x.astype(np.float64)).max() > F32_MAX / (1 + 2 ** -4)
        return
    codes, scales = out
    back = quant.dequantize_fp8_tiles(codes, scales, 4)
    assert _no_nan_code(codes) and finite(scales) and (scales > 0).all() and finite(back)
    assert (np.abs(back.astype(np.float64)) <= np.repeat(np.abs(x.astype(np.float64)).reshape(2, 2, 4).max(-1), 4,
                                                        axis=-1) * (1 + 2 ** -4) + 1e-37).all()


def test_the_meaningless_quant_inputs_found_by_probing_are_refused():
    """Each once gave a NaN or infinity from finite numbers, a silent True, or a raw NumPy error."""
    sub = np.full((1, 4), 1e-45, np.float32)
    codes, scales = quant.quantize_fp8_tiles(sub, 4)          # the scale underflowed to 0: inf / NaN codes
    assert (scales > 0).all() and _no_nan_code(codes)
    with pytest.raises(ValueError, match="x holds a value beyond the bfloat16 range"):
        quant.bf16_encode(np.array([3.4e38], np.float32))       # rounded to +inf
    with pytest.raises(ValueError, match="x holds a value beyond the float32 range"):
        quant.quantize_fp8_tiles(np.full((1, 4), 1e39), 4)
    with pytest.raises(TypeError, match="pow2_scale must be True or False"):
        quant.quantize_fp8_tiles(np.ones((1, 4)), 4, pow2_scale="no")     # "no" meant True
    with pytest.raises(ValueError, match="x holds a value whose FP8 rounding leaves the float32 range"):
        quant.quantize_fp8_tiles(np.array([[-3.39e38, 0, 0, 0]], np.float32), 4, pow2_scale=True)   # 2^128 = inf
    with pytest.raises(ValueError, match="x must hold finite values"):
        quant.hadamard_rotate(np.array([np.inf, 1.0]))          # inf - inf = NaN
    with pytest.raises(ValueError, match="the rotation leaves the float32 range"):
        quant.hadamard_rotate(np.array([3e38, 3e38], np.float32))   # 4.2e38 -> inf
    with pytest.raises(TypeError, match="x must hold numbers"):
        quant.hadamard_rotate(["a", "b"])                         # a raw NumPy ValueError
    with pytest.raises(TypeError, match="ckv must be a floating-point array"):
        quant.encode_latent([[1.0], [1.0, 2.0]], np.ones((2, 16)), TINY)   # ragged: a raw NumPy ValueError
    with pytest.raises(ValueError, match="scales must be finite|scales must hold finite"):
        quant.dequantize_fp8_tiles(np.zeros((1, 4), np.uint8), np.array([[np.nan]]), 4)
    with pytest.raises(TypeError, match="model must be a ModelSpec"):
        quant.encode_indexer_keys(np.ones((1, 32)), "tiny")       # AttributeError on a str
