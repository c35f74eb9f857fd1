"""Numba kernel of the real model's indexer for the CPU: same signature as :mod:`.reference` (shapes there).

How it is fast (measured in ``benchmarks/README.md``, "The real model's FP8 indexer"): one pass over each request's
cached keys, FP8 read in place, two tokens at a time (each query value loaded feeds two multiply-adds). Each token's
``Hkv x hd`` codes are widened to float32 into a small buffer that stays in L1 (never a float32 copy of the cache)
by bit arithmetic that the compiler vectorises, not by a 256-entry table (a table lookup is a gather, which LLVM
does not vectorise here): for a byte ``c``, the float32 with bits ``(c & 0x7f) << 20 | (c & 0x80) << 24`` is the
e4m3 value times ``2**-120`` -- exponent and mantissa land in float32's fields, and the e4m3 subnormals (exponent
field 0) land on float32 subnormals of the same significand -- so one multiplication by ``2**120`` gives the value
exactly; the NaN bytes ``0x7f`` / ``0xff`` are set to NaN. The widening is written in LLVM IR (:func:`_fp8`) with
32-bit integers: Numba's own integer arithmetic widens to 64 bits, which halves the vector lanes. Then every query
head's dot product with its KV head's key, vectorised over the head dimension. The softmax over the tokens uses an
exponential written in arithmetic (Cody-Waite range reduction, a degree-6 polynomial and the power of two built in
the float's exponent bits; relative error below 2e-7), which vectorises where a call to ``exp`` does not.

Compiled without the ``nnan`` / ``ninf`` fast-math flags (reassociation and contraction only), so a NaN byte gives
NaN scores, as in the reference. Arithmetic is float32 (compare with the reference with a tolerance).
"""
from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from .. import scratch

__all__ = ["indexer_scores"]

# reassociation (vectorised sums), contraction (FMA), approximate functions; NaN and inf keep their meaning
_FAST = {"nsz", "arcp", "contract", "afn", "reassoc"}
_LN2_HI, _LN2_LO = np.float32(0.693359375), np.float32(-2.12194440e-4)     # Cody-Waite split of ln 2 (Cephes)
_EXP_POLY = tuple(np.float32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                                          1.6666665459e-1, 5.0000001201e-1))  # Cephes expf's minimax polynomial


@intrinsic
def _bits_as_f32(typingctx, bits):
    """The float32 whose bit pattern is the int32 ``bits`` (a bitcast; vectorisable)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        return builder.bitcast(args[0], ir.FloatType())
    return sig, codegen


@intrinsic
def _fp8(typingctx, code):
    """The value of one FP8 e4m3 byte, exactly (NaN for 0x7f / 0xff), in 32-bit integer arithmetic (written in
    LLVM IR: Numba would widen the integer operations to 64 bits, halving the vector lanes)."""
    sig = types.float32(types.uint8)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        i32, f32 = ir.IntType(32), ir.FloatType()
        c = builder.zext(args[0], i32)
        mag = builder.and_(c, ir.Constant(i32, 0x7F))
        sign = builder.shl(builder.and_(c, ir.Constant(i32, 0x80)), ir.Constant(i32, 24))
        bits = builder.or_(builder.shl(mag, ir.Constant(i32, 20)), sign)
        value = builder.fmul(builder.bitcast(bits, f32), ir.Constant(f32, 2.0 ** 120))
        nan = builder.icmp_unsigned("==", mag, ir.Constant(i32, 0x7F))
        return builder.select(nan, ir.Constant(f32, float("nan")), value)
    return sig, codegen


@njit(fastmath=_FAST, inline="always")
def _exp_nonpositive(x):
    """exp(x) for x <= 0 (x below -87 gives exp(-87)), float32, relative error below 2e-7."""
    x = max(x, np.float32(-87.0))
    m = np.floor(x * np.float32(1.4426950408889634) + np.float32(0.5))        # x = m ln 2 + r, |r| <= ln 2 / 2
    r = x - m * _LN2_HI - m * _LN2_LO
    p = _EXP_POLY[0]
    p = p * r + _EXP_POLY[1]
    p = p * r + _EXP_POLY[2]
    p = p * r + _EXP_POLY[3]
    p = p * r + _EXP_POLY[4]
    p = p * r + _EXP_POLY[5]
    p = p * r * r + r + np.float32(1.0)
    return p * _bits_as_f32((np.int32(m) + np.int32(127)) << np.int32(23))     # times 2**m


@njit(fastmath=_FAST, inline="always")
def _logits(qb, key, f, logits, s, mx, g, G, hd):
    """The logits of token ``s`` for the G query heads of KV head ``g`` (key widened in ``key``), their maxima."""
    nan = False
    for j in range(G):
        h = g * G + j
        acc = np.float32(0.0)
        for d in range(hd):
            acc += qb[h, d] * key[g * hd + d]
        x = acc * f
        logits[h, s] = x
        if x > mx[h]:
            mx[h] = x
        elif x != x:
            nan = True
    return nan


@njit(fastmath=_FAST, nogil=True, cache=True, error_model="numpy")
def _scores(q, codes, scales, lengths, inv_sqrt, logits, out):
    B, H, hd = q.shape
    L = codes.shape[1]
    Hkv = scales.shape[2]
    G = H // Hkv
    D = Hkv * hd
    key0 = np.empty(D, np.float32)                    # two tokens' keys, widened (they stay in L1)
    key1 = np.empty(D, np.float32)
    mx = np.empty(H, np.float32)
    for b in range(B):
        n = min(lengths[b], L)
        qb = q[b]
        ob = out[b]
        for h in range(H):
            mx[h] = -np.inf
        nan = False
        for s in range(0, n, 2):                      # two tokens at a time: each q value loaded feeds two FMAs
            two = s + 1 < n
            r0 = codes[b, s]
            r1 = codes[b, s + 1 if two else s]
            for d in range(D):
                key0[d] = _fp8(r0[d])
                key1[d] = _fp8(r1[d])
            for g in range(Hkv):
                f0 = scales[b, s, g] * inv_sqrt
                if not two:
                    nan |= _logits(qb, key0, f0, logits, s, mx, g, G, hd)
                    continue
                f1 = scales[b, s + 1, g] * inv_sqrt
                for j in range(G):
                    h = g * G + j
                    a0 = np.float32(0.0)
                    a1 = np.float32(0.0)
                    for d in range(hd):
                        x = qb[h, d]
                        a0 += x * key0[g * hd + d]
                        a1 += x * key1[g * hd + d]
                    x0 = a0 * f0
                    x1 = a1 * f1
                    logits[h, s] = x0
                    logits[h, s + 1] = x1
                    for x in (x0, x1):
                        if x > mx[h]:
                            mx[h] = x
                        elif x != x:
                            nan = True
        for s in range(n):
            ob[s] = 0.0
        for h in range(H if n > 0 else 0):           # softmax over the tokens, summed over the heads
            lh = logits[h]
            m = mx[h]
            z = np.float32(0.0)
            for s in range(n):
                e = _exp_nonpositive(lh[s] - m)
                lh[s] = e
                z += e
            inv = np.float32(1.0) / z
            for s in range(n):
                ob[s] += lh[s] * inv
        if nan:                                      # a NaN byte: the request's scores are NaN, as in the reference
            for s in range(n):
                ob[s] = np.nan
        for s in range(n, L):
            ob[s] = -np.inf


def indexer_scores(q, codes, scales, lengths, out) -> None:
    """Shapes as in :mod:`.reference` (C-contiguous NumPy arrays, checked by the public wrapper)."""
    H, L = q.shape[1], codes.shape[1]
    logits = scratch("gqa_indexer_logits", (H, L))    # per-head logits, then their exponentials
    _scores(q, codes, scales, lengths, np.float32(1.0 / np.sqrt(q.shape[2])), logits, out)
