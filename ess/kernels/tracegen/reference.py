"""The oracle of the trace-generator kernels, written to be read: the two models of
:func:`ess.tracegen.synthetic_streams` query token by query token, with Python sets and lists where the kernels keep
stamp arrays, and the same random numbers drawn in the same order, so that both write the same streams (signatures
in :mod:`.numba_cpu`).

Each query token ``q`` (the ``n_warm`` warmup positions, then ``mtp`` per decode step) selects the ``ns`` sinks, the
last ``nw`` tokens of its context (the local window) and ``need`` "free" entries from ``[ns, hi)``
(:func:`token_geometry`); a warmup token's set is a warmup window, a decode step's set is the union of its tokens'
sets in the order they first select an entry (:func:`_write_sets`).
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["gen_uniform", "gen_drift", "token_geometry"]

_MASK = (1 << 64) - 1           # the kernels' uint64 arithmetic wraps modulo 2**64


def token_geometry(q, n_warm, mtp, context_len, n_sinks, window, k):
    """``(ctx, ns, nw, hi, need)``: the context query token ``q`` sees, its sinks, its window, the end of its free
    range ``[ns, hi)`` and how many free entries it selects."""
    if q < n_warm:                            # prefill position context_len - n_warm + q attends to [0, pos]
        ctx = context_len - n_warm + q + 1
    else:                                     # decode step t reads the cache that exists before the step
        ctx = context_len + ((q - n_warm) // mtp) * mtp
    ns = min(n_sinks, k)
    nw = min(window, k - ns)
    return ctx, ns, nw, ctx - nw, k - ns - nw


def _write_sets(sets, n_warm, mtp, warm_out, step_out) -> None:
    """Token sets (one list per query token, in order) into the warmup windows and the steps' unions."""
    for q, s in enumerate(sets[:n_warm]):
        warm_out[q, :len(s)] = s
    decode = sets[n_warm:]
    for t in range(len(decode) // mtp):
        union = list(dict.fromkeys(x for s in decode[t * mtp:(t + 1) * mtp] for x in s))   # first selection order
        step_out[t] = -1
        step_out[t, :len(union)] = union


# ------------------------------------------------------------------------------------------------------- uniform
class _XorShift64Star:
    """xorshift64* (Vigna 2016, "An experimental exploration of Marsaglia's xorshift generators"), seeded as the
    kernel seeds it."""

    def __init__(self, seed: int):
        self.x = (int(seed) * 0x9E3779B97F4A7C15 + 1) & _MASK

    def rand(self) -> float:
        """A uniform float in [0, 1) from the top 53 bits."""
        x = self.x
        x ^= x >> 12
        x ^= (x << 25) & _MASK
        x ^= x >> 27
        self.x = x
        return float(((x * 2685821657736338717) & _MASK) >> 11) * (1.0 / 9007199254740992.0)

    def randint(self, n: int) -> int:
        return min(int(self.rand() * n), n - 1)

    def draw(self, lo: int, hi: int, cdf, use_cdf: bool) -> int:
        """A position in [lo, hi): uniform, or by the popularity weights whose cumulative sums are ``cdf``."""
        if not use_cdf:
            return lo + self.randint(hi - lo)
        u = cdf[lo] + self.rand() * (cdf[hi] - cdf[lo])
        return int(min(max(np.searchsorted(cdf, u, side="right") - 1, lo), hi - 1))


def gen_uniform(seed, context_len, k, mtp, steps, n_warm, r, n_sinks, window, cdf, use_cdf, max_draws, warm_out,
                step_out) -> int:
    """The uniform model: each token keeps a random subset of the previous token's free entries -- as many as make
    its overlap with the previous set ``round(r k)``, the sinks and the shifted window counted -- and draws the rest,
    distinct, among the entries the previous set did not hold (any entry when there are too few of those)."""
    rng = _XorShift64Star(seed)
    sets = []
    free: list[int] = []                      # the previous token's free entries, in the kernel's array order
    prev_ctx = None
    for q in range(n_warm + steps * mtp):
        ctx, ns, nw, hi, need = token_geometry(q, n_warm, mtp, context_len, n_sinks, window, k)
        if prev_ctx is None:
            keep, previous = 0, set()
        else:
            # the previous set inside the free range: its free entries and the window tokens that left the window
            previous = set(free) | set(range(max(prev_ctx - nw, ns), min(ctx - nw, prev_ctx)))
            structural = ns + max(nw - (ctx - prev_ctx), 0)         # sinks and the window's shared part
            keep = max(0, min(int(np.rint(r * k)) - structural, len(free), need))
        for i in range(keep):                 # a partial Fisher-Yates shuffle picks the kept ones
            j = i + rng.randint(len(free) - i)
            free[i], free[j] = free[j], free[i]
        new = free[:keep]
        taken = set(new)
        strict = (hi - ns) - len(previous) >= need - keep        # room to draw only entries the previous set lacked
        draws = 0
        while len(new) < need:
            draws += 1
            if draws > max_draws * need:
                return -1                     # the outputs are left undefined, as the kernel leaves them
            x = rng.draw(ns, hi, cdf, use_cdf)
            if x in taken or (strict and x in previous):
                continue
            taken.add(x)
            new.append(x)
        free = new
        sets.append(list(range(ns)) + free + list(range(ctx - nw, ctx)))
        prev_ctx = ctx
    _write_sets(sets, n_warm, mtp, warm_out, step_out)
    return 0


# --------------------------------------------------------------------------------------------------------- drift
def _innovation_index(seed: int, q: int, xs: np.ndarray) -> np.ndarray:
    """The 16-bit index into the table of discretised N(0, 1) values of each token ``xs`` at query token ``q``:
    splitmix64's finaliser (Steele et al. 2014, "Fast splittable pseudorandom number generators") of a key of
    (seed, q) plus x times the golden ratio's 64-bit constant, top 16 bits (counter-based: a token's draw does not
    depend on which other tokens are simulated)."""
    key = np.uint64((int(seed) * 0xD1B54A32D192ED03 + (q + 1) * 0x8CB92BA72F3D8DD7) & _MASK)
    z = key + xs.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)             # uint64 arrays wrap, as the kernel
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(48)).astype(np.int64)


def gen_drift(seed, base, noise, cand, context_len, k, mtp, steps, n_warm, pi, rho, n_sinks, window, table, warm_out,
              step_out) -> float:
    """The score-drift model: token x scores ``sqrt(pi) base[x] + sqrt(1 - pi) noise[x]``; at every query token
    after the first, the noise of the candidates in the free range moves one AR(1) step
    ``noise = rho noise + sqrt(1 - rho^2) eps`` (``noise`` is updated in place), and the free entries are the
    ``need`` best-scoring candidates, ties to the lower position. Only the tokens of ``cand`` (sorted) are
    candidates. Returns the lowest score of a selected free entry, or -inf when the free range holds fewer
    candidates than ``need``."""
    a, cn, se = math.sqrt(pi), math.sqrt(1.0 - pi), math.sqrt(max(1.0 - rho * rho, 0.0))
    sets = []
    lowest = math.inf
    for q in range(n_warm + steps * mtp):
        ctx, ns, nw, hi, need = token_geometry(q, n_warm, mtp, context_len, n_sinks, window, k)
        picked = np.empty(0, np.int64)
        if need > 0:
            xs = cand[(cand >= ns) & (cand < hi)]                          # the candidates in the free range
            if q > 0 and rho < 1.0:
                noise[xs] = rho * noise[xs] + se * table[_innovation_index(seed, q, xs)]
            if xs.size < need:
                return -math.inf              # the outputs are left undefined, as the kernel leaves them
            score = a * base[xs] + cn * noise[xs]
            best = np.lexsort((xs, -score))[:need]                          # highest first, ties by position
            picked = np.sort(xs[best])
            lowest = min(lowest, float(score[best[-1]]))
        sets.append(list(range(ns)) + picked.tolist() + list(range(ctx - nw, ctx)))
    _write_sets(sets, n_warm, mtp, warm_out, step_out)
    return lowest
