"""The beyond-the-paper grid (ess.sim.grid) against plain references: the best configuration of a cell against a
search written out ratio by ratio, the link speeds against their definitions one step either side, the bands
against the combinations they span, on miss tables that need no cache simulation (a fixed, decreasing function of
the ratio) so that every check runs in seconds."""
import numpy as np
import pandas as pd
import pytest

from ess import memory
from ess.sim import Scenario, simulate
from ess.sim import grid as sgrid
from ess.sim.costs import CostParams
from ess.sim.misses import BandSizes
from ess.specs import deployment_spec, host_link_spec, model_spec
from ess.locality import locality_alternatives


class FakeTable:
    """Misses per sparse layer: ``level x 0.2 / ratio``, capped at what a step selects; the same for every context
    (``shift`` moves every count, as another locality model would)."""

    def __init__(self, model, shift=1.0):
        self.model = model_spec(model)
        self.shift = shift
        self.config = {"fake": True}

    def __call__(self, L, r, mtp):
        k = min(self.model.index_topk, self.model.sparse_rows(int(L)))
        return np.full(self.model.n_sparse_layers, min(60.0 * self.shift * 0.2 / float(r), mtp * k))

    def prefetch(self, points):
        list(points)

    def describe(self):
        return "a fake table"


@pytest.fixture(scope="module")
def inputs():
    p = CostParams(0.6, 1.2, 46.0, fitted_on="a test")
    locs = list(locality_alternatives())
    inp = sgrid.GridInputs(p, {"central": p, "slower": CostParams(0.7, 1.2, 46.0)},
                           {"kernel efficiencies low": CostParams(0.6, 1.2, 46.0, efficiency="low"),
                            "Blackwell attention at the measured B200 point":
                                CostParams(0.6, 1.2, 46.0, attention_transfer="b200-measured")},
                           locs, BandSizes(steps=8, batch=1, band_batch=1))
    for m in ("deepseek-v3.2", "glm-5", "deepseek-v4-flash"):
        for i, loc in enumerate(locs):
            inp.tables[(m, loc.name, "paper")] = FakeTable(m, 1.0 + 0.3 * i)
        inp.tables[(m, locs[0].name, "flat")] = FakeTable(m, 0.7)
    return inp


def test_cells_take_the_links_that_serve_each_gpu_and_the_contexts_each_model_reaches():
    c = sgrid.grid_cells(["deepseek-v3.2", "deepseek-v4-flash"], ["H200", "GB200", "B300"], [32768],
                         long_contexts=[1048576])
    assert set(c[c.gpu == "GB200"].link) == {"c2c-gh200", "c2c-gb300"}
    assert "pcie6" in set(c[c.gpu == "B300"].link) and "pcie6" not in set(c[c.gpu == "H200"].link)
    assert set(c[c.model == "deepseek-v3.2"].context_len) == {32768}          # 163,840 positions: no 1M
    assert set(c[c.model == "deepseek-v4-flash"].context_len) == {32768, 1048576}
    assert (c[c.gpu == "H200"].deployment == "paper-table1").all()
    assert (c[c.gpu == "GB200"].deployment == "paper-shape-gb200").all()


def test_ratio_grid_starts_where_a_step_fits():
    r = sgrid.ratio_grid("deepseek-v3.2", 32768, 2, 8)
    assert r[0] == memory.smallest_step_ratio(32768, 2, model=model_spec("deepseek-v3.2"))
    assert list(r) == sorted(r) and r[-1] == 0.8 and len(r) == 8
    assert sgrid.ratio_grid("deepseek-v4-flash", 1048576, 2, 8)[0] < 0.01 + 1e-9


def test_accept_ratios_are_the_sourced_ones():
    assert sgrid.accept_ratio_for(1, "paper-table1") == 1.0
    assert sgrid.accept_ratio_for(2, "paper-table1") == 1.7
    assert sgrid.accept_ratio_for(4, "paper-table1") == 2.8
    with pytest.raises(ValueError, match="no sourced accept ratio"):
        sgrid.accept_ratio_for(3, "paper-table1")


@pytest.mark.parametrize("model,gpu,link,L", [("deepseek-v3.2", "H200", "pcie5-flashtrans", 32768),
                                              ("glm-5", "B200", "pcie5", 65536),
                                              ("deepseek-v4-flash", "GB200", "c2c-gb300", 1048576)])
def test_the_search_finds_what_a_plain_search_finds(inputs, model, gpu, link, L):
    """Ratio by ratio: the memory limit of :func:`ess.memory.largest_batch` capped at 320, every batch up to it
    simulated, the best kept; the same for ratio 1."""
    cells = sgrid.grid_cells([model], [gpu], [L], links=[link])
    found = sgrid.grid_search(cells, inputs).iloc[0]
    dep = deployment_spec(sgrid.grid_deployment(gpu))
    lk = host_link_spec(link)
    sc = Scenario(model=model, deployment=dep.name, gpu=gpu, params=inputs.params)
    best = {}
    for r in (1.0, *sgrid.ratio_grid(model, L, 2, 8)):
        lim = memory.largest_batch(L, r, mtp=2, model=model, deployment=dep.name, gpu=gpu)
        b = min(lim.batch, 320)
        if b == 0:
            continue
        B = np.arange(1, b + 1)
        m = FakeTable(model)(L, r, 2) if r < 1 else np.zeros(model_spec(model).n_sparse_layers)
        t = simulate(B, L, r, misses=m, mtp=2, accept_ratio=1.7, h2d_GB_per_s=lk.h2d_GB_per_s,
                     d2h_GB_per_s=lk.d2h_GB_per_s, scenario=sc).throughput_per_gpu
        best[r] = (int(B[np.argmax(t)]), float(np.max(t)))
    off = max((v[1], r) for r, v in best.items() if r < 1)
    assert found.best_ratio == off[1] and found.best_batch == best[off[1]][0]
    assert np.isclose(found.throughput, off[0], rtol=1e-12)
    assert np.isclose(found.throughput_no_offload, best[1.0][1], rtol=1e-12)
    assert np.isclose(found.gain_pct, (off[0] / best[1.0][1] - 1) * 100, rtol=1e-12)


def test_the_cell_view_agrees_with_the_search(inputs):
    cells = sgrid.grid_cells(["glm-5"], ["H20"], [32768], links=["pcie5-flashtrans"])
    found = sgrid.grid_search(cells, inputs).iloc[0]
    v = sgrid.cell_view(inputs, "glm-5", "H20", "pcie5-flashtrans", 32768, 2, "best")
    assert (v.ratio, v.best_batch, v.batch_no_offload) == (found.best_ratio, found.best_batch, found.batch_no_offload)
    assert np.isclose(v.gain_pct, found.gain_pct, rtol=1e-12)
    fixed = sgrid.cell_view(inputs, "glm-5", "H20", "pcie5-flashtrans", 32768, 2, 0.5)
    assert fixed.ratio == 0.5 and fixed.best_throughput <= v.best_throughput + 1e-9
    bad = sgrid.cell_view(inputs, "glm-5", "H20", "pcie5-flashtrans", 32768, 2, 0.01)
    assert bad.reason and not len(bad.batches)
    with pytest.raises(ValueError, match="ratio"):
        sgrid.cell_view(inputs, "glm-5", "H20", "pcie5-flashtrans", 32768, 2, "all")


@pytest.fixture(scope="module")
def found(inputs):
    cells = sgrid.grid_cells(["deepseek-v3.2", "deepseek-v4-flash"], ["H200", "B200", "GB200"], [32768, 131072],
                             links=["pcie5-flashtrans", "c2c-gb300"])
    return sgrid.grid_search(cells, inputs)


def _best_at(inputs, cell, speed):
    """Offload's best over the break-even search's candidates at one host-to-device speed (plain loop)."""
    model, gpu, L = cell.model, cell.gpu, int(cell.context_len)
    sc = Scenario(model=model, deployment=sgrid.grid_deployment(gpu), gpu=gpu, params=inputs.params,
                  host_memory_cap=False)
    best = -np.inf
    for r in sgrid.ratio_grid(model, L, 2, 8):
        b = min(memory.largest_batch(L, r, mtp=2, model=model, deployment=sgrid.grid_deployment(gpu),
                                     gpu=gpu).batch, 320)
        if b == 0:
            continue
        B = np.unique(np.round(np.geomspace(1, b, min(b, 12)))).astype(int)
        t = simulate(B, L, r, misses=FakeTable(model)(L, r, 2), mtp=2, accept_ratio=1.7, h2d_GB_per_s=speed,
                     d2h_GB_per_s=speed * cell.d2h_GB_per_s / cell.h2d_GB_per_s, scenario=sc).throughput_per_gpu
        best = max(best, float(np.nanmax(t)))
    return best


def test_break_even_is_where_offload_starts_to_pay(inputs, found):
    be, below = sgrid.break_even_link(found, inputs)
    seen = 0
    for i, cell in found.iterrows():
        v = be[i]
        if np.isnan(v) or below[i]:
            continue
        seen += 1
        assert _best_at(inputs, cell, v * 1.02) > cell.throughput_no_offload
        assert _best_at(inputs, cell, v / 1.02) <= cell.throughput_no_offload
    assert seen >= 3
    capped = found.limit_no_offload == "batch cap"
    assert np.isnan(be[capped & (found.gain_pct < 0)]).all()        # no speed makes a capped batch larger


def test_the_overlap_speeds_meet_their_definitions(inputs, found):
    sp = sgrid.overlap_links(found, inputs)
    tol = sgrid.TOLERANCE
    for i, cell in found.iterrows():
        sc = Scenario(model=cell.model, deployment=sgrid.grid_deployment(cell.gpu), gpu=cell.gpu,
                      params=inputs.params, host_memory_cap=False)
        m = FakeTable(cell.model)(cell.context_len, cell.best_ratio, 2)
        k = cell.d2h_GB_per_s / cell.h2d_GB_per_s

        def run(s, strategy):
            return simulate(cell.best_batch, cell.context_len, cell.best_ratio, misses=m, mtp=2, accept_ratio=1.7,
                            h2d_GB_per_s=s, d2h_GB_per_s=s * k, scenario=sc.replace(strategy=strategy))

        h = sp.hidden_GB_per_s[i]
        if np.isfinite(h) and h > sgrid.LINK_RANGE_GB_PER_S[0]:
            r, r_lo = run(h * 1.01, "best"), run(h / 1.01, "best")
            assert r.stall_s[0] <= tol * r.step_no_offload_s[0] < r_lo.stall_s[0]
        s = sp.serial_GB_per_s[i]
        if np.isfinite(s) and s > sgrid.LINK_RANGE_GB_PER_S[0]:
            up, lo = s * 1.01, s / 1.01
            assert run(up, "none").step_s[0] - run(up, "best").step_s[0] <= tol * run(up, "best").step_no_offload_s[0]
            assert run(lo, "none").step_s[0] - run(lo, "best").step_s[0] > tol * run(lo, "best").step_no_offload_s[0]


def test_bands_hold_the_central_value_and_nest(inputs, found):
    b = sgrid.grid_bands(found, inputs)
    ok = b[b.best_batch.notna()]
    assert ((ok.gain_pct_low <= ok.gain_pct + 1e-9) & (ok.gain_pct <= ok.gain_pct_high + 1e-9)).all()
    assert ((ok.gain_pct_low <= ok.gain_pct_cal_low) & (ok.gain_pct_cal_high <= ok.gain_pct_high)).all()
    # a calibrated cell (the paper's geometry on its H200) spans the calibration band only: 2 calibrations x 3
    # locality models; GB200 adds the kernel ends, Blackwell's attention point and the all-to-all over RDMA
    cal = ok[(ok.model == "deepseek-v3.2") & (ok.gpu == "H200")]
    assert cal.calibrated_cell.all() and (cal.band_size == 2 * len(inputs.localities)).all()
    assert ((cal.gain_pct_low == cal.gain_pct_cal_low) & (cal.gain_pct_high == cal.gain_pct_cal_high)).all()
    gb = ok[(ok.model == "deepseek-v4-flash") & (ok.gpu == "GB200")]
    assert (gb.band_size == 2 * len(inputs.localities) + 2 + 1 + 1).all() and not gb.calibrated_cell.any()
    names = [v[0] for v in sgrid._variants(inputs, "deepseek-v4-flash", "GB200")]
    assert {"Fig. 2 flat at its mean", "all-to-all over RDMA", "Blackwell attention at the measured B200 point"} \
        <= set(names)
    assert "Blackwell attention at the measured B200 point" not in [v[0] for v in sgrid._variants(
        inputs, "glm-5", "H200")]


def test_provenance_names_what_is_extrapolated():
    p = sgrid.cell_provenance("deepseek-v3.2", "H200")
    assert p["calibrated_cell"] and not p["extrapolated"] and len(p["calibrated"]) == 3
    q = sgrid.cell_provenance("deepseek-v4-flash", "GB200")
    text = " ".join(q["extrapolated"])
    assert "21 sparse layers of top-512 rows of 4 tokens" in text and "Blackwell" in text and "NVLink" in text
    assert sgrid.cell_provenance("glm-5", "H20")["extrapolated"][1].startswith("GPU: H20 (Hopper")


def test_evaluate_configs_is_the_simulator_on_the_cell(inputs):
    ev = sgrid.evaluate_configs(inputs, "deepseek-v3.2", "H200", "pcie5-flashtrans", 32768, [52, 160], [1.0, 0.21],
                                check_memory=False)
    sc = Scenario(model="deepseek-v3.2", params=inputs.params, check_memory=False)
    r = simulate(160, 32768, 0.21, misses=FakeTable("deepseek-v3.2")(32768, 0.21, 2), scenario=sc)
    assert np.isclose(ev.throughput.iloc[1], r.throughput[0], rtol=1e-12)
    assert ev.feasible.all()
