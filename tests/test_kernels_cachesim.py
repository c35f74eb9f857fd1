"""The cache-simulation kernel family (ess.kernels.cachesim): the Numba kernel of every policy against the family's
reference (the policy references of ess.policies) on random rows -- odd widths, padding anywhere, positions drawn
from a small range so that hits, evictions and ties are common --, and the edge cases: no rows, one row, warmup
rows only, a pool exactly full, a row larger than the pool. Hand-worked sequences pin the eviction orders that
tell the policies apart."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ess.kernels import cachesim as K
from ess.policies import POLICIES

REF, FAST = K.get("reference"), K.get("numba")


def _run(mod, seq, n_free, capacity, policy, decay=0.5, n_pos=None):
    seq = np.ascontiguousarray(seq, np.int32)
    n_pos = int(seq.max(initial=-1)) + 1 if n_pos is None else n_pos
    out = np.full(seq.shape[0] - n_free, -7, np.int64)
    bad = mod.simulate(seq, n_free, capacity, policy, max(n_pos, 1), decay, out)
    return bad, out


def _rows(rng, T, W, n_pos, fill):
    """(T, W) int32 rows of distinct positions in [0, n_pos), each row holding a random count <= W at random
    places (the rest -1)."""
    seq = np.full((T, W), -1, np.int32)
    for t in range(T):
        n = int(rng.integers(0 if fill == "any" else 1, W + 1))
        where = rng.choice(W, n, replace=False)
        seq[t, where] = rng.choice(n_pos, n, replace=False)
    return seq


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), T=st.integers(1, 30), W=st.integers(1, 9), spread=st.integers(0, 12),
       extra=st.integers(0, 6), warm=st.integers(0, 4), policy=st.sampled_from(POLICIES),
       decay=st.sampled_from([0.0, 0.3, 0.5, 0.9, 1.0]))
def test_every_kernel_matches_its_reference(seed, T, W, spread, extra, warm, policy, decay):
    rng = np.random.default_rng(seed)
    n_pos = W + spread                      # spread 0: every row draws from the same W positions (many hits)
    seq = _rows(rng, T + warm, W, n_pos, "any")
    cap = W + extra                         # extra 0: a full row fills the pool exactly
    bad_ref, want = _run(REF, seq, warm, cap, policy, decay, n_pos)
    bad, got = _run(FAST, seq, warm, cap, policy, decay, n_pos)
    assert bad == bad_ref == -1
    assert got.tolist() == want.tolist()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), policy=st.sampled_from(POLICIES), cap=st.sampled_from([600, 601, 777, 1024]))
def test_wide_rows_with_many_misses_per_step(seed, policy, cap):
    """Steps missing hundreds of entries (the sampled CLOCK claims its victims in rounds of 512 and probes a ring
    whose size is not a power of two; the heap of the Belady kernel grows deep)."""
    rng = np.random.default_rng(seed)
    seq = np.stack([rng.choice(2000, 600, replace=False) for _ in range(5)]).astype(np.int32)
    assert _run(FAST, seq, 1, cap, policy)[1].tolist() == _run(REF, seq, 1, cap, policy)[1].tolist()


@pytest.mark.parametrize("mod", [REF, FAST], ids=["reference", "numba"])
@pytest.mark.parametrize("policy", POLICIES)
def test_edge_cases(mod, policy):
    # no rows at all, and warmup rows only: nothing counted
    bad, out = _run(mod, np.empty((0, 3), np.int32), 0, 2, policy, n_pos=4)
    assert bad == -1 and out.size == 0
    bad, out = _run(mod, np.array([[0, 1], [2, 3]]), 2, 2, policy)
    assert bad == -1 and out.size == 0
    # one row: every selected entry misses; an all-padding row misses nothing
    assert _run(mod, np.array([[4, -1, 0]]), 0, 2, policy)[1].tolist() == [2]
    assert _run(mod, np.array([[-1, -1], [1, 2], [-1, -1]]), 0, 2, policy)[1].tolist() == [0, 2, 0]
    # a pool exactly full at every step, each step a new set: every entry misses, every resident is evicted
    assert _run(mod, np.array([[0, 1], [2, 3], [0, 1]]), 0, 2, policy)[1].tolist() == [2, 2, 2]
    # a warmup row loads its entries: the counted row hits them
    assert _run(mod, np.array([[0, 1], [1, 0]]), 1, 2, policy)[1].tolist() == [0]


@pytest.mark.parametrize("mod", [REF, FAST], ids=["reference", "numba"])
@pytest.mark.parametrize("policy", POLICIES)
def test_the_first_row_larger_than_the_pool_is_reported(mod, policy):
    seq = np.array([[0, -1, -1], [1, 2, -1], [0, 1, 2], [3, 4, 5]])
    assert _run(mod, seq, 0, 2, policy)[0] == 2                       # row 2 has 3 entries for 2 slots
    assert _run(mod, seq, 1, 2, policy)[0] == 2                       # counted from the first row, warmup included
    assert _run(mod, seq, 0, 3, policy)[0] == -1                      # 3 slots hold it


@pytest.mark.parametrize("mod", [REF, FAST], ids=["reference", "numba"])
def test_eviction_orders_by_hand(mod):
    """Two slots; each sequence separates two policies by the victim they choose."""
    # 0, 1, 0 (hit), 2, 1: LRU evicts 1 (0 was used again) so 1 misses; FIFO evicts 0 (it came first) so 1 hits
    seq = np.array([[0], [1], [0], [2], [1]])
    assert _run(mod, seq, 0, 2, "lru")[1].tolist() == [1, 1, 0, 1, 1]
    assert _run(mod, seq, 0, 2, "fifo")[1].tolist() == [1, 1, 0, 1, 0]
    # 0, 1, 2, 0, 1: Belady evicts 1 at step 2 (next used later than 0) and then misses only 1; LRU misses every step
    seq = np.array([[0], [1], [2], [0], [1]])
    assert _run(mod, seq, 0, 2, "belady")[1].tolist() == [1, 1, 1, 0, 1]
    assert _run(mod, seq, 0, 2, "lru")[1].tolist() == [1, 1, 1, 1, 1]
    # heat with decay 1 (no decay): 0 read twice is hotter than 1, so 2 evicts 1 and 0 hits
    seq = np.array([[0], [0], [1], [2], [0]])
    assert _run(mod, seq, 0, 2, "heat", decay=1.0)[1].tolist() == [1, 0, 1, 1, 0]
    # heat with a decay: 0 read three times, then 1 twice; at step 5 the colder one is evicted. With decay 0.9 the
    # older reads still weigh more (0: 2.71 x 0.9^2 = 2.195 > 1: 1.9); with 0.81 they do not (1.618 < 1.81)
    seq = np.array([[0], [0], [0], [1], [1], [2], [0], [1]])
    assert _run(mod, seq, 0, 2, "heat", decay=0.9)[1].tolist() == [1, 0, 0, 1, 0, 1, 0, 1]
    assert _run(mod, seq, 0, 2, "heat", decay=0.81)[1].tolist() == [1, 0, 0, 1, 0, 1, 1, 0]
    # heat ties (decay 0: every resident's heat is 0 after a step) go to the least recently used: 2 evicts 0
    assert _run(mod, np.array([[0], [1], [2], [1]]), 0, 2, "heat", decay=0.0)[1].tolist() == [1, 1, 1, 0]
    # CLOCK's second chance: after 1 2 3 | 4 | 2 | 5 (three slots), 4's bit is set and 4 survives the next sweep
    seq = np.array([[1, 2, 3], [4, -1, -1], [2, -1, -1], [5, -1, -1], [3, -1, -1], [4, -1, -1]])
    assert _run(mod, seq, 0, 3, "clock")[1].tolist() == [3, 1, 0, 1, 1, 0]
    assert _run(mod, seq, 0, 3, "lru")[1].tolist() == [3, 1, 0, 1, 1, 1]


def test_the_family_has_no_torch_kernel():
    with pytest.raises(ValueError, match="no torch kernel"):
        K.get("torch")


def test_an_unknown_policy_is_refused_by_the_kernel():
    with pytest.raises(ValueError, match="policy must be one of"):
        _run(FAST, np.array([[0]]), 0, 1, "mru")
