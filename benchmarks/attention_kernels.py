"""Attention kernels against the roofline of this machine.

Per request (B = 1 by default): the lightning indexer over L tokens (Hi heads x D dims, DeepSeek-V3.2-Exp: 64 x 128)
and sparse MLA decode over K = 2,048 selected entries with H = 128 heads and 576 dims, every backend starting from
the same stored FP8 layouts (132-byte indexer entries, 656-byte latent entries), so dequantisation is part of the
timed work. Alongside, in the same run: the machine's fp32 matmul throughput (NumPy and torch GEMM, 2,048^3) and
its memory bandwidth (a large array copy), which bound what any kernel can reach.

Work counted: indexer 2 Hi D L flops (the dot products; ReLU and weighting are O(Hi L)) and L (D + 4) bytes read;
sparse MLA 2 H K (Dqk + Dv) flops and K * 656 bytes read (plus the K indices). GB/s is the bytes of the stored
cache read per second, the figure that matters for a memory-bound kernel.

Timing: ``--repeats / 5`` rounds; in each round every case gets a 0.3 s pause (the worker threads of OpenBLAS and
OpenMP keep spinning for a while after a call and would slow the next backend down), one untimed call (JIT
compilation and first touch excluded) and then 5 calls timed with ``time.perf_counter``.
Rounds spread every case over the run, so load from other processes on a shared machine falls on all alike. min,
median, mean and std are stored; rates use the minimum. Nothing is asserted.

    .venv/bin/python benchmarks/attention_kernels.py [--L 32768] [--repeats 20] [--reference-L 4096] [--threads 1]

Writes build/benchmarks/attention_kernels.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ess import quant  # noqa: E402
from ess.attention import softmax_scale  # noqa: E402
from ess.kernels.attention import numba_cpu, reference, torch_ops  # noqa: E402
from ess.specs import model_spec  # noqa: E402


def roofline_cases() -> dict:
    """The machine's limits, timed in the same rounds as the kernels: fp32 GEMM 2048^3 (NumPy/OpenBLAS and torch)
    and the bandwidth of a 256 MiB copy (read + write counted)."""
    import torch
    n = 2048
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = a.copy()
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    big = np.ones(64 * 2 ** 20, dtype=np.float32)
    dst = np.empty_like(big)
    return {("roofline", "numpy_sgemm"): (lambda: a @ b, 2.0 * n ** 3, 0.0),
            ("roofline", "torch_sgemm"): (lambda: ta @ tb, 2.0 * n ** 3, 0.0),
            ("roofline", "copy"): (lambda: np.copyto(dst, big), 0.0, 2.0 * big.nbytes)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="deepseek-v3.2-exp")
    ap.add_argument("--L", type=int, default=32768, help="indexer context length")
    ap.add_argument("--K", type=int, default=None, help="selected entries (default: the model's top-k)")
    ap.add_argument("--B", type=int, default=1, help="requests")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--reference-L", type=int, default=4096,
                    help="the float64 reference runs the indexer at this L (it is slow); rates are per token")
    ap.add_argument("--threads", type=int, default=None,
                    help="threads for Numba and torch (default: all); 1 compares per-core efficiency and is less "
                         "sensitive to other processes on a shared machine")
    ap.add_argument("--out", default=str(ROOT / "build" / "benchmarks" / "attention_kernels.json"))
    args = ap.parse_args(argv)

    import numba
    import torch
    if args.threads:
        numba.set_num_threads(args.threads)
        torch.set_num_threads(args.threads)
    m = model_spec(args.model)
    K = args.K or m.index_topk
    B, L, Hi, D, H = args.B, args.L, m.index_n_heads, m.index_head_dim, m.n_heads
    kv, rope, tile, Dqk = m.kv_lora_rank, m.qk_rope_head_dim, m.latent_fp8_tile, m.latent_dim
    rng = np.random.default_rng(0)

    keys = quant.encode_indexer_keys(rng.standard_normal((B, L, D), dtype=np.float32), m)       # (B, L, 132)
    qi = rng.standard_normal((B, Hi, D), dtype=np.float32)
    w = rng.random((B, Hi), dtype=np.float32)
    lengths = np.full(B, L, dtype=np.int64)
    n_lat = max(L, K)
    lat = quant.encode_latent(rng.standard_normal((n_lat, kv), dtype=np.float32),
                              rng.standard_normal((n_lat, rope), dtype=np.float32), m)          # (N, 656)
    idx = np.stack([rng.choice(n_lat, K, replace=False) for _ in range(B)]).astype(np.int64)   # (B, K)
    q = rng.standard_normal((B, H, Dqk), dtype=np.float32)
    sm = softmax_scale(m)

    idx_flops = 2.0 * B * Hi * D * L
    idx_bytes = float(B * L * (D + 4))
    mla_flops = 2.0 * B * H * K * (Dqk + kv)
    mla_bytes = float(B * K * lat.shape[1])

    results = {"machine": {"platform": platform.platform(), "processor": platform.processor(),
                           "cpus": os.cpu_count(), "numba_threads": numba.get_num_threads(),
                           "torch_threads": torch.get_num_threads(), "numpy": np.__version__,
                           "numba": numba.__version__, "torch": torch.__version__},
               "config": {"model": m.name, "B": B, "L": L, "K": K, "Hi": Hi, "D": D, "H": H, "Dqk": Dqk,
                          "Dv": kv, "reference_L": args.reference_L,
                          "threads": args.threads or "all"},
               "kernels": {}}

    out_i = np.empty((B, L), np.float32)
    tq, tw, tk, tl = (torch_ops.to_device(a, "cpu") for a in (qi, w, keys, lengths))
    Lr = min(args.reference_L, L)
    out_r = np.empty((B, Lr), np.float32)
    keys_r = np.ascontiguousarray(keys[:, :Lr])
    cases = {
        ("indexer", "numba"): (lambda: numba_cpu.indexer_scores(qi, w, keys, lengths, out_i), 1.0),
        ("indexer", "torch"): (lambda: torch_ops.indexer_scores_t(tq, tw, tk, tl), 1.0),
        ("indexer", "reference"): (lambda: reference.indexer_scores(qi, w, keys_r, np.full(B, Lr), out_r), Lr / L),
    }
    out = np.empty((B, H, kv), np.float32)
    lse = np.empty((B, H), np.float32)
    tqm, tpool, tidx = (torch_ops.to_device(a, "cpu") for a in (q, lat, idx))
    cases.update({
        ("sparse_mla", "numba"): (lambda: numba_cpu.sparse_mla_decode(q, lat, idx, sm, True, kv, rope, tile, out, lse),
                                  1.0),
        ("sparse_mla", "torch"): (lambda: torch_ops.sparse_mla_decode_t(tqm, tpool, tidx, sm, True, kv, rope, tile),
                                  1.0),
        ("sparse_mla", "reference"): (lambda: reference.sparse_mla_decode(q, lat, idx, sm, True, kv, rope, tile,
                                                                          out, lse), 1.0),
    })
    roof_cases = roofline_cases()
    cases.update({key: (fn, 1.0) for key, (fn, _, _) in roof_cases.items()})
    # rounds: in each, every case gets one untimed call (so the previous backend's OpenMP threads, which spin for a
    # while after a parallel region, have settled) and then a block of timed calls; rounds spread each case over
    # the run, so a busy spell of a shared machine hits all cases alike
    times = {key: [] for key in cases}
    per_round = 5
    for _ in range(max(1, args.repeats // per_round)):
        for key, (fn, _) in cases.items():
            time.sleep(0.3)      # let the previous backend's worker threads (OpenBLAS, OpenMP) stop spinning
            fn()
            for _ in range(per_round):
                t0 = time.perf_counter()
                fn()
                times[key].append(time.perf_counter() - t0)
    roof = {}
    for key, (_, flops, nbytes) in roof_cases.items():
        best = min(times.pop(key))
        cases.pop(key)
        roof[key[1]] = {"min_s": best, "GFLOPs": flops / best / 1e9, "GBs": nbytes / best / 1e9}
    results["roofline"] = {"numpy_sgemm_GFLOPs": roof["numpy_sgemm"]["GFLOPs"],
                           "torch_sgemm_GFLOPs": roof["torch_sgemm"]["GFLOPs"], "copy_GBs": roof["copy"]["GBs"],
                           "note": "GEMM 2048^3 fp32; copy counts read + write of a 256 MiB array; timed in the "
                                   "same rounds as the kernels, best of all rounds"}
    for (op, be), (fn, frac) in cases.items():
        v = times[(op, be)]
        t = {"min_s": min(v), "median_s": statistics.median(v), "mean_s": statistics.fmean(v),
             "std_s": statistics.pstdev(v), "repeats": len(v)}
        flops, nbytes = (idx_flops, idx_bytes) if op == "indexer" else (mla_flops, mla_bytes)
        t.update({"GFLOPs": frac * flops / t["min_s"] / 1e9, "GBs": frac * nbytes / t["min_s"] / 1e9,
                  "work_fraction": frac})
        results["kernels"][f"{op}/{be}"] = t
    roof = results["roofline"]
    peak = max(roof["numpy_sgemm_GFLOPs"], roof["torch_sgemm_GFLOPs"])
    ratios = {}
    for op in ("indexer", "sparse_mla"):
        k = results["kernels"]
        ratios[f"{op}: numba / torch speed"] = k[f"{op}/torch"]["min_s"] / k[f"{op}/numba"]["min_s"]
        ratios[f"{op}: numba / reference speed"] = k[f"{op}/reference"]["min_s"] / k[f"{op}/reference"]["work_fraction"] \
            / k[f"{op}/numba"]["min_s"]
        for be in ("numba", "torch"):
            ratios[f"{op}: {be} share of fp32 GEMM peak"] = k[f"{op}/{be}"]["GFLOPs"] / peak
    results["ratios"] = ratios
    # roofline bound per operation: min(fp32 GEMM peak, arithmetic intensity x copy bandwidth)
    bw = roof["copy_GBs"]
    results["bounds"] = {}
    for op, (flops, nbytes) in (("indexer", (idx_flops, idx_bytes)), ("sparse_mla", (mla_flops, mla_bytes))):
        ai = flops / nbytes
        bound = min(peak, ai * bw)
        results["bounds"][op] = {"flop_per_byte": ai, "bound_GFLOPs": bound,
                                 "limited_by": "compute" if peak < ai * bw else "memory"}

    print(f"machine: {results['machine']}")
    print(f"config: {results['config']}")
    print(f"roofline: numpy sgemm {roof['numpy_sgemm_GFLOPs']:.1f} GFLOP/s, torch sgemm "
          f"{roof['torch_sgemm_GFLOPs']:.1f} GFLOP/s, copy {roof['copy_GBs']:.1f} GB/s")
    for name, t in results["kernels"].items():
        print(f"{name:24s} min {t['min_s'] * 1e3:9.2f} ms  median {t['median_s'] * 1e3:9.2f} ms  "
              f"{t['GFLOPs']:7.2f} GFLOP/s  {t['GBs']:7.3f} GB/s" + ("" if t["work_fraction"] == 1 else
                                                                    f"  (measured at {t['work_fraction']:.3g} of L)"))
    for name, r in ratios.items():
        print(f"{name:45s} {r:8.3f}")
    for op, bnd in results["bounds"].items():
        print(f"{op}: {bnd['flop_per_byte']:.0f} flop per stored byte -> {bnd['limited_by']}-bound here "
              f"(bound {bnd['bound_GFLOPs']:.0f} GFLOP/s = min(GEMM peak, intensity x copy bandwidth))")
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return results


if __name__ == "__main__":
    main()
