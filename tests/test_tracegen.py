"""Synthetic trace generators (uniform, score drift), their calibration on the locality evidence, and the locality
models of the fit file."""
import numpy as np
import pytest

from ess import locality as LM
from ess import tracegen as G
from ess import traces as T


def small(**kw):
    args = dict(n_layers=3, k=32, mtp=1, steps=12, batch=2, warmup_windows=4, seed=3, local_window=4)
    args.update(kw)
    return G.synthetic_trace(kw.pop("context_len", 512), **{k: v for k, v in args.items() if k != "context_len"})


def test_generator_follows_the_profile_per_layer():
    prof = [0.2, 0.5, 0.9]
    tr = G.synthetic_trace(2048, n_layers=3, k=128, mtp=1, steps=20, batch=2, warmup_windows=0, seed=0,
                           local_window=4, profile=prof, trace_model="uniform")      # exact by construction
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
    tr = G.synthetic_trace(300, n_layers=2, k=40, mtp=3, steps=6, batch=1, warmup_windows=3, seed=1,
                           n_sinks=2, local_window=5, profile=0.3)
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
    tr = G.synthetic_trace(L, n_layers=61, k=2048, mtp=1, steps=12, batch=1, warmup_windows=0, seed=3,
                           trace_model="drift")
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
    tr = G.synthetic_trace(4096, n_layers=3, k=256, mtp=1, steps=40, batch=2, warmup_windows=0, seed=11,
                           local_window=8, profile=prof, trace_model="drift")
    np.testing.assert_allclose(T.adjacent_overlap(tr), prof, atol=0.03)     # K = 256: more sampling noise


def test_drift_sets_are_valid_with_sinks_window_growth_and_mtp_union():
    tr = G.synthetic_trace(3000, n_layers=2, k=64, mtp=3, steps=6, batch=1, warmup_windows=3, seed=1,
                           n_sinks=2, local_window=5, profile=[0.3, 0.8], trace_model="drift")
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
    tr = G.synthetic_trace(32768, n_layers=3, k=2048, mtp=2, steps=8, batch=1, warmup_windows=0, seed=2,
                           profile=prof, trace_model="drift")
    size = tr.set_sizes()[0].mean(axis=1) / 2048
    np.testing.assert_allclose(size, 2 - np.array(prof), atol=0.03)


def test_drift_generator_is_seeded_and_reproducible():
    kw = dict(n_layers=3, k=64, mtp=2, steps=10, batch=2, warmup_windows=4, local_window=4, trace_model="drift")
    a, b, c = (G.synthetic_trace(2048, seed=s, **kw) for s in (5, 5, 6))
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.windows, b.windows)
    assert not np.array_equal(a.indices, c.indices)
    # streams come out in (request, layer) order whatever the threads did
    order = [(r, l) for r, l, _, _ in G.synthetic_streams(2048, seed=5, **kw)]
    assert order == [(r, l) for r in range(2) for l in range(3)]


def test_drift_candidate_set_matches_the_full_model():
    # small cases and the real geometry (32K, K 2048) at overlaps where the restriction prunes most tokens
    for L, k, win, prof in ((4096, 256, 8, [0.0, 0.5, 0.9]), (32768, 2048, None, [0.8, 0.9])):
        kw = dict(n_layers=len(prof), k=k, mtp=2, steps=6, batch=1, warmup_windows=3, seed=4, profile=prof,
                  local_window=win, trace_model="drift")
        cut = G.synthetic_trace(L, **kw)
        full = G.synthetic_trace(L, drift_cutoff_sigmas=float("inf"), **kw)
        assert np.array_equal(cut.indices, full.indices) and np.array_equal(cut.windows, full.windows)
    cal = LM.drift_calibration(0.9, 32768, 2048)
    _, _, n_cand = G._drift_run(1, 32768 + 12, 32768, 2048, 2, 6, 0, cal["pi"], cal["rho"], 4, 64, 6.0)
    assert n_cand < 0.5 * 32768                      # it does prune (the bound is what makes it safe)


def test_drift_entries_that_drop_out_come_back_more_often_than_chance():
    """The point of the model: a token that leaves the top-K sits near the threshold and returns soon."""
    def return_rate(model):
        tr = G.synthetic_trace(32768, n_layers=1, k=2048, mtp=1, steps=10, batch=1, warmup_windows=0, seed=9,
                               profile=[0.475], trace_model=model)
        rows = [set(r[r >= 0]) - set(range(4)) for r in tr.indices[0, 0]]
        back = [len((rows[t - 2] - rows[t - 1]) & rows[t]) / max(len(rows[t - 2] - rows[t - 1]), 1)
                for t in range(2, len(rows))]
        return float(np.mean(back))
    chance = 2048 / 32768                            # a uniformly random entry's chance to be selected
    assert return_rate("drift") > 2 * chance         # measured 0.17 (seed 9)
    assert return_rate("uniform") < chance           # measured 0.035: new entries avoid the previous set


def test_unknown_trace_model_and_misplaced_options_raise():
    with pytest.raises(ValueError, match="trace_model must be one of"):
        G.synthetic_trace(512, n_layers=1, k=32, steps=1, batch=1, trace_model="markov")
    with pytest.raises(ValueError, match="trace_model must be one of"):
        next(G.synthetic_streams(512, n_layers=1, k=32, steps=1, batch=1, trace_model=3))
    with pytest.raises(ValueError, match="popularity_sigma belongs to trace_model='uniform'"):
        G.synthetic_trace(512, n_layers=1, k=32, steps=1, batch=1, trace_model="drift", popularity_sigma=1.0)
    with pytest.raises(ValueError, match="belong to trace_model='drift'"):
        G.synthetic_trace(512, n_layers=1, k=32, steps=1, batch=1, trace_model="uniform", drift_rho=0.3)
    with pytest.raises(ValueError, match="drift_rho"):
        G.synthetic_trace(512, n_layers=1, k=32, steps=1, batch=1, trace_model="drift", drift_rho=1.0)
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
    assert c.kwargs()["reading"] == c.reading and "locality" in c.config()
    with pytest.raises(ValueError, match="drift_rho"):
        LM.LocalityModel("x", "uniform", "fraction", 0.3)
    with pytest.raises(ValueError, match="reading"):
        LM.LocalityModel("x", "drift", "both", 0.3)
    with pytest.raises(ValueError, match="at must be one of"):
        LM.fitted_drift_rho("fraction", "at_95")
