"""The simulator's per-layer kernel family (ess.kernels.timeline): the Numba kernel against the NumPy reference on
random configurations (shared and per-row misses, offload on and off, fixed and chosen strategies, dense and MoE
layers), to the last bit; ties between the strategies, bad miss counts and the empty batch of configurations."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ess.kernels import timeline as K

REF, FAST = K.get("reference"), K.get("numba")
ROW_ARGS = ("k_h", "d", "bm", "I", "Ih", "p", "a", "ah2", "o", "merge", "fa", "ab")


def _inputs(rng, N, nl, shared, dense, fixed):
    """Random positive seconds of the right order of magnitude, misses up to the entries selected."""
    row = {name: rng.uniform(1e-6, 1e-3, N) for name in ROW_ARGS}
    sel = rng.uniform(100, 4000, N)
    ent = sel * rng.uniform(1.0, 1.5, N)
    spe = sel * rng.uniform(0.5, 1.0, N)
    m = rng.uniform(0, 1, (1 if shared else N, nl)) * (sel.min(initial=100) if shared else sel[:, None])
    per_layer = (rng.integers(0, 3, nl) if fixed else np.full(nl, -1)).astype(np.int8)
    if fixed:
        per_layer[rng.random(nl) < 0.3] = -1                # a mix of fixed and chosen layers
    return dict(m=m, offload=rng.random(N) < 0.7, **row, ob=float(rng.uniform(0, 2)), be=64.0, ent=ent, spe=spe,
                sel=sel, comp_d=rng.uniform(1e-4, 1e-3, N), comp_m=rng.uniform(1e-4, 1e-3, N),
                comm_m=rng.uniform(1e-4, 2e-3, N), dense=dense, per_layer=per_layer)


def _run(mod, args):
    N, nl = args["offload"].size, args["m"].shape[1]
    out = dict(layer_over=np.full((N, nl), -1.0), choice=np.full((N, nl), -1, np.int8), layers=np.full(N, -1.0),
               layers0=np.full(N, -1.0))
    names = ("m", "offload") + ROW_ARGS[:2] + ("bm", "I", "Ih", "p", "a", "ah2", "o", "merge", "fa", "ab", "ob", "be",
                                               "ent", "spe", "sel", "comp_d", "comp_m", "comm_m", "dense", "per_layer")
    bad = mod.layer_sums(*(args[n] for n in names), out["layer_over"], out["choice"], out["layers"], out["layers0"])
    return bad, out


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), N=st.integers(1, 7), nl=st.integers(1, 6), shared=st.booleans(),
       dense=st.integers(0, 6), fixed=st.booleans())
def test_the_kernel_matches_the_reference_to_the_bit(seed, N, nl, shared, dense, fixed):
    args = _inputs(np.random.default_rng(seed), N, nl, shared, dense, fixed)
    bad_r, want = _run(REF, args)
    bad, got = _run(FAST, args)
    assert bad == bad_r == 0
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    assert (got["choice"][~args["offload"]] == 0).all() and (got["layer_over"][~args["offload"]] == 0).all()


@pytest.mark.parametrize("mod", [REF, FAST], ids=["reference", "numba"])
def test_ties_go_to_none_then_da(mod):
    """Every operation free: the three strategies cost 0 each, and the cheapest is "none" (a tie-break that took
    the last of equals would say DBA)."""
    args = _inputs(np.random.default_rng(0), 3, 2, False, 1, False)
    for name in ROW_ARGS + ("comp_d", "comp_m", "comm_m"):
        args[name] = np.zeros(3)
    args["offload"] = np.ones(3, bool)
    bad, out = _run(mod, args)
    assert bad == 0 and (out["choice"] == 0).all() and (out["layer_over"] == 0).all()
    # make DBA cheaper than the others by a margin: it is chosen
    args["Ih"] = args["ah2"] = np.full(3, -1e-6)
    assert (_run(mod, args)[1]["choice"] == 2).all()


@pytest.mark.parametrize("mod", [REF, FAST], ids=["reference", "numba"])
def test_bad_miss_counts(mod):
    args = _inputs(np.random.default_rng(1), 3, 4, False, 2, False)
    args["offload"] = np.ones(3, bool)
    for value, code in ((np.nan, 1), (-1.0, 1), (np.inf, 1), (1e9, 2)):
        a = dict(args, m=args["m"].copy())
        a["m"][1, 2] = value
        assert _run(mod, a)[0] == code
    # the first bad value in row-major order decides: too many at (0, 3) before a NaN at (1, 0)
    a = dict(args, m=args["m"].copy())
    a["m"][0, 3], a["m"][1, 0] = 1e9, np.nan
    assert _run(mod, a)[0] == 2
    # a row without offload is not held to its selected entries, but its counts must still be finite
    a = dict(args, m=args["m"].copy(), offload=np.array([True, False, True]))
    a["m"][1, 0] = 1e9
    assert _run(mod, a)[0] == 0
    a["m"][1, 0] = np.nan
    assert _run(mod, a)[0] == 1


@pytest.mark.parametrize("mod", [REF, FAST], ids=["reference", "numba"])
def test_no_configuration(mod):
    args = _inputs(np.random.default_rng(2), 0, 3, True, 1, False)
    bad, out = _run(mod, args)
    assert bad == 0 and out["layers"].size == 0 and out["layer_over"].shape == (0, 3)


def test_no_torch_kernel():
    with pytest.raises(ValueError, match="no torch kernel"):
        K.get("torch")
