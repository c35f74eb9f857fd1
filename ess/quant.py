"""FP8 (e4m3) and BF16 emulation, the Hadamard rotation, and the byte layouts of the two caches.

Everything here is plain NumPy and bit-exact: a float8_e4m3fn value is stored as its byte, a bfloat16 value as its
16-bit pattern, so an encoded entry is the same bytes a GPU kernel would read.

* **FP8 e4m3 ("fn" variant)**: 1 sign, 4 exponent (bias 7), 3 mantissa bits, no infinities, largest finite value 448,
  the byte ``0x7f``/``0xff`` is NaN. Rounding is to the nearest value, ties to the even code, and values beyond 448
  saturate (the quantiser scales each tile so that its largest magnitude maps to 448, so saturation never changes a
  scaled value). This is the OCP FP8 format used by FlashMLA and DeepGEMM [FMLA; DG].
* **Per-tile scales**: each 128-value tile of c_KV (and each indexer key) is stored as ``x / s`` in FP8 with one
  float32 scale ``s = amax / 448`` (``amax`` the tile's largest magnitude; ``s = 1`` for an all-zero tile).
  ``pow2_scale=True`` rounds ``s`` up to a power of two instead (the "ue8m0" scale format of DeepSeek-V3.2-Exp's FP8
  blocks, paper-facts.md "weights FP8 (block 128, ue8m0 scales)").
* **BF16**: round to nearest, ties to even, from float32.
* **Hadamard rotation**: ``x @ H / sqrt(n)`` with the Sylvester Hadamard matrix ``H`` (n a power of two). It is
  orthonormal, so ``rot(q) . rot(k) == q . k``; the lightning indexer rotates q and k before quantising them to FP8
  because the rotation spreads outliers over the tile [DS ``inference/model.py``, ``rotate_activation``].

Byte layouts (offsets from :func:`ess.layout.latent_layout`, little-endian)::

    latent, FP8 (656 B)    [0, 512) c_KV fp8 | [512, 528) 4 x float32 scale | [528, 656) 64 x bf16 rope
    latent, BF16 (1,152 B) [0, 1024) c_KV bf16 | [1024, 1152) 64 x bf16 rope
    indexer key (132 B)    [0, 128) key fp8 | [128, 132) 1 x float32 scale
"""
from __future__ import annotations

import numpy as np

from . import validate
from .layout import check_model, indexer_entry_bytes, latent_layout
from .specs import ModelSpec

__all__ = [
    "FP8_E4M3_MAX", "FP8_BLOCK", "FP8_E4M3_VALUES", "fp8_e4m3_encode", "fp8_e4m3_decode", "fp8_e4m3_round",
    "bf16_encode", "bf16_decode", "bf16_round", "quantize_fp8_tiles", "dequantize_fp8_tiles",
    "hadamard_rotate", "encode_latent", "decode_latent", "encode_indexer_keys", "decode_indexer_keys",
]

FP8_E4M3_MAX = 448.0  # largest finite float8_e4m3fn value: 1.75 * 2**8 (OCP 8-bit floating point spec)
# values per FP8 scale block of the indexer's q and k (and of the c_KV tiles): paper-facts.md "DeepSeek-V3.2-Exp
# geometry" ("a Hadamard transform then per-128-block FP8 quantisation of q and k"; 656 B = 512 fp8 + 4 scales)
FP8_BLOCK = 128


def _fp8_table() -> np.ndarray:
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = codes & 0x7
    mag = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1.0 + man / 8.0) * 2.0 ** (exp - 7.0))
    vals = sign * mag
    vals[(codes & 0x7F) == 0x7F] = np.nan
    return vals.astype(np.float32)


#: Value of every FP8 e4m3fn byte (index = byte), float32; NaN at 0x7f and 0xff. Kernels dequantise through it.
FP8_E4M3_VALUES = _fp8_table()
FP8_E4M3_VALUES.setflags(write=False)
_POS = FP8_E4M3_VALUES[:127].astype(np.float64)  # codes 0..126: the non-negative finite values, increasing


def _check_finite(x: np.ndarray, name: str) -> None:
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} must hold finite values only (found NaN or inf)")


_F32_MAX = float(np.finfo(np.float32).max)


def _numbers(x, name: str, dtype) -> np.ndarray:
    """``x`` as an array of ``dtype``; a ``TypeError`` naming ``name`` for strings, bools or objects (ragged nesting
    included), a ``ValueError`` for values beyond the float32 range when ``dtype`` is float32 (they would become
    infinities)."""
    try:
        a = np.asarray(x)
    except (TypeError, ValueError):                       # ragged nesting
        raise TypeError(f"{name} must hold numbers, got {type(x).__name__}") from None
    if a.dtype.kind not in "iuf":
        raise TypeError(f"{name} must hold numbers, got dtype {a.dtype}")
    if np.dtype(dtype) == np.float32 and a.dtype.itemsize > 4:
        _check_finite(a, name)
        if a.size and float(np.max(np.abs(a.astype(np.float64)))) > _F32_MAX:
            raise ValueError(f"{name} holds a value beyond the float32 range (|x| <= {_F32_MAX:.4g})")
    return a.astype(dtype, copy=False)


def fp8_e4m3_encode(x) -> np.ndarray:
    """Bytes (uint8, same shape) of ``x`` rounded to float8_e4m3fn: nearest, ties to even, saturating at +-448."""
    x = _numbers(x, "x", np.float64)
    _check_finite(x, "x")
    a = np.minimum(np.abs(x), FP8_E4M3_MAX)
    hi = np.clip(np.searchsorted(_POS, a, side="left"), 0, 126)  # _POS[hi] >= a
    lo = np.maximum(hi - 1, 0)
    d_lo, d_hi = a - _POS[lo], _POS[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    return np.where(np.signbit(x), code | 0x80, code).astype(np.uint8)     # sign kept, -0 included (as torch)


def fp8_e4m3_decode(codes) -> np.ndarray:
    """float32 values of float8_e4m3fn bytes."""
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise TypeError(f"codes must be uint8 bytes, got dtype {codes.dtype}")
    return FP8_E4M3_VALUES[codes]


def fp8_e4m3_round(x) -> np.ndarray:
    """``x`` rounded to the nearest float8_e4m3fn value (float32)."""
    return fp8_e4m3_decode(fp8_e4m3_encode(x))


def bf16_encode(x) -> np.ndarray:
    """16-bit patterns (uint16) of ``x`` rounded to bfloat16, nearest with ties to even. A value that rounds past the
    largest finite bfloat16 (about 3.39e38) is a ``ValueError``, not an infinity."""
    return _bf16(x, "x")


def _bf16(x, name: str) -> np.ndarray:
    x = np.ascontiguousarray(_numbers(x, name, np.float32))
    _check_finite(x, name)
    u = x.view(np.uint32).astype(np.uint64)
    u = u + 0x7FFF + ((u >> 16) & 1)
    out = (u >> 16).astype(np.uint16)
    if ((out & 0x7F80) == 0x7F80).any():                  # exponent all ones: rounded up to infinity
        raise ValueError(f"{name} holds a value beyond the bfloat16 range (|x| < 3.39e38)")
    return out


def bf16_decode(bits) -> np.ndarray:
    """float32 values of bfloat16 bit patterns (uint16)."""
    bits = np.asarray(bits)
    if bits.dtype != np.uint16:
        raise TypeError(f"bits must be uint16, got dtype {bits.dtype}")
    return (bits.astype(np.uint32) << 16).view(np.float32)


def bf16_round(x) -> np.ndarray:
    """``x`` rounded to the nearest bfloat16 value (float32)."""
    return bf16_decode(bf16_encode(x))


def _tile_scales(amax: np.ndarray, pow2_scale: bool) -> np.ndarray:
    # float64, and at least float32's smallest normal number: amax / 448 of a tile of subnormal values underflows to
    # 0 in float32, and the tile would be divided by 0 (its values then quantise to 0, as small as they are)
    s = np.where(amax > 0, np.maximum(amax.astype(np.float64) / FP8_E4M3_MAX, np.finfo(np.float32).tiny), 1.0)
    if pow2_scale:
        s = 2.0 ** np.ceil(np.log2(s))
    return s.astype(np.float32)


def quantize_fp8_tiles(x, tile: int = FP8_BLOCK, *, pow2_scale: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Quantise the last axis of ``x`` in tiles of ``tile`` values: returns (codes uint8 (..., n), scales float32
    (..., n // tile)) with ``x ~= fp8(codes) * scale`` per tile."""
    tile = validate.positive_int("tile", tile)
    pow2_scale = validate.boolean("pow2_scale", pow2_scale)
    x = _numbers(x, "x", np.float32)
    _check_finite(x, "x")
    if x.ndim == 0 or x.shape[-1] % tile:
        raise ValueError(f"x: last axis ({x.shape[-1:] or 'scalar'}) must be a multiple of tile={tile}")
    tiles = x.reshape(*x.shape[:-1], x.shape[-1] // tile, tile)
    amax = np.abs(tiles).max(axis=-1)
    scales = _tile_scales(amax, pow2_scale)                                   # (..., n_tiles)
    codes = fp8_e4m3_encode(tiles / scales[..., None].astype(np.float64)).reshape(x.shape)
    # FP8 rounds up by at most 2^-4: only a tile within that of float32's limit can decode past it (a power-of-two
    # scale can turn 3.39e38 into 2^128)
    if (amax > _F32_MAX / (1 + 2 ** -4)).any() and \
            np.abs(_dequantize(codes, scales, tile, wide=True)).max() > _F32_MAX:
        raise ValueError(f"x holds a value whose FP8 rounding leaves the float32 range (|x| up to {amax.max():g}"
                         f"{', with pow2_scale' if pow2_scale else ''})")
    return codes, scales


def dequantize_fp8_tiles(codes, scales, tile: int = FP8_BLOCK) -> np.ndarray:
    """Inverse of :func:`quantize_fp8_tiles` (float32). ``scales`` are what the quantiser writes: finite and >= 0,
    and small enough that every value stays within float32 (a ``ValueError`` otherwise)."""
    scales_arr = _numbers(scales, "scales", np.float64)
    _check_finite(scales_arr, "scales")
    if scales_arr.size and scales_arr.min() < 0:
        raise ValueError(f"scales must be >= 0 (amax / 448 of a tile), got {scales_arr.min():g}")
    out = _dequantize(codes, scales, tile, wide=True)
    if out.size and np.nanmax(np.abs(out), initial=0.0) > _F32_MAX:
        raise ValueError(f"scales: a code times its scale leaves the float32 range (scale up to {scales_arr.max():g})")
    return out.astype(np.float32)


def _dequantize(codes, scales, tile, *, wide: bool = False) -> np.ndarray:
    """:func:`dequantize_fp8_tiles` of stored bytes, as they are: a NaN code or scale decodes to NaN (float32; with
    ``wide`` float64, the exact products before their rounding to float32)."""
    tile = validate.positive_int("tile", tile)
    vals = fp8_e4m3_decode(codes)
    if vals.ndim == 0 or vals.shape[-1] % tile:
        raise ValueError(f"codes: last axis ({vals.shape[-1:] or 'scalar'}) must be a multiple of tile={tile}")
    scales = _numbers(scales, "scales", np.float32)
    if scales.shape != vals.shape[:-1] + (vals.shape[-1] // tile,):
        raise ValueError(f"scales must have shape {vals.shape[:-1] + (vals.shape[-1] // tile,)} (one per tile of "
                         f"codes), got {scales.shape}")
    tiles = vals.reshape(*vals.shape[:-1], vals.shape[-1] // tile, tile).astype(np.float64)
    out = (tiles * scales.astype(np.float64)[..., None]).reshape(vals.shape)     # exact: two 24-bit mantissas
    if wide:
        return out
    with np.errstate(over="ignore"):                   # stored bytes beyond float32 decode to inf, as on a GPU
        return out.astype(np.float32)


def hadamard_rotate(x) -> np.ndarray:
    """Orthonormal Hadamard rotation of the last axis (length a power of two), by the fast Walsh-Hadamard transform.
    float32 in, float32 out; ``hadamard_rotate(hadamard_rotate(x)) == x`` up to rounding. ``x`` must be finite, and
    so must the rotated values in float32 (a ``ValueError`` otherwise)."""
    x = np.array(_numbers(x, "x", np.float64), dtype=np.float64)
    _check_finite(x, "x")
    n = x.shape[-1] if x.ndim else 0
    if n < 1 or n & (n - 1):
        raise ValueError(f"x: last axis must be a power of two for the Hadamard rotation, got {n}")
    h = 1
    while h < n:
        y = x.reshape(*x.shape[:-1], n // (2 * h), 2, h)
        a, b = y[..., 0, :].copy(), y[..., 1, :].copy()
        y[..., 0, :], y[..., 1, :] = a + b, a - b
        h *= 2
    x /= np.sqrt(n)
    if x.size and np.abs(x).max() > _F32_MAX:
        raise ValueError(f"x: the rotation leaves the float32 range (a value of up to sqrt({n}) x max|x|)")
    return x.astype(np.float32)


# ----------------------------------------------------------------------------------------------------------------
# Cache entries
# ----------------------------------------------------------------------------------------------------------------

def _as_rows(x, width: int, name: str) -> np.ndarray:
    try:
        x = np.asarray(x)
    except (TypeError, ValueError):                       # ragged nesting
        raise TypeError(f"{name} must be a floating-point array, got {type(x).__name__}") from None
    if x.ndim < 1 or x.shape[-1] != width:
        raise ValueError(f"{name} must have a last axis of {width} values, got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"{name} must be floating point, got dtype {x.dtype}")
    return _numbers(x, name, np.float32)


def encode_latent(ckv, rope, model: ModelSpec, dtype: str = "fp8", *, pow2_scale: bool = False) -> np.ndarray:
    """Latent entries (uint8 (..., entry_bytes)) from c_KV (..., kv_lora_rank) and rope keys (..., qk_rope_head_dim).

    FP8: c_KV quantised per 128-value tile with a float32 scale, rope kept in BF16 (656 B for DeepSeek-V3.2-Exp);
    BF16: both halves in BF16 (1,152 B).
    """
    lay = latent_layout(model, dtype)
    pow2_scale = validate.boolean("pow2_scale", pow2_scale)
    ckv = _as_rows(ckv, model.kv_lora_rank, "ckv")
    rope = _as_rows(rope, model.qk_rope_head_dim, "rope")
    if ckv.shape[:-1] != rope.shape[:-1]:
        raise ValueError(f"ckv and rope must have the same leading shape, got {ckv.shape[:-1]} and {rope.shape[:-1]}")
    out = np.zeros(ckv.shape[:-1] + (lay.entry_bytes,), dtype=np.uint8)
    rope_b = _bf16(rope, "rope").view(np.uint8)
    out[..., lay.rope_offset:lay.rope_offset + lay.rope_bytes] = rope_b
    if dtype == "bf16":
        out[..., lay.ckv_offset:lay.ckv_offset + lay.ckv_bytes] = _bf16(ckv, "ckv").view(np.uint8)
        return out
    codes, scales = quantize_fp8_tiles(ckv, model.latent_fp8_tile, pow2_scale=pow2_scale)
    out[..., lay.ckv_offset:lay.ckv_offset + lay.ckv_bytes] = codes
    out[..., lay.scale_offset:lay.scale_offset + 4 * lay.n_scales] = \
        np.ascontiguousarray(scales.astype("<f4")).view(np.uint8)
    return out


def decode_latent(entries, model: ModelSpec, dtype: str = "fp8") -> np.ndarray:
    """float32 (..., kv_lora_rank + qk_rope_head_dim) latents (c_KV then rope) from latent entries, decoded as stored
    (a NaN code or scale gives NaN, as the GPU's kernels read it)."""
    lay = latent_layout(model, dtype)
    e = validate.entries("entries", entries, (lay.entry_bytes,))
    rope = bf16_decode(np.ascontiguousarray(e[..., lay.rope_offset:lay.rope_offset + lay.rope_bytes]).view(np.uint16))
    raw = np.ascontiguousarray(e[..., lay.ckv_offset:lay.ckv_offset + lay.ckv_bytes])
    if dtype == "bf16":
        ckv = bf16_decode(raw.view(np.uint16))
    else:
        scales = np.ascontiguousarray(e[..., lay.scale_offset:lay.scale_offset + 4 * lay.n_scales]).view("<f4")
        ckv = _dequantize(raw, scales, model.latent_fp8_tile)
    return np.concatenate([ckv, rope], axis=-1).astype(np.float32)


def encode_indexer_keys(keys, model: ModelSpec, *, pow2_scale: bool = False) -> np.ndarray:
    """Indexer-cache entries (uint8 (..., index_head_dim + 4)): the key in FP8 with one float32 scale (132 B).
    Rotate the keys first (:func:`hadamard_rotate`) to match the model."""
    d = check_model(model).index_head_dim
    pow2_scale = validate.boolean("pow2_scale", pow2_scale)
    keys = _as_rows(keys, d, "keys")
    codes, scales = quantize_fp8_tiles(keys, d, pow2_scale=pow2_scale)
    out = np.empty(keys.shape[:-1] + (indexer_entry_bytes(model),), dtype=np.uint8)
    out[..., :d] = codes
    out[..., d:d + 4] = np.ascontiguousarray(scales.astype("<f4")).view(np.uint8)
    return out


def decode_indexer_keys(entries, model: ModelSpec) -> np.ndarray:
    """float32 (..., index_head_dim) keys from indexer-cache entries, decoded as stored (see :func:`decode_latent`)."""
    d = check_model(model).index_head_dim
    e = validate.entries("entries", entries, (indexer_entry_bytes(model),))
    scales = np.ascontiguousarray(e[..., d:d + 4]).view("<f4")
    return fp8_e4m3_decode(e[..., :d]) * scales
