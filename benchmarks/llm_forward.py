"""The real model (SmolLM2-135M-Instruct, float32, CPU): loading, prefill tokens/s and dense decode steps/s.

Three implementations on the same weights, measured in the same run:

* ``ess``: :class:`ess.llm.LlamaModel` with its explicit attention (scores, softmax, weighted sum; ``matmul``);
* ``ess_sdpa``: the same model with torch's ``scaled_dot_product_attention`` as the attention;
* ``transformers``: ``LlamaForCausalLM`` loaded from the same GGUF file (its default SDPA attention), the baseline.

Prefill: one prompt of T tokens (real English text: the language reference topics that ship with Python,
``pydoc_data.topics``, through ``ess.llm.reference_text_ids``), logits of the last token only (all three).
Decode: one new token for one sequence at context L, the K/V cache filled with L random entries beforehand (the
time of a step does not depend on the values), the cache cut back to L after each step so every timed step sees
the same L.

Timing: one untimed call of every case, then ``--repeats`` rounds in which every case is timed once
(``time.perf_counter``), so that load from other processes falls on all implementations alike. Reported: the
distribution of seconds per call, tokens/s (prefill) or steps/s (decode) from the median, and the ratios
ess / transformers and ess / ess_sdpa.
Loading is timed once each way: from the GGUF file (parse + dequantise), from the ``build/cache/llm`` cache, and
transformers' ``from_pretrained``. Nothing is asserted.

    .venv/bin/python benchmarks/llm_forward.py [--prefill 512 2048] [--decode 1024 4096 8191] [--repeats 3]
                                               [--threads 1] [--no-transformers]

Writes build/benchmarks/llm_forward.json.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from ess.bench import distribution, write_report  # noqa: E402
from ess.llm import load_model, model_path, reference_text_ids  # noqa: E402


def load_transformers():
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoModelForCausalLM
    path = model_path()
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


def ess_prefill(model, ids, impl):
    def run():
        model.attention_impl = impl
        model.prefill(ids)
    return run


def hf_prefill(hf, ids):
    x = torch.tensor([ids])

    def run():
        with torch.no_grad():
            hf(x, use_cache=True, logits_to_keep=1)
    return run


def ess_decode(model, L, impl):
    cache = model.new_cache(1, L + 1)
    g = torch.Generator().manual_seed(0)
    for t in cache.k + cache.v:
        t[:, :, :L] = torch.randn(t[:, :, :L].shape, generator=g)
    cache.lengths[:] = L

    def run():
        model.attention_impl = impl
        model.decode([42], cache)
        cache.lengths[:] = L
    return run


def hf_decode(hf, L):
    from transformers import DynamicCache
    c = hf.config
    cache = DynamicCache(config=c)
    g = torch.Generator().manual_seed(0)
    shape = (1, c.num_key_value_heads, L, c.head_dim)
    for layer in range(c.num_hidden_layers):
        cache.update(torch.randn(shape, generator=g), torch.randn(shape, generator=g), layer)
    x, pos = torch.tensor([[42]]), torch.tensor([[L]])

    def run():
        with torch.no_grad():
            hf(x, past_key_values=cache, position_ids=pos, use_cache=True)
        cache.crop(-1)                   # drop the new token again: every step sees context L
        assert cache.get_seq_length() == L
    return run


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefill", type=int, nargs="*", default=[512, 2048], help="prompt lengths")
    ap.add_argument("--decode", type=int, nargs="*", default=[1024, 4096, 8191], help="context lengths")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: on a shared 2-core machine, 2 threads stall on each other's "
                         "hand-offs whenever another process runs; pass 2 on an idle machine)")
    ap.add_argument("--no-transformers", action="store_true", help="skip the transformers baseline")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    lm_file = load_model(cache_dir=None)
    load = {"from_gguf_s": time.perf_counter() - t0, "from_gguf_parts_s": lm_file.timings_s}
    del lm_file
    load_model()                                     # make sure the cache exists
    t0 = time.perf_counter()
    lm = load_model()
    load.update(from_cache_s=time.perf_counter() - t0, from_cache_parts_s=lm.timings_s, cache=lm.cache_status)
    hf = None
    if not args.no_transformers:
        t0 = time.perf_counter()
        hf = load_transformers()
        load["transformers_s"] = time.perf_counter() - t0
    print(f"load: GGUF file {load['from_gguf_s']:.2f} s, cache {load['from_cache_s']:.2f} s"
          + (f", transformers {load['transformers_s']:.2f} s" if hf else ""))

    model, ctx = lm.model, lm.config.context_length
    cases = {}
    for T in args.prefill:
        ids = reference_text_ids(lm.tokenizer, T)
        cases[("prefill", T, "ess")] = ess_prefill(model, ids, "matmul")
        cases[("prefill", T, "ess_sdpa")] = ess_prefill(model, ids, "sdpa")
        if hf:
            cases[("prefill", T, "transformers")] = hf_prefill(hf, ids)
    for L in args.decode:
        if L >= ctx:
            raise SystemExit(f"--decode {L}: the context holds {ctx} tokens, the new token needs one")
        cases[("decode", L, "ess")] = ess_decode(model, L, "matmul")
        cases[("decode", L, "ess_sdpa")] = ess_decode(model, L, "sdpa")
        if hf:
            cases[("decode", L, "transformers")] = hf_decode(hf, L)

    for fn in cases.values():                        # one untimed call each (first touch, allocator, caches)
        fn()
    samples = {key: [] for key in cases}
    for _ in range(max(1, args.repeats)):            # interleave: every case once per round
        for key, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            samples[key].append(time.perf_counter() - t0)
    results = []
    for (kind, n, impl), xs in samples.items():
        med = statistics.median(xs)
        rate = n / med if kind == "prefill" else 1.0 / med
        results.append({"kind": kind, "tokens" if kind == "prefill" else "context": n, "impl": impl,
                        "seconds": distribution(xs),
                        "tokens_per_s" if kind == "prefill" else "steps_per_s": rate})
    by = {(r["kind"], r.get("tokens", r.get("context")), r["impl"]): r for r in results}
    ratios = {}
    for (kind, n, impl), r in by.items():
        if impl != "ess":
            continue
        key = "tokens_per_s" if kind == "prefill" else "steps_per_s"
        for base in ("transformers", "ess_sdpa"):
            if (kind, n, base) in by:
                ratios[f"{kind}_{n}_ess_over_{base}"] = r[key] / by[(kind, n, base)][key]
    for (kind, n, impl), r in by.items():
        rate = r.get("tokens_per_s", r.get("steps_per_s"))
        unit = "tokens/s" if kind == "prefill" else "steps/s"
        s = r["seconds"]
        print(f"{kind:7s} {n:5d} {impl:12s}: {rate:9.1f} {unit:8s} (median {s['median']:.3f} s, min {s['min']:.3f}, "
              f"n {s['n']})")
    for k, v in ratios.items():
        print(f"  {k}: {v:.2f}")
    report = {"benchmark": "llm_forward", "model": lm.metadata.get("general.name"), "dtype": "float32",
              "threads": args.threads, "config": lm.config.__dict__, "load": load, "results": results,
              "ratios": ratios, "text": "pydoc_data.topics (sorted keys), tokenized"}
    path = write_report("llm_forward", report)
    print(f"wrote {path.relative_to(ROOT)}")
    return report


if __name__ == "__main__":
    main()
