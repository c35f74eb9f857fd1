"""The beyond-the-paper grid as tables and records (notebook 10): the grid's findings one row per cell, the records
of every cell with its configuration, source and bands, the paper's own configuration inside the grid checked
against notebook 07's prediction of it, and what ess models next to what it does not.

The predictions come from :mod:`ess.sim.grid`; nothing here computes a throughput of its own.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .. import validate
from ..published import published
from ..sim import grid as sgrid
from ..specs import reference_link
from ..viz.grid import context_label

__all__ = ["SCOPE", "model_scope", "model_cache_table", "grid_table", "grid_records", "reference_cells", "paper_cell",
           "notebook07_record", "findings"]

#: what ess models and what it leaves out, one row per part of a deployment (the book's and the README's table)
SCOPE = (
    ("decode step", "one GPU's decode step: Two-Batch Overlap, MTP drafts and heads, the per-layer choice of none / "
                    "DA / DBA, each operation a roofline on measured kernel efficiencies with part-batch costs",
     "prefill: neither prefill chunks sharing the decode GPUs nor their interference with decoding",
     "both throughputs fall; offload's larger batch also asks for more prefill per second"),
    ("disaggregation", "decode-only instances in the paper's shape (attention data-parallel, EP 32)",
     "prefill-decode disaggregation: the KV transfer from prefill nodes, its landing in host memory",
     "a transfer into host memory would compete with offload's copies on the same link"),
    ("network", "the expert-parallel all-to-all at DeepEP's measured bandwidth for the EP size (RDMA), or its NVLink "
                "figures scaled to a decode batch (GB200 NVL72)",
     "contention between nodes, other traffic on the NICs, expert load imbalance (every expert receives its mean "
     "share)", "a longer all-to-all lane hides more of offload's stall; imbalance lengthens the slowest GPU's step"),
    ("memory", "weights per GPU, the KV budget (the paper's runtime reserve kept in GiB), the host memory per GPU, "
               "the pool that must hold one step's union of MTP selections",
     "fragmentation of the pools, the compressors' in-progress state (DeepSeek-V4), activations growing with the "
     "batch", "real limits are somewhat lower than ess's"),
    ("host link", "per-direction copy rates (measured where public), capped at each GPU's share of the host's DRAM "
                  "bandwidth",
     "per-copy latency and launch costs (the link is bandwidth only), PCIe switches shared by two GPUs, NUMA "
     "distance, several GPUs copying at once beyond their DRAM share",
     "small, scattered copies cost more than bandwidth alone says"),
    ("power and clocks", "datasheet peaks times measured efficiencies; TDP as a figure of each GPU",
     "power capping and clock throttling (FlashMLA's authors report ~1,600 MHz on H800 under load), energy beyond "
     "notebook 08's TDP estimate", "throughput at the real clocks is lower on both sides"),
    ("cache contents", "FP8 latent entries and FP8 indexer keys of each model, exact (lossless) sparse attention",
     "KV compression or eviction (SnapKV), FP4 indexer keys (68 B), accuracy effects of any of them",
     "smaller entries fit more requests with or without offload"),
    ("serving engine", "any whole batch up to the memory limit and 320 per GPU (the calibrated range)",
     "CUDA graph capture limits (graphs for a set of batch sizes, padding between them), admission control, "
     "request arrivals, mixed context lengths in one batch", "the batch a real engine runs is coarser and often "
                                                              "smaller"),
    ("speculative decoding", "MTP with a fixed accept ratio (1.7 at MTP 2, DeepSeek-V3.2-Exp's, for every model)",
     "acceptance that depends on the model and the task", "throughput scales with the accept ratio"),
    ("locality", "synthetic traces matched to paper Fig. 2 and vLLM's hit rate, LRU with warmup, Fig. 2 mapped onto "
                 "another model's depth (an extrapolation)",
     "measured selections of GLM-5 or DeepSeek-V4, workload-dependent locality, CLOCK or other replacement in "
     "production engines", "misses, and so every offload gain, move with the locality"),
)


def model_scope() -> pd.DataFrame:
    """:data:`SCOPE` as a table: ``part``, ``ess models``, ``ess does not model``, ``what it would change``."""
    return pd.DataFrame(SCOPE, columns=["part", "ess models", "ess does not model", "what it would change"])


def model_cache_table(models, *, context_len: int = 131072) -> pd.DataFrame:
    """Each model's cache as ess sizes it (:mod:`ess.layout`, :mod:`ess.memory`): layers and sparse layers, the
    latent row and indexer key in bytes, cache bytes per token on a long context, the share offload moves, what one
    decode step reads per request and sparse layer (its top-K rows), what the indexer scans per sparse layer at
    ``context_len``, one request's cache at ``context_len`` (page-padded; windows and dense rows included) and the
    weights per GPU in the paper's deployment (EP 32)."""
    from ..layout import indexer_entry_bytes, latent_entry_bytes, request_cache, token_bytes
    from ..memory import weights_per_gpu_bytes
    from ..specs import deployment_spec, model_spec
    from ..validate import positive_int
    context_len = positive_int("context_len", context_len)
    dep = deployment_spec("paper-table1")
    rows = []
    for m in models:
        spec = model_spec(m)
        entry, idx = latent_entry_bytes(spec), indexer_entry_bytes(spec)
        L = min(int(context_len), spec.max_position_embeddings)
        rc = request_cache(spec, L)
        per_token = token_bytes(spec)
        offload_share = spec.n_sparse_layers * entry / spec.sparse_compress_ratio / per_token
        rows.append({"model": m, "layers": spec.n_layers, "sparse_layers": spec.n_sparse_layers,
                     "tokens_per_row": spec.sparse_compress_ratio, "top_k": spec.index_topk,
                     "latent_row_B": entry, "indexer_key_B": idx, "cache_B_per_token": per_token,
                     "offloaded_share": offload_share, "step_read_per_layer_B": spec.index_topk * entry,
                     "indexer_scan_per_layer_B": spec.sparse_rows(L) * idx, "context_len": L,
                     "request_GB": rc.total_bytes / 1e9, "resident_GB": rc.resident_bytes / 1e9,
                     "weights_per_gpu_GB": weights_per_gpu_bytes(spec, dep) / 1e9,
                     "max_context": spec.max_position_embeddings})
    return pd.DataFrame(rows)


def grid_table(df: pd.DataFrame) -> pd.DataFrame:
    """The grid one row per cell, for display: model, GPU, link, context, the best offload batch and ratio and what
    binds, the gain with its calibration and extrapolation bands, the throughputs per GPU, the link speeds."""
    cols = {"model": "model", "gpu": "GPU", "link": "link", "context_len": "context", "batch_no_offload":
            "batch (no offload)", "limit_no_offload": "binds (no offload)", "best_batch": "batch", "best_ratio":
            "ratio", "limit": "binds", "throughput_no_offload": "tok/s/GPU (no offload)", "throughput":
            "tok/s/GPU", "gain_pct": "gain %", "gain_pct_cal_low": "cal. low", "gain_pct_cal_high": "cal. high",
            "gain_pct_low": "extr. low", "gain_pct_high": "extr. high", "break_even_GB_per_s": "break-even GB/s",
            "serial_GB_per_s": "DA/DBA stop mattering GB/s", "hidden_GB_per_s": "copies hidden GB/s",
            "calibrated_cell": "calibrated"}
    out = df[[c for c in cols if c in df]].rename(columns=cols)
    return out


def _band(lo, hi):
    return [None if pd.isna(lo) else float(lo), None if pd.isna(hi) else float(hi)]


def grid_records(df: pd.DataFrame, inputs: "sgrid.GridInputs", provenance: dict) -> list[dict]:
    """The records of every cell (notebook 10), as keyword arguments of :meth:`ess.results.Recorder.record`: its
    gain over no offload (``low`` / ``high`` the extrapolation band; the configuration holds the calibration band,
    which parts are calibrated and which extrapolated, the best batch and ratio, what binds, the link), its best
    throughput per GPU with the same bands, the break-even link speed and the speeds from which the copies are
    hidden and DA / DBA stop mattering. ``provenance`` (the calibration, the bands, the cache simulation) goes into
    every configuration."""
    out = []
    for _, r in df.iterrows():
        tag = f"{r.model}_{r.gpu}_{r.link}_{context_label(r.context_len)}"
        prov = sgrid.cell_provenance(r.model, r.gpu)
        cfg = {"model": r.model, "gpu": r.gpu, "link": r.link, "link_label": r.link_label,
               "h2d_GB_per_s": float(r.h2d_GB_per_s), "d2h_GB_per_s": float(r.d2h_GB_per_s),
               "link_measured": bool(r.link_measured), "host": r.host, "deployment": r.deployment,
               "context_len": int(r.context_len), "mtp": int(r.mtp), "accept_ratio": float(r.accept_ratio),
               "calibrated": prov["calibrated"], "extrapolated": prov["extrapolated"],
               "calibrated_cell": prov["calibrated_cell"], **provenance}
        src = ("ess.sim.grid: the calibrated simulator (notebook 05) with the cache simulation's misses at the "
               "model's geometry; specs in data/models, data/hardware, data/deployments")
        if pd.isna(r.get("best_batch", np.nan)):
            out.append(dict(name=f"gain_{tag}", value=None, unit="%", config=cfg, source=src,
                            note=f"infeasible: {r.reason}", status="predicted"))
            continue
        cfg.update(best_batch=int(r.best_batch), best_ratio=float(r.best_ratio), limit=r.limit,
                   ratio_floor=bool(r.ratio_floor), ratios_tried=list(r.ratios_tried),
                   batch_no_offload=int(r.batch_no_offload), limit_no_offload=r.limit_no_offload,
                   throughput_no_offload=float(r.throughput_no_offload),
                   misses_per_layer=float(r.misses_per_layer),
                   band_calibration=_band(r.gain_pct_cal_low, r.gain_pct_cal_high),
                   band_size=int(r.band_size), band_infeasible=int(r.band_infeasible))
        band_kind = "calibration band (nothing extrapolated)" if prov["calibrated_cell"] else "extrapolation band"
        out.append(dict(name=f"gain_{tag}", value=float(r.gain_pct), unit="%", config=cfg, source=src,
                        note=f"best offload batch {int(r.best_batch)} at ratio {r.best_ratio:g} ({r.limit} binds) "
                             f"against {int(r.batch_no_offload)} without offload ({r.limit_no_offload} binds); "
                             f"low/high: the {band_kind}; calibration band {r.gain_pct_cal_low:+.1f} to "
                             f"{r.gain_pct_cal_high:+.1f} %", low=float(r.gain_pct_low), high=float(r.gain_pct_high),
                        status="predicted"))
        out.append(dict(name=f"throughput_{tag}", value=float(r.throughput), unit="tokens/s per GPU",
                        config={**cfg, "band_calibration": _band(r.throughput_cal_low, r.throughput_cal_high)},
                        source=src, note=f"the best offload configuration; low/high: the {band_kind}",
                        low=float(r.throughput_low), high=float(r.throughput_high), status="predicted"))
        for col, what in (("break_even_GB_per_s", "the host-to-device speed below which offload stops paying "
                                                  "(the best configuration re-chosen at each speed)"),
                          ("serial_GB_per_s", "the host-to-device speed from which DA and DBA stop mattering (the "
                                              "serial copy within 1 % of the no-offload step of the per-layer "
                                              "choice)"),
                          ("hidden_GB_per_s", "the host-to-device speed from which the copies are hidden (the "
                                              "stall within 1 % of the no-offload step)")):
            if col not in r:
                continue
            v = r[col]
            lo_span, hi_span = sgrid.LINK_RANGE_GB_PER_S
            if pd.isna(v):
                note = f"{what}: not reached up to {hi_span:g} GB/s"
                if col == "break_even_GB_per_s":
                    note = f"{what}: offload does not pay at any speed up to {hi_span:g} GB/s"
                out.append(dict(name=f"{col.replace('_GB_per_s', '')}_link_{tag}", value=None, unit="GB/s",
                                config=cfg, source=src, note=note, status="predicted"))
                continue
            note = what + (f"; at or below {lo_span:g} GB/s already" if v <= lo_span else "")
            out.append(dict(name=f"{col.replace('_GB_per_s', '')}_link_{tag}", value=float(v), unit="GB/s",
                            config=cfg, source=src, note=note, status="predicted"))
    return out


def reference_cells(df: pd.DataFrame) -> pd.DataFrame:
    """The cells of each GPU's reference link (:func:`ess.specs.reference_link`): one row per model, GPU and
    context, what the summary figures show."""
    keep = df.apply(lambda r: r.link == reference_link(r.gpu), axis=1)
    return df[keep]


def paper_cell(evaluated: pd.DataFrame, t2: pd.DataFrame) -> pd.DataFrame:
    """The paper's own configuration inside the grid beside notebook 07's predictions of it: for every row of ``t2``
    (:func:`ess.tables.sim.table2_predictions` with the same calibration and miss table, one setting each) the
    grid's value at that row's batch and ratio (``evaluated``: :func:`ess.sim.grid.evaluate_configs`, rows in the
    same order), ``equal`` where they agree to 1e-9 relative (tokens/s per node)."""
    if len(evaluated) != len(t2):
        raise ValueError(f"evaluated has {len(evaluated)} rows, t2 {len(t2)}: one evaluation per row of t2")
    g = evaluated.throughput.to_numpy(dtype=float)
    n7 = t2.throughput.to_numpy(dtype=float)
    return pd.DataFrame({"row": t2.row.to_numpy(), "setting": t2.setting.to_numpy(),
                         "batch": t2.batch.astype(int).to_numpy(), "ratio": t2.ratio.to_numpy(dtype=float),
                         "notebook_07": n7, "grid": g, "equal": np.abs(g - n7) <= 1e-9 * np.abs(n7)})


def notebook07_record(results_path, name: str, smoke: bool):
    """The value notebook 07 recorded under ``name`` in the results folder of ``results_path`` (this notebook's
    results file), when that run was at the same size (``smoke``); None when there is none (07 not run, or at
    another size)."""
    from ..results import load_results
    smoke = validate.boolean("smoke", smoke)
    if not results_path:
        return None
    path = Path(results_path).parent / "07_table_32k.json"
    if not path.is_file():
        return None
    res = load_results(path)
    if res.run.get("smoke") != smoke:
        return None
    for r in res.records:
        if r.name == name:
            return r.value
    return None


def findings(df: pd.DataFrame) -> pd.DataFrame:
    """The grid's findings per model and context at each GPU's reference link: how many GPUs offload pays on (gain
    above 1 %), the median and the range of the gain, and the median break-even link speed."""
    ref = reference_cells(df)
    rows = []
    for (m, L), part in ref.groupby(["model", "context_len"], sort=False):
        g = part.gain_pct
        rows.append({"model": m, "context_len": int(L), "gpus": len(part), "pays_on": int((g > 1).sum()),
                     "gain_median_pct": float(g.median()), "gain_min_pct": float(g.min()),
                     "gain_max_pct": float(g.max()),
                     "break_even_median_GB_per_s": float(part.break_even_GB_per_s.median())
                     if "break_even_GB_per_s" in part else np.nan})
    return pd.DataFrame(rows)
