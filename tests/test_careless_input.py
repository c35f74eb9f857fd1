"""A careless user's calls, each of which once returned a wrong answer without a word or a raw traceback from deep
inside; each must now be a clear ``TypeError`` (wrong type) or ``ValueError`` (wrong value) naming the argument.
(The memory-safety cases run in subprocesses in test_memory_safety.py; the cost model's sizes are in
test_sim_costs_by_hand.py.)"""
import numpy as np
import pytest

from ess import TieredCache, capacity_from_budget, model_spec
from ess.archive import Archive
from ess.cachesim import sequence_misses, smallest_pool
from ess.tracegen import Workload
from ess.disk import ArchiveError, DiskTier
from ess.memory import fit_mem_fraction_static
from ess.heat_predictor import HeatScorer, History, evaluate_predictor
from ess.prefetch import PrefetchConfig, simulate_prefetch
from ess.quant import dequantize_fp8_tiles, fp8_e4m3_encode, quantize_fp8_tiles
from ess.memory import ratio_for_batch
from ess.sim import CostParams, best_batch, simulate
from ess.traces import Trace, TraceRecorder, load_trace

NL = 61


def small_trace():
    rng = np.random.default_rng(0)
    idx = np.stack([np.stack([rng.permutation(16)[:4] for _ in range(5)]) for _ in range(2)])[:, None]  # (2,1,5,4)
    return Trace(idx.astype(np.int32), 16, 4, 1)


def tiny_cache(**kw):
    c = TieredCache("tiny", capacity=4, **kw)
    c.add_request("r", np.zeros((4, 10, c.entry_bytes), np.uint8))
    return c


CASES = [
    # --- silent wrong answers
    ("a 'fraction' of 41,615", lambda: fit_mem_fraction_static(10**6, 131072), ValueError, "batch_limit=1000000"),
    ("batch 0 gave ratio 1.0", lambda: ratio_for_batch(0, 32768), ValueError, "batch must be finite and > 0"),
    ("batch 2.5 gave ratio 1.0", lambda: ratio_for_batch(2.5, 32768), ValueError, "batch must hold whole numbers"),
    ("negative decimals", lambda: ratio_for_batch(52, 32768, decimals=-1), ValueError, r"decimals must be in \[0, 16\)"),
    ("request -1 wrapped to the last", lambda: simulate_prefetch(small_trace(), PrefetchConfig(capacity=8, warmup_mode="none"),
                                                                 requests=[-1]), ValueError, r"requests\[0\] must be in \[0, 2\)"),
    ("request 0 counted twice", lambda: simulate_prefetch(small_trace(), PrefetchConfig(capacity=8, warmup_mode="none"), requests=[0, 0]),
     ValueError, "requests must not repeat"),
    ("True taken for request 1", lambda: simulate_prefetch(small_trace(), PrefetchConfig(capacity=8, warmup_mode="none"), requests=[True]),
     TypeError, r"requests\[0\] must be an integer"),
    ("layer 5 of 1", lambda: simulate_prefetch(small_trace(), PrefetchConfig(capacity=8, warmup_mode="none"), layers=[5]), ValueError,
     r"layers\[0\] must be in \[0, 1\)"),
    ("padding -5 taken as padding", lambda: sequence_misses(np.array([[0, -5, 2], [1, 2, 3]]), 4), ValueError,
     "steps holds -5"),
    ("1.7 truncated to 1", lambda: sequence_misses(np.array([[0, 1.7, 2], [1, 2, 3]]), 4), TypeError,
     "steps must hold integers"),
    ("capacity 2.5 truncated", lambda: sequence_misses(np.array([[0, 1]]), 2.5), TypeError,
     "capacity must be an integer"),
    ("float warmup windows truncated", lambda: sequence_misses(np.array([[0, 1]]), 4, windows=np.array([[0.5, 1.0]])),
     TypeError, "windows must hold integers"),
    ("host layer -3 read another layer", lambda: tiny_cache().host.layer_rows("r", -3), ValueError,
     r"layer must be in \[0, 4\)"),
    ("padding -5 recorded as padding", lambda: TraceRecorder(context_len=8, k=2, n_layers=1, batch=1).observe(
        0, np.array([[-5, 3]])), ValueError, "observe: indices must be >= 0, or -1"),
    ("history padding -5 ignored", lambda: History(10).observe(np.array([-5, 2])), ValueError, "indices holds -5"),
    ("evaluation start -1 ignored", lambda: evaluate_predictor(HeatScorer(), np.array([[0, 1], [1, 2], [2, 3]]),
                                                               start=-1), ValueError, "start must be a positive integer"),
    ("resolution 0 never ends", lambda: smallest_pool(Workload(4096, n_layers=1, k=64, steps=2, batch=1), 30.0,
                                                      resolution=0), ValueError, "resolution must be a positive integer"),
    ("best_batch over no ratio", lambda: best_batch(32768, []), ValueError, "ratios must list at least one"),
    ("CostParams(compute_scale=True)", lambda: CostParams(compute_scale=True), TypeError,
     "CostParams.compute_scale must be a number"),
    ("positions beyond int32", lambda: Trace(np.zeros((1, 1, 1, 1), np.int32), 2**31, 1), ValueError,
     r"context_len \+ steps \* mtp = 2147483649 positions"),
    # --- raw tracebacks
    ("model_spec(['x']): unhashable", lambda: model_spec(["x"]), TypeError, "model must be a preset name"),
    ("misses for 60 layers", lambda: simulate(52, 32768, 0.5, misses=np.zeros(60)), ValueError,
     r"misses must have shape \(61,\) or \(N, 61\)"),
    ("misses as text", lambda: simulate(52, 32768, 0.5, misses="abc"), TypeError, "misses must be a number"),
    ("3 rows of misses for 2 batches", lambda: simulate([52, 60], 32768, 0.5, misses=np.zeros((3, NL))), ValueError,
     "one length N"),
    ("best_batch without misses", lambda: best_batch(32768, [0.5]), ValueError, "misses_by_ratio must give"),
    ("an infinite budget", lambda: capacity_from_budget(model_spec("tiny"), float("inf"), 2, 512), ValueError,
     "budget_bytes must be finite"),
    ("a budget too large to allocate", lambda: TieredCache(
        "tiny", capacity=capacity_from_budget(model_spec("tiny"), 1e30, 2, 512), max_requests=2), ValueError,
     "capacity=.* cannot be allocated"),
    ("a disk tier of 0 layers", lambda: DiskTier("unused", 0, 16), ValueError, "n_layers must be a positive integer"),
    ("negative entry bytes", lambda: DiskTier("unused", 2, -1), ValueError, "entry_bytes must be a positive integer"),
    ("a disk directory that is an int", lambda: Archive(TieredCache("tiny", capacity=4), 123), TypeError,
     "directory must be a path"),
    ("FP8 tiles of 0 values", lambda: quantize_fp8_tiles(np.ones((2, 8)), 0), ValueError,
     "tile must be a positive integer"),
    ("FP8 decode with tiles of 0", lambda: dequantize_fp8_tiles(np.zeros((2, 8), np.uint8), np.ones((2, 1)), 0),
     ValueError, "tile must be a positive integer"),
    ("FP8 of a string", lambda: fp8_e4m3_encode(np.array(["a"])), TypeError, "x must hold numbers"),
    ("History of floats", lambda: History(10).observe(np.array([1.5, 2])), TypeError, "indices must hold integers"),
]


@pytest.mark.parametrize("case,call,err,match", CASES, ids=[c[0] for c in CASES])
def test_careless_call_gets_a_clear_error(case, call, err, match):
    with pytest.raises(err, match=match):
        call()


def test_a_damaged_trace_file_is_a_value_error(tmp_path):
    path = small_trace().save(tmp_path / "t.npz")
    data = path.read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[:len(data) // 2])              # was zipfile.BadZipFile
    flipped = bytearray(data)
    for i in range(200, 260):
        flipped[i] ^= 0xFF
    (tmp_path / "flip.npz").write_bytes(bytes(flipped))                     # was zlib.error
    (tmp_path / "dir.npz").mkdir()
    for name in ("cut.npz", "flip.npz", "dir.npz"):
        with pytest.raises(ValueError, match=f"{name}: cannot read the trace"):
            load_trace(tmp_path / name)
    assert np.array_equal(load_trace(path).indices, small_trace().indices)


def test_disk_problems_name_the_request_or_the_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="exists and is not a folder"):
        Archive(TieredCache("tiny", capacity=4), tmp_path / "file")
    with pytest.raises(ArchiveError, match="request_id 'nope': no manifest req-snope.json"):
        DiskTier(tmp_path / "d", 2, 16).read("nope")
