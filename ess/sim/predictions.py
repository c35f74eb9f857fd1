"""Banded predictions over configurations: tables of (batch, context, ratio, MTP, accept ratio) predicted with cache-
simulated miss counts (:class:`ess.sim.misses.MissesTable`), where a step's time goes, the offload overhead of each
overlap strategy against the miss count, the miss counts at which offload breaks even, and the inputs of every
banded prediction (the equally good calibrations and the locality models, :func:`band_inputs`). Every function takes
the simulator's :class:`ess.sim.Scenario` whole. The tables of :mod:`ess.tables.sim` set these predictions beside
the published values.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from .. import validate
from ..published import published
from .config import STRATEGIES, Scenario, as_scenario
from .costs import CostParams, layer_costs
from .misses import NOTEBOOK_SIZES, BandSizes, MissesTable, _sizes
from .timeline import simulate

__all__ = ["BandInputs", "band_inputs", "predict_configs", "step_breakdown", "overlap_vs_misses", "overlap_bands",
           "band_frames", "strategy_overheads", "break_even_misses", "calibrated_range", "extrapolated_parts",
           "extrapolation_params", "mtp_growth", "mtp_step_ratio", "mtp_growth_frame", "mtp_growth_check",
           "value_band"]

# where an offload configuration's misses come from: a MissesTable, or any (context_len, ratio, mtp) -> (n_layers,)
Misses = MissesTable | Callable[[int, float, int], np.ndarray]


def _counts(name: str, value, *, whole: bool) -> np.ndarray:
    """A non-empty 1-D array of counts (batches: whole and >= 1; miss counts: >= 0)."""
    arr = np.atleast_1d(validate.number_array(name, value, positive=whole, whole=whole,
                                              at_least=1.0 if whole else 0.0, at_most=validate.MAX_EXACT_COUNT))
    if arr.size == 0:
        raise ValueError(f"{name} must hold at least one value, got an empty array")
    return arr


def _optional_int(name: str, value, default, at_most: int = validate.MAX_EXACT_COUNT) -> int:
    """A positive integer up to ``at_most`` (``default`` when ``value`` is None)."""
    if value is None and default is not None:
        return int(default)
    return validate.integer(name, value, lo=1, below=int(at_most) + 1)


def step_breakdown(batches, context_len: int | None = None, *, scenario: Scenario | None = None) -> pd.DataFrame:
    """Where a no-offload step of ``scenario`` goes, in ms per step: compute-lane components summed over layers and
    both micro-batches, MTP drafts and heads, the fixed time, and the all-to-all time not hidden by Two-Batch
    Overlap. ``context_len`` defaults to the calibration row's (paper Table 2 row 1); memory is not checked."""
    sc = as_scenario(scenario).resolved()
    model_, dep, gpu, _ = sc.specs()
    params = sc.params
    context_len = _optional_int("context_len", context_len,
                                published("paper_table2")["t2_32k_mtp2_b52_r1"]["context_len"],
                                model_.max_position_embeddings)
    B = _counts("batches", batches, whole=True)
    c = layer_costs(model_, gpu, dep, B / 2, context_len, sc.mtp, part_batch_variant=params.part_batch).scaled(
        params.compute_scale, params.comm_scale)
    nl, nd = model_.n_layers, model_.n_dense_layers
    r = simulate(B, context_len, 1.0, scenario=sc.replace(check_memory=False))
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


@dataclass(frozen=True)
class BandInputs:
    """What every banded prediction starts from: the central calibration (``params``), every equally good
    calibration (``calibrations``, ``{name: CostParams}``, the central first), the locality models the evidence
    leaves open (``models``, the central first), one miss table per model (``misses``, by model name) and the
    sizes of their cache simulations (``sizes``, :class:`ess.sim.misses.BandSizes`)."""

    params: CostParams
    calibrations: dict
    models: list
    misses: dict
    sizes: BandSizes

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", _sizes("sizes", self.sizes, NOTEBOOK_SIZES))

    @property
    def central_misses(self) -> MissesTable:
        """The central locality model's miss table."""
        return self.misses[self.models[0].name]

    def scenario(self, base: Scenario | None = None) -> Scenario:
        """``base`` (default the project's scenario) with the central calibration."""
        return as_scenario(base).replace(params=self.params)

    def describe(self) -> dict:
        """What the band spans, for a record's configuration (and how much a throughput's band is widened to its
        measured coverage, :func:`ess.sim.calibrate.band_widening`)."""
        from .calibrate import BAND_NOMINAL, band_widening
        return {"calibrations": list(self.calibrations), "locality": [m.config() for m in self.models],
                "band_batch": self.sizes.band_batch,
                "throughput_band_widened_by": band_widening(),
                "widening": f"every throughput band's ends moved out by this share, so that {BAND_NOMINAL:.0%} of the "
                            f"calibration points, each left out of a refit, lie in the band the others give them "
                            f"(notebook 05)"}

    def variants(self, scenario: Scenario | None = None, variant_fit: dict | None = None) -> dict:
        """Every combination a banded prediction of ``scenario`` is made under, the central first:
        ``{name: (kind, scenario, misses)}``. Kind ``"calibration"``: every calibration crossed with every locality
        model's miss table (the calibration band); kind ``"extrapolation"``: each cost-parameter variant of
        :func:`extrapolation_params` with the central misses (the extrapolation band adds them; the public MTP growth
        applies to frames, :func:`mtp_growth_frame`)."""
        sc = as_scenario(scenario)
        out = {f"{cn} / {ln}": ("calibration", sc.replace(params=p), table)
               for ln, table in self.misses.items() for cn, p in self.calibrations.items()}
        out.update({name: ("extrapolation", sc.replace(params=p), self.central_misses)
                    for name, p in extrapolation_params(sc, variant_fit).items()})
        return out

    def provenance(self, scenario: Scenario | None = None) -> dict:
        """The configuration every banded prediction of ``scenario`` (default :meth:`scenario`) shares, for its
        records: the scenario (:meth:`ess.sim.Scenario.to_dict`) without its MTP and accept ratio (each prediction
        gives its own: the tables vary them row by row), which calibration it holds, what produced the central
        miss counts and what the band spans."""
        sc = self.scenario() if scenario is None else scenario
        shared = {k: v for k, v in sc.to_dict().items() if k not in ("mtp", "accept_ratio")}
        return {**shared, "calibration": "central of the equally good calibrations (notebook 05)",
                "misses": self.central_misses.config, "band": self.describe()}


def band_inputs(*, variant_fit: dict | None = None, sizes: BandSizes | None = None, ratios=(),
                part_batch_band: bool = True) -> BandInputs:
    """The calibrations of notebook 05 (:func:`ess.sim.calibrate.calibration_set` with ``variant_fit``) and the
    locality models of notebook 04 (:func:`ess.locality.locality_alternatives`), each model with its miss table
    of ``sizes`` (:class:`ess.sim.misses.BandSizes`; default :data:`ess.sim.misses.NOTEBOOK_SIZES`; ``ratios`` the
    tables' grid): the start of every banded prediction of notebooks 06-08, and of its records
    (:meth:`BandInputs.scenario`, :meth:`BandInputs.provenance`).

    With ``part_batch_band`` the central calibration under each end of the part-batch evidence
    (``data/calibration/part_batch.yaml``: ``"low"`` and ``"high"``, each calibrated anew on the same data) joins
    the calibrations, so that every band also spans what the kernels' fixed parts leave open."""
    from ..validate import boolean
    sizes = _sizes("sizes", sizes, NOTEBOOK_SIZES)
    part_batch_band = boolean("part_batch_band", part_batch_band)
    from ..locality import locality_alternatives
    from .calibrate import calibrate, calibration_set, compute_scale_from_cost, cost_growth_evidence
    cs = calibration_set(**(variant_fit or {}))
    calibrations = cs.kept_params()
    if part_batch_band:                     # the central calibration (default fit) under each end of the evidence
        for end in ("low", "high"):
            scen = Scenario(params=CostParams(part_batch=end))
            scale = compute_scale_from_cost(cost_growth_evidence()["central"], scenario=scen)
            q = calibrate(compute_scale=scale, scenario=scen, **(variant_fit or {})).params
            calibrations[f"part-batch evidence {end}, compute central ({q.compute_scale:.3f}), default"] = q
    models = list(locality_alternatives())
    tables = {m.name: MissesTable(ratios, steps=sizes.steps, locality=m, batch=sizes.batch_of(i == 0))
              for i, m in enumerate(models)}
    return BandInputs(cs.params, calibrations, models, tables, sizes)


def predict_configs(configs: pd.DataFrame, misses: Misses | None = None, *,
                    scenario: Scenario | None = None) -> pd.DataFrame:
    """Simulate rows with columns ``batch, context_len, ratio, mtp, accept_ratio`` in ``scenario`` (and optional
    ``h2d_GB_per_s``, and ``check_memory``: False for a row whose batch was sized by a memory rule of its own, e.g.
    the paper's KV-budget rule where the assumed host memory would cap it). Rows with ratio < 1 need miss counts:
    from ``misses`` (a :class:`~ess.sim.misses.MissesTable`: one cache simulation per context and MTP), or, when it
    is ``None``, the row is marked ``blocked`` (only the zero-miss bound ``throughput_no_miss`` is given). Also
    returns the zero-miss bound for every row and the miss total."""
    sc = as_scenario(scenario)
    nl = sc.specs()[0].n_sparse_layers
    if isinstance(misses, MissesTable):                         # one cache simulation per context and MTP
        ok = configs.ratio.notna() & (configs.ratio < 1) & (configs.batch > 0)
        misses.prefetch(zip(configs.context_len[ok], configs.ratio[ok], configs.mtp[ok]))
    rows = []
    for _, c in configs.iterrows():
        ratio, L, mtp = float(c.ratio), int(c.context_len), int(c.mtp)
        base = dict(batch=int(c.batch), context_len=L, ratio=ratio, mtp=mtp, accept_ratio=float(c.accept_ratio))
        row_sc = sc
        if "check_memory" in c and not bool(c.check_memory):
            row_sc = sc.replace(check_memory=False)
        args = dict(mtp=mtp, accept_ratio=float(c.accept_ratio), scenario=row_sc)
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
        if ratio < 1 and misses is None:
            rows.append({**row, "feasible": True, "status": "blocked",
                         "reason": "no miss counts given (ess.cachesim unavailable)"})
            continue
        if ratio < 1:
            try:
                m = np.asarray(misses(L, ratio, mtp), dtype=float)
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


def overlap_vs_misses(miss_counts, *, scenario: Scenario | None = None, context_len: int | None = None,
                      batch: int | None = None, mtp: int | None = None, ratio: float = 0.1,
                      profile: np.ndarray | None = None) -> pd.DataFrame:
    """Offload overhead of each strategy against the mean miss count per request, step and layer, in ``scenario``
    (its strategy and memory check are set here: every strategy, memory not checked).

    ``context_len``, ``batch`` and ``mtp`` default to the paper's overlap-chart configuration
    (``paper_table2.yaml: overlap_overhead_128k``); the link is the scenario's (default FlashTrans, ``links.yaml``).
    The per-layer shape is ``profile`` (normalised to mean 1, e.g. a cache-simulated miss profile) or uniform;
    memory is not checked (the configuration is the paper's overlap stress point), so ``ratio`` (< 1) only switches
    offload on. Overhead is the step-time increase over no offload, in % and ms, and in the paper's units,
    ``overhead_us_per_layer``: the extra microseconds each strategy puts on the compute lane of one layer and one
    Two-Batch-Overlap micro-batch (the mean over the layers; what the all-to-all lane may hide is not taken off)."""
    sc = as_scenario(scenario)
    model_ = sc.specs()[0]
    chart = published("paper_table2")["overlap_overhead_128k"]
    L_max = model_.max_position_embeddings
    context_len = _optional_int("context_len", context_len, chart["context_len"], L_max)
    batch = _optional_int("batch", batch, chart["batch"])
    mtp = _optional_int("mtp", mtp, chart["mtp"], L_max)
    ratio = validate.real("ratio", ratio, lo=0.0, hi=1.0, lo_open=True, hi_open=True)     # < 1: offload on
    nl = model_.n_sparse_layers
    if profile is None:
        prof = np.ones(nl)
    else:
        # at_most: weights of a shape, kept far from the float range so that their sum cannot overflow
        prof = validate.number_array("profile", profile, positive=False, at_least=0.0, at_most=1e12)
        if prof.shape != (nl,) or not prof.sum() > 0:
            raise ValueError(f"profile must be {nl} per-layer weights >= 0, not all 0, got shape {prof.shape}")
        prof = prof / prof.mean()
    counts = _counts("miss_counts", miss_counts, whole=False)
    ksel = mtp * min(model_.index_topk, context_len)
    m = np.minimum(counts[:, None] * prof[None, :], ksel)
    rows = []
    for s in STRATEGIES + ("best",):
        r = simulate(np.full(len(counts), batch), context_len, ratio, misses=m, mtp=mtp,
                     scenario=sc.replace(strategy=s, check_memory=False))
        per_layer_us = r.layer_overhead_s.mean(axis=1) / 2 * 1e6          # both micro-batches -> one
        for c, st, s0, ch, us in zip(counts, r.step_s, r.step_no_offload_s, r.layer_strategy, per_layer_us):
            rows.append({"strategy": s, "misses_per_layer": c, "step_ms": st * 1e3, "overhead_ms": (st - s0) * 1e3,
                         "overhead_pct": (st / s0 - 1) * 100, "overhead_us_per_layer": us,
                         "layers_da": int((ch == 1).sum()),
                         "layers_dba": int((ch == 2).sum()), "context_len": context_len, "batch": batch, "mtp": mtp,
                         "h2d_GB_per_s": float(r.h2d_GB_per_s[0])})
    return pd.DataFrame(rows)


def break_even_misses(configs: pd.DataFrame, baseline_throughput: float, *, scenario: Scenario | None = None,
                      profile: np.ndarray | None = None, resolution: int = 60) -> pd.DataFrame:
    """For each offload configuration (columns ``batch, context_len, ratio, mtp, accept_ratio``) of ``scenario``, the
    largest mean miss count per request, step and layer (per-layer shape ``profile``, normalised to mean 1; uniform
    if None) at which its throughput still reaches ``baseline_throughput``; also as a share of the entries selected
    per step. The shape is scaled by bisection (at most ``resolution`` halvings) between no misses and every layer
    missing all it selects (a layer's misses are capped at its selected entries, so a peaked shape saturates its
    worst layers first); the mean is taken after the cap. NaN where even zero misses fall short."""
    configs = validate.frame("configs", configs, ("batch", "context_len", "ratio", "mtp", "accept_ratio"))
    resolution = validate.non_negative_int("resolution", resolution)
    sc = as_scenario(scenario)
    model_ = sc.specs()[0]
    nl = model_.n_sparse_layers
    prof = np.ones(nl) if profile is None else np.asarray(profile, dtype=float) / np.mean(profile)
    out = []
    for _, c in configs.iterrows():
        ksel = int(c.mtp) * min(model_.index_topk, int(c.context_len))

        def misses(scale):
            return np.minimum(scale * prof, ksel)

        def reaches(scale):
            return simulate(int(c.batch), int(c.context_len), float(c.ratio), misses=misses(scale), mtp=int(c.mtp),
                            accept_ratio=float(c.accept_ratio), scenario=sc).throughput[0] >= baseline_throughput

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


def overlap_bands(calibrations, profiles, miss_counts, *, scenario: Scenario | None = None, **chart) -> pd.DataFrame:
    """:func:`overlap_vs_misses` for every calibration (``{name: CostParams}``, each replacing the scenario's)
    crossed with every per-layer miss profile (``{locality name: profile}``; the first of each is the central one),
    banded by :func:`band_frames` (``overhead_pct``, ``overhead_ms`` and ``overhead_us_per_layer``); a profile of
    ``None`` is uniform over the layers; ``chart``: ``context_len``, ``batch``, ``mtp``, ``ratio`` of
    :func:`overlap_vs_misses`."""
    sc = as_scenario(scenario)
    frames = [overlap_vs_misses(miss_counts, scenario=sc.replace(params=p), profile=prof, **chart)
              for prof in profiles.values() for p in calibrations.values()]
    return band_frames(frames, ("overhead_pct", "overhead_ms", "overhead_us_per_layer"))


def split_costs(batch: int, context_len: int, *, scenario: Scenario | None = None,
                mtp: int | None = None) -> dict:
    """What splitting costs for one configuration of ``scenario`` (its calibrated cost parameters and part-batch
    evidence; Two-Batch Overlap micro-batch ``b = batch / 2``), in microseconds per layer and micro-batch: the
    indexer's split part (logits + top-K) on ``b`` and on ``b / 2`` and their ratio; attention on ``b`` and ``b / 2``
    and their ratio; DA's own cost (a second attention launch over no entries plus the merge) and DBA's (both halves
    of the indexer and of attention, minus the whole)."""
    from .costs import layer_costs
    sc = as_scenario(scenario).resolved()
    model, dep, gpu, _ = sc.specs()
    batch = _optional_int("batch", batch, None)
    context_len = _optional_int("context_len", context_len, None, model.max_position_embeddings)
    mtp = _optional_int("mtp", mtp, sc.mtp, model.max_position_embeddings)
    q = sc.params
    c = layer_costs(model, gpu, dep, batch / 2, context_len, mtp, part_batch_variant=q.part_batch).scaled(
        q.compute_scale, q.comm_scale)
    us = lambda x: float(np.asarray(x)) * 1e6                                                  # noqa: E731
    b = batch / 2
    da_own = us(c.attention(b, 0.0)) + us(c.merge)
    dba_own = us(2 * c.indexer_half - c.indexer_split) + us(2 * c.attn_half - c.attn)
    return {"batch": int(batch), "micro_batch": b, "context_len": int(context_len), "mtp": mtp,
            "indexer_us": us(c.indexer_split), "indexer_half_us": us(c.indexer_half),
            "indexer_half_ratio": us(c.indexer_half) / us(c.indexer_split), "attn_us": us(c.attn),
            "attn_half_us": us(c.attn_half), "attn_half_ratio": us(c.attn_half) / us(c.attn),
            "da_own_us": da_own, "dba_own_us": dba_own, "part_batch": q.part_batch}


def strategy_map(batches, miss_counts, *, context_len: int, scenario: Scenario | None = None,
                 mtp: int | None = None) -> pd.DataFrame:
    """Which overlap strategy is cheapest at each batch and uniform miss count (per request, step and layer), in
    ``scenario`` (its link and cost parameters; memory not checked, offload on): one row per (batch, misses) with
    each strategy's extra microseconds per layer and micro-batch and ``best``, the cheapest (ties to the simpler:
    none, then DA). Where the misses are few the strategies' own costs decide (DA's second attention launch and
    merge, DBA's split indexer and attention); where they are many, what each hides."""
    sc = as_scenario(scenario)
    nl = sc.specs()[0].n_sparse_layers
    Bs = _counts("batches", batches, whole=True)
    counts = _counts("miss_counts", miss_counts, whole=False)
    model_ = sc.specs()[0]
    context_len = _optional_int("context_len", context_len, None, model_.max_position_embeddings)
    mtp = None if mtp is None else _optional_int("mtp", mtp, None, model_.max_position_embeddings)
    ksel = (sc.resolved().mtp if mtp is None else mtp) * min(model_.index_topk, context_len)
    if counts.max() > ksel:
        raise ValueError(f"miss_counts must be <= the entries selected per request, step and layer (mtp x min(K, "
                         f"context_len) = {ksel:,}), got {counts.max():g}")
    B, M = (x.ravel() for x in np.meshgrid(Bs, counts, indexing="ij"))
    out = {"batch": B.astype(int), "misses_per_layer": M}
    for s in STRATEGIES:
        r = simulate(B, context_len, 0.5, misses=np.repeat(M[:, None], nl, axis=1), mtp=mtp,
                     scenario=sc.replace(strategy=s, check_memory=False))
        out[f"{s}_us_per_layer"] = r.layer_overhead_s.mean(axis=1) / 2 * 1e6
    df = pd.DataFrame(out)
    us = df[[f"{s}_us_per_layer" for s in STRATEGIES]].to_numpy()
    df["best"] = np.array(STRATEGIES)[np.argmin(us, axis=1)]
    df["best_us_per_layer"] = us.min(axis=1)
    df["context_len"] = int(context_len)
    return df


def strategy_overheads(misses, *, scenario: Scenario | None = None, context_len: int, batch: int, mtp: int,
                       ratio: float) -> pd.DataFrame:
    """The offload overhead of each strategy (none, DA, DBA, the per-layer best) at given per-layer ``misses`` in
    ``scenario`` (its links and cost parameters), one row per strategy: % of the no-offload step, the stall in ms,
    and how many layers the per-layer choice gives to each strategy. Memory is not checked (a stress configuration,
    like the paper's overlap chart)."""
    sc = as_scenario(scenario)
    m = validate.number_array("misses", misses, positive=False, at_least=0.0, at_most=validate.MAX_EXACT_COUNT)
    L_max = sc.specs()[0].max_position_embeddings
    context_len = _optional_int("context_len", context_len, None, L_max)
    batch = _optional_int("batch", batch, None)
    mtp = _optional_int("mtp", mtp, None, L_max)
    ratio = validate.ratio("ratio", ratio)
    rows = []
    for st in STRATEGIES + ("best",):
        r = simulate(batch, context_len, ratio, misses=m, mtp=mtp,
                     scenario=sc.replace(strategy=st, check_memory=False))
        ch = r.layer_strategy[0]
        rows.append({"ratio": ratio, "strategy": st, "mean_misses_per_layer": float(m.mean()),
                     "overhead_pct": (r.step_s[0] / r.step_no_offload_s[0] - 1) * 100, "stall_ms": r.stall_s[0] * 1e3,
                     "layers_none": int((ch == 0).sum()), "layers_da": int((ch == 1).sum()),
                     "layers_dba": int((ch == 2).sum())})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------ extrapolation
def calibrated_range() -> dict:
    """What the cost model was calibrated on (the calibration points, :func:`ess.sim.calibrate.calibration_points`):
    ``mtp`` and ``context_len`` (each the one value every point shares), ``batch_max`` (the largest batch),
    ``ratio`` (1: no point offloads)."""
    from .calibrate import calibration_points
    pts = calibration_points()
    mtps, contexts = {p.mtp for p in pts}, {p.context_len for p in pts}
    if len(mtps) != 1 or len(contexts) != 1:              # the rule below assumes one MTP and one context
        raise ValueError(f"the calibration points span MTP {sorted(mtps)} and contexts {sorted(contexts)}")
    return {"mtp": mtps.pop(), "context_len": contexts.pop(), "batch_max": max(p.batch for p in pts),
            "ratio": max(p.ratio for p in pts)}


def extrapolated_parts(batch: int, context_len: int, ratio: float, mtp: int) -> list:
    """Which parts of a prediction at ``batch``, ``context_len``, ``ratio`` and ``mtp`` leave what the cost model
    was calibrated on (:func:`calibrated_range`), in words; empty for a calibrated configuration.

    >>> extrapolated_parts(52, 32768, 1.0, 2)
    []
    >>> [p.split(":")[0] for p in extrapolated_parts(400, 131072, 0.2, 4)]      # Fig. 1 reaches batch 320
    ['MTP 4', 'context 128K', 'batch 400', 'ratio 0.2']
    """
    from ..validate import positive_int
    batch, context_len, mtp = (positive_int(n, v) for n, v in (("batch", batch), ("context_len", context_len),
                                                                ("mtp", mtp)))
    c = calibrated_range()
    out = []
    if mtp != c["mtp"]:
        out.append(f"MTP {mtp}: the step's growth with query tokens per request priced by the cost model, calibrated "
                   f"at MTP {c['mtp']} (band: public MTP growth, data/calibration/mtp_growth.yaml)")
    if context_len != c["context_len"]:
        out.append(f"context {context_len // 1024}K: calibrated at {c['context_len'] // 1024}K; the indexer's growth "
                   f"with position from DeepSeek's decode cost (4K-128K)")
    if batch > c["batch_max"]:
        out.append(f"batch {batch}: beyond the largest calibration batch ({c['batch_max']})")
    if ratio < c["ratio"]:
        out.append(f"ratio {ratio:.3g}: offload, never calibrated on a DeepSeek run; misses from the locality models "
                   f"(calibration band), the copies and their overlap from the link and the formulas (checked on a "
                   f"real engine, notebook 09)")
    return out


def extrapolation_params(scenario: Scenario | None = None, variant_fit: dict | None = None) -> dict:
    """The cost-parameter variants of the extrapolation band that apply to ``scenario``'s GPU (notebook 10's, kept by
    :func:`ess.sim.store.stored_calibration`): the kernel efficiencies at the slowest and the fastest shapes measured
    at each point, each recalibrated; Blackwell's sparse attention at FlashMLA's measured B200 point on a Blackwell
    GPU only. ``{name: CostParams}``."""
    from .store import stored_calibration
    gpu = as_scenario(scenario).specs()[2]
    return {name: p for name, p in stored_calibration(variant_fit)["extrapolation"].items()
            if p.attention_transfer == "hopper" or gpu.architecture == "blackwell"}


def mtp_growth() -> dict:
    """The public evidence on how a DeepSeek-class decode step grows with the query tokens per request
    (``data/calibration/mtp_growth.yaml``, ``step_growth_per_query_token``): ``{"low", "central", "high"}`` -> ``a``
    of the rule ``s(m) / s(1) = 1 + a (m - 1)`` (:func:`mtp_step_ratio`), and its ``source``."""
    from .costs import calibration_data
    e = calibration_data("mtp_growth")["step_growth_per_query_token"]
    return {"low": float(e["low"]["a"]), "central": float(e["value"]["a"]), "high": float(e["high"]["a"]),
            "source": e["source"]}


def mtp_step_ratio(mtp, a: float, *, base: int = 2):
    """The step at ``mtp`` query tokens per request over the step at ``base``: ``(1 + a (mtp - 1)) / (1 + a (base -
    1))`` (the public rule, :func:`mtp_growth`).

    >>> round(mtp_step_ratio(4, 0.32), 3), round(mtp_step_ratio(1, 0.32), 3)
    (1.485, 0.758)
    """
    a = validate.real("a", a, lo=0.0)
    base = validate.positive_int("base", base)
    m = _counts("mtp", mtp, whole=True)
    out = (1 + a * (m - 1)) / (1 + a * (base - 1))
    return float(out[0]) if np.ndim(mtp) == 0 else out


def mtp_growth_check(batch: int, context_len: int, mtps=(1, 4), *, scenario: Scenario | None = None) -> pd.DataFrame:
    """The cost model's own growth of the no-offload step with query tokens per request beside the public evidence
    (:func:`mtp_growth`): for each of ``mtps``, the step at that MTP over the step at the calibrated MTP (same
    ``batch``, ``context_len``; memory not checked), the ``a`` of the public rule it implies, and the public ratio at
    the evidence's central ``a`` and the band its low and high ``a`` span (``public_low`` the smaller ratio). A check, never a fit: the evidence sets the extrapolation band
    (:func:`mtp_growth_frame`), not the cost model. Columns ``mtp, model_ratio, model_a, public_low,
    public_central, public_high, inside``.

    The implied ``a`` solves ``(1 + a (m - 1)) / (1 + a (b - 1)) = g`` for the calibrated MTP ``b``:
    ``a = (g - 1) / ((m - 1) - g (b - 1))``; at ``b = 2``, ``m = 4`` and ``g = 1.4``, ``a = 0.4 / 1.6 = 0.25``."""
    sc = as_scenario(scenario).replace(check_memory=False)
    batch = validate.positive_int("batch", batch)
    context_len = validate.positive_int("context_len", context_len)
    m = _counts("mtps", mtps, whole=True).astype(int)
    base = calibrated_range()["mtp"]
    growth = mtp_growth()
    at_base = simulate(batch, context_len, 1.0, mtp=base, accept_ratio=1.0, scenario=sc).step_no_offload_s[0]
    rows = []
    for mtp in m:
        g = float(simulate(batch, context_len, 1.0, mtp=int(mtp), accept_ratio=1.0,
                           scenario=sc).step_no_offload_s[0] / at_base)
        den = (mtp - 1) - g * (base - 1)
        a = (g - 1) / den if mtp != base and den != 0 else np.nan
        pub = {end: mtp_step_ratio(int(mtp), growth[end], base=base) for end in ("low", "central", "high")}
        lo, hi = min(pub["low"], pub["high"]), max(pub["low"], pub["high"])    # below the base MTP, a high a: low
        rows.append({"mtp": int(mtp), "model_ratio": g, "model_a": a, "public_low": lo,
                     "public_central": pub["central"], "public_high": hi, "inside": bool(lo <= g <= hi)})
    return pd.DataFrame(rows)


def mtp_growth_frame(frame: pd.DataFrame, a: float, *, scenario: Scenario | None = None) -> pd.DataFrame:
    """``frame`` (rows of :func:`predict_configs` or :func:`ess.tables.sim.table2_predictions`) with the step's
    growth with query tokens per request set by the public rule at ``a`` instead of the cost model's: each row at an
    MTP other than the calibrated one (:func:`calibrated_range`) has its step (and its zero-miss bound's) scaled by
    ``mtp_step_ratio(mtp, a) / g``, where ``g`` is the cost model's own ratio of the no-offload step at that MTP
    to the step at the calibrated MTP (same batch, context and accept ratio, memory not checked); throughput and
    OTPS by the inverse; ``gain_pct`` / ``gain_no_miss_pct`` against the unchanged reference. The offload part of
    the step (stalls) is scaled alike. Rows at the calibrated MTP are unchanged. One extrapolation variant of the
    bands of notebooks 07-08."""
    sc = as_scenario(scenario).replace(check_memory=False)
    base = calibrated_range()["mtp"]
    out = frame.copy()
    ok = (out.mtp != base) & out.get("step_ms_no_offload", pd.Series(np.nan, index=out.index)).notna()
    if not ok.any():
        return out
    part = out[ok]
    B, L = part.batch.to_numpy(int), part.context_len.to_numpy(int)
    # the step does not depend on the accept ratio (only the tokens it yields do): 1 is valid at every MTP
    at_base = simulate(B, L, 1.0, mtp=base, accept_ratio=1.0, scenario=sc).step_no_offload_s * 1e3
    g_model = part.step_ms_no_offload.to_numpy(float) / at_base
    f = mtp_step_ratio(part.mtp.to_numpy(int), a, base=base) / g_model
    has_ref = "gain_pct" in out and "throughput" in out
    if has_ref:
        ref = out.throughput / (1 + out.gain_pct / 100)
    for col, k in (("step_ms", f), ("stall_ms", f), ("step_ms_no_offload", f), ("throughput", 1 / f),
                   ("otps", 1 / f), ("throughput_no_miss", 1 / f)):
        if col in out:
            out.loc[ok, col] = out.loc[ok, col].to_numpy(float) * k
    if has_ref:
        out["gain_pct"] = (out.throughput / ref - 1) * 100
        if "gain_no_miss_pct" in out:
            out["gain_no_miss_pct"] = (out.throughput_no_miss / ref - 1) * 100
    return out


def value_band(band: BandInputs, fn: Callable, *, scenario: Scenario | None = None, variant_fit: dict | None = None,
               widen: bool = False) -> dict:
    """The bands of one number: ``fn(scenario, misses)`` under every combination of :meth:`BandInputs.variants`
    (``None`` or NaN where the combination admits no value). Returns ``value`` (the central combination's), ``low`` /
    ``high`` over the calibration band (moved out by :func:`ess.sim.calibrate.widen_band` with ``widen``, the rule
    for a throughput), ``ext_low`` / ``ext_high`` over the calibration band and the extrapolation variants, and
    ``band_size`` / ``ext_band_size`` (how many combinations gave a value). When ``fn`` returns a mapping of numbers,
    each key gets its own such dict (one evaluation per combination serves them all). The scenario must be at the
    calibrated MTP: another MTP's growth variant applies to frames (:func:`mtp_growth_frame`), not to a number.

    >>> import types
    >>> b = types.SimpleNamespace(variants=lambda sc, vf: {"c": ("calibration", 2.0, None),
    ...     "c2": ("calibration", 3.0, None), "x": ("extrapolation", 1.0, None)})
    >>> value_band(b, lambda sc, m: 10 * sc)
    {'value': 20.0, 'low': 20.0, 'high': 30.0, 'ext_low': 10.0, 'ext_high': 30.0, 'band_size': 2, 'ext_band_size': 3}
    >>> value_band(b, lambda sc, m: {"x": sc, "y": None if sc == 3.0 else -sc})["y"]["low"]
    -2.0
    """
    from .calibrate import widen_band
    if not callable(fn):
        raise TypeError(f"fn must be callable as fn(scenario, misses), got {type(fn).__name__}")
    widen = validate.boolean("widen", widen)
    combos = list(band.variants(scenario, variant_fit).values())
    mtp = getattr(combos[0][1], "mtp", None)
    if mtp is not None and mtp != calibrated_range()["mtp"]:
        raise ValueError(f"scenario is at MTP {mtp}; value_band applies to the calibrated MTP "
                         f"({calibrated_range()['mtp']}) only (another MTP's growth variant: mtp_growth_frame)")
    results = [(kind, fn(sc, misses)) for kind, sc, misses in combos]
    keyed = isinstance(results[0][1], Mapping)

    def number(v):
        return None if v is None or (isinstance(v, (float, np.floating)) and np.isnan(v)) else float(v)

    def reduce(vals):
        cal = [v for k, v in vals if k == "calibration" and v is not None]
        every = [v for _, v in vals if v is not None]
        low, high = (min(cal), max(cal)) if cal else (None, None)
        if widen and cal:
            low, high = (float(x) for x in widen_band(low, high))
        ext_low, ext_high = (min(every), max(every)) if every else (None, None)
        if low is not None:
            ext_low, ext_high = min(ext_low, low), max(ext_high, high)
        return {"value": vals[0][1], "low": low, "high": high, "ext_low": ext_low, "ext_high": ext_high,
                "band_size": len(cal), "ext_band_size": len(every)}

    if not keyed:
        return reduce([(k, number(v)) for k, v in results])
    return {key: reduce([(k, number(v.get(key))) for k, v in results]) for key in results[0][1]}
