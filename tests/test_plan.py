"""The front door: ess.plan / `ess plan` / `ess simulate`, the stored inputs behind them, and the calibrated default.

Each test names the mistake it catches."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ess
from ess import planning as pl
from ess.sim import Scenario, simulate
from ess.sim import grid as sgrid
from ess.sim import store
from ess.sim.costs import CostParams
from ess.specs import host_link_spec, list_gpus, list_host_links, reference_link
from ess.locality import locality_named

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------ calibrated default
def test_default_simulate_is_calibrated_not_unfitted():
    """Mistake: a default Scenario() pricing with CostParams() (compute x1, no fixed time): 16,033 tok/s at Table 2
    row 1's configuration instead of the calibrated ~9,650 (the paper's calibration row: 9,648)."""
    default = float(simulate(52, 32768).throughput[0])
    calibrated = float(simulate(52, 32768, scenario=Scenario(params=store.stored_calibration()["central"]))
                       .throughput[0])
    unfitted = float(simulate(52, 32768, scenario=Scenario(params=CostParams())).throughput[0])
    assert default == calibrated
    assert abs(default - unfitted) / unfitted > 0.2
    assert abs(default - 9648) / 9648 < 0.02              # Table 2 row 1 is a calibration point: it is fitted well
    assert Scenario().params.fitted_on != "unfitted"


@pytest.mark.slow
def test_stored_calibration_is_the_fit():
    """Mistake: data/generated/calibration.json out of step with the fit it claims to hold (the fit or its inputs
    changed and `ess calibrate` was not run). Regenerates the calibration (about 15 s) and compares every value."""
    fresh = store.calibration_payload()
    shipped = json.loads((store.GENERATED_DIR / "calibration.json").read_text())
    assert shipped["inputs_sha256"] == store.inputs_digest(), "data/ changed since `ess calibrate`: run it again"
    for part in ("central",):
        for k, v in fresh[part].items():
            assert shipped[part][k] == pytest.approx(v, rel=1e-12) if isinstance(v, float) else shipped[part][k] == v
    for part in ("calibrations", "extrapolation"):
        assert list(shipped[part]) == list(fresh[part])
        for name in fresh[part]:
            for k, v in fresh[part][name].items():
                if isinstance(v, float):
                    assert shipped[part][name][k] == pytest.approx(v, rel=1e-12), (part, name, k)
                else:
                    assert shipped[part][name][k] == v


@pytest.mark.parametrize("index", range(len(pl.shipped_tables())))
def test_stored_miss_rows_are_the_cache_simulation(index):
    """Mistake: a shipped miss table whose counts the cache simulation no longer gives (a changed generator, policy
    or locality model). Recomputes, for every shipped table, its row at the shortest context (two of its ratios)
    and compares."""
    t = pl.shipped_tables()[index][0]
    path = store.stored_table_path(t)
    d = json.loads(path.read_text())
    assert d["config"] == store.table_identity(t)
    key = min(d["rows"], key=lambda k: int(k.split(",")[0]))
    L, T = (int(x) for x in key.split(","))
    ratios = [float(r) for r in d["rows"][key]][:2]
    t.prefetch((L, r, T) for r in ratios)
    for r in ratios:
        want = d["rows"][key][repr(r)]
        got = t._rows[(L, T)][r]
        if isinstance(want, str):
            assert got == want
        else:
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


def test_stale_store_is_not_trusted(tmp_path, monkeypatch):
    """Mistake: a stored table read although its inputs changed (another digest): its rows must not be loaded."""
    t = pl.shipped_tables()[0][0]
    src = json.loads(store.stored_table_path(t).read_text())
    src["inputs_sha256"] = "0" * 64
    (tmp_path / "misses").mkdir()
    (tmp_path / "misses" / "x.json").write_text(json.dumps(src))
    monkeypatch.setattr(store, "GENERATED_DIR", tmp_path)
    monkeypatch.setenv("ESS_CACHE_DIR", str(tmp_path / "cache"))
    assert store.seed_table(pl.shipped_tables()[0][0]) == 0
    src["inputs_sha256"] = store.inputs_digest()
    (tmp_path / "misses" / "x.json").write_text(json.dumps(src))
    store._shipped_index.cache_clear()                   # the shipped files are read once per process
    assert store.seed_table(pl.shipped_tables()[0][0]) > 0


def test_user_cache_round_trip_and_code_key(tmp_path, monkeypatch):
    """Mistakes: rows computed on demand not kept (the next process recomputes), kept rows read back wrong, or a
    cache entry trusted after the code that computed it changed."""
    monkeypatch.setenv("ESS_CACHE_DIR", str(tmp_path))
    from ess.sim.misses import MissesTable
    t = MissesTable(steps=2, batch=1, model="deepseek-v4-flash")
    t.prefetch([(8192, 0.5, 1)])
    path = store.save_table(t)
    assert path is not None and path.parent.parent == tmp_path
    u = MissesTable(steps=2, batch=1, model="deepseek-v4-flash")
    assert store.seed_table(u, shipped=False) == 1
    np.testing.assert_array_equal(u._rows[(8192, 1)][0.5], t._rows[(8192, 1)][0.5])
    other = MissesTable(steps=3, batch=1, model="deepseek-v4-flash")               # other settings: another entry
    assert store.seed_table(other, shipped=False) == 0
    d = json.loads(path.read_text())
    d["code_sha256"] = "f" * 64
    path.write_text(json.dumps(d))
    assert store.seed_table(MissesTable(steps=2, batch=1, model="deepseek-v4-flash"), shipped=False) == 0
    path.write_text("{torn")                                                      # a torn file is ignored
    assert store.seed_table(MissesTable(steps=2, batch=1, model="deepseek-v4-flash"), shipped=False) == 0


def test_two_processes_write_one_cache_entry(tmp_path):
    """Mistake: two processes keeping rows in one cache entry leave a torn or empty file. Each child computes other
    points of one table and saves; the entry afterwards is whole JSON and holds at least one child's rows."""
    code = ("import sys; from ess.sim.misses import MissesTable; from ess.sim import store\n"
            "t = MissesTable(steps=2, batch=1, model='deepseek-v4-flash')\n"
            "t.prefetch([(8192, float(sys.argv[1]), 1)]); store.save_table(t)\n")
    env = {**os.environ, "ESS_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code, r], env=env) for r in ("0.5", "0.6")]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    files = list((tmp_path / "misses").glob("*.json"))
    assert len(files) == 1 and not list((tmp_path / "misses").glob(".*"))      # no temporary file left
    rows = json.loads(files[0].read_text())["rows"]["8192,1"]
    assert set(rows) & {"0.5", "0.6"}


# ----------------------------------------------------------------------------------------------------- plan
@pytest.fixture(scope="module")
def paper_plan():
    return pl.plan("deepseek-v3.2-exp", "H200", 32768)


@pytest.mark.slow
def test_plan_is_notebook_10s_grid_cell_for_cell():
    """Mistake: ess.plan answering otherwise than the grid of notebook 10 (another search, table, calibration or
    band). Every model x GPU x link of data/ at one context: the plan's best batch, ratio, throughput, gain, bands,
    limit and link speeds equal the grid's row, computed by the grid's batched path (one search per model and GPU
    over every link)."""
    inputs = pl.planner_inputs()
    models = list(sgrid.GRID_MODELS)
    gpus = [g for g in list_gpus() if g != "A100-80G"]
    cells = sgrid.grid_cells(models, gpus, [65536])
    found = sgrid.grid_search(cells, inputs)
    be, _ = sgrid.break_even_link(found, inputs)
    speeds = sgrid.overlap_links(found, inputs)
    grid = sgrid.grid_bands(found, inputs).assign(break_even=be, serial=speeds.serial_GB_per_s)
    assert len(grid) >= 3 * len(gpus)
    for _, row in grid.iterrows():
        p = pl.plan(row.model, row.gpu, int(row.context_len), link=row.link)
        if pd_na(row.get("best_batch")):
            assert p.throughput is None and p.reason
            continue
        assert (p.batch, p.ratio) == (int(row.best_batch), float(row.best_ratio)), (row.model, row.gpu, row.link)
        assert p.throughput == pytest.approx(row.throughput, rel=1e-12)
        assert p.gain_pct == pytest.approx(row.gain_pct, rel=1e-12, abs=1e-12)
        assert p.gain_band == pytest.approx((row.gain_pct_low, row.gain_pct_high), rel=1e-12)
        assert p.gain_band_calibration == pytest.approx((row.gain_pct_cal_low, row.gain_pct_cal_high), rel=1e-12)
        assert p.baseline_batch == int(row.batch_no_offload)
        assert p.limit == pl.LIMITS[row.limit]
        for got, want in ((p.break_even_GB_per_s, row.break_even), (p.serial_GB_per_s, row.serial)):
            assert (got is None and math.isnan(want)) or got == pytest.approx(want, rel=1e-12)


def pd_na(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def test_plan_fields_by_hand(paper_plan):
    """Mistakes in the derived fields: pool slots not floor(ratio x padded context), host memory not batch x the
    latent cache of one request, misses not the table's, a link share over 1, a band that does not hold its
    centre, the calibration band wider than the extrapolation band."""
    p = paper_plan
    assert p.verdict == "pays" and p.batch > p.baseline_batch
    padded = math.ceil(32768 / 64) * 64
    assert p.gpu_pool_slots_per_request_per_layer == math.floor(p.ratio * padded + 1e-9)
    per_request = 61 * 656 * padded                               # 61 layers x 656-B FP8 entries (ess.layout)
    assert p.host_memory_GB_per_gpu == pytest.approx(p.batch * per_request / 1e9, rel=1e-9)
    table = pl.planner_inputs().table("deepseek-v3.2-exp")
    np.testing.assert_array_equal(p.misses_per_layer, table(32768, p.ratio, 2))
    copy_s = sum(p.misses_per_layer) * p.batch * 656 / 37e9
    assert p.link_busy_share == pytest.approx(copy_s / (p.step_ms / 1e3), rel=1e-9)
    lo, hi = p.throughput_band
    c_lo, c_hi = p.throughput_band_calibration
    assert lo <= c_lo <= p.throughput <= c_hi <= hi
    assert p.gain_band[0] <= p.gain_pct <= p.gain_band[1]
    assert p.extrapolated == () and p.calibrated                 # the paper's own cell: nothing extrapolated
    assert len(p.strategy_per_layer) == 61 and set(p.strategy_per_layer) <= {"none", "da", "dba"}
    # the curve: the plan's point on it, and per-request speed = throughput / batch
    c = p.curve
    i = c.batch.index(p.batch)
    assert c.throughput_per_gpu[i] == pytest.approx(p.throughput, rel=1e-12)
    assert c.tokens_per_s_per_request[i] == pytest.approx(p.throughput / p.batch, rel=1e-12)
    assert max(c.throughput_per_gpu_no_offload) == pytest.approx(p.baseline_throughput, rel=1e-12)


def test_plan_words_json_and_serving(paper_plan):
    """Mistakes: a verdict not in three lines, JSON that does not load, serving settings that disagree with the
    plan."""
    p = paper_plan
    lines = str(p).splitlines()
    assert len(lines) == 3 and lines[0].startswith("Offload pays") and f"{p.batch} requests per GPU" in lines[1]
    assert "Calibrated:" in p.explain() and "Extrapolated: nothing" in p.explain()
    d = json.loads(json.dumps(p.to_dict()))
    assert d["batch"] == p.batch and d["curve"]["batch"][0] == 1
    s = p.serving()
    assert (s["batch_per_gpu"], s["sparse_memory_ratio"], s["top_k"]) == (p.batch, p.ratio, 2048)
    assert s["gpu_pool_slots_per_request_per_layer"] == p.gpu_pool_slots_per_request_per_layer
    fig = p.figure()
    assert len(fig.data) == 4


def test_plan_extrapolation_is_said():
    """Mistake: a cell off the paper's model, GPU or MTP said to be calibrated."""
    p = pl.plan("glm-5", "B200", 65536)
    assert any("glm-5" in e for e in p.extrapolated) and any("B200" in e for e in p.extrapolated)
    assert "Extrapolated: nothing" not in p.explain()


@pytest.mark.slow
def test_plan_fixed_ratio_and_strategy():
    """Mistakes: a fixed ratio or strategy ignored (the search's choice returned instead)."""
    best = pl.plan("deepseek-v3.2-exp", "H200", 32768)
    fixed = pl.plan("deepseek-v3.2-exp", "H200", 32768, ratio=0.5)
    assert fixed.ratio == 0.5 and fixed.batch < best.batch
    none = pl.plan("deepseek-v3.2-exp", "H200", 32768, strategy="none")
    assert set(none.strategy_per_layer) == {"none"}
    assert none.throughput <= best.throughput + 1e-9


@pytest.mark.parametrize("kw, name", [
    (dict(model="llama"), "model"), (dict(model=3), "model"), (dict(gpu="TPU"), "gpu"),
    (dict(context_len=0), "context_len"), (dict(context_len=32768.5), "context_len"),
    (dict(context_len=10 ** 7), "context_len"), (dict(link="pcie9"), "link"), (dict(link="c2c-gh200"), "link"),
    (dict(mtp=0), "mtp"), (dict(mtp=3), "accept_ratio"), (dict(mtp=2, accept_ratio=2.5), "accept_ratio"),
    (dict(ratio=1.0), "ratio"), (dict(ratio=0), "ratio"), (dict(ratio="most"), "ratio"),
    (dict(strategy="fast"), "strategy"), (dict(mtp=True), "mtp")])
def test_plan_refuses_bad_input_naming_it(kw, name):
    """Mistake: a meaningless question answered (or failing deep inside) instead of an error naming the argument."""
    args = {"model": "deepseek-v3.2-exp", "gpu": "H200", "context_len": 32768, **kw}
    with pytest.raises((ValueError, TypeError), match=name):
        pl.plan(args.pop("model"), args.pop("gpu"), args.pop("context_len"), **args)


@pytest.mark.parametrize("text, want", [("32768", 32768), ("32k", 32768), ("64K", 65536), ("1M", 1048576),
                                        (" 8k ", 8192)])
def test_parse_tokens(text, want):
    assert pl.parse_tokens(text) == want


@pytest.mark.parametrize("text", ["32q", "1.5", "", "k", "-8k", "0"])
def test_parse_tokens_refuses(text):
    with pytest.raises(ValueError):
        pl.parse_tokens(text)


def test_simulate_config_matches_simulate():
    """Mistake: `ess simulate` pricing with other costs or misses than the plan's scenario."""
    r = pl.simulate_config(52, 32768)
    assert r["feasible"] and r["ratio"] == 1.0
    p = pl.plan("deepseek-v3.2-exp", "H200", 32768)
    assert r["throughput_per_gpu"] == pytest.approx(p.curve.throughput_per_gpu_no_offload[51], rel=1e-12)
    with pytest.raises(ValueError, match="ratio"):
        pl.simulate_config(52, 32768, "best")
    with pytest.raises((ValueError, TypeError), match="batch"):
        pl.simulate_config(0, 32768)


# ------------------------------------------------------------------------------------------------------ CLI
def _ess(*args, env=None):
    return subprocess.run([sys.executable, "-m", "ess", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=300)


def test_cli_plan_agrees_with_the_call_and_says_three_lines():
    """Mistakes: the command answering another question than ess.plan with the same inputs (a flag parsed
    wrongly: 64k not 65,536), or printing more than the verdict."""
    r = _ess("plan", "--model", "glm-5", "--gpu", "H100", "--context", "64k", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    p = pl.plan("glm-5", "H100", 65536)
    assert (d["batch"], d["ratio"], d["context_len"]) == (p.batch, p.ratio, 65536)
    assert d["throughput"] == pytest.approx(p.throughput, rel=1e-12)
    r = _ess("plan", "--model", "glm-5", "--gpu", "H100", "--context", "64k")
    assert r.returncode == 0 and r.stdout.strip() == str(p)
    s = _ess("plan", "--serving")
    assert s.returncode == 0 and json.loads(s.stdout)["batch_per_gpu"] > 0


@pytest.mark.parametrize("args, flag", [(("plan", "--context", "64q"), "--context"),
                                        (("plan", "--gpu", "TPU"), "--gpu"),
                                        (("plan", "--gpu", "H100", "--link", "c2c-gh200"), "link"),
                                        (("plan", "--mtp", "3"), "--accept-ratio"),
                                        (("plan", "--model", "tiny", "--context", "8k"), "--context"),
                                        (("simulate", "--batch", "x"), "--batch")])
def test_cli_bad_input_one_line_exit_2(args, flag):
    """Mistake: a traceback, or an error that does not name the flag, where the command promises one line."""
    r = _ess(*args)
    assert r.returncode == 2
    err = [ln for ln in r.stderr.splitlines() if not ln.startswith(("usage:", " "))]
    assert len(err) == 1 and flag in err[0] and "Traceback" not in r.stderr, r.stderr


def test_cli_misses_is_the_workloads_cache_simulation():
    """Mistakes: a flag made from a Workload field parsed wrongly (32k not 32,768; --layers not reaching n_layers),
    the command simulating another workload or ratio than the call, or a hit rate over the wrong denominator."""
    from ess.cachesim import sweep_synthetic
    from ess.tracegen import Workload
    r = _ess("misses", "--context", "32k", "--ratio", "0.2", "--steps", "6", "--batch", "1", "--layers", "4",
             "--locality", "uniform", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    w = Workload(32768, steps=6, batch=1, n_layers=4, locality=locality_named("uniform"))
    assert d["workload"] == w.config()
    sel = np.zeros((4, 6))
    want = sweep_synthetic(w, [0.2], selected=sel)[(0.2, "lru", True)]
    assert d["misses_per_layer"] == pytest.approx(want.mean(axis=1).tolist(), rel=1e-12)
    assert d["hit_rate"] == pytest.approx(1 - want.sum() / sel.sum(), rel=1e-12)
    text = _ess("misses", "--context", "32k", "--ratio", "0.2", "--steps", "6", "--batch", "1", "--layers", "4",
                "--locality", "uniform", "--no-warmup")
    assert text.returncode == 0 and "uniform" in text.stdout and "hit rate" in text.stdout
    assert "LRU-Warmup" not in text.stdout.splitlines()[0]


@pytest.mark.parametrize("args, flag", [(("--context", "32k", "--ratio", "0.2", "--mtp", "0"), "--mtp"),
                                        (("--context", "32q", "--ratio", "0.2"), "--context"),
                                        (("--context", "32k", "--ratio", "0.2", "--locality", "nope"), "--locality"),
                                        (("--ratio", "0.2"), "--context"),
                                        (("--context", "1k", "--ratio", "0.2"), "k (top-K)")])
def test_cli_misses_bad_input_one_line_exit_2(args, flag):
    """Mistake: a workload the library refuses reaching the user as a traceback, or without the flag named."""
    r = _ess("misses", *args)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and flag in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_cli_listings_carry_sources():
    """Mistake: a listing without the source of its values."""
    r = _ess("links", "--json")
    d = json.loads(r.stdout)
    assert set(d) == set(list_host_links())
    assert d["pcie5-flashtrans"]["h2d_GB_per_s"]["source"] and d["pcie5-flashtrans"]["d2h_GB_per_s"]["source"]
    r = _ess("gpus")
    assert r.returncode == 0 and "H200" in r.stdout and "[" in r.stdout


def test_reference_links_serve_their_gpus():
    """Mistake: a GPU whose default link cannot serve it (ess.plan would fail on its defaults)."""
    for g in list_gpus():
        if g == "A100-80G":                       # no deployment of the paper's shape: ess.plan refuses it
            with pytest.raises(ValueError, match="gpu"):
                pl.plan("deepseek-v3.2-exp", g, 32768)
            continue
        assert host_link_spec(reference_link(g)).serves(ess.gpu_spec(g))


@pytest.mark.parametrize("row", [[1.0, 2.0], [-5.0] * 21, [float("nan")] * 21])
def test_cache_rows_that_do_not_fit_are_not_loaded(tmp_path, monkeypatch, row):
    """Mistake: a user-cache entry whose header checks out loaded whatever its rows hold (a wrong length, negative
    or NaN counts): the whole entry is refused with a warning, and the table computes its own."""
    monkeypatch.setenv("ESS_CACHE_DIR", str(tmp_path))
    from ess.sim.misses import MissesTable
    t = MissesTable(steps=2, batch=1, model="deepseek-v4-flash")
    t.prefetch([(8192, 0.5, 1)])
    path = store.save_table(t)
    d = json.loads(path.read_text())
    d["rows"]["8192,1"]["0.5"] = row
    d["rows"]["8192,1"]["0.6"] = [1.0] * 21                  # a good row beside it is not loaded either
    path.write_text(json.dumps(d))
    u = MissesTable(steps=2, batch=1, model="deepseek-v4-flash")
    with pytest.warns(store.StaleStoreWarning, match="do not fit"):
        assert store.seed_table(u, shipped=False) == 0
    assert not u._rows


def test_plan_prices_the_link_after_the_hosts_memory_share():
    """Mistake: the link share and the printed speed taken from the nominal link where the host's DRAM share caps
    it (a B300 on PCIe 6: 118 GB/s nominal)."""
    p = pl.plan("glm-5", "B300", 131072, link="pcie6")
    assert p.link_effective_GB_per_s < p.link_GB_per_s
    copy_s = sum(p.misses_per_layer) * p.batch * 656 / (p.link_effective_GB_per_s * 1e9)
    assert p.link_busy_share == pytest.approx(copy_s / (p.step_ms / 1e3), rel=1e-9)
    assert "after the host's memory share" in str(p)
