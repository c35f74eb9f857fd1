"""The trace-generator kernel family (ess.kernels.tracegen): both Numba generators against the Python reference
on random settings -- tiny contexts where the free range is barely larger than K, no free entry at all (the sinks
and the window fill K), one step, MTP unions, a popularity skew, candidate subsets too small -- stream for stream;
and what the streams must hold whatever the backend."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ess.kernels import tracegen as K
from ess.tracegen import _normal_table

REF, FAST = K.get("reference"), K.get("numba")


def _outputs(n_warm, steps, mtp, k):
    return np.full((n_warm, k), -9, np.int32), np.full((steps, mtp * k), -9, np.int32)


def _uniform(mod, seed, L, k, mtp, steps, n_warm, r, sinks, window, sigma, max_draws=10_000):
    n_pos = L + steps * mtp
    if sigma > 0:
        w = np.exp(sigma * np.random.default_rng(seed).standard_normal(n_pos))
        cdf = np.concatenate([[0.0], np.cumsum(w)])
    else:
        cdf = np.zeros(1)
    warm, out = _outputs(n_warm, steps, mtp, k)
    ret = mod.gen_uniform(seed, L, k, mtp, steps, n_warm, r, sinks, window, cdf, sigma > 0, max_draws, warm, out)
    return ret, warm, out


def _drift(mod, seed, L, k, mtp, steps, n_warm, pi, rho, sinks, window, keep, ties=False):
    n_pos = L + steps * mtp
    rng = np.random.default_rng(seed)
    base, noise = rng.standard_normal(n_pos), rng.standard_normal(n_pos)
    if ties:                                  # base scores on a coarse grid: with pi = 1 many tie at the threshold
        base = np.round(base * 2) / 2
    cand = np.flatnonzero(rng.random(n_pos) < keep).astype(np.int64)        # sorted, as the caller passes it
    warm, out = _outputs(n_warm, steps, mtp, k)
    ret = mod.gen_drift(seed, base, noise, cand, L, k, mtp, steps, n_warm, pi, rho, sinks, window, _normal_table(),
                        warm, out)
    return ret, warm, out, noise


settings_ = settings(max_examples=60, deadline=None)
geometry = dict(seed=st.integers(0, 2**31 - 1), k=st.integers(1, 12), spare=st.integers(0, 30),
                mtp=st.integers(1, 3), steps=st.integers(1, 8), n_warm=st.integers(0, 4), sinks=st.integers(0, 4),
                window=st.integers(0, 6))


@settings_
@given(r=st.sampled_from([0.0, 0.3, 0.5, 0.77, 1.0]), sigma=st.sampled_from([0.0, 0.0, 1.0, 3.0]), **geometry)
def test_uniform_generator_matches_the_reference(seed, k, spare, mtp, steps, n_warm, sinks, window, r, sigma):
    L = k + n_warm + spare                   # the first warmup window sees at least k tokens
    ref = _uniform(REF, seed, L, k, mtp, steps, n_warm, r, sinks, window, sigma)
    fast = _uniform(FAST, seed, L, k, mtp, steps, n_warm, r, sinks, window, sigma)
    assert fast[0] == ref[0] == 0
    np.testing.assert_array_equal(fast[1], ref[1])
    np.testing.assert_array_equal(fast[2], ref[2])


@settings_
@given(pi=st.sampled_from([0.0, 0.4, 0.9, 1.0]), rho=st.sampled_from([0.0, 0.5, 0.95, 1.0]),
       keep=st.sampled_from([1.0, 1.0, 0.7, 0.2]), ties=st.booleans(), **geometry)
def test_drift_generator_matches_the_reference(seed, k, spare, mtp, steps, n_warm, sinks, window, pi, rho, keep,
                                               ties):
    L = k + n_warm + spare
    ref = _drift(REF, seed, L, k, mtp, steps, n_warm, pi, rho, sinks, window, keep, ties)
    fast = _drift(FAST, seed, L, k, mtp, steps, n_warm, pi, rho, sinks, window, keep, ties)
    assert fast[0] == ref[0]                  # -inf in both when the candidates run short
    if ref[0] > -np.inf:
        for got, want in zip(fast[1:], ref[1:]):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mod", [REF, FAST], ids=["reference", "numba"])
def test_what_every_stream_holds(mod):
    """Each query token's set: the sinks, the window, k entries in all, every one inside its context; each step the
    union of its tokens' sets (so between k and mtp * k entries), distinct, -1 only as trailing padding."""
    L, k, mtp, steps, n_warm, sinks, window = 40, 8, 2, 5, 3, 2, 3
    for ret, warm, out in (_uniform(mod, 7, L, k, mtp, steps, n_warm, 0.5, sinks, window, 0.0),
                           _drift(mod, 7, L, k, mtp, steps, n_warm, 0.6, 0.5, sinks, window, 1.0)[:3]):
        assert ret >= 0 or ret > -np.inf
        for q in range(n_warm):
            ctx = L - n_warm + q + 1
            assert {0, 1} <= set(warm[q]) and set(range(ctx - window, ctx)) <= set(warm[q])
            assert len(set(warm[q])) == k and warm[q].max() < ctx
        for t in range(steps):
            row = out[t]
            n = int((row >= 0).sum())
            assert k <= n <= mtp * k and (row[n:] == -1).all() and len(set(row[:n])) == n
            assert row[:n].max() < L + t * mtp


@pytest.mark.parametrize("mod", [REF, FAST], ids=["reference", "numba"])
def test_edge_cases(mod):
    # no free entry: the sinks and the window fill k, every token of a step selects the same sinks and its window
    ret, warm, out = _uniform(mod, 1, 20, 4, 1, 3, 0, 0.5, 2, 2, 0.0)
    assert ret == 0 and out.tolist() == [[0, 1, 18, 19], [0, 1, 19, 20], [0, 1, 20, 21]]
    ret, _, out_d, _ = _drift(mod, 1, 20, 4, 1, 3, 0, 0.5, 0.5, 2, 2, 1.0)
    assert ret == np.inf and out_d.tolist() == out.tolist()        # no free entry: no threshold met
    # k = the whole context: the first step selects everything it sees, the next 5 of its 6 tokens
    ret, _, out = _uniform(mod, 2, 5, 5, 1, 2, 0, 0.3, 0, 0, 0.0)
    assert ret == 0 and sorted(out[0]) == [0, 1, 2, 3, 4] and set(out[1]) < set(range(6))
    # r = 1, no sinks, no window: a token keeps every free entry of the one before (the context grows, the set not)
    ret, _, out = _uniform(mod, 3, 30, 6, 1, 4, 0, 1.0, 0, 0, 0.0)
    assert ret == 0 and all(set(out[t]) == set(out[0]) for t in range(4))
    # ties at the threshold go to the lower positions: base scores all equal (pi = 1: the noise does not count)
    L, k = 30, 5
    rng_base = np.zeros(L + 2)
    warm, out = _outputs(0, 2, 1, k)
    lowest = mod.gen_drift(0, rng_base, np.ones(L + 2), np.arange(L + 2), L, k, 1, 2, 0, 1.0, 0.5, 0, 0,
                           _normal_table(), warm, out)
    assert lowest == 0.0 and out.tolist() == [[0, 1, 2, 3, 4]] * 2
    # too few candidates in the free range: the drift kernel gives up with -inf
    assert _drift(mod, 4, 30, 6, 1, 2, 0, 0.5, 0.5, 0, 0, 0.05)[0] == -np.inf


@pytest.mark.parametrize("mod", [REF, FAST], ids=["reference", "numba"])
def test_a_popularity_too_skewed_gives_up_after_the_draw_limit(mod):
    """A popularity so skewed that almost every draw lands on one entry: with one draw allowed per entry the
    uniform kernel reports -1 instead of drawing on and on."""
    assert _uniform(mod, 5, 200, 20, 1, 3, 0, 0.0, 0, 0, 60.0, max_draws=1)[0] == -1
    assert _uniform(mod, 5, 200, 20, 1, 3, 0, 0.0, 0, 0, 0.0, max_draws=1_000)[0] == 0


def test_no_torch_kernel():
    with pytest.raises(ValueError, match="no torch kernel"):
        K.get("torch")
