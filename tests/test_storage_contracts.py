"""The storage step's contracts against a careless caller (ess.storage). Each case was accepted before:

* a commit of a plan whose misses were never copied: the next step "hit" device rows that were never filled;
* a request longer than the model's context (prefill entries, reserved room, appended tokens);
* float entries cast to bytes by the all-resident cache (one value in 256 kept, no error);
* the all-resident cache took any device string and any hashable request id, where the tiered cache checks both.
"""
import numpy as np
import pytest
import torch

from ess import archive_state
from ess.specs import model_spec
from ess.storage import ResidentCache, TieredCache

TINY = model_spec("tiny")
W = 164                                   # bytes of one tiny FP8 entry
CTX = TINY.max_position_embeddings        # 4,096 tokens


def entries(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (TINY.n_layers, n, W), dtype=np.uint8)


# -- commit without its copy ------------------------------------------------------------------------------------

def test_commit_without_copy_is_refused_and_changes_nothing():
    c = TieredCache(TINY, capacity=4)
    c.add_request("r", entries(10))
    plan = c.plan("r", 0, np.array([3, 7], np.int64))
    before, n_metrics = archive_state.pool_state(c, "r"), len(c.metrics)
    with pytest.raises(ValueError, match="copy"):
        c.commit(plan)
    after = archive_state.pool_state(c, "r")
    assert all(np.array_equal(after[k], before[k]) for k in before) and len(c.metrics) == n_metrics
    c.copy(plan)                                           # the plan is still good: copy, then commit
    step = c.commit(plan)
    assert step.n_misses == 2
    np.testing.assert_array_equal(c.device_rows(step.slots), entries(10)[0, [3, 7]])


def test_a_step_after_a_refused_commit_never_reads_unfilled_rows():
    c = TieredCache(TINY, capacity=4)
    c.add_request("r", entries(10))
    plan = c.plan("r", 1, np.array([2, 5, -1], np.int64))
    with pytest.raises(ValueError):
        c.commit(plan)
    step = c.step("r", 1, np.array([2, 5, -1], np.int64))
    assert step.n_hits == 0 and step.n_misses == 2         # nothing was marked present
    np.testing.assert_array_equal(c.device_rows(step.slots[:2]), entries(10)[1, [2, 5]])


def test_a_plan_without_misses_commits_without_a_copy():
    c = TieredCache(TINY, capacity=4)
    c.add_request("r", entries(10))
    c.step("r", 0, np.array([1, 2], np.int64))
    plan = c.plan("r", 0, np.array([2, 1], np.int64))
    assert plan.n_misses == 0
    assert c.commit(plan).n_hits == 2


def test_a_copy_of_one_plan_does_not_license_another():
    c = TieredCache(TINY, capacity=4)
    c.add_request("r", entries(10))
    c.add_request("s", entries(10, 1))
    p_r = c.plan("r", 0, np.array([1], np.int64))
    p_s = c.plan("s", 0, np.array([1], np.int64))
    c.copy(p_r)
    with pytest.raises(ValueError, match="copy"):
        c.commit(p_s)
    c.commit(p_r)


# -- the model's context ----------------------------------------------------------------------------------------

def test_a_request_longer_than_the_context_is_refused():
    c = TieredCache(TINY, capacity=4)
    with pytest.raises(ValueError, match="context"):
        c.add_request("r", entries(CTX + 1))
    assert c.requests() == [] and c.host.requests() == []
    with pytest.raises(ValueError, match="context"):
        archive_state.load_request(c, "r", entries(CTX + 1))
    assert c.requests() == []


def test_reserved_room_past_the_context_is_refused():
    c = TieredCache(TINY, capacity=4)
    with pytest.raises(ValueError, match="reserve_tokens"):
        c.add_request("r", entries(8), reserve_tokens=CTX + 1)
    assert c.requests() == []


def test_appending_past_the_context_is_refused():
    c = TieredCache(TINY, capacity=4)
    c.add_request("r", entries(CTX))                        # exactly the context: accepted
    with pytest.raises(ValueError, match="context"):
        c.append_token("r", entries(1)[:, 0])
    assert c.n_tokens("r") == CTX


# -- the all-resident cache: bytes only, its device and ids checked as the tiered cache checks them ---------------

@pytest.mark.parametrize("make", [lambda a: a.astype(np.float32), lambda a: torch.from_numpy(a.astype(np.float64)),
                                  lambda a: a.astype(np.int16)], ids=["float32", "torch float64", "int16"])
def test_resident_cache_refuses_entries_that_are_not_bytes(make):
    c = ResidentCache(TINY, max_requests=2, max_tokens=16)
    with pytest.raises(TypeError, match="uint8"):
        c.add_request("r", make(entries(4)))
    assert c.requests() == []
    c.add_request("r", entries(4))
    with pytest.raises(TypeError, match="uint8"):
        c.append_token("r", make(entries(1))[:, 0])
    assert c.n_tokens("r") == 4


def test_resident_cache_keeps_torch_and_numpy_bytes_equal():
    c = ResidentCache(TINY, max_requests=2, max_tokens=16)
    e = entries(4)
    c.add_request("n", e)
    c.add_request("t", torch.from_numpy(e.copy()))
    tok = c.append_token("t", torch.from_numpy(entries(1, 5)[:, 0].copy()))
    assert tok == 4 and c.n_tokens("t") == 5


@pytest.mark.parametrize("device", ["gpu", "cuda:x", 0, None])
def test_resident_cache_checks_its_device_as_the_tiered_cache(device):
    errors = []
    for make in (lambda: TieredCache(TINY, capacity=4, device=device),
                 lambda: ResidentCache(TINY, max_requests=1, max_tokens=8, device=device)):
        with pytest.raises((TypeError, ValueError), match="device") as info:
            make()
        errors.append(info.type)
    assert errors[0] is errors[1]


@pytest.mark.parametrize("rid", [1.0, True, (1,), None])
def test_resident_cache_checks_request_ids_as_the_tiered_cache(rid):
    t = TieredCache(TINY, capacity=4)
    r = ResidentCache(TINY, max_requests=2, max_tokens=16)
    for c in (t, r):
        with pytest.raises(TypeError, match="request_id"):
            c.add_request(rid, entries(4))
        assert c.requests() == []


def test_resident_cache_numpy_int_id_names_the_int_request():
    r = ResidentCache(TINY, max_requests=2, max_tokens=16)
    r.add_request(np.int64(3), entries(4))
    assert r.requests() == [3] and type(r.requests()[0]) is int
    assert r.n_tokens(3) == 4


def test_resident_cache_of_absurd_size_is_refused_naming_its_arguments():
    with pytest.raises(ValueError, match="max_requests=1000000000000"):        # was torch's RuntimeError
        ResidentCache(TINY, max_requests=10 ** 12, max_tokens=CTX)
