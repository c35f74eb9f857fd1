"""The decode engine's speed at a long context: seconds per step of dense, sparse-resident and sparse-offloaded
decoding of the real model (SmolLM2-135M-Instruct, float32), and their ratios, measured in one run.

* ``dense``: the model's own dense decoding (every step attends over every cached token);
* ``resident``: sparse decoding (K = L/16 entries per step and layer, chosen by the FP8 indexer), every K/V entry
  resident (offload off);
* ``offloaded``: the same sparse decoding through the tiered cache: the host pool holds every entry, the device pool
  ``--ratio`` of them under LRU seeded by LRU-Warmup, the misses copied under ``--schedule`` on the copy worker
  link (``--link-GB-per-s``; default unpaced: at the machine's own copy speed).

One prompt of ``--context`` tokens of real text (Python's language reference topics, ``pydoc_data.topics``),
prefilled once. Timing: ``--repeats`` rounds, each decoding ``--steps`` steps in every mode, the modes' steps
interleaved (a dense step, a resident step, an offloaded step, the next dense step, ...), so that load from other
processes falls on all three alike; ``--warmup`` untimed rounds first, and the first step of every run is left out
(first touch of new memory); wall time (``time.perf_counter``, or ``--clock cpu``: the compute thread's CPU time),
the garbage collector off while timing (as ``timeit`` does). Reported: the distribution of seconds per step, steps/s from the
median, the ratios (goals: resident / dense >= 1.0 at 8K and >= 1.5 at 32K, offloaded / resident >= 0.9 at ratio
0.5 with DA), where a step's time goes in each sparse mode (the engine's per-operation timer, ms per step), and the
machine's load average before and after. Nothing is asserted.

SmolLM2-135M was trained on contexts of 8,192 tokens. ``--context`` beyond that needs
``--extrapolate-context``, a **benchmark-only** switch: the model then runs past its trained context (RoPE
extrapolated), the tokens it generates there are not meaningful, the work per step is real; the report says so
(``output_meaningful``). ``--prefill-attention sdpa`` prefills with torch's
fused attention (faster for a long prompt; decoding keeps the model's own attention).

    .venv/bin/python benchmarks/engine_decode.py [--context 8186] [--steps 6] [--repeats 3] [--warmup 1] [--ratio 0.5]
                                                [--schedule da] [--link-GB-per-s GBPS] [--threads 1]
                                                [--device cpu] [--clock wall] [--backend auto]
                                                [--extrapolate-context] [--prefill-attention matmul]

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
from ess.engine import DecodeConfig, DecodeEngine  # noqa: E402
from ess.studies.real_model.measure import measured_breakdown  # noqa: E402
from ess.llm import reference_text_ids  # noqa: E402


def per_op_ms(run) -> dict:
    """ms per step of each timed operation (steps from 1 on), summed over layers (:func:`measured_breakdown`)."""
    return {k: round(v * 1e3, 3) for k, v in measured_breakdown(run).items() if k != "other"}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=None,
                    help="context tokens when decoding starts (default and most: the model's trained context - "
                         "steps, 8,186; more with --extrapolate-context)")
    ap.add_argument("--steps", type=int, default=6, help="decode steps per run (the first is not timed)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds of 2 steps per mode first (compilation, "
                                                           "first allocations)")
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--schedule", default="da", choices=("none", "da", "dba"))
    ap.add_argument("--link-GB-per-s", type=float, default=None, help="emulated link bandwidth (default: unpaced)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch and Numba threads (default 1, see benchmarks/README.md)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (the device pool on the GPU, a copy stream)")
    ap.add_argument("--clock", default="wall", choices=("wall", "cpu"),
                    help="wall time, or the compute thread's CPU time (a shared machine's other processes left out)")
    ap.add_argument("--backend", default="auto", choices=("auto", "numba", "torch", "reference"),
                    help="kernels of the indexer, top-K and sparse attention (auto: Numba on the CPU, torch on CUDA)")
    ap.add_argument("--extrapolate-context", action="store_true",
                    help="BENCHMARK ONLY: allow --context past the trained 8,192 tokens (RoPE extrapolated); the "
                         "generated tokens are not meaningful, the work per step is real")
    ap.add_argument("--prefill-attention", default="matmul", choices=("matmul", "sdpa"),
                    help="dense attention of the prefill (sdpa: torch's fused kernel, faster for a long prompt)")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    import numba
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))   # every kernel on --threads threads
    if args.device.startswith("cuda") and args.clock == "cpu":
        ap.error("--clock cpu measures the CPU; on CUDA use the wall clock")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA: nothing to measure on the GPU")
        return {}
    out_dir = args.out_dir or (os.environ.get("OUT") or None)
    load_before = list(os.getloadavg())

    extrapolate = args.context + args.steps if args.extrapolate_context and args.context else None
    eng = DecodeEngine.load(device=args.device, extrapolate_context_to=extrapolate)
    if args.context is None:
        args.context = eng.trained_context_length - args.steps
    if args.context + args.steps > eng.config.context_length:
        ap.error(f"--context {args.context} + --steps {args.steps} is past the model's trained context of "
                 f"{eng.trained_context_length} tokens: add --extrapolate-context (benchmark only: the output is not "
                 f"meaningful)")
    L = args.context
    if L + args.steps > eng.trained_context_length:
        print(f"NOTE: decoding at {L} tokens, past the trained context of {eng.trained_context_length}: the tokens "
              f"generated are not meaningful; this measures the cost of a step only", flush=True)
    ids = reference_text_ids(eng.tokenizer, L, skip_tokens=1000)
    t0 = time.perf_counter()
    impl, eng.model.attention_impl = eng.model.attention_impl, args.prefill_attention
    try:
        pre = eng.prefill([ids], max_new_tokens=args.steps, keep_dense=True)
    finally:
        eng.model.attention_impl = impl
    prefill_s = time.perf_counter() - t0
    print(f"prefill of {L} tokens: {prefill_s:.1f} s", flush=True)
    K = max(1, L // 16)
    eng.windows(pre, K, backend=args.backend)          # the warmup windows, computed once, outside the timing
    sparse = DecodeConfig(topk=K, clock=args.clock, backend=args.backend)
    configs = {"resident": sparse.replace(offload=False),
               "offloaded": sparse.replace(ratio=args.ratio, schedule=args.schedule,
                                           link_GB_per_s=args.link_GB_per_s)}
    starts = {
        "dense": lambda: eng.start_dense(pre, args.steps, clock=args.clock),
        "resident": lambda: eng.start(pre, args.steps, configs["resident"]),
        "offloaded": lambda: eng.start(pre, args.steps, configs["offloaded"]),
    }
    samples = {m: [] for m in starts}
    last = {}
    for _ in range(max(0, args.warmup)):            # untimed: compiled kernels loaded, first allocations made
        warm = {m: (eng.start_dense(pre, 2, clock=args.clock) if m == "dense"
                    else eng.start(pre, 2, configs[m])) for m in starts}
        for s in warm.values():
            while not s.done:
                s.step()
            s.close()
    gc.disable()                                    # as timeit does: no collection inside a timed step
    try:
        for rnd in range(max(1, args.repeats)):
            sessions = {m: start() for m, start in starts.items()}
            for _ in range(args.steps):             # step by step, every mode in turn: the load falls alike
                for s in sessions.values():
                    s.step()
            for mode, s in sessions.items():
                run = last[mode] = s.close()
                samples[mode] += list(run.step_times()[1:])
            del sessions
            print(f"round {rnd + 1}: " + ", ".join(f"{m} {statistics.median(s) * 1e3:.0f} ms" for m, s in
                                                     samples.items()), flush=True)
    finally:
        gc.enable()
    rate = {m: 1.0 / statistics.median(s) for m, s in samples.items()}
    ratios = {"offloaded_over_resident": rate["offloaded"] / rate["resident"],
              "resident_over_dense": rate["resident"] / rate["dense"]}
    off = last["offloaded"]
    report = {"benchmark": "engine_decode", "device": args.device, "context": L, "steps": args.steps,
              "repeats": args.repeats, "warmup_rounds": args.warmup, "threads": args.threads, "clock": args.clock,
              "backend": args.backend,
              "topk": off.config["topk"], "ratio": args.ratio, "schedule": args.schedule,
              "link_GB_per_s": args.link_GB_per_s, "pool_slots": off.config["capacity"], "prefill_s": prefill_s,
              "prefill_attention": args.prefill_attention,
              "trained_context": eng.trained_context_length, "output_meaningful": off.config["output_meaningful"],
              "seconds_per_step": {m: distribution(s) for m, s in samples.items()}, "steps_per_s": rate,
              "ratios": ratios, "per_op_ms": {m: per_op_ms(last[m]) for m in ("resident", "offloaded")},
              "misses_per_step": float(off.misses[1:].sum(axis=(1, 2)).mean()),
              "loadavg_before": load_before, "loadavg_after": list(os.getloadavg()),
              "text": "pydoc_data.topics (sorted keys), tokens 1000 onward"}
    for m, r in rate.items():
        print(f"{m:9s}: {r:.2f} steps/s (median {1e3 / r:.0f} ms per step)")
    for k, v in ratios.items():
        print(f"  {k}: {v:.3f}")
    print("  resident ms per step:", report["per_op_ms"]["resident"])
    print("  offloaded ms per step:", report["per_op_ms"]["offloaded"])
    print(f"  load average before {load_before}, after {report['loadavg_after']}")
    path = write_report("engine_decode", report, out_dir)
    print(f"wrote {path}")
    return report


if __name__ == "__main__":
    main()
