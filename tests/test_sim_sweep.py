"""Sweeps: grids, equality with direct simulation, local processes and a Dask cluster give the same rows."""
import numpy as np
import pytest

from ess.sim import CostParams, Scenario
from ess.sim.sweep import grid, sweep
from ess.sim.timeline import simulate

AXES = {"batch": [13, 52, 64, 160], "context_len": [32768, 131072], "ratio": [1.0, 0.2, 0.1],
        "h2d_GB_per_s": [16.0, 37.0]}
MISSES = np.linspace(0, 800, 61)


def test_grid_is_the_cartesian_product():
    g = grid(AXES)
    assert len(g) == 4 * 2 * 3 * 2 and list(g.columns) == list(AXES)


def test_sweep_in_process_equals_direct_simulation():
    df = sweep(AXES, workers=0, misses=MISSES, progress=False)
    g = grid(AXES)
    r = simulate(g.batch, g.context_len, g.ratio, h2d_GB_per_s=g.h2d_GB_per_s, misses=MISSES)
    assert np.allclose(df.step_ms.to_numpy(), r.step_s * 1e3, equal_nan=True)
    assert (df.feasible.to_numpy() == r.feasible).all()


def test_the_scenario_reaches_every_chunk():
    """A scenario other than the default (one strategy, fitted-looking parameters, memory not checked) gives the rows
    of simulate in that scenario, in processes too; with the default scenario they differ."""
    sc = Scenario(strategy="none", params=CostParams(0.8, 1.2, 20.0), check_memory=False)
    df = sweep(AXES, scenario=sc, workers=2, chunk_size=7, misses=MISSES, progress=False)
    g = grid(AXES)
    r = simulate(g.batch, g.context_len, g.ratio, h2d_GB_per_s=g.h2d_GB_per_s, misses=MISSES, scenario=sc)
    assert np.array_equal(df.step_ms.to_numpy(), r.step_s * 1e3) and df.feasible.all()
    default = sweep(AXES, workers=0, misses=MISSES, progress=False)
    assert not np.allclose(default.step_ms, df.step_ms, equal_nan=True)


def test_local_processes_give_the_same_rows():
    a = sweep(AXES, workers=0, misses=MISSES, progress=False)
    b = sweep(AXES, workers=2, chunk_size=7, misses=MISSES, progress=False)
    assert np.allclose(a.throughput, b.throughput, equal_nan=True)


def test_dask_cluster_gives_the_same_rows():
    distributed = pytest.importorskip("dask.distributed")
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as client:
        b = sweep(AXES, scheduler=client, chunk_size=10, misses=MISSES, progress=False)
    a = sweep(AXES, workers=0, misses=MISSES, progress=False)
    assert np.allclose(a.throughput, b.throughput, equal_nan=True)


@pytest.mark.parametrize("axes,err", [({}, "non-empty"), ({"batch": [1]}, "context_len"),
                                      ({"batch": [1], "context_len": [8], "colour": [1]}, "unknown"),
                                      ({"batch": [], "context_len": [8]}, "non-empty list")])
def test_bad_grids(axes, err):
    with pytest.raises(ValueError, match=err):
        grid(axes)


def test_bad_chunk_size():
    with pytest.raises(ValueError, match="chunk_size"):
        sweep(AXES, chunk_size=0)
