"""Numba kernel of the simulator's per-layer part (CPU), fused over the layers of each configuration; the same
signature and arithmetic as :mod:`.reference` (:mod:`ess.kernels.timeline` names the arguments)."""
from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["layer_sums"]


@njit(cache=True, nogil=True)
def layer_sums(m, offload, k_h, d, bm, I, Ih, p, a, ah2, o, merge, fa, ab, ob, be, ent, spe, sel, comp_d, comp_m,
               comm_m, dense, per_layer, layer_over, choice, layers, layers0):
    N, nl = layer_over.shape
    shared = m.shape[0] == 1
    for i in range(N):
        row = 0 if shared else i
        kh, di, ai, si, ei, spi = k_h[i], d[i], a[i], sel[i], ent[i], spe[i]
        on = offload[i]
        # per row: the constants of the three formulas (see offload_overhead_s)
        per_block = bm[i] * ab[i]                 # one more entry block for every request of the micro-batch
        launch = fa[i] + per_block * ob           # a launch over no entries: fixed part + per-request overhead
        da_own = merge[i] + 2.0 * launch + per_block * ei / be - ai    # a_hit + a_miss - a, plus the merge
        da_d = max(di - o[i], 0.0)
        dba_own = (2.0 * Ih[i] - I[i]) + (2.0 * ah2[i] - ai)
        dba_2 = p[i] + ah2[i]
        dba_d = max(di - ah2[i], 0.0)
        tot = 0.0
        tot0 = 0.0                                # the same sum without offload, in the same order
        for l in range(nl):
            x = m[row, l]
            if not (x >= 0.0 and x < np.inf):
                return 1
            s = per_layer[l]
            if not on:
                best = 0.0
                s = 0
            else:
                if x > si + 1e-9:                 # a tolerance of 1e-9 misses for rounding (design choice)
                    return 2
                none = x * kh + di
                a_hit = launch + per_block * (ei - spi * x / si) / be      # misses among the selected
                da = da_own + max(x * kh - p[i] - a_hit, 0.0) + da_d
                h2 = x * kh / 2
                dba = dba_own + max(h2 - Ih[i], 0.0) + max(h2 - dba_2, 0.0) + dba_d
                if s < 0:
                    best, s = none, 0
                    if da < best:
                        best, s = da, 1
                    if dba < best:
                        best, s = dba, 2
                else:
                    best = none if s == 0 else (da if s == 1 else dba)
            over = 2.0 * best
            layer_over[i, l] = over
            choice[i, l] = s
            if l < dense:
                tot += comp_d[i] + over
                tot0 += comp_d[i]
            else:
                tot += max(comp_m[i] + over, comm_m[i])
                tot0 += max(comp_m[i], comm_m[i])
        layers[i] = tot
        layers0[i] = tot0
    return 0
