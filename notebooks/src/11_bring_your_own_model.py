# %% [markdown]
# # 11 · Bring your own model
#
# * **Question:** can a model someone brings -- any transformers decoder, or DeepSeek's own sparse-attention
#   architecture -- decode through the tiered cache unchanged, and what does offload do to it?
# * **Method:** `ess.hf` plugs ess into transformers' own extension points: a cache on its cache API whose entries
#   live in ess's tiered cache, and an attention function registered in its attention registry. SmolLM2-135M
#   as transformers' `LlamaForCausalLM` (the GGUF file's weights, as ess decodes them and caches between runs:
#   identical to transformers' own reading of the file, which the tests also run), and tiny random DeepSeek-V3.2
#   and GLM-5 models built from transformers' config classes, decode through it; the outputs are compared with
#   transformers' own attention and with all-resident decoding.
# * **Answer:** "SmolLM2 through transformers" (same tokens offloaded or not, bit for bit), "DeepSeek-V3.2's own
#   architecture" (transformers' dense-masked output to float32 rounding, K rows read per step), and the monitor
#   and trace below.
#
# **Overview.** Notebook 09 decoded SmolLM2 in ess's own Llama code. A user's model lives in transformers; there a
# `SparseCache` takes the place of transformers' `DynamicCache`. At the prefill the model runs densely (transformers'
# own SDPA); from the first decode step every layer's entries sit in the host pool, a *ratio* of them in the device
# pool, and each step selects K entries per layer and request, plans, copies the misses over the link and attends
# over the selected rows where they lie. A Llama-family model selects with ess's FP8 indexer (as in notebook 09); a
# DSA model with its own lightning indexer, and its cache holds MLA *latent* entries in ess's byte layout (FP8 codes,
# one float32 scale per 128 values, a bf16 RoPE part: DeepSeek's 656-byte entry at its real dims).
#
# **Prerequisites.** Notebook 09 (the engine, lossless offload), 03 (sparse MLA over latent entries), 04 (the cache
# simulation of traces). CPU only: the device pool is host memory here, the link an emulation.

# %% [parameters]
smoke = False
results_path = ""
threads = 1
chat_topic = "assert"
chat_question = "What does the assert statement do? Answer in one sentence."
gen_tokens = 16
gen_ratio = 0.25
gen_schedule = "da"
gen_link_GB_per_s = 0.05
dsa_context = 400
dsa_steps = 8
dsa_index_topk = 32
dsa_ratio = 0.2
trace_context = 384
trace_steps = 8
# the CI sizes: `ess reproduce --smoke` injects them as parameters (ess.parameters.smoke_sizes)
smoke_sizes = {"gen_tokens": 4, "dsa_context": 224, "dsa_steps": 3, "trace_context": 128, "trace_steps": 3}

# %% [hide-input]
import numpy as np
import pandas as pd
import torch
from pydoc_data.topics import topics

import ess
import ess.hf
from ess import viz
from ess.cachesim import trace_misses
from ess.hf.figures import fig_rows_read
from ess.llm import reference_text
from ess.monitor import StepSeries
from ess.viz.monitor import fig_monitor

viz.use_notebook_renderer()
torch.set_num_threads(threads)
rec = ess.Recorder("11_bring_your_own_model", results_path, smoke=smoke)
model, tok = ess.hf.load_smollm2(source="ess")  # transformers' LlamaForCausalLM, the GGUF file's weights
print(type(model).__name__, ess.hf.model_info(model))

# %% [markdown]
# ## SmolLM2 through transformers, offload on and off
# A chat prompt holding one topic of Python's language reference and a question about it. `model.generate` runs
# unchanged with a `SparseCache` (K = L/16 of the prompt, `gen_ratio` of it on the device, the `gen_schedule`
# schedule over a `gen_link_GB_per_s` link); then the same decoding with every entry resident, logits kept.

# %%
chat = [{"role": "user", "content": topics[chat_topic] + "\n\n" + chat_question}]
ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
series = StepSeries(total_steps=gen_tokens)
cache = ess.hf.SparseCache(model, max_new_tokens=gen_tokens, ratio=gen_ratio, schedule=gen_schedule,
                           link_GB_per_s=gen_link_GB_per_s, on_step=series.add)
out = model.generate(ids, attention_mask=torch.ones_like(ids), cache=cache, max_new_tokens=gen_tokens,
                     do_sample=False)
cache.close()
print(repr(tok.decode(out[0, ids.shape[1]:])))
on = ess.hf.decode(model, ids, gen_tokens, ratio=gen_ratio, schedule=gen_schedule, link_GB_per_s=gen_link_GB_per_s)
off = ess.hf.decode(model, ids, gen_tokens, offload=False)
same_tokens = bool(np.array_equal(on.tokens, off.tokens)) and bool(np.array_equal(out[0, ids.shape[1]:].numpy(),
                                                                                     on.tokens[0, :gen_tokens]))
same_logits = bool(torch.equal(on.logits, off.logits))
gen_cfg = {"prompt_tokens": int(ids.shape[1]), "topk": cache.topk, "ratio": gen_ratio, "schedule": gen_schedule,
           "link_GB_per_s": gen_link_GB_per_s, "steps": gen_tokens, "pool_slots": cache.capacity}
print(f"prompt {ids.shape[1]} tokens, K = {cache.topk}, pool {cache.capacity} slots per layer; same tokens: "
      f"{same_tokens}, same logits bit for bit: {same_logits}")
rec.record("smollm2_tokens_identical", same_tokens, "bool", config=gen_cfg)
rec.record("smollm2_logits_identical", same_logits, "bool", config=gen_cfg)
assert same_tokens and same_logits, "offload changed SmolLM2's output through transformers"

# %% [markdown]
# What each step moved, from the counters a serving engineer knows (`cache_hits`, `cache_misses`,
# `host_to_device_bytes`, per step and layer): the live monitor's view of the `generate` call above, drawn once.

# %%
fig_monitor(series.frame(), series.misses_by_layer(), total_steps=gen_tokens,
            title=f"SmolLM2 through transformers + ess: {ids.shape[1]}-token prompt, ratio {gen_ratio}").show()
counts = cache.frame()
tot = series.totals()
print(counts.groupby("step")[["cache_hits", "cache_misses", "host_to_device_bytes"]].sum().head())
rec.record("smollm2_hit_rate", tot["hit_rate"], "fraction", config=gen_cfg)
rec.record("smollm2_bytes_h2d_per_step", tot["bytes_h2d"] / tot["steps"], "B", config=gen_cfg)
assert counts.host_to_device_bytes.sum() == tot["bytes_h2d"] > 0

# %% [markdown]
# ## DeepSeek-V3.2's own architecture
# transformers' `deepseek_v32` with a tiny random configuration (3 layers, hidden 64, 4 heads, latent rank 128 with a
# 16-dim RoPE part, an indexer of 2 heads choosing `dsa_index_topk` entries). transformers applies the indexer's
# top-K as a mask over every key, so each step reads the whole context; through `ess.hf` each step reads the K
# selected latent rows. With float32 entries the two agree to rounding; with ess's FP8 entries offloaded and
# all-resident decoding agree bit for bit.

# %%
dsa = ess.hf.tiny_dsa_model("deepseek_v32", index_topk=dsa_index_topk, seed=0)
dsa_ids = torch.randint(0, dsa.config.vocab_size, (2, dsa_context), generator=torch.Generator().manual_seed(0))
dense = ess.hf.dense_decode(dsa, dsa_ids, dsa_steps)
exact = ess.hf.decode(dsa, dsa_ids, dsa_steps, entry_dtype="float32", ratio=dsa_ratio, schedule="da")
fp8_on = ess.hf.decode(dsa, dsa_ids, dsa_steps, entry_dtype="fp8", ratio=dsa_ratio, schedule="dba")
fp8_off = ess.hf.decode(dsa, dsa_ids, dsa_steps, entry_dtype="fp8", offload=False)
diff = float((exact.logits - dense.logits).abs().max())
dsa_cfg = {"model": "deepseek_v32 tiny (3 layers)", "context": dsa_context, "steps": dsa_steps,
           "index_topk": dsa_index_topk, "ratio": dsa_ratio, "pool_slots": fp8_on.cache.capacity,
           "entry_bytes_fp8": fp8_on.cache.format.entry_bytes}
print(f"float32 entries against transformers' dense-masked attention: same tokens "
      f"{bool(np.array_equal(exact.tokens, dense.tokens))}, max |logit diff| {diff:.1e}")
print(f"FP8 entries ({fp8_on.cache.format.entry_bytes} B each), offloaded (DBA) against all-resident: same logits bit "
      f"for bit {bool(torch.equal(fp8_on.logits, fp8_off.logits))}")
rec.record("dsa_float32_max_logit_diff", diff, "logit", config=dsa_cfg)
rec.record("dsa_fp8_offload_identical", bool(torch.equal(fp8_on.logits, fp8_off.logits)), "bool", config=dsa_cfg)
assert np.array_equal(exact.tokens, dense.tokens) and diff < 1e-4
assert torch.equal(fp8_on.logits, fp8_off.logits) and np.array_equal(fp8_on.tokens, fp8_off.tokens)

# %% [markdown]
# The latent rows each layer of each step read, against the context it could read: K (the indexer's picks among the
# cached entries, plus the new token's own when picked), while the device pool holds `dsa_ratio` of the context.

# %%
c = fp8_on.counters
read = (c["cache_hits"] + c["cache_misses"]).mean(axis=(1, 2))                    # per step
fig_rows_read(c, dsa_context, dsa_index_topk, f"Rows read per step and layer, tiny DeepSeek-V3.2, "
                                              f"K = {dsa_index_topk}").show()
rec.record("dsa_rows_read_per_layer", float(read.mean()), "rows", config=dsa_cfg)
rec.record("dsa_pool_slots", fp8_on.cache.capacity, "slots", config=dsa_cfg)
assert read.max() <= dsa_index_topk < dsa_context and fp8_on.cache.capacity < dsa_context

# %% [markdown]
# GLM-5 (`glm_moe_dsa`) shares one indexer's top-K between consecutive layers; the same check, briefly.

# %%
glm = ess.hf.tiny_dsa_model("glm_moe_dsa", index_topk=dsa_index_topk, seed=0)
g_dense = ess.hf.dense_decode(glm, dsa_ids, dsa_steps)
g_exact = ess.hf.decode(glm, dsa_ids, dsa_steps, entry_dtype="float32", ratio=dsa_ratio, schedule="da")
g_diff = float((g_exact.logits - g_dense.logits).abs().max())
print(f"GLM-5 tiny: same tokens {bool(np.array_equal(g_exact.tokens, g_dense.tokens))}, max |logit diff| "
      f"{g_diff:.1e}")
rec.record("glm_float32_max_logit_diff", g_diff, "logit", config={**dsa_cfg, "model": "glm_moe_dsa tiny"})
assert np.array_equal(g_exact.tokens, g_dense.tokens) and g_diff < 1e-4

# %% [markdown]
# ## A model's selections as a trace
# A `SparseCache(..., record_trace=True)` (and `ess.hf.record_trace`, the `ess record-trace --model PATH` command)
# turns any transformers model's top-K sets into an `ess.traces` trace for the cache simulation and the simulator.
# SmolLM2 reads `trace_context` tokens of real text (Python's language reference), teacher-forced; replayed through
# the cache simulation, the trace misses exactly where the run missed.

# %%
text = tok.encode(reference_text()[:8 * (trace_context + trace_steps + 1)])[:trace_context + trace_steps + 1]
t_ids = torch.tensor([text[:trace_context]])
feed = np.array([text[trace_context:]])
run = ess.hf.decode(model, t_ids, trace_steps, feed=feed, ratio=gen_ratio, record_trace=True)
trace = run.cache.trace()                                                           # an ess.traces.Trace
sim = trace_misses(trace, "lru", capacity=run.cache.capacity)                      # (B, layers, steps)
measured = run.counters["cache_misses"].transpose(2, 1, 0)
print(f"trace: {trace.steps} steps x {trace.n_layers} layers, K = {trace.k}; simulated misses {int(sim.sum())}, "
      f"measured {int(measured.sum())}")
rec.record("trace_sim_misses_equal", bool(np.array_equal(sim, measured)), "bool",
           config={"context": trace_context, "steps": trace_steps, "ratio": gen_ratio, "topk": trace.k})
assert np.array_equal(sim, measured), "the cache simulation of the trace disagrees with the run"

# %%
saved = rec.save()
rec.to_frame()[["name", "value", "unit"]]

# %% [markdown]
# ## Summary
# * A transformers model decodes through ess's tiered cache with `model.generate(..., cache=ess.hf.SparseCache(model,
#   ...))`: SmolLM2 gives the same tokens and bit-for-bit the same logits offloaded or not.
# * DeepSeek-V3.2's and GLM-5's own architectures decode with their own indexer over latent entries in ess's byte
#   layout, equal to transformers' dense-masked attention to float32 rounding, reading K latent rows per step and
#   layer instead of the whole context.
# * The counters feed the live monitor, and any model's selections become a trace the cache simulation replays to
#   the same misses. How fast the transformers path is against ess's own engine: `benchmarks/README.md`.
