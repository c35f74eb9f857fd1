# %% [markdown]
# # 07 · The 32K table
#
# **Overview.** The paper's Table 2 gives decode throughput at 32K context for MTP 2 and MTP 4 with batches from 52
# (the no-offload memory limit) up to 160, each batch with the sparse-memory ratio that makes it fit. Only its first
# row is given to us (calibration data); the rest is **held back**, so this notebook predicts every other row with
# the calibrated simulator of notebook 05 and the per-layer miss counts of the cache simulation (`ess.cachesim`,
# synthetic traces with the paper's Fig. 2 locality profile, LRU with warmup). Then it rebuilds the article's 32K
# table row by row: the article's numbers, the paper configuration each row comes from, the paper's given
# percentages, and ours, with the differences explained.
#
# **Prerequisites.** Notebook 01 (memory model), notebook 05 (calibration). The overlap strategy is the per-layer
# choice among none, DA and DBA (notebook 06); the link is FlashTrans's 37 GB/s host-to-device.

# %% [parameters]
smoke = False
results_path = ""
cachesim_steps = 64
cachesim_batch = 4
mtp4_accepts = [2.8, 3.4]

# %%
import numpy as np
import pandas as pd
from IPython.display import display

import ess
from ess import viz
from ess.published import published
from ess.sim.calibrate import calibrate
from ess.tables import sim as tsim
from ess.viz import sim as vsim

viz.use_notebook_renderer()
rec = ess.Recorder("07_table_32k", results_path)
if smoke:
    cachesim_steps, cachesim_batch = 16, 2
cal = calibrate()
params = cal.params
misses_fn = tsim.misses_from_cachesim(steps=cachesim_steps, batch=cachesim_batch)
sim_cfg = {"params": "calibrated (notebook 05)", "strategy": "best per layer", "h2d_GB_per_s": 37.0,
           "d2h_GB_per_s": 43.0, "misses": misses_fn.config, "deployment": "paper-table1"}
print(f"calibrated: compute x{params.compute_scale:.3f}, comm x{params.comm_scale:.3f}, fixed {params.fixed_ms:.1f} ms; "
      f"misses from ess.cachesim {misses_fn.config}")

# %% [markdown]
# ## The ratio each batch needs
# With offload, the paper keeps `batch x (indexer share + latent share x ratio)` equal to the no-offload KV budget;
# `ratio_for_batch` finds the largest ratio at which each batch fits (memory model of notebook 01).

# %%
t2 = tsim.table2_predictions(params, misses_fn, contexts=("32k",))
cols = ["row", "batch", "ratio", "mtp", "accept_ratio", "throughput", "otps", "step_ms", "stall_ms",
        "misses_per_step", "gain_pct", "throughput_no_miss", "gain_no_miss_pct", "status", "reason"]
with pd.option_context("display.max_colwidth", 80, "display.width", 250):
    display(t2[[c for c in cols if c in t2]].round(3))

# %% [markdown]
# Checks: the calibration row matches the paper; without misses (write-back only) a larger batch never lowers
# throughput; stalls are never negative; every prediction is feasible in memory or says why not.

# %%
row1 = t2[t2.row == "t2_32k_mtp2_b52_r1"].iloc[0]
assert abs(row1.throughput / row1.published - 1) < 0.03, row1
for (mtp, acc), part in t2.groupby(["mtp", "accept_ratio"]):
    tn = part.sort_values("batch").throughput_no_miss.to_numpy()
    assert np.all(np.diff(tn) >= -1e-6 * tn[:-1]), (mtp, acc, tn)
pred = t2[t2.status == "predicted"]
assert (pred.stall_ms >= -1e-9).all()
assert (t2.status.isin(["predicted", "infeasible", "calibration (fitted)"])).all()
assert (t2[t2.status == "infeasible"].reason.str.len() > 0).all()

# %% [markdown]
# ## Every prediction, recorded with its configuration
# Held-back rows have no published value here; set them beside the paper's Table 2 by their configuration.

# %%
for _, r in t2.iterrows():
    cfg = {"batch": int(r.batch), "context_len": 32768, "ratio": float(r.ratio), "mtp": int(r.mtp),
           "accept_ratio": float(r.accept_ratio), **sim_cfg}
    if r.status == "calibration (fitted)":
        rec.record(f"{r.row}_throughput", r.throughput, "tokens/s per node", config=cfg, published=r.published,
                   source=r.source, note="calibration row")
        continue
    if r.status == "predicted":
        rec.record(f"{r.row}_throughput", r.throughput, "tokens/s per node", config=cfg,
                   note=f"held back: prediction; stall {r.stall_ms:.1f} ms, {r.misses_per_step:.0f} misses per "
                        f"request and step; gain vs row 1 {r.gain_pct:+.1f} %; source of the config: {r.source}")
        rec.record(f"{r.row}_otps", r.otps, "tokens/s per request", config=cfg, note="held back: prediction")
    else:
        rec.record(f"{r.row}_throughput", "infeasible", "", config=cfg, note=f"held back; {r.reason}")
    rec.record(f"{r.row}_throughput_no_miss", r.throughput_no_miss, "tokens/s per node", config=cfg,
               note="bound: zero misses (only the D2H write-back of new tokens)")

# %%
vsim.fig_table2(t2, 32768).show()

# %% [markdown]
# ## Per-layer misses behind the offload rows
# The miss counts come from the cache simulation (synthetic traces, not the paper's held-back profiles); layer 0
# has no temporal locality and misses almost everything it selects.

# %%
ratios_shown = sorted(t2[(t2.ratio < 1) & (t2.mtp == 2)].ratio.unique())[::3]
vsim.fig_misses_per_layer({f"ratio {r:.3f}, MTP 2": misses_fn(32768, float(r), 2) for r in ratios_shown}).show()

# %% [markdown]
# ## How few misses the offload rows can afford
# For each offload row, the largest mean miss count per layer (cache-simulated per-layer shape) at which it still
# matches the no-offload row 1. The cache simulation's counts are above it, which is why our offload rows lose
# throughput; the paper's reported gains imply miss counts below these break-even points.

# %%
off = t2[(t2.ratio < 1) & (t2.mtp == 2)][["batch", "context_len", "ratio", "mtp", "accept_ratio"]]
prof = misses_fn(32768, float(off.ratio.min()), 2)
be = tsim.break_even_misses(params, off, float(row1.throughput), profile=prof)
be["cachesim_misses_per_layer"] = [misses_fn(32768, float(r), 2).mean() for r in be.ratio]
display(be.round(3))
for _, r in be.iterrows():
    rec.record(f"break_even_misses_mtp2_b{int(r.batch)}", r.break_even_misses_per_layer, "misses/request/step/layer",
               config={"batch": int(r.batch), "ratio": float(r.ratio), "mtp": 2, "context_len": 32768, **sim_cfg},
               note=f"cache simulation gives {r.cachesim_misses_per_layer:.0f}")

# %% [markdown]
# The same question for the paper's headline: how few misses per layer would let each MTP-2 offload row reach
# +69.4 % over row 1 (NaN: not even with zero misses, at that batch).

# %%
claim32 = published("paper_table2")["claim_32k_gain"]
target = float(row1.throughput) * (1 + claim32["value"] / 100)
be69 = tsim.break_even_misses(params, off, target, profile=prof)
display(be69.round(3))
for _, r in be69.iterrows():
    rec.record(f"misses_for_claim_69pct_mtp2_b{int(r.batch)}",
               r.break_even_misses_per_layer if np.isfinite(r.break_even_misses_per_layer) else "unreachable",
               "misses/request/step/layer",
               config={"batch": int(r.batch), "ratio": float(r.ratio), "mtp": 2, "context_len": 32768,
                       "target_tokens_per_s": target, **sim_cfg},
               note=f"largest miss count at which the row reaches +{claim32['value']} % ({claim32['source']})")

# %% [markdown]
# ## The article's 32K table, rebuilt
# The article's batches (4, 8, 32) and throughputs (1,250 to 2,793 tokens/s) are not the paper's (batch 52, 9,647.71
# tokens/s per node and up); its percentages are the paper's (the Chinese report's +53.1 % for MTP alone and
# +123.4 % with ESS). Each row is mapped to the paper configuration, shown for both MTP-4 accept ratios.

# %%
src = published("paper_table2")
for acc in mtp4_accepts:
    art = tsim.article_table_32k(t2, mtp4_accept=acc)
    print(f"MTP 4 with accept ratio {acc}")
    with pd.option_context("display.max_colwidth", 120, "display.width", 250):
        display(art.round(2))
    for _, a in art.iterrows():
        key = {"Baseline": "article_baseline", "MTP=4": "article_mtp4", "ESS Architecture": "article_ess",
               "Offload contribution": "article_offload_contribution"}[a.row]
        tag = a.row.lower().replace(" ", "_").replace("=", "")
        if a.ours_pct is not None and not pd.isna(a.ours_pct):
            rec.record(f"article_{tag}_pct_acc{acc}", float(a.ours_pct), "%",
                       config={"maps_to": a.maps_to, "mtp4_accept": acc, **sim_cfg},
                       published=a.article_pct, source=src[key]["source"],
                       note=f"paper/blog: {a.paper_pct} %; zero-miss bound {a.ours_pct_no_miss:+.1f} %; {a.explanation}")
a28 = tsim.article_table_32k(t2, mtp4_accept=mtp4_accepts[0])
assert a28.ours_tok_s.iloc[0] == row1.throughput

# %%
m4 = {acc: t2[(t2.mtp == 4) & (t2.accept_ratio == acc) & (t2.batch == 52)].gain_pct.iloc[0] for acc in mtp4_accepts}
offrows = t2[(t2.ratio < 1) & (t2.status == "predicted")]
print("MTP 2 -> 4 at batch 52: " + ", ".join(f"accept {a}: {g:+.1f} %" for a, g in m4.items())
      + f" (paper's report: +{src['blog_mtp_alone']['value']} %)")
print(f"offload rows with simulated misses: gain {offrows.gain_pct.min():+.1f} % to {offrows.gain_pct.max():+.1f} %; "
      f"with zero misses: {t2[t2.ratio < 1].gain_no_miss_pct.min():+.1f} % to {t2[t2.ratio < 1].gain_no_miss_pct.max():+.1f} %")

# %%
saved = rec.save()
rec.to_frame()[["name", "value", "unit", "published", "error"]]

# %% [markdown]
# ## Summary
# * Every held-back 32K row of Table 2 is predicted and recorded with its configuration (batch, ratio, MTP, accept
#   ratio, link, strategy, miss source).
# * MTP 4 at batch 52 gains less than the paper's +53.1 % at accept 2.8 and comes close at 3.4 (numbers printed
#   above): four query tokens and three draft passes make the step longer.
# * With the cache-simulated misses (synthetic traces), offload at 32K costs more link time than the larger batch
#   gains, so our offload rows fall below the no-offload row; with zero misses the same rows gain strongly. The
#   break-even table says how few misses the paper's gains imply: the miss counts, not the cost model, decide.
# * The article's table keeps the paper's percentages but not its batches or absolute throughputs.
#
# **Next:** 128K and the deployment benefits (notebook 08).
