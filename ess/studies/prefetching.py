"""The prefetching notebook's (04) studies, each returning its frames and records: the locality evidence and the
model it picks, the paper's held-back miss figures predicted with a band over the locality models (misses per layer
against the ratio, the first decode steps with and without warmup, misses against context, the smallest pool under a
target), the policies against Belady's bound, the LSTM heat predictor, a recorded trace and the prefetch classes on
one link.

Every function runs the library (:mod:`ess.cachesim`, :mod:`ess.tracegen`, :mod:`ess.heat_predictor`,
:mod:`ess.prefetch`) and returns what it computed with its **records**: keyword arguments of
:meth:`ess.results.Recorder.record` (name, value, unit, config, note, and where they exist the published value,
source and band), the configuration of each written here once. The notebook calls, shows, checks and records.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from ..specs import DEFAULT_MODEL, model_spec
from ..tracegen import Workload

__all__ = ["trace_setting", "band_setting", "drift_rho_fit", "evidence_records", "mtp_unions", "MissesByRatio",
           "misses_by_ratio", "WarmupCurves", "warmup_curves", "misses_by_context", "smallest_pools",
           "policies_against_belady", "lstm_heat_predictor", "recorded_trace", "prefetch_classes", "PREFETCH_CLASSES",
           "COMPARED_POLICIES", "PolicyComparison", "policy_comparison", "recorded_traces"]

MISSES_UNIT = "misses/request/layer/step"


def trace_setting(seed: int) -> dict:
    """The configuration every synthetic trace of the notebook shares: DeepSeek-V3.2-Exp's K and layers, the
    paper's warmup windows, the generator's sinks and local window (``data/locality/generator.yaml``), LRU."""
    from ..tracegen import PAPER_WARMUP_WINDOWS, generator_defaults
    from ..validate import integer
    seed = integer("seed", seed)
    model, gen = model_spec(DEFAULT_MODEL), generator_defaults()
    return {"k": model.index_topk, "n_layers": model.n_layers, "warmup_windows": PAPER_WARMUP_WINDOWS, "seed": seed,
            "n_sinks": gen["n_sinks"], "local_window": gen["local_window"], "policy": "lru"}


def band_setting(models, band_batch: int) -> dict:
    """What a band of the notebook spans: the locality models (the central first) and the requests the
    alternatives simulate."""
    from ..validate import positive_int
    band_batch = positive_int("band_batch", band_batch)
    return {"band": [m.config() for m in models], "band_batch": band_batch,
            "band_rule": "data/locality/README.md, Bands"}


def _band(values) -> tuple:
    """The lowest and highest of per-model arrays (the central first), element by element."""
    return np.min(values, axis=0), np.max(values, axis=0)


# ------------------------------------------------------------------------------------------------------ evidence
def drift_rho_fit(fit: dict) -> tuple[pd.DataFrame, list[dict]]:
    """Drift's ``rho`` fitted on vLLM's 2 x K hit rate (E2) in each reading of Fig. 2, at the middle of the range
    and its ends (``data/locality/fit.yaml``): a frame (one column per reading) and one record per fit."""
    from .locality import FIT_HIT_RATE
    from ..locality import READINGS
    fits = fit["drift_rho_fit"]["value"]
    frame = pd.DataFrame({rd: {f"rho ({at})": v["rho"] for at, v in fits[rd].items()}
                          | {f"2xK hit rate ({at})": v["hit_rate"] for at, v in fits[rd].items()}
                          | {f"target reachable ({at})": v["reachable"] for at, v in fits[rd].items()}
                          for rd in READINGS})
    records = []
    for rd in READINGS:
        for at in ("central", "at_80", "at_90"):
            f = fits[rd][at]
            records.append(dict(name=f"drift_rho_{rd}_{at}", value=f["rho"], unit="",
                                config={"reading": rd, "target_hit_rate": FIT_HIT_RATE[at], **fit["setting"]["value"]},
                                source=fit["drift_rho"]["source"],
                                note=f"fitted on vLLM's 2xK hit rate (E2); reached {f['hit_rate']}, target reachable "
                                     f"{f['reachable']}"))
    return frame, records


def evidence_setting(fit: dict, *, context_len: int, probe_steps: int, probe_seed: int, real) -> dict:
    """Where each evidence statistic is measured (``data/locality/README.md``): E2's setting of the fit file, the
    probe of E1 and E3, the real traces of E4."""
    return {"setting_E2": fit["setting"]["value"], "probe": {"context_len": context_len, "mtp": 1,
            "steps": probe_steps, "batch": 1, "seed": probe_seed}, "real_traces": sorted(real)}


def evidence_records(evidence: pd.DataFrame, setting: dict, central, scores: dict, chosen: tuple) -> list[dict]:
    """The records of :func:`ess.studies.locality.measure_evidence`: every candidate's E2, E3, E1 and E4 statistics
    and score, the central model's under plain names, and the model the rule picks (``chosen`` from ``scores``)."""
    from .locality import SHAPE_STATS
    out = []
    for name, r in evidence.iterrows():
        cfg = {**setting, "model": name, "trace_model": r.trace_model, "reading": r.reading, "drift_rho": r.drift_rho}
        tag = name.replace("/", "_").replace(" ", "_").replace(".", "")
        out.append(dict(name=f"evidence_{tag}_hit_2k", value=r.hit_2k, unit="", config=cfg,
                        source="vLLM RFC #48203 via paper-facts.md: 80-90 %",
                        note=f"E2: distance to 80-90 % {r.d_E2:.4f}"))
        out.append(dict(name=f"evidence_{tag}_gvr_deep", value=r.gvr_deep, unit="", config=cfg,
                        source="NVIDIA GVR via paper-facts.md: 35-50 % in deep layers",
                        note="E3: mean overlap, layers 2-60"))
        out.append(dict(name=f"evidence_{tag}_gvr_shallow", value=r.gvr_shallow, unit="", config=cfg,
                        source="NVIDIA GVR via paper-facts.md: ~1-2 % in layers 0-1",
                        note="E3: mean overlap, layers 0-1"))
        out.append(dict(name=f"evidence_{tag}_e1_max_error", value=r.e1_max_error, unit="",
                        config={**cfg, "floor": r.floor},
                        note="E1: largest |measured - target| over the layers (target raised to the floor)"))
        for st in SHAPE_STATS:
            if r[f"model_{st}"] is not None and not pd.isna(r[f"model_{st}"]):
                out.append(dict(name=f"evidence_{tag}_shape_{st}", value=r[f"model_{st}"], unit="", config=cfg,
                                note=f"E4: the model at the real traces' geometry; real traces "
                                     f"{r[f'real_{st}']:.4f}"))
        out.append(dict(name=f"evidence_{tag}_score", value=r.score, unit="", config=cfg,
                        note=f"d_E2 {r.d_E2:.4f} + d_E3 {r.d_E3:.4f} + d_E4 "
                             f"{r.d_E4 if r.d_E4 is not None else 'n/a'}"))
    cen = evidence.loc[f"{central.trace_model}/{central.reading}"]            # the central model under plain names
    for stat in ("hit_2k", "gvr_deep", "gvr_shallow", "e1_max_error", "score"):
        out.append(dict(name=f"locality_central_{stat}", value=cen[stat], unit="",
                        config={**setting, **central.config()},
                        note=f"the central locality model's {stat} (see the evidence_* records for every candidate)"))
    out.append(dict(name="locality_central_drift_rho", value=central.drift_rho, unit="", config=central.config(),
                    note="calibrated on vLLM's 2xK hit rate (E2); None for the uniform model", status="calibrated"))
    out.append(dict(name="locality_model_chosen", value="/".join(chosen), unit="",
                    config={"rule": "data/locality/README.md", **setting,
                            "scores": {"/".join(k): v for k, v in scores.items()}}))
    return out


# ------------------------------------------------------------------------------------------------------ MTP union
def mtp_unions(context_len: int, mtps, *, steps: int, seed: int, locality) -> tuple[pd.DataFrame, list[dict]]:
    """How large one MTP step's union is: for each ``mtp`` of ``mtps`` a synthetic trace of ``locality`` (one
    request, ``steps`` steps), its mean union per layer beside the bound :func:`ess.layout.step_entries` sets with
    the model's overlaps (the pool-size need), and the largest step over its layer's bound (a share)."""
    from ..layout import step_entries
    from ..tracegen import locality_profile, synthetic_trace
    from ..validate import non_negative_int, positive_int
    context_len, steps = positive_int("context_len", context_len), positive_int("steps", steps)
    seed = non_negative_int("seed", seed)
    model = model_spec(DEFAULT_MODEL)
    K = model.index_topk
    profile = locality_profile("paper", model.n_layers, locality.reading)
    rows, records = [], []
    for t in mtps:
        tr = synthetic_trace(Workload(context_len, mtp=t, steps=steps, batch=1, seed=seed, locality=locality))
        size = tr.set_sizes()[0].mean(axis=1)                                 # (layers,) mean union per step
        bound = step_entries(model, context_len, t, overlap=profile)
        excess = float((tr.set_sizes()[0].max(axis=1) / bound).max() - 1)
        rows.append({"mtp": t, "mean union": size.mean(), "bound (mean over layers)": bound.mean(),
                     "layer 0 union": size[0], "largest layer bound": bound.max(), "t x K": t * K,
                     "largest step over its bound": excess})
        records.append(dict(name=f"mtp{t}_union_mean", value=float(size.mean()), unit="entries/request/layer/step",
                            config={**trace_setting(seed), **locality.config(), "context_len": context_len, "mtp": t,
                                    "steps": steps, "batch": 1},
                            note=f"bound (step_entries, mean over layers) {bound.mean():.0f}; {t} x K = {t * K}"))
    return pd.DataFrame(rows), records


# ------------------------------------------------------------------------------------- held-back miss predictions
@dataclass
class MissesByRatio:
    """Prediction 1: ``per_ratio[model name][ratio]`` misses per layer (the central model first), ``band[ratio]``
    (low, high) per layer over the models, ``uniform[ratio]`` the earlier uniform model's, ``frame`` a summary and
    ``records``."""

    per_ratio: dict
    band: dict
    uniform: dict
    frame: pd.DataFrame
    records: list


def misses_by_ratio(context_len: int, ratios, models, uniform, *, mtp: int, steps: int, seed: int, batch: int,
                    band_batch: int) -> MissesByRatio:
    """Mean misses per layer at ``context_len`` for each ratio, LRU with warmup, with a band over ``models`` (the
    central first, ``batch`` requests; the alternatives ``band_batch``, their spread being the band), and the
    earlier ``uniform`` model for reference. Each (request, layer) stream is generated once and simulated at every
    ratio (:func:`ess.cachesim.sweep_synthetic`)."""
    from ..cachesim import sweep_synthetic
    from ..layout import pool_slots
    from ..validate import non_negative_int, positive_int
    context_len, mtp, steps, batch, band_batch = (positive_int(n, v) for n, v in (
        ("context_len", context_len), ("mtp", mtp), ("steps", steps), ("batch", batch), ("band_batch", band_batch)))
    seed = non_negative_int("seed", seed)
    model = model_spec(DEFAULT_MODEL)
    central = models[0]
    per_ratio = {}
    for m in models:
        sweep = sweep_synthetic(Workload(context_len, mtp=mtp, steps=steps, seed=seed,
                                         batch=batch if m == central else band_batch, locality=m), ratios)
        per_ratio[m.name] = {r: sweep[(r, "lru", True)].mean(axis=1) for r in ratios}
    uni = sweep_synthetic(Workload(context_len, mtp=mtp, steps=steps, batch=batch, seed=seed, locality=uniform),
                          ratios)
    uni = {r: uni[(r, "lru", True)] for r in ratios}
    cen = per_ratio[central.name]
    band = {r: _band([per_ratio[m.name][r] for m in models]) for r in ratios}
    cfg1 = {**trace_setting(seed), **central.config(), "context_len": context_len, "mtp": mtp, "steps": steps,
            "batch": batch, "warmup": True, **band_setting(models, band_batch)}
    records = []
    note = "held-back result of the paper (per-layer miss counts): prediction"
    for r in ratios:
        cfg_r = {**cfg1, "ratio": r, "capacity": pool_slots(model, r, context_len, need=model.index_topk)}
        held = "held back (predicted)"
        records.append(dict(name=f"misses_per_layer_32k_ratio{r:g}", value=cen[r], unit=MISSES_UNIT, config=cfg_r,
                            note=note, status=held))
        records.append(dict(name=f"misses_per_layer_32k_ratio{r:g}_low", value=band[r][0], unit=MISSES_UNIT,
                            config=cfg_r, note="the band's low end per layer: " + note, status=held))
        records.append(dict(name=f"misses_per_layer_32k_ratio{r:g}_high", value=band[r][1], unit=MISSES_UNIT,
                            config=cfg_r, note="the band's high end per layer: " + note, status=held))
        means = [per_ratio[m.name][r].mean() for m in models]
        records.append(dict(name=f"misses_mean_32k_ratio{r:g}", value=float(cen[r].mean()), unit=MISSES_UNIT,
                            config=cfg_r, note="prediction; band over the locality models", low=float(min(means)),
                            high=float(max(means)), status="predicted"))
        records.append(dict(name=f"misses_mean_32k_ratio{r:g}_uniform", value=float(uni[r].mean()),
                            unit=MISSES_UNIT, config={**cfg_r, **uniform.config()}, note="the earlier uniform model"))
    frame = pd.DataFrame({
        "ratio": ratios, "pool slots": [pool_slots(model, r, context_len, need=model.index_topk) for r in ratios],
        "mean misses (central)": np.round([cen[r].mean() for r in ratios], 1),
        **{f"mean misses ({m.name})": [round(per_ratio[m.name][r].mean(), 1) for r in ratios] for m in models[1:]},
        "mean misses (uniform)": [round(uni[r].mean(), 1) for r in ratios],
        "layer 0 (central)": [round(cen[r][0], 1) for r in ratios]})
    return MissesByRatio(per_ratio, band, uni, frame, records)


@dataclass
class WarmupCurves:
    """Prediction 2: ``curves[model name][warmup]`` the misses of each step (mean over layers and requests),
    ``per_layer_first`` the central model's sweep ((ratio, policy, warmup) -> (layers, steps)), ``settle`` the
    steps each model takes to settle without warmup, ``central``/``low``/``high`` by warmup, and ``records``."""

    curves: dict
    per_layer_first: dict
    settle: dict
    tail: slice
    records: list

    def series(self) -> tuple[dict, dict]:
        """``(curves, bands)`` of the central model for :func:`ess.viz.prefetch.fig_warmup_curve`: by label
        ("LRU, with warmup", "LRU, without warmup"), the curve and its (low, high) over the models."""
        central = next(iter(self.curves))
        label = {True: "LRU, with warmup", False: "LRU, without warmup"}
        return ({label[w]: self.curves[central][w] for w in (True, False)},
                {label[w]: _band([c[w] for c in self.curves.values()]) for w in (True, False)})


def warmup_curves(context_len: int, ratio: float, models, *, steps: int, seed: int, batch: int,
                  band_batch: int) -> WarmupCurves:
    """The first ``steps`` decode steps at ``ratio``, MTP 1, LRU, with and without LRU-Warmup, with a band over
    ``models`` (the central first): the curves, the first step's misses, the steady state (second half of the
    steps, with warmup) and the steps taken to settle without warmup (the first within 10 % of that state)."""
    from ..cachesim import sweep_synthetic
    from ..validate import integer, positive_int
    context_len, steps, batch, band_batch = (positive_int(n, v) for n, v in (
        ("context_len", context_len), ("steps", steps), ("batch", batch), ("band_batch", band_batch)))
    seed = integer("seed", seed)
    central = models[0]
    curves, per_layer_first = {}, None
    for m in models:
        res = sweep_synthetic(Workload(context_len, mtp=1, steps=steps, seed=seed,
                                       batch=batch if m == central else band_batch, locality=m),
                              [ratio], warmups=(True, False))
        curves[m.name] = {w: res[(ratio, "lru", w)].mean(axis=0) for w in (True, False)}
        if m == central:
            per_layer_first = res
    cfg2 = {**trace_setting(seed), **central.config(), "context_len": context_len, "mtp": 1, "ratio": ratio,
            "steps": steps, "batch": batch, **band_setting(models, band_batch)}
    tail = slice(steps // 2, None)
    records = []
    note = "held-back result of the paper (warmup curves): prediction"
    for w, label in ((True, "with"), (False, "without")):
        c = curves[central.name][w]
        lo, hi = _band([curves[m.name][w] for m in models])
        cfg_w = {**cfg2, "warmup": w}
        held = "held back (predicted)"
        records.append(dict(name=f"warmup_curve_{label}", value=c, unit="misses/request/layer", config=cfg_w,
                            note=note, status=held))
        records.append(dict(name=f"warmup_curve_{label}_low", value=lo, unit="misses/request/layer", config=cfg_w,
                            note="the band's low end per step: " + note, status=held))
        records.append(dict(name=f"warmup_curve_{label}_high", value=hi, unit="misses/request/layer", config=cfg_w,
                            note="the band's high end per step: " + note, status=held))
        firsts = [curves[m.name][w][0] for m in models]
        records.append(dict(name=f"first_step_misses_{label}_warmup", value=float(c[0]), unit="misses/request/layer",
                            config=cfg_w, note="prediction; band over the locality models", low=float(min(firsts)),
                            high=float(max(firsts)), status="predicted"))
    steady = [curves[m.name][True][tail].mean() for m in models]
    records.append(dict(name=f"steady_misses_mtp1_ratio{ratio:g}",
                        value=float(curves[central.name][True][tail].mean()), unit=MISSES_UNIT,
                        config={**cfg2, "warmup": True, "window": f"steps {steps // 2}..{steps - 1}"},
                        note="prediction; band over the locality models", low=float(min(steady)),
                        high=float(max(steady)), status="predicted"))
    settle = {m.name: int(np.argmax(curves[m.name][False] <= 1.1 * curves[m.name][True][tail].mean()))
              for m in models}
    records.append(dict(name="steps_to_settle_without_warmup", value=settle[central.name], unit="steps", config=cfg2,
                        note="first step whose misses are within 10 % of the steady state with warmup; band over "
                             "the models", low=min(settle.values()), high=max(settle.values())))
    return WarmupCurves(curves, per_layer_first, settle, tail, records)


def misses_by_context(context_lens, ratio: float, models, *, mtp: int, steps: int, batch: int,
                      seed: int) -> tuple[dict, list[dict]]:
    """Prediction 3: mean misses per layer against context length at one ratio (LRU with warmup) for each of
    ``models`` (the first under plain record names, the others with ``_<trace model>`` appended): ``{model name:
    [mean per context]}`` and the records."""
    from ..cachesim import misses_per_layer
    from ..validate import integer, positive_int
    mtp, steps, batch = (positive_int(n, v) for n, v in (("mtp", mtp), ("steps", steps), ("batch", batch)))
    seed = integer("seed", seed)
    by_ctx, records = {}, []
    for i, m in enumerate(models):
        by_ctx[m.name] = [float(misses_per_layer(Workload(L, mtp=mtp, steps=steps, batch=batch, seed=seed,
                                                          locality=m), ratio).mean()) for L in context_lens]
        sfx = "" if i == 0 else f"_{m.trace_model}"
        for L, v in zip(context_lens, by_ctx[m.name]):
            records.append(dict(name=f"misses_mean_ratio{ratio:g}_{L // 1024}k{sfx}", value=v, unit=MISSES_UNIT,
                                config={**trace_setting(seed), **m.config(), "ratio": ratio, "mtp": mtp,
                                        "steps": steps, "batch": batch, "warmup": True, "context_len": L},
                                note="prediction", status="predicted"))
    return by_ctx, records


def smallest_pools(context_len: int, target: float, models, *, resolution: int, mtp: int, steps: int, batch: int,
                   seed: int) -> tuple[dict, list[dict]]:
    """Prediction 4: for each of ``models`` (record suffixes as in :func:`misses_by_context`) the smallest pool
    whose mean misses stay under ``target`` (:func:`ess.cachesim.smallest_pool`): ``{model name: result dict, or
    the reason (a string) when even the whole context misses too much}`` and the records."""
    from ..cachesim import smallest_pool
    from ..validate import non_negative_int, positive_int
    context_len, resolution, mtp, steps, batch = (positive_int(n, v) for n, v in (
        ("context_len", context_len), ("resolution", resolution), ("mtp", mtp), ("steps", steps), ("batch", batch)))
    seed = non_negative_int("seed", seed)
    found, records = {}, []
    for i, m in enumerate(models):
        sfx = "" if i == 0 else f"_{m.trace_model}"
        cfg4 = {**trace_setting(seed), **m.config(), "context_len": context_len, "mtp": mtp, "steps": steps,
                "batch": batch, "warmup": True, "target": target, "resolution_slots": resolution}
        try:
            b = smallest_pool(Workload(context_len, mtp=mtp, steps=steps, batch=batch, seed=seed, locality=m),
                              target, resolution=resolution)
        except ValueError as exc:            # even the whole context misses too much: first loads dominate few steps
            found[m.name] = str(exc)
            records.append(dict(name=f"smallest_pool_under_200_slots{sfx}", value=None, unit="slots/request/layer",
                                config=cfg4, note=f"not reachable in this (smoke) configuration: {exc}"))
            continue
        found[m.name] = b
        below = "" if b["below_slots"] is None else f", {b['below_misses']:.1f} at {b['below_slots']} slots"
        records.append(dict(name=f"smallest_pool_under_200_slots{sfx}", value=b["slots"], unit="slots/request/layer",
                            config=cfg4, note=f"{b['misses']:.1f} misses at this size{below}: prediction",
                            status="predicted"))
        records.append(dict(name=f"smallest_pool_under_200_ratio{sfx}", value=b["ratio"], unit="", config=cfg4,
                            note="prediction", status="predicted"))
    return found, records


# --------------------------------------------------------------------------------------------- policies, LSTM
def policies_against_belady(cases, context_len: int, *, mtp: int, steps: int, batch: int, seed: int, layers,
                            ratio: float = 0.2) -> tuple[list[dict], list[dict]]:
    """Every policy of :data:`ess.policies.POLICIES`, with and without warmup, on one trace per case (``(locality
    model, popularity sigma or None)``), restricted to ``layers``: one row per case (mean misses per policy; the
    case's label under ``"trace model"``) and the records."""
    from ..cachesim import trace_misses
    from ..policies import DEFAULT_HEAT_DECAY, POLICIES
    from ..tracegen import synthetic_trace
    from ..traces import Trace
    from ..validate import non_negative_int, positive_int
    context_len, mtp, steps, batch = (positive_int(n, v) for n, v in (
        ("context_len", context_len), ("mtp", mtp), ("steps", steps), ("batch", batch)))
    seed = non_negative_int("seed", seed)
    model = model_spec(DEFAULT_MODEL)
    rows, records = [], []
    for m, sigma in cases:
        tr = synthetic_trace(Workload(context_len, n_layers=model.n_layers, k=model.index_topk, mtp=mtp, steps=steps,
                                      batch=batch, seed=seed, locality=m, popularity_sigma=sigma))
        sub = Trace(tr.indices[:, layers], tr.context_len, tr.k, tr.mtp, tr.seed, tr.windows[:, layers])
        label = m.label if sigma is None else f"{m.label}, popularity sigma {sigma:g}"
        tag = m.trace_model if sigma is None else f"{m.trace_model}_sigma{sigma:g}"
        row = {"trace model": label}
        for pol in POLICIES:
            for warm in (False, True):
                name = f"{pol}{' + warmup' if warm else ''}"
                row[name] = float(trace_misses(sub, pol, ratio=ratio, warmup=warm).mean())
                records.append(dict(name=f"policy_{pol}_{'warm' if warm else 'cold'}_{tag}", value=row[name],
                                    unit=MISSES_UNIT,
                                    config={**trace_setting(seed), **m.config(), "context_len": context_len,
                                            "ratio": ratio, "mtp": mtp, "steps": steps, "batch": batch,
                                            "layers": list(layers), "popularity_sigma": sigma, "policy": pol,
                                            "warmup": warm, "heat_decay": DEFAULT_HEAT_DECAY}))
        rows.append(row)
    return rows, records


COMPARED_POLICIES = ("lru", "clock", "sampled_clock", "heat", "belady")   # LRU (the paper's) first: the baseline


def recorded_traces() -> dict:
    """Every recorded trace of ``data/traces/`` by file name, whatever its MTP (:func:`ess.studies.locality.real_traces`
    keeps those with one query token per step, the ones the evidence reads)."""
    from ..specs import DATA_DIR
    from ..traces import load_trace
    return {path.stem: load_trace(path) for path in sorted((DATA_DIR / "traces").glob("*.npz"))}


@dataclass
class PolicyComparison:
    """Replacement policies side by side (:func:`policy_comparison`): ``frame`` one row per (source, ratio, warmup,
    policy) -- mean misses per request, layer and step, the hit rate, the difference from LRU in per cent and, for the
    synthetic source, the band of each over the locality models; ``per_layer[source][(ratio, warmup, policy)]``
    misses per layer (n_layers,) (the synthetic source: the central model's); ``records``."""

    frame: pd.DataFrame
    per_layer: dict
    records: list

    def series(self, source: str, warmup: bool, column: str = "vs LRU (%)") -> tuple[list, dict, dict]:
        """``(ratios, {policy: values by ratio}, {policy: (low, high) by ratio})`` of ``column`` for one source
        and warmup setting, for :func:`ess.viz.prefetch.fig_policies_by_ratio` (bands empty for a real trace)."""
        from ..validate import boolean
        warmup = boolean("warmup", warmup)
        sub = self.frame[(self.frame.source == source) & (self.frame.warmup == warmup)]
        ratios = sorted(sub.ratio.unique())
        values, bands = {}, {}
        for pol, g in sub.groupby("policy", sort=False):
            g = g.set_index("ratio").reindex(ratios)
            values[pol] = g[column].to_numpy(float)
            if f"{column} low" in g and g[f"{column} low"].notna().any():
                bands[pol] = (g[f"{column} low"].to_numpy(float), g[f"{column} high"].to_numpy(float))
        return ratios, values, bands


def _compared(policies, warmups) -> list[tuple[bool, str]]:
    """The (warmup, policy) pairs compared: Belady only without warmup (with the warmup windows counted out, its
    farthest-next-use choice is not a bound on the counted steps)."""
    return [(w, p) for w in warmups for p in policies if not (w and p == "belady")]


def policy_comparison(real: dict, models, *, context_len: int, ratios, real_ratios, mtp: int, steps: int,
                      batch: int, band_batch: int, seed: int, layers,
                      policies=COMPARED_POLICIES, warmups=(False, True)) -> PolicyComparison:
    """The replacement ``policies`` (LRU first) on the same traces and pools: each recorded trace of ``real`` (name
    -> :class:`ess.traces.Trace`) at ``real_ratios``, and DeepSeek-V3.2-Exp's synthetic traces at ``context_len``
    and ``ratios`` for the ``layers`` chosen, MTP ``mtp``, ``steps`` decode steps, the central locality model
    (``models[0]``, ``batch`` requests) and the alternatives (``band_batch`` requests each; their spread is the
    band). With and without the warmup windows (``warmups``); Belady without only. Mean misses per request, layer
    and step, hit rate ``1 - misses / selected entries``, and each policy's difference from LRU (per cent of
    LRU's misses); the records of the synthetic source are predictions (status "predicted", with the band), those of
    the real traces computed."""
    from ..cachesim import sweep_synthetic, trace_misses
    from ..layout import pool_slots
    from ..tracegen import locality_profile
    from ..validate import non_negative_int, positive_int
    context_len, mtp, steps, batch, band_batch = (positive_int(n, v) for n, v in (
        ("context_len", context_len), ("mtp", mtp), ("steps", steps), ("batch", batch), ("band_batch", band_batch)))
    seed = non_negative_int("seed", seed)
    if policies[0] != "lru":
        raise ValueError(f"policies must start with 'lru' (the baseline of the differences), got {list(policies)}")
    model = model_spec(DEFAULT_MODEL)
    compared = _compared(policies, warmups)
    rows, per_layer, records = [], {}, []
    columns = ("misses", "hit rate", "vs LRU (%)")

    def add(source, r, w, pol, stats, cfg, band=None):
        """One row and its records; ``stats`` the three columns, ``band`` their (low, high) (synthetic only: a
        prediction)."""
        row = {"source": source, "ratio": r, "warmup": w, "policy": pol, **dict(zip(columns, stats))}
        for c in columns if band else ():
            row[f"{c} low"], row[f"{c} high"] = band[c]
        rows.append(row)
        tag = f"{source}_{pol}_{'warm' if w else 'cold'}_ratio{r:g}"
        def extra(c):
            return {"low": band[c][0], "high": band[c][1], "status": "predicted"} if band else {}
        over = "; band over the locality models" if band else ""
        records.append(dict(name=f"policy_misses_{tag}", value=stats[0], unit=MISSES_UNIT, config=cfg,
                            note="mean misses per request, layer and step" + over, **extra("misses")))
        records.append(dict(name=f"policy_hit_rate_{tag}", value=stats[1], unit="", config=cfg,
                            note="1 - misses / selected entries" + over, **extra("hit rate")))
        if pol != "lru":
            records.append(dict(name=f"policy_vs_lru_{tag}", value=stats[2], unit="% of LRU's misses", config=cfg,
                                note=f"({pol} - lru) / lru misses, measured (not a target)" + over,
                                **extra("vs LRU (%)")))

    for name, tr in real.items():
        sizes = tr.set_sizes()                                                 # (B, layers, steps)
        per_layer[name] = {}
        for r in real_ratios:
            got = {(w, p): trace_misses(tr, p, ratio=r, warmup=w) for w, p in compared}
            for w, p in compared:
                m = got[(w, p)]
                per_layer[name][(r, w, p)] = m.mean(axis=(0, 2))
                lru = got[(w, "lru")].sum()
                stats = (float(m.mean()), float(1 - m.sum() / sizes.sum()), float(100 * (m.sum() - lru) / lru))
                add(name, r, w, p, stats,
                    {"trace": f"data/traces/{name}.npz", "context_len": tr.context_len, "k": tr.k, "mtp": tr.mtp,
                     "steps": tr.steps, "batch": tr.batch, "n_layers": tr.n_layers, "ratio": r,
                     "capacity": pool_slots(model, r, tr.context_len, need=tr.k), "warmup": w, "policy": p})
    source = f"deepseek_{context_len // 1024}k"
    central = models[0]
    profile = {m.name: locality_profile("paper", model.n_layers, m.reading)[list(layers)] for m in models}
    by_model = {}
    for m in models:
        sel = np.zeros((len(layers), steps))
        sweep = sweep_synthetic(Workload(context_len, n_layers=len(layers), profile=profile[m.name], mtp=mtp,
                                         steps=steps, seed=seed, batch=batch if m == central else band_batch,
                                         locality=m),
                                ratios, policies=policies, warmups=warmups, selected=sel)
        by_model[m.name] = {key: (v, sel) for key, v in sweep.items()}
    per_layer[source] = {}
    for r in ratios:
        for w, p in compared:
            stats = {}
            for m in models:
                v, sel = by_model[m.name][(r, p, w)]
                lru = by_model[m.name][(r, "lru", w)][0].sum()
                stats[m.name] = (float(v.mean()), float(1 - v.sum() / sel.sum()), float(100 * (v.sum() - lru) / lru))
            cen = stats[central.name]
            per_layer[source][(r, w, p)] = by_model[central.name][(r, p, w)][0].mean(axis=1)
            band = {c: (min(s[i] for s in stats.values()), max(s[i] for s in stats.values()))
                    for i, c in enumerate(columns)}
            cfg = {**trace_setting(seed), **central.config(), "context_len": context_len, "mtp": mtp, "steps": steps,
                   "batch": batch, "layers": list(layers), "ratio": r,
                   "capacity": pool_slots(model, r, context_len, need=model.index_topk), "warmup": w, "policy": p,
                   **band_setting(models, band_batch)}
            add(source, r, w, p, cen, cfg, band)
    return PolicyComparison(pd.DataFrame(rows), per_layer, records)


def lstm_heat_predictor(context_len: int, locality, *, mtp: int, train_steps: int, test_steps: int, epochs: int,
                        samples: int, seed: int, n_layers: int = 4, history: int = 8, hidden: int = 16):
    """The article's LSTM heat predictor (:class:`ess.heat_predictor.LSTMHeatPredictor`) trained on a trace of
    ``n_layers`` layers generated with another seed (``seed + 1000``) and scored on one of ``seed``: the precision
    of its top-n guesses per layer beside the heat ranking and random guesses. Returns ``(predictor, test trace,
    frame, records)``."""
    from ..heat_predictor import LSTMHeatPredictor, evaluate_predictor
    from ..tracegen import locality_profile, synthetic_trace
    from ..validate import non_negative_int, positive_int
    context_len, mtp, train_steps, test_steps, epochs, samples, n_layers, history, hidden = (
        positive_int(n, v) for n, v in (("context_len", context_len), ("mtp", mtp), ("train_steps", train_steps),
                                        ("test_steps", test_steps), ("epochs", epochs), ("samples", samples),
                                        ("n_layers", n_layers), ("history", history), ("hidden", hidden)))
    seed = non_negative_int("seed", seed)
    K = model_spec(DEFAULT_MODEL).index_topk
    train = synthetic_trace(Workload(context_len, n_layers=n_layers, k=K, mtp=mtp, steps=train_steps, batch=1,
                                     seed=seed + 1000, locality=locality))
    test = synthetic_trace(Workload(context_len, n_layers=n_layers, k=K, mtp=mtp, steps=test_steps, batch=1,
                                    seed=seed, locality=locality))
    lstm = LSTMHeatPredictor(history=history, hidden=hidden, seed=seed).fit(
        [train.indices[0, layer] for layer in range(n_layers)], epochs=epochs, max_samples=samples)
    reports = {layer: evaluate_predictor(lstm, test.indices[0, layer], start=history) for layer in range(n_layers)}
    depth = locality_profile("paper", n_layers, locality.reading)
    frame = pd.DataFrame([{"layer (of 4, spread over 61)": layer, "profile r": depth[layer], "LSTM": r.precision,
                           "heat": r.heat_precision, "random": r.random_precision} for layer, r in reports.items()])
    cfg = {"context_len": context_len, "k": K, "mtp": mtp, "layers": "4 spread over 61", "history": history,
           "hidden": hidden, "train_seed": seed + 1000, "test_seed": seed, "epochs": epochs}
    records = [dict(name="lstm_precision_mean", value=float(frame.LSTM.mean()), unit="", config=cfg),
               dict(name="heat_precision_mean", value=float(frame.heat.mean()), unit="", config=cfg),
               dict(name="random_precision_mean", value=float(frame.random.mean()), unit="", config=cfg)]
    return lstm, test, frame, records


def recorded_trace(*, steps: int, seed: int, context_len: int = 1024, batch: int = 2,
                   query_correlation: float = 0.9, ratio: float = 0.2):
    """A trace recorded from the real lightning indexer and top-K of :mod:`ess.attention` on the ``tiny`` model
    (:func:`ess.studies.locality.record_indexer_trace`, synthetic activations), its adjacent-step overlap per layer
    and its misses under every policy. Returns ``(trace, overlap, misses by policy, records)``."""
    from ..cachesim import trace_misses
    from ..policies import POLICIES
    from .locality import record_indexer_trace
    from ..traces import adjacent_overlap
    tr = record_indexer_trace("tiny", context_len=context_len, steps=steps, batch=batch, mtp=1, warmup_windows=4,
                              query_correlation=query_correlation, seed=seed)
    overlap = adjacent_overlap(tr)
    misses = {pol: float(trace_misses(tr, pol, ratio=ratio, warmup=False).mean()) for pol in POLICIES}
    misses["lru + warmup"] = float(trace_misses(tr, "lru", ratio=ratio, warmup=True).mean())
    cfg = {"model": "tiny", "k": tr.k, "context_len": context_len, "steps": tr.steps, "batch": batch, "mtp": 1,
           "query_correlation": query_correlation, "ratio": ratio, "seed": seed}
    records = [dict(name="recorded_overlap_per_layer", value=overlap, unit="", config=cfg),
               dict(name="recorded_misses_by_policy", value=misses, unit=MISSES_UNIT, config=cfg)]
    return tr, overlap, misses, records


# ------------------------------------------------------------------------------------------- the prefetch classes
# the settings compared on one link: demand loads only, each speculative predictor, warmup sent by the delayed class,
# and the LSTM ranking evictions too
PREFETCH_CLASSES = {
    "demand only (LRU + warmup)": dict(speculative=False, delayed=False, predictor="none", warmup_mode="before"),
    "+ speculative (heat)": dict(speculative=True, delayed=False, predictor="heat", warmup_mode="before"),
    "+ speculative (LSTM)": dict(speculative=True, delayed=False, predictor="lstm", warmup_mode="before"),
    "warmup in the delayed class": dict(speculative=False, delayed=True, predictor="none", warmup_mode="delayed"),
    "LSTM eviction + speculative": dict(speculative=True, delayed=False, predictor="lstm", eviction="predictor",
                                        warmup_mode="before"),
}


def prefetch_classes(trace, lstm, *, context_len: int, mtp: int, ratio: float = 0.2,
                     classes: dict = PREFETCH_CLASSES) -> tuple[dict, list[dict]]:
    """Each setting of ``classes`` (:class:`ess.prefetch.PrefetchConfig` keywords) simulated over ``trace``
    (:func:`ess.prefetch.simulate_prefetch`) with a pool of ``ratio`` and the trained ``lstm`` where a setting
    needs it: ``{setting: summary}`` and the records (hit rate, stall, bytes, link use)."""
    from ..layout import pool_slots
    from ..prefetch import PrefetchConfig, simulate_prefetch
    from ..validate import positive_int
    context_len, mtp = positive_int("context_len", context_len), positive_int("mtp", mtp)
    model = model_spec(DEFAULT_MODEL)
    cap = pool_slots(model, ratio, context_len, need=model.index_topk)
    summaries, records = {}, []
    for name, kw in classes.items():
        pc = PrefetchConfig(cap, **kw)
        r = simulate_prefetch(trace, pc, predictor=lstm if kw["predictor"] == "lstm" else None)
        summaries[name] = r.summary()
        records.append(dict(name=f"classes_{name}",
                            value={k: summaries[name][k] for k in ("hit_rate", "stall_s", "bytes_moved",
                                                                   "bytes_prefetched_unused", "link_use")},
                            unit="", config={"context_len": context_len, "k": model.index_topk, "mtp": mtp,
                                             "ratio": ratio, "capacity": cap, "layers": "4 spread over 61",
                                             "steps": trace.steps,
                                             **{k: v for k, v in asdict(pc).items() if k != "capacity"}}))
    return summaries, records
