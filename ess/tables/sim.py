"""Tables of the simulator (notebooks 05-08): paper Table 2 predicted, the article's 32K table rebuilt row by row,
the 128K claim, the article's deployment benefits (section 3.3) and its section 1.2 claims.

Published values come from ``data/published/`` with their source; held-back values are never filled in (``published``
is ``None`` and ``status`` says "held back: predicted"). Every row carries its configuration.
"""
from __future__ import annotations

import functools
from typing import Callable

import numpy as np
import pandas as pd

from ..layout import indexer_entry_bytes, latent_entry_bytes
from ..memory import largest_batch, resolve
from ..published import published
from ..specs import _read_yaml
from ..sim.costs import CostParams, layer_costs
from ..sim.timeline import ratio_for_batch, simulate

__all__ = ["break_even_misses", "step_breakdown", "misses_from_cachesim", "predict_configs", "table2_predictions", "article_table_32k", "claim_128k",
           "deployment_benefits", "section12_claims", "overlap_vs_misses", "deployment_assumptions"]

MissesFn = Callable[[int, float, int], np.ndarray]


def step_breakdown(params: CostParams, batches, context_len: int = 32768, *, mtp: int = 2, accept_ratio: float = 1.7,
                   model="deepseek-v3.2-exp", deployment="paper-table1") -> pd.DataFrame:
    """Where a no-offload step goes, in ms per step: compute-lane components summed over layers and both
    micro-batches, MTP drafts and heads, the fixed time, and the all-to-all time not hidden by Two-Batch Overlap."""
    model_, dep, gpu, _ = resolve(model, deployment, None, None)
    B = np.asarray(batches, dtype=float)
    c = layer_costs(model_, gpu, dep, B / 2, context_len, mtp).scaled(params.compute_scale, params.comm_scale)
    nl, nd = model_.n_layers, model_.n_dense_layers
    r = simulate(B, context_len, 1.0, mtp_tokens=mtp, accept_ratio=accept_ratio, params=params, model=model_,
                 deployment=dep, check_memory=False)
    ms = 2e3
    df = pd.DataFrame({"indexer": c.indexer * nl * ms, "pre_attn": c.pre_attn * nl * ms, "attn": c.attn * nl * ms,
                       "o_proj": c.o_proj * nl * ms,
                       "ffn_moe": (c.ffn_dense * nd + c.moe * (nl - nd)) * ms}, index=B.astype(int))
    comp = df.sum(axis=1).to_numpy()
    comm_total = 2 * (c.dispatch + c.combine) * (nl - nd) * 1e3
    step = r.step_s * 1e3
    df["fixed"] = params.fixed_ms
    layers = step - params.fixed_ms
    # what remains after the compute lane and the fixed time: heads, drafts and all-to-all not hidden by TBO
    df["heads_drafts_and_exposed_comm"] = layers - comp
    df["comm_lane_total"] = comm_total
    df["step"] = step
    df.index.name = "batch"
    return df


def misses_from_cachesim(*, steps: int = 64, batch: int = 4, seed: int = 0, warmup: bool = True,
                         policy: str = "lru") -> MissesFn:
    """A cached ``(context_len, ratio, mtp) -> misses per layer`` from :func:`ess.cachesim.misses_per_layer`
    (synthetic traces with the paper's Fig. 2 locality profile)."""
    from ..cachesim import misses_per_layer

    @functools.lru_cache(maxsize=None)
    def fn(context_len: int, ratio: float, mtp: int) -> np.ndarray:
        return misses_per_layer(int(context_len), float(ratio), mtp=int(mtp), steps=steps, batch=batch, seed=seed,
                                warmup=warmup, policy=policy)
    fn.config = {"steps": steps, "batch": batch, "seed": seed, "warmup": warmup, "policy": policy,
                 "profile": "paper"}
    return fn


def predict_configs(configs: pd.DataFrame, params: CostParams, misses_fn: MissesFn | None = None,
                    strategy="best", **kw) -> pd.DataFrame:
    """Simulate rows with columns ``batch, context_len, ratio, mtp, accept_ratio`` (and optional
    ``h2d_GB_per_s``). Rows with ratio < 1 need miss counts: from ``misses_fn``, or, when it is ``None``, the row is
    marked ``blocked`` (only the zero-miss bound ``throughput_no_miss`` is given). Also returns the zero-miss bound
    for every row and the miss total."""
    nl = resolve("deepseek-v3.2-exp", kw.get("deployment", "paper-table1"), None, None)[0].n_layers
    rows = []
    for _, c in configs.iterrows():
        ratio, L, T = float(c.ratio), int(c.context_len), int(c.mtp)
        base = dict(batch=int(c.batch), context_len=L, ratio=ratio, mtp=T, accept_ratio=float(c.accept_ratio))
        args = dict(mtp_tokens=T, accept_ratio=float(c.accept_ratio), params=params, strategy=strategy, **kw)
        if "h2d_GB_per_s" in c and not pd.isna(c.h2d_GB_per_s):
            args["h2d_GB_per_s"] = float(c.h2d_GB_per_s)
        if np.isnan(ratio) or int(c.batch) <= 0:
            rows.append({**base, "feasible": False, "status": "infeasible",
                         "reason": "no sparse-memory ratio fits this batch in GPU memory"})
            continue
        ideal = simulate(int(c.batch), L, ratio, misses=np.zeros(nl), **args)
        row = {**base, "throughput_no_miss": float(ideal.throughput[0]),
               "step_ms_no_offload": float(ideal.step_no_offload_s[0] * 1e3)}
        if not ideal.feasible[0]:
            rows.append({**row, "feasible": False, "status": "infeasible", "reason": ideal.reason[0]})
            continue
        if ratio < 1 and misses_fn is None:
            rows.append({**row, "feasible": True, "status": "blocked",
                         "reason": "no miss counts given (ess.cachesim unavailable)"})
            continue
        if ratio < 1:
            try:
                m = np.asarray(misses_fn(L, ratio, T), dtype=float)
            except ValueError as exc:            # the pool cannot hold one step's union of top-K sets
                rows.append({**row, "feasible": False, "status": "infeasible", "reason": f"cache simulation: {exc}"})
                continue
        else:
            m = np.zeros(nl)
        r = simulate(int(c.batch), L, ratio, misses=m, **args)
        rows.append({**row, "throughput": float(r.throughput[0]), "otps": float(r.otps[0]),
                     "step_ms": float(r.step_s[0] * 1e3), "stall_ms": float(r.stall_s[0] * 1e3),
                     "misses_per_step": float(m.sum()), "feasible": True, "status": "predicted", "reason": ""})
    return pd.DataFrame(rows)


def table2_predictions(params: CostParams, misses_fn: MissesFn | None = None, *, strategy="best",
                       contexts=("32k", "128k"), **kw) -> pd.DataFrame:
    """Paper Table 2, predicted: every held-back configuration of ``data/published/paper_table2.yaml`` plus the
    calibration row. At 32K each batch gets the ratio it needs (:func:`ess.sim.timeline.ratio_for_batch`); at 128K
    each ratio gets its memory-limited batch. ``gain_pct`` is against the calibration-row configuration predicted by
    the same simulator (32K) or the 128K ratio-1 row (128K)."""
    pub = published("paper_table2")
    cfg = []
    for key, e in pub.items():
        if e["role"] == "target":
            continue
        ctx = f"{e['context_len'] // 1024}k"
        if ctx not in contexts or key == "overlap_overhead_128k":
            continue
        if "batches" in e:
            B = np.array(e["batches"])
            r = ratio_for_batch(B, e["context_len"], **{k: v for k, v in kw.items() if k in ("deployment",)})
            for b, ri in zip(B, r):
                cfg.append({"row": f"{key}_b{b}", "key": key, "batch": int(b), "ratio": float(ri)})
        elif "ratios" in e:
            for ri in e["ratios"]:
                lim = largest_batch(e["context_len"], ri)
                cfg.append({"row": f"{key}_r{ri:g}", "key": key, "batch": lim.batch, "ratio": float(ri)})
        else:
            cfg.append({"row": key, "key": key, "batch": int(e["batch"]), "ratio": float(e["ratio"])})
        for c in cfg:
            if c["key"] == key:
                c.update(context_len=e["context_len"], mtp=e["mtp_tokens"], accept_ratio=e["accept_ratio"],
                         role=e["role"], published=e["value"] if e["role"] == "calibration" else None,
                         source=e["source"])
    cfg = pd.DataFrame(cfg)
    pred = predict_configs(cfg, params, misses_fn, strategy=strategy, **kw)
    out = pd.concat([cfg[["row", "role", "published", "source"]].reset_index(drop=True), pred], axis=1)
    base32 = out.loc[out.row == "t2_32k_mtp2_b52_r1", "throughput"]
    base128 = out.loc[(out.context_len == 131072) & (out.ratio == 1.0), "throughput"]
    ref = np.where(out.context_len == 131072, base128.iloc[0] if len(base128) else np.nan,
                   base32.iloc[0] if len(base32) else np.nan)
    out["gain_pct"] = (out.get("throughput") / ref - 1) * 100
    out["gain_no_miss_pct"] = (out.throughput_no_miss / ref - 1) * 100
    out["status"] = np.where(out.role == "calibration", "calibration (fitted)", out.status)
    return out


def article_table_32k(t2: pd.DataFrame, *, mtp4_accept: float = 2.8) -> pd.DataFrame:
    """The article's 32K table rebuilt: each row, the paper configuration it maps to, the article's numbers, the
    paper's given numbers (Table 2 row 1, [BLOG] percentages) and ours, with the difference explained."""
    pub = published("paper_table2")
    art = {k: pub[k] for k in ("article_baseline", "article_mtp4", "article_ess", "article_offload_contribution")}
    base = t2[t2.row == "t2_32k_mtp2_b52_r1"].iloc[0]
    mtp4 = t2[(t2.context_len == 32768) & (t2.mtp == 4) & (t2.accept_ratio == mtp4_accept)]
    mtp4_52 = mtp4[mtp4.batch == 52].iloc[0]
    off = mtp4[mtp4.ratio < 1]
    ess = off[off.status == "predicted"]
    ess_best = ess.loc[ess.throughput.idxmax()] if len(ess) else None
    ess_bound = off.loc[off.throughput_no_miss.idxmax()]
    blog_mtp, blog_all = pub["blog_mtp_alone"]["value"], pub["blog_mtp_plus_ess"]["value"]
    ours_mtp = (mtp4_52.throughput / base.throughput - 1) * 100
    ours_ess = (ess_best.throughput / base.throughput - 1) * 100 if ess_best is not None else np.nan
    ours_ess_bound = (ess_bound.throughput_no_miss / base.throughput - 1) * 100
    rows = [
        {"row": "Baseline", "maps_to": "Table 2 row 1: MTP 2, accept 1.7, batch 52, ratio 1 (no offload)",
         "article_batch": art["article_baseline"]["batch"], "article_tok_s": art["article_baseline"]["value"],
         "article_pct": None, "paper_tok_s": base.published, "paper_pct": None, "ours_tok_s": base.throughput,
         "ours_pct": None, "ours_pct_no_miss": None,
         "explanation": "calibration row (fitted); the article's batch 4 and 1,250 tok/s are not the paper's "
                        "batch 52 and 9,647.71 tok/s per node"},
        {"row": "MTP=4", "maps_to": f"MTP 4, accept {mtp4_accept}, batch 52, ratio 1",
         "article_batch": art["article_mtp4"]["batch"], "article_tok_s": art["article_mtp4"]["value"],
         "article_pct": art["article_mtp4"]["improvement_pct"], "paper_tok_s": None, "paper_pct": blog_mtp,
         "ours_tok_s": mtp4_52.throughput, "ours_pct": ours_mtp, "ours_pct_no_miss": ours_mtp,
         "explanation": f"prediction: accepted tokens rise {mtp4_accept / 1.7:.2f}x while the step grows "
                        f"{mtp4_52.step_ms / base.step_ms:.2f}x (4 query tokens, 3 draft passes); the paper's "
                        f"accept ratio for this row is held back"},
        {"row": "ESS Architecture",
         "maps_to": (f"MTP 4, accept {mtp4_accept}, offload, batch {int(ess_best.batch)}, ratio {ess_best.ratio:.3f}"
                     if ess_best is not None else "MTP 4 with offload (blocked: no miss counts)"),
         "article_batch": art["article_ess"]["batch"], "article_tok_s": art["article_ess"]["value"],
         "article_pct": art["article_ess"]["improvement_pct"], "paper_tok_s": None, "paper_pct": blog_all,
         "ours_tok_s": ess_best.throughput if ess_best is not None else np.nan, "ours_pct": ours_ess,
         "ours_pct_no_miss": ours_ess_bound,
         "explanation": "best batch of the 52-160 grid with the cache-simulated misses and the per-layer overlap "
                        f"choice; without misses (D2H only) the best is +{ours_ess_bound:.1f} % at batch "
                        f"{int(ess_bound.batch)}"},
        {"row": "Offload contribution", "maps_to": "ESS row minus MTP=4 row, percentage points",
         "article_batch": None, "article_tok_s": art["article_offload_contribution"]["value"],
         "article_pct": art["article_offload_contribution"]["improvement_pct"], "paper_tok_s": None,
         "paper_pct": round(blog_all - blog_mtp, 1), "ours_tok_s": None, "ours_pct": ours_ess - ours_mtp,
         "ours_pct_no_miss": ours_ess_bound - ours_mtp,
         "explanation": f"the article's 1,541 tok/s is its ESS minus baseline "
                        f"({art['article_ess']['value'] - art['article_baseline']['value']:,} by its own numbers); "
                        "70.2 % is 123.4 - 53.1 (or 53.2) percentage points"},
    ]
    return pd.DataFrame(rows)


def claim_128k(t2: pd.DataFrame) -> dict:
    """The 128K claim (+123 % with MTP 2): our best 128K offload row against the 128K no-offload row."""
    pub = published("paper_table2")["claim_128k_gain"]
    sub = t2[t2.context_len == 131072]
    base = sub[sub.ratio == 1.0].iloc[0]
    off = sub[(sub.ratio < 1) & (sub.status == "predicted")]
    best = off.loc[off.throughput.idxmax()] if len(off) else None
    bound = sub[sub.ratio < 1].throughput_no_miss.max()
    return {"published_pct": pub["value"], "source": pub["source"],
            "ours_pct": (best.throughput / base.throughput - 1) * 100 if best is not None else None,
            "ours_pct_no_miss": (bound / base.throughput - 1) * 100,
            "batch": int(best.batch) if best is not None else None,
            "ratio": float(best.ratio) if best is not None else None, "baseline_batch": int(base.batch)}


@functools.lru_cache(maxsize=None)
def deployment_assumptions() -> dict:
    """``data/calibration/deployment_assumptions.yaml`` as ``{name: (value, source)}``."""
    raw = _read_yaml("calibration/deployment_assumptions.yaml")
    return {k: (v["value"], v["source"]) for k, v in raw.items()}


def deployment_benefits(params: CostParams, misses_fn: MissesFn | None, *, ratio: float | None = None, mtp: int = 2,
                        accept_ratio: float = 1.7, context_len: int | None = None) -> pd.DataFrame:
    """Article section 3.3 (a customer-service deployment; no configuration given), rebuilt under stated
    assumptions: the context is the one at which a node holds the article's 1,200 sessions without offload (or
    ``context_len``), offload uses ``ratio`` (default: the smallest ratio, in steps of 0.01, whose pool holds one
    step's ``mtp x K`` entries) at its memory-limited batch, node power is constant."""
    asm = deployment_assumptions()
    pub = published("paper_table2")
    sessions0 = pub["article_sessions_per_node"]["before"]
    chosen = context_len is None
    if context_len is None:                       # the context at which 8 x no-offload batch ~= 1,200 sessions
        Ls = np.arange(1024, 131073, 512)
        b = np.array([largest_batch(int(L), 1.0).batch for L in Ls])
        context_len = int(Ls[np.argmin(np.abs(b * 8 - sessions0))])
    if ratio is None:
        ratio = min(1.0, float(np.ceil(mtp * 2048 / context_len * 100) / 100))
    b0 = largest_batch(context_len, 1.0).batch
    b1 = largest_batch(context_len, ratio).batch
    cfg = pd.DataFrame({"batch": [b0, b1], "context_len": context_len, "ratio": [1.0, ratio], "mtp": mtp,
                        "accept_ratio": accept_ratio})
    pred = predict_configs(cfg, params, misses_fn)
    t0 = pred.throughput.iloc[0]
    t1 = pred.throughput.iloc[1] if "throughput" in pred and not pd.isna(pred.throughput.iloc[1]) else np.nan
    t1_bound = pred.throughput_no_miss.iloc[1]
    gain = t1 / t0
    gpus_task = 8 / gain if np.isfinite(gain) else np.nan
    tdp, tdp_src = asm["gpu_power_W"]
    host_w, host_src = asm["host_power_W"]
    node_w = 8 * tdp + host_w
    e0 = node_w / t0
    e1 = node_w / t1 if np.isfinite(t1) else np.nan
    cfg_s = {"context_len": context_len, "ratio": ratio, "mtp": mtp, "accept_ratio": accept_ratio,
             "batch_no_offload": b0, "batch_offload": b1}
    art_e = pub["article_energy_per_token"]["value"]
    rows = [
        {"claim": "GPUs per task", "article": "8 -> 3", "article_ratio": pub["article_gpus_per_task"]["value"] /
         pub["article_gpus_per_task"]["before"], "ours_before": 8, "ours_after": gpus_task, "unit": "GPUs",
         "assumption": "a task is a fixed decode throughput (one node without offload); GPUs needed scale with "
                       "1 / per-GPU throughput gain; ignores that EP 32 needs 32 GPUs to hold the weights "
                       "(3 H200 cannot hold DeepSeek-V3.2-Exp)", "config": cfg_s},
        {"claim": "energy per token", "article": f"{art_e} %", "article_ratio": 1 + art_e / 100,
         "ours_before": e0, "ours_after": e1, "unit": "J/token",
         "assumption": f"node power constant: 8 GPUs x {tdp} W ({tdp_src}) + host {host_w} W ({host_src}); "
                       "offload adds no power; energy per token = node power / node throughput", "config": cfg_s},
        {"claim": "sessions per node", "article": "1,200 -> 3,500",
         "article_ratio": pub["article_sessions_per_node"]["value"] / sessions0, "ours_before": 8 * b0,
         "ours_after": 8 * b1, "unit": "sessions",
         "assumption": f"a session is one decoding request of {context_len} tokens"
                       + ("; the context is chosen so the no-offload node holds about 1,200" if chosen else "")
                       + f"; offload at ratio {ratio}, memory-limited batch",
         "config": cfg_s},
        {"claim": "node throughput behind the above", "article": "", "article_ratio": np.nan, "ours_before": t0,
         "ours_after": t1, "unit": "tokens/s per node",
         "assumption": f"cache-simulated misses; zero-miss bound {t1_bound:,.0f} tokens/s", "config": cfg_s},
    ]
    df = pd.DataFrame(rows)
    df["ours_ratio"] = df.ours_after / df.ours_before
    gain_bound = t1_bound / t0                    # the same rows with zero misses (write-back only)
    df["ours_ratio_no_miss"] = [1 / gain_bound, 1 / gain_bound, 8 * b1 / (8 * b0), gain_bound]
    return df


def section12_claims(params: CostParams, *, model="deepseek-v3.2-exp", deployment="paper-table1") -> pd.DataFrame:
    """Article section 1.2: "8-bit quantisation cuts cache size by 50 %" and "multi-GPU expansion via NVLink adds
    30 %+ communication overhead", derived where the model allows."""
    model_, dep, gpu, _ = resolve(model, deployment, None, None)
    fp8, bf16 = latent_entry_bytes(model_, "fp8"), latent_entry_bytes(model_, "bf16")
    idx = indexer_entry_bytes(model_)
    cut_latent = 1 - fp8 / bf16
    cut_total = 1 - (fp8 + idx) / (bf16 + idx)
    # NVLink expansion: attention tensor-parallel over the node's 8 GPUs instead of data-parallel: each layer adds an
    # all-reduce of the hidden state (bf16) over NVLink (ring: 2 (n-1)/n x bytes per GPU at half the bidirectional
    # NVLink figure per direction); priced at the calibrated Table 2 row 1 configuration (batch 52 per GPU).
    n, B, T = dep.gpus_per_node, 52, dep.mtp_tokens_per_step
    bytes_ar = 8 * B * T * model_.hidden_size * 2.0           # the node's tokens, since every GPU sees all of them
    t_ar = 2 * (n - 1) / n * bytes_ar / (gpu.nvlink_GB_per_s / 2 * 1e9)
    r = simulate(B, 32768, 1.0, params=params)
    extra = t_ar * model_.n_layers * 2                         # two micro-batches of TBO each all-reduce
    pct = extra / r.step_s[0] * 100
    return pd.DataFrame([
        {"claim": "8-bit quantisation halves the cache", "published": "50 %", "ours": round(cut_latent * 100, 1),
         "unit": "% smaller latent entry", "status": "not reproduced",
         "reason": f"latent entry {fp8} B (FP8 c_KV + fp32 scales + bf16 rope) vs {bf16} B (BF16): "
                   f"-{cut_latent:.1%}; with the (already FP8) indexer key -{cut_total:.1%}; the rope part stays "
                   f"16-bit and the scales cost 16 B"},
        {"claim": "NVLink expansion adds 30 %+ overhead", "published": "30 %+", "ours": round(float(pct), 1),
         "unit": "% of the step", "status": "reproduced" if pct >= 30 else "not reproduced",
         "reason": f"attention TP {n} over NVLink ({gpu.nvlink_GB_per_s:g} GB/s bidirectional) adds a ring "
                   f"all-reduce of {bytes_ar / 1e6:.1f} MB per layer and micro-batch ({t_ar * 1e6:.0f} us) to a "
                   f"{r.step_s[0] * 1e3:.1f} ms step (batch 52 per GPU, 32K, calibrated); compute savings of TP "
                   "are not credited"},
    ])


def overlap_vs_misses(params: CostParams, miss_counts, *, context_len: int = 131072, batch: int = 160,
                      mtp: int = 2, h2d_GB_per_s: float = 37.0, profile: np.ndarray | None = None,
                      n_layers: int = 61) -> pd.DataFrame:
    """Offload overhead of each strategy against the mean miss count per request, step and layer.

    The per-layer shape is ``profile`` (normalised to mean 1, e.g. a cache-simulated miss profile) or uniform;
    memory is not checked (the configuration is the paper's overlap stress point). Overhead is the step-time
    increase over no offload, in % and ms."""
    prof = np.ones(n_layers) if profile is None else np.asarray(profile, dtype=float) / np.mean(profile)
    counts = np.asarray(miss_counts, dtype=float)
    ksel = mtp * min(2048, context_len)
    m = np.minimum(counts[:, None] * prof[None, :], ksel)
    rows = []
    for s in ("none", "da", "dba", "best"):
        r = simulate(np.full(len(counts), batch), context_len, 0.1, misses=m, mtp_tokens=mtp, h2d_GB_per_s=h2d_GB_per_s,
                     strategy=s, params=params, check_memory=False)
        for c, st, s0, ch in zip(counts, r.step_s, r.step_no_offload_s, r.layer_strategy):
            rows.append({"strategy": s, "misses_per_layer": c, "step_ms": st * 1e3, "overhead_ms": (st - s0) * 1e3,
                         "overhead_pct": (st / s0 - 1) * 100, "layers_da": int((ch == 1).sum()),
                         "layers_dba": int((ch == 2).sum())})
    return pd.DataFrame(rows)


def break_even_misses(params: CostParams, configs: pd.DataFrame, baseline_throughput: float, *,
                      profile: np.ndarray | None = None, strategy="best", n_layers: int = 61,
                      resolution: int = 400) -> pd.DataFrame:
    """For each offload configuration (columns ``batch, context_len, ratio, mtp, accept_ratio``), the largest mean
    miss count per request, step and layer (per-layer shape ``profile``, normalised to mean 1; uniform if None) at
    which its throughput still reaches ``baseline_throughput``; also as a share of the entries selected per step.
    NaN where even zero misses fall short."""
    prof = np.ones(n_layers) if profile is None else np.asarray(profile, dtype=float) / np.mean(profile)
    out = []
    for _, c in configs.iterrows():
        ksel = int(c.mtp) * min(2048, int(c.context_len))
        scale = np.linspace(0, ksel / prof.max(), resolution)
        m = np.minimum(scale[:, None] * prof[None, :], ksel)
        r = simulate(np.full(resolution, int(c.batch)), int(c.context_len), float(c.ratio), misses=m,
                     mtp_tokens=int(c.mtp), accept_ratio=float(c.accept_ratio), params=params, strategy=strategy)
        ok = r.throughput >= baseline_throughput
        be = float(scale[ok].max()) if ok.any() else np.nan
        out.append({"batch": int(c.batch), "ratio": float(c.ratio), "mtp": int(c.mtp),
                    "accept_ratio": float(c.accept_ratio), "break_even_misses_per_layer": be,
                    "break_even_miss_share": be / ksel if np.isfinite(be) else np.nan})
    return pd.DataFrame(out)
