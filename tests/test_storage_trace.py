"""ess.replay.run_trace (a whole ess.traces.Trace through the real cache), TieredCache.plan, DiskTier.block_path and
the public names of the storage modules."""
import numpy as np
import pytest

import ess.archive
import ess.replay
import ess.storage as S
from ess.archive import Archive
from ess.disk import request_id_of_stem, request_stem
from ess.layout import latent_entry_bytes
from ess.policies import simulate_misses
from ess.replay import run_trace
from ess.specs import model_spec
from ess.storage import ResidentCache, TieredCache
from ess.tracegen import Workload, synthetic_trace

TINY = model_spec("tiny")
W = latent_entry_bytes(TINY)


def _setup(ctx=300, steps=6, mtp=1, warm=4, capacity=None, seed=0):
    trace = synthetic_trace(Workload(ctx, n_layers=TINY.n_layers, k=TINY.index_topk, mtp=mtp, steps=steps, batch=2,
                                     warmup_windows=warm, profile=[0.0, 0.9, 0.5, 0.7], seed=seed))
    rng = np.random.default_rng(seed)
    prefill = rng.integers(0, 256, (TINY.n_layers, ctx, W), dtype=np.uint8)
    new = rng.integers(0, 256, (steps * mtp, TINY.n_layers, W), dtype=np.uint8)
    cache = TieredCache(TINY, capacity=capacity or 2 * mtp * TINY.index_topk, backend="numba")
    cache.add_request("q", prefill)
    return trace, cache, prefill, new


@pytest.mark.parametrize("mtp", [1, 2])
def test_run_trace_equals_the_step_by_step_loop(mtp):
    trace, cache, prefill, new = _setup(mtp=mtp)
    df = run_trace(cache, trace, "q", batch_index=1, new_tokens=new, verify=True)
    # the same calls written out by hand, on a second cache
    _, hand, _, _ = _setup(mtp=mtp)
    for layer in range(TINY.n_layers):
        hand.warmup("q", layer, trace.windows[1, layer])
    for t in range(trace.steps):
        for layer in range(TINY.n_layers):
            hand.step("q", layer, trace.indices[1, layer, t])
        for j in range(mtp):
            hand.append_token("q", new[t * mtp + j])
    assert df.equals(hand.metrics.to_frame())
    assert (df.kind == "step").sum() == trace.steps * TINY.n_layers
    assert (df.kind == "append").sum() == trace.steps * mtp
    truth = np.concatenate([prefill, new.transpose(1, 0, 2)], axis=1)
    np.testing.assert_array_equal(cache.host.entries("q"), truth)
    for layer in range(TINY.n_layers):
        m = cache.slot_map("q", layer)
        np.testing.assert_array_equal(cache.device_rows(np.fromiter(m.values(), np.int64)),
                                      truth[layer, np.fromiter(m, np.int64)])
    # the bytes-free oracle counts the same misses layer by layer
    st = df[df.kind == "step"]
    for layer in range(TINY.n_layers):
        want = simulate_misses(list(trace.indices[1, layer]), cache.capacity, windows=list(trace.windows[1, layer]))
        assert st[st.layer == layer].misses.tolist() == want.tolist()


def test_run_trace_returns_only_its_own_records_and_can_skip_warmup():
    trace, cache, _, new = _setup()
    cache.step("q", 0, np.array([1, 2, 3], np.int64))
    df = run_trace(cache, trace, "q", warmup=False, new_tokens=new)
    assert len(df) == len(cache.metrics) - 1 and "warmup" not in set(df.kind)
    first = df[(df.kind == "step") & (df.layer == 1)].misses.iloc[0]
    assert first >= TINY.index_topk - 3                     # cold pool: at most the 3 tokens stepped above hit


@pytest.mark.parametrize("kwargs,err,match", [
    ({"trace": "x"}, TypeError, "trace must be an ess.traces.Trace"),
    ({"request_id": "nobody"}, ValueError, "unknown request_id"),
    ({"batch_index": 2}, ValueError, r"batch_index must be in \[0, 2\), got 2"),
    ({"batch_index": 1.0}, TypeError, "batch_index must be an integer, got float"),
    ({"new_tokens": "short"}, ValueError, "new_tokens must hold steps \\* mtp = 6 tokens"),
    ({"new_tokens": None}, ValueError, "new_tokens is None but the trace selects token"),
    ({"capacity": TINY.index_topk - 1}, ValueError, "capacity=63"),
    ({"context": 299}, ValueError, "trace starts at context_len=300 tokens but request 'q' holds 299"),
    ({"verify": 1}, TypeError, "verify must be True or False, got int 1"),
    ({"warmup": "no"}, TypeError, "warmup must be True or False, got str 'no'"),
])
def test_run_trace_checks_everything_before_changing_anything(kwargs, err, match):
    trace, cache, prefill, new = _setup()
    if "capacity" in kwargs:
        cache = TieredCache(TINY, capacity=kwargs.pop("capacity"))
        cache.add_request("q", prefill)
    if "context" in kwargs:
        cache = TieredCache(TINY, capacity=cache.capacity)
        cache.add_request("q", prefill[:, :kwargs.pop("context")])
    if kwargs.get("new_tokens") == "short":
        kwargs["new_tokens"] = new[:-1]
    args = {"trace": trace, "request_id": "q", "new_tokens": new, **kwargs}
    before = cache.snapshot()
    with pytest.raises(err, match=match):
        run_trace(cache, args.pop("trace"), args.pop("request_id"), **args)
    after = cache.snapshot()
    np.testing.assert_array_equal(before["device"], after["device"])
    assert before["n_metrics"] == after["n_metrics"]
    for rid in before["host"]:
        np.testing.assert_array_equal(before["host"][rid], after["host"][rid])


def test_run_trace_layer_mismatch_and_missing_windows():
    trace, cache, prefill, new = _setup(warm=0)
    with pytest.raises(ValueError, match="the trace has no warmup windows"):
        run_trace(cache, trace, "q", new_tokens=new)
    assert len(cache.metrics) == 0
    three = TieredCache(model_spec("tiny"), capacity=cache.capacity)
    other = synthetic_trace(Workload(300, n_layers=3, k=TINY.index_topk, mtp=1, steps=2, batch=1, warmup_windows=0))
    three.add_request("q", prefill)
    with pytest.raises(ValueError, match="trace has 3 layers, the cache 4"):
        run_trace(three, other, "q", warmup=False)


def test_run_trace_verify_catches_a_wrong_copy(monkeypatch):
    trace, cache, _, new = _setup()
    real = TieredCache._copy_rows

    def corrupting(self, src, src_idx, dst, dst_idx):
        real(self, src, src_idx, dst, dst_idx)
        dst[int(dst_idx[0])] ^= 1                                 # one bit of the first loaded row flipped

    monkeypatch.setattr(TieredCache, "_copy_rows", corrupting)
    with pytest.raises(RuntimeError, match="differ from their host copies"):
        run_trace(cache, trace, "q", warmup=False, new_tokens=new, verify=True)


def test_plan_raises_what_step_raises_and_changes_nothing():
    _, cache, _, _ = _setup()
    before = cache.snapshot()
    plan = cache.plan("q", 0, np.array([1, 2, -1], np.int64))
    assert plan.n_misses == 2 and plan.miss_pos.tolist() == [0, 1] and plan.slots[2] == -1
    for args, err, match in [(("nobody", 0, np.array([1])), ValueError, "unknown request_id"),
                             (("q", 9, np.array([1])), ValueError, r"layer must be in \[0, 4\)"),
                             (("q", 0, np.array([300])), ValueError, r"holds 300, outside \[-1, 300\)"),
                             (("q", 0, np.array([1, 1])), ValueError, "repeats token 1"),
                             (("q", 0, np.array([1.0])), TypeError, "integers")]:
        with pytest.raises(err, match=match):
            cache.plan(*args)
        with pytest.raises(err, match=match):
            cache.step(*args)
    with pytest.raises(ValueError, match="scores must have the shape"):
        cache.plan("q", 0, np.array([1, 2]), scores=np.array([1.0]))
    after = cache.snapshot()
    np.testing.assert_array_equal(before["device"], after["device"])
    assert before["n_metrics"] == after["n_metrics"]


def test_replay_drives_any_cache_with_the_step_protocol():
    """The replay reaches the cache only through its step protocol: a cache lacking a call is refused by name, and
    a plain stand-in that counts the calls sees warmup, plan, copy, commit and append_token in the replay's order."""
    trace, cache, _, new = _setup(steps=2, warm=1)
    with pytest.raises(TypeError, match=r"lacks \['capacity', 'warmup'\]"):
        run_trace(ResidentCache(TINY, max_requests=1, max_tokens=400), trace, "q")
    calls = []

    class Counting:
        def __getattr__(self, name):
            attr = getattr(cache, name)
            if callable(attr):
                return lambda *a, **k: (calls.append(name), attr(*a, **k))[1]
            return attr

    df = run_trace(Counting(), trace, "q", new_tokens=new)
    L = TINY.n_layers
    assert calls[0] == "n_tokens" and calls[1:1 + L] == ["warmup"] * L
    assert calls[1 + L:] == (["plan", "copy", "commit"] * L + ["append_token"]) * trace.steps
    assert (df.kind == "step").sum() == 2 * L


def test_block_path_is_the_file_the_blocks_live_in(tmp_path):
    cache = TieredCache(TINY, capacity=TINY.index_topk)
    archive = Archive(cache, tmp_path, block_tokens=16)
    e = np.random.default_rng(3).integers(0, 256, (4, 40, W), dtype=np.uint8)
    cache.add_request("req.0", e)
    with pytest.raises(ValueError, match="no manifest"):                  # nothing archived yet
        archive.disk.block_path("req.0")
    archive.spill("req.0")
    path = archive.disk.block_path("req.0")
    assert path.exists() and path.parent == tmp_path
    assert path.stat().st_size == 3 * archive.disk.block_bytes              # 40 tokens in 16-token blocks
    mm = np.fromfile(path, np.uint8).reshape(3, 4, 16, W)
    np.testing.assert_array_equal(mm[1, :, :16], e[:, 16:32])              # block 1 holds tokens 16..31, all layers
    with open(path, "r+b") as fh:                                           # damage block 2 through the public path
        fh.seek(2 * archive.disk.block_bytes + 7)
        b = fh.read(1)
        fh.seek(2 * archive.disk.block_bytes + 7)
        fh.write(bytes([b[0] ^ 0xFF]))
    assert archive.disk.verify("req.0") == [2]
    assert request_stem(7) != request_stem("7")                             # int and str ids do not collide
    assert request_id_of_stem(request_stem(7)) == 7 and request_id_of_stem(request_stem("7")) == "7"
    with pytest.raises(ValueError, match="cannot name a disk file"):
        archive.disk.block_path("../evil")


def test_public_names():
    for name in S.__all__:
        assert hasattr(S, name), name
    import ess.disk
    import ess.memory
    for mod in (ess.disk, ess.memory, ess.archive, ess.replay):
        for name in mod.__all__:
            assert hasattr(mod, name), name
    assert "tier_placement" in ess.memory.__all__ and "DiskTier" in ess.disk.__all__
