# %% [markdown]
# # 04 · Prefetching
#
# **Overview.** How much GPU memory offload frees depends on how often the top-K entries a decode step needs are
# already in the GPU pool. This notebook generates access traces whose per-layer locality follows the paper's
# Fig. 2 (read by eye) with two trace models -- `uniform` (new entries drawn uniformly) and `drift` (persistent
# token scores plus drifting noise) --, picks the default model by a rule fixed in advance, simulates the pool over a
# whole batch and all 61 layers, and predicts the paper's held-back miss figures: misses per layer at 32K for ratios 0.2 … 0.9, the miss curve of the first 256 decode
# steps with and without LRU-Warmup, misses against context length, and the smallest pool that keeps misses
# under 200. It then compares the replacement policies with Belady's offline bound, trains the article's LSTM
# "heat predictor", and runs three prefetch classes over one host-to-device link.
#
# **Prerequisites.** Notebook 01 (ratio, byte layouts). The trace model is in `ess.traces`, the simulation in
# `ess.cachesim`, the predictor in `ess.predict`, the prefetch classes in `ess.prefetch`. Every miss count here is a
# **prediction** of `ess` from a synthetic trace model, not a measurement on DeepSeek-V3.2-Exp.

# %% [parameters]
smoke = False
results_path = ""
context_len = 32768
ratios = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
mtp = 2
batch = 4
steps = 64
curve_steps = 256
curve_ratio = 0.2
context_lens = [32768, 49152, 65536, 98304, 131072]
context_ratio = 0.2
miss_target = 200
pool_steps = 256
pool_batch = 2
seed = 0
hit_steps = 128
hit_batch = 2
drift_rho_sensitivity = [0.0, 0.9]
probe_steps = 16
pool_resolution_per_context = 64
popularity_sigmas = [1.5]
lstm_train_steps = 48
lstm_test_steps = 32
lstm_epochs = 6
lstm_samples = 30000
recorded_steps = 32
smoke_sizes = {"batch": 2, "steps": 16, "curve_steps": 48, "pool_steps": 48, "pool_batch": 1,
               "context_lens": [32768, 131072], "drift_rho_sensitivity": [], "probe_steps": 8,
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
from ess.studies.locality import VLLM_BUFFER_2K_HIT_RATE, buffer_hit_rate, choose_trace_model, record_indexer_trace
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
DEFAULT = tracegen.default_trace_model()     # chosen by the rule below (data/locality/paper_fig2.yaml)
OTHER = [m for m in tracegen.TRACE_MODELS if m != DEFAULT][0]
gen_cfg = tracegen.generator_defaults()
model_cfg = {"uniform": {"popularity_sigma": gen_cfg["popularity_sigma"]}, "drift": {"drift_rho": gen_cfg["drift_rho"]}}
base = {"k": K, "n_layers": LAYERS, "profile": "paper (Fig. 2, read by eye)", "warmup_windows": WARMUP_WINDOWS,
        "seed": seed, "batch": batch, "n_sinks": gen_cfg["n_sinks"], "local_window": gen_cfg["local_window"],
        "policy": "lru"}
cfg_of = {tm: {**base, "trace_model": tm, **model_cfg[tm]} for tm in tracegen.TRACE_MODELS}
suffix = {tm: "" if tm == DEFAULT else f"_{tm}" for tm in tracegen.TRACE_MODELS}     # record-name suffix
print(f"default trace model: {DEFAULT}; also shown: {OTHER}")

# %% [markdown]
# ## Two trace models
# Both models follow, per request and layer, a chain of query tokens (the 32 warmup positions, then `mtp` tokens
# per decode step); every token selects the 4 attention sinks, the last 64 tokens (local window) and 1,980 "free"
# entries; a decode step selects the union of its `mtp` tokens' sets, and the context grows by the step's tokens.
#
# * **uniform**: the next token keeps as many of the previous free entries as the layer's overlap `r` asks for and
#   draws the rest uniformly from the older context -- an entry that just left the set is no likelier to return
#   than any other.
# * **drift** (score drift): each token has a persistent base score `b_i ~ N(0, 1)` and a noise that drifts as an
#   AR(1) process, `n_i(q) = rho n_i(q-1) + sqrt(1 - rho^2) eps`, one update per query token (the `mtp` tokens of
#   a step see successive draws); the free entries are the top of `sqrt(pi) b_i + sqrt(1 - pi) n_i(q)`. New tokens
#   get fresh base scores. The adjacent-token score correlation `c = pi + (1 - pi) rho` is the **only calibrated
#   quantity**: per layer, bisection makes the adjacent-step overlap equal the Fig. 2 value (the profile is input
#   data for trace models). `rho = 0.5` is a design choice (nothing we hold constrains it); a layer whose `c` is
#   below `rho` is pure drift (`pi = 0`, `rho_layer = c`).
#
# Check: both reproduce the profile (MTP 1, adjacent steps, a seed the calibration never saw). Below a model's
# floor -- sinks plus the shifted window, plus chance for drift -- a layer sits at the floor (layer 0).

# %%
profile = tracegen.locality_profile("paper", LAYERS)
measured, floors, overlap_err = {}, {}, {}
for tm in tracegen.TRACE_MODELS:
    probe = tracegen.synthetic_trace(context_len, n_layers=LAYERS, k=K, mtp=1, steps=probe_steps, batch=1,
                                   warmup_windows=0, seed=seed + 1, trace_model=tm)
    measured[tm] = traces.adjacent_overlap(probe)
    floors[tm] = ((gen_cfg["n_sinks"] + gen_cfg["local_window"] - 1) / K if tm == "uniform"
                     else tracegen.drift_calibration(0.0, context_len, K)["floor"])
    overlap_err[tm] = float(np.abs(measured[tm] - np.maximum(profile, floors[tm])).max())
    rec.record(f"overlap_profile_max_abs_error{suffix[tm]}", overlap_err[tm], "",
               config={**cfg_of[tm], "mtp": 1, "context_len": context_len, "seed": seed + 1,
                       "steps": probe.steps, "batch": 1, "floor": floors[tm]},
               note=f"max over layers of |measured - max(profile, floor)|; floor {floors[tm]:.3f}")
assert overlap_err["uniform"] < 0.01, overlap_err      # exact by construction, up to rounding
assert overlap_err["drift"] < 0.02, overlap_err        # calibrated by bisection on another seed
calib = pd.DataFrame([{"overlap r": r, **tracegen.drift_calibration(float(r), context_len, K)}
                      for r in sorted(set(profile))]).round(4)
display(calib)
pviz.fig_locality_profile(profile, {f"measured, {m}": measured[m] for m in tracegen.TRACE_MODELS}).show()

# %% [markdown]
# ## Choosing the default: the hit rate with a buffer of twice K
# The rule, fixed before either model was measured (`data/locality/README.md`): the default is the model whose
# LRU hit rate with a pool of 2 × K entries per (request, layer) is closer to the 80–90 % that vLLM's RFC #48203
# reports for DeepSeek-V3.2 with a 2 × top-k GPU buffer (paper-facts.md; an independent figure, **not**
# calibration data, nothing is fitted to it). Setting: 32K, **MTP 1** (the RFC counts per top-k selection),
# LRU + warmup, all 61 layers, hit rate = 1 − misses / K over the second half of 128 decode steps, 2 requests,
# seed 0. Smoke mode runs the same setting (it is cheap). A tie would keep `uniform`.
#
# For the drift model, `rho` is a design choice; the same hit rate at `rho = 0` and `0.9` is shown as a
# sensitivity (not used by the rule; full mode only).

# %%
VLLM_LOW, VLLM_HIGH = VLLM_BUFFER_2K_HIT_RATE      # vLLM RFC #48203 via paper-facts.md (2 x top-k buffer)
hit_cfg = {"context_len": context_len, "mtp": 1, "capacity": 2 * K, "steps": hit_steps, "batch": hit_batch,
           "warmup": True, "window": f"steps {hit_steps // 2}..{hit_steps - 1}", "seed": 0}
hit = {}
for tm in tracegen.TRACE_MODELS:
    hit[tm] = buffer_hit_rate(context_len, steps=hit_steps, batch=hit_batch, seed=0, trace_model=tm)
    rec.record(f"hit_rate_buffer_2k_{tm}", hit[tm], "", config={**cfg_of[tm], **hit_cfg},
               source="compare: vLLM RFC #48203 via paper-facts.md, 80-90 % (independent, different workload)")
chosen, distance = choose_trace_model(hit)
rec.record("trace_model_chosen", chosen, "", config={"rule": "data/locality/README.md", **hit_cfg,
                                                      "distance_to_80_90": distance})
assert chosen == DEFAULT, (chosen, DEFAULT, hit)   # the data file's default must be what the rule picks
sens = {}
for rho in drift_rho_sensitivity:
    sens[rho] = buffer_hit_rate(context_len, steps=hit_steps, batch=hit_batch, seed=0, trace_model="drift",
                                drift_rho=rho)
    rec.record(f"hit_rate_buffer_2k_drift_rho{rho:g}", sens[rho], "", config={**cfg_of["drift"], **hit_cfg,
               "drift_rho": rho}, note="sensitivity to the design choice rho; not used by the selection rule")
print(f"2 x K hit rate: uniform {hit['uniform']:.3f}, drift {hit['drift']:.3f} (rho 0.5); "
      f"vLLM RFC {VLLM_LOW:.0%}-{VLLM_HIGH:.0%} -> default {chosen}")
print("drift sensitivity: " + ", ".join(f"rho {r:g}: {h:.3f}" for r, h in sens.items()))
pviz.fig_hit_rate_against_range({**{f"{m}" + (" (default)" if m == DEFAULT else ""): hit[m]
                                    for m in tracegen.TRACE_MODELS},
                                 **{f"drift, rho {r:g}": h for r, h in sens.items()}}, VLLM_LOW, VLLM_HIGH,
                                source="vLLM RFC #48203: 80-90 %",
                                title="LRU hit rate, pool 2 x K, 32K, MTP 1 (independent check)").show()

# %% [markdown]
# ## Prediction 1: misses per layer at 32K, ratios 0.2 … 0.9
# LRU with warmup (32 windows), MTP 2 as in the paper's Table 1, pool = floor(ratio × 32,768) slots per request
# and layer (32K is a whole number of 64-token pages; `ess.layout.pool_slots`). Each (request, layer) trace is generated once and simulated at every ratio. The default model's
# predictions carry the plain names; the other model's are recorded with its name appended.

# %%
per_ratio, means = {}, {}
for tm in (DEFAULT, OTHER):
    sweep = cachesim.sweep_synthetic(context_len, ratios, n_layers=LAYERS, k=K, mtp=mtp, steps=steps, batch=batch,
                                     seed=seed, trace_model=tm)
    per_ratio[tm] = {r: sweep[(r, "lru", True)].mean(axis=1) for r in ratios}
    cfg1 = {**cfg_of[tm], "context_len": context_len, "mtp": mtp, "steps": steps, "warmup": True}
    for r in ratios:
        rec.record(f"misses_per_layer_32k_ratio{r:g}{suffix[tm]}", per_ratio[tm][r],
                   "misses/request/layer/step",
                   config={**cfg1, "ratio": r, "capacity": ess.layout.pool_slots(model, r, context_len, need=K)},
                   note="held-back result of the paper (per-layer miss counts): prediction")
        rec.record(f"misses_mean_32k_ratio{r:g}{suffix[tm]}", float(per_ratio[tm][r].mean()),
                   "misses/request/layer/step", config={**cfg1, "ratio": r})
    means[tm] = [per_ratio[tm][r].mean() for r in ratios]
    assert all(a >= b for a, b in zip(means[tm], means[tm][1:])), means   # a larger pool never misses more
    assert per_ratio[tm][ratios[0]][0] == max(per_ratio[tm][ratios[0]]), "layer 0 (no locality) misses most"
    pviz.fig_misses_per_layer(per_ratio[tm],
                              title=f"Misses per layer at 32K, MTP {mtp}, LRU + warmup ({tm} model)").show()
pd.DataFrame({"ratio": ratios, "pool slots": [ess.layout.pool_slots(model, r, context_len, need=K) for r in ratios],
              **{f"mean misses ({m})": np.round(means[m], 1) for m in (DEFAULT, OTHER)},
              **{f"layer 0 ({m})": [round(per_ratio[m][r][0], 1) for r in ratios] for m in (DEFAULT, OTHER)},
              **{f"max other layer ({m})": [round(per_ratio[m][r][1:].max(), 1) for r in ratios]
                 for m in (DEFAULT, OTHER)}})

# %% [markdown]
# ## Prediction 2: the first 256 decode steps with and without warmup
# MTP 1, ratio 0.2, 32K, LRU; the curve is the mean over layers and requests of the misses of each step. Without
# warmup the pool starts empty, so step 0 misses every selected entry.

# %%
curve_sets = {}
for tm in (DEFAULT, OTHER):
    curves = cachesim.sweep_synthetic(context_len, [curve_ratio], warmups=(True, False), n_layers=LAYERS, k=K,
                                      mtp=1, steps=curve_steps, batch=batch, seed=seed, trace_model=tm)
    with_w = curves[(curve_ratio, "lru", True)].mean(axis=0)
    without_w = curves[(curve_ratio, "lru", False)].mean(axis=0)
    cfg2 = {**cfg_of[tm], "context_len": context_len, "mtp": 1, "ratio": curve_ratio, "steps": curve_steps}
    sfx = suffix[tm]
    rec.record(f"warmup_curve_with{sfx}", with_w, "misses/request/layer", config={**cfg2, "warmup": True},
               note="held-back result of the paper (warmup curves): prediction")
    rec.record(f"warmup_curve_without{sfx}", without_w, "misses/request/layer", config={**cfg2, "warmup": False},
               note="held-back result of the paper (warmup curves): prediction")
    rec.record(f"first_step_misses_with_warmup{sfx}", float(with_w[0]), "misses/request/layer",
               config={**cfg2, "warmup": True})
    rec.record(f"first_step_misses_without_warmup{sfx}", float(without_w[0]), "misses/request/layer",
               config={**cfg2, "warmup": False})
    tail = slice(curve_steps // 2, None)
    rec.record(f"steady_misses_mtp1_ratio0.2{sfx}", float(with_w[tail].mean()), "misses/request/layer/step",
               config={**cfg2, "warmup": True, "window": f"steps {curve_steps // 2}..{curve_steps - 1}"})
    settle = int(np.argmax(without_w <= 1.1 * with_w[tail].mean()))
    rec.record(f"steps_to_settle_without_warmup{sfx}", settle, "steps", config=cfg2,
               note="first step whose misses are within 10 % of the steady state with warmup")
    assert without_w[0] >= K * 0.99 and with_w[0] < 0.5 * without_w[0], (tm, with_w[0], without_w[0])
    assert np.all(curves[(curve_ratio, "lru", True)][:, 0] <= curves[(curve_ratio, "lru", False)][:, 0])
    curve_sets[f"{tm}: LRU + warmup"] = with_w
    curve_sets[f"{tm}: LRU, no warmup"] = without_w
    print(f"{tm}: first step {with_w[0]:.0f} (warmup) vs {without_w[0]:.0f} (none); steady "
          f"{with_w[tail].mean():.0f}; settles after {settle} steps without warmup")
pviz.fig_warmup_curve(curve_sets, title=f"Misses per step, 32K, MTP 1, ratio {curve_ratio}").show()

# %% [markdown]
# ## Prediction 3: misses against context length at a fixed ratio
# Ratio 0.2, MTP 2, LRU + warmup. A longer context has a larger pool at the same ratio but also more tokens to
# choose from. The drift model is calibrated at each context length (Fig. 2's overlap is nearly independent of it).

# %%
by_ctx = {}
for tm in (DEFAULT, OTHER):
    by_ctx[tm] = [float(cachesim.misses_per_layer(L, context_ratio, n_layers=LAYERS, k=K, mtp=mtp, steps=steps,
                                                     batch=batch, seed=seed, trace_model=tm).mean())
                     for L in context_lens]
    cfg3 = {**cfg_of[tm], "ratio": context_ratio, "mtp": mtp, "steps": steps, "warmup": True}
    for L, m in zip(context_lens, by_ctx[tm]):
        rec.record(f"misses_mean_ratio{context_ratio:g}_{L // 1024}k{suffix[tm]}", m, "misses/request/layer/step",
                   config={**cfg3, "context_len": L}, note="prediction")
pviz.fig_misses_vs_context(context_lens, {f"{m} model": by_ctx[m] for m in (DEFAULT, OTHER)},
                           ratio=context_ratio).show()

# %% [markdown]
# ## Prediction 4: the smallest pool with fewer than 200 misses on average
# Bisection over the pool size (slots per request and layer) at 32K, MTP 2, LRU + warmup; average = mean over
# layers, requests and the first 256 decode steps (the pool starts with the warmup windows only, so the first loads
# of entries count). The search stops at a resolution of 1/64 of the context (smoke: 1/16, one request, 48 steps).

# %%
res_slots = context_len // pool_resolution_per_context
best = {}
for tm in (DEFAULT, OTHER):
    cfg4 = {**cfg_of[tm], "context_len": context_len, "mtp": mtp, "steps": pool_steps, "batch": pool_batch,
            "warmup": True, "target": miss_target, "resolution_slots": res_slots}
    try:
        best[tm] = cachesim.smallest_pool(context_len, miss_target, resolution=res_slots, n_layers=LAYERS, k=K,
                                             mtp=mtp, steps=pool_steps, batch=pool_batch, seed=seed, trace_model=tm)
    except ValueError as exc:            # even the whole context misses too much: first loads dominate few steps
        assert smoke, exc                # over the full 256 steps both models must reach the target
        rec.record(f"smallest_pool_under_200_slots{suffix[tm]}", None, "slots/request/layer", config=cfg4,
                   note=f"not reachable in this (smoke) configuration: {exc}")
        print(f"{tm}: {exc}")
        continue
    b = best[tm]
    assert b["below_misses"] is None or b["misses"] < miss_target <= b["below_misses"], b
    below = ("" if b["below_slots"] is None else
             f", {b['below_misses']:.1f} at {b['below_slots']} slots")
    rec.record(f"smallest_pool_under_200_slots{suffix[tm]}", b["slots"], "slots/request/layer", config=cfg4,
               note=f"{b['misses']:.1f} misses at this size{below}: prediction")
    rec.record(f"smallest_pool_under_200_ratio{suffix[tm]}", b["ratio"], "", config=cfg4, note="prediction")
    print(f"{tm}: smallest pool with < {miss_target} misses: {b['slots']} slots (ratio {b['ratio']:.3f}); "
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
pol_cases = [("drift", None), ("uniform", 0.0)] + [("uniform", sigma) for sigma in popularity_sigmas]
for tm, sigma in pol_cases:
    tr = tracegen.synthetic_trace(context_len, n_layers=LAYERS, k=K, mtp=mtp, steps=steps, batch=min(batch, 2),
                                seed=seed, trace_model=tm, **({} if sigma is None else {"popularity_sigma": sigma}))
    sub = traces.Trace(tr.indices[:, layer_pick], tr.context_len, tr.k, tr.mtp, tr.seed, tr.windows[:, layer_pick])
    label = tm if sigma is None else f"{tm}, popularity sigma {sigma:g}"
    tag = tm if sigma is None else f"{tm}_sigma{sigma:g}"
    row = {"trace model": label}
    for pol in policies.POLICIES:
        for warm in (False, True):
            name = f"{pol}{' + warmup' if warm else ''}"
            row[name] = float(cachesim.trace_misses(sub, pol, ratio=0.2, warmup=warm).mean())
            rec.record(f"policy_{pol}_{'warm' if warm else 'cold'}_{tag}", row[name],
                       "misses/request/layer/step",
                       config={**cfg_of[tm], "context_len": context_len, "ratio": 0.2, "mtp": mtp, "steps": steps,
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
                                   seed=seed + 1000)
ptr_test = tracegen.synthetic_trace(context_len, n_layers=4, k=K, mtp=mtp, steps=lstm_test_steps, batch=1,
                                  seed=seed)
lstm = predict.LSTMHeatPredictor(history=8, hidden=16, seed=seed).fit(
    [ptr_train.indices[0, l] for l in range(4)], epochs=lstm_epochs, max_samples=lstm_samples)
reports = {l: predict.evaluate_predictor(lstm, ptr_test.indices[0, l], start=8) for l in range(4)}
depth = tracegen.locality_profile("paper", 4)
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
rtr = record_indexer_trace("tiny", context_len=1024, steps=recorded_steps, batch=2, mtp=1,
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
