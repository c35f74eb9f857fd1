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
           "overlap_bands", "band_frames", "strategy_overheads", "break_even_misses"]

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
                         policy: str = "lru", locality=None, trace_model: str | None = None) -> MissesFn:
    """A cached ``(context_len, ratio, mtp) -> misses per layer`` from the cache simulation
    (:func:`ess.cachesim.sweep_synthetic`, synthetic traces with the paper's Fig. 2 locality profile). ``locality``
    is an :class:`ess.tracegen.LocalityModel` (default :func:`ess.tracegen.default_locality`, the central model);
    ``trace_model`` alone picks that model with its defaults.

    ``fn.prefetch(points)`` simulates many ``(context_len, ratio, mtp)`` at once: the points sharing a context and
    an MTP come from one set of generated streams (one sweep), which is where the time goes. A later call of ``fn``
    for a prefetched point is a lookup. ``fn.config`` says what produced the counts."""
    from ..cachesim import sweep_synthetic
    from ..tracegen import LocalityModel, default_locality, fitted_drift_rho

    if locality is None:
        locality = default_locality()
        if trace_model is not None and trace_model != locality.trace_model:
            locality = LocalityModel(trace_model, trace_model, locality.reading,
                                     fitted_drift_rho(locality.reading) if trace_model == "drift" else None)
    elif trace_model is not None:
        raise ValueError("give locality or trace_model, not both")
    if not isinstance(locality, LocalityModel):
        raise TypeError(f"locality must be an ess.tracegen.LocalityModel, got {type(locality).__name__}")
    cache: dict = {}
    kw = dict(steps=steps, batch=batch, seed=seed, policies=(policy,), warmups=(warmup,), **locality.kwargs())

    def run(context_len: int, mtp: int, ratios) -> None:
        res = sweep_synthetic(context_len, list(ratios), mtp=mtp, **kw)
        for r in ratios:
            cache[(context_len, r, mtp)] = res[(r, policy, warmup)].mean(axis=1)

    def fn(context_len: int, ratio: float, mtp: int) -> np.ndarray:
        key = (int(context_len), float(ratio), int(mtp))
        if key not in cache:
            run(key[0], key[2], [key[1]])
        return cache[key]

    def prefetch(points) -> None:
        groups: dict = {}
        for L, r, t in points:
            key = (int(L), float(r), int(t))
            if key[1] < 1 and key not in cache:
                groups.setdefault((key[0], key[2]), set()).add(key[1])
        for (L, t), ratios in groups.items():
            try:
                run(L, t, sorted(ratios))
            except ValueError:                  # a ratio whose pools cannot hold a step: each alone says which
                for r in sorted(ratios):
                    try:
                        run(L, t, [r])
                    except ValueError:
                        pass

    fn.prefetch = prefetch
    fn.locality = locality
    fn.config = {"steps": steps, "batch": batch, "seed": seed, "warmup": warmup, "policy": policy,
                 "profile": "paper", **locality.config()}
    return fn


def predict_configs(configs: pd.DataFrame, params: CostParams, misses_fn: MissesFn | None = None,
                    strategy="best", **kw) -> pd.DataFrame:
    """Simulate rows with columns ``batch, context_len, ratio, mtp, accept_ratio`` (and optional
    ``h2d_GB_per_s``, and ``check_memory``: False for a row whose batch was sized by a memory rule of its own, e.g.
    the paper's KV-budget rule where the assumed host memory would cap it). Rows with ratio < 1 need miss counts:
    from ``misses_fn``, or, when it is ``None``, the row is marked ``blocked`` (only the zero-miss bound
    ``throughput_no_miss`` is given). Also returns the zero-miss bound for every row and the miss total."""
    nl = resolve(kw.get("model", "deepseek-v3.2-exp"), kw.get("deployment", "paper-table1"), None, None)[0].n_layers
    if misses_fn is not None and hasattr(misses_fn, "prefetch"):           # one cache simulation per context and MTP
        ok = configs.ratio.notna() & (configs.ratio < 1) & (configs.batch > 0)
        misses_fn.prefetch(zip(configs.context_len[ok], configs.ratio[ok], configs.mtp[ok]))
    rows = []
    for _, c in configs.iterrows():
        ratio, L, mtp = float(c.ratio), int(c.context_len), int(c.mtp)
        base = dict(batch=int(c.batch), context_len=L, ratio=ratio, mtp=mtp, accept_ratio=float(c.accept_ratio))
        args = dict(mtp=mtp, accept_ratio=float(c.accept_ratio), params=params, strategy=strategy, **kw)
        if "check_memory" in c and not bool(c.check_memory):
            args["check_memory"] = False
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
                      profile: np.ndarray | None = None, strategy="best", resolution: int = 60,
                      model="deepseek-v3.2-exp", deployment="paper-table1") -> pd.DataFrame:
    """For each offload configuration (columns ``batch, context_len, ratio, mtp, accept_ratio``), the largest mean
    miss count per request, step and layer (per-layer shape ``profile``, normalised to mean 1; uniform if None) at
    which its throughput still reaches ``baseline_throughput``; also as a share of the entries selected per step.
    The shape is scaled by bisection (at most ``resolution`` halvings) between no misses and every layer missing all
    it selects (a layer's misses are capped at its selected entries, so a peaked shape saturates its worst layers
    first); the mean is taken after the cap. NaN where even zero misses fall short."""
    model_, dep, _, _ = resolve(model, deployment, None, None)
    nl = model_.n_layers
    prof = np.ones(nl) if profile is None else np.asarray(profile, dtype=float) / np.mean(profile)
    out = []
    for _, c in configs.iterrows():
        ksel = int(c.mtp) * min(model_.index_topk, int(c.context_len))

        def misses(scale):
            return np.minimum(scale * prof, ksel)

        def reaches(scale):
            return simulate(int(c.batch), int(c.context_len), float(c.ratio), misses=misses(scale), mtp=int(c.mtp),
                            accept_ratio=float(c.accept_ratio), params=params, strategy=strategy, model=model_,
                            deployment=dep).throughput[0] >= baseline_throughput

        lo, hi = 0.0, ksel / max(prof[prof > 0].min(), 1e-12)      # hi: every layer misses all it selects
        if not reaches(lo):
            be = np.nan
        elif reaches(hi):
            be = float(misses(hi).mean())
        else:                                                      # throughput falls as the misses grow
            for _ in range(resolution):
                if hi - lo <= 1e-6 * hi:
                    break
                mid = 0.5 * (lo + hi)
                lo, hi = (mid, hi) if reaches(mid) else (lo, mid)
            be = float(misses(lo).mean())
        out.append({"batch": int(c.batch), "ratio": float(c.ratio), "mtp": int(c.mtp),
                    "accept_ratio": float(c.accept_ratio), "break_even_misses_per_layer": be,
                    "break_even_miss_share": be / ksel if np.isfinite(be) else np.nan})
    return pd.DataFrame(out)


def band_frames(frames, columns) -> pd.DataFrame:
    """The band over several frames of the same rows (one frame per calibration and locality model, the central
    first): the central frame with ``<column>_low`` / ``<column>_high`` for each of ``columns``, the lowest and the
    highest value over the frames (NaN where no frame has a number), and ``band_size`` (how many frames)."""
    import warnings
    frames = list(frames.values()) if isinstance(frames, dict) else list(frames)
    if not frames:
        raise ValueError("band_frames needs at least one frame (the central one first)")
    out = frames[0].copy()
    for col in columns:
        vals = np.stack([f[col].to_numpy(dtype=float) if col in f else np.full(len(out), np.nan) for f in frames])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)            # all-NaN rows: no band
            out[f"{col}_low"], out[f"{col}_high"] = np.nanmin(vals, axis=0), np.nanmax(vals, axis=0)
    out["band_size"] = len(frames)
    return out


def overlap_bands(calibrations, profiles, miss_counts, **kw) -> pd.DataFrame:
    """:func:`overlap_vs_misses` for every calibration (``{name: CostParams}``) crossed with every per-layer miss
    profile (``{locality name: profile}``; the first of each is the central one), banded by :func:`band_frames`
    (``overhead_pct`` and ``overhead_ms``)."""
    frames = [overlap_vs_misses(p, miss_counts, profile=prof, **kw) for prof in profiles.values()
              for p in calibrations.values()]
    return band_frames(frames, ("overhead_pct", "overhead_ms"))


def strategy_overheads(params: CostParams, misses, *, context_len: int, batch: int, mtp: int, ratio: float,
                       h2d_GB_per_s: float | None = None, d2h_GB_per_s: float | None = None,
                       model="deepseek-v3.2-exp", deployment="paper-table1") -> pd.DataFrame:
    """The offload overhead of each strategy (none, DA, DBA, the per-layer best) at given per-layer ``misses``, one
    row per strategy: % of the no-offload step, the stall in ms, and how many layers the per-layer choice gives to
    each strategy. Memory is not checked (a stress configuration, like the paper's overlap chart)."""
    from .timeline import STRATEGIES
    m = np.asarray(misses, dtype=float)
    rows = []
    for st in STRATEGIES + ("best",):
        r = simulate(batch, context_len, ratio, misses=m, mtp=mtp, h2d_GB_per_s=h2d_GB_per_s,
                     d2h_GB_per_s=d2h_GB_per_s, strategy=st, params=params, check_memory=False, model=model,
                     deployment=deployment)
        ch = r.layer_strategy[0]
        rows.append({"ratio": ratio, "strategy": st, "mean_misses_per_layer": float(m.mean()),
                     "overhead_pct": (r.step_s[0] / r.step_no_offload_s[0] - 1) * 100, "stall_ms": r.stall_s[0] * 1e3,
                     "layers_none": int((ch == 0).sum()), "layers_da": int((ch == 1).sum()),
                     "layers_dba": int((ch == 2).sum())})
    return pd.DataFrame(rows)
