# %% [markdown]
# # 10 · Beyond the paper: does latent offload pay on my GPUs, for my model?
#
# * **Question:** does latent offload pay for a given model on a given GPU, host link and context -- at which batch
#   and ratio, and how sure is that?
# * **Method:** every cell of model x GPU x link x context searched by the calibrated simulator (the stored
#   calibration and miss tables of `data/generated`), each gain with a calibration band and an extrapolation band;
#   `ess.plan` answers one cell with the same functions.
# * **Answer:** the heat maps under "The gain over GPU x context", the one-call check under "One call", every cell
#   in this notebook's records.
#
# **Overview.** Notebooks 05-08 answer the paper's question for one model (DeepSeek-V3.2-Exp) on one machine (H200
# over PCIe 5 at 37 GB/s). This notebook asks it for today's sparse-attention models and machines: DeepSeek-V3.2
# (final), GLM-5 (78 layers, 64 heads, qk_nope 192, v 256, 32 indexer heads) and DeepSeek-V4-Flash (compressed: 21
# C4 layers whose 584-B rows hold 4 tokens each, 20 densely attended C128 layers, a 128-token window on every layer;
# offload moves only the C4 rows), on H20, H800, H100, H200, GH200, B200, B300 and GB200, over every host link that
# serves each GPU (PCIe 4 / 5 / 6, the measured kernel copy rates, NVLink-C2C as measured on Grace systems), at
# 8K-128K of context (1M where the model reaches it). Every spec value comes from `data/` with its source. For each
# cell of model x GPU x link x context the vectorised simulator searches the best offload batch and ratio against
# the best batch without offload, and names the limit that binds; the gain carries two bands: the **calibration
# band** (the equally good calibrations of notebook 05, the part-batch evidence's ends, the locality models of
# notebook 04) and a wider **extrapolation band** for what ess was not calibrated on (kernel efficiencies at the
# spread of the measured points, Blackwell's attention at FlashMLA's measured B200 point, Fig. 2's locality flat
# instead of mapped onto another model's depth, the all-to-all over RDMA instead of NVLink). Two link speeds per
# cell say when the link matters: the one below which offload stops paying, and the one from which DA / DBA stop
# mattering. The paper's own configuration sits inside the grid and is checked against notebook 07's prediction.
#
# **Prerequisites.** Notebooks 01 (memory), 04 (locality models, cache simulation), 05 (calibration), 06 (the
# overlap strategies), 07 (the 32K table). The specs: `data/models/`, `data/hardware/` (GPUs, hosts, host links),
# `data/deployments/paper-shape-*.yaml` (the paper's Table 1 shape on each GPU), `data/calibration/extrapolation.yaml`.

# %% [parameters]
smoke = False
results_path = ""
models = ["deepseek-v3.2", "glm-5", "deepseek-v4-flash"]
gpus = ["H20", "H800", "H100", "H200", "GH200", "B200", "B300", "GB200"]
contexts = [8192, 16384, 32768, 65536, 131072]
long_contexts = [1048576]
n_ratios = 8
band_sizes = {}      # the grid's cache simulations: changes to ess.sim.misses.PLANNER_SIZES (32 steps, 2/1 requests)
widget_cachesim_steps = 16
widget_cachesim_batch = 1
paper_cachesim_steps = 64
paper_cachesim_batch = 4
variant_fit = {}
# the CI sizes: `ess reproduce --smoke` injects them as parameters (ess.parameters.smoke_sizes)
smoke_sizes = {"gpus": ["H20", "H200", "B200", "GB200"], "contexts": [8192], "n_ratios": 3,
               "band_sizes": {"steps": 8, "batch": 1, "band_batch": 1}, "widget_cachesim_steps": 4, "widget_cachesim_batch": 1, "paper_cachesim_steps": 16,
               "paper_cachesim_batch": 2, "variant_fit": {"grid": 12, "refine": 1}}

# %% [hide-input]
import time

import numpy as np
import pandas as pd
from IPython.display import display

import ess
from ess import viz
from ess.sim import Scenario
from ess.sim import grid as sgrid
from ess.sim.misses import PLANNER_SIZES, MissesTable
from ess.specs import gpu_spec, host_link_spec, list_host_links, reference_link
from ess.tables import grid as tgrid
from ess.tables import sim as tsim
from ess.viz import grid as vgrid
from ess.widgets.grid import grid_view, grid_widget, prepare_tables

viz.use_notebook_renderer()
rec = ess.Recorder("10_beyond_the_paper", results_path, smoke=smoke)
t_start = time.perf_counter()
# notebook 05's equally good calibrations, the part-batch ends and notebook 04's locality models (the calibration
# band), and the extrapolation band's recalibrated kernel-efficiency ends
inputs = sgrid.grid_inputs(variant_fit=variant_fit, sizes=PLANNER_SIZES.replace(**band_sizes))
provenance = {"calibration": "central of the equally good calibrations (notebook 05)",
              "params": {k: v for k, v in inputs.params.to_dict().items() if k != "fitted_on"},
              "strategy": "best (the per-layer choice of none, DA, DBA)", "host_memory_cap": True,
              "bands": inputs.summary(), "in_full": "record grid_inputs"}
rec.record("grid_inputs", len(inputs.calibrations), "calibrations",
           config={"params": inputs.params.to_dict(), **inputs.describe()},
           note="what every cell's bands span, in full: the calibrations (notebook 05), the locality models (notebook "
                "04), the extrapolation variants, the cache simulation's sizes")
print(f"central calibration: compute x{inputs.params.compute_scale:.3f}, comm x{inputs.params.comm_scale:.3f}, "
      f"fixed {inputs.params.fixed_ms:.1f} ms; calibration band: {len(inputs.calibrations)} calibrations x "
      f"{len(inputs.localities)} locality models; extrapolation variants: {', '.join(inputs.extrapolation)}")

# %% [markdown]
# ## The specs: what each model caches and what each machine offers
# ess sizes every cache from the model's spec (`ess.layout`): a DSA model keeps a 656-B latent entry and a 132-B
# indexer key per token and layer; DeepSeek-V4-Flash keeps a 584-B row per 4 tokens on its 21 C4 layers (with a
# 132-B indexer key per row), a row per 128 tokens on its 20 C128 layers and a 128-token window on all 43. Offload
# moves what the indexer selects from: every latent entry of a DSA model, the C4 rows of V4. Weights per GPU are for
# the paper's EP 32 (V4's routed experts in FP4).

# %%
caches = tgrid.model_cache_table(["deepseek-v3.2-exp", *models])
display(caches.round(3))
by = caches.set_index("model")
assert by.loc["deepseek-v3.2", "cache_B_per_token"] == by.loc["deepseek-v3.2-exp", "cache_B_per_token"] == 48068
assert by.loc["glm-5", "cache_B_per_token"] == 78 * (656 + 132)
assert by.loc["deepseek-v4-flash", "cache_B_per_token"] == 21 * (584 + 132) / 4 + 20 * 584 / 128
assert by.loc["deepseek-v4-flash", "step_read_per_layer_B"] == 512 * 584
for _, r in caches.iterrows():
    for col, unit in (("cache_B_per_token", "B per token"), ("offloaded_share", "fraction"),
                      ("request_GB", "GB"), ("weights_per_gpu_GB", "GB")):
        rec.record(f"{col}_{r.model}", float(r[col]), unit,
                   config={"model": r.model, "context_len": int(r.context_len), "deployment": "paper-table1"},
                   source=f"data/models/{r.model}.yaml through ess.layout / ess.memory")

# %%
hw = pd.DataFrame([{**{k: v for k, v in gpu_spec(g).__dict__.items() if k != "sources"},
                    "reference link": reference_link(g)} for g in gpus])
display(hw)
links = pd.DataFrame([{k: v for k, v in host_link_spec(n).__dict__.items() if k != "sources"}
                      for n in list_host_links()])
display(links)

# %% [markdown]
# ## Miss counts, computed once
# The cache simulation runs at each model's own geometry (top-K, sparse-layer count, rows: V4's over `L / 4` rows,
# 1M simulated at 128K rows, which overstates its misses) with paper Fig. 2's per-layer locality mapped onto the
# model's depth -- for a model other than the paper's an extrapolation. Everything the grid and the widget read is
# computed here, so that the widget redraws from the simulator alone.

# %%
t0 = time.perf_counter()
widget_contexts = list(contexts) + list(long_contexts)
tables = prepare_tables(inputs, models, widget_contexts, steps=widget_cachesim_steps, batch=widget_cachesim_batch,
                        n_ratios=n_ratios)
print(f"widget and grid miss tables: {time.perf_counter() - t0:.0f} s")

# %% [markdown]
# ## The grid
# Every cell searched: each ratio of a geometric grid from the smallest the pools allow, at every batch up to its
# memory limit and the deployment's cap of 320 per GPU (the calibrated range), against the best batch without
# offload. Then the bands at each cell's chosen configuration, and the two link speeds.

# %%
t0 = time.perf_counter()
cells = sgrid.grid_cells(models, gpus, contexts, long_contexts=long_contexts)
found = sgrid.grid_search(cells, inputs, n_ratios=n_ratios)
t_search = time.perf_counter() - t0
be, be_below = sgrid.break_even_link(found, inputs, n_ratios=n_ratios)
speeds = sgrid.overlap_links(found, inputs)
grid = sgrid.grid_bands(found, inputs).assign(break_even_GB_per_s=be, break_even_below_span=be_below,
                                              serial_GB_per_s=speeds.serial_GB_per_s,
                                              hidden_GB_per_s=speeds.hidden_GB_per_s)
print(f"{len(grid)} cells: search {t_search:.1f} s, with link speeds and bands {time.perf_counter() - t0:.0f} s")
with pd.option_context("display.max_rows", 400, "display.width", 250):
    display(tgrid.grid_table(grid).round(2))

# %% [markdown]
# Checks: every cell has a prediction or says why not; each band contains its central value, and the extrapolation
# band contains the calibration band (its combinations are among its own); a cell ess was calibrated on has no
# extrapolated part; where offload pays at a cell's link, it still pays at the break-even speed found, which lies
# at or below that link; the best offload batch never exceeds the cap; a cell whose batch cap binds without offload
# gains nothing from offload.

# %%
ok = grid[grid.best_batch.notna()]
assert (grid.best_batch.notna() | grid.reason.astype(bool)).all()
assert ((ok.gain_pct_low <= ok.gain_pct + 1e-6) & (ok.gain_pct <= ok.gain_pct_high + 1e-6)).all()
assert ((ok.gain_pct_low <= ok.gain_pct_cal_low + 1e-9) & (ok.gain_pct_cal_high <= ok.gain_pct_high + 1e-9)).all()
cal = ok[ok.calibrated_cell]
assert ((cal.gain_pct_low == cal.gain_pct_cal_low) & (cal.gain_pct_high == cal.gain_pct_cal_high)).all()
pays = ok[ok.gain_pct > 0.5]
assert (pays.break_even_GB_per_s <= pays.h2d_GB_per_s + 1e-9).all(), pays[["break_even_GB_per_s", "h2d_GB_per_s"]]
assert (ok.best_batch <= 320).all() and (ok.batch_no_offload <= 320).all()
capped = ok[ok.limit_no_offload == "batch cap"]
assert (capped.gain_pct <= 0.5).all(), capped[["model", "gpu", "context_len", "gain_pct"]]
print(f"{len(ok)} of {len(grid)} cells predicted; offload pays (> 1 %) in {int((ok.gain_pct > 1).sum())}; "
      f"{len(cal)} cells are calibrated (nothing extrapolated)")

# %%
for r in tgrid.grid_records(grid, inputs, provenance):
    rec.record(**r)

# %% [markdown]
# ## One call
# `ess.plan(model, gpu, context_len, link=...)` answers one cell of this grid from the stored inputs in about a
# second (`ess plan` on the command line). Check: at each GPU's reference link, the plan of every cell equals the
# grid's row (batch, ratio, throughput, the band's low end). The plan's cache-simulation sizes are the full grid's;
# a smoke run, whose sizes are smaller, skips the comparison and says so. Then the plan of the paper's cell, and its
# whole curve: throughput per GPU against tokens per second per request, with and without offload.

# %%
plan_inputs = ess.planning.planner_inputs()
same_sizes = plan_inputs.sizes == inputs.sizes and not variant_fit
ref_cells = tgrid.reference_cells(grid)
checked = 0
for row in ref_cells[ref_cells.best_batch.notna()].itertuples() if same_sizes else ():
    p = ess.plan(row.model, row.gpu, int(row.context_len), link=row.link)
    assert (p.batch, p.ratio) == (int(row.best_batch), float(row.best_ratio)), (row.model, row.gpu, row.context_len)
    assert abs(p.throughput - row.throughput) <= 1e-9 * row.throughput, (row.model, row.gpu, row.context_len)
    assert abs(p.gain_band[0] - row.gain_pct_low) <= 1e-9 * max(1.0, abs(row.gain_pct_low))
    checked += 1
print(f"ess.plan equals the grid on {checked} cells" if same_sizes else
      "smoke sizes: the plan (full sizes) is not compared with this grid")
paper_plan = ess.plan("deepseek-v3.2", ess.deployment_spec("paper-table1").gpu, 32768)
print(paper_plan)
rec.figure("plan_pareto", paper_plan.figure()).show()
rec.record("plan_checked_cells", checked, "cells", config={"sizes_equal": bool(same_sizes)},
           note="cells at the reference links where ess.plan was compared with the grid (0 in a smoke run)")

# %% [markdown]
# ## The gain over GPU x context, for each model
# At each GPU's reference link (the paper's measured 37 GB/s kernel copies on a PCIe host, the C2C rate measured on
# its own platform on a Grace system), with the extrapolation band in brackets; the box is the paper's own
# configuration (DeepSeek-V3.2's geometry on the H200 at 32K).

# %%
ref = tgrid.reference_cells(grid)
paper_dep = ess.deployment_spec("paper-table1")
fig_heat = vgrid.fig_gain_heatmap(ref, paper=("deepseek-v3.2", paper_dep.gpu, 32768))
rec.figure("gain_heatmap", fig_heat).show()

# %% [markdown]
# The same gains against context, the extrapolation band shaded and the calibration band as error bars.

# %%
rec.figure("gain_vs_context", vgrid.fig_gain_vs_context(ref)).show()

# %%
link_lines = {host_link_spec(n).label.split(",")[0] + f" {host_link_spec(n).h2d_GB_per_s:g}":
              host_link_spec(n).h2d_GB_per_s for n in ("pcie4", "pcie5-flashtrans", "pcie6", "c2c-gh200")}
fig_be = vgrid.fig_break_even(ref, links=link_lines, span=sgrid.LINK_RANGE_GB_PER_S)
rec.figure("break_even_link", fig_be).show()
display(tgrid.findings(grid).round(2))

# %% [markdown]
# ## The paper inside the grid
# The paper's configuration -- DeepSeek-V3.2-Exp on the H200 of `paper-table1`, FlashTrans's 37 / 43 GB/s, 32K, MTP
# 2 at accept ratio 1.7 -- evaluated by the grid's machinery at each MTP-2 offload row of paper Table 2 (the paper's
# batch and ratio, and the ratio ess's memory rule gives that batch), with notebook 07's cache-simulation sizes and
# calibration, beside notebook 07's own prediction of each row (`ess.tables.sim.table2_predictions`); then the grid's
# own best for that cell.

# %%
paper_table = MissesTable(steps=paper_cachesim_steps, batch=paper_cachesim_batch, locality=inputs.localities[0],
                          model="deepseek-v3.2-exp")
t2 = tsim.table2_predictions(paper_table, scenario=Scenario(params=inputs.params), contexts=("32k",))
t2 = t2[(t2.mtp == paper_dep.mtp) & (t2.ratio < 1) & (t2.status == "predicted")].reset_index(drop=True)
evaluated = sgrid.evaluate_configs(inputs, "deepseek-v3.2-exp", paper_dep.gpu, "pcie5-flashtrans", 32768, t2.batch,
                                   t2.ratio, table=paper_table, check_memory=False)
check = tgrid.paper_cell(evaluated, t2)
display(check)
assert len(check) and check.equal.all(), check
seen07 = {r.row: tgrid.notebook07_record(results_path, f"{r.row}_throughput", smoke) for r in check.itertuples()}
for row, v in seen07.items():
    if v is not None:                                  # notebook 07 ran at the same size: its record, to 1e-9
        g = float(check.set_index("row").loc[row, "grid"])
        assert abs(v - g) <= 1e-9 * abs(v), (row, v, g)
print(f"notebook 07's records compared: {sum(v is not None for v in seen07.values())} of {len(seen07)} "
      "(none when notebook 07 has not run at this size in this build)")
paper_cells = sgrid.grid_cells(["deepseek-v3.2-exp"], [paper_dep.gpu], [32768], links=["pcie5-flashtrans"])
paper_best = sgrid.grid_search(paper_cells, inputs, n_ratios=n_ratios, tables={"deepseek-v3.2-exp": paper_table})
display(paper_best[["best_batch", "best_ratio", "limit", "throughput", "throughput_per_node", "batch_no_offload",
                    "throughput_no_offload", "gain_pct"]].round(3))
for r in check.itertuples():
    rec.record(f"paper_cell_{r.row}_throughput", float(r.grid), "tokens/s per node",
               config={"model": "deepseek-v3.2-exp", "gpu": paper_dep.gpu, "link": "pcie5-flashtrans",
                       "context_len": 32768, "batch": int(r.batch), "ratio": float(r.ratio), "setting": r.setting,
                       "misses": paper_table.config, "notebook_07": float(r.notebook_07), **provenance},
               source="paper Table 2's configuration (data/published/paper_table2.yaml) through the grid's "
                      "simulator; equal to notebook 07's prediction of the row", status="predicted")
pb = paper_best.iloc[0]
rec.record("paper_cell_best_gain", float(pb.gain_pct), "%",
           config={"model": "deepseek-v3.2-exp", "gpu": paper_dep.gpu, "link": "pcie5-flashtrans",
                   "context_len": 32768, "best_batch": int(pb.best_batch), "best_ratio": float(pb.best_ratio),
                   "limit": pb.limit, "batch_no_offload": int(pb.batch_no_offload), "misses": paper_table.config,
                   **provenance},
           source="the grid's search on the paper's own configuration", status="predicted")

# %% [markdown]
# ## Explore a cell
# Model, GPU, host link, context, MTP (1, 2 or 4: the accept ratios ess has a source for) and the sparse-memory
# ratio, or the best one. The widget redraws from the simulator on every move (the misses were computed above); the
# book shows its default view below.

# %%
fig0, s0 = grid_view(inputs, "deepseek-v3.2", paper_dep.gpu, reference_link(paper_dep.gpu), contexts[-1], 2,
                     "best", tables=tables, n_ratios=n_ratios)
fig0.show()
print(s0)
t0 = time.perf_counter()
for _ in range(5):
    grid_view(inputs, "glm-5", gpus[-1], reference_link(gpus[-1]), contexts[-1], 4, "best", tables=tables,
              n_ratios=n_ratios)
print(f"one redraw's computation: {(time.perf_counter() - t0) / 5 * 1e3:.0f} ms (this machine, shared)")
grid_widget(inputs, tables, models, gpus, widget_contexts, model="deepseek-v3.2", gpu=paper_dep.gpu,
            context_len=32768, n_ratios=n_ratios)

# %% [markdown]
# ## What ess models, and what it does not
# Every number above is conditional on what the simulator leaves out.

# %%
with pd.option_context("display.max_colwidth", 200):
    display(tgrid.model_scope())

# %%
saved = rec.save()
print(f"notebook 10: {time.perf_counter() - t_start:.0f} s")
rec.to_frame()[["name", "value", "unit", "status"]].head(20)

# %% [markdown]
# ## Summary
# * Each model's cache is sized from its spec: DeepSeek-V3.2 (final) is V3.2-Exp's network (48,068 B per token),
#   GLM-5 caches the same entries on 78 layers (61,464 B), DeepSeek-V4-Flash 3,850 B per token on a long context
#   (its C4 rows are what offload moves, 80 % of it).
# * The grid gives, for every model x GPU x link x context, the best offload batch and ratio, the gain over no
#   offload with a calibration band and a wider extrapolation band, the limit that binds, the link speed below which
#   offload stops paying and the one from which DA / DBA stop mattering; the heat maps and the break-even figure
#   summarise it at each GPU's reference link, and the records hold every cell with its configuration.
# * Where the batch cap of the calibrated range already binds without offload (short contexts, large GPUs, V4's
#   small cache), offload buys nothing; where memory binds, its gain grows with the context.
# * The paper's own configuration, evaluated by the grid's machinery, equals notebook 07's prediction row by row.
# * Everything beyond DeepSeek-V3.2's geometry on the paper's H200 is extrapolated: the model's operations priced by
#   its geometry, Hopper's kernel efficiencies moved to other GPUs by their peaks, Fig. 2's locality mapped onto
#   another depth; the records say which parts of each cell are calibrated and which extrapolated.
#
# **Next:** the book's page on this notebook sets the grid's findings beside what ess does not model.
