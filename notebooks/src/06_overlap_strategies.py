# %% [markdown]
# # 06 · Overlap strategies
#
# * **Question.** How much extra time per layer do a step's host-to-device copies cost under the serial order, DA and
#   DBA, and where does each strategy pay off?
# * **Method.** The calibrated simulator of notebook 05 prices each strategy over miss counts, batches and link
#   speeds, with a band over the equally good calibrations, the part-batch evidence and the locality models.
# * **Where the answer is.** The paper's held-back overlap chart, predicted in its own units, is the first figure
#   (*The paper's chart, in its units*); the cheapest strategy per batch and miss count in the figure of *Where each
#   strategy is the cheapest*; the overhead at the cache-simulated misses in *At the cache-simulated miss counts*; the
#   conclusions under *Summary*.
#
# **Overview.** Each decode step copies the missed latent entries host-to-device and writes the new tokens back.
# The paper hides these copies in three ways, chosen per layer offline from profiled miss counts: **none** (SGLang's
# serial order), **DA** (dual attention: attend over the hits while the misses are copied, then over the misses in a
# second launch, and merge the two by log-sum-exp) and **DBA** (dual-batch attention: split the indexer's logits and
# top-K, and attention, along the batch, so that one half's copy hides behind the other half's indexer). Neither is
# free: DA pays a second attention launch and the merge, DBA runs each half at a cost that does not halve (a kernel's
# launch, FlashMLA's per-part scheduling and the top-K's row latency stay; `data/calibration/part_batch.yaml`), so a
# layer with few misses is best left serial. This notebook prices the three with the calibrated simulator and
# predicts the paper's held-back overlap chart in its own units: the extra microseconds per layer and Two-Batch-Overlap
# micro-batch of each strategy at 32 to 512 misses per request and layer, 128K, batch 160, MTP 2, 37 GB/s. It also
# shows what a half batch costs, where each strategy is the cheapest, which strategy each layer picks and how the
# overhead depends on the link. Every number carries a band: over the equally good calibrations of notebook 05, the two
# ends of the part-batch evidence (each calibrated anew) and the locality models the evidence leaves open (notebook
# 04; they shape the per-layer misses).
#
# **Prerequisites.** Notebook 05 (calibrated simulator). The formulas of each strategy are in the docstring of
# `ess/sim/timeline.py`, the part-batch costs in `ess/sim/costs.py`. Batch 160 at 128K exceeds the memory model's limit
# (48 at ratio 0.1); like the paper's chart, it is a stress configuration, so memory is not checked here.
#
# The chart's configuration is in the parameters: 128K, batch 160, MTP 2 (the paper's overlap chart,
# `data/published/paper_table2.yaml: overlap_overhead_128k`) and the FlashTrans link, 37 GB/s host-to-device and
# 43 GB/s device-to-host (`data/hardware/links.yaml: flashtrans`, [BLOG]). The next cell checks they still match the
# data, so a changed parameter is a deliberate what-if.

# %% [parameters]
smoke = False
results_path = ""
chart_misses = [32, 64, 128, 256, 512]
miss_grid = [0, 25, 50, 100, 150, 200, 300, 400, 600, 800, 1200, 1600, 2400, 3200, 4096]
map_batches = [16, 32, 52, 80, 128, 160, 200, 264]
map_misses = [0, 16, 32, 64, 128, 256, 512]
links_GB_per_s = [4, 8, 16, 24, 37, 48, 64, 96, 128, 256]
band_sizes = {}      # the band's cache simulations: changes to ess.sim.misses.NOTEBOOK_SIZES (64 steps, 4/2 requests)
context_len = 131072
batch = 160
mtp = 2
h2d_GB_per_s = 37.0
d2h_GB_per_s = 43.0
profile_ratio = 0.1
context_len_short = 32768
profile_ratio_short = 0.2
offload_ratios = [0.2, 0.1]
# the CI sizes: `ess reproduce --smoke` injects them as parameters (ess.parameters.smoke_sizes)
smoke_sizes = {"miss_grid": [0, 100, 400, 1600, 4096], "links_GB_per_s": [8, 37, 128],
               "map_batches": [16, 52, 160, 264], "map_misses": [0, 32, 128, 512],
               "band_sizes": {"steps": 16, "batch": 2, "band_batch": 1}, "variant_fit": {"grid": 12, "refine": 1}}
variant_fit = {}

# %% [hide-input]
import numpy as np
import pandas as pd
from IPython.display import display

import ess
from ess import viz
from ess.sim.sweep import sweep
from ess.published import published
from ess.layout import latent_entry_bytes
from ess.specs import link_figures, model_spec
from ess.sim import STRATEGIES, predictions
from ess.sim.misses import NOTEBOOK_SIZES
from ess.viz import sim as vsim

viz.use_notebook_renderer()
rec = ess.Recorder("06_overlap_strategies", results_path, smoke=smoke)
# the equally good calibrations of notebook 05 and the locality models of notebook 04, the central first of each
band = predictions.band_inputs(variant_fit=variant_fit, sizes=NOTEBOOK_SIZES.replace(**band_sizes))
params, calibrations, ALTS, misses = band.params, band.calibrations, band.models, band.central_misses
L, B, LINK, D2H = context_len, batch, h2d_GB_per_s, d2h_GB_per_s
scenario = band.scenario().replace(h2d_GB_per_s=LINK, d2h_GB_per_s=D2H)     # the chart's link, the calibration
for table in band.misses.values():             # one cache simulation per locality model for every ratio used here
    table.prefetch([(L, r, mtp) for r in set(offload_ratios) | {profile_ratio}])
chart = published("paper_table2")["overlap_overhead_128k"]
flashtrans = link_figures()["flashtrans"]
as_data = ((L, B, mtp, LINK) == (chart["context_len"], chart["batch"], chart["mtp"], chart["h2d_GB_per_s"])
           and (LINK, D2H) == (flashtrans["h2d_GB_per_s"], flashtrans["d2h_GB_per_s"]))
print(f"memory model's limit at {L // 1024}K, ratio {profile_ratio}: batch "
      f"{ess.largest_batch(L, profile_ratio).batch} (the chart's batch {B} is a stress point)")
print("configuration: the paper's overlap chart with the FlashTrans link" if as_data else
      f"what-if: the parameters differ from the chart ({chart['source']}) or FlashTrans ({flashtrans})")
label = f"{L // 1024}K, batch {B}, MTP {mtp}, {LINK:g} GB/s"
# every number below is offload at 128K and batch 160: outside what the cost model was calibrated on (MTP 2, 32K, no
# offload). Its extrapolation band adds, to the calibrations, notebook 10's kernel-efficiency variants (the slowest
# and fastest measured shapes, recalibrated); each record says what it extrapolates.
xparams = predictions.extrapolation_params(scenario, variant_fit)
extrapolated = predictions.extrapolated_parts(B, L, profile_ratio, mtp)
cfg = {"context_len": L, "batch": B, "mtp": mtp, "h2d_GB_per_s": LINK, "d2h_GB_per_s": D2H,
       "params": "central calibration (notebook 05)", "memory_checked": False, "as_published_chart": as_data,
       "band": band.describe()}

# %% [markdown]
# ## The paper's chart, in its units
# Extra microseconds each strategy adds to the compute lane of one layer and one micro-batch (b = 80 requests of the
# batch of 160), at the same miss count on every layer: the x axis of the paper's overlap chart. These are held-back
# results of the paper: predictions. The band spans the equally good calibrations and the two ends of the part-batch
# evidence (the misses are given here, so the locality models do not enter).

# %%
chart_ov = predictions.overlap_bands(calibrations, {"uniform": None}, chart_misses, scenario=scenario,
                                     context_len=L, batch=B, mtp=mtp)
chart_ov = chart_ov[chart_ov.strategy.isin(STRATEGIES)]
chart_x = predictions.overlap_bands({**calibrations, **xparams}, {"uniform": None}, chart_misses, scenario=scenario,
                                    context_len=L, batch=B, mtp=mtp)
chart_x = chart_x[chart_x.strategy.isin(STRATEGIES)]
display(chart_ov.pivot(index="misses_per_layer", columns="strategy",
                       values=["overhead_us_per_layer", "overhead_us_per_layer_low",
                               "overhead_us_per_layer_high"]).round(1))
vsim.fig_overlap_vs_misses(chart_ov, f"Extra time per layer and micro-batch, {label} (band: calibrations x "
                                     "part-batch evidence)", value="overhead_us_per_layer").show()
for (_, r), (_, x) in zip(chart_ov.iterrows(), chart_x.iterrows()):
    rec.record(f"overlap_us_{r.strategy}_m{int(r.misses_per_layer)}", r.overhead_us_per_layer,
               "us per layer and micro-batch",
               config={**cfg, "strategy": r.strategy, "misses_per_layer": r.misses_per_layer,
                       "profile": "uniform over the layers", "micro_batch": B / 2,
                       "extrapolation_band": {"low": float(x.overhead_us_per_layer_low),
                                              "high": float(x.overhead_us_per_layer_high)},
                       "extrapolated": extrapolated},
               note="held back in the paper (the overlap chart): prediction", low=r.overhead_us_per_layer_low,
               high=r.overhead_us_per_layer_high, status="held back (predicted)")

# %% [markdown]
# Checks: the serial order pays every byte (its overhead is the copy time, `misses x b x 656 B / 37 GB/s`, plus the
# write-back, exactly); DA and DBA cost something of their own even where they hide the whole copy; no strategy gets
# cheaper as the misses grow.

# %%
cpiv = chart_ov.pivot(index="misses_per_layer", columns="strategy", values="overhead_us_per_layer")
entry = latent_entry_bytes(model_spec(), "fp8")
copy_us = cpiv.index.to_numpy() * (B / 2) * entry / (LINK * 1e9) * 1e6
write_back_us = (B / 2) * mtp * entry / (D2H * 1e9) * 1e6
assert np.allclose(cpiv["none"].to_numpy(), copy_us + write_back_us, rtol=1e-9)
assert (cpiv[["da", "dba"]].to_numpy() > 0).all()
for s in STRATEGIES:
    assert np.all(np.diff(cpiv[s].to_numpy()) >= -1e-9), s

# %% [markdown]
# ## What a half batch costs
# Dual-batch attention runs the indexer's logits and top-K, and attention, once per half batch. A half costs more
# than half: each launch has a fixed part (the logits kernel about 8 us, FlashMLA its launch and scheduler overhead),
# the top-K takes one row's latency per wave of 132 rows whatever the rows, and FlashMLA weighs each request's blocks
# plus a fixed overhead (`data/calibration/part_batch.yaml`, each value with its source). Dual attention's own cost is
# a second attention launch and the merge. Below, for the chart's batch and for Table 2's first row (32K, batch 52),
# in microseconds per layer and micro-batch with the central calibration; notebook 09 measures the same ratio on the
# real model's engine.

# %%
splits = pd.DataFrame([predictions.split_costs(b_, L_, scenario=scenario, mtp=mtp)
                       for b_, L_ in ((B, L), (52, context_len_short), (B, context_len_short), (40, L))])
display(splits.round(3))
for _, r in splits.iterrows():
    tag = f"{r.context_len // 1024}k_b{r.batch}"
    for col, unit in (("indexer_half_ratio", "half / whole"), ("attn_half_ratio", "half / whole"),
                      ("da_own_us", "us per layer and micro-batch"), ("dba_own_us", "us per layer and micro-batch")):
        rec.record(f"split_{col}_{tag}", r[col], unit,
                   config={**cfg, "batch": int(r.batch), "context_len": int(r.context_len),
                           "micro_batch": r.micro_batch, "part_batch": r.part_batch},
                   note="the cost model's part-batch rule (data/calibration/part_batch.yaml), central calibration",
                   status="computed")
assert (splits.indexer_half_ratio > 0.5).all() and (splits.attn_half_ratio > 0.5).all()

# %% [markdown]
# ## Where each strategy is the cheapest
# The cheapest strategy at each batch and miss count (the same count on every layer), at 32K and at 128K: with few
# misses the strategies' own costs decide and the serial order wins; with more, DA (whose own cost is smallest at
# small batches) and then DBA (which hides a half's copy behind the other half's indexer). From a batch of 133 on
# (more than 132 top-K rows per micro-batch at MTP 2) the indexer's top-K takes two waves, and each half fits in one:
# the split costs little, and DBA wins early.

# %%
maps = {}
for L_ in (context_len_short, L):
    maps[L_] = predictions.strategy_map(map_batches, map_misses, context_len=L_, scenario=scenario, mtp=mtp)
    vsim.fig_strategy_map(maps[L_], f"The cheapest strategy at {L_ // 1024}K, MTP {mtp}, {LINK:g} GB/s").show()
    grid = maps[L_].pivot(index="batch", columns="misses_per_layer", values="best")
    rec.record(f"cheapest_strategy_{L_ // 1024}k", {str(b_): list(row) for b_, row in grid.iterrows()}, "",
               config={**cfg, "context_len": L_, "batches": map_batches, "misses_per_layer": map_misses,
                       "profile": "uniform over the layers"},
               note="per batch (keys), the cheapest strategy at each miss count", status="predicted")
    assert (grid[0] == "none").all()            # nothing to hide: a split only costs

# %% [markdown]
# ## Overhead against the miss count (the paper's chart, predicted)
# The per-layer shape of the misses is the cache simulation's at this context and `profile_ratio` (layer 0 misses
# most); the x axis is its mean over layers. The band: every equally good calibration with every locality model's
# per-layer shape.

# %%
profiles = {name: table(L, profile_ratio, mtp) for name, table in band.misses.items()}
ov = predictions.overlap_bands(calibrations, profiles, miss_grid, scenario=scenario, context_len=L, batch=B, mtp=mtp)
ov_x = predictions.overlap_bands({**calibrations, **xparams}, profiles, miss_grid, scenario=scenario, context_len=L,
                                 batch=B, mtp=mtp)
piv = ov.pivot(index="misses_per_layer", columns="strategy", values="overhead_pct")
display(ov.pivot(index="misses_per_layer", columns="strategy",
                 values=["overhead_pct", "overhead_pct_low", "overhead_pct_high"]).round(2))
vsim.fig_overlap_vs_misses(ov, f"Offload overhead, {label} (band: calibrations x locality models)").show()
for (_, r), (_, x) in zip(ov.iterrows(), ov_x.iterrows()):
    rec.record(f"overhead_{r.strategy}_m{int(r.misses_per_layer)}", r.overhead_pct, "% of step",
               config={**cfg, "strategy": r.strategy, "mean_misses_per_layer": r.misses_per_layer,
                       "profile": f"ess.cachesim {L // 1024}K ratio {profile_ratio}",
                       "extrapolation_band": {"low": float(x.overhead_pct_low), "high": float(x.overhead_pct_high)},
                       "extrapolated": extrapolated},
               note="held back in the paper: prediction", low=r.overhead_pct_low, high=r.overhead_pct_high,
               status="held back (predicted)")

# %% [markdown]
# Checks: the per-layer choice is never worse than any single strategy; without misses it keeps the serial order
# and pays only the write-back; the overhead never falls as misses grow.

# %%
assert (piv["best"] <= piv[list(STRATEGIES)].min(axis=1) + 1e-9).all()
assert piv.loc[0, "best"] < 0.5
for s in piv.columns:
    assert np.all(np.diff(piv[s].to_numpy()) >= -1e-9), s
cross = piv[(piv["da"] > piv["dba"] + 1e-6)].index.min()
rec.record("da_worse_than_dba_from_misses", float(cross) if not pd.isna(cross) else -1, "misses/request/step/layer",
           config=cfg, note="-1: DA never worse on this grid")
print(f"DBA beats DA from {cross} misses per layer on this grid")

# %% [markdown]
# ## The same chart at a shorter context
# The indexer is shorter at `context_len_short` (32K: four times shorter), so DBA has less to hide behind; the paper
# prefers DA when misses are few. Same batch, MTP and link; the per-layer shape is the cache simulation's at that
# context and `profile_ratio_short`.

# %%
Ls = context_len_short
ov32 = predictions.overlap_bands(calibrations, {"central": misses(Ls, profile_ratio_short, mtp)}, miss_grid,
                               scenario=scenario, context_len=Ls, batch=B, mtp=mtp)
ov32_x = predictions.overlap_bands({**calibrations, **xparams}, {"central": misses(Ls, profile_ratio_short, mtp)},
                                   miss_grid, scenario=scenario, context_len=Ls, batch=B, mtp=mtp)
piv32 = ov32.pivot(index="misses_per_layer", columns="strategy", values="overhead_pct")
display(piv32.round(2))
vsim.fig_overlap_vs_misses(ov32, f"Offload overhead, {Ls // 1024}K, batch {B}, MTP {mtp}, {LINK:g} GB/s "
                                 "(band: calibrations)").show()
for (_, r), (_, x) in zip(ov32.iterrows(), ov32_x.iterrows()):
    rec.record(f"overhead{Ls // 1024}k_{r.strategy}_m{int(r.misses_per_layer)}", r.overhead_pct, "% of step",
               config={**cfg, "context_len": Ls, "strategy": r.strategy, "mean_misses_per_layer": r.misses_per_layer,
                       "profile": f"ess.cachesim {Ls // 1024}K ratio {profile_ratio_short} (central locality)",
                       "extrapolation_band": {"low": float(x.overhead_pct_low), "high": float(x.overhead_pct_high)},
                       "extrapolated": predictions.extrapolated_parts(B, Ls, profile_ratio_short, mtp)},
               note="prediction; band over the equally good calibrations", low=r.overhead_pct_low,
               high=r.overhead_pct_high, status="predicted")
da_wins = piv32[(piv32["da"] < piv32["dba"] - 1e-6)].index.tolist()
print(f"at {Ls // 1024}K DA beats DBA at {da_wins or 'no'} misses per layer on this grid")
assert (piv32["best"] <= piv32[list(STRATEGIES)].min(axis=1) + 1e-9).all()

# %% [markdown]
# ## At the cache-simulated miss counts
# The same configuration with the simulated per-layer misses themselves, for each of `offload_ratios`: overhead of
# each strategy and how many layers the per-layer choice gives to DA and DBA, with the band over the calibrations
# and the locality models (each model its own misses).

# %%
at_parts, at_x = [], []
for ratio in offload_ratios:
    frames = [predictions.strategy_overheads(table(L, ratio, mtp), scenario=scenario.replace(params=q), context_len=L,
                                           batch=B, mtp=mtp, ratio=ratio)
              for table in band.misses.values() for q in calibrations.values()]
    xframes = [predictions.strategy_overheads(misses(L, ratio, mtp), scenario=scenario.replace(params=q), context_len=L,
                                            batch=B, mtp=mtp, ratio=ratio) for q in xparams.values()]
    at_parts.append(predictions.band_frames(frames, ("overhead_pct", "stall_ms", "mean_misses_per_layer")))
    at_x.append(predictions.band_frames(frames + xframes, ("overhead_pct",)))
at_sim = pd.concat(at_parts, ignore_index=True)
at_sim_x = pd.concat(at_x, ignore_index=True)
display(at_sim.round(2))
for (_, r), (_, x) in zip(at_sim.iterrows(), at_sim_x.iterrows()):
    rec.record(f"overhead_cachesim_r{r.ratio:g}_{r.strategy}", r.overhead_pct, "% of step",
               config={**cfg, "ratio": r.ratio, "strategy": r.strategy, "misses": misses.config,
                       "extrapolation_band": {"low": float(x.overhead_pct_low), "high": float(x.overhead_pct_high)},
                       "extrapolated": predictions.extrapolated_parts(B, L, float(r.ratio), mtp)},
               note=f"held back in the paper: prediction; mean misses per layer {r.mean_misses_per_layer:.0f} "
                    f"({r.mean_misses_per_layer_low:.0f}-{r.mean_misses_per_layer_high:.0f} over the locality "
                    f"models); layers none/DA/DBA {r.layers_none}/{r.layers_da}/{r.layers_dba}",
               low=r.overhead_pct_low, high=r.overhead_pct_high, status="held back (predicted)")
assert (at_sim.overhead_pct_low <= at_sim.overhead_pct + 1e-9).all()
assert (at_sim.overhead_pct <= at_sim.overhead_pct_high + 1e-9).all()

# %% [markdown]
# ## The link
# A sweep over the host-to-device bandwidth (FlashTrans's 37 GB/s, PCIe 5.0's 63 GB/s theoretical, and slower or
# faster links) for each strategy, with the simulated misses at `profile_ratio`. It runs through `ess.sim.sweep`,
# which shows a progress bar and can run on a Dask cluster by passing `scheduler=`.

# %%
m01 = misses(L, profile_ratio, mtp)
parts = []
for s in STRATEGIES + ("best",):
    df = sweep({"batch": [B], "context_len": [L], "ratio": [profile_ratio], "h2d_GB_per_s": links_GB_per_s},
               scenario=scenario.replace(mtp=mtp, strategy=s, check_memory=False), misses=m01, workers=0)
    df["strategy"] = s
    parts.append(df)
links = pd.concat(parts)
display(links.pivot(index="h2d_GB_per_s", columns="strategy", values="throughput").round(0))
for s, part in links.groupby("strategy"):
    tp = part.sort_values("h2d_GB_per_s").throughput.to_numpy()
    assert np.all(np.diff(tp) >= -1e-9), s                 # a faster link never lowers throughput
    for _, r in part.iterrows():
        rec.record(f"throughput_{s}_link{r.h2d_GB_per_s:g}", r.throughput, "tokens/s per node",
                   config={**cfg, "ratio": profile_ratio, "strategy": s, "h2d_GB_per_s": r.h2d_GB_per_s,
                           "misses": misses.config})
vsim.fig_overlap_vs_misses(links, f"Throughput against link bandwidth, {L // 1024}K, batch {B}, ratio "
                                  f"{profile_ratio}", value="throughput", x="h2d_GB_per_s", log_x=True).show()

# %%
saved = rec.save()
rec.to_frame()[["name", "value", "unit", "published", "error"]].head(30)

# %% [markdown]
# ## Summary
# * Neither overlap is free: dual attention pays a second attention launch and the merge, dual-batch attention runs
#   each half at more than half the cost (launches, FlashMLA's per-part overhead and the top-K's row latency stay).
#   With few misses the serial order is the cheapest; the per-layer choice keeps it there.
# * As misses grow DA and then DBA pay off; at the paper's chart configuration (batch 160, so 160 top-K rows per
#   micro-batch: two waves, one per half) DBA's split is cheap and it wins from a few dozen misses on; at smaller
#   batches DA wins first, as the paper says of few misses.
# * At the cache-simulated miss counts the copies are far larger than the compute they could hide behind, so
#   every strategy leaves most of the transfer exposed: the miss rate, not the overlap, is the bottleneck.
#
# **Next:** the 32K table (notebook 07) and 128K with the deployment benefits (notebook 08).
