# %% [markdown]
# # 04 · Prefetching
#
# **Overview.** How much GPU memory offload frees depends on how often the top-K entries a decode step needs are
# already in the GPU pool. This notebook builds synthetic access traces whose locality rests on **all** the public
# evidence we hold -- the per-layer adjacent-step overlap of the paper's Fig. 2 (read by eye, in both readings of its
# metric), vLLM's 80-90 % hit rate with a buffer of 2 x K, GVR's consecutive-step overlaps, and the shape of traces
# recorded from a real model where they exist -- measures every candidate model against each piece of evidence,
# keeps the one the rule written in advance picks (`data/locality/README.md`), and predicts the paper's held-back
# miss figures with a **band** from the models the evidence leaves open: misses per layer at 32K for ratios
# 0.2 … 0.9, the miss curve of the first 256 decode steps with and without LRU-Warmup, misses against context
# length, and the smallest pool that keeps misses under 200. It also shows how one MTP step's union fills the pool,
# compares the replacement policies with Belady's offline bound, trains the article's LSTM "heat predictor", and
# runs three prefetch classes over one host-to-device link.
#
# **Prerequisites.** Notebook 01 (ratio, byte layouts). The trace models are in `ess.tracegen` (fitted models in
# `data/locality/fit.yaml`, written by `tools/fit_locality.py`), the evidence statistics in
# `ess.studies.locality`, the simulation in `ess.cachesim`, the predictor in `ess.predict`, the prefetch classes in
# `ess.prefetch`. Every miss count here is a **prediction** of `ess` from a synthetic trace model, not a
# measurement on DeepSeek-V3.2-Exp.

# %% [parameters]
smoke = False
results_path = ""
context_len = 32768
ratios = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
mtp = 2
batch = 4
band_batch = 2
steps = 64
curve_steps = 256
curve_ratio = 0.2
context_lens = [32768, 49152, 65536, 98304, 131072]
context_ratio = 0.2
miss_target = 200
pool_steps = 256
pool_batch = 2
seed = 0
probe_steps = 16
hit_steps = 128
union_steps = 8
union_mtps = [2, 4]
pool_resolution_per_context = 64
popularity_sigmas = [1.5]
lstm_train_steps = 48
lstm_test_steps = 32
lstm_epochs = 6
lstm_samples = 30000
recorded_steps = 32
smoke_sizes = {"batch": 2, "band_batch": 1, "steps": 16, "curve_steps": 48, "pool_steps": 48, "pool_batch": 1,
               "context_lens": [32768, 131072], "probe_steps": 8, "hit_steps": 32, "union_steps": 4,
               "pool_resolution_per_context": 16, "popularity_sigmas": [], "lstm_train_steps": 24,
               "lstm_test_steps": 16, "lstm_epochs": 3, "lstm_samples": 10000, "recorded_steps": 8}

# %%
from dataclasses import asdict

import numpy as np
import pandas as pd
from IPython.display import display

import ess
from ess import viz
from ess import cachesim, policies, predict, prefetch, tracegen, traces
from ess.studies import locality as loc
from ess.viz import prefetch as pviz
from ess.widgets.prefetch import prefetch_view, prefetch_widget

viz.use_notebook_renderer()
rec = ess.Recorder("04_prefetching", results_path, smoke=smoke)
if smoke:
    globals().update(smoke_sizes)              # the CI sizes of the parameters cell
model = ess.model_spec("deepseek-v3.2-exp")
K = model.index_topk                       # 2,048 ([DS] indexer top-k, data/models)
LAYERS = model.n_layers                    # 61 ([DS], data/models)
WARMUP_WINDOWS = tracegen.PAPER_WARMUP_WINDOWS
fit = tracegen.locality_fit()              # data/locality/fit.yaml (tools/fit_locality.py)
CENTRAL = tracegen.default_locality()      # chosen by the rule of data/locality/README.md
ALTS = tracegen.locality_alternatives()    # the band: CENTRAL first, then the alternatives the evidence leaves open
UNIFORM = tracegen.LocalityModel("uniform", "uniform", CENTRAL.reading)   # the earlier model, kept for reference
gen_cfg = tracegen.generator_defaults()
base = {"k": K, "n_layers": LAYERS, "warmup_windows": WARMUP_WINDOWS, "seed": seed, "n_sinks": gen_cfg["n_sinks"],
        "local_window": gen_cfg["local_window"], "policy": "lru"}
band_cfg = {"band": [m.config() for m in ALTS], "band_batch": band_batch,
            "band_rule": "data/locality/README.md, Bands"}
print(f"central model: {CENTRAL.label}; band over: " + "; ".join(f"{m.name}: {m.label}" for m in ALTS[1:]))

# %% [markdown]
# ## The evidence
# | | evidence (paper-facts.md) | what it constrains |
# |---|---|---|
# | E1 | paper Fig. 2: adjacent-step top-K overlap per layer, read by eye | each layer's overlap level |
# | E2 | vLLM RFC #48203: 80-90 % LRU hit rate with a 2 x top-k buffer on DeepSeek-V3.2 | how soon entries come back |
# | E3 | NVIDIA GVR: consecutive-step top-2048 overlap 35-50 % in deep layers, ~1-2 % in layers 0-1 | overlap levels |
# | E4 | real traces from a real model in `data/traces/` (when present) | reuse distances, MTP union, union growth |
#
# Fig. 2's metric is ambiguous: the overlap **fraction** `|A & B| / |B|`, or (one summary) the **Jaccard** index
# `|A & B| / |A | B|`, which for two K-sets is the fraction `2J / (1 + J)`. Both readings are candidates.
#
# ## The candidates and what each parameter rests on
# Two models -- **uniform** (new entries drawn uniformly) and **drift** (persistent token scores plus an AR(1)
# noise `n(q) = rho n(q-1) + sqrt(1 - rho^2) eps`; the top of `sqrt(pi) b + sqrt(1 - pi) n(q)` is selected) -- in
# each reading. Each layer's overlap target comes from **E1** in the candidate's reading, and drift's per-layer
# score correlation `c` is solved from it by bisection. Drift's `rho` (one for all layers) is **fitted on E2**: the
# value at which the 2 x K hit rate is 0.85 (the middle of vLLM's range), and, for the band, 0.80 and 0.90
# (`tools/fit_locality.py`; an unreachable target takes the nearer end of [0, 0.95]). E3 and E4 fit nothing: they
# test the candidates. The fitted values:

# %%
rho_fit = pd.DataFrame({rd: {f"rho ({at})": v["rho"] for at, v in fit["drift_rho_fit"]["value"][rd].items()}
                        | {f"2xK hit rate ({at})": v["hit_rate"] for at, v in fit["drift_rho_fit"]["value"][rd].items()}
                        | {f"target reachable ({at})": v["reachable"] for at, v in fit["drift_rho_fit"]["value"][rd].items()}
                        for rd in tracegen.READINGS})
display(rho_fit)
for rd in tracegen.READINGS:
    for at in ("central", "at_80", "at_90"):
        f = fit["drift_rho_fit"]["value"][rd][at]
        rec.record(f"drift_rho_{rd}_{at}", f["rho"], "",
                   config={"reading": rd, "target_hit_rate": loc.FIT_HIT_RATE[at], **fit["setting"]["value"]},
                   source=fit["drift_rho"]["source"],
                   note=f"fitted on vLLM's 2xK hit rate (E2); reached {f['hit_rate']}, target reachable "
                        f"{f['reachable']}")

# %% [markdown]
# ## Each candidate against each piece of evidence
# Setting of every statistic: `data/locality/README.md`. E2 is the 2 x K LRU hit rate at 32K, MTP 1 (the RFC counts
# per top-k selection), warmup, the second half of 128 steps, 2 requests, seed 0. E3 and E1 come from one probe per
# model (32K, MTP 1, `probe_steps` steps, one request, seed 1): GVR's means over layers 2-60 and 0-1, and the largest
# distance of any layer's overlap from its target (raised to the model's floor: sinks, the shifted window and
# chance). E4 runs each model at the geometry of every real trace with that trace's own per-layer overlap as its
# profile and compares three statistics: the 2 x K hit rate, the share of distinct entries among four consecutive
# sets (the MTP-4 union), and the share of entries leaving the set that come back within 8 steps. Smoke mode runs
# E2 over fewer steps and a shorter probe (and so cannot be checked against the fit file).

# %%
real = loc.real_traces()
cands = loc.candidates({rd: tracegen.fitted_drift_rho(rd) for rd in tracegen.READINGS})
extra = [m for m in ALTS if (m.trace_model, m.reading, m.drift_rho) not in
         {(c.trace_model, c.reading, c.drift_rho) for c in cands}]
evidence, probe = loc.measure_evidence(cands + extra, context_len=context_len, probe_steps=probe_steps,
                                       probe_seed=seed + 1, real=real, steps=hit_steps)
if not real:
    print("data/traces/ holds no real trace with one query token per step: E4 is left out of every score")
show = ["trace_model", "reading", "drift_rho", "hit_2k", "gvr_deep", "gvr_shallow", "e1_max_error", "model_hit_2k",
        "model_union4", "model_return8", "d_E2", "d_E3", "d_E4", "score"]
display(evidence[show].round(4))
ev_cfg = {"setting_E2": fit["setting"]["value"], "probe": {"context_len": context_len, "mtp": 1,
          "steps": probe_steps, "batch": 1, "seed": seed + 1}, "real_traces": sorted(real)}
for name, r in evidence.iterrows():
    cfg = {**ev_cfg, "model": name, "trace_model": r.trace_model, "reading": r.reading, "drift_rho": r.drift_rho}
    tag = name.replace("/", "_").replace(" ", "_").replace(".", "")
    rec.record(f"evidence_{tag}_hit_2k", r.hit_2k, "", config=cfg, source="vLLM RFC #48203 via paper-facts.md: 80-90 %",
               note=f"E2: distance to 80-90 % {r.d_E2:.4f}")
    rec.record(f"evidence_{tag}_gvr_deep", r.gvr_deep, "", config=cfg,
               source="NVIDIA GVR via paper-facts.md: 35-50 % in deep layers", note="E3: mean overlap, layers 2-60")
    rec.record(f"evidence_{tag}_gvr_shallow", r.gvr_shallow, "", config=cfg,
               source="NVIDIA GVR via paper-facts.md: ~1-2 % in layers 0-1", note="E3: mean overlap, layers 0-1")
    rec.record(f"evidence_{tag}_e1_max_error", r.e1_max_error, "", config={**cfg, "floor": r.floor},
               note="E1: largest |measured - target| over the layers (target raised to the floor)")
    for st in loc.SHAPE_STATS:
        if r[f"model_{st}"] is not None and not pd.isna(r[f"model_{st}"]):
            rec.record(f"evidence_{tag}_shape_{st}", r[f"model_{st}"], "", config=cfg,
                       note=f"E4: the model at the real traces' geometry; real traces {r[f'real_{st}']:.4f}")
    rec.record(f"evidence_{tag}_score", r.score, "", config=cfg,
               note=f"d_E2 {r.d_E2:.4f} + d_E3 {r.d_E3:.4f} + d_E4 {r.d_E4 if r.d_E4 is not None else 'n/a'}")
cen = evidence.loc[f"{CENTRAL.trace_model}/{CENTRAL.reading}"]                # the central model under plain names
for stat in ("hit_2k", "gvr_deep", "gvr_shallow", "e1_max_error", "score"):
    rec.record(f"locality_central_{stat}", cen[stat], "", config={**ev_cfg, **CENTRAL.config()},
               note=f"the central locality model's {stat} (see the evidence_* records for every candidate)")
rec.record("locality_central_drift_rho", CENTRAL.drift_rho, "", config=CENTRAL.config(),
           note="calibrated on vLLM's 2xK hit rate (E2); None for the uniform model", status="calibrated")
scores = {(r.trace_model, r.reading): r.score for n, r in evidence.iterrows() if n in {c.name for c in cands}}
chosen = loc.choose_locality(scores)
rec.record("locality_model_chosen", "/".join(chosen), "", config={"rule": "data/locality/README.md", **ev_cfg,
           "scores": {"/".join(k): v for k, v in scores.items()}})
assert chosen == (CENTRAL.trace_model, CENTRAL.reading), (chosen, CENTRAL)     # the data file's default is the rule's
assert evidence.e1_max_error.max() < 0.03, evidence.e1_max_error              # every model meets E1 (calibrated)
if not smoke:                                                                  # the fit file holds: nothing drifted
    for name, r in evidence.iterrows():
        if name in fit["evidence"]["value"]:
            f = fit["evidence"]["value"][name]
            assert abs(r.hit_2k - f["hit_2k"]) < 2e-3 and abs(r.gvr_deep - f["gvr_deep"]) < 5e-3, (name, r, f)
print(f"chosen: {chosen[0]} with the {chosen[1]} reading (scores: "
      + ", ".join(f"{'/'.join(k)} {v:.3f}" for k, v in scores.items()) + ")")

# %%
profile = tracegen.locality_profile("paper", LAYERS, CENTRAL.reading)
pviz.fig_locality_profile(profile, {f"measured, {n}": probe[n] for n in evidence.index}).show()
VLLM_LOW, VLLM_HIGH = loc.VLLM_BUFFER_2K_HIT_RATE
pviz.fig_hit_rate_against_range({(f"{n} (central)" if n == CENTRAL.name else n): h
                                 for n, h in evidence.hit_2k.items()}, VLLM_LOW, VLLM_HIGH,
                                source="vLLM RFC #48203: 80-90 %",
                                title="LRU hit rate, pool 2 x K, 32K, MTP 1 (E2)").show()

# %% [markdown]
# ## MTP: one step selects the union of its query tokens' sets
# With MTP the step's `mtp` query tokens each select K entries; the pool holds their union and the misses count
# each entry once. How large is the union? Each further token adds at most the `(1 - r) K` entries the previous one
# lacked on average (`ess.layout.step_entries`, the pool-size need per layer). The central model's measured unions
# (32K, `union_steps` steps, one request) are set beside that bound: on average well below it (entries come back
# within a step), a single step at most a few per cent above it (its tokens overlapped less than the layer's mean;
# the pool takes up to `ess.cachesim.STEP_SLACK` more). A ratio's slots are shared over the layers so that each
# layer's pool holds its step (`ess.layout.layer_pool_slots`).

# %%
union_rows = []
for t in union_mtps:
    tr = tracegen.synthetic_trace(context_len, mtp=t, steps=union_steps, batch=1, seed=seed, **CENTRAL.kwargs())
    size = tr.set_sizes()[0].mean(axis=1)                                    # (layers,) mean union per step
    bound = ess.layout.step_entries(model, context_len, t, overlap=profile)
    excess = float((tr.set_sizes()[0].max(axis=1) / bound).max() - 1)
    assert excess <= cachesim.STEP_SLACK, ("a step's union exceeds its layer's bound by more than the slack", excess)
    union_rows.append({"mtp": t, "mean union": size.mean(), "bound (mean over layers)": bound.mean(),
                       "layer 0 union": size[0], "largest layer bound": bound.max(), "t x K": t * K,
                       "largest step over its bound": excess})
    rec.record(f"mtp{t}_union_mean", float(size.mean()), "entries/request/layer/step",
               config={**base, **CENTRAL.config(), "context_len": context_len, "mtp": t, "steps": union_steps,
                       "batch": 1}, note=f"bound (step_entries, mean over layers) {bound.mean():.0f}; {t} x K = {t * K}")
display(pd.DataFrame(union_rows).round(1))

# %% [markdown]
# ## Prediction 1: misses per layer at 32K, ratios 0.2 … 0.9, with a band
# LRU with warmup (32 windows), MTP 2 as in the paper's Table 1, pool = floor(ratio × 32,768) slots per request and
# layer (32K is a whole number of 64-token pages; `ess.layout.pool_slots`; no layer needs more than its share at
# MTP 2 for these ratios). Each (request, layer) trace is generated once and simulated at every ratio. The central
# model runs `batch` requests; the band's alternatives `band_batch` (their spread, not their noise, is the band).
# The earlier `uniform` model's means are recorded with `_uniform` appended.

# %%
per_ratio = {}
for m in ALTS:
    sweep = cachesim.sweep_synthetic(context_len, ratios, mtp=mtp, steps=steps, seed=seed,
                                     batch=batch if m == CENTRAL else band_batch, **m.kwargs())
    per_ratio[m.name] = {r: sweep[(r, "lru", True)].mean(axis=1) for r in ratios}
uni = cachesim.sweep_synthetic(context_len, ratios, mtp=mtp, steps=steps, batch=batch, seed=seed, **UNIFORM.kwargs())
central = per_ratio[CENTRAL.name]
band = {r: (np.min([per_ratio[m.name][r] for m in ALTS], axis=0), np.max([per_ratio[m.name][r] for m in ALTS], axis=0))
        for r in ratios}
cfg1 = {**base, **CENTRAL.config(), "context_len": context_len, "mtp": mtp, "steps": steps, "batch": batch,
        "warmup": True, **band_cfg}
for r in ratios:
    cfg_r = {**cfg1, "ratio": r, "capacity": ess.layout.pool_slots(model, r, context_len, need=K)}
    note = "held-back result of the paper (per-layer miss counts): prediction"
    rec.record(f"misses_per_layer_32k_ratio{r:g}", central[r], "misses/request/layer/step", config=cfg_r, note=note,
               status="held back (predicted)")
    rec.record(f"misses_per_layer_32k_ratio{r:g}_low", band[r][0], "misses/request/layer/step", config=cfg_r,
               note="the band's low end per layer: " + note, status="held back (predicted)")
    rec.record(f"misses_per_layer_32k_ratio{r:g}_high", band[r][1], "misses/request/layer/step", config=cfg_r,
               note="the band's high end per layer: " + note, status="held back (predicted)")
    means = [per_ratio[m.name][r].mean() for m in ALTS]
    rec.record(f"misses_mean_32k_ratio{r:g}", float(central[r].mean()), "misses/request/layer/step", config=cfg_r,
               note="prediction; band over the locality models", low=float(min(means)), high=float(max(means)),
               status="predicted")
    rec.record(f"misses_mean_32k_ratio{r:g}_uniform", float(uni[(r, "lru", True)].mean()),
               "misses/request/layer/step", config={**cfg_r, **UNIFORM.config()}, note="the earlier uniform model")
mc = [central[r].mean() for r in ratios]
assert all(a >= b for a, b in zip(mc, mc[1:])), mc          # a larger pool never misses more
assert central[ratios[0]][0] == max(central[ratios[0]]), "layer 0 (no locality) misses most"
assert all((band[r][0] <= central[r] + 1e-9).all() and (central[r] <= band[r][1] + 1e-9).all() for r in ratios)
pviz.fig_misses_per_layer(central, bands=band,
                          title=f"Misses per layer at 32K, MTP {mtp}, LRU + warmup ({CENTRAL.label}; band)").show()
pd.DataFrame({"ratio": ratios, "pool slots": [ess.layout.pool_slots(model, r, context_len, need=K) for r in ratios],
              "mean misses (central)": np.round(mc, 1),
              **{f"mean misses ({m.name})": [round(per_ratio[m.name][r].mean(), 1) for r in ratios] for m in ALTS[1:]},
              "mean misses (uniform)": [round(uni[(r, "lru", True)].mean(), 1) for r in ratios],
              "layer 0 (central)": [round(central[r][0], 1) for r in ratios]})

# %% [markdown]
# ## Prediction 2: the first 256 decode steps with and without warmup, with a band
# MTP 1, ratio 0.2, 32K, LRU; the curve is the mean over layers and requests of the misses of each step. Without
# warmup the pool starts empty, so step 0 misses every selected entry.

# %%
curves = {}
for m in ALTS:
    res = cachesim.sweep_synthetic(context_len, [curve_ratio], warmups=(True, False), mtp=1, steps=curve_steps,
                                   seed=seed, batch=batch if m == CENTRAL else band_batch, **m.kwargs())
    curves[m.name] = {w: res[(curve_ratio, "lru", w)].mean(axis=0) for w in (True, False)}
    if m == CENTRAL:
        per_layer_first = res                                          # (layers, steps) with and without warmup
cfg2 = {**base, **CENTRAL.config(), "context_len": context_len, "mtp": 1, "ratio": curve_ratio, "steps": curve_steps,
        "batch": batch, **band_cfg}
tail = slice(curve_steps // 2, None)
curve_sets, curve_bands = {}, {}
for w, label in ((True, "with"), (False, "without")):
    c = curves[CENTRAL.name][w]
    lo = np.min([curves[m.name][w] for m in ALTS], axis=0)
    hi = np.max([curves[m.name][w] for m in ALTS], axis=0)
    note = "held-back result of the paper (warmup curves): prediction"
    rec.record(f"warmup_curve_{label}", c, "misses/request/layer", config={**cfg2, "warmup": w}, note=note,
               status="held back (predicted)")
    rec.record(f"warmup_curve_{label}_low", lo, "misses/request/layer", config={**cfg2, "warmup": w},
               note="the band's low end per step: " + note, status="held back (predicted)")
    rec.record(f"warmup_curve_{label}_high", hi, "misses/request/layer", config={**cfg2, "warmup": w},
               note="the band's high end per step: " + note, status="held back (predicted)")
    firsts = [curves[m.name][w][0] for m in ALTS]
    rec.record(f"first_step_misses_{label}_warmup", float(c[0]), "misses/request/layer", config={**cfg2, "warmup": w},
               note="prediction; band over the locality models", low=float(min(firsts)), high=float(max(firsts)),
               status="predicted")
    curve_sets[f"LRU, {label} warmup"] = c
    curve_bands[f"LRU, {label} warmup"] = (lo, hi)
steady = [curves[m.name][True][tail].mean() for m in ALTS]
rec.record("steady_misses_mtp1_ratio0.2", float(curves[CENTRAL.name][True][tail].mean()), "misses/request/layer/step",
           config={**cfg2, "warmup": True, "window": f"steps {curve_steps // 2}..{curve_steps - 1}"},
           note="prediction; band over the locality models", low=float(min(steady)), high=float(max(steady)),
           status="predicted")
settle = {m.name: int(np.argmax(curves[m.name][False] <= 1.1 * curves[m.name][True][tail].mean())) for m in ALTS}
rec.record("steps_to_settle_without_warmup", settle[CENTRAL.name], "steps", config=cfg2,
           note="first step whose misses are within 10 % of the steady state with warmup; band over the models",
           low=min(settle.values()), high=max(settle.values()))
with_w, without_w = curves[CENTRAL.name][True], curves[CENTRAL.name][False]
assert without_w[0] >= K * 0.99 and with_w[0] < 0.5 * without_w[0], (with_w[0], without_w[0])
assert np.all(per_layer_first[(curve_ratio, "lru", True)][:, 0] <= per_layer_first[(curve_ratio, "lru", False)][:, 0])
print(f"central: first step {with_w[0]:.0f} (warmup) vs {without_w[0]:.0f} (none); steady "
      f"{with_w[tail].mean():.0f}; settles after {settle[CENTRAL.name]} steps without warmup")
pviz.fig_warmup_curve(curve_sets, bands=curve_bands,
                      title=f"Misses per step, 32K, MTP 1, ratio {curve_ratio} ({CENTRAL.label}; band)").show()

# %% [markdown]
# ## Prediction 3: misses against context length at a fixed ratio
# Ratio 0.2, MTP 2, LRU + warmup, the central model and (for reference) the earlier uniform one. A longer context
# has a larger pool at the same ratio but also more tokens to choose from. The drift model is calibrated at each
# context length (Fig. 2's overlap is nearly independent of it).

# %%
by_ctx = {}
for m in (CENTRAL, UNIFORM):
    by_ctx[m.name] = [float(cachesim.misses_per_layer(L, context_ratio, mtp=mtp, steps=steps, batch=batch, seed=seed,
                                                       **m.kwargs()).mean()) for L in context_lens]
    sfx = "" if m == CENTRAL else "_uniform"
    for L, v in zip(context_lens, by_ctx[m.name]):
        rec.record(f"misses_mean_ratio{context_ratio:g}_{L // 1024}k{sfx}", v, "misses/request/layer/step",
                   config={**base, **m.config(), "ratio": context_ratio, "mtp": mtp, "steps": steps, "batch": batch,
                           "warmup": True, "context_len": L}, note="prediction", status="predicted")
pviz.fig_misses_vs_context(context_lens, {f"{m.label}": by_ctx[m.name] for m in (CENTRAL, UNIFORM)},
                           ratio=context_ratio).show()

# %% [markdown]
# ## Prediction 4: the smallest pool with fewer than 200 misses on average
# Bisection over the pool size (slots per request and layer) at 32K, MTP 2, LRU + warmup; average = mean over
# layers, requests and the first 256 decode steps (the pool starts with the warmup windows only, so the first loads
# of entries count). The search stops at a resolution of 1/64 of the context (smoke: 1/16, one request, 48 steps).

# %%
res_slots = context_len // pool_resolution_per_context
best = {}
for m in (CENTRAL, UNIFORM):
    sfx = "" if m == CENTRAL else "_uniform"
    cfg4 = {**base, **m.config(), "context_len": context_len, "mtp": mtp, "steps": pool_steps, "batch": pool_batch,
            "warmup": True, "target": miss_target, "resolution_slots": res_slots}
    try:
        best[m.name] = cachesim.smallest_pool(context_len, miss_target, resolution=res_slots, mtp=mtp,
                                              steps=pool_steps, batch=pool_batch, seed=seed, **m.kwargs())
    except ValueError as exc:            # even the whole context misses too much: first loads dominate few steps
        assert smoke, exc                # over the full 256 steps both models must reach the target
        rec.record(f"smallest_pool_under_200_slots{sfx}", None, "slots/request/layer", config=cfg4,
                   note=f"not reachable in this (smoke) configuration: {exc}")
        print(f"{m.label}: {exc}")
        continue
    b = best[m.name]
    assert b["below_misses"] is None or b["misses"] < miss_target <= b["below_misses"], b
    below = ("" if b["below_slots"] is None else
             f", {b['below_misses']:.1f} at {b['below_slots']} slots")
    rec.record(f"smallest_pool_under_200_slots{sfx}", b["slots"], "slots/request/layer", config=cfg4,
               note=f"{b['misses']:.1f} misses at this size{below}: prediction", status="predicted")
    rec.record(f"smallest_pool_under_200_ratio{sfx}", b["ratio"], "", config=cfg4, note="prediction",
               status="predicted")
    print(f"{m.label}: smallest pool with < {miss_target} misses: {b['slots']} slots (ratio {b['ratio']:.3f}); "
          f"{b['misses']:.1f} misses there{below}")

# %% [markdown]
# ## Policies against Belady's bound
# Same trace for every policy: 32K, ratio 0.2, MTP 2, every 6th layer. Belady evicts the entry used farthest in
# the future; it needs the future, so it is a bound, not a policy. Without warmup every policy starts from the
# same empty pool and none can beat it (a test checks this on random traces). The heat policy evicts the entry
# with the smallest decayed access count since it was loaded (decay 0.5 per step, a design choice; ties go to the
# least recently used).
#
# The trace model matters: with uniformly drawn new entries nothing but recency can be learnt; with persistent
# scores (drift) or a popularity skew (`popularity_sigma` of the uniform model, a design choice, not calibrated)
# entries return and frequency-aware policies can gain.

# %%
layer_pick = list(range(0, LAYERS, 6))
pol_rows = []
pol_cases = [(CENTRAL, None), (UNIFORM, 0.0)] + [(UNIFORM, sigma) for sigma in popularity_sigmas]
for m, sigma in pol_cases:
    tr = tracegen.synthetic_trace(context_len, n_layers=LAYERS, k=K, mtp=mtp, steps=steps, batch=min(batch, 2),
                                  seed=seed, **m.kwargs(), **({} if sigma is None else {"popularity_sigma": sigma}))
    sub = traces.Trace(tr.indices[:, layer_pick], tr.context_len, tr.k, tr.mtp, tr.seed, tr.windows[:, layer_pick])
    tm = m.trace_model
    label = m.label if sigma is None else f"{m.label}, popularity sigma {sigma:g}"
    tag = tm if sigma is None else f"{tm}_sigma{sigma:g}"
    row = {"trace model": label}
    for pol in policies.POLICIES:
        for warm in (False, True):
            name = f"{pol}{' + warmup' if warm else ''}"
            row[name] = float(cachesim.trace_misses(sub, pol, ratio=0.2, warmup=warm).mean())
            rec.record(f"policy_{pol}_{'warm' if warm else 'cold'}_{tag}", row[name],
                       "misses/request/layer/step",
                       config={**base, **m.config(), "context_len": context_len, "ratio": 0.2, "mtp": mtp, "steps": steps,
                               "batch": min(batch, 2), "layers": layer_pick, "popularity_sigma": sigma,
                               "policy": pol, "warmup": warm, "heat_decay": policies.DEFAULT_HEAT_DECAY})
    assert all(row["belady"] <= row[p] for p in ("lru", "fifo", "heat")), row
    pol_rows.append(row)
    pviz.fig_policies({k: v for k, v in row.items() if k != "trace model"}, bound="belady",
                      title=f"Policies at 32K, ratio 0.2, MTP {mtp}, {label}").show()
pd.DataFrame(pol_rows).round(1)

# %% [markdown]
# ## The LSTM heat predictor
# A one-layer LSTM (16 units) reads, for each entry, its selections and decayed heat over the last 8 steps and
# predicts whether the next step selects it. It is trained on a trace generated with another seed and scored on
# this one: precision of its top-n guesses (n = the next step's size), beside random guesses and the heat ranking.

# %%
ptr_train = tracegen.synthetic_trace(context_len, n_layers=4, k=K, mtp=mtp, steps=lstm_train_steps, batch=1,
                                     seed=seed + 1000, **CENTRAL.kwargs())
ptr_test = tracegen.synthetic_trace(context_len, n_layers=4, k=K, mtp=mtp, steps=lstm_test_steps, batch=1,
                                    seed=seed, **CENTRAL.kwargs())
lstm = predict.LSTMHeatPredictor(history=8, hidden=16, seed=seed).fit(
    [ptr_train.indices[0, l] for l in range(4)], epochs=lstm_epochs, max_samples=lstm_samples)
reports = {l: predict.evaluate_predictor(lstm, ptr_test.indices[0, l], start=8) for l in range(4)}
depth = tracegen.locality_profile("paper", 4, CENTRAL.reading)
pred_df = pd.DataFrame([{"layer (of 4, spread over 61)": l, "profile r": depth[l], "LSTM": r.precision,
                         "heat": r.heat_precision, "random": r.random_precision} for l, r in reports.items()])
cfg5 = {"context_len": context_len, "k": K, "mtp": mtp, "layers": "4 spread over 61", "history": 8, "hidden": 16,
        "train_seed": seed + 1000, "test_seed": seed, "epochs": lstm_epochs}
rec.record("lstm_precision_mean", float(pred_df.LSTM.mean()), "", config=cfg5)
rec.record("heat_precision_mean", float(pred_df.heat.mean()), "", config=cfg5)
rec.record("random_precision_mean", float(pred_df.random.mean()), "", config=cfg5)
assert pred_df.LSTM.mean() > 2 * pred_df.random.mean(), pred_df
pred_df.round(3)

# %% [markdown]
# ## A recorded trace
# `TraceRecorder` captures index sets from a sparse-attention implementation. Here it records the real lightning
# indexer and top-K of `ess.attention` on the `tiny` model's shapes (4 layers, K = 64) with synthetic activations
# (random keys; queries that drift as an AR(1) walk with correlation 0.9, a design choice: there is no trained
# model). The recorded trace goes through the same simulation.

# %%
rtr = loc.record_indexer_trace("tiny", context_len=1024, steps=recorded_steps, batch=2, mtp=1,
                                  warmup_windows=4, query_correlation=0.9, seed=seed)
r_overlap = traces.adjacent_overlap(rtr)
r_rows = {pol: float(cachesim.trace_misses(rtr, pol, ratio=0.2, warmup=False).mean()) for pol in policies.POLICIES}
r_rows["lru + warmup"] = float(cachesim.trace_misses(rtr, "lru", ratio=0.2, warmup=True).mean())
cfg_r = {"model": "tiny", "k": rtr.k, "context_len": 1024, "steps": rtr.steps, "batch": 2, "mtp": 1,
         "query_correlation": 0.9, "ratio": 0.2, "seed": seed}
rec.record("recorded_overlap_per_layer", r_overlap, "", config=cfg_r)
rec.record("recorded_misses_by_policy", r_rows, "misses/request/layer/step", config=cfg_r)
assert r_rows["belady"] <= min(r_rows["lru"], r_rows["fifo"], r_rows["heat"]), r_rows
assert r_overlap.mean() > 3 * rtr.k / 1024, r_overlap          # more overlap than independent random sets
pd.DataFrame({"misses per step": r_rows}).round(2)

# %% [markdown]
# ## Three prefetch classes on one link
# Immediate (the step's misses; the step waits), speculative (predicted next-step entries, in the link time while
# the step computes) and delayed (background: here the warmup windows). Link 37 GB/s (FlashTrans H2D, [BLOG]);
# per-step link time per (request, layer) 23.1 µs = 73.3 ms step / 61 layers / batch 52 (derived from the
# calibration row of Table 2). Same trace as above (4 layers, one request), ratio 0.2.

# %%
cap = ess.layout.pool_slots(model, 0.2, context_len, need=K)
class_cfgs = {
    "demand only (LRU + warmup)": dict(speculative=False, delayed=False, predictor="none", warmup_mode="before"),
    "+ speculative (heat)": dict(speculative=True, delayed=False, predictor="heat", warmup_mode="before"),
    "+ speculative (LSTM)": dict(speculative=True, delayed=False, predictor="lstm", warmup_mode="before"),
    "warmup in the delayed class": dict(speculative=False, delayed=True, predictor="none", warmup_mode="delayed"),
    "LSTM eviction + speculative": dict(speculative=True, delayed=False, predictor="lstm", eviction="predictor",
                                        warmup_mode="before"),
}
summaries = {}
for name, kw in class_cfgs.items():
    pc = prefetch.PrefetchConfig(cap, **kw)
    r = prefetch.simulate_prefetch(ptr_test, pc, predictor=lstm if kw["predictor"] == "lstm" else None)
    summaries[name] = r.summary()
    rec.record(f"classes_{name}", {k: summaries[name][k] for k in ("hit_rate", "stall_s", "bytes_moved",
                                                                  "bytes_prefetched_unused", "link_use")}, "",
               config={"context_len": context_len, "k": K, "mtp": mtp, "ratio": 0.2, "capacity": cap,
                       "layers": "4 spread over 61", "steps": ptr_test.steps, **{k: v for k, v in
                       asdict(pc).items() if k != "capacity"}})
demand = summaries["demand only (LRU + warmup)"]
assert demand["bytes_speculative"] == demand["bytes_delayed"] == 0
pviz.fig_prefetch_classes(summaries).show()
pd.DataFrame(summaries).T[["hit_rate", "stall_s", "bytes_moved", "bytes_speculative", "bytes_delayed",
                           "bytes_prefetched_unused", "link_use"]].round(4)

# %% [markdown]
# ## Try it: the speculative class, where the warmup windows go, pool and link
# The note under the summary says what the warmup setting does to the first steps. Needs a running kernel; the
# default view is drawn below.

# %%
fig, s = prefetch_view()
fig.show()
prefetch_widget()

# %%
saved = rec.save()
rec.to_frame()[["name", "unit", "note"]]

# %% [markdown]
# ## Summary
# * Two trace models reproduce the per-layer overlap of the paper's Fig. 2 (as read by eye): `uniform` exactly,
#   `drift` within 0.02 per layer after its one calibrated quantity per layer (the score correlation of adjacent
#   query tokens). Layer 0, with no locality, dominates the misses at every ratio under both.
# * By the rule fixed in advance, the default is the model whose 2 × K LRU hit rate is closer to vLLM's 80–90 %:
#   `drift` (its hit rate and `uniform`'s are printed and recorded above). Drift still sits below that range;
#   its design choice `rho` moves it (full mode shows `rho` = 0 and 0.9), so the trace model stays the main
#   uncertainty of every miss count here, and a recorded trace from the real model can replace both.
# * Predicted held-back figures (configurations, including `trace_model`, in `build/results/04_prefetching.json`;
#   the default model's under the plain names, the other's with `_uniform` or `_drift` appended): misses per layer
#   at 32K for ratios 0.2 … 0.9, the first 256 steps with and without warmup, misses against context length at
#   ratio 0.2, and the smallest pool with fewer than 200 misses on average. With drift, the layers of high overlap
#   miss far fewer entries than under uniform, and a longer context misses fewer at the same ratio, as the paper
#   reports qualitatively; under uniform the misses barely depend on the context.
# * Under `uniform` nothing but recency can be learnt: LRU, FIFO and heat are nearly the same. Under `drift`
#   entries return, the heat policy edges ahead of LRU and FIFO falls behind, and Belady's bound stays well below
#   all of them.
#
# **Next:** these miss counts feed the throughput simulator (`ess.cachesim.misses_per_layer`, default trace model).
