"""GPU check of the transfer kernels and the tiered cache on CUDA: correctness first, then bandwidth.

    .venv/bin/python benchmarks/gpu_check_transfer.py [--quick]

Without CUDA it prints "no CUDA: nothing to check" and exits 0. With a GPU (about a minute; a time guard stops the
bandwidth part after ``--budget-s`` seconds, default 180, so the whole script stays within 5 minutes):

1. correctness: host->device gather of 2,047 random rows (-1 padded) from a pinned 32K-row pool into device slots
   with each mode (``zero_copy``, ``staged``, ``per_row``), and device->host write-back, compared byte for byte
   with the NumPy reference; a :class:`ess.storage.TieredCache` on ``cuda`` run over a short trace, every resident
   row compared with the host truth; the CUDA-marked pytest tests.
2. bandwidth (CUDA events, median of repetitions after warm-up; GB = 1e9 B; the copies are called without argument
   validation, as the storage step calls them): the host->device and device->host
   peak (one contiguous copy of 256 MiB between pinned host and device memory), then 2,048 scattered 656-byte
   rows, and 64 x 2,048 rows (a batch of requests in one call), with each mode. Prints the ratio of zero-copy to
   the peak (the project's target: >= 50 %) and to per-row, beside the paper's 37 vs 0.79 GB/s ([BLOG],
   data/hardware/links.yaml).

Writes ``gpu_check_transfer.json`` to ``$OUT`` when that is set, else to ``build/benchmarks/``.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from ess.bench import write_report  # noqa: E402

N_ROWS, K, W = 32 * 1024, 2048, 656      # pool rows: one 32K-token context; K = index_topk [DS]; FP8 entry [FMLA]
MODES = ("zero_copy", "staged", "per_row")


def cuda_events_time(fn, reps: int, warmup: int = 3) -> list[float]:
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)            # seconds
    return out


def summary(nbytes: int, secs: list[float]) -> dict:
    g = nbytes / np.asarray(secs) / 1e9
    return {"median_GB_per_s": float(np.median(g)), "min": float(g.min()), "mean": float(g.mean()),
            "std": float(g.std()), "n": int(g.size), "bytes": int(nbytes)}


def check_correctness(report: dict) -> bool:
    import torch

    from ess.kernels.transfer import copy_rows, reference
    from ess.storage import TieredCache

    ok_all = True
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, (N_ROWS, W), dtype=np.uint8)
    host = torch.from_numpy(src).pin_memory()
    k = K - 1                                           # not a power of two
    s_idx = rng.integers(0, N_ROWS, k).astype(np.int64)
    s_idx[rng.random(k) < 0.1] = -1
    d_idx = rng.permutation(k + 9)[:k].astype(np.int64)
    want = reference.copy_rows(src, s_idx, np.zeros((k + 9, W), np.uint8), d_idx)
    for mode in MODES:
        try:
            dev = torch.zeros((k + 9, W), dtype=torch.uint8, device="cuda")
            copy_rows(host, s_idx, dev, d_idx, backend="torch", mode=mode)
            torch.cuda.synchronize()
            h2d = bool(np.array_equal(dev.cpu().numpy(), want))
            back = torch.zeros((k, W), dtype=torch.uint8).pin_memory()
            back_idx = np.where(s_idx >= 0, np.arange(k), -1)
            copy_rows(dev, d_idx, back, back_idx, backend="torch", mode=mode)
            torch.cuda.synchronize()
            ok = back_idx >= 0
            d2h = bool(np.array_equal(back.numpy()[ok], src[s_idx[ok]]))
            report[f"correct_{mode}"] = {"h2d": h2d, "d2h": d2h}
        except Exception as exc:                        # report, keep going
            report[f"correct_{mode}"] = {"error": f"{type(exc).__name__}: {exc}"}
            h2d = d2h = False
        print(f"  {mode:10s} H2D {'ok' if h2d else 'WRONG'}  D2H {'ok' if d2h else 'WRONG'}")
        ok_all &= h2d and d2h
    # the tiered cache on CUDA (tiny model: 4 layers, 164-byte rows, K = 64), a short synthetic trace
    try:
        from ess.specs import model_spec
        from ess.tracegen import Workload, synthetic_trace
        tiny = model_spec("tiny")
        cache = TieredCache(tiny, capacity=96, device="cuda")
        truth = rng.integers(0, 256, (tiny.n_layers, 600, cache.entry_bytes), dtype=np.uint8)
        cache.add_request("g", truth)
        trace = synthetic_trace(Workload(600, n_layers=tiny.n_layers, k=tiny.index_topk, mtp=1, steps=30, batch=1,
                                         warmup_windows=0, profile=0.7, seed=1))
        for t in range(trace.steps):                     # step t sees 600 + t tokens: append one per step
            for layer in range(tiny.n_layers):
                idx = trace.indices[0, layer, t].astype(np.int64)
                r = cache.step("g", layer, idx)
                if not np.array_equal(cache.device_rows(r.slots)[idx >= 0], truth[layer, idx[idx >= 0]]):
                    raise AssertionError(f"layer {layer}: device rows differ from host truth")
            new = rng.integers(0, 256, (tiny.n_layers, cache.entry_bytes), dtype=np.uint8)
            cache.append_token("g", new)
            truth = np.concatenate([truth, new[:, None]], axis=1)
        report["tiered_cache_cuda"] = {"ok": True, "misses": int(cache.metrics.totals()["step"]["misses"])}
        print("  TieredCache(device='cuda') rows == host truth: ok")
    except Exception as exc:
        report["tiered_cache_cuda"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(f"  TieredCache on cuda FAILED: {exc}")
        ok_all = False
    return ok_all


def bandwidth(report: dict, budget_s: float, quick: bool) -> None:
    import torch

    from ess.kernels.transfer import copy_rows_unchecked as copy_rows   # validated above; time the copy only

    start = time.perf_counter()
    reps = 5 if quick else 20
    big = 256 * 2 ** 20
    h_big = torch.empty(big, dtype=torch.uint8).pin_memory()
    d_big = torch.empty(big, dtype=torch.uint8, device="cuda")
    report["peak_h2d"] = summary(big, cuda_events_time(lambda: d_big.copy_(h_big, non_blocking=True), reps))
    report["peak_d2h"] = summary(big, cuda_events_time(lambda: h_big.copy_(d_big, non_blocking=True), reps))
    del h_big, d_big
    print(f"  peak H2D {report['peak_h2d']['median_GB_per_s']:.1f} GB/s, "
          f"D2H {report['peak_d2h']['median_GB_per_s']:.1f} GB/s (256 MiB contiguous, pinned)")
    rng = np.random.default_rng(1)
    for n_rows, pool_rows in ((K, N_ROWS), (64 * K, 64 * N_ROWS // 8)):
        host = torch.from_numpy(rng.integers(0, 256, (pool_rows, W), dtype=np.uint8)).pin_memory()
        dev = torch.zeros((n_rows, W), dtype=torch.uint8, device="cuda")
        back = torch.zeros((pool_rows, W), dtype=torch.uint8).pin_memory()
        s_idx = rng.permutation(pool_rows)[:n_rows].astype(np.int64)
        d_idx = np.arange(n_rows, dtype=np.int64)
        for mode in MODES:
            if time.perf_counter() - start > budget_s:
                print("  time budget reached: stopping the bandwidth part")
                return
            if mode == "per_row" and n_rows > K:
                continue                                  # 131K single-row copies: minutes, and nothing new
            key = f"h2d_{n_rows}rows_{mode}"
            try:
                secs = cuda_events_time(lambda: copy_rows(host, s_idx, dev, d_idx, backend="torch", mode=mode),
                                        reps if mode != "per_row" else 3, warmup=1 if mode == "per_row" else 3)
                report[key] = summary(n_rows * W, secs)
                secs = cuda_events_time(lambda: copy_rows(dev, d_idx, back, s_idx, backend="torch", mode=mode),
                                        reps if mode != "per_row" else 3, warmup=1 if mode == "per_row" else 3)
                report[key.replace("h2d", "d2h")] = summary(n_rows * W, secs)
            except Exception as exc:
                report[key] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"  {key}: {exc}")
                continue
            h, d = report[key]["median_GB_per_s"], report[key.replace("h2d", "d2h")]["median_GB_per_s"]
            print(f"  {n_rows:6d} rows {mode:10s} H2D {h:7.2f} GB/s ({h / report['peak_h2d']['median_GB_per_s']:5.0%}"
                  f" of peak)  D2H {d:7.2f} GB/s ({d / report['peak_d2h']['median_GB_per_s']:5.0%} of peak)")
        del host, dev, back


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--budget-s", type=float, default=180.0)
    p.add_argument("--no-pytest", action="store_true")
    args = p.parse_args(argv)
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "build" / "benchmarks"
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        print("no CUDA: nothing to check (run this script on a machine with an NVIDIA GPU)")
        return 0
    t0 = time.perf_counter()
    report: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                    "cuda": torch.version.cuda, "numpy": np.__version__}
    print(f"GPU: {report['gpu']}, torch {report['torch']}, CUDA {report['cuda']}")
    print("correctness:")
    ok = check_correctness(report)
    if not args.no_pytest:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "tests/test_kernels_transfer.py",
                            "tests/test_storage.py"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        tail = (r.stdout + r.stderr).strip().splitlines()[-3:]
        report["pytest_cuda"] = {"rc": r.returncode, "tail": tail}
        print("  pytest -m cuda:", " | ".join(tail))
        ok &= r.returncode == 0
    print("bandwidth:")
    bandwidth(report, args.budget_s, args.quick)
    peak = report["peak_h2d"]["median_GB_per_s"]
    zc = report.get(f"h2d_{K}rows_zero_copy", {}).get("median_GB_per_s")
    pr = report.get(f"h2d_{K}rows_per_row", {}).get("median_GB_per_s")
    if zc and pr:
        report["ratios"] = {"zero_copy_vs_peak_h2d": zc / peak, "zero_copy_vs_per_row": zc / pr}
        print(f"2,048 rows: zero-copy {zc:.1f} GB/s = {zc / peak:.0%} of the H2D peak (target >= 50 %: "
              f"{'met' if zc / peak >= 0.5 else 'NOT met'}); {zc / pr:.0f}x per-row ({pr:.2f} GB/s); "
              f"paper: 37 vs 0.79 GB/s [BLOG]")
    report["seconds"] = time.perf_counter() - t0
    report["correct"] = bool(ok)
    write_report("gpu_check_transfer", report, out_dir)
    print(f"correct: {ok}; {report['seconds']:.0f} s; written {out_dir / 'gpu_check_transfer.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
