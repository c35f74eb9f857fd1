"""One argument contract at every public entry, swept by introspection: every public function of ess (the names
``ess`` exports and the ``__all__`` of each public submodule), every public class's constructor and the public
methods of the classes with a cheap instance (:data:`INSTANCES`), with each boolean and integer parameter fed a
wrong value while the others hold valid ones:

* a boolean option (annotated ``bool`` or defaulting to ``True``/``False``) gets ``"no"`` (``bool("no")`` is
  True) and ``1``;
* an integer (annotated ``int`` / ``int | None`` or defaulting to an ``int``: a count, context, MTP, batch, layer,
  seed or token id) gets ``2.5`` (never truncated), ``nan`` and ``"3"``.

Each must raise a ``TypeError`` or ``ValueError`` whose message names the parameter. A new function is swept
without a new test; one that cannot be called cheaply is listed in :data:`EXCLUDED` with its reason, and
:func:`test_every_public_callable_is_swept_or_excluded` keeps that list honest (an excluded name that no longer
exists, or no longer has such a parameter, fails; so does a public method neither swept nor excluded).
``python tests/test_argument_contract.py`` prints each case that fails (for triage), then the counts: callables and
parameters swept, callables excluded by reason (the README quotes them)."""
from __future__ import annotations

import functools
import importlib
import inspect
import math
import pkgutil
import sys
import typing
import warnings
from pathlib import Path

import numpy as np
import pytest

import ess

BOOL_BAD = ("no", 1)
INT_BAD = (2.5, math.nan, "3")

# modules not swept, with the reason
SKIP_MODULES = {
    "ess.hf": "owned elsewhere this round (a package in the making)",
    "ess.pipeline": "owned elsewhere this round; tests/test_fuzz_bad_input.py fuzzes its arguments (and a wrong "
                    "value accepted would start the reproduction pipeline)",
    "ess.validate": "the validators themselves: their options (lo, below, ndim, positive ...) are set by ess's own "
                    "code, never by a user, and test_validate-style tests check them directly",
}


def _modules() -> list[str]:
    out = ["ess"]
    for m in pkgutil.walk_packages(ess.__path__, "ess."):
        parts = m.name.split(".")
        if any(p.startswith("_") for p in parts[1:]) or any(m.name == s or m.name.startswith(s + ".")
                                                             for s in SKIP_MODULES):
            continue
        out.append(m.name)
    return sorted(out)


def _public_objects() -> dict[str, object]:
    """qualified name -> function or class, for every public name (``ess``'s exports, each module's ``__all__``)."""
    found = {}
    for name in _modules():
        mod = importlib.import_module(name)
        names = getattr(mod, "__all__", None)
        if names is None:
            names = [n for n in dir(mod) if not n.startswith("_")] if name == "ess" else []
        for n in names:
            obj = getattr(mod, n, None)
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and getattr(obj, "__module__", "").startswith("ess"):
                found.setdefault(f"{obj.__module__}.{n}", obj)
    return found


def _kind(p: inspect.Parameter, hints: dict) -> str | None:
    """``"bool"``, ``"int"`` or None for a parameter, by its annotation and its default."""
    ann = hints.get(p.name, p.annotation)
    text = ann if isinstance(ann, str) else repr(ann)
    if isinstance(p.default, (bool, np.bool_)) or ann is bool or text in ("bool", "<class 'bool'>"):
        return "bool"
    if ann is int or text in ("int", "int | None", "typing.Optional[int]", "Optional[int]") or \
            ann == typing.Optional[int] or (isinstance(p.default, int) and not isinstance(p.default, bool)):
        return "int"
    return None


@functools.lru_cache(maxsize=1)
def _targets() -> list[tuple[str, object, inspect.Signature, list[tuple[str, str]]]]:
    """(qualified name, callable, signature, [(parameter, kind)]) for every callable with such parameters; a class
    gives its constructor and its public methods."""
    out = []
    for qn, obj in sorted(_public_objects().items()):
        calls = [(qn, obj)]
        if inspect.isclass(obj):
            calls += [(f"{qn}.{n}", f) for n, f in vars(obj).items()
                      if not n.startswith("_") and inspect.isfunction(f)]
        for name, f in calls:
            try:
                sig = inspect.signature(f)
            except (TypeError, ValueError):
                continue
            try:
                hints = typing.get_type_hints(f.__init__ if inspect.isclass(f) else f)
            except Exception:  # noqa: BLE001 - a forward reference that cannot be resolved: annotations as text
                hints = {}
            params = [(p.name, _kind(p, hints)) for p in sig.parameters.values()
                      if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            params = [(n, k) for n, k in params if k]
            if params:
                out.append((name, f, sig, params))
    return out


# ------------------------------------------------------------------------------------------ valid arguments
def _tiny():
    from ess.specs import model_spec
    return model_spec("tiny")


def _trace():
    from ess.traces import Trace
    rng = np.random.default_rng(0)
    idx = np.stack([np.stack([rng.permutation(16)[:4] for _ in range(5)]) for _ in range(2)])[:, None]
    return Trace(idx.astype(np.int32), 16, 4, 1)


def _one_combination():
    """A band of one combination (the project's scenario, no misses): what value_band and its users iterate."""
    import types
    from ess.sim.config import as_scenario
    return types.SimpleNamespace(variants=lambda sc, vf: {"c": ("calibration", as_scenario(sc), None)})


#: a valid value for a required parameter, by its name (a function: a fresh value per call)
VALID = {
    "model": _tiny, "models": lambda: ["tiny"], "context_len": lambda: 1024, "mtp": lambda: 1, "batch": lambda: 2,
    "ratio": lambda: 0.5, "layer": lambda: 0, "steps": lambda: 2, "capacity": lambda: 8, "k": lambda: 4,
    "seed": lambda: 0, "n_layers": lambda: 2, "gpu": lambda: "H200", "link": lambda: "pcie5",
    "entry_bytes": lambda: 16, "n_heads": lambda: 2, "head_dim": lambda: 8, "n_kv_heads": lambda: 1,
    "step": lambda: 0, "band_batch": lambda: 1, "trace": _trace, "request_id": lambda: "r", "n": lambda: 2,
    "n_tokens": lambda: 16, "topk": lambda: 4, "width": lambda: 4, "name": lambda: "x", "tile": lambda: 4,
    "indices": lambda: np.array([[0, 1], [1, 2]]), "budget_bytes": lambda: 1e6, "n_requests": lambda: 2,
    "batch_limit": lambda: 4, "deployment": lambda: "paper-table1", "ratios": lambda: [0.5],
    "n_positions": lambda: 16, "history": lambda: 2, "window": lambda: 2, "within": lambda: 2, "K": lambda: 4,
    "max_requests": lambda: 2, "block_tokens": lambda: 4, "total_steps": lambda: 4, "L": lambda: 1024,
    "context_lens": lambda: [1024], "contexts": lambda: [1024], "mtps": lambda: [1], "resolution": lambda: 8,
}

def _locs():
    try:                                            # the locality registry, moving to ess.locality this round
        from ess.locality import locality_alternatives
    except ImportError:
        from ess.tracegen import locality_alternatives
    return list(locality_alternatives())


def _workload(context_len, **kw):
    """A synthetic trace's setting (ess.tracegen.Workload) at a small geometry."""
    from ess.tracegen import Workload
    return Workload(context_len, **kw)


def _uniform():
    """The earlier uniform locality model at the central model's reading (tests/test_studies_prefetching.py's)."""
    from ess.locality import LocalityModel
    return LocalityModel("uniform", "uniform", _locs()[0].reading)


def _fields(make):
    """A dataclass's constructor arguments from one of its instances."""
    import dataclasses
    return lambda: {f.name: getattr(make(), f.name) for f in dataclasses.fields(make()) if f.init}


def _grid(**kw):
    """The grid's entries on fake miss tables (tests/test_probe_grid.py's inputs): cheap to search."""
    def make():
        from test_probe_grid import found, inputs
        out = {"inputs": inputs(), "model": "deepseek-v3.2", "gpu": "H200", "link": "pcie5", "context_len": 32768,
               "mtp": 2}
        if "found" in kw:
            out["found"] = found()
        if "cells" in kw:
            from ess.sim.grid import grid_cells
            out["cells"] = grid_cells(["deepseek-v3.2"], ["H200"], [32768], links=["pcie5"])
        return {**out, **{k: v for k, v in kw.items() if k not in ("found", "cells")}}
    return make


def _spec(kind, name):
    def make():
        from ess import specs
        return getattr(specs, f"{kind}_spec")(name)
    return make


def _tmp_json():
    import tempfile
    return {"path": Path(tempfile.mkdtemp()) / "x.json", "data": {"a": 1}}


def _decode_config():
    from ess.engine.config import DecodeConfig
    return DecodeConfig()


#: valid arguments of one callable, where the name table is not enough
ARGS = {
    "ess.cachesim.misses_per_layer": lambda: {"workload": _workload(1024, k=16, n_layers=2, steps=4), "ratio": 0.5},
    "ess.cachesim.misses_per_step": lambda: {"workload": _workload(1024, k=16, n_layers=2, steps=4), "ratio": 0.5},
    "ess.cachesim.sweep_synthetic": lambda: {"workload": _workload(1024, k=16, n_layers=2, steps=4), "ratios": [0.5]},
    "ess.cachesim.trace_misses": lambda: {"trace": _trace(), "capacity": 8},
    "ess.studies.real_model.measure.CheckConfig": lambda: {"context_len": 64, "batch": 2, "decode": _decode_config()},
    "ess.studies.real_model.check.CheckDesign": lambda: {
        "calibration_contexts": [40], "calibration_batches": [1, 2], "calibration_ratio": 0.5,
        "calibration_links_GB_per_s": [0.05], "held_out_contexts": [50], "held_out_batches": [2],
        "held_out_ratio": 0.75, "held_out_links_GB_per_s": [0.1], "steps": 2},
    "ess.studies.real_model.fit.product_line": lambda: {"products": {"finish": {1: 1.0, 2: 2.0}}, "rows": [1, 2]},
    "ess.sim.calibrate.CalibrationPoint": lambda: {"name": "p", "batch": 2, "context_len": 1024, "ratio": 1.0,
                                                   "mtp": 2, "accept_ratio": 1.7, "throughput": 100.0,
                                                   "read_from_chart": True, "source": "s"},
    "ess.cachesim.sequence_misses": lambda: {"steps": np.array([[0, 1], [1, 2]]), "capacity": 4},
    "ess.cachesim.smallest_pool": lambda: {"workload": _workload(4096, k=64, n_layers=1, steps=2, batch=1),
                                           "target": 30.0},
    "ess.policies.make_policy": lambda: {"name": "lru", "capacity": 4},
    "ess.policies.first_in_order": lambda: {"keys": (np.array([2, 1, 3]),), "n": 1},
    # the generators' settings are a Workload's fields, swept on its constructor (synthetic_trace and
    # synthetic_streams take the workload alone: no boolean or integer parameter of their own)
    "ess.tracegen.Workload": lambda: {"context_len": 1024, "k": 16, "n_layers": 2, "steps": 2, "batch": 1},
    "ess.tracegen.synthetic_trace": lambda: {"workload": _workload(1024, k=16, n_layers=2, steps=2, batch=1)},
    "ess.tracegen.synthetic_streams": lambda: {"workload": _workload(1024, k=16, n_layers=2, steps=2, batch=1)},
    "ess.studies.locality.measure_evidence": lambda: {"models": _locs()},
    "ess.studies.prefetching.band_setting": lambda: {"models": _locs(), "band_batch": 1},
    "ess.studies.prefetching.misses_by_context": lambda: {"context_lens": [1024], "ratio": 0.5, "models": _locs(),
                                                         "mtp": 1, "steps": 2, "batch": 1, "seed": 0},
    "ess.studies.prefetching.warmup_curves": lambda: {"context_len": 1024, "ratio": 0.5, "models": _locs(),
                                                     "steps": 2, "seed": 0, "batch": 1, "band_batch": 1},
    "ess.studies.prefetching.mtp_unions": lambda: {"context_len": 4096, "mtps": [1], "steps": 2, "seed": 0,
                                                  "locality": _locs()[0]},
    "ess.studies.prefetching.misses_by_ratio": lambda: {"context_len": 4096, "ratios": [0.5], "models": _locs()[:1],
                                                       "uniform": _uniform(), "mtp": 1, "steps": 2, "seed": 0,
                                                       "batch": 1, "band_batch": 1},
    "ess.studies.prefetching.smallest_pools": lambda: {"context_len": 4096, "target": 1e6, "models": _locs()[:1],
                                                      "resolution": 4096, "mtp": 1, "steps": 2, "batch": 1,
                                                      "seed": 0},
    "ess.studies.prefetching.policies_against_belady": lambda: {"cases": [(_uniform(), None)], "context_len": 4096,
                                                               "mtp": 1, "steps": 2, "batch": 1, "seed": 0,
                                                               "layers": [0], "ratio": 0.5},
    "ess.studies.prefetching.policy_comparison": lambda: {     # no real trace: the synthetic source, one layer
        "real": {}, "models": _locs()[:1], "context_len": 4096, "ratios": [0.5], "real_ratios": [], "mtp": 1,
        "steps": 2, "batch": 1, "band_batch": 1, "seed": 0, "layers": [0]},
    "ess.studies.prefetching.lstm_heat_predictor": lambda: {"context_len": 4096, "locality": _locs()[0], "mtp": 1,
                                                           "train_steps": 4, "test_steps": 4, "epochs": 1,
                                                           "samples": 16, "seed": 0, "n_layers": 1, "history": 2,
                                                           "hidden": 2},
    "ess.studies.prefetching.prefetch_classes": lambda: {     # one class without the LSTM: no predictor to train
        "trace": _replay()["trace"], "lstm": None, "context_len": 4096, "mtp": 1, "ratio": 0.5,
        "classes": {"demand only": dict(speculative=False, delayed=False, predictor="none", warmup_mode="before")}},
    "ess.attention.topk_indices": lambda: {"scores": np.linspace(0, 1, 32).reshape(2, 16)},
    "ess.attention.stack_ragged": lambda: {"arrays": [np.array([1, 2]), np.array([3])], "name": "rows", "width": 4},
    "ess.quant.quantize_fp8_tiles": lambda: {"x": np.ones((2, 128))},
    "ess.quant.dequantize_fp8_tiles": lambda: {"codes": np.zeros((2, 128), np.uint8), "scales": np.ones((2, 1))},
    "ess.traces.index_rows": lambda: {"name": "rows", "rows": np.array([[0, 1]])},
    "ess.traces.validate_trace_arrays": lambda: {"indices": _trace().indices, "windows": _trace().windows,
                                                 "context_len": 16, "k": 4, "mtp": 1},
    "ess.atomic.write_json_atomic": _tmp_json,
    "ess.studies.prefetching.PolicyComparison.series": lambda: {"source": "s", "warmup": True},
    "ess.sim.predictions.mtp_step_ratio": lambda: {"mtp": 2, "a": 1.0},
    "ess.sim.predictions.value_band": lambda: {"band": _one_combination(), "fn": lambda sc, m: 1.0},
    "ess.tables.sim.adaptive_batch": lambda: {"band": _one_combination(), "context_len": 1024, "ratios": [1.0]},
    "ess.sim.predictions.step_breakdown": lambda: {"batches": [52], "context_len": 32768},
    "ess.sim.predictions.strategy_overheads": lambda: {"misses": np.zeros(61), "context_len": 32768, "batch": 52,
                                                       "mtp": 2, "ratio": 0.5},
    "ess.sim.predictions.overlap_vs_misses": lambda: {"miss_counts": [0.0, 100.0]},
    "ess.heat_predictor.evaluate_predictor": lambda: {"predictor": __import__("ess.heat_predictor").heat_predictor
                                                      .HeatScorer(), "seq": np.array([[0, 1], [1, 2], [2, 3]])},
    "ess.link.EmulatedLink": lambda: {"GB_per_s": 10.0},
    "ess.archive.Archive": lambda: {"cache": _cache(), "directory": _tmp_json()["path"].parent / "archive"},
    "ess.disk.DiskTier": lambda: {"directory": _tmp_json()["path"].parent / "disk", "n_layers": 2, "entry_bytes": 16},
    "ess.attention.prepare_index_queries": lambda: {"q": np.ones((2, 4, 32), np.float32)},
    "ess.quant.encode_latent": lambda: {"ckv": np.ones((3, 128), np.float32), "rope": np.ones((3, 16), np.float32),
                                        "model": _tiny()},
    "ess.quant.encode_indexer_keys": lambda: {"keys": np.ones((3, 32), np.float32), "model": _tiny()},
    "ess.storage.ResidentCache": lambda: {"model": "tiny", "max_requests": 2, "max_tokens": 64},
    "ess.locality.drift_calibration": lambda: {"r": 0.5, "context_len": 4096, "k": 64},
    "ess.llm.config.LlamaConfig": lambda: dict(n_layers=2, d_model=16, d_ffn=32, n_heads=2, n_kv_heads=1,
                                               head_dim=8, rope_base=10000.0, rms_eps=1e-5, context_length=64,
                                               vocab_size=100),
    "ess.layout.layer_pool_slots": lambda: {"model": _tiny(), "ratio": 0.5, "context_len": 1024, "need": 8},
    "ess.sim.costs.gemm_time_s": lambda: {"m": 8, "n": 16, "k": 16, "gpu": _spec("gpu", "H200")(),
                                          "model": _spec("model", "deepseek-v3.2-exp")()},
    "ess.sim.costs.layer_costs": lambda: {"model": _spec("model", "deepseek-v3.2-exp")(), "gpu": _spec("gpu", "H200")(),
                                          "deployment": _spec("deployment", "paper-table1")(), "micro_batch": 8,
                                          "context_len": 32768, "mtp": 2},
    "ess.sim.store.seed_table": lambda: {"table": INSTANCES["ess.sim.misses.MissesTable"]()},
    "ess.sim.sweep.sweep": lambda: {"axes": {"batch": [8], "context_len": [32768]}, "workers": 0},
    "ess.llm.kv_cache.KVCache": lambda: {"config": __import__("ess.llm.config").llm.config.LlamaConfig(
        **ARGS["ess.llm.config.LlamaConfig"]()), "batch": 2},
    "ess.kernels.topk.topk_positions": lambda: {"scores": np.linspace(0, 1, 32, dtype=np.float32).reshape(2, 16)},
    "ess.viz.sim.fig_overlap_vs_misses": lambda: {"df": __import__("ess.sim.predictions").sim.predictions
                                                  .overlap_vs_misses([0.0, 100.0])},
    "ess.llm.inputs.as_token_batch": lambda: {"token_ids": [[1, 2]], "vocab_size": 100, "max_length": 10},
    "ess.llm.reference.rope_angles": lambda: {"positions": np.arange(4), "head_dim": 8, "base": 10000.0},
    "ess.llm.weights.permute_rope_rows": lambda: {"w": np.zeros((8, 3)), "n_heads": 2},
    "ess.llm.weights.unpermute_rope_rows": lambda: {"w": np.zeros((8, 3)), "n_heads": 2},
    "ess.sim.grid.GridInputs": lambda: {"params": __import__("ess.sim.costs").sim.costs.CostParams(),
                                        "calibrations": {}, "extrapolation": {}, "localities": _locs(),
                                        "sizes": __import__("ess.sim.misses").sim.misses.BandSizes(8, 1, 1)},
    "ess.sim.grid.grid_search": _grid(cells=True),
    "ess.sim.grid.break_even_link": _grid(found=True),
    "ess.sim.grid.overlap_links": _grid(found=True),
    "ess.sim.grid.cell_view": _grid(),
    "ess.sim.grid.evaluate_configs": _grid(batches=[8], ratios=[0.5]),
    "ess.specs.ModelSpec": _fields(_spec("model", "tiny")),
    "ess.specs.GPUSpec": _fields(_spec("gpu", "H200")),
    "ess.specs.HostSpec": _fields(_spec("host", "dgx-h200")),
    "ess.specs.DeploymentSpec": _fields(_spec("deployment", "paper-table1")),
    "ess.specs.HostLinkSpec": _fields(lambda: __import__("ess.specs").specs.host_link_spec("pcie5")),
    "ess.layout.EntryFormat": _fields(lambda: __import__("ess.layout").layout.entry_format(_tiny())),
    "ess.layout.LatentLayout": _fields(lambda: __import__("ess.layout").layout.latent_layout(_tiny())),
}

def _cache():
    from ess.storage import TieredCache
    c = TieredCache("tiny", capacity=4)
    c.add_request("r", np.zeros((4, 10, c.entry_bytes), np.uint8))
    return c


def _host_pool():
    from ess.storage import HostPool
    pool = HostPool(2, 16)
    pool.add("r", np.zeros((2, 8, 16), np.uint8))
    return pool


def _make(module, name, *args, **kw):
    return lambda: getattr(importlib.import_module(module), name)(*args, **kw)


def _disk():
    """A disk tier (2 layers, 16-byte entries) holding a checkpoint of request "r"."""
    from ess.disk import DiskTier
    disk = DiskTier(_tmp_json()["path"].parent / "disk", n_layers=2, entry_bytes=16, block_tokens=4)
    disk.write("r", np.zeros((2, 8, 16), np.uint8), {})
    return disk


def _resident():
    from ess.storage import ResidentCache
    c = ResidentCache("tiny", max_requests=2, max_tokens=64)
    c.add_request("r", np.zeros((4, 10, c.entry_bytes), np.uint8))
    return c


def _shared_pool():
    from ess.engine.shared_prompt import PromptSharingHostPool
    pool = PromptSharingHostPool(2, 16)
    pool.add("r", np.zeros((2, 8, 16), np.uint8))
    return pool


def _indexer_cache():
    """The engine's indexer keys: 2 layers, 1 KV head of 8, request "r" of 6 tokens."""
    import torch

    from ess.engine.indexer import IndexerCache, quantize_keys
    c = IndexerCache(2, 1, 8, max_requests=2, capacity=8)
    c.add_request("r", *quantize_keys(torch.ones((2, 6, 1, 8))))
    return c


def _llama_config():
    from ess.llm.config import LlamaConfig
    return LlamaConfig(**ARGS["ess.llm.config.LlamaConfig"]())


#: a cheap instance of a class whose public methods are swept (a function: a fresh one per call); the methods of
#: other classes are not swept (their constructors are)
INSTANCES = {
    "ess.studies.prefetching.PolicyComparison": lambda: __import__("ess.studies.prefetching").studies.prefetching
    .PolicyComparison(__import__("pandas").DataFrame({"source": ["s"], "ratio": [0.5], "warmup": [True],
                                                     "policy": ["lru"], "vs LRU (%)": [0.0]}), {}, []),
    "ess.storage.TieredCache": _cache,
    "ess.storage.HostPool": _host_pool,
    "ess.traces.TraceRecorder": _make("ess.traces", "TraceRecorder", context_len=8, k=2, n_layers=1, batch=1),
    "ess.sim.misses.MissesTable": _make("ess.sim.misses", "MissesTable", steps=2, batch=1, model="tiny"),
    "ess.sim.misses.BandSizes": _make("ess.sim.misses", "BandSizes", steps=2, batch=1, band_batch=1),
    "ess.policies.SlotPool": _make("ess.policies", "SlotPool", 4),
    "ess.policies.EvictionPolicy": _make("ess.policies", "LRUPolicy", 4),
    "ess.metrics.OpTimer": _make("ess.metrics", "OpTimer"),
    "ess.metrics.MetricsLog": _make("ess.metrics", "MetricsLog"),
    "ess.link.EmulatedLink": _make("ess.link", "EmulatedLink", 10.0),
    "ess.archive.Archive": lambda: __import__("ess.archive").archive.Archive(**ARGS["ess.archive.Archive"]()),
    "ess.disk.DiskTier": _disk,
    "ess.storage.ResidentCache": _resident,
    "ess.engine.shared_prompt.PromptSharingHostPool": _shared_pool,
    "ess.engine.indexer.IndexerCache": _indexer_cache,
    "ess.heat_predictor.LSTMHeatPredictor": _make("ess.heat_predictor", "LSTMHeatPredictor", history=2, hidden=4),
    "ess.llm.config.LlamaConfig": _llama_config,
    "ess.llm.kv_cache.KVCache": lambda: __import__("ess.llm.kv_cache").llm.kv_cache.KVCache(_llama_config(), 2,
                                                                                          capacity=8),
}


def _decode_state(B=2, L=8):
    """A tiny DeepSeek decode step's inputs (tests/test_decode.py's): a tiered cache holding ``B`` requests of ``L``
    tokens, the indexer's queries, head weights and keys, the attention queries."""
    from ess import quant
    from ess.storage import TieredCache
    m, rng = _tiny(), np.random.default_rng(0)
    cache = TieredCache(m, capacity=m.index_topk)
    for b in range(B):
        cache.add_request(f"r{b}", quant.encode_latent(rng.standard_normal((m.n_layers, L, m.kv_lora_rank)),
                                                       rng.standard_normal((m.n_layers, L, m.qk_rope_head_dim)), m))
    keys = [quant.encode_indexer_keys(rng.standard_normal((L, m.index_head_dim)), m) for _ in range(B)]
    qi = rng.standard_normal((B, m.index_n_heads, m.index_head_dim))
    w = rng.random((B, m.index_n_heads))
    q = rng.standard_normal((B, m.n_heads, m.latent_dim)).astype(np.float32)
    return {"cache": cache, "layer": 0, "request_ids": [f"r{b}" for b in range(B)], "q_index": qi,
            "index_weights": w, "index_keys": keys, "q": q, "model": m}


def _run_layer():
    from ess.decode import LatentWiring
    d = _decode_state()
    wiring = LatentWiring(d["cache"], d["q_index"], d["index_weights"], d["index_keys"], d["q"], d["model"])
    return {"cache": d["cache"], "layer": 0, "request_ids": d["request_ids"], "wiring": wiring}


def _replay():
    """A tiny cache holding request "r" (16 tokens, 4 layers) and a trace of two requests at its geometry, with
    warmup windows: what ess.replay drives."""
    from ess.storage import TieredCache
    from ess.traces import Trace
    cache = TieredCache("tiny", capacity=8)
    cache.add_request("r", np.zeros((4, 16, cache.entry_bytes), np.uint8))
    rng = np.random.default_rng(0)
    sets = lambda n: np.stack([rng.permutation(16)[:4] for _ in range(n)])          # noqa: E731
    idx = np.stack([np.stack([sets(3) for _ in range(4)]) for _ in range(2)]).astype(np.int32)
    win = np.stack([np.stack([sets(2) for _ in range(4)]) for _ in range(2)]).astype(np.int32)
    return {"cache": cache, "trace": Trace(idx, 16, 4, 1, windows=win), "request_id": "r"}


def _frame(**cols):
    import pandas as pd
    return lambda: pd.DataFrame(cols)


ARGS.update({
    "ess.decode.select": lambda: {k: v for k, v in _decode_state().items()
                                  if k in ("q_index", "index_weights", "index_keys", "model")},
    "ess.decode.decode_layer": _decode_state,
    "ess.kernels.attention.reference.decode_latent_rows": lambda: {    # tiny's FP8 layout: 128 + 4 + 2 x 16 B
        "rows": np.zeros((2, 164), np.uint8), "fp8": True, "kv_rank": 128, "rope_dim": 16, "tile": 128},
    "ess.decode.run_layer": _run_layer,
    "ess.replay.replay_trace": _replay,
    "ess.replay.run_trace": _replay,
    "ess.replay.replay_steps": _replay,
    "ess.monitor.check_row": lambda: {"row": __import__("ess.metrics").metrics.StepRow(
        1, 0.1, 0.0, 0.0, 0, 0, (1, 2), (0, 1))},
    "ess.sim.predictions.break_even_misses": lambda: {     # a baseline no configuration reaches: one simulate call
        "configs": _frame(batch=[8], context_len=[4096], ratio=[0.5], mtp=[1], accept_ratio=[1.0])(),
        "baseline_throughput": 1e12},
    "ess.sim.timeline.offload_overhead_s": lambda: {
        "costs": __import__("test_sim_overlap")._costs(), "micro_batch": 2.0, "misses": np.array([[128.0, 0.0]]),
        "mtp": 1.0, "h2d_GB_per_s": 37.0, "d2h_GB_per_s": 43.0, "entry_bytes": 656},
    "ess.studies.locality.fit_drift_rho": lambda: {      # both ends evaluated already: no trace is generated
        "target": 0.95, "reading": "fraction", "evaluated": {0.0: 0.9, 0.95: 0.1}},
    "ess.studies.locality.model_shape": lambda: {"real_trace": __import__("ess.traces").traces.Trace(   # 12 steps:
        np.stack([np.random.default_rng(0).permutation(64)[:4] for _ in range(12)])[None, None].astype(np.int32),
        64, 4, 1)},                                                       # return_share reads 8 steps ahead
    "ess.tables.grid.notebook07_record": lambda: {"results_path": _tmp_json()["path"], "name": "x", "smoke": True},
    "ess.tables.sim.deployment_benefits": lambda: {"misses": None, "context_len": 32768, "ratio": 0.5},
    "ess.viz.memory.fig_batch_limits": lambda: {"df": _frame(context_len=[1024], ratio=[1.0], gpu=["H200"],
                                                             batch=[4], limited_by=["memory"])()},
    "ess.viz.monitor.fig_monitor": lambda: {"df": _frame(step=[1, 2], link_utilisation=[0.5, 0.6],
                                                         hit_rate=[0.9, 0.8], stall_s=[0.0, 1e-3])(),
                                            "misses_by_layer": np.zeros((2, 2))},
    "ess.viz.sim.fig_table2": lambda: {"t2": _frame(context_len=[1024], mtp=[1], accept_ratio=[1.0], batch=[8],
                                                    ratio=[0.5], throughput_no_miss=[100.0], published=[np.nan],
                                                    source=["s"])()},
    "ess.viz.storage.fig_step_traffic": lambda: {"runs": {"a": _frame(step=[0, 1], misses=[2, 1],
                                                                      bytes_h2d=[10, 5])()}},
    "ess.widgets.grid.grid_view": _grid(),
    "ess.widgets.grid.grid_widget": lambda: {**_grid(models=["deepseek-v3.2"], gpus=["H200"], contexts=[32768])(),
                                             "tables": {("deepseek-v3.2", 2): _grid()()["inputs"].table(
                                                 "deepseek-v3.2")}},
    "ess.widgets.grid.prepare_tables": _grid(models=["deepseek-v3.2"], contexts=[], mtps=(1,)),  # no cache run
})
ARGS.update({
    "ess.disk.DiskTier.block_location": lambda: {"request_id": "r", "block": 1},
    "ess.disk.DiskTier.write": lambda: {"request_id": "s", "entries": np.zeros((2, 8, 16), np.uint8),
                                        "pool_state": {}},
    "ess.storage.ResidentCache.plan": lambda: {"request_id": "r", "indices": np.array([0, 1])},
    "ess.engine.shared_prompt.PromptSharingHostPool.add": lambda: {"request_id": "s",
                                                                   "entries": np.zeros((2, 8, 16), np.uint8)},
    "ess.engine.indexer.IndexerCache.scores": lambda: {"q": __import__("torch").ones((1, 2, 8)), "rows": slice(0, 1)},
    "ess.engine.indexer.IndexerCache.select": lambda: {"q": __import__("torch").ones((1, 2, 8)), "rows": slice(0, 1),
                                                       "k": 4},
    "ess.heat_predictor.LSTMHeatPredictor.training_set": lambda: {"seqs": [np.array([[0, 1], [1, 2], [2, 3]])]},
    "ess.heat_predictor.LSTMHeatPredictor.fit": lambda: {"seqs": [np.array([[0, 1], [1, 2], [2, 3]])]},
    "ess.llm.kv_cache.KVCache.write": lambda: {"k": __import__("torch").ones((2, 1, 1, 8)),
                                               "v": __import__("torch").ones((2, 1, 1, 8)),
                                               "positions": __import__("torch").zeros((2, 1), dtype=__import__(
                                                   "torch").int64)},
    "ess.storage.TieredCache.add_request": lambda: {"request_id": "s", "latent_entries": np.zeros(
        (4, 10, _cache().entry_bytes), np.uint8)},
    "ess.storage.TieredCache.plan": lambda: {"request_id": "r", "indices": np.array([0, 1])},
    "ess.storage.TieredCache.step": lambda: {"request_id": "r", "indices": np.array([0, 1])},
    "ess.storage.TieredCache.warmup": lambda: {"request_id": "r", "windows": np.array([[0, 1]])},
    "ess.storage.HostPool.add": lambda: {"request_id": "s", "entries": np.zeros((2, 8, 16), np.uint8)},
    "ess.traces.TraceRecorder.observe": lambda: {"indices": np.array([[0, 1]])},
    "ess.traces.TraceRecorder.observe_windows": lambda: {"indices": np.array([[0, 1]])},
    "ess.policies.EvictionPolicy.choose_victims": lambda: {"candidates": np.array([0, 1, 2])},
    "ess.metrics.OpTimer.span": lambda: {"op": "x"},
    "ess.metrics.OpTimer.add": lambda: {"op": "x", "start_s": 0.0, "end_s": 1.0},
})

_RECORD = ("an output record: the library fills it from values it has checked; checking every field in "
           "__post_init__ would cost the per-step and per-layer paths and guard no user's input")
_OWNED = "owned elsewhere this round"
_MODEL = ("needs a real model's weights, tokenizer or a prefilled engine (seconds to load); its options are checked "
          "by tests/test_engine_bad_input.py and the llm tests")

#: callables not swept, with the reason (qualified name; a class name covers its constructor and methods)
EXCLUDED = {
    # output records
    **{n: _RECORD for n in (
        "ess.layout.RequestCache", "ess.memory.BatchLimit", "ess.metrics.DecodeStepMetrics", "ess.metrics.OpRecord",
        "ess.metrics.StepMetrics", "ess.metrics.StepRow", "ess.prefetch.PrefetchResult", "ess.sim.timeline.SimResult",
        "ess.sim.grid.CellView", "ess.planning.Plan", "ess.heat_predictor.PredictorReport",
        "ess.llm.generate.Generation", "ess.storage.PoolStep", "ess.storage.StepPlan", "ess.policies.SlotPlan",
        "ess.results.Results", "ess.sim.costs.LayerCosts", "ess.sim.costs.KernelPoints", "ess.sim.costs.PartBatch",
        "ess.link.Transfer", "ess.engine.engine.DecodeSession",
        "ess.engine.engine.DenseSession")},
    # owned elsewhere this round
    # a decode run or a model to build (tests/test_studies_real_model_check.py checks their arguments)
    **{n: _MODEL for n in (
        "ess.studies.real_model.measure.link_samples", "ess.studies.real_model.measure.measured_breakdown",
        "ess.studies.real_model.measure.misses_by_layer", "ess.studies.real_model.measure.op_samples",
        "ess.studies.real_model.fit.predict_run", "ess.studies.real_model.measure.product_costs",
        "ess.studies.real_model.check.run_check", "ess.studies.real_model.measure.run_configs",
        "ess.studies.real_model.measure.step_lanes")},
    "ess.studies.real_model.check.OverlapCheck.breakdown": _MODEL + " (its runs come from run_check; its "
                                                                    "context_len and batch are checked first)",
    # a real model
    **{n: _MODEL for n in (
        "ess.studies.real_model.quality", "ess.studies.real_model.record_traces.record",
        "ess.studies.real_model.repeat_check.repeat_check",
        "ess.engine.wiring.KVWiring", "ess.engine.kv.kv_view", "ess.engine.indexer.selection_mass",
        "ess.llm.generate.generate", "ess.llm.llama.LlamaModel", "ess.llm.tokenizer.Tokenizer",
        "ess.llm.text.reference_text_ids", "ess.widgets.engine")},
    # kernels: the backends behind a public wrapper that checks (STYLE: kernels are private and write into out)
    "ess.kernels.transfer.numba_cpu.copy_rows": "a backend's kernel, called by its checked wrapper",
    "ess.kernels.prefetch.reference.pool": "a kernel family's reference, called by its checked wrapper "
                                           "(ess.prefetch.simulate_prefetch) and by the kernel tests",
    # methods of classes with a cheap instance that are not swept
    "ess.decode.StepCache": "a Protocol: its plan is a stub; the implementations' are swept (TieredCache.plan, "
                            "ResidentCache.plan)",
    "ess.engine.engine.DecodeEngine": _MODEL,
    "ess.engine.shared_prompt.PromptSharingHostPool.layer_rows": "always refuses (TypeError: the rows lie in two "
                                                                 "arrays, use layer_segments): no call is valid",
}


def _instance(qn: str):
    return next(make() for cls, make in INSTANCES.items() if qn.startswith(cls + "."))


def _is_method(qn: str, f) -> bool:
    return not inspect.isclass(f) and "." in f.__qualname__ and "<locals>" not in f.__qualname__


def _excluded(qn: str) -> str | None:
    for name, why in EXCLUDED.items():
        if qn == name or qn.startswith(name + "."):
            return why
    return None


def _valid_args(qn: str, sig: inspect.Signature, skip: str) -> tuple[list, dict]:
    """Positional-only and keyword arguments for every required parameter but ``skip`` (from :data:`ARGS`, else
    :data:`VALID`); a ``LookupError`` naming one without a valid value."""
    given = ARGS.get(qn, lambda: {})()
    args, kwargs = [], {}
    for p in sig.parameters.values():
        if p.name in ("self", "cls") or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name == skip:
            continue
        if p.name in given:
            value = given[p.name]
        elif p.default is not p.empty:
            continue
        elif p.name in VALID:
            value = VALID[p.name]()
        else:
            raise LookupError(f"{qn}: no valid value for {p.name}")
        if p.kind is p.POSITIONAL_ONLY:
            args.append(value)
        else:
            kwargs[p.name] = value
    return args, kwargs


def _cases():
    out = []
    for qn, f, sig, params in _targets():
        if _excluded(qn):
            continue
        if _is_method(qn, f) and not any(qn.startswith(c + ".") for c in INSTANCES):
            continue                                # methods of a class without a cheap instance: see INSTANCES
        for name, kind in params:
            for bad in (BOOL_BAD if kind == "bool" else INT_BAD):
                out.append(pytest.param(qn, name, bad, id=f"{qn}:{name}={bad!r}"))
    return out


def _call(qn: str, name: str, bad):
    """Call ``qn`` with ``name=bad`` and valid other arguments; returns what it returns."""
    f = {t[0]: t for t in _targets()}[qn][1]
    sig = inspect.signature(f)
    args, kwargs = _valid_args(qn, sig, name)
    if sig.parameters[name].kind is inspect.Parameter.POSITIONAL_ONLY:
        args.insert(list(sig.parameters).index(name), bad)
    else:
        kwargs[name] = bad
    if _is_method(qn, f):
        obj = _instance(qn)
        return getattr(obj, f.__name__)(*args, **kwargs)
    return f(*args, **kwargs)


@pytest.mark.parametrize("qn,name,bad", _cases())
def test_a_wrong_boolean_or_integer_is_refused_by_name(qn, name, bad):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises((TypeError, ValueError)) as info:
            _call(qn, name, bad)
    assert name in str(info.value), f"{qn}({name}={bad!r}): the message names another argument: {info.value}"


def _summary() -> str:
    """The sweep's counts: callables and parameters swept, callables excluded by reason, methods not swept."""
    import collections
    cases = [c.values for c in _cases()]
    targets = _targets()
    excluded = collections.Counter(_excluded(qn) for qn, *_ in targets if _excluded(qn))
    unswept = [qn for qn, f, _, _ in targets if not _excluded(qn) and _is_method(qn, f)
               and not any(qn.startswith(c + ".") for c in INSTANCES)]
    lines = [f"swept: {len({c[0] for c in cases})} callables, {len({c[:2] for c in cases})} boolean and integer "
             f"parameters ({len(cases)} cases)",
             f"excluded: {sum(excluded.values())} callables"]
    lines += [f"  {n:3d}  {why}" for why, n in excluded.most_common()]
    lines.append(f"methods not swept (a class without an instance in INSTANCES): {len(unswept)}")
    lines += [f"  {qn}" for qn in unswept]
    return "\n".join(lines)


def test_every_public_callable_is_swept_or_excluded():
    targets = {t[0] for t in _targets()}
    stale = [n for n in EXCLUDED if not any(t == n or t.startswith(n + ".") for t in targets)]
    assert stale == [], f"excluded names that are not public callables with boolean/integer parameters: {stale}"
    assert len(targets) > 100                       # the introspection finds the library, not an empty list
    unswept = [qn for qn, f, _, _ in _targets() if not _excluded(qn) and _is_method(qn, f)
               and not any(qn.startswith(c + ".") for c in INSTANCES)]
    assert unswept == [], f"public methods neither swept (INSTANCES) nor excluded (EXCLUDED): {unswept}"


if __name__ == "__main__":                         # triage: each callable's outcome, one line per case
    import signal

    def _alarm(*_):
        raise TimeoutError

    signal.signal(signal.SIGALRM, _alarm)
    warnings.simplefilter("ignore")
    only = sys.argv[1] if len(sys.argv) > 1 else ""
    for c in _cases():
        qn, name, bad = c.values
        if only not in qn:
            continue
        signal.alarm(5)
        try:
            out = _call(qn, name, bad)
            res = f"ACCEPTED -> {type(out).__name__}"
        except LookupError as e:
            res = f"NOARGS {e}"
        except TimeoutError:
            res = "TIMEOUT"
        except (TypeError, ValueError) as e:
            res = "ok" if name in str(e) else f"WRONGNAME {type(e).__name__}: {str(e)[:150]}"
        except Exception as e:  # noqa: BLE001
            res = f"RAW {type(e).__name__}: {str(e)[:150]}"
        finally:
            signal.alarm(0)
        if res != "ok":
            print(f"{qn} {name}={bad!r}: {res}", flush=True)
    if not only:
        print(_summary())


def test_token_id_arrays_of_floats_are_refused_not_truncated():
    import torch

    from ess.llm.inputs import as_token_batch
    for ids in (np.array([[1.0, 2.0]]), [[1.5, 2]], torch.tensor([[1.0, 2.0]]), np.array([1.0, 2.0], np.float32)):
        with pytest.raises(TypeError, match="token_ids"):
            as_token_batch(ids, 100, 10)
    ids, lengths = as_token_batch(np.array([[1, 2]]), 100, 10)
    assert ids.tolist() == [[1, 2]] and lengths.tolist() == [2]


def test_the_span_and_sequence_validators():
    from ess.validate import sequence, span
    assert span("span", (0.5, 5000)) == (0.5, 5000.0)
    for bad, err in (((5.0, 1.0), ValueError), ((1.0, 1.0), ValueError), ((0.0, 1.0), ValueError),
                     ((1.0, math.inf), ValueError), ((math.nan, 1.0), ValueError), ((1.0,), TypeError),
                     ("ab", TypeError), (3.0, TypeError), ((True, 2.0), TypeError)):
        with pytest.raises(err, match="link_span"):
            span("link_span", bad)
    assert sequence("gpus", ("H200",)) == ["H200"] and sequence("contexts", np.array([1, 2])) == [1, 2]
    for bad in ("H200", b"H200", 3, {"a": 1}):
        with pytest.raises(TypeError, match="gpus must be a list"):
            sequence("gpus", bad)


def test_the_boolean_array_validator_and_a_vectorised_offload():
    from ess.sim.timeline import offload_overhead_s
    from ess.validate import boolean_array
    assert boolean_array("offload", np.bool_(True)) is True and boolean_array("offload", False) is False
    arr = np.array([True, False])
    assert boolean_array("offload", arr) is arr
    for bad in ("no", 1, 1.0, None, np.array([1, 0]), np.array([1.0]), np.array(["yes"])):
        with pytest.raises(TypeError, match="offload must be True, False or a bool array"):
            boolean_array("offload", bad)
    args = ARGS["ess.sim.timeline.offload_overhead_s"]()
    on = offload_overhead_s(**args, offload=np.array([True]))["none"]
    assert on[0, 0] > 0 and (offload_overhead_s(**args, offload=np.array([False]))["none"] == 0).all()
    with pytest.raises(TypeError, match="offload"):                  # was read as a float array: 1 -> on
        offload_overhead_s(**args, offload=np.array([1]))


def test_break_even_misses_wants_a_frame_of_configurations():
    from ess.sim.predictions import break_even_misses
    with pytest.raises(TypeError, match="configs must be a pandas DataFrame"):   # was AttributeError: iterrows
        break_even_misses([{"batch": 8}], 1.0)
    with pytest.raises(ValueError, match="configs lacks the columns \\['accept_ratio'\\]"):
        break_even_misses(ARGS["ess.sim.predictions.break_even_misses"]()["configs"].drop(columns="accept_ratio"),
                          1.0)
