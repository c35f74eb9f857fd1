# %% [markdown]
# # 02 · Tiered storage
#
# * **Question.** Where do a batch's bytes live with offload, and how many entries, and bytes, does each decode step
#   move host to device?
# * **Method.** The memory model places the bytes; the real `ess.storage.TieredCache` (real bytes, real copies)
#   replays a synthetic top-K trace with and without LRU-Warmup and under three eviction policies; then the disk tier
#   and a live monitor.
# * **Where the answer is.** The placement in the first figure (*Where the bytes of a batch live*); misses and bytes
#   per step in the figures of *A trace through the real cache*, their time on the link in *What the bytes cost on the
#   link*; the policies in *Eviction policies on the same trace*; the conclusions under *Summary*.
#
# **Overview.** ESS keeps every latent entry of every request in host memory and only a hot subset on the GPU; each
# decode step copies the misses among the K selected entries host → device and writes the new token back
# (article §2, paper "Design"). This notebook shows where the bytes of a batch live for a GPU budget, ratio and
# context, then runs the real `ess.storage.TieredCache` (real bytes, real copies, LRU per layer) over a synthetic
# top-K trace and counts hits, misses and bytes per step, with and without LRU-Warmup and for three eviction
# policies; it ends with the disk tier (spill, restore, a corrupted block caught by its checksum) and a live monitor
# of a replay (link utilisation, hit rate, stall and misses per layer, step by step).
#
# **Prerequisites.** Notebook 01 (bytes per entry, the memory model, the ratio). The trace here is synthetic
# (`ess.tracegen.synthetic_trace`): each layer's adjacent-step overlap r follows the paper's locality figure (Fig. 2,
# read by eye, `data/locality/paper_fig2.yaml`, through `ess.tracegen.locality_profile`), with attention sinks and a
# local window. It demonstrates the mechanism; it does not reproduce the paper's per-layer miss counts or warmup
# curves, which are held back as prediction targets for later notebooks.

# %% [parameters]
smoke = False
results_path = ""
gpu = "H200"
context_len = 32768
ratio = 0.2
trace_context = 16384
trace_ratio = 0.25
trace_steps = 48
trace_layers = [0, 3, 18, 30, 50]
warmup_windows = 32
seed = 0
monitor_pace_s = 0.1
# the CI sizes: `ess reproduce --smoke` injects them as parameters (ess.parameters.smoke_sizes)
smoke_sizes = {"trace_context": 8192, "trace_ratio": 0.5, "trace_steps": 12, "warmup_windows": 8}

# %% [hide-input]
import dataclasses
import tempfile

import numpy as np
import pandas as pd
from IPython.display import display

import ess
from ess import viz
from ess.archive import Archive
from ess.disk import CorruptBlockError, DirectoryInUseError
from ess.layout import capacity_from_budget, capacity_from_ratio
from ess.memory import tier_placement
from ess.metrics import link_model
from ess.replay import COMPUTE_S_PER_LAYER, replay_steps, run_trace
from ess.storage import TieredCache
from ess.tracegen import Workload, locality_profile, synthetic_trace
from ess.traces import adjacent_overlap
from ess.viz.storage import fig_layer_misses, fig_policy_misses, fig_step_traffic, fig_tier_bytes
from ess.widgets.monitor import LiveMonitor
from ess.widgets.storage import storage_budget_view, storage_budget_widget

viz.use_notebook_renderer()
rec = ess.Recorder("02_tiered_storage", results_path, smoke=smoke)
model = ess.model_spec("deepseek-v3.2-exp")
entry = ess.latent_entry_bytes(model)
K = model.index_topk

# %% [markdown]
# ## Where the bytes of a batch live
# For the chosen GPU, context and ratio, the largest batch comes from the memory model of notebook 01; the GPU holds
# the weights, every request's indexer cache and `floor(ratio × tokens)` latent slots per request and layer (tokens
# rounded up to whole 64-token pages, `ess.layout.pool_slots`); host
# memory holds every latent entry; paused requests would sit on disk.

# %%
place = tier_placement(context_len, ratio, gpu=gpu)
a = place.attrs
fig_tier_bytes(place).show()
display(place.assign(GB=place.bytes / 1e9)[["tier", "part", "GB"]])
cfg = {"gpu": gpu, "context_len": context_len, "ratio": ratio, "deployment": a["deployment"]}
rec.record("batch", a["batch"], "requests/GPU", config=cfg, note=f"bounded by {a['limited_by']}")
rec.record("slots_per_request_layer", a["capacity"], "slots", config=cfg)
pool_bytes = float(place[(place.tier == "GPU") & (place.part == "latent pool")].bytes.sum())
host_bytes = float(place[(place.tier == "host") & (place.part == "latent cache (all)")].bytes.sum())
rec.record("gpu_latent_pool_bytes", pool_bytes, "B/GPU", config=cfg)
rec.record("host_latent_bytes", host_bytes, "B/GPU", config=cfg)
# the byte budget and the ratio must give the same pool: capacity_from_budget turns the pool bytes back into slots
assert a["batch"] > 0, a["reason"]
assert capacity_from_ratio(model, ratio, context_len) == a["capacity"]
assert capacity_from_budget(model, pool_bytes, a["batch"], context_len) == a["capacity"]
# and the pool is the ratio's share of the host copy (to within the floor of one slot per request and layer)
assert abs(pool_bytes / host_bytes - a["capacity"] / ess.layout.padded_tokens(model, context_len)) < 1e-12
assert pool_bytes <= ratio * host_bytes
print(f"batch {a['batch']} per GPU ({a['limited_by']}-bound), {a['capacity']} slots per request and layer: "
      f"{pool_bytes / 1e9:.1f} GB latent pool on the GPU, {host_bytes / 1e9:.0f} GB of latent cache in host memory")

# %% [markdown]
# ## A trace through the real cache
# One request of `trace_context` tokens; the cache holds the DeepSeek-V3.2-Exp entry (656 B) and K = 2,048 for a
# handful of the model's layers (the layer count of the copy is reduced so the run takes seconds; each simulated
# layer plays one paper layer with that layer's overlap r). One query token per step (no MTP), so a step selects
# exactly K entries per layer and the context grows by one token per step. Prefill entries are random bytes; every
# decode step selects K tokens per layer, the cache copies the misses host → device with the Numba transfer kernel
# (each loaded row checked against its host copy), and the new token is written back
# (`ess.replay.run_trace`). One run seeds each layer with LRU-Warmup from the last prefill windows, one does not.

# %%
overlap = locality_profile("paper")[trace_layers]
sim_model = dataclasses.replace(model, name=f"{model.name} ({len(trace_layers)} of {model.n_layers} layers)",
                                n_layers=len(trace_layers), n_dense_layers=0)
trace = synthetic_trace(Workload(trace_context, n_layers=len(trace_layers), k=K, mtp=1, steps=trace_steps, batch=1,
                                 warmup_windows=warmup_windows, profile=overlap, seed=seed))
measured_overlap = adjacent_overlap(trace)
rng = np.random.default_rng(seed)
prefill = rng.integers(0, 256, (len(trace_layers), trace_context, entry), dtype=np.uint8)
new_tokens = rng.integers(0, 256, (trace_steps, len(trace_layers), entry), dtype=np.uint8)
truth = np.concatenate([prefill, new_tokens.transpose(1, 0, 2)], axis=1)
trace_cfg = {"context_len": trace_context, "ratio": trace_ratio, "K": K, "steps": trace_steps,
             "layers": trace_layers, "overlap": [round(float(r), 3) for r in overlap], "seed": seed,
             "warmup_windows": warmup_windows, "policy": "lru", "backend": "numba", "mtp": 1,
             "trace": dict(trace.meta)}

trace_capacity = capacity_from_ratio(sim_model, trace_ratio, trace_context)     # the pool rule, checked >= K
caches, runs = {}, {}
for label, warm in (("LRU, no warmup", False), ("LRU-Warmup", True)):
    caches[label] = TieredCache(sim_model, capacity=trace_capacity, policy="lru", backend="numba")
    caches[label].add_request("req0", prefill)
    runs[label] = run_trace(caches[label], trace, "req0", warmup=warm, new_tokens=new_tokens, verify=True)
    st = runs[label].query("kind == 'step'")
    assert (st.hits + st.misses == K).all() and (st.bytes_h2d == st.misses * entry).all()
capacity = caches["LRU-Warmup"].capacity
print(f"{capacity} slots per layer ({capacity * entry / 1e6:.1f} MB), {trace_steps} steps x {len(trace_layers)} layers; "
      f"trace model {trace.meta.get('trace_model')!r}, measured overlap per layer {np.round(measured_overlap, 3).tolist()}")
# the generator delivers the profile it was given, within 0.05 (the sinks and the local window set a floor for r = 0)
assert np.all(measured_overlap >= overlap - 0.05), (measured_overlap, overlap)
assert np.all(measured_overlap[overlap > 0.1] <= overlap[overlap > 0.1] + 0.05), (measured_overlap, overlap)

# %%
# every resident entry of every layer equals its host copy byte for byte, and no pool exceeds its slots
for label, cache in caches.items():
    for layer in range(len(trace_layers)):
        m = cache.slot_map("req0", layer)
        assert len(m) <= cache.capacity
        toks, slots = np.fromiter(m, np.int64), np.fromiter(m.values(), np.int64)
        assert np.array_equal(cache.device_rows(slots), truth[layer, toks]), (label, layer)
    assert np.array_equal(cache.host.entries("req0"), truth)
per_step = {label: c.metrics.per_step() for label, c in caches.items()}
fig_step_traffic(per_step, entry_bytes=entry, k=K).show()
display(per_step["LRU-Warmup"].head(8))

# %%
frames = []
for label, df in runs.items():
    st = df[df.kind == "step"]
    frames.append(pd.DataFrame({"run": label, "layer": trace_layers, "overlap": measured_overlap,
                                "misses": st.groupby("layer").misses.mean().to_numpy(),
                                "first_step_misses": st[st.step == 1].misses.to_numpy()}))
by_layer = pd.concat(frames, ignore_index=True)
fig_layer_misses(by_layer).show()
display(by_layer)
warm = by_layer[by_layer.run == "LRU-Warmup"].reset_index(drop=True)
cold = by_layer[by_layer.run == "LRU, no warmup"].reset_index(drop=True)
# without warmup the first step misses all K entries of every layer; with it, only what the windows did not hold
assert (cold.first_step_misses == K).all()
assert (warm.first_step_misses < K).all() and (warm.first_step_misses <= cold.first_step_misses).all()
# the previous step's K entries are resident (LRU, capacity >= K), so decode step s (numbered from 1) misses at most
# the entries of its set that the previous step's set did not hold
sets = trace.indices[0]                                                  # (layers, steps, K)
fresh = np.array([[np.setdiff1d(sets[l, t], sets[l, t - 1]).size for t in range(1, trace_steps)]
                  for l in range(len(trace_layers))])
for run, df in runs.items():
    st = df.query("kind == 'step' and step > 1")
    assert (st.misses.to_numpy() <= fresh[st.layer.to_numpy(), st.step.to_numpy() - 2]).all(), run
# more locality, fewer misses (layer 0, r = 0, against the layer with the highest r)
assert warm.misses.iloc[int(np.argmax(overlap))] < warm.misses.iloc[int(np.argmin(overlap))]
for _, r in by_layer.iterrows():
    tag = "warmup" if r.run == "LRU-Warmup" else "nowarmup"
    rec.record(f"mean_misses_layer{r.layer}_{tag}", float(r.misses), "entries/step", config=trace_cfg)
    rec.record(f"first_step_misses_layer{r.layer}_{tag}", int(r.first_step_misses), "entries", config=trace_cfg)
tot = {label: c.metrics.totals() for label, c in caches.items()}
rec.record("warmup_loads", tot["LRU-Warmup"]["warmup"]["misses"], "entries", config=trace_cfg)
for label in caches:
    rec.record(f"step_bytes_h2d_{'warmup' if 'Warmup' in label else 'nowarmup'}", tot[label]["step"]["bytes_h2d"],
               "B", config=trace_cfg)
assert tot["LRU-Warmup"]["append"]["bytes_d2h"] == trace_steps * len(trace_layers) * entry   # new token only

# %% [markdown]
# ## What the bytes cost on the link
# The misses of one step and layer cross PCIe; at the FlashTrans rate (37 GB/s host → device, [BLOG]) and at one
# `cudaMemcpyAsync` per entry (0.79 GB/s, [BLOG]) the same bytes take very different times. Times are the bytes over
# the link rate, not measured here.

# %%
ft, per_entry = link_model("flashtrans_h2d"), link_model("memcpy_per_entry_h2d")
st = caches["LRU-Warmup"].metrics.to_frame().query("kind == 'step'")
mean_bytes = float(st.bytes_h2d.mean())
link = pd.DataFrame({"link": [ft.name, per_entry.name], "GB/s": [ft.bandwidth_GB_per_s, per_entry.bandwidth_GB_per_s],
                     "us per layer step": [ft.transfer_s(mean_bytes) * 1e6, per_entry.transfer_s(mean_bytes) * 1e6],
                     "source": [ft.source, per_entry.source]})
display(link)
rec.record("mean_h2d_bytes_per_layer_step", mean_bytes, "B", config=trace_cfg)
rec.record("h2d_us_per_layer_step_flashtrans", ft.transfer_s(mean_bytes) * 1e6, "us", config=trace_cfg,
           source=ft.source)
rec.record("h2d_us_per_layer_step_per_entry_copy", per_entry.transfer_s(mean_bytes) * 1e6, "us", config=trace_cfg,
           source=per_entry.source)
assert per_entry.transfer_s(mean_bytes) > 40 * ft.transfer_s(mean_bytes)

# %% [markdown]
# ## Eviction policies on the same trace
# LRU (the paper's), FIFO and heat (decayed access count, since this trace carries no indexer scores), same
# capacity, with LRU-Warmup. How far the policies part depends on how much long-range reuse the trace has beyond
# adjacent steps; the totals below are for this synthetic trace only.

# %%
rows = []
for policy in ("lru", "fifo", "heat"):
    cache = TieredCache(sim_model, capacity=trace_capacity, policy=policy, backend="numba")
    cache.add_request("req0", prefill)
    df = run_trace(cache, trace, "req0", warmup=True, new_tokens=new_tokens)
    rows.append({"policy": policy, "misses": int(df.query("kind == 'step'").misses.sum())})
    rec.record(f"total_misses_{policy}", rows[-1]["misses"], "entries", config={**trace_cfg, "policy": policy})
policies = pd.DataFrame(rows)
fig_policy_misses(policies).show()
display(policies)
assert policies.set_index("policy").misses["lru"] == tot["LRU-Warmup"]["step"]["misses"]   # same run, same count

# %% [markdown]
# ## The disk tier
# A paused request is spilled to a memory-mapped archive (blocks of 64 tokens × all layers, one CRC-32 each) and
# restored with its GPU pool (`ess.archive.Archive`, a cache paired with its folder); a flipped byte in a block is
# caught by its checksum. The archive owns its folder while it is open: a second one on the same folder is refused.

# %%
with tempfile.TemporaryDirectory() as tmp, Archive(TieredCache(sim_model, capacity=trace_capacity), tmp) as archive:
    cache = archive.cache
    cache.add_request("req0", prefill)
    for layer in range(len(trace_layers)):
        cache.warmup("req0", layer, trace.windows[0, layer])
    resident_before = [cache.resident("req0", l).tolist() for l in range(len(trace_layers))]
    archive.spill("req0")
    n_blocks = len(archive.disk.manifest("req0")["block_crc32"])
    blocks_file = archive.disk.block_path("req0")
    disk_bytes = blocks_file.stat().st_size
    info = archive.restore("req0")
    assert [cache.resident("req0", l).tolist() for l in range(len(trace_layers))] == resident_before
    assert np.array_equal(cache.host.entries("req0"), prefill)
    archive.spill("req0")
    with open(blocks_file, "r+b") as fh:                           # flip one byte of block 3
        fh.seek(3 * archive.disk.block_bytes + 100)
        b = fh.read(1)
        fh.seek(3 * archive.disk.block_bytes + 100)
        fh.write(bytes([b[0] ^ 0xFF]))
    try:
        archive.restore("req0")
        raise AssertionError("a corrupted block was not detected")
    except CorruptBlockError as exc:
        caught = exc.blocks
    assert caught == [3], caught
    try:
        Archive(TieredCache(sim_model, capacity=trace_capacity), tmp)
        raise AssertionError("a second archive on the same folder was not refused")
    except DirectoryInUseError:
        pass
disk_cfg = {"context_len": trace_context, "layers": len(trace_layers), "block_tokens": 64}
rec.record("disk_blocks", n_blocks, "blocks", config=disk_cfg)
rec.record("disk_archive_bytes", disk_bytes, "B", config=disk_cfg)
rec.record("restore_bytes_h2d", info["bytes_h2d"], "B", config=disk_cfg)
rec.record("corrupt_block_detected", caught[0], "block", config=disk_cfg)
print(f"spilled {disk_bytes / 1e6:.1f} MB in {n_blocks} blocks; restored {info['resident']} resident entries; "
      f"flipped byte found in block {caught}")

# %% [markdown]
# ## Try it: the memory budgets
# Move the sliders (needs a running kernel); the default view is drawn below.

# %%
fig, summary = storage_budget_view(gpu, context_len, ratio)
fig.show()
print(summary)
storage_budget_widget(gpu, context_len, ratio)

# %% [markdown]
# ## Watching a replay: the monitor
# The LRU-Warmup replay of the trace above once more, now followed while it runs: after every decode step the
# progress bar moves and the figure redraws the host-to-device link utilisation, the hit rate, the stall and the
# misses of each layer. The bytes and misses are the cache's own; the times are modelled, not measured: the misses
# cross the FlashTrans link (37 GB/s host to device, [BLOG]), every layer computes for 23.1 µs (one request's
# share of a 73.3 ms step over 61 layers at batch 52, paper Table 2) after its misses arrived (no overlap: a miss
# stalls the step). The replay takes milliseconds per step, so each step is held for `monitor_pace_s` seconds to
# be watched (`ess.replay.replay_steps`). A decode engine hands the monitor the same per-step rows (`ess.monitor`). The whole run is drawn once
# more below as a plain figure, which the book shows.

# %%
mon_cache = TieredCache(sim_model, capacity=trace_capacity, policy="lru", backend="numba")
mon_cache.add_request("req0", prefill)
monitor = LiveMonitor(trace_steps, layer_labels=[f"layer {l}" for l in trace_layers], pace_s=monitor_pace_s,
                      title=f"Replay of {trace_steps} steps, ratio {trace_ratio:g}, {trace_context // 1024}K, LRU-Warmup")
display(monitor.widget)
mon_totals = monitor.follow(replay_steps(mon_cache, trace, "req0", new_tokens=new_tokens))

# %%
monitor.figure().show()
mon = monitor.series.frame()
mon_cfg = {**trace_cfg, "link": ft.name, "compute_s_per_layer": COMPUTE_S_PER_LAYER, "overlap": "none"}
# the monitor saw every step of the replay, and the same misses as the LRU-Warmup run above (same trace and cache)
ref = runs["LRU-Warmup"].query("kind == 'step'").pivot(index="layer", columns="step", values="misses")
assert monitor.progress.value == trace_steps and list(mon.step) == list(range(1, trace_steps + 1))
assert np.array_equal(monitor.series.misses_by_layer(), ref.to_numpy())
assert mon_totals["bytes_h2d"] == tot["LRU-Warmup"]["step"]["bytes_h2d"]
assert np.allclose(mon.stall_s, mon.bytes_h2d / (ft.bandwidth_GB_per_s * 1e9))
rec.record("monitor_hit_rate", mon_totals["hit_rate"], "", config=mon_cfg)
rec.record("monitor_link_utilisation", mon_totals["link_utilisation"], "", config=mon_cfg,
           note="host-to-device busy time over elapsed time (modelled)")
rec.record("monitor_stall_us_per_step", mon_totals["stall_s"] / trace_steps * 1e6, "us", config=mon_cfg)
print(f"{len(mon)} steps watched ({monitor.redraws} redraws): hit rate {mon_totals['hit_rate']:.3f}, link "
      f"utilisation {mon_totals['link_utilisation']:.3f}, stall {mon_totals['stall_s'] / trace_steps * 1e6:.1f} us "
      f"per step")

# %%
saved = rec.save()
rec.to_frame()[["name", "value", "unit"]]

# %% [markdown]
# ## Summary
# * At 32K on an H200 with ratio 0.2, the GPU keeps a fifth of each request's latent cache and the batch grows from
#   the no-offload limit to the value recorded above; the whole latent cache of that batch sits in host memory.
# * Through the real cache, a step misses at most the entries its top-K set did not share with the previous step's
#   (about (1 − r)·K for a layer with overlap r); without warmup the first step misses all K in every layer, and
#   LRU-Warmup removes most of that burst.
# * The eviction policies' totals on this synthetic trace are in the table above; the trace decides how far they
#   part.
# * Every entry read back from the GPU pool equals its host copy; a corrupted disk block is caught by its CRC-32.
# * The monitor follows a run step by step from per-step rows (misses and hits per layer, bytes, link time, stall);
#   here it watched the replay and showed the same misses the cache logged.
#
# **Next:** sparse attention over the hits and the misses, merged exactly (notebook 03).
