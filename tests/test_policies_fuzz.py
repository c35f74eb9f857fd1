"""Fuzz tests (hypothesis) of ess.policies' public calls: one argument of one call at a time gets a meaningless value
(fuzz_helpers.BAD); the call returns a valid result or raises a TypeError/ValueError naming the argument (never a raw
IndexError or NumPy error), a call that raised left the pool or policy as it was, and a result stays in its range
(misses between 0 and the entries selected, victims among the candidates, heat finite).

Cases per test: the policies' methods 300, the slot pool 300, the functions (make_policy, check_step_indices,
next_uses, first_in_order, simulate_misses) 300, and random valid heat runs 100 (about 1,000 calls, a few seconds)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ess.policies import (ONLINE_POLICIES, POLICIES, SlotPlan, SlotPool, check_step_indices, first_in_order,
                          make_policy, next_uses, simulate_misses)
from fuzz_helpers import finite, mutate, outcome, same

CAP = 5
# a NumPy RuntimeWarning (an invalid cast, a NaN from finite numbers) is a failure here
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")
FAST = dict(deadline=None)


def policy_state(p):
    return {k: np.copy(v) for k, v in p.state().items()}


def used_policy(name):
    """A policy of ``CAP`` slots after two steps."""
    p = make_policy(name, CAP, **({"decay": 0.5} if name == "heat" else {}))
    p.update(np.array([0, 1, 2]), np.array([True, True, True]), None if name != "belady" else np.array([3, 1, 2]))
    p.update(np.array([2, 3]), np.array([False, True]), np.array([0.5, 2.0]) if name != "belady" else np.array([4, 4]))
    return p


POLICY_CALLS = {
    "choose_victims": (lambda p, a: p.choose_victims(a["candidates"], a["n"]),
                       {"candidates": np.array([0, 1, 3]), "n": 2}),
    "touch": (lambda p, a: p.touch(a["slots"]), {"slots": np.array([4, 1])}),
    "touch_cold": (lambda p, a: p.touch_cold(a["slots"]), {"slots": np.array([4])}),
    "update": (lambda p, a: p.update(a["slots"], a["inserted"], a["weights"]),
               {"slots": np.array([1, 4]), "inserted": np.array([False, True]), "weights": np.array([1.0, 3.0])}),
    "clear": (lambda p, a: p.clear(a["slots"]), {"slots": np.array([0, 2])}),
    "set_state": (lambda p, a: p.set_state(a["state"]), {"state": "STATE"}),
}


@settings(max_examples=300, **FAST)
@given(policy=st.sampled_from(POLICIES), method=st.sampled_from(sorted(POLICY_CALLS)), data=st.data())
def test_policy_methods_refuse_meaningless_arguments(policy, method, data):
    p = used_policy(policy)
    call, good = POLICY_CALLS[method]
    args = {k: (policy_state(p) if isinstance(v, str) else v) for k, v in good.items()}
    name, args = mutate(data, args)
    before = policy_state(p)
    ok, out = outcome(lambda: call(p, args), name)
    if not ok:
        assert same(before, policy_state(p)), f"{method} raised after changing the policy"
    elif method == "choose_victims":
        cand = set(np.asarray(args["candidates"]).tolist())
        assert set(out.tolist()) <= cand and len(set(out.tolist())) == out.size
    assert finite(p.stamp) and all(finite(v) for v in policy_state(p).values())


def pool_state(pool):
    return {"token_of": pool.token_of.copy(), "slot_of": pool.slot_of.copy(), "policy": policy_state(pool.policy),
            "version": pool.version}


POOL_CALLS = {
    "plan": (lambda q, a: q.plan(a["tokens"], rank=a["rank"]), {"tokens": np.array([9, 1, 7]), "rank": None}),
    "commit": (lambda q, a: q.commit(a["plan"], a["weights"]), {"plan": "PLAN", "weights": None}),
    "grow": (lambda q, a: q.grow(a["n_tokens"]), {"n_tokens": 40}),
    "drop": (lambda q, a: q.drop(a["slots"]), {"slots": np.array([0, 1])}),
    "set_token_map": (lambda q, a: q.set_token_map(a["token_of"]), {"token_of": np.array([3, -1, 5, 0, -1])}),
    "__init__": (lambda q, a: SlotPool(a["capacity"], a["policy"], a["n_tokens"]),
                 {"capacity": CAP, "policy": "lru", "n_tokens": 10}),
}


@settings(max_examples=300, **FAST)
@given(policy=st.sampled_from(ONLINE_POLICIES), method=st.sampled_from(sorted(POOL_CALLS)), data=st.data())
def test_slot_pool_refuses_meaningless_arguments_and_keeps_its_map(policy, method, data):
    q = SlotPool(CAP, policy, 20)
    q.commit(q.plan(np.array([1, 2, 3])))
    call, good = POOL_CALLS[method]
    args = dict(good)
    if isinstance(args.get("plan"), str):
        args["plan"] = q.plan(np.array([4, 5, 1, 6]))
    name, args = mutate(data, args)
    before = pool_state(q)
    ok, out = outcome(lambda: call(q, args), name, "policy" if name == "policy" else name)
    if not ok:
        assert same(before, pool_state(q))
    elif method == "plan":
        assert isinstance(out, SlotPlan) and 0 <= out.n_misses <= out.tokens.size <= CAP
        assert set(out.victims.tolist()) <= set(np.flatnonzero(q.token_of >= 0).tolist())
    held = q.token_of[q.token_of >= 0]
    assert np.unique(held).size == held.size and (q.slot_of[held] == np.flatnonzero(q.token_of >= 0)).all()


STEPS = [np.array([1, 2, -1]), np.array([2, 3, 4]), np.array([5, -1, 1])]
FUNCTIONS = {
    "make_policy": (lambda a: make_policy(a["name"], a["capacity"], decay=a["decay"]),
                    {"name": "heat", "capacity": 4, "decay": 0.3}),
    "check_step_indices": (lambda a: check_step_indices(a["indices"], a["n_tokens"], a["capacity"]),
                           {"indices": np.array([3, -1, 0]), "n_tokens": 8, "capacity": 4}),
    "next_uses": (lambda a: next_uses(a["rows"]), {"rows": STEPS}),
    "first_in_order": (lambda a: first_in_order(a["keys"], a["n"]), {"keys": (np.array([3, 1, 2]),), "n": 2}),
    "simulate_misses": (lambda a: simulate_misses(a["steps"], a["capacity"], policy=a["policy"], windows=a["windows"],
                                                  weights=a["weights"], decay=a["decay"]),
                        {"steps": STEPS, "capacity": 3, "policy": "heat", "windows": [np.array([0, 1])],
                         "weights": [np.array([1.0, 2.0, np.nan]), np.ones(3), np.array([0.5, -np.inf, 1.0])],
                         "decay": 0.5}),
}


@settings(max_examples=300, **FAST)
@given(fn=st.sampled_from(sorted(FUNCTIONS)), data=st.data())
def test_policy_functions_refuse_meaningless_arguments_and_stay_in_range(fn, data):
    call, good = FUNCTIONS[fn]
    name, args = mutate(data, good)
    aliases = {"name": ("policy",), "rows": ("rows",), "steps": ("steps",), "windows": ("windows",),
               "weights": ("weights",), "keys": ("keys",)}
    ok, out = outcome(lambda: call(args), *aliases.get(name, (name,)))
    if not ok:
        return
    if fn == "simulate_misses":
        selected = [int((np.asarray(r) >= 0).sum()) for r in args["steps"]]
        assert out.dtype == np.int64 and len(out) == len(selected)
        assert all(0 <= m <= s for m, s in zip(out.tolist(), selected))
    elif fn == "first_in_order":
        size = np.asarray(args["keys"][0]).size
        assert sorted(out.tolist()) == sorted(set(out.tolist())) and all(0 <= i < size for i in out.tolist())
    elif fn == "next_uses":
        assert all(((u > t) & (u <= len(args["rows"]))).all() for t, u in enumerate(out))


@settings(max_examples=100, **FAST)
@given(seed=st.integers(0, 2 ** 31 - 1), capacity=st.integers(1, 8), decay=st.floats(0, 1),
       scale=st.sampled_from([1e-300, 1.0, 1e300]))
def test_heat_stays_finite_and_misses_in_range_on_valid_runs(seed, capacity, decay, scale):
    """Finite inputs never give NaN: the heat of every slot stays finite, even with weights near the float range."""
    rng = np.random.default_rng(seed)
    steps = [rng.choice(12, size=rng.integers(1, capacity + 1), replace=False) for _ in range(10)]
    weights = [rng.uniform(-1, 1, s.size) * scale for s in steps]
    misses = simulate_misses(steps, capacity, policy="heat", weights=weights, decay=decay)
    assert all(0 <= m <= s.size for m, s in zip(misses.tolist(), steps))
    pool = SlotPool(capacity, "heat", 12, decay=decay)
    for s, w in zip(steps, weights):
        pool.commit(pool.plan(s), w)
        assert finite(pool.policy.heat)
