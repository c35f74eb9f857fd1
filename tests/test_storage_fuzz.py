"""Fuzz tests (hypothesis) of the storage's public calls: ess.storage (TieredCache, HostPool), ess.archive, ess.disk,
ess.replay and the sizing rules of ess.layout. One argument of one call at a time gets a meaningless value
(fuzz_helpers.BAD: wrong type, sign, size, finiteness, shape, dtype); the call either returns a valid result or
raises a TypeError/ValueError naming the argument -- never another exception -- and a call that raised changed
nothing (the cache's snapshot, the archive's files).

Cases per test: the TieredCache methods 300, the constructor 150, HostPool 150, the archive 80 (each opens a locked
folder and writes with fsync), the disk tier 100, the replay 100, the sizing rules 200 (about 1,100 calls in all,
under 10 s here)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ess import archive_state
from ess.archive import Archive
from ess.disk import DiskTier
from ess.layout import capacity_from_budget, capacity_from_ratio, latent_entry_bytes, step_entries
from ess.replay import replay_steps, run_trace
from ess.specs import model_spec
from ess.storage import HostPool, TieredCache
from ess.traces import Trace
from fuzz_helpers import BAD, finite, mutate, outcome, same

TINY = model_spec("tiny")
DS = model_spec("deepseek-v3.2-exp")
W = latent_entry_bytes(TINY)
CAP = 6
# a NumPy RuntimeWarning (an invalid cast, a NaN from finite numbers) is a failure here
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")
FAST = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def E(n, seed=0, layers=4):
    return np.random.default_rng(seed).integers(0, 256, (layers, n, W), dtype=np.uint8)


def small_cache(**kw):
    """A cache holding request "r" (20 tokens) with a few steps taken."""
    c = TieredCache(TINY, capacity=CAP, backend="reference", **kw)
    c.add_request("r", E(20))
    c.step("r", 0, np.array([1, 2, 3], np.int64))
    c.step("r", 1, np.array([4, -1, 5], np.int64), scores=np.array([0.5, -np.inf, 2.0]))
    return c


def check_cache(c):
    """The invariants of a cache: every pool within its capacity, every resident row equal to its host copy."""
    for rid in c.requests():
        truth = c.host.entries(rid)
        for layer in range(c.n_layers):
            m = c.slot_map(rid, layer)
            assert len(m) <= c.capacity
            if m:
                rows = c.device_rows(np.fromiter(m.values(), np.int64))
                np.testing.assert_array_equal(rows, truth[layer, np.fromiter(m, np.int64)])


# -------------------------------------------------------------------------------------------------------------
# TieredCache and HostPool
# -------------------------------------------------------------------------------------------------------------

def _plan(c, a):
    return c.plan(a["request_id"], a["layer"], a["indices"], scores=a["scores"])


# method -> (call, valid arguments, names a message may use for each argument)
METHODS = {
    "add_request": (lambda c, a: c.add_request(a["request_id"], a["latent_entries"],
                                               reserve_tokens=a["reserve_tokens"]),
                    {"request_id": "s", "latent_entries": E(5, 1), "reserve_tokens": None}),
    "append_token": (lambda c, a: c.append_token(a["request_id"], a["entries"]),
                     {"request_id": "r", "entries": E(1, 2)[:, 0]}),
    "remove_request": (lambda c, a: c.remove_request(a["request_id"]), {"request_id": "r"}),
    "n_tokens": (lambda c, a: c.n_tokens(a["request_id"]), {"request_id": "r"}),
    "plan": (_plan, {"request_id": "r", "layer": 2, "indices": np.array([7, -1, 1], np.int64), "scores": None}),
    "step": (lambda c, a: c.step(a["request_id"], a["layer"], a["indices"], scores=a["scores"]),
             {"request_id": "r", "layer": 0, "indices": np.array([3, 9, 10], np.int64),
              "scores": np.array([1.0, 0.5, 2.0])}),
    "copy": (lambda c, a: c.copy(a["plan"]), {"plan": "PLAN"}),
    "commit": (lambda c, a: c.commit(a["plan"]), {"plan": "PLAN"}),
    "warmup": (lambda c, a: c.warmup(a["request_id"], a["layer"], a["windows"]),
               {"request_id": "r", "layer": 3, "windows": [np.array([1, 2], np.int64), np.array([2, 6], np.int64)]}),
    "resident": (lambda c, a: c.resident(a["request_id"], a["layer"]), {"request_id": "r", "layer": 1}),
    "slot_map": (lambda c, a: c.slot_map(a["request_id"], a["layer"]), {"request_id": "r", "layer": 1}),
    "pool_state": (lambda c, a: archive_state.pool_state(c, a["request_id"]), {"request_id": "r"}),
    "load_request": (lambda c, a: archive_state.load_request(c, a["request_id"], a["latent_entries"], a["pool_state"]),
                     {"request_id": "t", "latent_entries": E(20), "pool_state": "STATE"}),
    "device_rows": (lambda c, a: c.device_rows(a["slots"]), {"slots": np.array([0, -1, 5], np.int64)}),
}
# what a message about an argument may call it
ALIASES = {"latent_entries": ("latent_entries",), "windows": ("windows",), "pool_state": ("pool_state",),
           "plan": ("plan",), "request_id": ("request_id",), "scores": ("scores",), "indices": ("indices",)}


@settings(max_examples=300, **FAST)
@given(method=st.sampled_from(sorted(METHODS)), data=st.data())
def test_tiered_cache_methods_refuse_meaningless_arguments_and_change_nothing(method, data):
    c = small_cache()
    call, good = METHODS[method]
    args = dict(good)
    if "plan" in args:
        args["plan"] = c.plan("r", 2, np.array([7, 8], np.int64))
    if args.get("pool_state") == "STATE":
        args["pool_state"] = archive_state.pool_state(c, "r")
    name, args = mutate(data, args)
    before = c.snapshot()
    ok, out = outcome(lambda: call(c, args), *ALIASES.get(name, (name,)))
    if not ok:
        assert same(before, c.snapshot()), f"{method} raised ({out}) after changing the cache"
    elif method in ("step", "commit"):
        assert 0 <= out.n_misses <= int((out.indices >= 0).sum()) and out.bytes_h2d == out.n_misses * c.entry_bytes
    check_cache(c)


CTOR = {"model": TINY, "capacity": 4, "dtype": "fp8", "policy": "lru", "backend": "reference", "device": "cpu",
        "max_requests": None, "policy_options": None}


@settings(max_examples=150, **FAST)
@given(data=st.data())
def test_tiered_cache_constructor_refuses_meaningless_arguments(data):
    name, kw = mutate(data, CTOR, lambda n: st.one_of(BAD, st.just(2 ** 45)) if n in ("capacity", "max_requests")
                      else BAD)
    model = kw.pop("model")
    ok, c = outcome(lambda: TieredCache(model, **kw), name, "policy" if name == "policy_options" else name)
    if ok:
        assert c.capacity >= 1 and c.device_allocated_bytes == c.capacity * c.n_layers * c.entry_bytes * (
            c.max_requests or 1)
        c.add_request(0, np.zeros((c.n_layers, 3, c.entry_bytes), np.uint8))
        assert c.step(0, 0, np.array([0, 1], np.int64)).n_misses == 2


HOST = {
    "add": (lambda h, a: h.add(a["request_id"], a["entries"], a["capacity"]),
            {"request_id": 5, "entries": E(3), "capacity": 8}),
    "append": (lambda h, a: h.append(a["request_id"], a["entries"]), {"request_id": "r", "entries": E(1)[:, 0]}),
    "entries": (lambda h, a: h.entries(a["request_id"]), {"request_id": "r"}),
    "n_tokens": (lambda h, a: h.n_tokens(a["request_id"]), {"request_id": "r"}),
    "remove": (lambda h, a: h.remove(a["request_id"]), {"request_id": "r"}),
    "layer_rows": (lambda h, a: h.layer_rows(a["request_id"], a["layer"], as_torch=a["as_torch"]),
                   {"request_id": "r", "layer": 1, "as_torch": False}),
    "__init__": (lambda h, a: HostPool(a["n_layers"], a["entry_bytes"], pinned=a["pinned"]),
                 {"n_layers": 4, "entry_bytes": W, "pinned": False}),
}


@settings(max_examples=150, **FAST)
@given(method=st.sampled_from(sorted(HOST)), data=st.data())
def test_host_pool_refuses_meaningless_arguments(method, data):
    h = HostPool(4, W)
    h.add("r", E(6))
    call, good = HOST[method]
    name, args = mutate(data, good)
    before = {r: h.entries(r).copy() for r in h.requests()}
    ok, _ = outcome(lambda: call(h, args), name)
    if not ok:
        assert same(before, {r: h.entries(r).copy() for r in h.requests()})
    assert all(h.entries(r).shape[1] == h.n_tokens(r) for r in h.requests())


# -------------------------------------------------------------------------------------------------------------
# The archive and the disk tier
# -------------------------------------------------------------------------------------------------------------

def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name.startswith("req-")}


ARCHIVE = {
    "checkpoint": (lambda a, v: a.checkpoint(v["request_id"], overwrite=v["overwrite"]),
                   {"request_id": "r", "overwrite": False}),
    "spill": (lambda a, v: a.spill(v["request_id"]), {"request_id": "r"}),
    "restore": (lambda a, v: a.restore(v["request_id"]), {"request_id": "old"}),
    "verify": (lambda a, v: a.verify(v["request_id"]), {"request_id": "old"}),
    "repair": (lambda a, v: a.repair(v["request_id"]), {"request_id": "r"}),
    "discard": (lambda a, v: a.discard(v["request_id"]), {"request_id": "old"}),
    "__init__": (None, {"cache": "CACHE", "directory": "DIR", "block_tokens": 8}),
}
# a directory that is not a path (never a str: a random one would name a folder in the working directory)
BAD_DIRS = st.one_of(st.none(), st.integers(-3, 3), st.floats(allow_nan=True), st.binary(max_size=3),
                     st.lists(st.integers(), max_size=2), st.sampled_from(["", "\x00bad"]))


@settings(max_examples=80, **FAST)
@given(method=st.sampled_from(sorted(ARCHIVE)), data=st.data())
def test_archive_refuses_meaningless_arguments_and_touches_no_file(tmp_path_factory, method, data):
    folder = tmp_path_factory.mktemp("arch")
    with Archive(TieredCache(TINY, capacity=CAP, backend="reference"), folder, block_tokens=8) as old:
        old.cache.add_request("old", E(9, 3))
        old.spill("old")
    c = small_cache()
    call, good = ARCHIVE[method]
    if method == "__init__":
        good = {"cache": c, "directory": folder, "block_tokens": 8}
    name, args = mutate(data, good, lambda n: BAD_DIRS if n == "directory" else BAD)
    before, files = c.snapshot(), _files(folder)
    if method == "__init__":
        ok, a = outcome(lambda: Archive(args["cache"], args["directory"], block_tokens=args["block_tokens"]),
                        name, "path" if name == "directory" else name)
        if ok:
            a.close()
        return
    a = Archive(c, folder, block_tokens=8)
    ok, out = outcome(lambda: call(a, args), name)
    if not ok:
        assert same(before, c.snapshot()) and _files(folder) == files, f"{method} changed something, then raised"
    assert a.recover().failed == {}
    check_cache(c)
    a.close()


DISK = {
    "write": (lambda d, v: d.write(v["request_id"], v["entries"], v["pool_state"], from_token=v["from_token"]),
              {"request_id": "w", "entries": E(10), "pool_state": {"x": np.arange(3)}, "from_token": 0}),
    "read": (lambda d, v: d.read(v["request_id"]), {"request_id": "a"}),
    "manifest": (lambda d, v: d.manifest(v["request_id"]), {"request_id": "a"}),
    "block_location": (lambda d, v: d.block_location(v["request_id"], v["block"]), {"request_id": "a", "block": 1}),
    "has": (lambda d, v: d.has(v["request_id"]), {"request_id": "a"}),
    "remove": (lambda d, v: d.remove(v["request_id"]), {"request_id": "a"}),
    "__init__": (lambda d, v: DiskTier(v["directory"], v["n_layers"], v["entry_bytes"], v["block_tokens"]),
                 {"directory": "OTHER", "n_layers": 4, "entry_bytes": W, "block_tokens": 8}),
}


@settings(max_examples=100, **FAST)
@given(method=st.sampled_from(sorted(DISK)), data=st.data())
def test_disk_tier_refuses_meaningless_arguments(tmp_path_factory, method, data):
    folder = tmp_path_factory.mktemp("disk")
    d = DiskTier(folder, 4, W, 8)
    d.write("a", E(20, 4), {"token_of": np.full((4, 3), -1)})
    call, good = DISK[method]
    good = {k: (tmp_path_factory.mktemp("other") if isinstance(v, str) and v == "OTHER" else v)
            for k, v in good.items()}
    name, args = mutate(data, good, lambda n: BAD_DIRS if n == "directory" else BAD)
    files = _files(folder)
    ok, out = outcome(lambda: call(d, args), name, "path" if name == "directory" else name)
    if not ok:
        assert _files(folder) == files
    if method == "__init__" and ok:
        out.close()
    if method == "block_location" and ok:
        assert out[1] % d.block_bytes == 0
    scan = d.scan()
    assert scan.failed == {} and scan.orphans == [] and ("a" in scan.readable or (method == "remove" and ok))
    d.close()


# -------------------------------------------------------------------------------------------------------------
# The replay
# -------------------------------------------------------------------------------------------------------------

def _trace():
    """A small trace built by hand (2 requests x 4 layers x 3 steps of K = 64 among 100 tokens; 2 warmup windows)."""
    rng = np.random.default_rng(1)
    pick = lambda *shape: np.stack([rng.permutation(100)[:64] for _ in range(int(np.prod(shape)))]).reshape(
        *shape, 64).astype(np.int32)
    return Trace(pick(2, 4, 3), 100, 64, 1, windows=pick(2, 4, 2))


TRACE = _trace()
NEW = np.random.default_rng(5).integers(0, 256, (3, 4, W), dtype=np.uint8)
REPLAY = {"cache": "CACHE", "trace": TRACE, "request_id": "q", "batch_index": 1, "warmup": True, "new_tokens": NEW,
          "verify": True, "h2d": None, "d2h": None, "compute_s_per_layer": 1e-5}


@settings(max_examples=100, **FAST)
@given(data=st.data(), rows=st.booleans())
def test_replay_refuses_meaningless_arguments_before_any_step(data, rows):
    c = TieredCache(TINY, capacity=2 * TINY.index_topk, backend="reference")
    c.add_request("q", np.random.default_rng(2).integers(0, 256, (4, 100, W), dtype=np.uint8))
    good = {k: v for k, v in REPLAY.items() if rows or k not in ("h2d", "d2h", "compute_s_per_layer")}
    name, args = mutate(data, {**good, "cache": c})
    before = c.snapshot()
    if rows:
        ok, out = outcome(lambda: list(replay_steps(**args)), name)
    else:
        ok, out = outcome(lambda: run_trace(**args), name)
    if not ok:
        assert same(before, c.snapshot())
    elif rows:
        assert all(r.step_s > 0 and 0 <= r.link_busy_s <= r.step_s and finite([r.step_s, r.stall_s]) for r in out)
        assert all(0 <= m <= TINY.index_topk for r in out for m in r.misses)
    else:
        st_ = out[out.kind == "step"]
        assert ((st_.misses >= 0) & (st_.misses <= st_.hits + st_.misses)).all() and finite(out[["hits", "misses"]])


# -------------------------------------------------------------------------------------------------------------
# The sizing rules
# -------------------------------------------------------------------------------------------------------------

SIZING = {
    "capacity_from_ratio": (capacity_from_ratio, {"model": DS, "ratio": 0.2, "context_len": 32768}),
    "capacity_from_budget": (capacity_from_budget, {"model": TINY, "budget_bytes": 3 * 4 * W * 100, "n_requests": 3,
                                                    "context_len": 1000, "dtype": "fp8"}),
}


@settings(max_examples=200, **FAST)
@given(fn=st.sampled_from(sorted(SIZING)), data=st.data())
def test_sizing_rules_refuse_meaningless_arguments_and_hold_one_step(fn, data):
    call, good = SIZING[fn]
    name, args = mutate(data, good, st.one_of(BAD, st.floats(1, 1e30)))
    ok, cap = outcome(lambda: call(**args), name)
    if ok:
        model, L = args["model"], args["context_len"]
        assert type(cap) is int and cap >= step_entries(model, L)            # holds one step
        if fn == "capacity_from_budget":
            assert cap * args["n_requests"] * model.n_layers * latent_entry_bytes(model, args["dtype"]) <= \
                args["budget_bytes"]


def test_the_fuzz_strategies_reach_the_errors_they_are_for():
    """The strategy is not too tame: a few of its values, by hand, give the errors the fuzz tests accept."""
    c = small_cache()
    for value, err in ((1.0, TypeError), (True, TypeError), ("nobody", ValueError), (None, TypeError)):
        with pytest.raises(err, match="request_id"):
            c.n_tokens(value)
    with pytest.raises(ValueError, match="scores must be finite"):
        c.step("r", 0, np.array([1]), scores=np.array([np.nan]))
