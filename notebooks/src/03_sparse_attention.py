# %% [markdown]
# # 03 · Sparse attention
#
# * **Question.** Do the indexer and sparse MLA kernels compute what they should, is attention through the tiered
#   cache exactly attention over an all-resident cache, and what do sparse attention and FP8 storage save?
# * **Method.** The `ess` kernels (NumPy reference, Numba, torch) on synthetic latents, keys and queries: checks
#   against the reference, a bit-for-bit comparison through the cache, a timing scan over the context length, and the
#   error of FP8 against BF16 storage.
# * **Where the answer is.** The check tables of *The kernels agree, and sparse with K ≥ L is dense* and *The lossless
#   check* (record `lossless_all_bitwise_equal`); the figure of *Cost: dense against sparse attention as L grows*; the
#   figure of *Precision*; the conclusions under *Summary*.
#
# **Overview.** DeepSeek Sparse Attention is why offload works at all: at each decode step a cheap *lightning
# indexer* scores every cached token with a small FP8 key, and sparse MLA attention then reads only the top
# K = 2,048 latent entries. This notebook runs both for real with the `ess` kernels (NumPy reference, Numba,
# torch): what the indexer selects on a small example, the checks that the kernels agree and that sparse attention
# with K ≥ L is dense attention, the **lossless check** (attention read through the tiered cache equals attention
# over an all-resident cache, bit for bit), the measured cost of dense against sparse attention as L grows, and the
# precision of FP8 (656 B) against BF16 (1,152 B) latent storage.
#
# **Prerequisites.** Notebook 01 (byte layouts) and notebook 02 (the tiered cache). Inputs here are synthetic
# (random latents, keys and queries): the notebook measures the kernels and the storage, not a trained model.

# %% [parameters]
smoke = False
results_path = ""
backend = "numba"
scan_context_lens = [2048, 4096, 8192, 16384, 32768]
scan_heads = 128
scan_repeats = 5
scan_threads = 1
precision_tokens = 8192
lossless_ratios = [0.1, 0.3, 1.0]
lossless_policies = ["lru", "fifo", "heat"]
# the CI sizes: `ess reproduce --smoke` injects them as parameters (ess.parameters.smoke_sizes)
smoke_sizes = {"scan_context_lens": [2048, 4096, 8192], "scan_heads": 32, "precision_tokens": 2048,
               "lossless_ratios": [0.1, 1.0], "lossless_policies": ["lru", "fifo"]}

# %% [hide-input]
import numpy as np
import pandas as pd
from IPython.display import display

import ess
from ess import attention as A
from ess import bench, quant, viz
from ess.studies import attention as studies
from ess.viz.attention import fig_attention_cost, fig_indexer_selection, fig_storage_precision

viz.use_notebook_renderer()
rec = ess.Recorder("03_sparse_attention", results_path, smoke=smoke)
full = ess.model_spec("deepseek-v3.2-exp")
tiny = ess.model_spec("tiny")

# %% [markdown]
# ## The softmax scale
# Sparse MLA scales the logits by `(qk_nope + qk_rope)^-0.5 · mscale²` with the YaRN `mscale = 0.1 ln(40) + 1`
# (paper-facts.md, DeepSeek's `inference/model.py`): `192^-0.5 · 1.369² = 0.1352` for the full model.

# %%
sm = rec.record("softmax_scale_full", A.softmax_scale(full), "", config={"model": full.name},
                source="paper-facts.md: 192^-0.5 x mscale^2, mscale = 0.1 ln(40) + 1")
assert abs(sm - 192 ** -0.5 * (0.1 * np.log(40) + 1) ** 2) < 1e-12, sm
print(f"softmax scale {sm:.4f} (full model), {A.softmax_scale(tiny):.4f} (tiny: 48^-0.5, no YaRN)")

# %% [markdown]
# ## What the indexer selects
# A small synthetic prefill with the `tiny` geometry (4 indexer heads × 32 dims): each query position t asks for
# the key of token t − 8 (plus noise), and token 0 has a large key. Keys are stored as 36-byte FP8 entries; the
# scores are causal (−∞ above the diagonal), and the red crosses are each row's top-16 picks.

# %%
example = studies.indexer_selection_example(tiny, 96, topk=16, lag=8, backend=backend)
fig_indexer_selection(example).show()
idx = example["indices"]
T = idx.shape[0]
causal_ok = all((idx[t][idx[t] >= 0] <= t).all() for t in range(T))
padded_ok = all((idx[t] >= 0).sum() == min(16, t + 1) for t in range(T))
top_is_lag = np.mean([np.argmax(example["scores"][t]) == t - 8 for t in range(8, T)])   # best-scored pick
rec.record("indexer_example_top1_is_lagged_token", top_is_lag, "fraction",
           config={"model": tiny.name, "tokens": T, "topk": 16, "lag": 8, "backend": backend})
assert causal_ok and padded_ok, "top-k picked an invisible token or padded wrongly"
assert top_is_lag > 0.9, f"the indexer should find the looked-for token first, got {top_is_lag:.2f}"
print(f"causal: {causal_ok}, -1 padding below K tokens: {padded_ok}, top pick = token t-8 in {top_is_lag:.0%} of rows")

# %% [markdown]
# ## The kernels agree, and sparse with K ≥ L is dense
# Every backend reads the same stored bytes (FP8 indexer keys, 656-byte latents) and is compared with the float64
# reference; sparse attention whose top-K covers every token is compared with an independent dense computation;
# attention split into two disjoint index sets and merged by log-sum-exp is compared with one pass.

# %%
rng = np.random.default_rng(0)
B, L, H = 2, 301, 7
lat = quant.encode_latent(rng.standard_normal((B, L, full.kv_lora_rank)),
                          rng.standard_normal((B, L, full.qk_rope_head_dim)), full)
keys = quant.encode_indexer_keys(rng.standard_normal((B, L, full.index_head_dim)), full)
q = rng.standard_normal((B, H, full.latent_dim)).astype(np.float32)
qi, w = rng.standard_normal((B, 5, full.index_head_dim)), rng.random((B, 5))
lengths = np.array([L, 123])
agree = {}
ref_scores = A.indexer_scores(qi, w, keys, lengths, backend="reference")
topk = A.topk_indices(ref_scores, 2048)                                  # K = 2,048 > L: every visible token
ref = A.sparse_mla_decode(q, lat, topk, full, backend="reference")
for be in ("numba", "torch"):
    s = A.indexer_scores(qi, w, keys, lengths, backend=be)
    vis = np.isfinite(ref_scores)
    o = A.sparse_mla_decode(q, lat, topk, full, backend=be)
    agree[be] = {"indexer_max_rel_err": float(np.abs(s[vis] - ref_scores[vis]).max() / np.abs(ref_scores[vis]).max()),
                 "mla_max_abs_err": float(np.abs(o.out - ref.out).max())}
dense = A.dense_mla_decode(q, lat, full, lengths)
half = np.where(rng.random(topk.shape) < 0.5, topk, -1)
merged = A.split_attention(q, lat, half, np.where(half >= 0, -1, topk), full, backend=backend)
checks = pd.DataFrame(agree).T
checks.loc["sparse K>=L vs dense", "mla_max_abs_err"] = float(np.abs(ref.out - dense.out).max())
checks.loc["split + merge vs one pass", "mla_max_abs_err"] = float(np.abs(merged.out - ref.out).max())
for name, row in checks.iterrows():
    for col, v in row.dropna().items():
        rec.record(f"check_{name}_{col}".replace(" ", "_").replace(">=", "ge").replace("+", "plus"), v, "",
                   config={"B": B, "L": L, "H": H, "lengths": lengths, "model": full.name})
assert (checks.fillna(0).to_numpy() < 1e-4).all(), checks
display(checks)

# %% [markdown]
# ## The lossless check: attention through the tiered cache
# For each sparse-memory ratio and eviction policy, four decode steps over every layer of `tiny` (batch 2, K = 64;
# the context is the shortest whole number of 64-token pages, at least 4 K, at which the smallest ratio's pool of
# `floor(ratio × tokens)` slots holds one step's K entries; the indexer queries alternate between two "topics", so
# entries come back) run through `ess.storage.TieredCache` with `ess.decode.decode_layer`: indexer → top-K → plan
# (hits resolved, victims chosen, misses' slots reserved) → copy (misses host → device) → attention over the device
# slots → commit. The baseline attends over the all-resident cache with the same indices. ESS moves storage and does not change the maths [BLOG], so the two
# must agree **bit for bit** on the same backend.

# %%
lossless = studies.lossless_check(tiny, ratios=lossless_ratios, policies=lossless_policies, batch=2, steps=4,
                            backend=backend)
display(lossless)
print(f"context {lossless.attrs['config']['L']} tokens; pool slots per ratio: "
      f"{dict(zip(lossless.ratio, lossless.capacity))}")
for _, r in lossless.iterrows():
    rec.record(f"lossless_ratio{r.ratio:g}_{r.policy}_misses", r.misses, "entries",
               config={**lossless.attrs["config"], "ratio": r.ratio, "policy": r.policy, "capacity": r.capacity},
               note=f"bitwise equal: {r.bitwise_equal}")
rec.record("lossless_all_bitwise_equal", bool(lossless.bitwise_equal.all()), "", config=lossless.attrs["config"],
           published=True, source="[BLOG] ESS is lossless (paper-facts.md, Headline claims)", status="compared")
assert lossless.bitwise_equal.all(), "attention through the cache differs from attention over resident entries"
assert (lossless.misses > 0).all(), "the check must serve misses through the cache"

# %% [markdown]
# ## Cost: dense against sparse attention as L grows
# One decode step of one request and layer, measured with the kernels from stored FP8 entries: dense MLA over all
# L entries, sparse MLA over K = 2,048, and the indexer over L keys (64 heads × 128 dims). Per step, dense grows
# with L while sparse attention stays flat; summed over the L steps of a sequence that is O(L²) against O(L·K),
# plus the indexer's O(L²) at a much smaller constant. Times depend on this machine and on what else runs on it;
# the scan uses one thread (`scan_threads`) because on a shared two-core machine a two-thread kernel waits for
# whichever thread the OS has descheduled, which swamps millisecond timings. The scan is the `attention_cost`
# benchmark (`benchmarks/attention_cost.py`), run in its own process so that its thread setting stays there.

# %%
scan = bench.run_benchmark("attention_cost", model=full.name, context_lens=scan_context_lens, heads=scan_heads,
                           backend=backend, repeats=scan_repeats, threads=scan_threads)
cost = pd.DataFrame(scan["rows"])
cost.attrs["config"] = scan["config"]
fig_attention_cost(cost).show()
display(cost[["context_len", "dense_s", "sparse_s", "indexer_s", "sparse_total_s"]])
for _, r in cost.iterrows():
    for col in ("dense_s", "sparse_s", "indexer_s"):
        rec.record(f"cost_{col[:-2]}_L{int(r.context_len)}", r[col] * 1e3, "ms/step",
                   config={**cost.attrs["config"], "context_len": int(r.context_len)})
last, first = cost.iloc[-1], cost.iloc[0]
speedup = rec.record("dense_over_sparse_at_max_L", last.dense_s / last.sparse_total_s, "x",
                     config={**cost.attrs["config"], "context_len": int(last.context_len)})
growth = last.context_len / first.context_len
assert growth >= 4 and last.context_len >= 4 * cost.attrs["config"]["K"], "scan a factor >= 4 in L, up to >= 4 K"
# wall times are measured, not asserted (the machine may be shared): the benchmark reports the ratios the model
# expects, dense growing about as fast as L and sparse well below dense past K
for key in ("dense_growth_over_context_growth", "sparse_over_dense_at_max_L"):
    rec.record(key, scan[key], "ratio", config={**cost.attrs["config"], "context_len": int(last.context_len)})
print(f"at L = {int(last.context_len)}: dense {last.dense_s * 1e3:.1f} ms, sparse {last.sparse_total_s * 1e3:.1f} ms "
      f"(indexer {last.indexer_s * 1e3:.1f} ms) per step: {speedup:.1f}x; dense grew "
      f"{scan['dense_growth_over_context_growth']:.2f}x as fast as L, sparse / dense "
      f"{scan['sparse_over_dense_at_max_L']:.2f}")

# %% [markdown]
# ## Precision: FP8 (656 B) against BF16 (1,152 B) latent storage
# The same synthetic latents are stored in both layouts and attended with the float64 reference; the error is
# measured against float64 attention over the unquantised latents. The article says 8-bit quantisation "cuts cache
# size by 50% at the cost of 0.5–1.2% accuracy loss" (article §1.2). Two things differ: the FlashMLA FP8 entry is
# 656 / 1,152 = 56.9 % of the BF16 entry (the scales and the BF16 rope part stay), a 43.1 % cut, not 50 %; and what
# we measure is the relative error of one attention output on random inputs, **not** a task-accuracy loss, so it
# neither confirms nor refutes the 0.5–1.2 %. With standard-normal inputs the logits spread widely
# (0.1352 · √576 ≈ 3.2), so a few entries dominate each head and their FP8 rounding (3 mantissa bits, up to 6.25 %
# per value) passes into the output almost undiluted: this is a demanding case, not a typical one.

# %%
prec = studies.storage_precision(full, precision_tokens, n_heads=scan_heads, backend="reference")
fig_storage_precision(prec).show()
display(prec.drop(columns="config"))
fp8, bf16 = prec.set_index("dtype").loc["fp8"], prec.set_index("dtype").loc["bf16"]
cut = rec.record("fp8_size_cut_vs_bf16", 1 - fp8.entry_bytes / bf16.entry_bytes, "fraction",
                 config={"model": full.name}, published=0.5, source="article §1.2 (8-bit quantisation cuts 50%)",
                 note="656 B FP8 entry vs 1,152 B BF16 entry", status="compared")
for d, r in (("fp8", fp8), ("bf16", bf16)):
    rec.record(f"attention_output_rel_rms_error_{d}", r.rel_rms_error, "fraction", config=r.config,
               note="output error of one attention layer on synthetic inputs, not task accuracy")
assert (fp8.entry_bytes, bf16.entry_bytes) == (656, 1152)
assert bf16.rel_rms_error < fp8.rel_rms_error, prec
print(f"FP8 saves {cut:.1%} of the latent bytes; output error FP8 {fp8.rel_rms_error:.2%}, "
      f"BF16 {bf16.rel_rms_error:.2%} (relative RMS)")

# %%
saved = rec.save()
rec.to_frame()[["name", "value", "unit", "published", "error"]]

# %% [markdown]
# ## Summary
# * The lightning indexer, top-K (ties to the lower token, −1 padding) and sparse MLA in MQA mode run from the stored
#   FP8 bytes on three backends that agree with the float64 reference; sparse attention with K ≥ L equals dense
#   attention, and split attention merged by log-sum-exp equals one pass.
# * Attention read through the tiered cache equals attention over the all-resident cache bit for bit, at every ratio
#   and policy tried: offload changes where entries live, not the result.
# * Per decode step, dense attention grows with L while sparse attention over K entries stays flat; the indexer is
#   the part of sparse attention that still scans the whole context.
# * FP8 storage is 56.9 % of BF16 (a 43 % cut, not the article's 50 %); its attention-output error on synthetic
#   inputs is shown above, an output error rather than the task-accuracy figure the article quotes.
#
# **Next:** the cost of each stage on the GPU and the overlap of transfers with attention (simulator notebooks).
