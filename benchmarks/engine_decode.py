"""The decode engine's speed at a long context: steps/s of dense, sparse-resident and sparse-offloaded decoding of the
real model (SmolLM2-135M-Instruct, float32, CPU), and the offloaded/resident ratio.

* ``dense``: the model's own dense decoding (every step attends over every cached token);
* ``resident``: sparse decoding (K = L/16 entries per step and layer, chosen by the FP8 indexer), every K/V entry
  resident (offload off);
* ``offloaded``: the same sparse decoding through the tiered cache: the host pool holds every entry, the device pool
  ``--ratio`` of them under LRU seeded by LRU-Warmup, the misses copied under ``--schedule`` on the copy worker
  link (``--link-GB-per-s``; default unpaced: at the machine's own copy speed).

One prompt of ``--context`` tokens of real text (Python's language reference topics, ``pydoc_data.topics``),
prefilled once. Timing: ``--repeats`` rounds, each decoding ``--steps`` steps in every mode, one mode after the other,
so that load from other processes falls on all three alike; the first step of every run is left out (first touch
of new memory); wall time (``time.perf_counter``, or ``--clock cpu``), the garbage collector off while timing (as
``timeit`` does). Reported: the distribution of seconds per step, steps/s from the median, the ratios offloaded /
resident (goal >= 0.9 at ratio 0.5 with DA) and resident / dense, and where a step's time goes in each sparse mode
(the engine's per-operation timer, ms per step). Nothing is asserted.

    .venv/bin/python benchmarks/engine_decode.py [--context 8192] [--steps 6] [--repeats 3] [--ratio 0.5]
                                                [--schedule da] [--link-GB-per-s GBPS] [--threads 1]
                                                [--device cpu] [--clock wall]

Writes build/benchmarks/engine_decode.json (``$OUT/engine_decode.json`` when ``OUT`` is set, as the GPU check has
it). ``--device cuda`` without a GPU says so and exits 0.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from ess.bench import distribution, write_report  # noqa: E402
from ess.engine import DecodeEngine  # noqa: E402
from ess.engine.timing import measured_breakdown  # noqa: E402
from ess.llm import reference_text_ids  # noqa: E402


def per_op_ms(run) -> dict:
    """ms per step of each timed operation (steps from 1 on), summed over layers (:func:`measured_breakdown`)."""
    return {k: round(v * 1e3, 3) for k, v in measured_breakdown(run).items() if k != "other"}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=8192, help="context tokens when decoding starts (max 8192 - "
                                                                "steps)")
    ap.add_argument("--steps", type=int, default=6, help="decode steps per run (the first is not timed)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--schedule", default="da", choices=("none", "da", "dba"))
    ap.add_argument("--link-GB-per-s", type=float, default=None, help="emulated link bandwidth (default: unpaced)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, see benchmarks/README.md)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (the device pool on the GPU, a copy stream)")
    ap.add_argument("--clock", default="wall", choices=("wall", "cpu"),
                    help="wall time, or the compute thread's CPU time (a shared machine's other processes left out)")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and args.clock == "cpu":
        ap.error("--clock cpu measures the CPU; on CUDA use the wall clock")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA: nothing to measure on the GPU")
        return {}
    out_dir = args.out_dir or (os.environ.get("OUT") or None)

    eng = DecodeEngine.load(device=args.device)
    ctx = eng.config.context_length
    L = min(args.context, ctx - args.steps)
    ids = reference_text_ids(eng.tokenizer, L, skip_tokens=1000)
    t0 = time.perf_counter()
    pre = eng.prefill([ids], max_new_tokens=args.steps, keep_dense=True)
    prefill_s = time.perf_counter() - t0
    print(f"prefill of {L} tokens: {prefill_s:.1f} s", flush=True)
    eng.windows(pre, max(1, L // 16))                     # the warmup windows, computed once, outside the timing
    modes = {
        "dense": lambda: eng.decode_dense(pre, args.steps, clock=args.clock),
        "resident": lambda: eng.decode(pre, args.steps, offload=False, clock=args.clock),
        "offloaded": lambda: eng.decode(pre, args.steps, ratio=args.ratio, schedule=args.schedule,
                                        link_GB_per_s=args.link_GB_per_s, clock=args.clock),
    }
    samples = {m: [] for m in modes}
    last = {}
    gc.disable()                                    # as timeit does: no collection inside a timed step
    try:
        for rnd in range(max(1, args.repeats)):
            for mode, fn in modes.items():
                run = fn()
                samples[mode] += list(run.step_times()[1:])
                last[mode] = run
            print(f"round {rnd + 1}: " + ", ".join(f"{m} {statistics.median(s) * 1e3:.0f} ms" for m, s in
                                                     samples.items()), flush=True)
    finally:
        gc.enable()
    rate = {m: 1.0 / statistics.median(s) for m, s in samples.items()}
    ratios = {"offloaded_over_resident": rate["offloaded"] / rate["resident"],
              "resident_over_dense": rate["resident"] / rate["dense"]}
    off = last["offloaded"]
    report = {"benchmark": "engine_decode", "device": args.device, "context": L, "steps": args.steps,
              "repeats": args.repeats, "threads": args.threads, "clock": args.clock, "topk": off.config["topk"],
              "ratio": args.ratio, "schedule": args.schedule,
              "link_GB_per_s": args.link_GB_per_s, "pool_slots": off.config["capacity"], "prefill_s": prefill_s,
              "seconds_per_step": {m: distribution(s) for m, s in samples.items()}, "steps_per_s": rate,
              "ratios": ratios, "per_op_ms": {m: per_op_ms(last[m]) for m in ("resident", "offloaded")},
              "misses_per_step": float(off.misses[1:].sum(axis=(1, 2)).mean()),
              "text": "pydoc_data.topics (sorted keys), tokens 1000 onward"}
    for m, r in rate.items():
        print(f"{m:9s}: {r:.2f} steps/s (median {1e3 / r:.0f} ms per step)")
    for k, v in ratios.items():
        print(f"  {k}: {v:.3f}")
    print("  resident ms per step:", report["per_op_ms"]["resident"])
    print("  offloaded ms per step:", report["per_op_ms"]["offloaded"])
    path = write_report("engine_decode", report, out_dir)
    print(f"wrote {path}")
    return report


if __name__ == "__main__":
    main()
