"""GPU check of the attention kernels (prepared to run in one short session on a CUDA machine; < 3 minutes).

1. torch CUDA against the float64 NumPy reference, from the same stored bytes: the indexer (full geometry,
   64 heads x 128 dims, L = 4,097, 3 requests of different lengths) and sparse MLA (128 heads, 576 dims,
   K = 2,048 with -1 padding, FP8 and BF16 layouts).
2. The decode step through ``ess.storage.TieredCache(device="cuda")`` against attention over the all-resident cache,
   bit for bit (torch CUDA backend both ways), when ``ess.storage`` is present.
3. Timing of the CUDA kernels at the benchmark sizes (indexer L = 32K, sparse MLA K = 2,048, batch 1 and 32), with
   ``torch.cuda.synchronize`` around each of 20 timed calls after 3 warm-ups, reported as GFLOP/s and GB/s.

On a machine without CUDA it prints "no CUDA" and exits 0. Results go to ``$OUT/gpu_check_attention.json`` when
``OUT`` is set, else ``build/benchmarks/``.

    python benchmarks/gpu_check_attention.py
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from ess.bench import write_report  # noqa: E402


def main() -> int:
    import torch
    if not torch.cuda.is_available():
        print("no CUDA")
        return 0
    from ess import attention as A
    from ess import quant
    from ess.decode import decode_layer
    from ess.kernels.attention import torch_ops
    from ess.specs import model_spec

    t_start = time.time()
    m = model_spec("deepseek-v3.2-exp")
    rng = np.random.default_rng(0)
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "checks": {}, "timing": {}}
    ok = True

    # 1. correctness against the reference
    B, L = 3, 4097
    keys = quant.encode_indexer_keys(rng.standard_normal((B, L, 128)), m)
    qi, w = rng.standard_normal((B, 64, 128)), rng.random((B, 64))
    lengths = np.array([L, 2049, 17])
    ref = A.indexer_scores(qi, w, keys, lengths, backend="reference")
    got = A.indexer_scores(qi, w, keys, lengths, backend="torch", device="cuda")
    vis = np.isfinite(ref)
    err = float(np.abs(got[vis] - ref[vis]).max() / np.abs(ref[vis]).max())
    same_mask = bool(np.array_equal(np.isfinite(got), vis))
    report["checks"]["indexer_max_rel_err"] = err
    ok &= err < 1e-3 and same_mask
    idx = A.topk_indices(ref, 2048)
    q = rng.standard_normal((B, 128, 576)).astype(np.float32)
    for dtype in ("fp8", "bf16"):
        lat = quant.encode_latent(rng.standard_normal((B, L, 512)), rng.standard_normal((B, L, 64)), m, dtype)
        r = A.sparse_mla_decode(q, lat, idx, m, dtype=dtype, backend="reference")
        g = A.sparse_mla_decode(q, lat, idx, m, dtype=dtype, backend="torch", device="cuda")
        e_out, e_lse = float(np.abs(g.out - r.out).max()), float(np.abs(g.lse - r.lse).max())
        report["checks"][f"mla_{dtype}_max_abs_err_out"] = e_out
        report["checks"][f"mla_{dtype}_max_abs_err_lse"] = e_lse
        ok &= e_out < 1e-3 and e_lse < 1e-3          # TF32 is off by default for torch matmul
    print(f"correctness: {report['checks']}  ({time.time() - t_start:.1f} s)")

    # 2. lossless through the tiered cache on the GPU
    try:
        from ess.storage import TieredCache
    except ImportError:
        report["checks"]["lossless"] = "ess.storage missing"
    else:
        tiny = model_spec("tiny")
        lens = [300, 190]
        lat = [quant.encode_latent(rng.standard_normal((tiny.n_layers, n, 128)),
                                   rng.standard_normal((tiny.n_layers, n, 16)), tiny) for n in lens]
        ik = [quant.encode_indexer_keys(rng.standard_normal((n, 32)), tiny) for n in lens]
        cache = TieredCache(tiny, capacity=80, policy="lru", device="cuda")
        for i, e in enumerate(lat):
            cache.add_request(f"r{i}", e)
        equal, misses = True, 0
        for layer in (0, 1, 0, 3):
            qa = rng.standard_normal((2, tiny.n_heads, tiny.latent_dim)).astype(np.float32)
            qx, wx = rng.standard_normal((2, 4, 32)), rng.random((2, 4))
            st = decode_layer(cache, layer, ["r0", "r1"], qx, wx, ik, qa, tiny, backend="torch", device="cuda")
            base = A.resident_attention(qa, [e[layer] for e in lat], st.indices, tiny, backend="torch",
                                        device="cuda")
            equal &= bool(np.array_equal(st.out, base.out) and np.array_equal(st.lse, base.lse))
            misses += sum(int(s.miss_pos.size) for s in st.steps)
        report["checks"]["lossless_bitwise_equal"] = equal
        report["checks"]["lossless_misses"] = misses
        ok &= equal and misses > 0
        print(f"lossless through TieredCache(device='cuda'): {equal}, {misses} misses")

    # 3. timing
    def timed(fn, n=20):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        return min(ts), statistics.median(ts)

    dev = "cuda"
    for Bt in (1, 32):
        Lt, K = 32768, 2048
        keys = torch_ops.to_device(quant.encode_indexer_keys(rng.standard_normal((Bt, Lt, 128), dtype=np.float32), m),
                                   dev)
        qi_t = torch_ops.to_device(rng.standard_normal((Bt, 64, 128), dtype=np.float32), dev)
        w_t = torch_ops.to_device(rng.random((Bt, 64), dtype=np.float32), dev)
        len_t = torch_ops.to_device(np.full(Bt, Lt, np.int64), dev)
        tmin, tmed = timed(lambda: torch_ops.indexer_scores_t(qi_t, w_t, keys, len_t))
        report["timing"][f"indexer_B{Bt}"] = {"min_s": tmin, "median_s": tmed,
                                              "GFLOPs": 2 * Bt * 64 * 128 * Lt / tmin / 1e9,
                                              "GBs": Bt * Lt * 132 / tmin / 1e9}
        pool = torch_ops.to_device(quant.encode_latent(rng.standard_normal((Bt * 4096, 512), dtype=np.float32),
                                                       rng.standard_normal((Bt * 4096, 64), dtype=np.float32), m), dev)
        idx_t = torch_ops.to_device(np.stack([b * 4096 + rng.choice(4096, K, replace=False) for b in range(Bt)]), dev)
        q_t = torch_ops.to_device(rng.standard_normal((Bt, 128, 576), dtype=np.float32), dev)
        tmin, tmed = timed(lambda: torch_ops.sparse_mla_decode_t(q_t, pool, idx_t, 0.1352, True, 512, 64, 128))
        report["timing"][f"sparse_mla_B{Bt}"] = {"min_s": tmin, "median_s": tmed,
                                                 "GFLOPs": 2 * Bt * 128 * K * (576 + 512) / tmin / 1e9,
                                                 "GBs": Bt * K * 656 / tmin / 1e9}
    for k, v in report["timing"].items():
        print(f"{k:16s} min {v['min_s'] * 1e3:8.3f} ms  median {v['median_s'] * 1e3:8.3f} ms  "
              f"{v['GFLOPs']:9.1f} GFLOP/s  {v['GBs']:8.2f} GB/s")
    report["ok"] = bool(ok)
    report["wall_s"] = time.time() - t_start
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "build" / "benchmarks"
    write_report("gpu_check_attention", report, out_dir)
    print(f"{'OK' if ok else 'FAILED'} in {report['wall_s']:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
