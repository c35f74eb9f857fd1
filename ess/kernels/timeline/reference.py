"""NumPy oracle of the simulator's per-layer part (signature in :mod:`ess.kernels.timeline`), written to be read:
every configuration at once, one layer at a time, the operations in the kernel's order (so that the two agree to
the last bit)."""
from __future__ import annotations

import numpy as np

__all__ = ["layer_sums"]


def _first_bad(m, offload, sel) -> int:
    """0, or the code of the first bad miss count in row-major order: 1 negative or not finite, 2 more than the
    entries selected (on a row with offload)."""
    m = np.broadcast_to(m, (offload.size, m.shape[1]))
    with np.errstate(invalid="ignore"):
        not_finite = ~((m >= 0.0) & (m < np.inf))
        too_many = offload[:, None] & (m > sel[:, None] + 1e-9)      # the kernel's tolerance of 1e-9 misses
    bad = not_finite | too_many
    if not bad.any():
        return 0
    first = np.unravel_index(np.argmax(bad), bad.shape)
    return 1 if not_finite[first] else 2


def layer_sums(m, offload, k_h, d, bm, I, Ih, p, a, ah2, o, merge, fa, ab, ob, be, ent, spe, sel, comp_d, comp_m,
               comm_m, dense, per_layer, layer_over, choice, layers, layers0) -> int:
    bad = _first_bad(m, offload, sel)
    if bad:
        return bad
    # per configuration: the constants of the three formulas (ess.sim.timeline.offload_overhead_s)
    per_block = bm * ab                                  # one more entry block for every request of the micro-batch
    launch = fa + per_block * ob                         # a launch over no entries
    da_own = merge + 2.0 * launch + per_block * ent / be - a       # a_hit + a_miss - a, plus the merge
    da_d = np.maximum(d - o, 0.0)
    dba_own = (2.0 * Ih - I) + (2.0 * ah2 - a)
    dba_2 = p + ah2
    dba_d = np.maximum(d - ah2, 0.0)
    tot = np.zeros(offload.size)
    tot0 = np.zeros(offload.size)
    for l in range(layer_over.shape[1]):
        x = np.broadcast_to(m[:, l], offload.shape)     # (N,) misses of this layer
        with np.errstate(all="ignore"):                  # rows without offload may divide by 0 selected entries
            none = x * k_h + d
            a_hit = launch + per_block * (ent - spe * x / sel) / be          # the misses among the selected
            da = da_own + np.maximum(x * k_h - p - a_hit, 0.0) + da_d
            h2 = x * k_h / 2
            dba = dba_own + np.maximum(h2 - Ih, 0.0) + np.maximum(h2 - dba_2, 0.0) + dba_d
        if per_layer[l] < 0:                             # the cheapest: ties to none, then DA, then DBA
            s = np.where(da < none, 1, 0)
            s = np.where(dba < np.where(s == 1, da, none), 2, s)
        else:
            s = np.full(offload.size, per_layer[l])
        best = np.choose(s, [none, da, dba])
        best = np.where(offload, best, 0.0)
        s = np.where(offload, s, 0)
        over = 2.0 * best
        layer_over[:, l] = over
        choice[:, l] = s
        if l < dense:
            tot += comp_d + over
            tot0 += comp_d
        else:
            tot += np.maximum(comp_m + over, comm_m)
            tot0 += np.maximum(comp_m, comm_m)
    layers[:] = tot
    layers0[:] = tot0
    return 0
