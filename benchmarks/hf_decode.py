"""The transformers path's speed: seconds per decode step of SmolLM2-135M-Instruct (float32) decoding sparsely
through ``ess.hf`` (transformers' model code, ess's cache and attention), against ess's own engine at the same
settings and against transformers' own dense decoding, and their ratios, measured in one run.

* ``hf_ess``: transformers' ``LlamaForCausalLM`` (loaded by transformers from ess's GGUF file) with a
  :class:`ess.hf.SparseCache`: K = L/16 entries per step and layer chosen by ess's FP8 indexer, the K/V entries
  offloaded (device pool ``--ratio``, LRU, ``--schedule``, the copy-worker link unpaced);
* ``ess_engine``: ess's own engine (:class:`ess.engine.DecodeEngine`, ess's Llama code) at the same settings;
* ``hf_dense``: transformers' own dense decoding (SDPA over its ``DynamicCache``).

One prompt of ``--context`` tokens of real text (``pydoc_data.topics``), prefilled **once** by transformers
(one forward: SDPA's fused causal kernel, on every core); every mode continues from it (:meth:`ess.hf.SparseCache.from_cache`; ess's engine takes the same
K/V entries and FP8 indexer keys), so LRU-Warmup is off in both sparse modes (the pool starts cold; the
``--warmup`` untimed steps fill it). Timing: one session per mode, ``--warmup`` untimed steps then
``--repeats`` x ``--steps`` timed ones, the modes' steps interleaved (a dense step, an ess step, an hf step, ...)
so that load from other processes falls on all three alike; wall time, the garbage collector off while timing.
Reported: the distribution of seconds per step, the ratios (goal: hf_ess / ess_engine <= 1.25), where a step's
time goes in each sparse mode (the caches' per-operation timers, ms per step; ``model``: the step outside them,
the model's own layers), and the machine's load average before and after. Nothing is asserted.

SmolLM2-135M was trained on 8,192-token contexts: ``--context`` past that needs ``--extrapolate-context``
(**benchmark only**: RoPE extrapolated, the tokens are not meaningful, the work per step is real).

    .venv/bin/python benchmarks/hf_decode.py [--context 8176] [--steps 4] [--repeats 3] [--warmup 2]
                                            [--ratio 0.5] [--schedule da] [--threads 1] [--extrapolate-context]

Writes build/benchmarks/hf_decode_<context>.json (``$OUT/...`` when ``OUT`` is set).
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

import ess.hf as H  # noqa: E402
from ess.bench import distribution, write_report  # noqa: E402
from ess.engine import DecodeConfig, DecodeEngine, Prefilled  # noqa: E402
from ess.engine.indexer import quantize_keys  # noqa: E402
from ess.engine.kv import kv_entries  # noqa: E402
from ess.studies.real_model.measure import measured_breakdown  # noqa: E402
from ess.llm import reference_text_ids  # noqa: E402


def hf_breakdown(cache, step_s: list, skip: int) -> dict:
    """ms per step of each operation the SparseCache timed (steps from ``skip`` on, summed over layers), and
    ``model``: the rest of the step (transformers' layers, embedding, logits, the glue of ess.hf)."""
    df = cache.timer.to_frame()
    df = df[df.step >= skip]
    n = max(len(step_s), 1)
    ops = (df.groupby(df.op.str.replace(r"_b[01]$", "", regex=True)).seconds.sum() / n).sort_values(ascending=False)
    out = {k: round(float(v) * 1e3, 3) for k, v in ops.items()}
    out["model"] = round((statistics.mean(step_s) - sum(ops)) * 1e3, 3)
    return out


def engine_prefilled(ids: list, dyn, first_logits, n_layers: int, seconds: float) -> Prefilled:
    """ess's engine's prefill state built from transformers' DynamicCache (the same K/V and indexer keys)."""
    ks = [layer.keys for layer in dyn.layers]                                         # (1, Hkv, L, hd) each
    vs = [layer.values for layer in dyn.layers]
    entries = torch.stack([kv_entries(k, v)[0] for k, v in zip(ks, vs)]).cpu()          # (n_layers, L, E)
    cs = [quantize_keys(k[0].transpose(0, 1)) for k in ks]
    codes = torch.stack([c for c, _ in cs]).cpu()
    scales = torch.stack([s for _, s in cs]).cpu()
    H_, hd = 1, ks[0].shape[-1]
    tails = torch.zeros((n_layers, 1, H_, hd))                      # only LRU-Warmup reads them (off here)
    return Prefilled([ids], [entries], [codes], [scales], [tails], first_logits.cpu(), None, seconds)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=8176, help="context tokens when decoding starts (default: the trained 8,192 - 16)")
    ap.add_argument("--steps", type=int, default=4, help="timed steps per round")
    ap.add_argument("--repeats", type=int, default=3, help="rounds")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (the cold pool fills)")
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--schedule", default="da", choices=("none", "da", "dba"))
    ap.add_argument("--threads", type=int, default=1, help="torch and Numba threads")
    ap.add_argument("--extrapolate-context", action="store_true",
                    help="BENCHMARK ONLY: --context past the trained 8,192 tokens (the tokens are not meaningful)")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    import numba
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    out_dir = args.out_dir or (os.environ.get("OUT") or None)
    load_before = list(os.getloadavg())
    total = args.warmup + args.repeats * args.steps
    L = args.context
    extrapolate = L + total + 1 if args.extrapolate_context else None
    eng = DecodeEngine.load(extrapolate_context_to=extrapolate)
    if L + total > eng.config.context_length:
        ap.error(f"--context {L} + {total} steps is past the trained context of {eng.trained_context_length} "
                 f"tokens: add --extrapolate-context (benchmark only)")
    model, _ = H.load_smollm2()
    H.enable(model)                       # without a SparseCache, ess's attention is transformers' SDPA
    ids = reference_text_ids(eng.tokenizer, L, skip_tokens=1000)
    from transformers import DynamicCache
    dyn = DynamicCache(config=model.config)
    torch.set_num_threads(os.cpu_count() or 1)                     # the prefill on every core (not timed)
    first, prefill_s = H.prefill(model, torch.tensor([ids]), dyn, chunk=None)
    torch.set_num_threads(args.threads)
    print(f"prefill of {L} tokens (transformers, SDPA): {prefill_s:.1f} s", flush=True)
    K = max(1, L // 16)
    cfg = DecodeConfig(topk=K, ratio=args.ratio, schedule=args.schedule, warmup=False)
    pre = engine_prefilled(ids, dyn, first, eng.config.n_layers, prefill_s)
    session = eng.start(pre, total, cfg)
    cache = H.SparseCache.from_cache(model, dyn, cfg, max_new_tokens=total)
    tok0 = int(first.argmax(-1)[0])
    toks = {"hf_dense": tok0, "hf_ess": tok0}

    def hf_step(mode, c):
        with torch.no_grad():
            lg = model(input_ids=torch.tensor([[toks[mode]]]), cache=c).logits[:, -1]
        toks[mode] = int(lg.argmax(-1)[0])

    samples = {"hf_dense": [], "ess_engine": [], "hf_ess": []}
    gc.disable()
    try:
        for t in range(total):
            timed = t >= args.warmup
            t0 = time.perf_counter()
            hf_step("hf_dense", dyn)
            t1 = time.perf_counter()
            rec = session.step()
            t2 = time.perf_counter()
            hf_step("hf_ess", cache)
            t3 = time.perf_counter()
            if timed:
                samples["hf_dense"].append(t1 - t0)
                samples["ess_engine"].append(rec.step_s)
                samples["hf_ess"].append(t3 - t2)
            if timed and (t - args.warmup + 1) % args.steps == 0:
                print(f"round {(t - args.warmup + 1) // args.steps}: " + ", ".join(
                    f"{m} {statistics.median(s) * 1e3:.0f} ms" for m, s in samples.items()), flush=True)
    finally:
        gc.enable()
    run = session.close()
    cache.close()
    med = {m: statistics.median(s) for m, s in samples.items()}
    ratios = {"hf_ess_over_ess_engine": med["hf_ess"] / med["ess_engine"],
              "hf_dense_over_hf_ess": med["hf_dense"] / med["hf_ess"]}
    c = cache.counters()
    report = {"benchmark": "hf_decode", "context": L, "steps_timed": args.repeats * args.steps,
              "warmup_steps": args.warmup, "threads": args.threads, "topk": K, "ratio": args.ratio,
              "schedule": args.schedule, "pool_slots": cache.capacity, "prefill_s": prefill_s,
              "trained_context": eng.trained_context_length, "output_meaningful": L + total <= 8192,
              "seconds_per_step": {m: distribution(s) for m, s in samples.items()},
              "ratios": ratios, "goal_hf_ess_over_ess_engine_at_most": 1.25,
              "per_op_ms": {"ess_engine": {k: round(v * 1e3, 3) for k, v in
                                           measured_breakdown(run, skip_steps=args.warmup).items()},
                            "hf_ess": hf_breakdown(cache, samples["hf_ess"], args.warmup)},
              "misses_per_step_hf": float(c["cache_misses"][args.warmup:].sum(axis=(1, 2)).mean()),
              "misses_per_step_engine": float(run.misses[args.warmup:].sum(axis=(1, 2)).mean()),
              "loadavg_before": load_before, "loadavg_after": list(os.getloadavg()),
              "text": "pydoc_data.topics (sorted keys), tokens 1000 onward",
              "dense_note": "transformers' SDPA attention over its DynamicCache, called through ess's registered "
                            "attention function (which falls back to it without a SparseCache)"}
    for m, v in med.items():
        print(f"{m:10s}: median {v * 1e3:.1f} ms per step")
    for k, v in ratios.items():
        print(f"  {k}: {v:.3f}")
    for m, ops in report["per_op_ms"].items():
        print(f"  {m} ms per step:", ops)
    print(f"  load average before {load_before}, after {report['loadavg_after']}")
    path = write_report(f"hf_decode_{L}", report, out_dir)
    print(f"wrote {path}")
    return report


if __name__ == "__main__":
    main()
