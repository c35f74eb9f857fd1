"""Prefetch simulation: the Numba pool kernel of ess.prefetch against its reference (NumPy on ess.policies.SlotPool),
the seconds one ``simulate_prefetch`` takes, both timed in the same run on the same trace and checked to agree miss
for miss.

The setting is the prefetch widget's default (notebook 04): a synthetic trace at 32K (K = 2,048, MTP 2, the paper's
locality profile, 4 layers, 24 steps, one request), pool ratio 0.2, the heat predictor's speculative class and the
LRU-Warmup windows sent by the delayed class, FlashTrans 37 GB/s. The widget redraws from one such simulation.

    .venv/bin/python benchmarks/prefetch_pool.py [--quick]

Writes build/benchmarks/prefetch_pool.json.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from ess.bench import distribution, write_report  # noqa: E402
from ess.layout import pool_slots  # noqa: E402
from ess.prefetch import PrefetchConfig, simulate_prefetch  # noqa: E402
from ess.specs import model_spec  # noqa: E402
from ess.widgets.prefetch import _trace  # noqa: E402


def _times(trace, cfg, backend, repeats):
    out, res = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = simulate_prefetch(trace, cfg, backend=backend)
        out.append(time.perf_counter() - t0)
    return out, res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    args = ap.parse_args()
    L, layers, steps = 32768, 4, 24
    trace = _trace(L, layers, steps, 0)
    cap = pool_slots(model_spec(), 0.2, L, need=trace.width)
    cfg = PrefetchConfig(cap, speculative=True, delayed=True, predictor="heat", warmup_mode="delayed")
    simulate_prefetch(trace, cfg, backend="numba")                                    # compile (or load the cache)
    fast_t, fast = _times(trace, cfg, "numba", 3 if args.quick else 7)
    ref_t, ref = _times(trace, cfg, "reference", 2 if args.quick else 3)
    assert np.array_equal(fast.misses_per_step, ref.misses_per_step) and fast.bytes_moved == ref.bytes_moved, \
        "the kernel and the reference disagree"
    ratio = statistics.median(ref_t) / statistics.median(fast_t)
    out = {"benchmark": "prefetch_pool",
           "config": {"context_len": L, "k": trace.k, "mtp": trace.mtp, "layers": layers, "steps": steps,
                      "ratio": 0.2, "capacity": cap, "speculative": "heat", "warmup": "delayed",
                      "link_GB_per_s": cfg.link_GB_per_s},
           "numba_s": distribution(fast_t), "reference_s": distribution(ref_t), "speedup_median": ratio}
    print(f"prefetch simulation, {layers} layers x {steps} steps at 32K, ratio 0.2, heat + delayed:")
    print(f"  numba    : median {statistics.median(fast_t) * 1e3:8.1f} ms (min {min(fast_t) * 1e3:.1f}, n {len(fast_t)})")
    print(f"  reference: median {statistics.median(ref_t) * 1e3:8.1f} ms (min {min(ref_t) * 1e3:.1f}, n {len(ref_t)})")
    print(f"  ratio reference/numba {ratio:.1f}x (same misses per step)")
    print(f"wrote {write_report('prefetch_pool', out)}")


if __name__ == "__main__":
    main()
