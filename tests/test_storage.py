"""TieredCache: the step contract, bad input leaves everything unchanged, injected faults, its archive on disk
(ess.archive), the sizing rules (ess.layout), and a hypothesis state machine checking every resident entry against
the host truth byte for byte."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ess.archive import Archive
from ess.kernels.transfer import TransferError
from ess.layout import capacity_from_budget, capacity_from_ratio, latent_entry_bytes
from ess.specs import model_spec
from ess.disk import CorruptBlockError
from ess.storage import TieredCache
from fuzz_helpers import same

TINY = model_spec("tiny")
W = latent_entry_bytes(TINY)            # 164 B: the tiny model's FP8 entry


def entries(n_tokens, seed=0, n_layers=4, w=W):
    return np.random.default_rng(seed).integers(0, 256, (n_layers, n_tokens, w), dtype=np.uint8)


def check_resident_bytes(cache, rid, truth):
    """Every resident entry of every layer equals the host truth byte for byte."""
    for layer in range(cache.n_layers):
        m = cache.slot_map(rid, layer)
        if m:
            toks = np.fromiter(m, np.int64)
            slots = np.fromiter(m.values(), np.int64)
            np.testing.assert_array_equal(cache.device_rows(slots), truth[layer, toks])
        np.testing.assert_array_equal(cache.host.entries(rid)[layer], truth[layer])


def test_step_contract_fields():
    c = TieredCache(TINY, capacity=5)
    e = entries(20)
    c.add_request("a", e)
    r1 = c.step("a", 1, np.array([3, -1, 9, 4], np.int64))
    assert r1.slots[1] == -1 and (r1.slots[[0, 2, 3]] >= 0).all()
    assert r1.hit.tolist() == [False] * 4 and r1.miss_pos.tolist() == [0, 2, 3] and r1.hit_pos.size == 0
    assert r1.bytes_h2d == 3 * W
    r2 = c.step("a", 1, np.array([9, 10, -1, 3, 11], np.int64))
    assert r2.hit.tolist() == [True, False, False, True, False]
    assert r2.hit_pos.tolist() == [0, 3] and r2.miss_pos.tolist() == [1, 4]
    assert r2.slots[0] == r1.slots[2] and r2.slots[3] == r1.slots[0]      # hits keep their slots
    assert r2.bytes_h2d == 2 * W and r2.evicted.tolist() == []
    rows = c.device_rows(r2.slots)
    np.testing.assert_array_equal(rows[[0, 1, 3, 4]], e[1, [9, 10, 3, 11]])
    assert (rows[2] == 0).all()
    # layers and requests have separate pools with separate slot ranges
    c.add_request("b", entries(20, seed=1))
    rb = c.step("b", 1, np.array([3], np.int64))
    assert rb.n_misses == 1 and rb.slots[0] not in set(r2.slots.tolist())
    check_resident_bytes(c, "a", e)


def test_eviction_and_append():
    c = TieredCache(TINY, capacity=3)
    e = entries(6)
    c.add_request(0, e)
    c.step(0, 0, np.array([0, 1, 2], np.int64))
    r = c.step(0, 0, np.array([3, 0], np.int64))       # 1 is the LRU entry not in S
    assert r.evicted.tolist() == [1]
    new = np.random.default_rng(9).integers(0, 256, (4, W), dtype=np.uint8)
    tok = c.append_token(0, new)
    assert tok == 6 and c.n_tokens(0) == 7
    truth = np.concatenate([e, new[:, None]], axis=1)
    r = c.step(0, 0, np.array([6, 3], np.int64))
    assert r.n_misses == 1
    np.testing.assert_array_equal(c.device_rows(r.slots), truth[0, [6, 3]])
    tot = c.metrics.totals()
    assert tot["append"]["bytes_d2h"] == 4 * W and tot["step"]["misses"] == 3 + 1 + 1
    check_resident_bytes(c, 0, truth)


def test_host_pool_grows_many_appends():
    c = TieredCache(TINY, capacity=4)
    c.add_request(0, entries(1))
    truth = [entries(1)[:, 0]]
    for i in range(70):
        new = entries(1, seed=100 + i)[:, 0]
        c.append_token(0, new)
        truth.append(new)
    assert c.n_tokens(0) == 71
    np.testing.assert_array_equal(c.host.entries(0), np.stack(truth, axis=1))


BAD_STEPS = [
    (np.array([0, 50], np.int64), ValueError, r"holds 50, outside \[-1, 20\)"),
    (np.array([2, 2], np.int64), ValueError, "repeats token 2"),
    (np.arange(7, dtype=np.int64), ValueError, "capacity=6"),
    (np.array([1.0, 2.0]), TypeError, "integers"),
    (np.array([[1, 2]], np.int64), ValueError, "1-D"),
    ([1, 2], TypeError, "NumPy integer array"),
]


@pytest.mark.parametrize("bad,err,match", BAD_STEPS)
def test_bad_step_changes_nothing(bad, err, match):
    c = TieredCache(TINY, capacity=6)
    c.add_request("r", entries(20))
    c.step("r", 0, np.array([1, 2, 3], np.int64))
    before = c.snapshot()
    with pytest.raises(err, match=match):
        c.step("r", 0, bad)
    assert same(before, c.snapshot())


def test_other_bad_calls_change_nothing():
    c = TieredCache(TINY, capacity=4)
    c.add_request("r", entries(10))
    c.step("r", 0, np.array([1, 2], np.int64))
    before = c.snapshot()
    calls = [
        (lambda: c.step("nope", 0, np.array([1])), ValueError, "unknown request_id"),
        (lambda: c.step("r", 4, np.array([1])), ValueError, r"layer must be in \[0, 4\)"),
        (lambda: c.step("r", 0, np.array([1]), scores=np.array([1.0, 2.0])), ValueError, "scores must have"),
        (lambda: c.step("r", 0, np.array([1]), scores=np.array([np.nan])), ValueError, "finite"),
        (lambda: c.append_token("r", np.zeros((4, W), np.int8)), TypeError, "uint8"),
        (lambda: c.append_token("r", np.zeros((3, W), np.uint8)), ValueError, "shape"),
        (lambda: c.add_request("r", entries(3)), ValueError, "already exists"),
        (lambda: c.add_request("s", entries(3, w=W + 1)), ValueError, "shape"),
        (lambda: c.add_request("s", entries(3, n_layers=3)), ValueError, "n_layers=4"),
        (lambda: c.add_request("s", entries(3).astype(np.float32)), TypeError, "uint8"),
        (lambda: c.warmup("r", 0, [np.array([1, 2]), np.array([3, 3])]), ValueError, r"windows\[1\] repeats"),
        (lambda: c.warmup("r", 0, [np.arange(5)]), ValueError, "capacity=4"),
        (lambda: c.device_rows(np.array([10 ** 6])), ValueError, "slots must be in"),
        (lambda: c.add_request(1.0, entries(3)), TypeError, "request_id must be an int or a str"),
        (lambda: c.add_request("s", entries(3), reserve_tokens=10 ** 15), ValueError, "exceeds the maximum context"),
    ]
    for call, err, match in calls:
        with pytest.raises(err, match=match):
            call()
        assert same(before, c.snapshot()), match


def test_constructor_errors():
    with pytest.raises(ValueError, match="capacity must be a positive integer, got 0"):
        TieredCache(TINY, capacity=0)
    with pytest.raises(TypeError, match="capacity must be an integer"):
        TieredCache(TINY, capacity=2.5)
    with pytest.raises(ValueError, match="dtype must be one of"):
        TieredCache(TINY, capacity=2, dtype="int4")
    with pytest.raises(ValueError, match="policy must be one of"):
        TieredCache(TINY, capacity=2, policy="mru")
    with pytest.raises(ValueError, match="device must be"):
        TieredCache(TINY, capacity=2, device="tpu")


def test_budgets():
    ds = model_spec("deepseek-v3.2-exp")
    # 2 requests x 61 layers x 656 B x 4096 slots, plus a little: 4096 slots
    budget = 2 * 61 * 656 * 4096 + 1000
    assert capacity_from_budget(ds, budget, 2, 32768) == 4096
    with pytest.raises(ValueError, match="one step needs K = 2048"):
        capacity_from_budget(ds, 2 * 61 * 656 * 2047, 2, 32768)
    assert capacity_from_ratio(TINY, 0.1, 1280) == 128                        # 0.1 x 1,280 (20 pages)
    with pytest.raises(ValueError, match="fewer than the 2048 entries"):
        capacity_from_ratio(ds, 0.05, 32768)
    c = TieredCache(TINY, capacity=capacity_from_budget(TINY, 3 * 4 * W * 100, 3, 1000), max_requests=3)
    assert c.capacity == 100 and c.budget_bytes <= 3 * 4 * W * 100
    for r in range(3):
        c.add_request(r, entries(5))
    with pytest.raises(ValueError, match="max_requests=3"):
        c.add_request(3, entries(5))
    assert c.device_allocated_bytes == c.budget_bytes
    c.remove_request(1)
    c.add_request(3, entries(5))                          # the freed block is reused
    assert c.device_allocated_bytes == c.budget_bytes
    b16 = TieredCache(TINY, capacity=capacity_from_ratio(TINY, 0.5, 256), dtype="bf16")
    assert b16.entry_bytes == (128 + 16) * 2 and b16.capacity == 128
    assert capacity_from_budget(TINY, 3 * 4 * 288 * 100, 3, 1000, dtype="bf16") == 100      # 288-byte BF16 entries


def test_injected_transfer_failure_leaves_no_half_written_slot():
    c = TieredCache(TINY, capacity=4)
    e = entries(30)
    c.add_request(0, e)
    c.step(0, 0, np.array([1, 2, 3, 4], np.int64))
    real = c._copy_rows

    def half_then_fail(src, s_idx, dst, d_idx):
        h = len(s_idx) // 2
        real(src, s_idx[:h], dst, d_idx[:h])              # half the rows land, overwriting victims
        raise OSError("injected: link reset")

    c._copy_rows = half_then_fail
    with pytest.raises(TransferError, match="injected: link reset"):
        c.step(0, 0, np.array([10, 11, 12, 2], np.int64))   # 3 misses, victims 1, 3, 4
    c._copy_rows = real
    m = c.slot_map(0, 0)
    assert set(m) == {2}                                  # the victims were freed, the hit stays
    check_resident_bytes(c, 0, e)
    r = c.step(0, 0, np.array([10, 11, 12, 2], np.int64))  # retry works and loads into the freed slots
    assert r.n_misses == 3
    check_resident_bytes(c, 0, e)


def test_failure_on_free_slots_keeps_every_entry():
    c = TieredCache(TINY, capacity=8)
    e = entries(30)
    c.add_request(0, e)
    c.step(0, 2, np.array([1, 2], np.int64))
    c._copy_rows = lambda *a: (_ for _ in ()).throw(RuntimeError("injected"))
    with pytest.raises(TransferError):
        c.step(0, 2, np.array([5, 6, 1], np.int64))        # misses go to free slots only
    assert set(c.slot_map(0, 2)) == {1, 2}
    check_resident_bytes(c, 0, e)


def test_spill_restore_and_incremental_checkpoint(tmp_path):
    c = TieredCache(TINY, capacity=4)
    a = Archive(c, tmp_path, block_tokens=8)
    e = entries(20)
    c.add_request("x", e)
    c.step("x", 3, np.array([1, 5, 19], np.int64))
    assert a.checkpoint("x") == 3                          # ceil(20 / 8) blocks
    new = entries(1, seed=7)[:, 0]
    c.append_token("x", new)
    assert a.checkpoint("x") == 1                          # only the last block changed
    c.step("x", 3, np.array([2, 20], np.int64))
    order = c.resident("x", 3).tolist()
    a.spill("x")
    assert "x" not in c.requests() and "x" not in c.host and a.spilled == ["x"]
    with pytest.raises(ValueError, match="spilled to disk"):
        c.step("x", 0, np.array([1], np.int64))
    with pytest.raises(ValueError, match="spilled to"):
        c.add_request("x", e)
    info = a.restore("x")
    assert info == {"tokens": 21, "resident": 4, "bytes_h2d": 4 * W, "pool_state_restored": True}
    truth = np.concatenate([e, new[:, None]], axis=1)
    check_resident_bytes(c, "x", truth)
    assert c.resident("x", 3).tolist() == order
    assert c.step("x", 3, np.array([2, 20], np.int64)).n_misses == 0


def test_restore_with_failing_transfer_keeps_pools_consistent(tmp_path):
    c = TieredCache(TINY, capacity=4)
    a = Archive(c, tmp_path)
    e = entries(12)
    c.add_request(0, e)
    for layer in range(4):
        c.step(0, layer, np.array([1, 2, 3], np.int64))
    a.spill(0)
    real = c._copy_rows
    calls = []

    def fail_on_third(*args):
        calls.append(1)
        if len(calls) == 3:
            raise OSError("injected")
        real(*args)

    c._copy_rows = fail_on_third
    with pytest.raises(TransferError, match="layer 2"):
        a.restore(0)
    c._copy_rows = real
    assert a.spilled == [] and c.requests() == [0]           # back in memory (that layer's pool empty)
    assert c.slot_map(0, 2) == {} and set(c.slot_map(0, 1)) == {1, 2, 3}
    check_resident_bytes(c, 0, e)


def test_crash_recovery_rebuilds_pools(tmp_path):
    c = TieredCache(TINY, capacity=3, policy="fifo")
    a = Archive(c, tmp_path)
    e0, e1 = entries(10, 1), entries(12, 2)
    c.add_request(0, e0)
    c.add_request("b", e1)
    c.step(0, 0, np.array([1, 2, 3], np.int64))
    c.step("b", 1, np.array([4, 5], np.int64))
    a.checkpoint(0)
    a.checkpoint("b")
    r0, rb = c.resident(0, 0).tolist(), c.resident("b", 1).tolist()
    del a, c                                                # "crash": only the disk survives
    d = TieredCache(TINY, capacity=3, policy="fifo")
    rec = Archive(d, tmp_path).recover()
    assert sorted(map(str, rec.recovered)) == ["0", "b"] and rec.failed == {} and rec.orphans == []
    assert sorted(map(str, d.requests())) == ["0", "b"]
    assert d.resident(0, 0).tolist() == r0 and d.resident("b", 1).tolist() == rb
    check_resident_bytes(d, 0, e0)
    check_resident_bytes(d, "b", e1)
    assert d.step(0, 0, np.array([4], np.int64)).evicted.tolist() == [1]   # FIFO order survived


def _flip_byte(path, offset):
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0xFF]))


def test_corrupt_block_is_repaired_from_host(tmp_path):
    c = TieredCache(TINY, capacity=4)
    a = Archive(c, tmp_path, block_tokens=4)
    e = entries(10)
    c.add_request(5, e)
    a.checkpoint(5)
    path, offset = a.disk.block_location(5, 1)
    _flip_byte(path, offset + 17)                                  # damage block 1
    assert a.verify(5) == [1]
    assert a.repair(5) == [1]
    assert a.verify(5) == []
    a.spill(5)
    a.restore(5)
    check_resident_bytes(c, 5, e)


def test_corrupt_block_without_host_copy_is_reported(tmp_path):
    c = TieredCache(TINY, capacity=4)
    a = Archive(c, tmp_path, block_tokens=4)
    c.add_request(5, entries(10))
    a.spill(5)
    before = c.snapshot()
    path, offset = a.disk.block_location(5, 2)
    _flip_byte(path, offset + 3)                                # damage block 2
    with pytest.raises(CorruptBlockError, match=r"block\(s\) \[2\]") as info:
        a.restore(5)
    assert info.value.blocks == [2]
    assert same(before, c.snapshot()) and a.spilled == [5]      # nothing restored, nothing half-changed
    _flip_byte(path, offset + 3)                                # undo: the block is whole again
    _flip_byte(a.disk.pool_path(5), 40)                         # now only the pool state is damaged
    assert a.verify(5) == [-1]
    info = a.restore(5)                                                 # entries back, device pool empty
    assert info["pool_state_restored"] is False and info["resident"] == 0
    assert c.n_tokens(5) == 10 and all(c.slot_map(5, l) == {} for l in range(4))
    np.testing.assert_array_equal(c.host.entries(5), entries(10))


def test_disk_rejects_unsafe_ids(tmp_path):
    c = TieredCache(TINY, capacity=4)
    c.add_request("../etc", entries(3))                     # in memory any str is an id ...
    a = Archive(c, tmp_path)
    with pytest.raises(ValueError, match="cannot name a disk file"):
        c.add_request("../etc2", entries(3))                # ... one that cannot name a file is refused while archived
    with pytest.raises(ValueError, match="cannot name a disk file"):
        a.checkpoint("../etc")
    assert c.requests() == ["../etc"] and list(tmp_path.glob("req-*")) == []


@pytest.mark.cuda
def test_cuda_device_pool_matches_host():
    c = TieredCache(TINY, capacity=6, device="cuda")
    assert c.backend == "torch" and c.host.pinned
    e = entries(40)
    c.add_request(0, e)
    rng = np.random.default_rng(0)
    for _ in range(10):
        idx = rng.choice(40, 5, replace=False).astype(np.int64)
        idx[0] = -1
        r = c.step(0, int(rng.integers(4)), idx)
        np.testing.assert_array_equal(c.device_rows(r.slots)[1:], e[r.layer, idx[1:]])
    check_resident_bytes(c, 0, e)


# -------------------------------------------------------------------------------------------------------------
# Property test: random sequences of appends, steps (with evictions), warmups, spills and restores
# -------------------------------------------------------------------------------------------------------------

ops = st.lists(st.tuples(st.sampled_from(["step", "step", "step", "append", "warmup", "spill", "checkpoint"]),
                         st.integers(0, 2 ** 31 - 1)), min_size=1, max_size=25)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops, capacity=st.integers(3, 9), policy=st.sampled_from(["lru", "fifo", "heat", "clock", "sampled_clock"]),
       backend=st.sampled_from(["numba", "torch", "reference"]))
def test_random_sequences_keep_bytes_true(tmp_path_factory, ops, capacity, policy, backend):
    disk = tmp_path_factory.mktemp("disk")
    c = TieredCache(TINY, capacity=capacity, policy=policy, backend=backend, max_requests=2)
    a = Archive(c, disk, block_tokens=4)
    truth = {r: entries(6 + 3 * r, seed=r) for r in range(2)}
    for r, e in truth.items():
        c.add_request(r, e)
    for op, seed in ops:
        rng = np.random.default_rng(seed)
        r = int(rng.integers(2))
        if r not in c.requests():
            a.restore(r)
        n = truth[r].shape[1]
        layer = int(rng.integers(4))
        if op == "step":
            k = int(rng.integers(1, capacity + 3))
            idx = rng.choice(n, size=min(k, n), replace=False).astype(np.int64)
            idx[rng.random(idx.size) < 0.25] = -1
            scores = rng.random(idx.size)
            if (idx >= 0).sum() > capacity:
                before = c.snapshot()
                with pytest.raises(ValueError):
                    c.step(r, layer, idx, scores=scores)
                assert same(before, c.snapshot())
                continue
            before = set(c.slot_map(r, layer))
            res = c.step(r, layer, idx, scores=scores)
            valid = idx[idx >= 0]
            assert set(valid[res.hit[idx >= 0]].tolist()) == before & set(valid.tolist())
            np.testing.assert_array_equal(c.device_rows(res.slots)[idx >= 0], truth[r][layer, valid])
        elif op == "append":
            new = rng.integers(0, 256, (4, W), dtype=np.uint8)
            c.append_token(r, new)
            truth[r] = np.concatenate([truth[r], new[:, None]], axis=1)
        elif op == "warmup":
            wins = [rng.choice(n, size=min(capacity, n), replace=False).astype(np.int64) for _ in range(2)]
            c.warmup(r, layer, wins)
        elif op == "spill":
            a.spill(r)
            continue
        else:
            a.checkpoint(r)
        for layer in range(4):
            assert len(c.slot_map(r, layer)) <= capacity
        assert c.device_resident_bytes <= c.budget_bytes
        check_resident_bytes(c, r, truth[r])
    a.close()
