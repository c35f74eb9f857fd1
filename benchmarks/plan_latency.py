"""How long the front door takes: a cold `ess plan` in a new process, and a warm `ess.plan` call in a process that
has answered before (memoized, and recomputed), against today's-path baseline measured in the same run -- the same question answered by the
grid's functions from inputs computed on the spot (`ess.sim.grid.grid_inputs(stored=False)`: the calibration, then
the cache simulation), which is what a plan cost before the inputs were stored.

    .venv/bin/python benchmarks/plan_latency.py [--repeats 5] [--baseline-repeats 1]

Every process gets an empty user cache folder (ESS_CACHE_DIR), so the stored inputs of data/generated are all a
cold run has. Prints the distribution of each path's seconds and the ratios; writes build/benchmarks/
plan_latency.json. No wall time is asserted.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ess.bench import distribution, write_report

ROOT = Path(__file__).resolve().parents[1]
QUESTION = ("glm-5", "H100", 65536)
OTHER = ("deepseek-v3.2-exp", "H200", 32768)

WARM = """
import time, ess
ess.plan(*{q!r}); ess.plan(*{o!r})                      # both answered once: the process is warm
same, other = [], []
for _ in range({n}):
    t = time.perf_counter(); ess.plan(*{q!r}); same.append(time.perf_counter() - t)
ess.planning._plan.cache_clear()                       # the same question answered again without the memo: its search, bands and link speeds recomputed
for _ in range({n}):
    t = time.perf_counter(); ess.plan(*{q!r}); other.append(time.perf_counter() - t)
    ess.planning._plan.cache_clear()
print(repr((same, other)))
"""

BASELINE = """
import time
t = time.perf_counter()
from ess.sim import grid as g
from ess.specs import reference_link
inputs = g.grid_inputs(stored=False)
cells = g.grid_cells([{m!r}], [{gpu!r}], [{L}], links=[reference_link({gpu!r})])
found = g.grid_search(cells, inputs)
g.grid_bands(found, inputs); g.break_even_link(found, inputs); g.overlap_links(found, inputs)
print(time.perf_counter() - t)
"""


def _run(code: str, cache: str) -> str:
    env = {**os.environ, "ESS_CACHE_DIR": cache}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                          env=env).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline-repeats", type=int, default=1)
    a = ap.parse_args()
    m, gpu, L = QUESTION
    cold = []
    for _ in range(a.repeats):
        with tempfile.TemporaryDirectory() as cache:
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "ess", "plan", "--model", m, "--gpu", gpu, "--context", str(L)],
                           check=True, capture_output=True, cwd=ROOT, env={**os.environ, "ESS_CACHE_DIR": cache})
            cold.append(time.perf_counter() - t)
    with tempfile.TemporaryDirectory() as cache:
        same, other = eval(_run(WARM.format(q=QUESTION, o=OTHER, n=a.repeats), cache))
    base = []
    for _ in range(a.baseline_repeats):
        with tempfile.TemporaryDirectory() as cache:
            base.append(float(_run(BASELINE.format(m=m, gpu=gpu, L=L), cache)))
    report = {"question": {"model": m, "gpu": gpu, "context_len": L},
              "cold_ess_plan_process_s": distribution(cold),
              "warm_same_question_s": distribution(same),
              "warm_recomputed_s": distribution(other),
              "baseline_inputs_computed_s": distribution(base)}
    report["ratio_baseline_over_cold"] = report["baseline_inputs_computed_s"]["median"] / report[
        "cold_ess_plan_process_s"]["median"]
    report["ratio_baseline_over_warm_recomputed"] = report["baseline_inputs_computed_s"]["median"] / report[
        "warm_recomputed_s"]["median"]
    path = write_report("plan_latency", report)
    for k in ("cold_ess_plan_process_s", "warm_same_question_s", "warm_recomputed_s", "baseline_inputs_computed_s"):
        d = report[k]
        print(f"{k:30s} median {d['median']:.4f} s  min {d['min']:.4f}  max {d['max']:.4f}  (n={d['n']})")
    print(f"baseline / cold plan: {report['ratio_baseline_over_cold']:.1f}x; baseline / warm recomputed: "
          f"{report['ratio_baseline_over_warm_recomputed']:.0f}x  -> {path}")


if __name__ == "__main__":
    main()
