"""Hostile-user probes of the storage layer and what it records (``tests/hostile.py``): the tiered and all-resident
caches (``ess.storage``), the shared preset specs (``ess.specs``) and the record files (``ess.results``). Each probe
does what a careless or hostile user would -- a step half done, a request past the model's context, float bytes, an
absurd size, a wrong type, two threads on two caches, a forked child, a ``kill -9`` in the middle of a save, a link
planted where a record is written -- and checks the answer: a refusal must name the argument, a call that goes
through must leave the right bytes (and nothing of the caller's changed). Fixed seeds; a fraction of a second each.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import numpy as np
import torch

from ess import archive_state
from ess.results import Record, Recorder, load_results
from ess.specs import link_figures, model_spec
from ess.storage import HostPool, ResidentCache, TieredCache

from hostile import Probe, ProbeError, bad_rows, run_probes

TINY = model_spec("tiny")
W = 164                                          # bytes of one tiny FP8 entry
CTX = TINY.max_position_embeddings


def entries(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (TINY.n_layers, n, W), dtype=np.uint8)


def check(ok, what):
    if not ok:
        raise ProbeError(what)


def cache(**kw):
    c = TieredCache(TINY, capacity=4, **kw)
    c.add_request("r", entries(16))
    return c


# -- the step protocol ------------------------------------------------------------------------------------------

def commit_without_copy(tmp):
    c = cache()
    plan = c.plan("r", 0, np.array([3, 9], np.int64))
    try:
        c.commit(plan)
    finally:                                     # refused or not, the next step must read the right bytes
        step = c.step("r", 0, np.array([3, 9], np.int64))
        check(np.array_equal(c.device_rows(step.slots), entries(16)[0, [3, 9]]), "a step read rows never filled")


def commit_twice(tmp):
    c = cache()
    plan = c.plan("r", 0, np.array([1], np.int64))
    c.copy(plan)
    c.commit(plan)
    c.commit(plan)                               # the plan is stale: its pool changed


def plan_of_another_cache(tmp):
    a, b = cache(), cache()
    b.commit(a.plan("r", 0, np.array([1], np.int64)))


def float_indices(tmp):
    cache().step("r", 0, np.array([1.0, 2.0]))


def indices_past_the_request(tmp):
    cache().step("r", 0, np.array([16], np.int64))


def more_indices_than_capacity(tmp):
    cache().step("r", 0, np.arange(5, dtype=np.int64))


def layer_as_bool(tmp):
    cache().step("r", True, np.array([1], np.int64))


# -- sizes and the model's context ------------------------------------------------------------------------------

def request_past_the_context(tmp):
    TieredCache(TINY, capacity=4).add_request("r", entries(CTX + 1))


def reserve_past_the_context(tmp):
    TieredCache(TINY, capacity=4).add_request("r", entries(4), reserve_tokens=2 ** 62)


def append_past_the_context(tmp):
    c = TieredCache(TINY, capacity=4)
    c.add_request("r", entries(CTX))
    c.append_token("r", entries(1)[:, 0])


def absurd_capacity(tmp):
    TieredCache(TINY, capacity=2 ** 62)


def absurd_max_requests(tmp):
    TieredCache(TINY, capacity=4, max_requests=10 ** 15)


def absurd_resident_pool(tmp):
    ResidentCache(TINY, max_requests=10 ** 12, max_tokens=CTX)


def host_pool_absurd_capacity(tmp):
    HostPool(4, W).add("r", entries(2), capacity=10 ** 15)


# -- wrong types ------------------------------------------------------------------------------------------------

def tiered_float_entries(tmp):
    TieredCache(TINY, capacity=4).add_request("r", entries(4).astype(np.float32))


def resident_float_entries(tmp):
    ResidentCache(TINY, max_requests=1, max_tokens=8).add_request("r", entries(4).astype(np.float64))


def resident_torch_float_entries(tmp):
    ResidentCache(TINY, max_requests=1, max_tokens=8).add_request("r", torch.ones((4, 4, W)))


def resident_bad_device(tmp):
    ResidentCache(TINY, max_requests=1, max_tokens=8, device="gpu")


def resident_float_request_id(tmp):
    ResidentCache(TINY, max_requests=1, max_tokens=8).add_request(1.0, entries(4))


def tiered_tuple_request_id(tmp):
    TieredCache(TINY, capacity=4).add_request(("a", 1), entries(4))


def pinned_as_text(tmp):
    HostPool(4, W, pinned="no")


def policy_options_not_a_dict(tmp):
    TieredCache(TINY, capacity=4, policy="heat", policy_options=[("decay", 0.5)])


def pool_state_of_another_policy(tmp):
    lru = cache()
    archive_state.load_request(TieredCache(TINY, capacity=4, policy="heat"), "r", entries(16),
                               archive_state.pool_state(lru, "r"))


# -- concurrency and forks --------------------------------------------------------------------------------------

def two_threads_two_caches(tmp):
    """Each thread steps its own cache: the same rows as one thread stepping both."""
    rng = np.random.default_rng(7)
    steps = [np.sort(rng.choice(16, 3, replace=False)).astype(np.int64) for _ in range(40)]

    def run(c, out):
        for idx in steps:
            out.append(c.device_rows(c.step("r", 1, idx).slots).copy())
    serial = []
    run(cache(), serial)
    outs = [[], []]
    threads = [threading.Thread(target=run, args=(cache(), outs[i])) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(all(len(o) == len(serial) and all(np.array_equal(a, b) for a, b in zip(o, serial)) for o in outs),
          "two threads on two caches read other rows than one thread")


def forked_child_leaves_the_parent_cache(tmp):
    c = cache()
    before = c.host.entries("r").copy()
    pid = os.fork()
    if pid == 0:                                 # the child changes its copy of the cache
        try:
            c.append_token("r", entries(1, 3)[:, 0])
            c.step("r", 0, np.array([0, 1, 2], np.int64))
            c.remove_request("r")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    check(c.requests() == ["r"] and np.array_equal(c.host.entries("r"), before), "a child changed the parent's cache")


# -- specs and records ------------------------------------------------------------------------------------------

def change_a_cached_spec(tmp):
    spec = model_spec("tiny")
    key = next(iter(spec.sources))
    try:
        spec.sources[key] = "changed by a caller"
    finally:
        check(model_spec("tiny").sources[key] != "changed by a caller", "a caller's change reached every caller")


def change_link_figures(tmp):
    figs = link_figures()
    group = next(iter(figs))
    figs[group].clear()
    check(link_figures()[group], "a caller's change reached every caller")


def colliding_config_keys(tmp):
    Record("x", 1.0, "B", {1: "one", "1": "also one"}, status="computed")


def config_of_objects(tmp):
    Recorder("nb").record("x", 1.0, "B", config={"f": object()})


def save_through_a_planted_link(tmp):
    """A link planted under the record file's name: the save replaces the link, never writes through it."""
    outside = tmp / "outside.json"
    outside.write_text("precious")
    (tmp / "nb.json").symlink_to(outside)
    rec = Recorder("nb", tmp / "nb.json")
    rec.record("x", 1.0, "B")
    rec.save()
    check(outside.read_text() == "precious", "the save wrote through a planted link")
    check(load_results(tmp / "nb.json").records[0].value == 1.0, "the saved record does not read back")


def kill_during_saves(tmp):
    """``kill -9`` of a child saving records in a loop: the file is always a whole earlier save."""
    path = tmp / "nb.json"
    for trial in range(3):
        pid = os.fork()
        if pid == 0:
            try:
                rec = Recorder("nb", path)
                for i in range(10 ** 6):
                    rec.record(f"x{i}", float(i), "B")
                    rec.save()
            finally:
                os._exit(0)
        time.sleep(0.05 + 0.03 * trial)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        if path.exists():
            res = load_results(path)
            check([r.value for r in res.records] == [float(i) for i in range(len(res.records))],
                  "a killed save left a file that is not a whole earlier save")
    check(not [p for p in tmp.iterdir() if p.name != "nb.json" and not p.name.startswith(".")],
          f"stray files: {sorted(p.name for p in tmp.iterdir())}")


def record_file_is_a_folder(tmp):
    (tmp / "nb.json").mkdir()
    rec = Recorder("nb", tmp / "nb.json")
    rec.record("x", 1.0, "B")
    rec.save()


def read_a_record_file_of_garbage(tmp):
    (tmp / "nb.json").write_text(json.dumps({"notebook": "nb", "records": [{"name": 3}]}))
    load_results(tmp / "nb.json")


PROBES = [
    Probe("storage", "commit_without_copy", commit_without_copy, ("copy",)),
    Probe("storage", "commit_twice", commit_twice, ("stale",)),
    Probe("storage", "plan_of_another_cache", plan_of_another_cache, ("another cache",)),
    Probe("storage", "float_indices", float_indices, ("indices",)),
    Probe("storage", "indices_past_the_request", indices_past_the_request, ("indices",)),
    Probe("storage", "more_indices_than_capacity", more_indices_than_capacity, ("capacity",)),
    Probe("storage", "layer_as_bool", layer_as_bool, ("layer",)),
    Probe("storage", "request_past_the_context", request_past_the_context, ("context",)),
    Probe("storage", "reserve_past_the_context", reserve_past_the_context, ("reserve_tokens",)),
    Probe("storage", "append_past_the_context", append_past_the_context, ("context",)),
    Probe("storage", "absurd_capacity", absurd_capacity, ("capacity",)),
    Probe("storage", "absurd_max_requests", absurd_max_requests, ("max_requests",)),
    Probe("storage", "absurd_resident_pool", absurd_resident_pool, ("max_requests", "max_tokens", "pool")),
    Probe("storage", "host_pool_absurd_capacity", host_pool_absurd_capacity, ("capacity",)),
    Probe("storage", "tiered_float_entries", tiered_float_entries, ("uint8",)),
    Probe("storage", "resident_float_entries", resident_float_entries, ("uint8",)),
    Probe("storage", "resident_torch_float_entries", resident_torch_float_entries, ("uint8",)),
    Probe("storage", "resident_bad_device", resident_bad_device, ("device",)),
    Probe("storage", "resident_float_request_id", resident_float_request_id, ("request_id",)),
    Probe("storage", "tiered_tuple_request_id", tiered_tuple_request_id, ("request_id",)),
    Probe("storage", "pinned_as_text", pinned_as_text, ("pinned",)),
    Probe("storage", "policy_options_not_a_dict", policy_options_not_a_dict, ("policy_options",)),
    Probe("storage", "pool_state_of_another_policy", pool_state_of_another_policy, ("pool_state",)),
    Probe("storage", "two_threads_two_caches", two_threads_two_caches),
    Probe("storage", "forked_child_leaves_the_parent_cache", forked_child_leaves_the_parent_cache),
    Probe("storage", "change_a_cached_spec", change_a_cached_spec, ("sources",)),
    Probe("storage", "change_link_figures", change_link_figures),
    Probe("storage", "colliding_config_keys", colliding_config_keys, ("collide",)),
    Probe("storage", "config_of_objects", config_of_objects, ("config",)),
    Probe("storage", "save_through_a_planted_link", save_through_a_planted_link),
    Probe("storage", "kill_during_saves", kill_during_saves),
    Probe("storage", "record_file_is_a_folder", record_file_is_a_folder, ("nb.json",),
          clear_types=(IsADirectoryError, OSError)),
    Probe("storage", "read_a_record_file_of_garbage", read_a_record_file_of_garbage, ("nb.json", "name")),
]


def test_storage_probes(tmp_path_factory):
    rows = run_probes(PROBES, tmp_path_factory.mktemp)
    assert bad_rows(rows) == []
