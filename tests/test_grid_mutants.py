"""Edge cases of the what-if grid (ess.sim.grid) that the broader grid tests leave open: the largest ratio count
and a single ratio are accepted; a pool floor at or above a full cache gives no offload ratio; a chosen overlap
strategy is the one a found frame is read under; an accept ratio below the MTP's own is accepted and recorded; a
cell whose no-offload batch does not fit says why in memory's own words; the no-offload step is in milliseconds;
the provenance names a compression of 2; the bands never ask a miss table about the no-offload rows. Each check is
worked by hand or against the simulator called directly, on the fake miss tables of test_sim_grid."""
import dataclasses
import types

import numpy as np
import pandas as pd
import pytest

from ess.sim import Scenario, simulate
from ess.sim import grid as sgrid
from ess.sim.misses import BandSizes
from ess.specs import model_spec
from test_sim_grid import FakeTable, inputs  # noqa: F401  (the fixture)

MODEL, GPU, LINK, L = "deepseek-v3.2", "H200", "pcie5-flashtrans", 32768


def _cells(contexts=(L,)):
    return sgrid.grid_cells([MODEL], [GPU], list(contexts), links=[LINK])


# ---------------------------------------------------------------------------------------------- ratio grid
def test_ratio_grid_accepts_the_largest_ratio_count():
    """Catches an upper bound one short: ``n = MAX_RATIOS`` is allowed (and one more is refused)."""
    r = sgrid.ratio_grid(MODEL, L, 2, sgrid.MAX_RATIOS)
    assert 1 <= len(r) <= sgrid.MAX_RATIOS and r[-1] == 0.8
    with pytest.raises(ValueError, match="n"):
        sgrid.ratio_grid(MODEL, L, 2, sgrid.MAX_RATIOS + 1)


@pytest.mark.parametrize("floor,expected", [(1.0, ()), (1.5, ()), (0.9, (0.9,)), (0.85, (0.85,))])
def test_a_pool_floor_at_a_full_cache_leaves_no_offload_ratio(monkeypatch, floor, expected):
    """Catches the wrong cut between "the floor alone" and "nothing": when the smallest step ratio is at or above
    ``top`` the grid is that floor while it is an offload ratio (< 1), and empty from 1 on (ratio 1 is no offload;
    a floor of 1.5 or 1.0 must not come back as a ratio)."""
    monkeypatch.setattr(sgrid, "smallest_step_ratio", lambda *a, **k: floor)
    assert sgrid.ratio_grid(MODEL, L, 2, 8, top=0.8) == expected


# -------------------------------------------------------------------------------------------------- strategy
@pytest.mark.parametrize("strategy", ["none", "da", "dba", "best"])
def test_a_found_frame_is_read_under_its_own_strategy(strategy):
    """Catches a reversed column test: a frame with a ``strategy`` column is read under that strategy, one
    without it under the per-layer choice (``"best"``)."""
    assert sgrid._strategy(pd.DataFrame({"strategy": [strategy, strategy]})) == strategy
    assert sgrid._strategy(pd.DataFrame({"model": [MODEL]})) == "best"


def test_overlap_links_hide_the_copies_under_the_searched_strategy(inputs):  # noqa: F811
    """Catches the same through the public entry: a cell searched with ``strategy="none"`` (serial copies) hides
    its copies only at the speed where the serial stall is within the tolerance -- worked out here with the
    simulator at strategy ``none`` one step either side of the reported speed."""
    found = sgrid.grid_search(_cells(), inputs, strategy="none")
    cell = found.iloc[0]
    h = sgrid.overlap_links(found, inputs).hidden_GB_per_s.iloc[0]
    assert np.isfinite(h) and h > sgrid.LINK_RANGE_GB_PER_S[0]
    sc = Scenario(model=MODEL, deployment=sgrid.grid_deployment(GPU), gpu=GPU, params=inputs.params,
                  host_memory_cap=False, strategy="none")
    m = FakeTable(MODEL)(L, cell.best_ratio, 2)
    k = cell.d2h_GB_per_s / cell.h2d_GB_per_s

    def stall_share(s):
        r = simulate(cell.best_batch, L, cell.best_ratio, misses=m, mtp=2, accept_ratio=1.7, h2d_GB_per_s=s,
                     d2h_GB_per_s=s * k, scenario=sc)
        return r.stall_s[0] / r.step_no_offload_s[0]

    assert stall_share(h * 1.01) <= sgrid.TOLERANCE < stall_share(h / 1.01)


# -------------------------------------------------------------------------------------------- grid_search
def test_grid_search_takes_a_single_ratio(inputs):  # noqa: F811
    """Catches a lower bound of 2 on ``n_ratios``: one ratio is a grid (the smallest the pools allow)."""
    row = sgrid.grid_search(_cells(), inputs, n_ratios=1).iloc[0]
    assert len(row.ratios_tried) == 1 and row.best_ratio == row.ratios_tried[0]
    assert sgrid.cell_view(inputs, MODEL, GPU, LINK, L, 2, n_ratios=1).ratio == row.best_ratio


def test_grid_search_takes_and_records_an_accept_ratio_between_one_and_the_mtp(inputs):  # noqa: F811
    """Catches a lower bound of 2 on ``accept_ratio``: 1.5 accepted tokens at MTP 2 is allowed, and it is the
    accept ratio the row records and its throughput is priced at (the simulator called directly at 1.5)."""
    row = sgrid.grid_search(_cells(), inputs, accept_ratio=1.5).iloc[0]
    assert row.mtp == 2 and row.accept_ratio == 1.5
    sc = Scenario(model=MODEL, deployment=sgrid.grid_deployment(GPU), gpu=GPU, params=inputs.params)
    t = simulate(int(row.batch_no_offload), L, 1.0, misses=np.zeros(model_spec(MODEL).n_sparse_layers), mtp=2,
                 accept_ratio=1.5, scenario=sc).throughput_per_gpu[0]
    assert np.isclose(row.throughput_no_offload, t, rtol=1e-12)
    with pytest.raises(ValueError, match="accept_ratio"):
        sgrid.grid_search(_cells(), inputs, accept_ratio=0.9)


def test_a_cell_without_a_no_offload_batch_says_why_in_memorys_words(inputs, monkeypatch):  # noqa: F811
    """Catches the reason read from the wrong key: where not even one request fits without offload at one context
    (while another context of the same model and GPU has batches), the cell's reason is the memory limit's own
    text for ratio 1, not the generic "no batch fits"."""
    real = sgrid.batch_limits
    why = "a test: the weights leave no room at ratio 1"

    def limits(Ls, rs, **kw):
        got = real(Ls, rs, **kw)
        cut = (np.asarray(Ls) == 131072) & (np.asarray(rs) >= 1)
        return types.SimpleNamespace(batch=np.where(cut, 0, got.batch),
                                     limited_by=np.where(cut, "infeasible", got.limited_by),
                                     reason=np.where(cut, why, got.reason))

    monkeypatch.setattr(sgrid, "batch_limits", limits)
    found = sgrid.grid_search(_cells((L, 131072)), inputs).set_index("context_len")
    assert found.loc[131072, "reason"] == why
    assert np.isnan(found.loc[131072, "batch_no_offload"])
    assert found.loc[L, "reason"] == "" and found.loc[L, "batch_no_offload"] > 0


def test_the_no_offload_step_is_in_milliseconds(inputs):  # noqa: F811
    """Catches a unit slip: ``step_ms_no_offload`` is the simulator's step at the best no-offload batch x 1000
    (tens of milliseconds for a decode step, never thousandths of a second read as ms)."""
    row = sgrid.grid_search(_cells(), inputs).iloc[0]
    sc = Scenario(model=MODEL, deployment=sgrid.grid_deployment(GPU), gpu=GPU, params=inputs.params)
    r = simulate(int(row.batch_no_offload), L, 1.0, misses=np.zeros(model_spec(MODEL).n_sparse_layers), mtp=2,
                 accept_ratio=1.7, scenario=sc)
    assert np.isclose(row.step_ms_no_offload, r.step_s[0] * 1e3, rtol=1e-12)
    assert 1.0 < row.step_ms_no_offload < 1000.0


# ------------------------------------------------------------------------------------------------- bands
def test_provenance_names_a_compression_of_two(monkeypatch):
    """Catches a threshold above 1 on the compression ratio: a model whose sparse layers select rows of 2 tokens
    says so (no shipped model has a ratio of 2, so a model spec is altered here); a ratio of 1 says nothing."""
    v4 = model_spec("deepseek-v4-flash")
    two = dataclasses.replace(v4, sparse_compress_ratio=2, layer_compress_ratios=tuple(2 if r == 4 else r
                                                                                  for r in v4.layer_compress_ratios))
    monkeypatch.setattr(sgrid, "model_spec", lambda m: two if m == "two" else model_spec(m))
    text = " ".join(sgrid.cell_provenance("two", GPU)["extrapolated"])
    assert f"{two.n_sparse_layers} sparse layers of top-{two.index_topk} rows of 2 tokens" in text
    assert "rows of" not in " ".join(sgrid.cell_provenance("glm-5", GPU)["extrapolated"])


class _OffloadOnlyTable(FakeTable):
    """A miss table that, like a cache simulation asked about a pool it cannot run, refuses ratio 1 -- the bands
    have no reason to ask it: a no-offload row has no misses."""

    asked = []

    def __call__(self, L, r, mtp):
        self.asked.append(float(r))
        if r >= 1:
            raise ValueError("a test: no offload has no misses to simulate")
        return super().__call__(L, r, mtp)


def test_the_bands_never_ask_a_miss_table_about_no_offload(inputs):  # noqa: F811
    """Catches the ratio cut moved past 1: the no-offload rows of the bands take zero misses without consulting
    the table (which here refuses ratio 1, as a table for the offload ratios may), so no combination is counted
    infeasible and the calibration band holds the central gain."""
    found = sgrid.grid_search(_cells(), inputs)
    inp = sgrid.GridInputs(inputs.params, inputs.calibrations, inputs.extrapolation, inputs.localities,
                           BandSizes(steps=8, batch=1, band_batch=1))
    for i, loc in enumerate(inp.localities):
        inp.tables[(MODEL, loc.name, "paper")] = _OffloadOnlyTable(MODEL, 1.0 + 0.3 * i)
    _OffloadOnlyTable.asked = []
    b = sgrid.grid_bands(found, inp).iloc[0]
    assert _OffloadOnlyTable.asked and max(_OffloadOnlyTable.asked) < 1
    assert b.band_infeasible == 0 and b.band_size == 2 * len(inp.localities)
    assert b.gain_pct_cal_low <= found.gain_pct.iloc[0] + 1e-9 <= b.gain_pct_cal_high + 2e-9


# ------------------------------------------------------------------------------------- a second mutation sample
def test_ratio_floor_says_the_best_ratio_is_the_smallest_tried(inputs):  # noqa: F811
    """Catches ``min`` made ``max``: ``ratio_floor`` is True exactly where the best ratio is the smallest the grid
    tried; over these cells both cases occur (so a flag always True or always False fails too)."""
    cells = sgrid.grid_cells([MODEL], [GPU, "B200"], [8192, L, 131072], links=[LINK])
    found = sgrid.grid_search(cells, inputs)
    want = [r.best_ratio == min(r.ratios_tried) for r in found.itertuples()]
    assert found.ratio_floor.tolist() == want
    assert any(want) and not all(want)
    assert all(len(r) >= 2 for r in found.ratios_tried)


def test_break_even_link_accepts_the_largest_ratio_count(inputs):  # noqa: F811
    """Catches an upper bound short of ``MAX_RATIOS`` (and one more is refused, naming ``n_ratios``)."""
    found = sgrid.grid_search(_cells(), inputs)
    speed, below = sgrid.break_even_link(found, inputs, n_ratios=sgrid.MAX_RATIOS, iterations=1)
    assert len(speed) == len(below) == len(found)
    with pytest.raises(ValueError, match="n_ratios"):
        sgrid.break_even_link(found, inputs, n_ratios=sgrid.MAX_RATIOS + 1, iterations=1)


def test_cell_view_takes_the_models_whole_context_and_not_one_more(inputs):  # noqa: F811
    """Catches the context bound one too wide: the model's ``max_position_embeddings`` is a context, one more is
    refused by name."""
    top = model_spec(MODEL).max_position_embeddings
    assert sgrid.cell_view(inputs, MODEL, GPU, LINK, top, 2).context_len == top
    with pytest.raises(ValueError, match="context_len"):
        sgrid.cell_view(inputs, MODEL, GPU, LINK, top + 1, 2)


def test_a_cell_without_an_offload_ratio_still_names_its_no_offload_limit(inputs):  # noqa: F811
    """Catches the no-offload limit read from the wrong field where no offload ratio fits: the no-offload side is
    the same as in a cell whose ratios do fit (memory binds there, not throughput)."""
    class NoPool(FakeTable):
        def __call__(self, L, r, mtp):
            raise ValueError("the pool cannot hold one step's selections")

    ok = sgrid.cell_view(inputs, MODEL, GPU, LINK, L, 2)
    none = sgrid.cell_view(inputs, MODEL, GPU, LINK, L, 2, tables={(MODEL, 2): NoPool(MODEL)})
    assert none.ratio is None and none.reason
    assert none.batch_no_offload == ok.batch_no_offload
    assert none.limit_no_offload == ok.limit_no_offload != "throughput"
