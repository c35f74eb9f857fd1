"""Hostile-user probes of the kernels and the simulator's sweep (``tests/hostile.py``): the transfer, top-K, indexer
and K/V attention kernels (``ess.kernels``) on every CPU backend, and ``ess.sim.sweep``. Each probe does what a
careless or hostile user would -- a copy into its own source, an absurd width or grid, wrong dtypes, shapes and
devices, read-only or strided arrays, four threads at once, a forked child -- and checks the answer: a refusal must
name the argument, a call that goes through must agree with the NumPy reference. Fixed seeds; a few seconds.
"""
from __future__ import annotations

import os
import threading
import tracemalloc

import numpy as np
import torch

from ess.kernels import resolve_backend
from ess.kernels.gqa_indexer import gqa_indexer_scores
from ess.kernels.kv_attention import score_columns
from ess.kernels.topk import topk_positions
from ess.kernels.transfer import copy_rows, gather_rows, scatter_rows
from ess.sim.sweep import grid, sweep

from hostile import Probe, ProbeError, bad_rows, run_probes

BACKENDS = ("reference", "numba", "torch")


def check(ok, what):
    if not ok:
        raise ProbeError(what)


def rows(n, w=24, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, w), dtype=np.uint8)


# -- the transfer kernels ---------------------------------------------------------------------------------------

def gather_into_its_own_source(tmp):
    """``gather_rows(a, idx, out=a)`` on every backend and array kind: one answer, every row read before written."""
    a = rows(10)
    idx = np.array([9, 8, 7, 6, 5, 4, 3, 2, 1, -1], np.int64)
    want = a.copy()
    want[:9] = a[idx[:9]]
    for backend in BACKENDS:
        for kind in ("numpy", "torch"):
            arr = a.copy() if kind == "numpy" else torch.from_numpy(a.copy())
            gather_rows(arr, idx, out=arr, backend=backend)
            check(np.array_equal(np.asarray(arr), want), f"{backend} on {kind}: another answer than the reference")


def copy_between_overlapping_views(tmp):
    base = rows(16)
    want = base.copy()
    want[3:11] = base[0:8]
    for backend in BACKENDS:
        b = base.copy()
        copy_rows(b[0:8], np.arange(8), b[3:11], np.arange(8), backend=backend)
        check(np.array_equal(b, want), f"{backend}: an overlapping copy read rows it had written")


def scatter_onto_itself(tmp):
    for backend in BACKENDS:
        a = rows(7)
        want = a[::-1].copy()
        scatter_rows(a, np.arange(6, -1, -1), a, backend=backend)
        check(np.array_equal(a, want), f"{backend}: a scatter onto its own rows lost rows")


def copy_float_rows(tmp):
    copy_rows(np.zeros((4, 8), np.float32), np.arange(2), rows(4, 8), np.arange(2))


def copy_index_past_the_rows(tmp):
    copy_rows(rows(4), np.array([0, 4]), rows(4), np.array([0, 1]))


def copy_index_near_2_31(tmp):
    copy_rows(rows(4), np.array([2 ** 31 - 1]), rows(4), np.array([0]))


def copy_repeated_destination(tmp):
    copy_rows(rows(4), np.array([0, 1]), rows(4), np.array([2, 2]))


def copy_unknown_mode(tmp):
    copy_rows(rows(4), np.arange(2), rows(4), np.arange(2), mode="fast")


def copy_unknown_backend(tmp):
    copy_rows(rows(4), np.arange(2), rows(4), np.arange(2), backend="cuda")


def copy_float_indices(tmp):
    copy_rows(rows(4), np.array([0.0, 1.0]), rows(4), np.arange(2))


def gather_into_read_only(tmp):
    out = np.zeros((2, 24), np.uint8)
    out.flags.writeable = False
    gather_rows(rows(4), np.arange(2), out=out)


def gather_strided_source(tmp):
    gather_rows(rows(8)[::2], np.arange(2))


def gather_out_of_another_width(tmp):
    gather_rows(rows(4), np.arange(2), out=np.zeros((2, 23), np.uint8))


def gather_from_a_list(tmp):
    gather_rows([[1, 2], [3, 4]], np.arange(2))


def gather_empty(tmp):
    out = gather_rows(rows(4), np.empty(0, np.int64))
    check(out.shape == (0, 24), f"an empty gather gave shape {out.shape}")


def four_threads_gather(tmp):
    src = rows(4096, 64)
    rng = np.random.default_rng(3)
    idxs = [rng.integers(-1, 4096, 2048) for _ in range(8)]
    want = [gather_rows(src, i, backend="reference") for i in idxs]
    outs = [None] * 8

    def run(j):
        outs[j] = gather_rows(src, idxs[j], backend="numba" if j % 2 else "torch")
    threads = [threading.Thread(target=run, args=(j,)) for j in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(all(o is not None and np.array_equal(o, w) for o, w in zip(outs, want)), "threads gathered other rows")


def forked_child_gathers(tmp):
    src = rows(64)
    want = gather_rows(src, np.arange(63, -1, -1), backend="reference")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            got = gather_rows(src, np.arange(63, -1, -1), backend="numba")
            code = 0 if np.array_equal(got, want) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    check(os.waitstatus_to_exitcode(status) == 0, f"the forked child's gather ended in {status}")


# -- top-K, the indexer and the K/V attention -------------------------------------------------------------------

def topk_width_near_2_31(tmp):
    topk_positions(np.zeros((1, 8), np.float32), 2 ** 31 - 1)


def topk_width_2_30(tmp):
    topk_positions(np.zeros((1, 8), np.float32), 2 ** 30)


def topk_float_width(tmp):
    topk_positions(np.zeros((1, 8), np.float32), 4.0)


def topk_integer_scores(tmp):
    topk_positions(np.zeros((1, 8), np.int64), 4)


def topk_padding_agrees(tmp):
    s = np.random.default_rng(5).standard_normal((3, 9)).astype(np.float32)
    s[1, 4:] = -np.inf
    outs = [topk_positions(s, 12, backend=b) for b in BACKENDS]
    check(all(np.array_equal(o, outs[0]) for o in outs), "the backends pad differently")
    check((outs[0][:, 9:] == -1).all(), "padding past L is not -1")


def four_threads_topk(tmp):
    rng = np.random.default_rng(11)
    scores = [rng.standard_normal((4, 3000)).astype(np.float32) for _ in range(8)]
    want = [topk_positions(s, 100, backend="reference") for s in scores]
    outs = [None] * 8

    def run(j):
        outs[j] = topk_positions(scores[j], 100, backend="numba")      # each thread its own scratch buffers
    threads = [threading.Thread(target=run, args=(j,)) for j in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(all(np.array_equal(o, w) for o, w in zip(outs, want)), "threads sharing the kernel got other top-K sets")


def indexer_mixed_array_kinds(tmp):
    B, L, H, Hkv, hd = 1, 8, 4, 2, 4
    gqa_indexer_scores(torch.zeros((B, H, hd)), np.zeros((B, L, Hkv * hd), np.uint8),
                       np.ones((B, L, Hkv), np.float32), np.array([L]))


def indexer_lengths_of_another_shape(tmp):
    B, L, H, Hkv, hd = 2, 8, 4, 2, 4
    gqa_indexer_scores(np.zeros((B, H, hd), np.float32), np.zeros((B, L, Hkv * hd), np.uint8),
                       np.ones((B, L, Hkv), np.float32), np.array([L]))


def kv_rows_past_the_pool(tmp):
    q = np.zeros((2, 4, 4), np.float32)
    pool = np.zeros((5, 2, 2, 4), np.float32)
    score_columns(q, pool, np.array([0, 1]), np.array([0, 0]), np.array([0, 5]), 0.5, np.zeros((2, 4, 3), np.float32))


def kv_scale_nan(tmp):
    q = np.zeros((2, 4, 4), np.float32)
    pool = np.zeros((5, 2, 2, 4), np.float32)
    score_columns(q, pool, np.array([0]), np.array([0]), np.array([0]), float("nan"), np.zeros((2, 4, 3), np.float32))


def backend_on_missing_cuda(tmp):
    if torch.cuda.is_available():
        return "sensible"
    resolve_backend("torch", device="cuda")


# -- the sweep --------------------------------------------------------------------------------------------------

def sweep_grid_absurd(tmp):
    grid({"batch": list(range(1, 10 ** 5)), "context_len": list(range(1, 10 ** 5)), "ratio": [0.5] * 10 ** 3})


def sweep_grid_memory(tmp):
    axes = {"batch": list(range(1, 101)), "context_len": [4096 * i for i in range(1, 51)], "ratio": [0.2, 0.5, 1.0]}
    grid({"batch": [1], "context_len": [1]})
    tracemalloc.start()
    try:
        df = grid(axes)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    frame = int(df.memory_usage(deep=True).sum())
    check(peak < 1.5 * frame, f"the grid peaked at {peak / frame:.1f}x the frame it returned")


def sweep_unknown_axis(tmp):
    sweep({"batch": [1], "context_len": [4096], "gpu": ["H200"]}, workers=0, progress=False)


def sweep_chunk_fraction(tmp):
    sweep({"batch": [1], "context_len": [4096]}, chunk_size=1.5, workers=0, progress=False)


def sweep_negative_workers(tmp):
    sweep({"batch": [1], "context_len": [4096]}, workers=-1, progress=False)


def sweep_progress_as_text(tmp):
    sweep({"batch": [1], "context_len": [4096]}, workers=0, progress="no")


def sweep_scenario_of_another_type(tmp):
    sweep({"batch": [1], "context_len": [4096]}, scenario="paper", workers=0, progress=False)


def sweep_misses_2d(tmp):
    sweep({"batch": [1], "context_len": [4096]}, misses=np.ones((2, 3)), workers=0, progress=False)


def sweep_axis_of_text(tmp):
    sweep({"batch": ["many"], "context_len": [4096]}, workers=0, progress=False)


def sweep_empty_axis(tmp):
    sweep({"batch": [], "context_len": [4096]}, workers=0, progress=False)


def sweep_chunks_agree(tmp):
    axes = {"batch": [16, 52, 100], "context_len": [8192, 32768], "mtp": [1, 2]}
    whole = sweep(axes, workers=0, progress=False)
    chunked = sweep(axes, workers=0, progress=False, chunk_size=5)
    check(whole.equals(chunked), "chunking changed the answer")


PROBES = [
    Probe("kernels", "gather_into_its_own_source", gather_into_its_own_source),
    Probe("kernels", "copy_between_overlapping_views", copy_between_overlapping_views),
    Probe("kernels", "scatter_onto_itself", scatter_onto_itself),
    Probe("kernels", "copy_float_rows", copy_float_rows, ("src",)),
    Probe("kernels", "copy_index_past_the_rows", copy_index_past_the_rows, ("src_idx",)),
    Probe("kernels", "copy_index_near_2_31", copy_index_near_2_31, ("src_idx",)),
    Probe("kernels", "copy_repeated_destination", copy_repeated_destination, ("dst_idx",)),
    Probe("kernels", "copy_unknown_mode", copy_unknown_mode, ("mode",)),
    Probe("kernels", "copy_unknown_backend", copy_unknown_backend, ("backend",)),
    Probe("kernels", "copy_float_indices", copy_float_indices, ("src_idx",)),
    Probe("kernels", "gather_into_read_only", gather_into_read_only, ("out",)),
    Probe("kernels", "gather_strided_source", gather_strided_source, ("src",)),
    Probe("kernels", "gather_out_of_another_width", gather_out_of_another_width, ("out",)),
    Probe("kernels", "gather_from_a_list", gather_from_a_list, ("src",)),
    Probe("kernels", "gather_empty", gather_empty),
    Probe("kernels", "four_threads_gather", four_threads_gather),
    Probe("kernels", "forked_child_gathers", forked_child_gathers),
    Probe("kernels", "topk_width_near_2_31", topk_width_near_2_31, ("k",)),
    Probe("kernels", "topk_width_2_30", topk_width_2_30, ("k",)),
    Probe("kernels", "topk_float_width", topk_float_width, ("k",)),
    Probe("kernels", "topk_integer_scores", topk_integer_scores, ("scores",)),
    Probe("kernels", "topk_padding_agrees", topk_padding_agrees),
    Probe("kernels", "four_threads_topk", four_threads_topk),
    Probe("kernels", "indexer_mixed_array_kinds", indexer_mixed_array_kinds, ("codes", "q")),
    Probe("kernels", "indexer_lengths_of_another_shape", indexer_lengths_of_another_shape, ("lengths",)),
    Probe("kernels", "kv_rows_past_the_pool", kv_rows_past_the_pool, ("rows",)),
    Probe("kernels", "kv_scale_nan", kv_scale_nan, ("scale",)),
    Probe("kernels", "backend_on_missing_cuda", backend_on_missing_cuda, ("device",)),
    Probe("kernels", "sweep_grid_absurd", sweep_grid_absurd, ("axes",)),
    Probe("kernels", "sweep_grid_memory", sweep_grid_memory),
    Probe("kernels", "sweep_unknown_axis", sweep_unknown_axis, ("gpu",)),
    Probe("kernels", "sweep_chunk_fraction", sweep_chunk_fraction, ("chunk_size",)),
    Probe("kernels", "sweep_negative_workers", sweep_negative_workers, ("workers",)),
    Probe("kernels", "sweep_progress_as_text", sweep_progress_as_text, ("progress",)),
    Probe("kernels", "sweep_scenario_of_another_type", sweep_scenario_of_another_type, ("scenario",)),
    Probe("kernels", "sweep_misses_2d", sweep_misses_2d, ("misses",)),
    Probe("kernels", "sweep_axis_of_text", sweep_axis_of_text, ("batch",)),
    Probe("kernels", "sweep_empty_axis", sweep_empty_axis, ("batch",)),
    Probe("kernels", "sweep_chunks_agree", sweep_chunks_agree),
]


def test_kernel_probes(tmp_path_factory):
    rows_ = run_probes(PROBES, tmp_path_factory.mktemp)
    assert bad_rows(rows_) == []
