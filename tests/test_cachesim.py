"""Trace-driven cache simulation: exact LRU semantics, Belady's bound, warmup, the misses_per_layer contract."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ess import cachesim as C
from ess.policies import ONLINE_POLICIES, POLICIES, simulate_misses
from ess import locality as LM
from ess import tracegen as G
from ess import traces as T


def random_trace(seed, *, L=60, k=6, steps=25, mtp=1, warm=3, locality=0.0):
    """Random sets, optionally reusing a share of the previous step's set (a little locality)."""
    rng = np.random.default_rng(seed)
    idx = np.full((1, 1, steps, mtp * k), -1, np.int32)
    prev = rng.choice(L, k, replace=False)
    for t in range(steps):
        keep = prev[: int(locality * k)]
        rest = rng.choice(np.setdiff1d(np.arange(L), keep), k * mtp - keep.size, replace=False)
        s = np.concatenate([keep, rest])[: rng.integers(k, mtp * k + 1)]
        rng.shuffle(s)
        idx[0, 0, t, : s.size] = s
        prev = s
    wr = np.stack([rng.choice(L, k, replace=False) for _ in range(warm)])[None, None].astype(np.int32)
    return T.Trace(idx, L, k, mtp, seed, wr)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), cap_extra=st.integers(0, 30), locality=st.sampled_from([0.0, 0.5, 0.8]),
       mtp=st.sampled_from([1, 2]))
def test_belady_never_has_more_misses_than_any_policy(seed, cap_extra, locality, mtp):
    tr = random_trace(seed, mtp=mtp, locality=locality)
    cap = tr.width + cap_extra
    best = C.trace_misses(tr, "belady", capacity=cap, warmup=False).sum()
    for pol in ONLINE_POLICIES:
        assert best <= C.trace_misses(tr, pol, capacity=cap, warmup=False).sum(), pol
    # and no better than the trivial lower bound: every distinct entry is loaded once
    assert best >= np.unique(tr.indices[tr.indices >= 0]).size


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), cap_extra=st.integers(0, 20), warm=st.booleans(), mtp=st.sampled_from([1, 2]),
       locality=st.sampled_from([0.0, 0.5, 0.8]), decay=st.sampled_from([0.0, 0.3, 0.5, 1.0]))
def test_kernels_match_the_policy_references_miss_for_miss(seed, cap_extra, warm, mtp, locality, decay):
    """The Numba kernels are the fast path of ess.policies.simulate_misses (the readable references): equal miss
    counts for every policy, with and without warmup, at decays where ties are exact and where they are not."""
    tr = random_trace(seed, mtp=mtp, locality=locality)
    cap = tr.width + cap_extra
    for pol in POLICIES:
        got = C.trace_misses(tr, pol, capacity=cap, warmup=warm, decay=decay)[0, 0]
        want = simulate_misses(list(tr.indices[0, 0]), cap, policy=pol, decay=decay,
                               windows=list(tr.windows[0, 0]) if warm else ())
        assert got.tolist() == want.tolist(), pol


def test_lru_semantics_by_hand():
    # capacity 3; step order decides recency: after [1, 2, 3] the LRU entry is 1
    steps = np.array([[1, 2, 3], [4, -1, -1], [1, 3, -1], [2, -1, -1]])
    # step1: miss 4 evicts 1 (pool 2,3,4); step2: 1 misses (3 hits), victim among {2,4}: 2 -> pool 3,4,1
    # step3: 2 misses, victim among {3,4,1} least recent: 4
    assert C.sequence_misses(steps, 3).tolist() == [3, 1, 1, 1]
    assert simulate_misses(list(steps), 3).tolist() == [3, 1, 1, 1]
    # the array order of a step sets recency: [3, 2, 1] makes 3 the least recent
    assert C.sequence_misses(np.array([[3, 2, 1], [4, -1, -1], [3, -1, -1]]), 3).tolist() == [3, 1, 1]


def test_warmup_never_increases_first_step_misses():
    tr = G.synthetic_trace(G.Workload(1024, n_layers=4, k=64, mtp=2, steps=4, batch=2, warmup_windows=8, seed=2,
                                      local_window=8))
    for pol in POLICIES:
        cold = C.trace_misses(tr, pol, ratio=0.3, warmup=False)[:, :, 0]
        warm = C.trace_misses(tr, pol, ratio=0.3, warmup=True)[:, :, 0]
        assert (warm <= cold).all(), pol
        assert warm.sum() < cold.sum(), pol        # with locality warmup must actually help


def test_misses_per_layer_contract_shape_and_monotone_in_ratio():
    w = G.Workload(8192, n_layers=5, k=256, mtp=2, steps=8, batch=2, local_window=8)
    small = C.misses_per_layer(w, 0.15)
    big = C.misses_per_layer(w, 0.5)
    assert small.shape == (5,) and small.dtype == np.float64
    assert (big <= small).all() and big.sum() < small.sum()
    assert np.array_equal(small, C.misses_per_layer(w, 0.15))       # seeded
    assert C.misses_per_step(w, 0.15).shape == (5, 8)
    # layer 0 has no locality in the paper profile: it misses more than the layers with overlap 0.8-0.9
    assert small[0] > small[1:].max()


def test_bad_input_is_refused():
    tr = random_trace(0)
    for r in (0, -0.1, 1.5):
        with pytest.raises(ValueError, match=r"ratio.* must be in \(0, 1\]"):
            C.trace_misses(tr, ratio=r)
    with pytest.raises(TypeError, match="ratio"):
        C.trace_misses(tr, ratio="0.5")
    with pytest.raises(ValueError, match="smaller than K"):
        C.trace_misses(tr, capacity=tr.k - 1)
    with pytest.raises(ValueError, match="fewer than the 2048 entries"):             # one query token: K
        C.misses_per_layer(G.Workload(32768, n_layers=1, k=2048, mtp=1, steps=1, batch=1), 0.05)
    # layer 0 of the paper profile (overlap 0): two query tokens select 2 x 2048 entries, 1,638 slots cannot hold them
    with pytest.raises(ValueError, match="fewer than the 4096 entries"):
        C.misses_per_layer(G.Workload(32768, n_layers=1, k=2048, mtp=2, steps=1, batch=1), 0.05)
    with pytest.raises(ValueError, match="GPU slots"):    # holds K but not one MTP step's union
        C.misses_per_layer(G.Workload(4096, n_layers=1, k=2048, mtp=2, steps=2, batch=1), 0.6)
    with pytest.raises(ValueError, match="policy"):
        C.trace_misses(tr, "random", capacity=10)
    with pytest.raises(TypeError, match="Trace"):
        C.trace_misses(np.zeros((1, 1, 1, 1)), capacity=10)
    with pytest.raises(ValueError, match="exactly one"):
        C.trace_misses(tr)


def test_lru_agrees_exactly_with_the_storage_module():
    storage = pytest.importorskip("ess.storage")
    from ess.specs import model_spec
    model = model_spec("tiny")
    L, k, steps = 300, model.index_topk, 12
    tr = G.synthetic_trace(G.Workload(L, n_layers=model.n_layers, k=k, mtp=2, steps=steps, batch=2,
                                      warmup_windows=4, seed=7, local_window=8))
    cap = int(0.6 * L)
    for pol in ("lru", "fifo"):
        cache = storage.TieredCache(model, capacity=cap, policy=pol)
        entry = cache.entry_bytes
        for b in range(tr.batch):
            cache.add_request(b, np.zeros((model.n_layers, tr.n_positions, entry), np.uint8))
            for layer in range(model.n_layers):
                cache.warmup(b, layer, [w.astype(np.int64) for w in tr.windows[b, layer]])
        got = np.zeros((tr.batch, tr.n_layers, steps), np.int64)
        for t in range(steps):
            for b in range(tr.batch):
                for layer in range(model.n_layers):
                    got[b, layer, t] = cache.step(b, layer, tr.indices[b, layer, t].astype(np.int64)).n_misses
        assert np.array_equal(got, C.trace_misses(tr, pol, capacity=cap, warmup=True)), pol


@pytest.mark.parametrize("threads", [1, 2])
def test_sweep_equals_simulating_the_materialised_trace(threads):
    w = G.Workload(4096, n_layers=3, k=256, mtp=2, steps=6, batch=2, seed=5, local_window=8, warmup_windows=4)
    tr = G.synthetic_trace(w)
    got = C.sweep_synthetic(w, [0.2, 0.5], policies=POLICIES, warmups=(True, False), threads=threads)
    for (r, pol, w), m in got.items():
        np.testing.assert_allclose(m, C.trace_misses(tr, pol, ratio=r, warmup=w).mean(axis=0), err_msg=str((r, pol, w)))


@pytest.mark.parametrize("model", ["uniform", "drift"])
def test_sweep_equals_the_materialised_trace_for_both_models(model):
    w = G.Workload(4096, n_layers=3, k=256, mtp=2, steps=6, batch=2, seed=5, local_window=8, warmup_windows=4,
                   locality=LM.LocalityModel.of(model))
    tr = G.synthetic_trace(w)
    assert tr.meta["trace_model"] == model
    got = C.sweep_synthetic(w, [0.2, 0.5], policies=("lru", "belady"), warmups=(True, False))
    for (r, pol, w), m in got.items():
        np.testing.assert_allclose(m, C.trace_misses(tr, pol, ratio=r, warmup=w).mean(axis=0), err_msg=str((r, pol, w)))


def test_default_model_is_the_one_the_data_names():
    kw = dict(n_layers=2, k=256, mtp=2, steps=4, batch=1, local_window=8)
    named = C.misses_per_layer(G.Workload(8192, locality=LM.LocalityModel.of(LM.default_trace_model()), **kw), 0.2)
    w = G.Workload(8192, **kw)                                          # locality None: the central model
    assert w.locality == LM.default_locality() == LM.locality_named("central")
    assert np.array_equal(C.misses_per_layer(w, 0.2), named)
    other = [m for m in LM.TRACE_MODELS if m != LM.default_trace_model()][0]
    assert not np.array_equal(C.misses_per_layer(G.Workload(8192, locality=LM.LocalityModel.of(other), **kw), 0.2),
                              named)


@pytest.mark.slow
def test_misses_per_layer_drift_runs_at_the_full_geometry():
    """Mistake: the drift generator or the sweep failing only at the full geometry (61 layers, 128K, K 2,048:
    int32 positions, candidate sets, pool sizes), which the small tests never reach."""
    # 61 layers, 128K, K 2048, default steps (64) and MTP (2); one request keeps the suite fast (the default batch
    # of 4 takes about 4x as long: see the notebook 04 timings)
    m = C.misses_per_layer(G.Workload(131072, n_layers=61, k=2048, batch=1, locality=LM.LocalityModel.of("drift")),
                           0.2)
    assert m.shape == (61,) and np.isfinite(m).all() and (m >= 0).all()
    assert m[0] == m.max()                          # layer 0, no locality, misses most
    assert m[1:17].mean() < m[19:45].mean()         # layers 1-16 (overlap 0.7-0.9) miss less than 19-44


def test_unknown_model_is_refused_everywhere():
    # a model is named in a LocalityModel (or by its name in the band); the workload takes a model, never its name,
    # and the sweeps take a workload only (tests/test_tracegen.py)
    kw = dict(n_layers=1, k=256, steps=2, batch=1, local_window=8)
    for bad in ("lru", "", "Drift", "none"):
        for call in (lambda: LM.LocalityModel.of(bad), lambda: LM.LocalityModel.of(bad, reading="fraction"),
                     lambda: LM.LocalityModel(bad, bad, "fraction")):
            with pytest.raises(ValueError, match=r"trace_model must be one of \('uniform', 'drift'\)"):
                call()
        with pytest.raises(ValueError, match="locality must be one of"):
            LM.locality_named(bad)
        with pytest.raises(TypeError, match="locality must be an ess.locality.LocalityModel"):
            G.Workload(4096, locality=bad, **kw)
    for call in (lambda: C.misses_per_layer(4096, 0.5), lambda: C.misses_per_step(4096, 0.5),
                 lambda: C.sweep_synthetic(4096, [0.5]), lambda: C.smallest_pool(4096, 100)):
        with pytest.raises(TypeError, match="workload must be an ess.tracegen.Workload"):
            call()


def test_a_pool_takes_a_step_a_little_above_its_share():
    # share 1,000 slots: a step of 1,040 entries (4 % above) is taken, one of 1,060 (6 %) is not (STEP_SLACK 5 %)
    assert C.STEP_SLACK == 0.05
    assert C._holding_the_step(1000, 1040) == 1040 and C._holding_the_step(1000, 1060) == 1000
    assert C._holding_the_step(1000, 900) == 1000


def test_layers_share_the_ratio_so_an_mtp_step_fits():
    """MTP 4 at 32K, ratio 0.193 (6,324 slots per layer): a layer without locality selects 4 x 2,048 entries, more
    than its even share; with the layers sharing the slots (ess.layout.layer_pool_slots) it holds them, and the sweep
    equals simulating each layer with its own share."""
    from ess import layout
    from ess.specs import model_spec
    w = G.Workload(32768, n_layers=3, k=2048, mtp=4, steps=3, batch=1, profile=[0.0, 0.8, 0.8],
                   locality=LM.LocalityModel.of("uniform"), local_window=8)
    got = C.sweep_synthetic(w, [0.193])[(0.193, "lru", True)]
    need = layout.step_entries(model_spec(), 32768, 4, overlap=[0.0, 0.8, 0.8])
    caps = layout.layer_pool_slots(model_spec(), 0.193, 32768, need)
    assert caps[0] == 8192 > layout.pool_slots(model_spec(), 0.193, 32768) > caps[1]
    want = np.zeros((3, 3))
    for b, layer, warm, st in G.synthetic_streams(w):
        width = int((st >= 0).sum(axis=1).max())
        want[layer] = C.sequence_misses(st, C._holding_the_step(int(caps[layer]), width), windows=warm,
                                        n_positions=32768 + 12)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_single_step_misses_everything_it_selects(policy):
    """One step into an empty pool: every selected entry misses (a trace of one step is a valid trace)."""
    assert C.sequence_misses(np.array([[0, 5, 9, -1]]), 4, policy=policy).tolist() == [3]


def test_a_step_larger_than_the_pool_is_refused_with_its_size():
    """Position 0 counts as an entry (only -1 is padding)."""
    with pytest.raises(ValueError, match=r"smaller than the 3 entries of step 1"):
        C.sequence_misses(np.array([[1, -1, -1], [0, 1, 2]]), 2)


# ------------------------------------------------------------------------------------- CLOCK and the sampled CLOCK
CLOCKS = ("clock", "sampled_clock")


def _reference(rows, cap, policy, windows=()):
    return simulate_misses(list(rows), cap, policy=policy, windows=list(windows)).tolist()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(CLOCKS), cap_extra=st.sampled_from([0, 1, 2, 7]),
       mtp=st.sampled_from([1, 2, 4]), warm=st.booleans(), locality=st.sampled_from([0.0, 0.5, 0.9]))
def test_clock_kernels_match_the_references_on_odd_shapes(seed, policy, cap_extra, mtp, warm, locality):
    """Miss for miss against ess.policies: pools exactly one step wide or one slot more, MTP unions, warmup."""
    tr = random_trace(seed, L=50, k=5, steps=30, mtp=mtp, locality=locality)
    cap = tr.width + cap_extra
    got = C.trace_misses(tr, policy, capacity=cap, warmup=warm)[0, 0]
    assert got.tolist() == _reference(tr.indices[0, 0], cap, policy, tr.windows[0, 0] if warm else ())


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(CLOCKS), cap_extra=st.integers(0, 40),
       mtp=st.sampled_from([1, 2, 3]), locality=st.sampled_from([0.0, 0.5, 0.9]))
def test_clock_policies_never_beat_belady(seed, policy, cap_extra, mtp, locality):
    tr = random_trace(seed, L=80, k=8, steps=30, mtp=mtp, locality=locality)
    cap = tr.width + cap_extra
    assert C.trace_misses(tr, "belady", capacity=cap, warmup=False).sum() <= \
        C.trace_misses(tr, policy, capacity=cap, warmup=False).sum()


def test_clock_kernels_count_an_entry_repeated_across_mtp_steps_once():
    """A one-token-per-step trace whose tokens share most of their sets, its MTP-2 and MTP-4 unions
    (ess.studies.real_model.record_traces.mtp_union: steps united, repeats dropped): each union step misses at most
    its distinct entries, and the kernels agree with the references on the united steps."""
    from ess.studies.real_model.record_traces import mtp_union
    base = random_trace(11, L=90, k=12, steps=48, mtp=1, locality=0.9)
    for m in (2, 4):
        tr = mtp_union(base, m)
        assert tr.width < m * base.k                      # the tokens' sets overlapped: repeats were dropped
        for policy in CLOCKS:
            cap = tr.width + 1
            got = C.trace_misses(tr, policy, capacity=cap, warmup=True)[0, 0]
            assert (got <= tr.set_sizes()[0, 0]).all()
            assert got.tolist() == _reference(tr.indices[0, 0], cap, policy, tr.windows[0, 0])


def test_sampled_clock_kernel_with_more_than_512_misses_a_step():
    """Steps missing over 512 entries (two of the kernel's rounds), with a capacity that is not a power of two (the
    probe does not cover the ring there, so ess's end of the probe runs too)."""
    rng = np.random.default_rng(5)
    rows = np.stack([rng.choice(4000, 1300, replace=False) for _ in range(6)]).astype(np.int32)
    for cap in (1300, 1301, 2047, 2048):
        got = C.sequence_misses(rows, cap, policy="sampled_clock")
        assert got.tolist() == _reference(rows, cap, "sampled_clock")


def test_clock_kernel_worked_example():
    """The second-chance example of tests/test_policies.py through the kernel: CLOCK keeps 4 where LRU evicts it."""
    rows = np.array([[1, 2, 3], [4, -1, -1], [2, -1, -1], [5, -1, -1], [3, -1, -1], [4, -1, -1]])
    assert C.sequence_misses(rows, 3, policy="clock").tolist() == [3, 1, 0, 1, 1, 0]
    assert C.sequence_misses(rows, 3, policy="lru").tolist() == [3, 1, 0, 1, 1, 1]


def test_sweep_returns_the_selected_entries_for_hit_rates():
    w = G.Workload(4096, n_layers=3, k=256, mtp=2, steps=5, batch=2, seed=4, local_window=8, warmup_windows=3)
    sel = np.zeros((3, 5))
    got = C.sweep_synthetic(w, [0.3], policies=CLOCKS, selected=sel)
    tr = G.synthetic_trace(w)
    np.testing.assert_allclose(sel, tr.set_sizes().mean(axis=0))
    for pol in CLOCKS:
        np.testing.assert_allclose(got[(0.3, pol, True)], C.trace_misses(tr, pol, ratio=0.3).mean(axis=0))
    with pytest.raises(TypeError, match=r"selected must be a float64 array of shape \(3, 5\)"):
        C.sweep_synthetic(w, [0.3], selected=np.zeros((3, 4)))
