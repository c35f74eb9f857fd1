"""Dense against sparse attention as the context grows: one decode step (one request, one layer) timed at each
context length L.

Cases, all read from stored FP8 entries with the library's kernels (``--backend``): dense MLA over all L entries
(the baseline, measured in the same run), sparse MLA over K entries and the lightning indexer over L keys. Every
(L, case) pair is warmed up once (JIT compilation and first touch excluded), then the pairs are timed in turn
``--repeats`` times, interleaved so that a busy spell of the machine hits all of them, and the minimum is kept.
``cumulative_*`` columns integrate the per-step cost over a whole sequence of L decode steps (trapezoid between the
measured L, linear from 0 to the first): O(L^2) dense against O(L K) sparse attention, plus the indexer's O(L^2) at
a much smaller constant. ``--threads`` sets this process's Numba and torch thread count. Inputs are random
(standard-normal latents, keys and queries). Nothing is asserted.

    .venv/bin/python benchmarks/attention_cost.py [--context-lens 2048 4096 ...] [--heads 128] [--repeats 5]
        [--threads 1] [--backend numba] [--out-dir build/benchmarks]

Writes attention_cost.json (rows, configuration, machine); notebook 03 runs it through ess.bench.run_benchmark.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from functools import partial
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ess.attention import indexer_scores, sparse_mla_decode  # noqa: E402
from ess.bench import write_report  # noqa: E402
from ess.quant import encode_indexer_keys, encode_latent  # noqa: E402
from ess.specs import ModelSpec, model_spec  # noqa: E402


def attention_cost_scan(model: ModelSpec, context_lens: Sequence[int], *, topk: int | None = None,
                        n_heads: int | None = None, backend: str = "numba", repeats: int = 3, seed: int = 0,
                        threads: int | None = None) -> pd.DataFrame:
    """The scan of the module docstring: one row per context length, times in seconds (``dense_s``, ``sparse_s``,
    ``indexer_s``, ``sparse_total_s`` and their ``cumulative_*``), the configuration in ``df.attrs["config"]``."""
    rng = np.random.default_rng(seed)
    H = n_heads or model.n_heads
    K = topk or model.index_topk
    Lmax = max(context_lens)
    ckv = rng.standard_normal((Lmax, model.kv_lora_rank)).astype(np.float32)
    rope = rng.standard_normal((Lmax, model.qk_rope_head_dim)).astype(np.float32)
    lat = encode_latent(ckv, rope, model)[None]                                               # (1, Lmax, E)
    keys = encode_indexer_keys(rng.standard_normal((1, Lmax, model.index_head_dim)), model)
    q = rng.standard_normal((1, H, model.latent_dim)).astype(np.float32)
    qi = rng.standard_normal((1, model.index_n_heads, model.index_head_dim)).astype(np.float32)
    w = rng.random((1, model.index_n_heads)).astype(np.float32)

    cases = {}
    for L in sorted(context_lens):
        dense_idx = np.arange(L, dtype=np.int64)[None]
        sparse_idx = rng.choice(L, min(K, L), replace=False)[None].astype(np.int64)
        lat_L, keys_L = lat[:, :L], keys[:, :L]
        cases[(L, "dense_s")] = partial(sparse_mla_decode, q, lat_L, dense_idx, model, backend=backend)
        cases[(L, "sparse_s")] = partial(sparse_mla_decode, q, lat_L, sparse_idx, model, backend=backend)
        cases[(L, "indexer_s")] = partial(indexer_scores, qi, w, keys_L, backend=backend)
    import numba
    import torch
    if threads is not None:                  # this process's thread count (the benchmark runs in its own process)
        numba.set_num_threads(threads)
        torch.set_num_threads(threads)
    for fn in cases.values():
        fn()
    best = {key: math.inf for key in cases}
    for _ in range(repeats):
        for key, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            best[key] = min(best[key], time.perf_counter() - t0)
    rows = [{"context_len": L, **{kind: best[(L, kind)] for kind in ("dense_s", "sparse_s", "indexer_s")}}
            for L in sorted(context_lens)]
    df = pd.DataFrame(rows)
    df["sparse_total_s"] = df.sparse_s + df.indexer_s
    Ls = np.concatenate([[0], df.context_len.to_numpy()])
    for col in ("dense_s", "sparse_total_s", "sparse_s", "indexer_s"):
        per_step = np.concatenate([[0.0], df[col].to_numpy()])
        df["cumulative_" + col] = np.cumsum(np.diff(Ls) * (per_step[1:] + per_step[:-1]) / 2)[:]
    df.attrs["config"] = {"model": model.name, "H": H, "K": K, "backend": backend, "repeats": repeats,
                          "batch": 1, "dtype": "fp8", "threads": threads or numba.get_num_threads()}
    return df


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="deepseek-v3.2-exp")
    ap.add_argument("--context-lens", type=int, nargs="+", default=[2048, 4096, 8192, 16384, 32768])
    ap.add_argument("--heads", type=int, default=None, help="query heads (default: the model's)")
    ap.add_argument("--topk", type=int, default=None, help="selected entries (default: the model's top-k)")
    ap.add_argument("--backend", default="numba")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out-dir", default=None, help="report folder (default: build/benchmarks)")
    args = ap.parse_args(argv)
    df = attention_cost_scan(model_spec(args.model), args.context_lens, topk=args.topk, n_heads=args.heads,
                             backend=args.backend, repeats=args.repeats, seed=args.seed, threads=args.threads)
    last, first = df.iloc[-1], df.iloc[0]
    growth = float(last.context_len / first.context_len)
    report = {"rows": df.to_dict(orient="records"), "config": df.attrs["config"],
              "dense_over_sparse_at_max_L": float(last.dense_s / last.sparse_total_s),
              # what the model expects, as ratios measured side by side (reported, never asserted): dense attention
              # grows about linearly with L (ratio near 1), attention over K entries stays well below dense past K
              "dense_growth_over_context_growth": float(last.dense_s / first.dense_s) / growth,
              "sparse_over_dense_at_max_L": float(last.sparse_s / last.dense_s)}
    path = write_report("attention_cost", report, args.out_dir)
    print(df.to_string(index=False))
    print(f"at L = {int(last.context_len)}: dense / (indexer + sparse) = {report['dense_over_sparse_at_max_L']:.1f}x;"
          f" dense grew {report['dense_growth_over_context_growth']:.2f}x as fast as L; sparse / dense "
          f"{report['sparse_over_dense_at_max_L']:.2f}  -> {path}")
    return report


if __name__ == "__main__":
    main()
