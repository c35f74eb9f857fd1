"""Numba kernels of the synthetic trace generators (CPU): one (request, layer) stream per call, the same signatures
as :mod:`.reference`::

    gen_uniform(seed, context_len, k, mtp, steps, n_warm, r, n_sinks, window, cdf, use_cdf, max_draws,
                warm_out, step_out) -> int      0, or -1 when a token's free entries took > max_draws draws each
    gen_drift(seed, base, noise, cand, context_len, k, mtp, steps, n_warm, pi, rho, n_sinks, window, table,
              warm_out, step_out) -> float      the lowest free-entry threshold met (-inf: too few candidates)

    warm_out  (n_warm, k) int32          the warmup windows (query tokens 0 .. n_warm-1), written
    step_out  (steps, mtp * k) int32     each decode step's union of its mtp tokens' sets, -1 padded, written

What both generators share is written once (``token_geometry``, ``emit``) and inlined into both. The models, their
parameters and why are :func:`ess.tracegen.synthetic_streams`'s; it validates and calls these.
"""
from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["gen_uniform", "gen_drift"]


@njit(cache=True, inline="always")
def emit(cur, k, q, n_warm, mtp, union_mark, warm_out, step_out):
    """Query token ``q``'s selected set ``cur[:k]`` becomes warmup window ``q`` (q < n_warm), or joins the union of
    decode step ``(q - n_warm) // mtp`` (MTP: the step's query tokens select the union of their sets;
    ``union_mark`` remembers which step last took a token)."""
    if q < n_warm:
        for i in range(k):
            warm_out[q, i] = cur[i]
        return
    t = (q - n_warm) // mtp
    fill = 0
    if (q - n_warm) % mtp == 0:
        for i in range(step_out.shape[1]):
            step_out[t, i] = -1
    else:
        while fill < step_out.shape[1] and step_out[t, fill] >= 0:
            fill += 1
    for i in range(k):
        x = cur[i]
        if union_mark[x] != t + 1:
            union_mark[x] = t + 1
            step_out[t, fill] = x
            fill += 1


@njit(cache=True, inline="always")
def token_geometry(q, n_warm, mtp, context_len, n_sinks, window, k):
    """Context length seen by query token ``q``, sinks, window, the free range's end ``hi`` (free range
    ``[ns, hi)``) and how many free entries it selects."""
    if q < n_warm:                        # prefill position context_len - n_warm + q attends to [0, pos]
        ctx = context_len - n_warm + q + 1
    else:                                 # decode step t reads the cache that exists before the step
        ctx = context_len + ((q - n_warm) // mtp) * mtp
    ns = min(n_sinks, k)
    nw = min(window, k - ns)
    return ctx, ns, nw, ctx - nw, k - ns - nw


@njit(cache=True, inline="always")
def rand(state):
    """xorshift64* (Vigna 2016, "An experimental exploration of Marsaglia's xorshift generators"): a uniform
    float in [0, 1). Fast and reproducible; the stream is seeded per (request, layer)."""
    x = state[0]
    x ^= x >> np.uint64(12)
    x ^= x << np.uint64(25)
    x ^= x >> np.uint64(27)
    state[0] = x
    return float((x * np.uint64(2685821657736338717)) >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True, inline="always")
def randint(state, n):
    return min(int(rand(state) * n), n - 1)


@njit(cache=True)
def draw(state, lo, hi, cdf, use_cdf):
    if use_cdf:
        u = cdf[lo] + rand(state) * (cdf[hi] - cdf[lo])
        x = np.searchsorted(cdf, u, side="right") - 1
        if x < lo:
            x = lo
        if x >= hi:
            x = hi - 1
        return x
    return lo + randint(state, hi - lo)


@njit(cache=True, nogil=True)
def gen_uniform(seed, context_len, k, mtp, steps, n_warm, r, n_sinks, window, cdf, use_cdf, max_draws, warm_out,
                step_out):
    """One (request, layer) stream. Fills warm_out (n_warm, k) and step_out (steps, mtp*k), -1 padded. Returns
    0, or -1 when a token's free entries took more than ``max_draws`` draws each (a popularity too
    skewed: the draw of distinct entries by rejection would not end)."""
    state = np.empty(1, np.uint64)
    state[0] = np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(1)   # never 0
    n_pos = context_len + steps * mtp
    prev_mark = np.zeros(n_pos, np.int64)    # == g: in the previous query token's set
    chosen = np.zeros(n_pos, np.int64)       # == g: chosen for the current token
    union_mark = np.zeros(n_pos, np.int64)   # == t+1: in the union of decode step t
    free = np.empty(k, np.int64)             # current token's free entries (not sink, not window)
    nfree = 0
    newfree = np.empty(k, np.int64)
    cur = np.empty(k, np.int64)
    prev_ctx = -1
    g = 0
    n_tokens = n_warm + steps * mtp
    for q in range(n_tokens):
        ctx, ns, nw, hi, need = token_geometry(q, n_warm, mtp, context_len, n_sinks, window, k)
        g += 1
        # previous set's members inside the free range: previous free entries + window tokens that left it
        if prev_ctx >= 0:
            for i in range(nfree):
                prev_mark[free[i]] = g
            for x in range(max(prev_ctx - nw, ns), min(ctx - nw, prev_ctx)):
                prev_mark[x] = g
            shift = ctx - prev_ctx
            struct_overlap = ns + max(nw - shift, 0)
            keep = int(np.rint(r * k)) - struct_overlap
            keep = max(0, min(keep, nfree, need))
        else:
            keep = 0
        # keep a random subset of the previous free entries (partial Fisher-Yates)
        for i in range(keep):
            j = i + randint(state, nfree - i)
            tmp = free[i]
            free[i] = free[j]
            free[j] = tmp
            newfree[i] = free[i]
            chosen[free[i]] = g
        n = keep
        n_excl = 0
        if prev_ctx >= 0:
            n_excl = nfree + max(0, min(ctx - nw, prev_ctx) - max(prev_ctx - nw, ns))
        strict = (hi - ns) - n_excl >= need - keep   # enough room to draw only entries the previous set lacked
        draws = 0
        while n < need:
            draws += 1
            if draws > max_draws * need:              # a popularity too skewed to find distinct entries
                return -1
            x = draw(state, ns, hi, cdf, use_cdf)
            if chosen[x] == g:
                continue
            if strict and prev_mark[x] == g:
                continue
            chosen[x] = g
            newfree[n] = x
            n += 1
        nfree = need
        for i in range(need):
            free[i] = newfree[i]
        # the token's set: sinks, free entries, local window
        c = 0
        for x in range(ns):
            cur[c] = x
            c += 1
        for i in range(need):
            cur[c] = free[i]
            c += 1
        for x in range(ctx - nw, ctx):
            cur[c] = x
            c += 1
        emit(cur, k, q, n_warm, mtp, union_mark, warm_out, step_out)
        prev_ctx = ctx
    return 0


@njit(cache=True, inline="always")
def collect(cand, j0, j1, a, base, cn, noise, lo, buf_idx, buf_val):
    """Score the candidates cand[j0:j1] with their current noise; keep those >= lo in buf_idx/buf_val (in
    position order). Returns how many were kept."""
    cnt = 0
    for j in range(j0, j1):
        x = cand[j]
        s = a * base[x] + cn * noise[x]
        if s >= lo:
            buf_idx[cnt] = x
            buf_val[cnt] = s
            cnt += 1
    return cnt


@njit(cache=True, nogil=True)
def gen_drift(seed, base, noise, cand, context_len, k, mtp, steps, n_warm, pi, rho, n_sinks, window,
              table, warm_out, step_out):
    """One (request, layer) stream of the score-drift model; fills warm_out (n_warm, k) and step_out
    (steps, mtp*k), -1 padded. ``base``/``noise`` (n_pos,) hold each token's base score and its noise at the
    first query token (standard normal); ``noise`` is updated in place (AR(1), one update per query token).
    Only the tokens in ``cand`` (sorted positions) are simulated; every other token is never selected.
    Returns the lowest free-entry threshold met (the score of the weakest selected free entry)."""
    n_pos = base.shape[0]
    a = np.sqrt(pi)
    cn = np.sqrt(1.0 - pi)
    se = np.sqrt(max(1.0 - rho * rho, 0.0))
    nc = cand.shape[0]
    buf_idx = np.empty(nc, np.int64)
    buf_val = np.empty(nc, np.float64)
    union_mark = np.zeros(n_pos, np.int64)
    cur = np.empty(k, np.int64)
    theta = -np.inf                            # last token's threshold (score of the need-th free entry)
    delta = np.inf                             # collect scores >= theta - delta, then cut exactly
    lowest = np.inf
    n_tokens = n_warm + steps * mtp
    for q in range(n_tokens):
        ctx, ns, nw, hi, need = token_geometry(q, n_warm, mtp, context_len, n_sinks, window, k)
        key = np.uint64(seed) * np.uint64(0xD1B54A32D192ED03) + np.uint64(q + 1) * np.uint64(0x8CB92BA72F3D8DD7)
        c = 0
        for x in range(ns):
            cur[c] = x
            c += 1
        j0 = 0
        while j0 < nc and cand[j0] < ns:
            j0 += 1
        j1 = j0
        while j1 < nc and cand[j1] < hi:
            j1 += 1
        if need > 0:
            lo = theta - delta
            cnt = 0
            if q > 0 and rho < 1.0:           # one pass: move the noise, score, keep candidates >= lo
                for j in range(j0, j1):
                    x = cand[j]
                    # innovation: splitmix64's finaliser (Steele et al. 2014, "Fast splittable
                    # pseudorandom number generators") of key + x * golden -- counter-based, so a token's draw
                    # does not depend on which other tokens are simulated -- whose top 16 bits index the
                    # table of discretised N(0, 1) values (_normal_table)
                    z = key + np.uint64(x) * np.uint64(0x9E3779B97F4A7C15)
                    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
                    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
                    z = z ^ (z >> np.uint64(31))
                    n = rho * noise[x] + se * table[np.int64(z >> np.uint64(48))]
                    noise[x] = n
                    s = a * base[x] + cn * n
                    if s >= lo:
                        buf_idx[cnt] = x
                        buf_val[cnt] = s
                        cnt += 1
            else:
                cnt = collect(cand, j0, j1, a, base, cn, noise, lo, buf_idx, buf_val)
            while cnt < need:                 # too few above lo: widen and rescan (no noise update)
                if j1 - j0 < need:
                    return -np.inf            # fewer candidates than free entries: the caller falls back
                delta = 2.0 * delta if delta > 0 else 0.05
                lo = theta - delta
                cnt = collect(cand, j0, j1, a, base, cn, noise, lo, buf_idx, buf_val)
            if cnt > need:
                cut = np.partition(buf_val[:cnt], cnt - need)[cnt - need]
                n_above = 0
                for i in range(cnt):
                    if buf_val[i] > cut:
                        n_above += 1
                ties = need - n_above             # entries equal to the cut, taken in position order
                for i in range(cnt):
                    v = buf_val[i]
                    if v > cut or (v == cut and ties > 0):
                        if v == cut:
                            ties -= 1
                        cur[c] = buf_idx[i]
                        c += 1
            else:
                cut = np.inf
                for i in range(cnt):
                    cur[c] = buf_idx[i]
                    c += 1
                    if buf_val[i] < cut:
                        cut = buf_val[i]
            # the next token collects about 1.25-3 x need: the threshold moves little between tokens
            if delta == np.inf or cnt > 3 * need:
                delta = 0.02
            elif cnt < need + need // 4:
                delta *= 1.5
            theta = cut
            if cut < lowest:
                lowest = cut
        for x in range(ctx - nw, ctx):
            cur[c] = x
            c += 1
        emit(cur, k, q, n_warm, mtp, union_mark, warm_out, step_out)
    return lowest
