# %% [markdown]
# # 04 · Prefetching
#
# * **Question.** How many of a step's top-K entries miss the GPU pool (per layer, over the first decode steps,
#   against the context and the pool size), and which replacement and prefetch policies lower that?
# * **Method.** Synthetic trace models measured against every piece of public locality evidence, one chosen by a rule
#   written in advance and the others kept as a band; cache simulations of the paper's held-back miss figures;
#   policies against Belady's bound; an LSTM heat predictor and three prefetch classes.
# * **Where the answer is.** The paper's held-back miss figures, predicted, are the sections *Prediction 1* to
#   *Prediction 4*, in the middle of the notebook after the evidence and the candidate models; the policies in
#   *Policies against Belady's bound* and the section after it; prefetching in *Three prefetch classes on one link*;
#   every number on the book's results page; the conclusions under *Summary*.
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
# **Prerequisites.** Notebook 01 (ratio, byte layouts). The trace generators are in `ess.tracegen`, the locality models in `ess.locality` (fitted in
# `data/locality/fit.yaml`, written by `tools/fit_locality.py`), the evidence statistics in
# `ess.studies.locality`, the simulation in `ess.cachesim`, the predictor in `ess.heat_predictor`, the prefetch
# classes in `ess.prefetch`; `ess.studies.prefetching` runs each study below and returns its frames, bands and
# records (with their configurations). Every miss count here is a **prediction** of `ess` from a synthetic trace
# model, not a measurement on DeepSeek-V3.2-Exp.

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
policy_ratios = [0.125, 0.2, 0.5]
policy_layer_stride = 6
policy_batch = 2
lstm_train_steps = 48
lstm_test_steps = 32
lstm_epochs = 6
lstm_samples = 30000
recorded_steps = 32
# the CI sizes: `ess reproduce --smoke` injects them as parameters (ess.parameters.smoke_sizes)
smoke_sizes = {"batch": 2, "band_batch": 1, "steps": 16, "curve_steps": 48, "pool_steps": 48, "pool_batch": 1,
               "context_lens": [32768, 131072], "probe_steps": 8, "hit_steps": 32, "union_steps": 4,
               "pool_resolution_per_context": 16, "popularity_sigmas": [],
               "policy_ratios": [0.125, 0.5], "policy_layer_stride": 20, "policy_batch": 1, "lstm_train_steps": 24,
               "lstm_test_steps": 16, "lstm_epochs": 3, "lstm_samples": 10000, "recorded_steps": 8}

# %% [hide-input]
import numpy as np
import pandas as pd
from IPython.display import display

import ess
from ess import viz
from ess import cachesim, locality, tracegen
from ess.studies import locality as loc
from ess.studies import prefetching as tp
from ess.viz import prefetch as pviz
from ess.widgets.prefetch import prefetch_view, prefetch_widget

viz.use_notebook_renderer()
rec = ess.Recorder("04_prefetching", results_path, smoke=smoke)
model = ess.model_spec("deepseek-v3.2-exp")
K = model.index_topk                       # 2,048 ([DS] indexer top-k, data/models)
LAYERS = model.n_layers                    # 61 ([DS], data/models)
fit = locality.locality_fit()              # data/locality/fit.yaml (tools/fit_locality.py)
CENTRAL = locality.default_locality()      # chosen by the rule of data/locality/README.md
ALTS = locality.locality_alternatives()    # the band: CENTRAL first, then the alternatives the evidence leaves open
UNIFORM = locality.LocalityModel("uniform", "uniform", CENTRAL.reading)   # the earlier model, kept for reference
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
rho_fit, records = tp.drift_rho_fit(fit)
display(rho_fit)
for r in records:
    rec.record(**r)

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
cands = loc.candidates({rd: locality.fitted_drift_rho(rd) for rd in locality.READINGS})
extra = [m for m in ALTS if (m.trace_model, m.reading, m.drift_rho) not in
         {(c.trace_model, c.reading, c.drift_rho) for c in cands}]
evidence, probe = loc.measure_evidence(cands + extra, context_len=context_len, probe_steps=probe_steps,
                                       probe_seed=seed + 1, real=real, steps=hit_steps)
if not real:
    print("data/traces/ holds no real trace with one query token per step: E4 is left out of every score")
show = ["trace_model", "reading", "drift_rho", "hit_2k", "gvr_deep", "gvr_shallow", "e1_max_error", "model_hit_2k",
        "model_union4", "model_return8", "d_E2", "d_E3", "d_E4", "score"]
display(evidence[show].round(4))
scores = {(r.trace_model, r.reading): r.score for n, r in evidence.iterrows() if n in {c.name for c in cands}}
chosen = loc.choose_locality(scores)
setting = tp.evidence_setting(fit, context_len=context_len, probe_steps=probe_steps, probe_seed=seed + 1, real=real)
for r in tp.evidence_records(evidence, setting, CENTRAL, scores, chosen):
    rec.record(**r)
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
unions, records = tp.mtp_unions(context_len, union_mtps, steps=union_steps, seed=seed, locality=CENTRAL)
for r in records:
    rec.record(**r)
assert (unions["largest step over its bound"] <= cachesim.STEP_SLACK).all(), \
    ("a step's union exceeds its layer's bound by more than the slack", unions)
display(unions.round(1))

# %% [markdown]
# ## Prediction 1: misses per layer at 32K, ratios 0.2 … 0.9, with a band
# LRU with warmup (32 windows), MTP 2 as in the paper's Table 1, pool = floor(ratio × 32,768) slots per request and
# layer (32K is a whole number of 64-token pages; `ess.layout.pool_slots`; no layer needs more than its share at
# MTP 2 for these ratios). Each (request, layer) trace is generated once and simulated at every ratio. The central
# model runs `batch` requests; the band's alternatives `band_batch` (their spread, not their noise, is the band).
# The earlier `uniform` model's means are recorded with `_uniform` appended.

# %%
p1 = tp.misses_by_ratio(context_len, ratios, ALTS, UNIFORM, mtp=mtp, steps=steps, seed=seed, batch=batch,
                        band_batch=band_batch)
for r in p1.records:
    rec.record(**r)
central, band = p1.per_ratio[CENTRAL.name], p1.band
mc = [central[r].mean() for r in ratios]
assert all(a >= b for a, b in zip(mc, mc[1:])), mc          # a larger pool never misses more
assert central[ratios[0]][0] == max(central[ratios[0]]), "layer 0 (no locality) misses most"
assert all((band[r][0] <= central[r] + 1e-9).all() and (central[r] <= band[r][1] + 1e-9).all() for r in ratios)
pviz.fig_misses_per_layer(central, bands=band,
                          title=f"Misses per layer at 32K, MTP {mtp}, LRU + warmup ({CENTRAL.label}; band)").show()
p1.frame

# %% [markdown]
# ## Prediction 2: the first 256 decode steps with and without warmup, with a band
# MTP 1, ratio 0.2, 32K, LRU; the curve is the mean over layers and requests of the misses of each step. Without
# warmup the pool starts empty, so step 0 misses every selected entry.

# %%
p2 = tp.warmup_curves(context_len, curve_ratio, ALTS, steps=curve_steps, seed=seed, batch=batch,
                      band_batch=band_batch)
for r in p2.records:
    rec.record(**r)
with_w, without_w = p2.curves[CENTRAL.name][True], p2.curves[CENTRAL.name][False]
first = p2.per_layer_first
assert without_w[0] >= K * 0.99 and with_w[0] < 0.5 * without_w[0], (with_w[0], without_w[0])
assert np.all(first[(curve_ratio, "lru", True)][:, 0] <= first[(curve_ratio, "lru", False)][:, 0])
print(f"central: first step {with_w[0]:.0f} (warmup) vs {without_w[0]:.0f} (none); steady "
      f"{with_w[p2.tail].mean():.0f}; settles after {p2.settle[CENTRAL.name]} steps without warmup")
curve_sets, curve_bands = p2.series()
pviz.fig_warmup_curve(curve_sets, bands=curve_bands,
                      title=f"Misses per step, 32K, MTP 1, ratio {curve_ratio} ({CENTRAL.label}; band)").show()

# %% [markdown]
# ## Prediction 3: misses against context length at a fixed ratio
# Ratio 0.2, MTP 2, LRU + warmup, the central model and (for reference) the earlier uniform one. A longer context
# has a larger pool at the same ratio but also more tokens to choose from. The drift model is calibrated at each
# context length (Fig. 2's overlap is nearly independent of it).

# %%
by_ctx, records = tp.misses_by_context(context_lens, context_ratio, (CENTRAL, UNIFORM), mtp=mtp, steps=steps,
                                       batch=batch, seed=seed)
for r in records:
    rec.record(**r)
pviz.fig_misses_vs_context(context_lens, {f"{m.label}": by_ctx[m.name] for m in (CENTRAL, UNIFORM)},
                           ratio=context_ratio).show()

# %% [markdown]
# ## Prediction 4: the smallest pool with fewer than 200 misses on average
# Bisection over the pool size (slots per request and layer) at 32K, MTP 2, LRU + warmup; average = mean over
# layers, requests and the first 256 decode steps (the pool starts with the warmup windows only, so the first loads
# of entries count). The search stops at a resolution of 1/64 of the context (smoke: 1/16, one request, 48 steps).

# %%
best, records = tp.smallest_pools(context_len, miss_target, (CENTRAL, UNIFORM),
                                  resolution=context_len // pool_resolution_per_context, mtp=mtp, steps=pool_steps,
                                  batch=pool_batch, seed=seed)
for r in records:
    rec.record(**r)
for m in (CENTRAL, UNIFORM):
    b = best[m.name]
    if isinstance(b, str):               # even the whole context misses too much: first loads dominate few steps
        assert smoke, b                  # over the full 256 steps both models must reach the target
        print(f"{m.label}: {b}")
        continue
    assert b["below_misses"] is None or b["misses"] < miss_target <= b["below_misses"], b
    below = "" if b["below_slots"] is None else f", {b['below_misses']:.1f} at {b['below_slots']} slots"
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
pol_cases = [(CENTRAL, None), (UNIFORM, 0.0)] + [(UNIFORM, sigma) for sigma in popularity_sigmas]
pol_rows, records = tp.policies_against_belady(pol_cases, context_len, mtp=mtp, steps=steps, batch=min(batch, 2),
                                               seed=seed, layers=layer_pick)
for r in records:
    rec.record(**r)
for row in pol_rows:
    assert all(row["belady"] <= row[p] for p in ess.policies.ONLINE_POLICIES), row
    pviz.fig_policies({k: v for k, v in row.items() if k != "trace model"}, bound="belady",
                      title=f"Policies at 32K, ratio 0.2, MTP {mtp}, {row['trace model']}").show()
pd.DataFrame(pol_rows).round(1)

# %% [markdown]
# ## LRU, CLOCK and production's sampled CLOCK, on real and synthetic traces
# Production sparse-KV offload has moved to CLOCK-like replacement: SGLang's HiSparse keeps an exact LRU for one
# query token per step and, for MTP, a "CLOCK" that samples six slots per miss from a moving hand and evicts the one
# used longest ago (`sampled_clock`; `ess.policies` gives both CLOCKs with their sources). How many more entries
# does each copy than LRU? The same traces and pools for every policy: the two real SmolLM2 traces of
# `data/traces/` (1K context, K = 64, one and two query tokens per step) and DeepSeek-V3.2-Exp's synthetic traces
# at 32K, MTP 2 (every `policy_layer_stride`-th layer, the central locality model with a band over the
# alternatives), at ratios 0.125 (2 x K slots per layer at 32K: HiSparse's default buffer of 2 x top-k), 0.2 and
# 0.5. Without warmup every policy starts from the same empty pool, so Belady's offline choice is a bound (checked
# below); with the warmup windows (as deployed) the figures compare the online policies. The differences from LRU
# are measured, not targets: nothing here requires CLOCK to stay close to LRU.

# %%
cmp_ = tp.policy_comparison(tp.recorded_traces(), ALTS, context_len=context_len, ratios=policy_ratios,
                            real_ratios=policy_ratios, mtp=mtp, steps=steps, batch=policy_batch, band_batch=1,
                            seed=seed, layers=list(range(0, LAYERS, policy_layer_stride)))
for r in cmp_.records:
    rec.record(**r)
f = cmp_.frame
cold = f[~f.warmup]
for (src, ratio), g in cold.groupby(["source", "ratio"]):
    m = g.set_index("policy").misses
    assert all(m["belady"] <= m[p] + 1e-9 for p in m.index), (src, ratio, m)       # Belady is never beaten
assert f["hit rate"].between(0, 1).all() and (f[f.policy == "lru"]["vs LRU (%)"] == 0).all()
banded = f.dropna(subset=["misses low"])
assert ((banded["misses low"] <= banded.misses + 1e-9) & (banded.misses <= banded["misses high"] + 1e-9)).all()
for src in f.source.unique():
    ratios_, values, bands_ = cmp_.series(src, True)
    pviz.fig_policies_by_ratio(ratios_, values, bands=bands_,
                               title=f"Misses relative to LRU, with warmup: {src}").show()
clock_rows = f[f.policy.isin(["clock", "sampled_clock"])]
display(clock_rows.pivot_table(index=["source", "ratio"], columns=["policy", "warmup"],
                               values="vs LRU (%)").round(2))
f.drop(columns=[c for c in f.columns if c.endswith((" low", " high"))]).round(3)

# %% [markdown]
# ## The LSTM heat predictor
# A one-layer LSTM (16 units) reads, for each entry, its selections and decayed heat over the last 8 steps and
# predicts whether the next step selects it. It is trained on a trace generated with another seed and scored on
# this one: precision of its top-n guesses (n = the next step's size), beside random guesses and the heat ranking.

# %%
lstm, ptr_test, pred_df, records = tp.lstm_heat_predictor(context_len, CENTRAL, mtp=mtp, train_steps=lstm_train_steps,
                                                          test_steps=lstm_test_steps, epochs=lstm_epochs,
                                                          samples=lstm_samples, seed=seed)
for r in records:
    rec.record(**r)
assert pred_df.LSTM.mean() > 2 * pred_df.random.mean(), pred_df
pred_df.round(3)

# %% [markdown]
# ## A recorded trace
# `TraceRecorder` captures index sets from a sparse-attention implementation. Here it records the real lightning
# indexer and top-K of `ess.attention` on the `tiny` model's shapes (4 layers, K = 64) with synthetic activations
# (random keys; queries that drift as an AR(1) walk with correlation 0.9, a design choice: there is no trained
# model). The recorded trace goes through the same simulation.

# %%
rtr, r_overlap, r_rows, records = tp.recorded_trace(steps=recorded_steps, seed=seed)
for r in records:
    rec.record(**r)
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
summaries, records = tp.prefetch_classes(ptr_test, lstm, context_len=context_len, mtp=mtp)
for r in records:
    rec.record(**r)
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
# * CLOCK (second chance) and production's sampled CLOCK (SGLang HiSparse, for MTP) against LRU on the real SmolLM2
#   traces and the synthetic DeepSeek traces: the pivot table above gives each one's difference from LRU's misses
#   per source, ratio and warmup (recorded as `policy_vs_lru_*`); Belady's gap below LRU is the room any online
#   policy has. `ess.sim.misses.MissesTable(policy="clock")` prices a CLOCK cache in the simulator.
#
# **Next:** these miss counts feed the throughput simulator (`ess.cachesim.misses_per_layer`, default trace model).
