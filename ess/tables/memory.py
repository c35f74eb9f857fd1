"""Tables of the memory model (notebook 01): the article's memory claims and the batch limits."""
from __future__ import annotations

import pandas as pd

from .. import validate
from ..layout import KV_DTYPES, request_cache
from ..memory import host_memory_needed_bytes, largest_batch
from ..published import published
from ..specs import DEFAULT_DEPLOYMENT, DEFAULT_MODEL, gpu_spec, host_spec, list_gpus, resolve

__all__ = ["memory_wall_claims", "batch_limits_by_gpu", "kv_bytes_by_context"]


def _contexts(model, context_lens) -> list[int]:
    """``context_lens`` (a number or a 1-D array of whole numbers of tokens, each within the model's maximum
    context) as a list of ints."""
    L = validate.number_array("context_lens", context_lens, whole=True)
    if L.size == 0:
        raise ValueError("context_lens must list at least one context length")
    if (L > model.max_position_embeddings).any():
        raise ValueError(f"context_lens must not exceed the maximum context of {model.name} "
                         f"({model.max_position_embeddings} tokens), got {context_lens!r}")
    return [int(x) for x in L.ravel()]


def _names(name: str, values, choices) -> list:
    """``values``, a list or tuple of choices (one string is refused: it would be read letter by letter)."""
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"{name} must be a list of names, got {type(values).__name__}")
    if not values:
        raise ValueError(f"{name} must list at least one of {tuple(choices)}")
    return [validate.one_of(f"{name}[{i}]", v, choices) for i, v in enumerate(values)]


def kv_bytes_by_context(context_lens, *, model=DEFAULT_MODEL, dtypes=("fp8", "bf16")) -> pd.DataFrame:
    """Cache bytes per request against context length: indexer and latent parts, per latent dtype."""
    model, *_ = resolve(model, DEFAULT_DEPLOYMENT, None, None)
    context_lens = _contexts(model, context_lens)
    dtypes = _names("dtypes", dtypes, KV_DTYPES)
    rows = []
    for dtype in dtypes:
        for L in context_lens:
            rc = request_cache(model, int(L), 1.0, dtype)
            rows.append({"context_len": int(L), "dtype": dtype, "indexer_bytes": rc.indexer_bytes,
                         "latent_bytes": rc.latent_bytes, "total_bytes": rc.total_bytes})
    return pd.DataFrame(rows)


def batch_limits_by_gpu(context_lens, ratios, *, gpus=None, model=DEFAULT_MODEL,
                        deployment=DEFAULT_DEPLOYMENT) -> pd.DataFrame:
    """Largest batch per GPU for every GPU preset, context length and ratio, under one deployment layout
    (the deployment's GPU replaced by each preset; its host and memory fraction kept)."""
    model_, dep, *_ = resolve(model, deployment, None, None)
    context_lens = _contexts(model_, context_lens)
    ratios = [float(r) for r in validate.number_array("ratios", ratios).ravel()]
    if not ratios:
        raise ValueError("ratios must list at least one sparse-memory ratio")
    for r in ratios:
        validate.ratio("ratios", r)
    gpus = list_gpus() if gpus is None else _names("gpus", gpus, list_gpus())
    for gpu in gpus:
        gpu_spec(gpu)
    rows = []
    for gpu in gpus:
        for L in context_lens:
            for r in ratios:
                try:
                    lim = largest_batch(int(L), float(r), model=model, deployment=deployment, gpu=gpu)
                    rows.append({"gpu": gpu, "context_len": int(L), "ratio": float(r), "batch": lim.batch,
                                 "limited_by": lim.limited_by, "reason": lim.reason,
                                 "kv_budget_GB": lim.kv_budget_bytes / 1e9})
                except ValueError as exc:           # weights do not fit on this GPU (every argument was checked)
                    rows.append({"gpu": gpu, "context_len": int(L), "ratio": float(r), "batch": 0,
                                 "limited_by": "infeasible", "reason": str(exc), "kv_budget_GB": 0.0})
    return pd.DataFrame(rows)


def memory_wall_claims(*, model=DEFAULT_MODEL, deployment=DEFAULT_DEPLOYMENT,
                       a100_deployment="a100-ep32", offload_ratio=0.2) -> pd.DataFrame:
    """The article's memory claims (sections 1.1 and 2.1) and the paper's no-offload limits, each computed from
    the memory model and marked reproduced or not, with the reason."""
    art, pap = published("article"), published("paper")
    model_, dep, *_ = resolve(model, deployment, None, None)
    rows = []

    def row(claim, published_value, ours, unit, status, reason, source, config):
        rows.append({"claim": claim, "published": published_value, "ours": ours, "unit": unit, "status": status,
                     "reason": reason, "source": source, "config": config})

    for key, fit in (("batch_limit_32k", True), ("batch_limit_128k", False)):
        p = pap[key]
        lim = largest_batch(p["context_len"], 1.0, model=model_, deployment=dep)
        ok = abs(lim.batch - p["value"]) <= 2          # the memory model's acceptance band: within 2 requests
        if fit:
            status = "calibrated" if ok else "calibration failed"
            how = "mem_fraction_static was fitted on this limit, so agreement here shows only that the fit holds"
        else:
            # a 128K request is exactly four 32K requests (131,072 = 4 x 32,768 tokens, whole cache pages, bytes
            # linear in tokens): a budget that holds 52 but not 53 of them at 32K holds floor(52 / 4) = 13 and
            # fewer than 53 / 4 = 13.25 at 128K, whatever fraction was fitted -- the 128K limit follows from the fit
            status = "implied by the 32K fit" if ok else "not reproduced"
            how = (f"follows arithmetically from the fraction fitted at 32K (a 128K request is exactly four 32K "
                   f"requests, so 52 at 32K means 13 at 128K), not an independent check: {lim.batch} vs "
                   f"{p['value']} (difference {lim.batch - p['value']:+d})")
        row(f"no-offload batch limit at {p['context_len'] // 1024}K", p["value"], lim.batch, p["unit"],
            status, how, p["source"],
            {"deployment": dep.name, "context_len": p["context_len"], "ratio": 1.0})

    p = art["kv_per_sample_32k"]
    rc = request_cache(model_, 32768, 1.0, dep.kv_dtype)
    inside = p["low"] <= rc.total_bytes < p["high"]
    per_layer = rc.total_bytes / model_.n_layers
    row("KV cache per sample at 32K", p["value"], rc.total_bytes, "B", "reproduced" if inside else "not reproduced",
        f"{rc.total_bytes / 1e9:.2f} GB over {model_.n_layers} layers ({per_layer / 1e6:.1f} MB per layer); 'hundreds "
        f"of MB' fits a model with {p['low'] / per_layer:.0f}-{p['high'] / per_layer:.0f} such layers, or a "
        f"per-GPU share of a sharded cache", p["source"], {"context_len": 32768, "dtype": dep.kv_dtype})

    p = art["a100_batch_beyond_16k"]
    lim = largest_batch(p["context_len"], 1.0, model=model_, deployment=a100_deployment)
    L4 = p["context_len"]
    while L4 * 2 <= model_.max_position_embeddings and \
            largest_batch(L4, 1.0, model=model_, deployment=a100_deployment).batch > p["value"]:
        L4 *= 2
    row("A100 80GB batch beyond 16K", p["value"], lim.batch, p["unit"],
        "reproduced" if lim.batch == p["value"] else "not reproduced",
        f"DeepSeek-V3.2-Exp with FP8 weights and cache on A100-80G ({a100_deployment}): KV budget "
        f"{lim.kv_budget_bytes / 1e9:.1f} GB, {lim.gpu_bytes_per_request / 1e9:.2f} GB per 16K request; the limit "
        f"falls to {largest_batch(L4, 1.0, model=model_, deployment=a100_deployment).batch} only at {L4 // 1024}K; batch 4 "
        f"would need a cache about {lim.batch / p['value']:.0f}x larger per token (e.g. a dense-attention model "
        f"without MLA)", p["source"], {"deployment": a100_deployment, "context_len": p["context_len"], "ratio": 1.0})

    p = art["xeon8380_batch_32k"]
    host = host_spec(p["host"])
    need_node = host_memory_needed_bytes(p["value"], p["context_len"], model=model_) * host.gpus
    lim = largest_batch(p["context_len"], offload_ratio, model=model_, deployment=dep, host=host)
    feasible = need_node <= host.memory_capacity_GB * 1e9 and lim.batch >= p["value"]
    row("batch 32 at 32K on dual Xeon 8380", p["value"], lim.batch, p["unit"],
        "reproduced" if feasible else "not reproduced",
        f"batch 32 per GPU needs {need_node / 1e9:.0f} GB of host memory per 8-GPU node (the 8380 pair takes up to "
        f"{host.memory_capacity_GB / 1e3:.1f} TB); with ratio {offload_ratio} the largest batch is {lim.batch} "
        f"(bounded by {lim.limited_by} memory), so 32 is feasible; the claim that only CPU memory limits the batch "
        f"does not hold: the indexer cache and the GPU pool stay on the GPU", p["source"],
        {"deployment": dep.name, "host": host.name, "context_len": p["context_len"], "ratio": offload_ratio})

    p = art["gpu_active_cache"]
    k_bytes = model_.index_topk * request_cache(model_, 32768, 1.0, dep.kv_dtype).latent_bytes / \
        request_cache(model_, 32768, 1.0, dep.kv_dtype).tokens / 1e6
    lim = largest_batch(32768, offload_ratio, model=model_, deployment=dep)
    step_mb = k_bytes * lim.batch
    row("GPU active cache < 512 MB", p["value"], round(step_mb, 1), p["unit"],
        "reproduced" if step_mb < p["value"] else "not reproduced",
        f"one step's top-{model_.index_topk} latent entries over {model_.n_layers} layers are {k_bytes:.1f} MB per "
        f"request; at batch {lim.batch} (32K, ratio {offload_ratio}) that is {step_mb:.0f} MB per GPU, and the LRU "
        f"pool itself holds ratio x the whole latent cache", p["source"],
        {"deployment": dep.name, "context_len": 32768, "ratio": offload_ratio})
    return pd.DataFrame(rows)
