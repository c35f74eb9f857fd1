"""The real model's decode kernels alone: the FP8 indexer (:mod:`ess.kernels.gqa_indexer`), top-K
(:mod:`ess.kernels.topk`) and the sparse attention over the K/V pool (:mod:`ess.kernels.kv_attention`), per backend,
at SmolLM2-135M's shapes (9 query heads on 3 KV heads of 64 dims, 30 layers, K = L/16), one request.

Each kernel runs over 30 layers' worth of distinct data (so that, as in a decode step, a layer's keys are not in the
CPU's caches when it is scored) and is timed per 30 layers: the median of ``--reps`` repetitions on the compute
thread's CPU clock (``time.thread_time``: a shared machine's other processes left out) and on the wall clock. The
baseline in the same run: a contiguous copy (``np.copyto``) of the bytes the indexer reads, the memory-bound limit
of a scan. Nothing is asserted.

    .venv/bin/python benchmarks/engine_kernels.py [--contexts 8192 32768] [--reps 5] [--threads 1]

Writes build/benchmarks/engine_kernels.json.
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
import torch  # noqa: E402

from ess.bench import write_report  # noqa: E402
from ess.kernels.gqa_indexer import gqa_indexer_scores  # noqa: E402
from ess.kernels.kv_attention import combine_columns, score_columns  # noqa: E402
from ess.kernels.topk import topk_positions  # noqa: E402

LAYERS, H, HKV, HD = 30, 9, 3, 64        # SmolLM2-135M-Instruct (ess.llm.config reads them from its GGUF file)


def timed(fn, reps: int) -> dict:
    fn(0)                                                     # compile / warm up
    cpu, wall = [], []
    for _ in range(reps):
        c0, w0 = time.thread_time(), time.perf_counter()
        for layer in range(LAYERS):
            fn(layer)
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    return {"cpu_ms": statistics.median(cpu) * 1e3, "wall_ms": statistics.median(wall) * 1e3}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    import numba
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))   # every kernel on --threads threads
    rng = np.random.default_rng(0)
    report = {"benchmark": "engine_kernels", "threads": args.threads, "reps": args.reps, "contexts": {}}
    for L in args.contexts:
        K = L // 16
        codes = rng.integers(0, 0x7F, (LAYERS, 1, L, HKV * HD)).astype(np.uint8)      # finite FP8 bytes
        scales = (rng.random((LAYERS, 1, L, HKV)) * 0.05).astype(np.float32)
        q = rng.standard_normal((1, H, HD)).astype(np.float32)
        lengths = np.array([L], np.int64)
        out = np.empty((1, L), np.float32)
        row = {}
        for be in ("numba", "torch"):
            row[f"indexer_{be}"] = timed(lambda l: gqa_indexer_scores(q, codes[l], scales[l], lengths, backend=be,
                                                                      out=out), args.reps)
        scanned = codes[0].nbytes + scales[0].nbytes
        dst = np.empty(scanned, np.uint8)
        flat = [np.concatenate([codes[l].ravel(), scales[l].view(np.uint8).ravel()]) for l in range(LAYERS)]
        row["copy_of_the_indexer_bytes"] = timed(lambda l: np.copyto(dst, flat[l]), args.reps)
        scores = rng.standard_normal((1, L)).astype(np.float32)
        for be in ("numba", "torch"):
            row[f"topk_{be}"] = timed(lambda l: topk_positions(scores, K, backend=be), args.reps)
        pool = rng.standard_normal((LAYERS * L, 2, HKV, HD)).astype(np.float32)           # every layer's entries
        slots = np.stack([np.sort(rng.choice(L, K, replace=False)) + l * L for l in range(LAYERS)])[:, None]
        cols = np.arange(K, dtype=np.int64)
        b = np.zeros(K, np.int64)
        sc = np.full((1, H, K + 1), -np.inf, np.float32)
        sc[:, :, K] = 0.0
        own = rng.standard_normal((1, HKV, HD)).astype(np.float32)
        o = np.empty((1, H, HD), np.float32)
        for be in ("numba", "torch"):
            def attention(l, be=be):
                score_columns(q, pool, b, cols, slots[l, 0], 0.125, sc, backend=be)
                combine_columns(sc, pool, slots[l], own, np.zeros(1, np.int64), o, backend=be)
            row[f"sparse_attention_{be}"] = timed(attention, args.reps)
        row["indexer_bytes_per_layer"] = scanned
        report["contexts"][str(L)] = row
        print(f"L = {L} (K = {K}), ms per 30 layers (CPU clock / wall):")
        for name, t in row.items():
            if isinstance(t, dict):
                print(f"  {name:28s} {t['cpu_ms']:8.2f} / {t['wall_ms']:8.2f}")
    path = write_report("engine_kernels", report)
    print(f"wrote {path}")
    return report


if __name__ == "__main__":
    main()
