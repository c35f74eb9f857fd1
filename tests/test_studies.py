"""The studies the notebooks run: the rule that chooses the locality model, its distances, and the statistics it
rests on."""
import numpy as np
import pytest

from ess.studies import locality as loc
from ess.studies.locality import VLLM_BUFFER_2K_HIT_RATE, buffer_hit_rate


def test_range_distance_and_evidence_distances_worked_examples():
    assert loc.range_distance(0.7, (0.8, 0.9)) == pytest.approx(0.1)          # below: distance to the low end
    assert loc.range_distance(0.85, (0.8, 0.9)) == 0.0                         # inside
    assert loc.range_distance(0.95, (0.8, 0.9)) == pytest.approx(0.05)        # above
    # hit rate 0.77 is 0.03 below vLLM's 0.80; GVR deep mean 0.60 is 0.10 above 0.50, shallow 0.40 is 0.38 above
    # 0.02; without real traces d_E4 is None and the score is 0.03 + 0.48 = 0.51
    d = loc.evidence_distances(0.77, {"deep": 0.60, "shallow": 0.40})
    assert d["d_E2"] == pytest.approx(0.03) and d["d_E3"] == pytest.approx(0.48) and d["d_E4"] is None
    assert d["score"] == pytest.approx(0.51)
    # with real traces: |0.85-0.88| = 0.03, |0.60-0.50| = 0.10, |0.20-0.30| = 0.10 -> mean 0.0767
    d = loc.evidence_distances(0.85, {"deep": 0.45, "shallow": 0.015}, {"hit_2k": 0.85, "union4": 0.6, "return8": 0.2},
                               {"hit_2k": 0.88, "union4": 0.5, "return8": 0.3})
    assert d["d_E2"] == 0 and d["d_E3"] == 0 and d["d_E4"] == pytest.approx(0.23 / 3)
    assert VLLM_BUFFER_2K_HIT_RATE == (0.80, 0.90) and loc.FIT_HIT_RATE["central"] == 0.85


def test_choose_locality_worked_examples():
    scores = {("uniform", "fraction"): 0.68, ("drift", "fraction"): 0.55, ("drift", "jaccard"): 0.72}
    assert loc.choose_locality(scores) == ("drift", "fraction")
    # another candidate lower by more than the tie: it wins
    assert loc.choose_locality({("drift", "fraction"): 0.55, ("drift", "jaccard"): 0.54}, tie=0.005) == \
        ("drift", "jaccard")
    # lower by less than the tie: the earlier default is kept
    assert loc.choose_locality({("drift", "fraction"): 0.55, ("drift", "jaccard"): 0.548}) == ("drift", "fraction")


def test_buffer_hit_rate_follows_the_locality():
    from ess import tracegen as G
    from ess.cachesim import misses_per_step
    from ess.locality import LocalityModel, default_locality
    kw = dict(steps=6, batch=1)
    uniform = LocalityModel.of("uniform")

    def h2k(workload):
        """The statistic by its definition: 1 - misses / K over the second half of the steps, a 2 x K pool."""
        k = workload.k
        return 1 - misses_per_step(workload, 2 * k / workload.context_len)[:, workload.steps // 2:].mean() / k

    # buffer_hit_rate is that statistic on the locality model's workload (MTP 1, every layer of the model)
    high = buffer_hit_rate(16384, locality=uniform, **kw)
    assert high == pytest.approx(h2k(G.Workload(16384, mtp=1, locality=uniform, **kw)), abs=1e-12)
    central = buffer_hit_rate(16384, **kw)                                      # None: the central model
    assert central == buffer_hit_rate(16384, locality=default_locality(), **kw)
    assert abs(central - high) > 0.05                                           # measured 0.86 and 0.66
    # and the statistic follows the overlap: every layer at overlap 1 keeps its set (a step only adds the new window
    # tokens); at overlap 0 nearly every free entry is new each step, so a 2 x K pool hits little beyond the sinks
    # and the window
    w = G.Workload(16384, mtp=1, n_layers=2, locality=uniform, **kw)
    high, low = h2k(w.replace(profile=1.0)), h2k(w.replace(profile=0.0))
    assert high > 0.95 and low < 0.2, (high, low)


def test_fit_drift_rho_bisects_a_falling_hit_rate_and_reports_unreachable_targets():
    kw = dict(steps=8, batch=1, n_layers=2, profile=0.5, context_len=8192)
    seen = {}
    ends = (loc.fit_drift_rho(0.0, reading="fraction", evaluated=seen, **kw),
            loc.fit_drift_rho(1.0, reading="fraction", evaluated=seen, **kw))
    h0, h95 = seen[0.0], seen[0.95]
    assert h0 > h95                                                   # more drift correlation, fewer returns
    assert ends[0]["rho"] == 0.95 and ends[1]["rho"] == 0.0 and not ends[0]["reachable"]
    mid = 0.5 * (h0 + h95)
    f = loc.fit_drift_rho(mid, reading="fraction", evaluated=seen, tol=0.01, **kw)
    assert f["reachable"] and 0 < f["rho"] < 0.95
    assert abs(f["hit_rate"] - mid) <= 0.5 * (h0 - h95)


def test_trace_shape_statistics_on_a_hand_trace():
    from ess.traces import Trace
    # K = 2, context 8, one request and layer: sets {0,1} {0,1} {2,3} {0,1} {0,1} {0,1} (mtp 1)
    idx = np.array([[[[0, 1], [0, 1], [2, 3], [0, 1], [0, 1], [0, 1]]]], np.int32)
    tr = Trace(idx, 8, 2, windows=np.array([[[[0, 1]]]], np.int32))
    s = loc.trace_shape(tr, return_within=2)
    # union of 4 consecutive sets: t=0 {0,1,2,3} 4, t=1 {0,1,2,3} 4, t=2 {0,1,2,3} 4 -> 4 / 8 = 0.5
    assert s["union4"] == pytest.approx(0.5)
    # leaving (within 2, t = 1..3): t=2: 0 and 1 leave, both back at t=3 -> 2/2; t=3: 2 and 3 leave, not back -> 2/4
    assert s["return8"] == pytest.approx(0.5)
    # pool 4 (2 x K) with the window {0,1}: steps 3..5 (second half) all hit -> hit rate 1
    assert s["hit_2k"] == pytest.approx(1.0)
    assert s["overlap"] == pytest.approx((1 + 0 + 0 + 1 + 1) / 5)


def test_model_shape_runs_the_model_at_the_real_geometry():
    from ess import tracegen as G
    from ess.locality import LocalityModel
    uniform = LocalityModel.of("uniform")
    real = G.synthetic_trace(G.Workload(2048, n_layers=2, k=128, mtp=1, steps=24, batch=1, warmup_windows=4, seed=5,
                                        profile=[0.3, 0.8], locality=uniform, local_window=8))
    # the same model, seed and geometry (the generator's 4 sinks set, since model_shape scales them to K otherwise)
    same = loc.model_shape(real, locality=LocalityModel.of("uniform", "fraction"), seed=5, local_window=8, n_sinks=4)
    assert same == pytest.approx(loc.trace_shape(real))
    scaled = loc.model_shape(real, locality=uniform, seed=5, local_window=8)      # 4 x 128 / 2,048 -> 0 sinks
    assert scaled != pytest.approx(loc.trace_shape(real))
    other = loc.model_shape(real, locality=LocalityModel.of("drift", drift_rho=0.0), local_window=8)
    assert other["overlap"] == pytest.approx(loc.trace_shape(real)["overlap"], abs=0.03)   # overlap level matched


def _imported_modules(path, package: str) -> set:
    """Every module a file imports (``import a.b``, ``from a.b import c`` and ``from a import b`` as ``a.b``,
    relative imports resolved against ``package``), at any depth of the file (function-level imports too)."""
    import ast
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def test_nothing_in_ess_outside_the_studies_imports_them():
    """The layer rule of ess.studies: the library's modules (everything in ess but ess/studies) never import a study,
    at module level or inside a function; the notebooks and the tests may."""
    from pathlib import Path

    import ess
    root = Path(ess.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        if rel.parts[:2] == ("ess", "studies"):
            continue
        package = ".".join(rel.parent.parts)                   # what a relative import in the file starts from
        bad = sorted(m for m in _imported_modules(path, package) if m == "ess.studies" or m.startswith("ess.studies."))
        if bad:
            found.append(f"{rel}: {bad}")
    assert len(list(root.rglob("*.py"))) > 50                       # the walk saw the package
    assert not found, "modules outside ess/studies import a study:\n" + "\n".join(found)


def test_the_layer_rule_check_sees_relative_and_late_imports(tmp_path):
    """The check above resolves a relative import against its package and reads imports inside functions."""
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from ..studies import locality\n    from ..studies.real_model.fit import OpCosts\n"
                 "import ess.studies.prefetching\nfrom . import grid\n")
    got = _imported_modules(f, "ess.tables")
    assert {"ess.studies", "ess.studies.locality", "ess.studies.real_model.fit", "ess.studies.prefetching",
            "ess.tables.grid"} <= got
