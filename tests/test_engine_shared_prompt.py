"""The tiered cache whose host pool shares the prompt's entries (ess.engine.shared_prompt): the same steps as a
TieredCache with a private copy -- same device rows, hits, misses, bytes -- while holding no copy of the prompt,
never writing it, and growing its own tail like a HostPool."""
import numpy as np
import pytest
import torch

from ess.engine import DecodeConfig, DecodeEngine
from ess.engine.shared_prompt import PromptSharingCache, PromptSharingHostPool
from ess.layout import EntryFormat
from ess.storage import TieredCache

from engine_helpers import small_engine

FMT = EntryFormat("toy", 3, 8, 4, 64, "u8")      # 3 layers, 8-byte entries


@pytest.mark.parametrize("policy", ["lru", "fifo", "heat"])
def test_the_same_steps_as_a_private_copy_and_no_copy_of_the_prompt(policy):
    rng = np.random.default_rng(0)
    L, steps = 20, 12
    prompt = rng.integers(0, 256, (3, L, 8), dtype=np.uint8)
    keep = prompt.copy()
    shared, plain = (kind(FMT, capacity=6, policy=policy, max_requests=2) for kind in (PromptSharingCache, TieredCache))
    for c in (shared, plain):
        c.add_request(0, prompt, reserve_tokens=L + 3)                # room for 3: the tail doubles twice
        c.add_request(1, prompt[:, :L - 5], reserve_tokens=L)
    assert np.shares_memory(shared.host.layer_segments(0, 1)[0], prompt), "the prompt is shared, not copied"
    assert shared.host.allocated_bytes == (3 + 5) * 3 * 8, "only the tails are the pool's own"
    mixed = 0
    for t in range(steps):
        for r in (0, 1):
            n = plain.n_tokens(r)
            for layer in range(3):
                idx = np.sort(rng.choice(n, size=4, replace=False)).astype(np.int64)
                idx[-1] = n - 1                                     # the newest token: a tail row once decoding
                a, b = shared.step(r, layer, idx), plain.step(r, layer, idx)
                assert (a.n_hits, a.n_misses, a.bytes_h2d) == (b.n_hits, b.n_misses, b.bytes_h2d)
                np.testing.assert_array_equal(a.slots, b.slots)
                mixed += bool((idx < L - 5 * r).any() and (idx >= L - 5 * r).any() and a.n_misses)
            new = rng.integers(0, 256, (3, 8), dtype=np.uint8)
            assert shared.append_token(r, new) == plain.append_token(r, new) == n
    assert mixed > 0, "some copies read the prompt and the tail in one step"
    assert torch.equal(shared.device_pool, plain.device_pool)
    for r in (0, 1):
        np.testing.assert_array_equal(shared.host.entries(r), plain.host.entries(r))
        assert shared.host.n_tokens(r) == plain.host.n_tokens(r)
    np.testing.assert_array_equal(prompt, keep)                     # never written
    assert shared.host.nbytes == plain.host.nbytes
    shared.remove_request(0)
    assert shared.host.requests() == [1] and 0 not in shared.host._prompt


def test_the_device_pool_is_resident_only_where_written():
    """The pool is mapped memory, zero until written (the unused slots of a run cost nothing)."""
    c = PromptSharingCache(FMT, capacity=4096, max_requests=2)            # 2 x 3 layers x 4096 slots x 8 B
    assert c.device_pool.shape == (2 * 3 * 4096, 8)
    base = c.device_pool.data_ptr()
    with open("/proc/self/smaps") as f:                                    # the mapping's resident size
        rss = _resident_kib(f.read(), base)
    assert rss == 0, f"{rss} KiB resident before any slot was written"
    c.add_request(0, np.ones((3, 10, 8), np.uint8))
    c.step(0, 2, np.arange(4, dtype=np.int64))
    with open("/proc/self/smaps") as f:
        rss = _resident_kib(f.read(), base)
    assert 0 < rss <= 8, f"one page written, {rss} KiB resident"
    written = (c.device_pool != 0).any(1)
    assert written.sum() == 4 and (c.device_pool[written] == 1).all(), "zero where nothing was written"


def _resident_kib(smaps: str, address: int) -> int:
    """The ``Rss`` of the mapping of /proc/self/smaps that holds ``address``."""
    inside = False
    for line in smaps.splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "Rss:":
            return int(line.split()[1])
    raise AssertionError("no mapping holds the pool")


def test_the_host_pool_refuses_what_a_host_pool_refuses():
    pool = PromptSharingHostPool(3, 8)
    e = np.zeros((3, 4, 8), np.uint8)
    pool.add("a", e, capacity=6)
    with pytest.raises(ValueError, match="already in the host pool"):
        pool.add("a", e)
    with pytest.raises(ValueError, match="entries must have shape"):
        pool.add("b", np.zeros((2, 4, 8), np.uint8))
    with pytest.raises(ValueError, match="capacity"):
        pool.add("b", e, capacity=3)
    with pytest.raises(ValueError, match="unknown request_id"):
        pool.append("zz", np.zeros((3, 8), np.uint8))
    with pytest.raises(TypeError, match="layer_segments"):
        pool.layer_rows("a", 0)
    with pytest.raises(ValueError, match="layer"):
        pool.layer_segments("a", 3)


def test_the_engine_shares_the_prefills_entries_on_the_cpu():
    eng = small_engine()
    pre = eng.prefill([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [5, 4, 3, 2, 1, 6, 7, 8, 9, 10]], max_new_tokens=3)
    before = [e.clone() for e in pre.entries]
    s = eng.start(pre, 3, DecodeConfig(ratio=0.5, link_GB_per_s=None))
    assert isinstance(s.cache, PromptSharingCache)
    assert all(np.shares_memory(s.cache.host.layer_segments(b, 0)[0], pre.entries[b].numpy()) for b in range(2))
    while not s.done:
        s.step()
    s.close()
    assert all(torch.equal(a, b) for a, b in zip(pre.entries, before)), "decoding never writes the prefill"
