"""Configurations per second of the simulator: the vectorised path (ess.sim.simulate over N configurations at once)
against a plain-Python loop calling it one configuration at a time, both measured in this run.

    .venv/bin/python benchmarks/sim_throughput.py [--n 100000] [--repeats 5]

Prints the distribution (min, median, mean, std) of configurations per second for each, their ratio, and the
machine and library versions; writes build/benchmarks/sim_throughput.json. No wall time is asserted. The project's
target is >= 1,000,000 configurations per second on one core, so a band over several calibrations and locality
models still redraws a widget of a few hundred batches well under 100 ms.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from ess.bench import distribution, write_report
from ess.sim import Scenario
from ess.sim.calibrate import calibrated_params
from ess.sim.timeline import simulate
from ess.specs import model_spec


def configs(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    n_layers = model_spec("deepseek-v3.2-exp").n_layers
    return dict(batch=rng.integers(1, 200, n), context_len=rng.choice([8192, 32768, 65536, 131072], n),
                ratio=rng.choice([1.0, 0.5, 0.3, 0.2, 0.15, 0.1], n), mtp=rng.choice([1, 2, 3, 4], n),
                h2d_GB_per_s=rng.uniform(4, 128, n), misses=rng.uniform(0, 1500, (n, n_layers)))


def run_vectorised(c, params, strategy):
    return simulate(c["batch"], c["context_len"], c["ratio"], misses=c["misses"], mtp=c["mtp"],
                    accept_ratio=1.0, h2d_GB_per_s=c["h2d_GB_per_s"],
                    scenario=Scenario(strategy=strategy, params=params, check_memory=True))


def run_loop(c, params, strategy, n):
    out = []
    sc = Scenario(strategy=strategy, params=params)
    for i in range(n):
        r = simulate(int(c["batch"][i]), int(c["context_len"][i]), float(c["ratio"][i]), misses=c["misses"][i],
                     mtp=int(c["mtp"][i]), accept_ratio=1.0, h2d_GB_per_s=float(c["h2d_GB_per_s"][i]), scenario=sc)
        out.append(r.step_s[0])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--loop-n", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--strategy", default="best")
    a = ap.parse_args()
    params = calibrated_params()                       # the fitted parameters (speed does not depend on them)
    c = configs(a.n)
    run_vectorised({k: v[:100] for k, v in c.items()}, params, a.strategy)          # warm-up
    vec = []
    for _ in range(a.repeats):
        t = time.perf_counter()
        run_vectorised(c, params, a.strategy)
        vec.append(a.n / (time.perf_counter() - t))
    loop = []
    for _ in range(a.repeats):
        t = time.perf_counter()
        run_loop(c, params, a.strategy, a.loop_n)
        loop.append(a.loop_n / (time.perf_counter() - t))
    # the two paths agree
    v = run_vectorised({k: val[:a.loop_n] for k, val in c.items()}, params, a.strategy).step_s
    l = np.array(run_loop(c, params, a.strategy, a.loop_n))
    assert np.allclose(v, l, equal_nan=True)
    res = {"n": a.n, "loop_n": a.loop_n, "strategy": a.strategy, "vectorised_cfg_per_s": distribution(vec),
           "loop_cfg_per_s": distribution(loop), "speedup_median": statistics.median(vec) / statistics.median(loop),
           "target_cfg_per_s": 1_000_000}
    print(json.dumps(res, indent=1))
    print(f"vectorised: {statistics.median(vec):,.0f} configurations/s (median of {a.repeats}), loop: "
          f"{statistics.median(loop):,.0f}/s -> {res['speedup_median']:.0f}x; target 1,000,000/s")
    write_report("sim_throughput", res)


if __name__ == "__main__":
    main()
