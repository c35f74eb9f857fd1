"""Fuzz tests (hypothesis) of the memory model: ess.memory, the byte layouts of ess.layout (its two sizing rules are
fuzzed in test_storage_fuzz.py) and the tables of ess.tables.memory. One argument of one public call at a time gets
a meaningless value (fuzz_helpers.BAD: wrong type, sign, size, finiteness; here also huge numbers); the call returns
a valid result or raises a TypeError/ValueError naming the argument, never another exception, and a result stays in
its range: a batch never above what fits in the GPU's KV budget and the host's memory, no negative byte count, a
ratio in (0, 1], no NaN out of finite inputs.

Cases per test (times ESS_FUZZ_SCALE): ess.memory 400, ess.layout 400, ess.tables.memory 60 (each call builds a
table over GPUs, contexts and ratios); about 860 calls, a few seconds."""
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, strategies as st

from ess import layout, memory
from ess.specs import deployment_spec, model_spec
from ess.tables import memory as tables
from fuzz_helpers import BAD, call_one, finite, fuzz_settings

DS = model_spec("deepseek-v3.2-exp")
TINY = model_spec("tiny")
DEP = deployment_spec("paper-table1")
# a NumPy RuntimeWarning (an invalid cast, an overflow, a NaN from finite numbers) is a failure here
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")
# meaningless values, and numbers too large for any memory (they must be refused, not overflow)
HUGE = st.one_of(BAD, st.sampled_from([10 ** 7, 2 ** 40, 1e30, 1e300, 5e-324, 10 ** 400]))
SPEC_ARGS = ("model", "deployment", "gpu", "host")


def _dep(**kw):
    return dict(model=DS, deployment=DEP, gpu=None, host=None, **kw)


LIMITS = memory.batch_limits(np.array([4096, 32768]), np.array([[1.0], [0.2]]))
MEMORY = {
    "param_counts": (lambda **a: memory.param_counts(**a), {"model": DS}),
    "fp8_weight_bytes": (lambda **a: memory.fp8_weight_bytes(**a), {"model": DS, "params": 1e9}),
    "weights_per_gpu_bytes": (lambda **a: memory.weights_per_gpu_bytes(**a), {"model": DS, "deployment": DEP}),
    "kv_budget_bytes": (lambda **a: memory.kv_budget_bytes(**a), {"model": DS, "deployment": DEP, "gpu": None}),
    "batch_limits": (lambda **a: memory.batch_limits(**a), _dep(context_len=[4096, 32768], ratio=0.2, mtp=2)),
    "largest_batch": (lambda **a: memory.largest_batch(**a), _dep(context_len=32768, ratio=0.2, mtp=2)),
    "step_slots_needed": (lambda **a: memory.step_slots_needed(**a), {"model": DS, "context_len": 32768, "mtp": 2}),
    "group_rows": (lambda **a: memory.group_rows(a["first"], a["second"]),
                   {"first": np.array([1, 2, 1, 2]), "second": np.array([0.5, 0.5, 0.5, 0.25])}),
    "ratio_for_batch": (lambda **a: memory.ratio_for_batch(**a), _dep(batch=[52, 160], context_len=32768, mtp=1,
                                                                      decimals=4)),
    "smallest_step_ratio": (lambda **a: memory.smallest_step_ratio(**a),
                            {"context_len": 32768, "mtp": 2, "model": DS, "step": 0.01}),
    "host_memory_needed_bytes": (lambda **a: memory.host_memory_needed_bytes(**a),
                                 {"batch": 32, "context_len": 32768, "model": DS, "dtype": "fp8"}),
    "fit_mem_fraction_static": (lambda **a: memory.fit_mem_fraction_static(**a),
                                {"batch_limit": 52, "context_len": 32768, "model": DS, "deployment": DEP}),
    "tier_placement": (lambda **a: memory.tier_placement(**a), _dep(context_len=32768, ratio=0.2, batch=100,
                                                                    n_spilled=2)),
    "BatchLimits.at": (lambda **a: LIMITS.at(a["index"]), {"index": (1, 0)}),
}
MEMORY_ALIASES = {"first": ("cols[0]", "cols"), "second": ("cols[1]", "cols"), "index": ("index",)}


def _check_limit(lim):
    """A batch limit that fits: in the KV budget and, with offload, in the host's memory."""
    assert lim.batch >= 0 and lim.limited_by in ("gpu", "host", "infeasible")
    if lim.batch:
        assert lim.batch * lim.gpu_bytes_per_request <= lim.kv_budget_bytes
        assert lim.host_bytes_per_request == 0 or lim.batch * lim.host_bytes_per_request <= lim.host_budget_bytes


@fuzz_settings(400)
@given(data=st.data())
def test_memory_calls_refuse_meaningless_arguments_and_never_exceed_the_gpu(data):
    fn, name, args, ok, out = call_one(data, MEMORY, HUGE, MEMORY_ALIASES)
    if not ok:
        return
    if fn == "param_counts":
        assert all(type(v) is int and v >= 0 for v in out.values())
    elif fn in ("fp8_weight_bytes", "weights_per_gpu_bytes", "kv_budget_bytes", "fit_mem_fraction_static"):
        assert finite(out) and out >= 0
        if fn == "fit_mem_fraction_static":
            assert 0 < out <= 1
    elif fn == "batch_limits":
        for i in np.ndindex(out.shape):
            _check_limit(out.at(i))
    elif fn in ("largest_batch", "BatchLimits.at"):
        _check_limit(out)
    elif fn == "step_slots_needed":
        assert type(out) is int and 1 <= out <= args["context_len"]
    elif fn == "ratio_for_batch":
        r = np.asarray(out, dtype=float)
        assert ((r > 0) & (r <= 1) | np.isnan(r)).all()
        lim = memory.batch_limits(args["context_len"], np.where(np.isnan(r), 1.0, r), mtp=args["mtp"],
                                  **{k: args[k] for k in SPEC_ARGS})
        assert (np.isnan(r) | (lim.batch >= np.asarray(args["batch"]))).all()     # the batch fits at that ratio
    elif fn == "smallest_step_ratio":
        assert 0 < out <= 1
    elif fn == "host_memory_needed_bytes":
        assert type(out) is int and out > 0
    elif fn == "group_rows":
        first, inv = out
        assert inv.min() >= 0 and inv.max() < first.size and (inv[first] == np.arange(first.size)).all()
    elif fn == "tier_placement":
        _check_placement(out)


def _check_placement(df):
    """Bytes per tier: none negative, the GPU's parts add up to its HBM, the host's to its memory."""
    a = df.attrs
    assert (df.bytes >= 0).all() and finite(df)
    assert 0 <= a["batch"] <= a["largest_batch"]
    gpu = df[df.tier == "GPU"].bytes.sum()
    hbm = memory.gpu_spec(a["gpu"]).hbm_capacity_GiB * memory.GiB
    assert gpu == pytest.approx(hbm, rel=1e-9)
    host = df[df.tier == "host"].bytes.sum()
    assert df[(df.tier == "host") & (df.part == "latent cache (all)")].bytes.sum() <= host


LAYOUT = {
    "EntryFormat": (lambda **a: layout.EntryFormat(**a), {"name": "x", "n_layers": 4, "entry_bytes": 164,
                                                          "page_tokens": 64, "max_context": 4096, "dtype": "fp8"}),
    "entry_format": (lambda **a: layout.entry_format(**a), {"model": DS, "dtype": "bf16"}),
    "latent_layout": (lambda **a: layout.latent_layout(**a), {"model": DS, "dtype": "fp8"}),
    "latent_entry_bytes": (lambda **a: layout.latent_entry_bytes(**a), {"model": TINY, "dtype": "fp8"}),
    "indexer_entry_bytes": (lambda **a: layout.indexer_entry_bytes(**a), {"model": DS}),
    "token_bytes": (lambda **a: layout.token_bytes(**a), {"model": DS, "dtype": "fp8"}),
    "check_context_len": (lambda **a: layout.check_context_len(**a), {"model": DS, "context_len": 4097}),
    "padded_tokens": (lambda **a: layout.padded_tokens(**a), {"model": DS, "context_len": 4097}),
    "step_entries": (lambda **a: layout.step_entries(**a), {"model": DS, "context_len": 32768, "mtp": 3,
                                                           "overlap": np.full(61, 0.5), "k": None}),
    "pool_slots": (lambda **a: layout.pool_slots(**a), {"model": DS, "ratio": 0.2, "context_len": 32768,
                                                       "need": 2048}),
    "layer_pool_slots": (lambda **a: layout.layer_pool_slots(**a), {"model": DS, "ratio": 0.2, "context_len": 32768,
                                                                   "need": [8000, 2048, 2048]}),
    "request_cache": (lambda **a: layout.request_cache(**a), {"model": DS, "context_len": 32768, "ratio": 0.2,
                                                             "dtype": "fp8"}),
}
FIELDS = ("name", "n_layers", "entry_bytes", "page_tokens", "max_context", "dtype")


@fuzz_settings(400)
@given(data=st.data())
def test_layout_calls_refuse_meaningless_arguments_and_give_whole_bytes(data):
    fn, name, args, ok, out = call_one(data, LAYOUT, HUGE, {f: (f"EntryFormat.{f}",) for f in FIELDS})
    if not ok:
        return
    if fn in ("latent_entry_bytes", "indexer_entry_bytes", "token_bytes", "padded_tokens", "check_context_len"):
        assert type(out) is int and out > 0
        if fn == "padded_tokens":
            assert out >= args["context_len"] and out % DS.cache_page_tokens == 0
    elif fn == "step_entries":
        n = np.asarray(out)
        assert ((n >= 1) & (n <= args["context_len"])).all()
    elif fn == "pool_slots":
        assert type(out) is int and (args["need"] or 0) <= out <= layout.padded_tokens(DS, args["context_len"])
    elif fn == "layer_pool_slots":
        assert out.dtype == np.int64 and (out >= np.asarray(args["need"])).all()
        assert out.sum() <= out.size * layout.pool_slots(DS, args["ratio"], args["context_len"])
    elif fn == "request_cache":
        assert 0 <= out.latent_host_bytes <= out.latent_bytes and 0 < out.gpu_bytes <= out.total_bytes


TABLES = {
    "kv_bytes_by_context": (lambda **a: tables.kv_bytes_by_context(**a),
                            {"context_lens": [4096, 32768], "model": DS, "dtypes": ("fp8", "bf16")}),
    "batch_limits_by_gpu": (lambda **a: tables.batch_limits_by_gpu(**a),
                            {"context_lens": [32768], "ratios": [1.0, 0.2], "gpus": ["H200", "A100-80G"],
                             "model": DS, "deployment": DEP}),
    "memory_wall_claims": (lambda **a: tables.memory_wall_claims(**a),
                           {"model": DS, "deployment": DEP, "a100_deployment": "a100-ep32", "offload_ratio": 0.2}),
}
TABLE_ALIASES = {"context_lens": ("context_len",), "ratios": ("ratio",), "gpus": ("gpu",), "dtypes": ("dtype",),
                 "a100_deployment": ("deployment",), "offload_ratio": ("ratio",)}


@fuzz_settings(60)
@given(data=st.data())
def test_memory_tables_refuse_meaningless_arguments(data):
    fn, name, args, ok, out = call_one(data, TABLES, HUGE, TABLE_ALIASES)
    if not ok:
        return
    assert isinstance(out, pd.DataFrame) and len(out)
    if fn == "batch_limits_by_gpu":
        assert (out.batch >= 0).all() and finite(out[["batch", "kv_budget_GB"]])
    elif fn == "kv_bytes_by_context":
        assert (out.total_bytes == out.indexer_bytes + out.latent_bytes).all() and (out.total_bytes > 0).all()


def test_the_meaningless_memory_inputs_found_by_probing_are_refused():
    """Each once returned a silent answer or a raw traceback (the fuzz tests above found them)."""
    with pytest.raises(ValueError, match="batch=100000 does not fit: .* largest batch on H200 is 157"):
        memory.tier_placement(32768, 0.2, batch=100_000)          # reported 52.7 TB on a 141 GB GPU
    with pytest.raises(ValueError, match="52 requests of context_len=43713 tokens need"):   # named batch_limit only
        memory.fit_mem_fraction_static(52, 43713, model=DS, deployment=DEP)
    with pytest.raises(ValueError, match="mtp must not exceed the maximum context"):
        memory.batch_limits(32768, 0.2, mtp=1e300)                 # an int64 cast of 1e300
    with pytest.raises(ValueError, match="context_len must not exceed the maximum context"):
        memory.ratio_for_batch(10, 1e300)
    with pytest.raises(ValueError, match="decimals must be in"):
        memory.ratio_for_batch(10, 32768, decimals=400)            # OverflowError from 10 ** 400
    with pytest.raises(ValueError, match="batch and context_len must broadcast"):
        memory.ratio_for_batch([1, 2, 3], [4096, 8192])
    with pytest.raises(ValueError, match="step must be in"):
        memory.smallest_step_ratio(32768, step=0)                  # ZeroDivisionError in np.arange
    with pytest.raises(ValueError, match="step must be in"):
        memory.smallest_step_ratio(32768, step=2.0)                # silently 1.0
    with pytest.raises(TypeError, match="context_len must be an integer"):
        memory.step_slots_needed(DS, [1])                          # unhashable in the cache
    with pytest.raises(ValueError, match="index"):
        LIMITS.at((5, 0))
    with pytest.raises(ValueError, match="cols must be 1-D arrays of one length"):
        memory.group_rows([1, 2], [1, 2, 3])
    with pytest.raises(TypeError, match="model must be a ModelSpec"):
        layout.latent_entry_bytes("deepseek-v3.2-exp")             # AttributeError on a str
    with pytest.raises(TypeError, match="overlap must be a number"):
        layout.step_entries(DS, 4096, 2, overlap=["a"])
    with pytest.raises(ValueError, match="context_len=200000 exceeds the maximum context"):
        layout.padded_tokens(DS, 200_000)
    with pytest.raises(ValueError, match="context_lens must hold whole numbers"):
        tables.kv_bytes_by_context([4096.5])                       # truncated to 4096
    with pytest.raises(ValueError, match="ratios must be in"):
        tables.batch_limits_by_gpu([32768], [5.0])                 # an "infeasible" row, the error as its reason
    assert math.isfinite(memory.tier_placement(32768, 0.2, batch=3, n_spilled=2 ** 62).bytes.sum())
