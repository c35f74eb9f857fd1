"""Configurations per second of the beyond-the-paper grid's search (ess.sim.grid.grid_search: every ratio of a
cell's grid at every batch up to its memory limit, one vectorised simulate call per model and GPU) against a loop
that simulates the same configurations one at a time, both measured in this run, on one core.

    .venv/bin/python benchmarks/grid_throughput.py [--repeats 3] [--loop-n 300]

The miss counts are a fixed function of the ratio (no cache simulation: what is timed is the simulator), over the
three models of notebook 10, four GPUs (Hopper and Blackwell, PCIe and NVLink-C2C hosts), the reference link of
each and two contexts. Prints the distribution (min, median, mean, std) of configurations per second of each path,
their ratio, and the machine; writes build/benchmarks/grid_throughput.json. No wall time is asserted.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")          # one core

import numpy as np  # noqa: E402

from ess.bench import distribution, write_report  # noqa: E402
from ess.sim import Scenario, grid as sgrid, simulate  # noqa: E402
from ess.sim.calibrate import calibrated_params  # noqa: E402
from ess.specs import host_link_spec, model_spec, reference_link  # noqa: E402
from ess.locality import locality_alternatives  # noqa: E402
from ess.sim.misses import BandSizes  # noqa: E402

MODELS = ("deepseek-v3.2", "glm-5", "deepseek-v4-flash")
GPUS = ("H200", "H20", "B200", "GB200")
CONTEXTS = (32768, 131072)


class FixedMisses:
    """Misses per sparse layer falling with the ratio (``60 x 0.2 / ratio``, capped at what a step selects)."""

    def __init__(self, model):
        self.model = model_spec(model)

    def __call__(self, L, r, mtp):
        k = min(self.model.index_topk, self.model.sparse_rows(int(L)))
        return np.full(self.model.n_sparse_layers, min(12.0 / float(r), mtp * k))

    def prefetch(self, points):
        list(points)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--loop-n", type=int, default=300)
    a = ap.parse_args()
    params = calibrated_params()
    loc = list(locality_alternatives())[:1]
    inputs = sgrid.GridInputs(params, {"central": params}, {}, loc, BandSizes(steps=8, batch=1, band_batch=1))
    for m in MODELS:
        inputs.tables[(m, loc[0].name, "paper")] = FixedMisses(m)
    cells = sgrid.grid_cells(MODELS, GPUS, CONTEXTS)
    cells = cells[cells.apply(lambda r: r.link == reference_link(r.gpu), axis=1)]

    # count the configurations the search simulates (the rows of its simulate calls)
    counted = []
    real = sgrid.simulate

    def counting(batch, *args, **kw):
        res = real(batch, *args, **kw)
        counted.append(len(res.step_s))
        return res

    sgrid.simulate = counting
    sgrid.grid_search(cells, inputs)                      # warm-up (Numba compile, caches)
    counted.clear()
    sgrid.grid_search(cells, inputs)
    n_cfg = sum(counted)
    sgrid.simulate = real
    vec = []
    for _ in range(a.repeats):
        t = time.perf_counter()
        sgrid.grid_search(cells, inputs)
        vec.append(n_cfg / (time.perf_counter() - t))

    # the loop: a sample of the same configurations, one simulate call each
    rng = np.random.default_rng(0)
    sample = []
    for _, c in cells.iterrows():
        for r in sgrid.ratio_grid(c.model, c.context_len, 2, 8):
            sample.append((c.model, c.gpu, int(c.context_len), r))
    picks = [sample[i] for i in rng.integers(0, len(sample), a.loop_n)]
    link = {g: host_link_spec(reference_link(g)) for g in GPUS}
    scen = {(m, g): Scenario(model=m, deployment=sgrid.grid_deployment(g), gpu=g, params=params)
            for m in MODELS for g in GPUS}
    loop = []
    for _ in range(a.repeats):
        t = time.perf_counter()
        for m, g, L, r in picks:
            simulate(int(rng.integers(1, 64)), L, r, misses=inputs.tables[(m, loc[0].name, "paper")](L, r, 2), mtp=2,
                     accept_ratio=1.7, h2d_GB_per_s=link[g].h2d_GB_per_s, d2h_GB_per_s=link[g].d2h_GB_per_s,
                     scenario=scen[(m, g)])
        loop.append(a.loop_n / (time.perf_counter() - t))
    res = {"cells": len(cells), "configurations_per_search": n_cfg, "models": MODELS, "gpus": GPUS,
           "contexts": CONTEXTS, "grid_cfg_per_s": distribution(vec), "loop_cfg_per_s": distribution(loop),
           "loop_n": a.loop_n, "speedup_median": statistics.median(vec) / statistics.median(loop)}
    print(json.dumps(res, indent=1))
    print(f"grid search: {statistics.median(vec):,.0f} configurations/s (median of {a.repeats}, {n_cfg:,} per "
          f"search over {len(cells)} cells), one at a time: {statistics.median(loop):,.0f}/s -> "
          f"{res['speedup_median']:.0f}x")
    write_report("grid_throughput", res)


if __name__ == "__main__":
    main()
