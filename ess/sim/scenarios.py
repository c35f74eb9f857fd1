"""Configurations through the simulator: tables of (batch, context, ratio, MTP, accept ratio) predicted with cache-
simulated miss counts, where a step's time goes, the offload overhead of each overlap strategy against the miss
count, and the miss counts at which offload breaks even. The tables of :mod:`ess.tables.sim` set these predictions
beside the published values.
"""
from __future__ import annotations

import functools
from typing import Callable

import numpy as np
import pandas as pd

from ..published import published
from ..specs import resolve
from .costs import CostParams, layer_costs
from .timeline import simulate

__all__ = ["MissesFn", "misses_from_cachesim", "predict_configs", "step_breakdown", "overlap_vs_misses",
           "break_even_misses"]

MissesFn = Callable[[int, float, int], np.ndarray]


def step_breakdown(params: CostParams, batches, context_len: int | None = None, *, mtp: int | None = None,
                   accept_ratio: float | None = None, model="deepseek-v3.2-exp",
                   deployment="paper-table1") -> pd.DataFrame:
    """Where a no-offload step goes, in ms per step: compute-lane components summed over layers and both
    micro-batches, MTP drafts and heads, the fixed time, and the all-to-all time not hidden by Two-Batch Overlap.
    ``context_len`` defaults to the calibration row's (paper Table 2 row 1), ``mtp`` and ``accept_ratio`` to the
    deployment's."""
    model_, dep, gpu, _ = resolve(model, deployment, None, None)
    if context_len is None:
        context_len = int(published("paper_table2")["t2_32k_mtp2_b52_r1"]["context_len"])
    mtp = dep.mtp if mtp is None else mtp
    accept_ratio = dep.mtp_accept_ratio if accept_ratio is None else accept_ratio
    B = np.asarray(batches, dtype=float)
    c = layer_costs(model_, gpu, dep, B / 2, context_len, mtp).scaled(params.compute_scale, params.comm_scale)
    nl, nd = model_.n_layers, model_.n_dense_layers
    r = simulate(B, context_len, 1.0, mtp=mtp, accept_ratio=accept_ratio, params=params, model=model_,
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
                         policy: str = "lru", trace_model: str | None = None) -> MissesFn:
    """A cached ``(context_len, ratio, mtp) -> misses per layer`` from :func:`ess.cachesim.misses_per_layer`
    (synthetic traces with the paper's Fig. 2 locality profile; ``trace_model`` ``"drift"`` or ``"uniform"``,
    ``None`` for the default chosen by the rule in data/locality/README.md)."""
    from ..cachesim import misses_per_layer
    from ..tracegen import default_trace_model

    trace_model = trace_model or default_trace_model()

    @functools.lru_cache(maxsize=None)
    def fn(context_len: int, ratio: float, mtp: int) -> np.ndarray:
        return misses_per_layer(int(context_len), float(ratio), mtp=int(mtp), steps=steps, batch=batch, seed=seed,
                                warmup=warmup, policy=policy, trace_model=trace_model)
    fn.config = {"steps": steps, "batch": batch, "seed": seed, "warmup": warmup, "policy": policy,
                 "profile": "paper", "trace_model": trace_model}
    return fn


def predict_configs(configs: pd.DataFrame, params: CostParams, misses_fn: MissesFn | None = None,
                    strategy="best", **kw) -> pd.DataFrame:
    """Simulate rows with columns ``batch, context_len, ratio, mtp, accept_ratio`` (and optional
    ``h2d_GB_per_s``). Rows with ratio < 1 need miss counts: from ``misses_fn``, or, when it is ``None``, the row is
    marked ``blocked`` (only the zero-miss bound ``throughput_no_miss`` is given). Also returns the zero-miss bound
    for every row and the miss total."""
    nl = resolve(kw.get("model", "deepseek-v3.2-exp"), kw.get("deployment", "paper-table1"), None, None)[0].n_layers
    rows = []
    for _, c in configs.iterrows():
        ratio, L, mtp = float(c.ratio), int(c.context_len), int(c.mtp)
        base = dict(batch=int(c.batch), context_len=L, ratio=ratio, mtp=mtp, accept_ratio=float(c.accept_ratio))
        args = dict(mtp=mtp, accept_ratio=float(c.accept_ratio), params=params, strategy=strategy, **kw)
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
                m = np.asarray(misses_fn(L, ratio, mtp), dtype=float)
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


def overlap_vs_misses(params: CostParams, miss_counts, *, context_len: int | None = None, batch: int | None = None,
                      mtp: int | None = None, h2d_GB_per_s: float | None = None, ratio: float = 0.1,
                      profile: np.ndarray | None = None, model="deepseek-v3.2-exp",
                      deployment="paper-table1") -> pd.DataFrame:
    """Offload overhead of each strategy against the mean miss count per request, step and layer.

    ``context_len``, ``batch`` and ``mtp`` default to the paper's overlap-chart configuration
    (``paper_table2.yaml: overlap_overhead_128k``), ``h2d_GB_per_s`` to the FlashTrans link (``links.yaml``).
    The per-layer shape is ``profile`` (normalised to mean 1, e.g. a cache-simulated miss profile) or uniform;
    memory is not checked (the configuration is the paper's overlap stress point), so ``ratio`` (< 1) only switches
    offload on. Overhead is the step-time increase over no offload, in % and ms."""
    model_, dep, _, _ = resolve(model, deployment, None, None)
    chart = published("paper_table2")["overlap_overhead_128k"]
    context_len = int(chart["context_len"] if context_len is None else context_len)
    batch = int(chart["batch"] if batch is None else batch)
    mtp = int(chart["mtp"] if mtp is None else mtp)
    if not 0 < ratio < 1:
        raise ValueError(f"ratio must be in (0, 1) (offload on), got {ratio!r}")
    nl = model_.n_layers
    prof = np.ones(nl) if profile is None else np.asarray(profile, dtype=float) / np.mean(profile)
    if prof.shape != (nl,):
        raise ValueError(f"profile must have shape ({nl},), got {prof.shape}")
    counts = np.asarray(miss_counts, dtype=float)
    ksel = mtp * min(model_.index_topk, context_len)
    m = np.minimum(counts[:, None] * prof[None, :], ksel)
    rows = []
    for s in ("none", "da", "dba", "best"):
        r = simulate(np.full(len(counts), batch), context_len, ratio, misses=m, mtp=mtp,
                     h2d_GB_per_s=h2d_GB_per_s, strategy=s, params=params, check_memory=False, model=model_,
                     deployment=dep)
        for c, st, s0, ch in zip(counts, r.step_s, r.step_no_offload_s, r.layer_strategy):
            rows.append({"strategy": s, "misses_per_layer": c, "step_ms": st * 1e3, "overhead_ms": (st - s0) * 1e3,
                         "overhead_pct": (st / s0 - 1) * 100, "layers_da": int((ch == 1).sum()),
                         "layers_dba": int((ch == 2).sum()), "context_len": context_len, "batch": batch, "mtp": mtp,
                         "h2d_GB_per_s": float(r.h2d_GB_per_s[0])})
    return pd.DataFrame(rows)


def break_even_misses(params: CostParams, configs: pd.DataFrame, baseline_throughput: float, *,
                      profile: np.ndarray | None = None, strategy="best", resolution: int = 400,
                      model="deepseek-v3.2-exp", deployment="paper-table1") -> pd.DataFrame:
    """For each offload configuration (columns ``batch, context_len, ratio, mtp, accept_ratio``), the largest mean
    miss count per request, step and layer (per-layer shape ``profile``, normalised to mean 1; uniform if None) at
    which its throughput still reaches ``baseline_throughput``; also as a share of the entries selected per step.
    NaN where even zero misses fall short."""
    model_, dep, _, _ = resolve(model, deployment, None, None)
    nl = model_.n_layers
    prof = np.ones(nl) if profile is None else np.asarray(profile, dtype=float) / np.mean(profile)
    out = []
    for _, c in configs.iterrows():
        ksel = int(c.mtp) * min(model_.index_topk, int(c.context_len))
        scale = np.linspace(0, ksel / prof.max(), resolution)
        m = np.minimum(scale[:, None] * prof[None, :], ksel)
        r = simulate(np.full(resolution, int(c.batch)), int(c.context_len), float(c.ratio), misses=m,
                     mtp=int(c.mtp), accept_ratio=float(c.accept_ratio), params=params, strategy=strategy,
                     model=model_, deployment=dep)
        ok = r.throughput >= baseline_throughput
        be = float(scale[ok].max()) if ok.any() else np.nan
        out.append({"batch": int(c.batch), "ratio": float(c.ratio), "mtp": int(c.mtp),
                    "accept_ratio": float(c.accept_ratio), "break_even_misses_per_layer": be,
                    "break_even_miss_share": be / ksel if np.isfinite(be) else np.nan})
    return pd.DataFrame(out)
