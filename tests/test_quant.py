"""FP8 / BF16 emulation against torch's own float8_e4m3fn and bfloat16 conversions, and the cache byte layouts."""
import numpy as np
import pytest
import torch

from ess import quant
from ess.layout import latent_layout
from ess.specs import model_spec

FULL = model_spec("deepseek-v3.2-exp")
TINY = model_spec("tiny")


def test_fp8_table_matches_torch():
    codes = torch.arange(256, dtype=torch.uint8)
    ref = codes.view(torch.float8_e4m3fn).float().numpy()
    np.testing.assert_array_equal(np.isnan(quant.FP8_E4M3_VALUES), np.isnan(ref))
    ok = ~np.isnan(ref)
    np.testing.assert_array_equal(quant.FP8_E4M3_VALUES[ok], ref[ok])
    assert quant.FP8_E4M3_VALUES[0x7E] == quant.FP8_E4M3_MAX == 448.0


def test_fp8_encode_matches_torch_rounding():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(4000) * 40, rng.standard_normal(1000) * 1e-3,
                        # midpoints between neighbours: the ties-to-even cases
                        (quant.FP8_E4M3_VALUES[1:126] + quant.FP8_E4M3_VALUES[2:127]) / 2,
                        -(quant.FP8_E4M3_VALUES[0:120] + quant.FP8_E4M3_VALUES[1:121]) / 2,
                        [0.0, -0.0, 448.0, -448.0]]).astype(np.float32)
    ours = quant.fp8_e4m3_encode(x)
    theirs = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    np.testing.assert_array_equal(ours, theirs)          # every byte, signed zeros included


def test_fp8_saturates_and_rejects_nonfinite():
    assert quant.fp8_e4m3_round(np.array([1e6, -1e6])).tolist() == [448.0, -448.0]
    with pytest.raises(ValueError, match="x must hold finite"):
        quant.fp8_e4m3_encode(np.array([1.0, np.nan]))


def test_bf16_matches_torch():
    x = np.random.default_rng(2).standard_normal(5000).astype(np.float32) * 100
    x[:3] = [1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -(1.0 + 2 ** -8)]            # ties
    ours = quant.bf16_encode(x)
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(quant.bf16_decode(ours), torch.from_numpy(x).to(torch.bfloat16).float().numpy())


def test_latent_fp8_layout_bytes_and_fields():
    rng = np.random.default_rng(3)
    ckv = rng.standard_normal((5, 512)).astype(np.float32)
    ckv[2, 128:256] = 0.0                                              # an all-zero tile
    rope = rng.standard_normal((5, 64)).astype(np.float32)
    e = quant.encode_latent(ckv, rope, FULL)
    lay = latent_layout(FULL, "fp8")
    assert e.shape == (5, 656) and e.dtype == np.uint8
    assert (lay.scale_offset, lay.rope_offset) == (512, 528)
    scales = np.ascontiguousarray(e[:, 512:528]).view("<f4")            # (5, 4)
    amax = np.abs(ckv.reshape(5, 4, 128)).max(axis=2)
    np.testing.assert_allclose(scales, np.where(amax > 0, amax / 448, 1.0), rtol=1e-7)
    np.testing.assert_array_equal(np.ascontiguousarray(e[:, 528:656]).view("<u2"), quant.bf16_encode(rope))
    dec = quant.decode_latent(e, FULL)
    assert dec.shape == (5, 576)
    np.testing.assert_array_equal(dec[:, 512:], quant.bf16_round(rope))
    assert np.all(dec[2, 128:256] == 0)
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for normal values, absolute <= scale * 2^-10 below
    err = np.abs(dec[:, :512] - ckv)
    bound = np.abs(ckv) * 2 ** -4 + np.repeat(scales, 128, axis=1) * 2 ** -9
    assert np.all(err <= bound)


def test_latent_bf16_layout():
    rng = np.random.default_rng(4)
    ckv, rope = rng.standard_normal((3, 512)), rng.standard_normal((3, 64))
    e = quant.encode_latent(ckv, rope, FULL, "bf16")
    assert e.shape == (3, 1152)
    dec = quant.decode_latent(e, FULL, "bf16")
    np.testing.assert_array_equal(dec, np.concatenate([quant.bf16_round(ckv), quant.bf16_round(rope)], axis=1))


def test_pow2_scales_are_powers_of_two():
    ckv = np.random.default_rng(5).standard_normal((4, 128)) * 7
    e = quant.encode_latent(ckv, np.zeros((4, 16)), TINY, pow2_scale=True)
    s = np.ascontiguousarray(e[:, 128:132]).view("<f4")
    np.testing.assert_array_equal(np.log2(s), np.round(np.log2(s)))
    np.testing.assert_allclose(quant.decode_latent(e, TINY)[:, :128], ckv, rtol=0.07, atol=0.05)


def test_indexer_key_layout():
    keys = np.random.default_rng(6).standard_normal((7, 128))
    e = quant.encode_indexer_keys(keys, FULL)
    assert e.shape == (7, 132)
    s = np.ascontiguousarray(e[:, 128:]).view("<f4")[:, 0]
    np.testing.assert_allclose(s, np.abs(keys).max(axis=1) / 448, rtol=1e-7)
    np.testing.assert_allclose(quant.decode_indexer_keys(e, FULL), keys, rtol=2 ** -4, atol=float(s.max()) * 2 ** -9)


def test_hadamard_is_orthonormal_and_matches_sylvester():
    h = np.array([[1.0]])
    for _ in range(3):
        h = np.block([[h, h], [h, -h]])
    x = np.random.default_rng(7).standard_normal((5, 8))
    np.testing.assert_allclose(quant.hadamard_rotate(x), x @ h / np.sqrt(8), atol=1e-6)
    q, k = np.random.default_rng(8).standard_normal((2, 128))
    assert abs(quant.hadamard_rotate(q) @ quant.hadamard_rotate(k) - q @ k) < 1e-4
    np.testing.assert_allclose(quant.hadamard_rotate(quant.hadamard_rotate(x)), x, atol=1e-6)
    with pytest.raises(ValueError, match="power of two"):
        quant.hadamard_rotate(np.ones((2, 12)))


def test_bad_latent_inputs_name_the_argument():
    with pytest.raises(ValueError, match="ckv must have a last axis of 512"):
        quant.encode_latent(np.zeros((2, 500)), np.zeros((2, 64)), FULL)
    with pytest.raises(ValueError, match="rope must hold finite"):
        quant.encode_latent(np.zeros((2, 512)), np.full((2, 64), np.inf), FULL)
    with pytest.raises(ValueError, match="same leading shape"):
        quant.encode_latent(np.zeros((2, 512)), np.zeros((3, 64)), FULL)
    with pytest.raises(TypeError, match="entries must be uint8"):
        quant.decode_latent(np.zeros((2, 656), np.int32), FULL)
    with pytest.raises(ValueError, match="dtype must be one of"):
        quant.encode_latent(np.zeros((2, 512)), np.zeros((2, 64)), FULL, "fp4")
