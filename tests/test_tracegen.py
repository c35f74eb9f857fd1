"""Synthetic trace generators (uniform, score drift), their calibration on the locality evidence, and the locality
models of the fit file."""
import numpy as np
import pytest

from ess import locality as LM
from ess import tracegen as G
from ess import traces as T


def small(**kw):
    args = dict(context_len=512, n_layers=3, k=32, mtp=1, steps=12, batch=2, warmup_windows=4, seed=3,
                local_window=4)
    args.update(kw)
    return G.synthetic_trace(G.Workload(**args))


def uniform():
    return LM.LocalityModel.of("uniform")


def drift(**kw):
    return LM.LocalityModel.of("drift", **kw)


def test_generator_follows_the_profile_per_layer():
    prof = [0.2, 0.5, 0.9]
    tr = G.synthetic_trace(G.Workload(2048, n_layers=3, k=128, mtp=1, steps=20, batch=2, warmup_windows=0, seed=0,
                                      local_window=4, profile=prof, locality=uniform()))  # exact by construction
    np.testing.assert_allclose(T.adjacent_overlap(tr), prof, atol=1.5 / 128)


def test_paper_profile_is_read_from_data_and_has_sources():
    import yaml
    raw = yaml.safe_load(open(G.DATA_DIR / "paper_fig2.yaml"))
    assert raw["read_from_chart"] is True
    assert all(v["source"] for v in raw["layers"].values())
    p = G.locality_profile("paper", 61)
    assert p.shape == (61,) and p[0] == 0.0 and p[2] > p[18] and p[45] > p[47]
    assert G.locality_profile("paper", 4).shape == (4,)


def test_sets_are_valid_with_sinks_window_growth_and_mtp_union():
    tr = G.synthetic_trace(G.Workload(300, n_layers=2, k=40, mtp=3, steps=6, batch=1, warmup_windows=3, seed=1,
                                      n_sinks=2, local_window=5, profile=0.3))
    for t in range(tr.steps):
        ctx = 300 + 3 * t
        for layer in range(2):
            row = tr.indices[0, layer, t]
            s = row[row >= 0]
            assert s.size == np.unique(s).size and 40 <= s.size <= 120
            assert s.max() < ctx                                            # the context grows by mtp per step
            assert {0, 1} <= set(s) and set(range(ctx - 5, ctx)) <= set(s)  # sinks and local window
            assert (row[s.size:] == -1).all()
    w = tr.windows[0, 0]
    assert w.shape == (3, 40) and w[0].max() < 300 - 3 + 1


def test_generator_is_seeded():
    a, b, c = small(seed=5), small(seed=5), small(seed=6)
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.windows, b.windows)
    assert not np.array_equal(a.indices, c.indices)


# ------------------------------------------------------------------------------------- score-drift model (drift)


DRIFT_TOL = 0.02   # stated tolerance: per-layer adjacent overlap of a fresh seed vs the profile (K = 2048)


def test_drift_model_reproduces_the_paper_profile_per_layer():
    L = 32768
    tr = G.synthetic_trace(G.Workload(L, n_layers=61, k=2048, mtp=1, steps=12, batch=1, warmup_windows=0, seed=3,
                                      locality=drift()))
    assert tr.meta["trace_model"] == "drift" and tr.meta["drift_rho"] == LM.fitted_drift_rho(tr.meta["reading"])
    prof = G.locality_profile("paper", 61)
    floor = LM.drift_calibration(0.0, L, 2048)["floor"]       # sinks + shifted window + chance at c = 0
    want = np.maximum(prof, floor)
    got = T.adjacent_overlap(tr)
    assert np.abs(got - want).max() < DRIFT_TOL, np.round(got - want, 3)
    assert floor < 0.1                                       # layer 0 stays (nearly) without locality


def test_drift_calibration_is_monotone_and_fits_small_geometries():
    cals = [LM.drift_calibration(r, 4096, 256, 4, 8) for r in (0.3, 0.5, 0.7, 0.9)]
    cs = [c["c"] for c in cals]
    assert cs == sorted(cs) and all(abs(c["overlap"] - r) < 0.01 for c, r in zip(cals, (0.3, 0.5, 0.7, 0.9)))
    # c = pi + (1 - pi) rho_layer, rho_layer = min(rho, c): pure drift below rho, a persistent part above
    for c in cals:
        assert abs(c["pi"] + (1 - c["pi"]) * c["rho"] - c["c"]) < 1e-12
    low = LM.drift_calibration(0.3, 4096, 256, 4, 8, rho=0.9)
    assert low["pi"] == 0 and low["rho"] == low["c"]
    prof = [0.3, 0.6, 0.85]
    tr = G.synthetic_trace(G.Workload(4096, n_layers=3, k=256, mtp=1, steps=40, batch=2, warmup_windows=0, seed=11,
                                      local_window=8, profile=prof, locality=drift()))
    np.testing.assert_allclose(T.adjacent_overlap(tr), prof, atol=0.03)     # K = 256: more sampling noise


def test_drift_sets_are_valid_with_sinks_window_growth_and_mtp_union():
    tr = G.synthetic_trace(G.Workload(3000, n_layers=2, k=64, mtp=3, steps=6, batch=1, warmup_windows=3, seed=1,
                                      n_sinks=2, local_window=5, profile=[0.3, 0.8], locality=drift()))
    for t in range(tr.steps):
        ctx = 3000 + 3 * t
        for layer in range(2):
            row = tr.indices[0, layer, t]
            s = row[row >= 0]
            assert s.size == np.unique(s).size and 64 <= s.size <= 192
            assert s.max() < ctx
            assert {0, 1} <= set(s) and set(range(ctx - 5, ctx)) <= set(s)
            assert (row[s.size:] == -1).all()
    w = tr.windows[0, 0]
    assert w.shape == (3, 64) and w[0].max() < 3000 - 3 + 1 and (np.sort(w, axis=1)[:, :2] == [0, 1]).all()


def test_drift_mtp_union_size_follows_the_overlap_between_the_step_tokens():
    # the mtp tokens of a step are successive links of the query-token chain: two tokens overlapping by r unite
    # to about k * (2 - r) entries
    prof = [0.3, 0.6, 0.9]
    tr = G.synthetic_trace(G.Workload(32768, n_layers=3, k=2048, mtp=2, steps=8, batch=1, warmup_windows=0, seed=2,
                                      profile=prof, locality=drift()))
    size = tr.set_sizes()[0].mean(axis=1) / 2048
    np.testing.assert_allclose(size, 2 - np.array(prof), atol=0.03)


def test_drift_generator_is_seeded_and_reproducible():
    w = G.Workload(2048, n_layers=3, k=64, mtp=2, steps=10, batch=2, warmup_windows=4, local_window=4,
                   locality=drift())
    a, b, c = (G.synthetic_trace(w.replace(seed=s)) for s in (5, 5, 6))
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.windows, b.windows)
    assert not np.array_equal(a.indices, c.indices)
    # streams come out in (request, layer) order whatever the threads did
    order = [(r, l) for r, l, _, _ in G.synthetic_streams(w.replace(seed=5))]
    assert order == [(r, l) for r in range(2) for l in range(3)]


def test_drift_candidate_set_matches_the_full_model():
    # small cases and the real geometry (32K, K 2048) at overlaps where the restriction prunes most tokens
    for L, k, win, prof in ((4096, 256, 8, [0.0, 0.5, 0.9]), (32768, 2048, None, [0.8, 0.9])):
        w = G.Workload(L, n_layers=len(prof), k=k, mtp=2, steps=6, batch=1, warmup_windows=3, seed=4, profile=prof,
                       local_window=win, locality=drift())
        cut = G.synthetic_trace(w)
        full = G.synthetic_trace(w.replace(drift_cutoff_sigmas=float("inf")))
        assert np.array_equal(cut.indices, full.indices) and np.array_equal(cut.windows, full.windows)
    cal = LM.drift_calibration(0.9, 32768, 2048)
    _, _, n_cand = G._drift_run(1, 32768 + 12, 32768, 2048, 2, 6, 0, cal["pi"], cal["rho"], 4, 64, 6.0)
    assert n_cand < 0.5 * 32768                      # it does prune (the bound is what makes it safe)


def test_drift_entries_that_drop_out_come_back_more_often_than_chance():
    """The point of the model: a token that leaves the top-K sits near the threshold and returns soon."""
    def return_rate(model):
        tr = G.synthetic_trace(G.Workload(32768, n_layers=1, k=2048, mtp=1, steps=10, batch=1, warmup_windows=0,
                                          seed=9, profile=[0.475], locality=LM.LocalityModel.of(model)))
        rows = [set(r[r >= 0]) - set(range(4)) for r in tr.indices[0, 0]]
        back = [len((rows[t - 2] - rows[t - 1]) & rows[t]) / max(len(rows[t - 2] - rows[t - 1]), 1)
                for t in range(2, len(rows))]
        return float(np.mean(back))
    chance = 2048 / 32768                            # a uniformly random entry's chance to be selected
    assert return_rate("drift") > 2 * chance         # measured 0.17 (seed 9)
    assert return_rate("uniform") < chance           # measured 0.035: new entries avoid the previous set


def test_unknown_trace_model_and_misplaced_options_raise():
    with pytest.raises(ValueError, match="trace_model must be one of"):
        LM.LocalityModel.of("markov")
    with pytest.raises(ValueError, match="trace_model must be one of"):
        LM.LocalityModel.of(3)
    with pytest.raises(ValueError, match="trace_model must be one of"):
        LM.LocalityModel("x", "markov", "fraction")
    with pytest.raises(ValueError, match="popularity_sigma belongs to the uniform trace model"):
        G.Workload(512, n_layers=1, k=32, steps=1, batch=1, locality=drift(), popularity_sigma=1.0)
    with pytest.raises(ValueError, match="drift_cutoff_sigmas belongs to the drift trace model"):
        G.Workload(512, n_layers=1, k=32, steps=1, batch=1, locality=uniform(), drift_cutoff_sigmas=6.0)
    with pytest.raises(ValueError, match="drift_rho belongs to trace_model='drift'"):
        LM.LocalityModel.of("uniform", drift_rho=0.3)
    with pytest.raises(ValueError, match="drift_rho"):
        drift(drift_rho=1.0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        LM.drift_calibration(1.5, 512, 32)
    with pytest.raises(ValueError, match="larger than the context"):
        LM.drift_calibration(0.5, 16, 32)
    assert LM.default_trace_model() in LM.TRACE_MODELS


def test_the_jaccard_reading_turns_fig2_into_overlap_fractions():
    # J = |A & B| / |A | B| for two K-sets is the fraction r = 2J / (1 + J): 0.475 -> 0.95 / 1.475 = 0.6441,
    # 0.8 -> 1.6 / 1.8 = 0.8889, 0.3 -> 0.6 / 1.3 = 0.4615, 0 -> 0
    frac = G.locality_profile("paper", 61, "fraction")
    jac = G.locality_profile("paper", 61, "jaccard")
    assert frac[30] == 0.475 and jac[30] == pytest.approx(0.6441, abs=1e-4)
    assert frac[5] == 0.8 and jac[5] == pytest.approx(0.8889, abs=1e-4)
    assert jac[18] == pytest.approx(0.4615, abs=1e-4) and jac[0] == 0.0
    assert (jac >= frac).all()
    with pytest.raises(ValueError, match="reading"):
        G.locality_profile("paper", 61, "cosine")
    with pytest.raises(ValueError, match="applies to profile='paper' only"):
        G.locality_profile(0.5, 3, "jaccard")


def test_locality_models_from_the_fit_file():
    c = LM.default_locality()
    alts = LM.locality_alternatives()
    assert alts[0] == c and len({(m.trace_model, m.reading, m.drift_rho) for m in alts}) == len(alts)
    assert {m.reading for m in alts} == set(LM.READINGS)                  # the other reading is an alternative
    if c.trace_model == "drift":
        assert c.drift_rho == LM.fitted_drift_rho(c.reading)
        rhos = {LM.fitted_drift_rho(c.reading, at) for at in ("at_80", "at_90")}
        assert rhos <= {m.drift_rho for m in alts if m.reading == c.reading}
    assert c.config()["reading"] == c.reading and c.config()["trace_model"] == c.trace_model
    assert c.config()["locality"] == c.name and ("drift_rho" in c.config()) == (c.trace_model == "drift")
    with pytest.raises(ValueError, match="drift_rho"):
        LM.LocalityModel("x", "uniform", "fraction", 0.3)
    with pytest.raises(ValueError, match="reading"):
        LM.LocalityModel("x", "drift", "both", 0.3)
    with pytest.raises(ValueError, match="at must be one of"):
        LM.fitted_drift_rho("fraction", "at_95")


# ---------------------------------------------------------------------------------------- the Workload type
def test_a_workload_is_frozen_and_hashable():
    import dataclasses
    w = G.Workload(4096, n_layers=2, k=64, profile=[0.2, 0.7])
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.mtp = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.locality = uniform()
    assert w.profile == (0.2, 0.7)                   # a given sequence is kept as a tuple: the workload hashes
    assert hash(w) == hash(G.Workload(4096, n_layers=2, k=64, profile=[0.2, 0.7]))
    assert w == G.Workload(4096, n_layers=2, k=64, profile=(0.2, 0.7))


def test_a_workload_resolves_its_none_fields():
    w = G.Workload(32768)
    d = G.generator_defaults()
    assert (w.n_layers, w.k) == (61, 2048) == G.geometry()
    assert w.locality == LM.default_locality()
    assert (w.n_sinks, w.local_window) == (d["n_sinks"], d["local_window"])
    assert (w.mtp, w.steps, w.batch, w.warmup_windows, w.seed, w.profile) == (2, 64, 4, G.PAPER_WARMUP_WINDOWS, 0,
                                                                             "paper")
    if w.locality.trace_model == "drift":
        assert w.popularity_sigma is None and w.drift_cutoff_sigmas == G.DRIFT_CUTOFF_SIGMAS
    else:
        assert w.popularity_sigma == d["popularity_sigma"] and w.drift_cutoff_sigmas is None
    u = G.Workload(4096, k=64, locality=uniform())
    assert u.popularity_sigma == d["popularity_sigma"] and u.drift_cutoff_sigmas is None
    v = G.Workload(4096, k=64, locality=drift())
    assert v.popularity_sigma is None and v.drift_cutoff_sigmas == G.DRIFT_CUTOFF_SIGMAS
    # what a workload derives
    assert w.n_positions == 32768 + 64 * 2
    np.testing.assert_array_equal(w.overlaps(), G.locality_profile("paper", 61, w.locality.reading))
    c = G.Workload(4096, n_layers=2, k=64, profile=[0.2, 0.7], locality=uniform()).config()
    assert c["profile"] == [0.2, 0.7] and c["trace_model"] == "uniform" and c["context_len"] == 4096
    assert c["popularity_sigma"] == d["popularity_sigma"] and "drift_rho" not in c


def test_replace_makes_a_checked_copy():
    w = G.Workload(4096, n_layers=2, k=64, steps=4, batch=1)
    x = w.replace(seed=7, mtp=1)
    assert (x.seed, x.mtp, w.seed, w.mtp) == (7, 1, 0, 2) and x.replace(seed=0, mtp=2) == w
    with pytest.raises(ValueError, match="mtp"):
        w.replace(mtp=0)
    with pytest.raises(ValueError, match="larger than the context"):
        w.replace(k=8192)
    with pytest.raises(TypeError, match="locality"):
        w.replace(locality="uniform")


def test_replace_switches_the_trace_model():
    """Mistake: the resolved option of one trace model (the drift cutoff, the uniform popularity skew) carried into
    a copy of the other, which then refuses it."""
    from ess.locality import LocalityModel
    drift = G.Workload(4096, n_layers=2, k=64, steps=4, batch=1, locality=LocalityModel.of("drift"))
    uniform = drift.replace(locality=LocalityModel.of("uniform"))
    assert uniform.popularity_sigma == G.generator_defaults()["popularity_sigma"]
    assert uniform.drift_cutoff_sigmas is None
    back = uniform.replace(locality=LocalityModel.of("drift"))
    assert back == drift
    assert uniform.replace(locality=LocalityModel.of("drift"), drift_cutoff_sigmas=3.0).drift_cutoff_sigmas == 3.0
    with pytest.raises(ValueError, match="popularity_sigma"):           # an explicit option still checked
        uniform.replace(locality=LocalityModel.of("drift"), popularity_sigma=0.5)


@pytest.mark.parametrize("field,bad,err", [
    ("context_len", 2.5, TypeError), ("context_len", 0, ValueError), ("mtp", True, TypeError),
    ("mtp", 0, ValueError), ("steps", 0, ValueError), ("batch", "4", TypeError), ("seed", -1, ValueError),
    ("warmup_windows", -1, ValueError), ("n_layers", 0, ValueError), ("k", 2.0, TypeError),
    ("n_sinks", -1, ValueError), ("local_window", 1.5, TypeError), ("locality", "drift", TypeError),
    ("profile", [0.5, 0.5], ValueError), ("profile", 1.5, ValueError), ("profile", "fig2", ValueError),
])
def test_each_wrong_workload_field_is_named(field, bad, err):
    kw = dict(n_layers=3, k=64, steps=4, batch=1)
    with pytest.raises(err, match=field):
        G.Workload(**{"context_len": 4096, **kw, field: bad})


def test_a_workload_names_options_of_the_other_trace_model_and_an_impossible_geometry():
    kw = dict(n_layers=1, k=32, steps=1, batch=1)
    with pytest.raises(ValueError, match="popularity_sigma belongs to the uniform trace model"):
        G.Workload(512, locality=drift(), popularity_sigma=0.5, **kw)
    with pytest.raises(ValueError, match="drift_cutoff_sigmas belongs to the drift trace model"):
        G.Workload(512, locality=uniform(), drift_cutoff_sigmas=6.0, **kw)
    with pytest.raises(ValueError, match="popularity_sigma"):
        G.Workload(512, locality=uniform(), popularity_sigma=-1.0, **kw)
    with pytest.raises(ValueError, match="drift_cutoff_sigmas"):
        G.Workload(512, locality=drift(), drift_cutoff_sigmas=0.0, **kw)
    with pytest.raises(ValueError, match=r"k \(top-K\) = 2048 is larger than the context"):
        G.Workload(1024, n_layers=1)
    with pytest.raises(ValueError, match="warmup_windows"):
        G.Workload(512, n_layers=1, k=500, warmup_windows=32)
    with pytest.raises(ValueError, match="maximum context"):
        G.Workload(10 ** 7, n_layers=1, steps=1, batch=1)


def test_every_workload_field_has_help_and_unit():
    import dataclasses
    for f in dataclasses.fields(G.Workload):
        assert f.metadata.get("help") and f.metadata.get("unit"), f.name
        if f.metadata.get("flag"):
            assert f.metadata["flag"].startswith("--") and callable(f.metadata["parse"]), f.name
    meta = {f.name: f.metadata for f in dataclasses.fields(G.Workload)}
    assert meta["context_len"]["parse"]("32k") == 32768
    assert meta["locality"]["parse"]("uniform") == uniform()
    assert meta["locality"]["choices"]() == LM.locality_names()


def test_the_generators_and_sweeps_take_a_workload_only():
    from ess import cachesim as C
    w = G.Workload(1024, n_layers=1, k=16, steps=2, batch=1)
    for call in (lambda: G.synthetic_trace(1024), lambda: G.synthetic_trace({"context_len": 1024}),
                 lambda: G.synthetic_streams(1024),             # refused at the call, not at the first stream
                 lambda: C.sweep_synthetic(1024, [0.5]), lambda: C.misses_per_layer(1024, 0.5),
                 lambda: C.misses_per_step(1024, 0.5), lambda: C.smallest_pool(1024, 1.0)):
        with pytest.raises(TypeError, match="workload must be an ess.tracegen.Workload"):
            call()
    assert G.synthetic_trace(w).indices.shape == (1, 1, 2, 2 * 16)
    with pytest.raises(TypeError):
        G.synthetic_trace(1024, k=16)                   # the old keyword form is gone


def test_locality_model_of_fills_the_defaults():
    c = LM.default_locality()
    d = LM.LocalityModel.of("drift")
    assert d.drift_rho == LM.fitted_drift_rho(c.reading) and d.reading == c.reading and d.name == "drift"
    j = LM.LocalityModel.of("drift", reading="jaccard")
    assert j.drift_rho == LM.fitted_drift_rho("jaccard") and j.reading == "jaccard"
    assert LM.LocalityModel.of("drift", drift_rho=0.3).drift_rho == 0.3
    u = LM.LocalityModel.of("uniform")
    assert (u.trace_model, u.reading, u.drift_rho) == ("uniform", c.reading, None)
    n = LM.LocalityModel.of()
    assert (n.trace_model, n.reading, n.drift_rho) == (c.trace_model, c.reading, c.drift_rho)
    assert LM.LocalityModel.of("uniform", name="flat").name == "flat"
    with pytest.raises(ValueError, match="drift_rho belongs to trace_model='drift'"):
        LM.LocalityModel.of("uniform", drift_rho=0.3)
    with pytest.raises(ValueError, match="reading must be one of"):
        LM.LocalityModel.of("drift", reading="cosine")
    with pytest.raises(ValueError, match="drift_rho"):
        LM.LocalityModel.of("drift", drift_rho=-0.1)


def test_locality_models_by_name():
    names = LM.locality_names()
    assert names[:len(LM.locality_alternatives())] == [m.name for m in LM.locality_alternatives()]
    assert set(LM.TRACE_MODELS) <= set(names)
    assert LM.locality_named("central") == LM.default_locality()
    assert all(LM.locality_named(m.name) == m for m in LM.locality_alternatives())
    assert LM.locality_named("uniform") == LM.LocalityModel.of("uniform")
    assert LM.locality_named("drift") == LM.LocalityModel.of("drift")
    for bad in ("markov", None, 3):
        with pytest.raises(ValueError, match="locality must be one of"):
            LM.locality_named(bad)
