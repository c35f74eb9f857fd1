"""The real cache (ess.storage) and the fast simulator (ess.cachesim) agree miss for miss on LRU and FIFO."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

cachesim = pytest.importorskip("ess.cachesim")

from ess.specs import model_spec  # noqa: E402
from ess.storage import TieredCache  # noqa: E402


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 11), extra=st.integers(0, 15), n_warm=st.integers(0, 3),
       policy=st.sampled_from(["lru", "fifo"]))
def test_storage_and_cachesim_agree(seed, k, extra, n_warm, policy):
    rng = np.random.default_rng(seed)
    n_tokens, steps = 40, 15

    def rows(n):
        out = np.full((n, k), -1, np.int64)
        for i in range(n):
            out[i] = rng.choice(n_tokens, k, replace=False)
            out[i, rng.random(k) < 0.2] = -1
        return out

    trace, warm = rows(steps), rows(n_warm)
    capacity = k + extra
    want = cachesim.sequence_misses(trace.astype(np.int32), capacity, policy=policy,
                                    windows=warm.astype(np.int32) if n_warm else None, n_positions=n_tokens)
    c = TieredCache(model_spec("tiny"), capacity=capacity, policy=policy)
    c.add_request(0, np.zeros((4, n_tokens, c.entry_bytes), np.uint8))
    if n_warm:
        c.warmup(0, 1, list(warm))
    got = [c.step(0, 1, row).n_misses for row in trace]
    assert got == want.tolist()
