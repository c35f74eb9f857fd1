"""The sweep's grid (ess.sim.sweep.grid) built without a row of Python objects per configuration: its peak memory
was about 6x the frame it returned (a list of tuples, then the frame); it is now the frame's own size (tracemalloc,
which counts NumPy's and pandas' buffers). The frame is the one the cartesian product of the axes gave before."""
import itertools
import tracemalloc

import numpy as np
import pandas as pd
import pytest

from ess.sim.sweep import grid


def product_frame(axes):
    """The grid as it was built before: one tuple per configuration."""
    return pd.DataFrame(list(itertools.product(*[list(axes[k]) for k in axes])), columns=list(axes))


@pytest.mark.parametrize("axes", [
    {"batch": [52, 64], "context_len": [32768]},
    {"context_len": [4096, 8192, 16384], "batch": [1, 2.5], "ratio": [0.1, 0.2, 1]},
    {"batch": [np.int64(3), 4], "context_len": [1.0, np.float32(2.0)], "mtp": [1, 2, 4]},
    {"batch": np.arange(1, 7), "context_len": np.array([4096, 8192]), "h2d_GB_per_s": [37.0]},
    {"batch": [1], "context_len": [2], "ratio": [0.5], "mtp": [1], "accept_ratio": [1.0, 2.0], "d2h_GB_per_s": [1e9]},
])
def test_the_grid_is_the_cartesian_product(axes):
    pd.testing.assert_frame_equal(grid(axes), product_frame(axes))


def test_the_grid_peaks_at_about_the_frame_it_returns():
    axes = {"batch": list(range(1, 101)), "context_len": [4096 * i for i in range(1, 51)],
            "ratio": list(np.linspace(0.05, 1, 20)), "mtp": [1, 2]}                     # 200,000 configurations
    grid({"batch": [1], "context_len": [1]})                                            # imports, caches
    tracemalloc.start()
    try:
        df = grid(axes)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    frame = int(df.memory_usage(deep=True).sum())
    assert len(df) == 200_000
    assert peak < 1.5 * frame, f"peak {peak:,} B for a frame of {frame:,} B"


def test_an_absurd_grid_is_refused_before_it_is_built():
    axes = {"batch": list(range(1, 10 ** 4)), "context_len": list(range(1, 10 ** 4)), "ratio": list(range(1, 10 ** 4))}
    with pytest.raises(ValueError, match="axes"):
        grid(axes)
