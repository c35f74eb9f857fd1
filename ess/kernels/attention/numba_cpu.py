"""Numba kernels for the CPU, same signatures as :mod:`.reference` (see there for shapes and conventions).

How they are fast (and why loops, not BLAS): NumPy's ``np.dot`` inside Numba needs SciPy's BLAS bindings, which this
project does not depend on, so the matrix products are written as loops that LLVM vectorises (``fastmath``), with
register blocking so that each value loaded feeds several fused multiply-adds:

* **indexer**: one task per (request, chunk of 256 tokens); four keys at a time are dequantised from FP8 through a
  256-entry table into a small buffer (fused: no dequantised copy of the cache is ever written), then every indexer
  head's query is dotted with the four keys (one load of q feeds four FMAs). The per-key scale is applied after the
  ReLU, once per key instead of once per value: ``ReLU(s x) = s ReLU(x)`` holds only for ``s >= 0`` (the reference
  applies it before the ReLU), so :func:`ess.attention.indexer_scores` rejects negative or non-finite scales.
* **sparse MLA**: the selected entries of each request are gathered and dequantised once (parallel over entries) into
  a reused float32 (K, 576) buffer; then one task per (request, block of 16 heads) computes the scores with entries
  in the outer loop and a 4-head x 2-entry register block (six loads feed eight FMAs), the softmax, and ``P V`` with
  a 2-head x 4-entry block over the 512-wide output rows of the head block (the block's outputs stay in L1).

Arithmetic is float32 (accumulation order differs from the float64 reference: compare with a tolerance).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ...quant import FP8_E4M3_VALUES
from .. import scratch

__all__ = ["indexer_scores", "sparse_mla_decode"]

_LUT = np.ascontiguousarray(FP8_E4M3_VALUES, dtype=np.float32)   # immutable table, safe to share between threads
_LUT.setflags(write=False)
_CHUNK = 256        # tokens per indexer task
_HEAD_BLOCK = 16    # query heads per sparse-MLA task


@njit(inline="always")
def _u32(row, o):
    return (np.uint32(row[o]) | (np.uint32(row[o + 1]) << np.uint32(8)) | (np.uint32(row[o + 2]) << np.uint32(16))
            | (np.uint32(row[o + 3]) << np.uint32(24)))


@njit(parallel=True, fastmath=True, cache=True)
def _indexer(q, w, keys, lengths, lut, out):
    B, Hi, D = q.shape
    L = keys.shape[1]
    n_chunks = (L + _CHUNK - 1) // _CHUNK
    for task in prange(B * n_chunks):
        b = task // n_chunks
        s0 = (task % n_chunks) * _CHUNK
        s1 = min(s0 + _CHUNK, L)
        n = lengths[b]
        bits = np.empty(1, np.uint32)
        fbits = bits.view(np.float32)
        r = np.empty((4, D), np.float32)
        sc = np.empty(4, np.float32)
        qb = q[b]
        wb = w[b]
        s = s0
        while s < s1:
            m = min(4, s1 - s)
            for i in range(m):
                row = keys[b, s + i]
                for d in range(D):
                    r[i, d] = lut[row[d]]
                bits[0] = _u32(row, D)
                sc[i] = fbits[0]
            if m == 4:
                r0 = r[0]
                r1 = r[1]
                r2 = r[2]
                r3 = r[3]
                c0 = np.float32(0.0)
                c1 = np.float32(0.0)
                c2 = np.float32(0.0)
                c3 = np.float32(0.0)
                for j in range(Hi):
                    qj = qb[j]
                    a0 = np.float32(0.0)
                    a1 = np.float32(0.0)
                    a2 = np.float32(0.0)
                    a3 = np.float32(0.0)
                    for d in range(D):
                        x = qj[d]
                        a0 += x * r0[d]
                        a1 += x * r1[d]
                        a2 += x * r2[d]
                        a3 += x * r3[d]
                    wj = wb[j]
                    c0 += wj * max(a0, np.float32(0.0))
                    c1 += wj * max(a1, np.float32(0.0))
                    c2 += wj * max(a2, np.float32(0.0))
                    c3 += wj * max(a3, np.float32(0.0))
                out[b, s] = c0 * sc[0]
                out[b, s + 1] = c1 * sc[1]
                out[b, s + 2] = c2 * sc[2]
                out[b, s + 3] = c3 * sc[3]
            else:
                for i in range(m):
                    ri = r[i]
                    c = np.float32(0.0)
                    for j in range(Hi):
                        qj = qb[j]
                        a = np.float32(0.0)
                        for d in range(D):
                            a += qj[d] * ri[d]
                        c += wb[j] * max(a, np.float32(0.0))
                    out[b, s + i] = c * sc[i]
            s += m
        for t in range(max(s0, n), s1):
            out[b, t] = -np.inf


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"attention kernel arguments: {what}")


def _arrays(**arrays) -> None:
    for name, (a, dtype, ndim) in arrays.items():
        if not isinstance(a, np.ndarray) or a.dtype != dtype or a.ndim != ndim or not a.flags.c_contiguous:
            raise TypeError(f"attention kernel arguments: {name} must be a C-contiguous {ndim}-D {np.dtype(dtype)} "
                            f"array")


def indexer_scores(q, w, keys, lengths, out) -> None:
    """Shapes as in :mod:`.reference`; checked here because the kernel runs without bounds checks."""
    _arrays(q=(q, np.float32, 3), w=(w, np.float32, 2), keys=(keys, np.uint8, 3), lengths=(lengths, np.int64, 1),
            out=(out, np.float32, 2))
    B, Hi, D = q.shape
    _require(w.shape == (B, Hi), f"w must have shape {(B, Hi)}, got {w.shape}")
    _require(keys.shape[0] == B and keys.shape[2] == D + 4, f"keys must have shape (B={B}, L, D + 4 = {D + 4}), "
                                                             f"got {keys.shape}")
    _require(lengths.shape == (B,) and out.shape == (B, keys.shape[1]), "lengths must be (B,) and out (B, L)")
    _indexer(q, w, keys, lengths, _LUT, out)


@njit(parallel=True, fastmath=True, cache=True)
def _gather_dequant(pool, comp, nvalid, fp8, kv_rank, rope_dim, tile, lut, kv):
    B, K = comp.shape
    for task in prange(B * K):
        b = task // K
        k = task % K
        if k >= nvalid[b]:
            continue
        row = pool[comp[b, k]]
        dst = kv[b, k]
        bits = np.empty(1, np.uint32)
        fbits = bits.view(np.float32)
        if fp8:
            n_scales = kv_rank // tile
            for t in range(n_scales):
                bits[0] = _u32(row, kv_rank + 4 * t)
                sc = fbits[0]
                for i in range(t * tile, (t + 1) * tile):
                    dst[i] = lut[row[i]] * sc
            ro = kv_rank + 4 * n_scales
        else:
            for i in range(kv_rank):
                bits[0] = (np.uint32(row[2 * i]) | (np.uint32(row[2 * i + 1]) << np.uint32(8))) << np.uint32(16)
                dst[i] = fbits[0]
            ro = 2 * kv_rank
        for i in range(rope_dim):
            bits[0] = (np.uint32(row[ro + 2 * i]) | (np.uint32(row[ro + 2 * i + 1]) << np.uint32(8))) << np.uint32(16)
            dst[kv_rank + i] = fbits[0]


@njit(parallel=True, fastmath=True, cache=True)
def _mla(q, kv, nvalid, sm_scale, kv_rank, out, lse):
    B, H, Dqk = q.shape
    n_blocks = (H + _HEAD_BLOCK - 1) // _HEAD_BLOCK
    for task in prange(B * n_blocks):
        b = task // n_blocks
        h0 = (task % n_blocks) * _HEAD_BLOCK
        h1 = min(h0 + _HEAD_BLOCK, H)
        nh = h1 - h0
        n = nvalid[b]
        if n == 0:
            for h in range(h0, h1):
                out[b, h, :] = 0.0
                lse[b, h] = -np.inf
            continue
        qb = q[b]
        kvb = kv[b]
        s = np.empty((nh, n), np.float32)
        # scores: entries in the outer loop, a 4-head x 2-entry register block (6 loads feed 8 FMAs)
        h4 = h0 + nh - nh % 4
        n2 = n - n % 2
        for k in range(0, n2, 2):
            r0 = kvb[k]
            r1 = kvb[k + 1]
            for h in range(h0, h4, 4):
                q0 = qb[h]
                q1 = qb[h + 1]
                q2 = qb[h + 2]
                q3 = qb[h + 3]
                a0 = np.float32(0.0)
                a1 = np.float32(0.0)
                a2 = np.float32(0.0)
                a3 = np.float32(0.0)
                c0 = np.float32(0.0)
                c1 = np.float32(0.0)
                c2 = np.float32(0.0)
                c3 = np.float32(0.0)
                for d in range(Dqk):
                    x = r0[d]
                    y = r1[d]
                    a0 += q0[d] * x
                    a1 += q1[d] * x
                    a2 += q2[d] * x
                    a3 += q3[d] * x
                    c0 += q0[d] * y
                    c1 += q1[d] * y
                    c2 += q2[d] * y
                    c3 += q3[d] * y
                i = h - h0
                s[i, k] = a0
                s[i + 1, k] = a1
                s[i + 2, k] = a2
                s[i + 3, k] = a3
                s[i, k + 1] = c0
                s[i + 1, k + 1] = c1
                s[i + 2, k + 1] = c2
                s[i + 3, k + 1] = c3
            for h in range(h4, h1):
                qh = qb[h]
                a = np.float32(0.0)
                c = np.float32(0.0)
                for d in range(Dqk):
                    a += qh[d] * r0[d]
                    c += qh[d] * r1[d]
                s[h - h0, k] = a
                s[h - h0, k + 1] = c
        for k in range(n2, n):
            row = kvb[k]
            for h in range(h0, h1):
                qh = qb[h]
                a = np.float32(0.0)
                for d in range(Dqk):
                    a += qh[d] * row[d]
                s[h - h0, k] = a
        # softmax, in place: s becomes the unnormalised probabilities
        denom = np.empty(nh, np.float32)
        for i in range(nh):
            si = s[i]
            m = np.float32(-np.inf)
            for k in range(n):
                si[k] = si[k] * sm_scale
                m = max(m, si[k])
            tot = np.float32(0.0)
            for k in range(n):
                e = np.exp(si[k] - m)
                si[k] = e
                tot += e
            denom[i] = tot
            lse[b, h0 + i] = m + np.log(tot)
        # P V: a 2-head x 4-entry block per pass over the output rows (4 value loads feed 8 FMAs)
        o = np.zeros((nh, kv_rank), np.float32)
        n4 = n - n % 4
        nh2 = nh - nh % 2
        for k in range(0, n4, 4):
            v0 = kvb[k]
            v1 = kvb[k + 1]
            v2 = kvb[k + 2]
            v3 = kvb[k + 3]
            for i in range(0, nh2, 2):
                p0 = s[i, k]
                p1 = s[i, k + 1]
                p2 = s[i, k + 2]
                p3 = s[i, k + 3]
                g0 = s[i + 1, k]
                g1 = s[i + 1, k + 1]
                g2 = s[i + 1, k + 2]
                g3 = s[i + 1, k + 3]
                oi = o[i]
                oj = o[i + 1]
                for d in range(kv_rank):
                    x0 = v0[d]
                    x1 = v1[d]
                    x2 = v2[d]
                    x3 = v3[d]
                    oi[d] += p0 * x0 + p1 * x1 + p2 * x2 + p3 * x3
                    oj[d] += g0 * x0 + g1 * x1 + g2 * x2 + g3 * x3
            for i in range(nh2, nh):
                p0 = s[i, k]
                p1 = s[i, k + 1]
                p2 = s[i, k + 2]
                p3 = s[i, k + 3]
                oi = o[i]
                for d in range(kv_rank):
                    oi[d] += p0 * v0[d] + p1 * v1[d] + p2 * v2[d] + p3 * v3[d]
        for k in range(n4, n):
            v = kvb[k]
            for i in range(nh):
                p = s[i, k]
                oi = o[i]
                for d in range(kv_rank):
                    oi[d] += p * v[d]
        for i in range(nh):
            inv = np.float32(1.0) / denom[i]
            for d in range(kv_rank):
                out[b, h0 + i, d] = o[i, d] * inv


def _workspace(shape: tuple) -> np.ndarray:
    """A float32 scratch buffer for the dequantised entries, reused by later calls of the same thread
    (:func:`ess.kernels.scratch`: a fresh 4.7 MB buffer per call adds page faults; the measurement is in
    ``benchmarks/README.md``). Contents are overwritten before they are read."""
    return scratch("sparse_mla_entries", shape, np.float32)


def compact_indices(indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Valid (>= 0) indices of each row moved to the front in their order, and the count per row."""
    valid = indices >= 0
    order = np.argsort(~valid, axis=1, kind="stable")
    comp = np.ascontiguousarray(np.take_along_axis(indices, order, axis=1))
    return comp, valid.sum(axis=1).astype(np.int64)


def sparse_mla_decode(q, pool, indices, sm_scale, fp8, kv_rank, rope_dim, tile, out, lse) -> None:
    """Shapes as in :mod:`.reference`; checked here (the entry layout against ``pool``'s row width, every index
    against ``pool``'s rows) because the kernels run without bounds checks."""
    _arrays(q=(q, np.float32, 3), pool=(pool, np.uint8, 2), indices=(indices, np.int64, 2), out=(out, np.float32, 3),
            lse=(lse, np.float32, 2))
    B, H, Dqk = q.shape
    _require(kv_rank > 0 and rope_dim >= 0 and tile > 0 and kv_rank % tile == 0,
             f"kv_rank ({kv_rank}) must be a positive multiple of tile ({tile}), rope_dim >= 0")
    entry = kv_rank + 4 * (kv_rank // tile) + 2 * rope_dim if fp8 else 2 * (kv_rank + rope_dim)
    _require(pool.shape[1] == entry, f"pool rows must be {entry} B for this layout, got {pool.shape[1]}")
    _require(Dqk == kv_rank + rope_dim, f"q's last axis must be kv_rank + rope_dim = {kv_rank + rope_dim}, got {Dqk}")
    _require(indices.shape[0] == B and out.shape == (B, H, kv_rank) and lse.shape == (B, H),
             "indices must be (B, K), out (B, H, kv_rank) and lse (B, H)")
    if indices.size:
        lo, hi = int(indices.min()), int(indices.max())
        _require(lo >= -1 and hi < pool.shape[0], f"indices must lie in [-1, {pool.shape[0]}), got [{lo}, {hi}]")
    B, K = indices.shape
    comp, nvalid = compact_indices(indices)
    kv = _workspace((B, K, kv_rank + rope_dim))
    _gather_dequant(pool, comp, nvalid, bool(fp8), kv_rank, rope_dim, tile, _LUT, kv)
    _mla(q, kv, nvalid, np.float32(sm_scale), kv_rank, out, lse)
