"""One decode step through a tiered cache (ess.decode): equal, bit for bit, to attention over all-resident caches;
every request checked before anything moves; a failed copy leaves the batch consistent; the write-back."""
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from ess import decode as D
from ess import quant
from ess.attention import resident_attention
from ess.kernels.transfer import TransferError
from ess.specs import model_spec
from ess.storage import TieredCache

TINY = model_spec("tiny")
BACKENDS = ["reference", "numba", "torch"]


def test_decode_step_checks_q_before_touching_the_cache():
    rng = np.random.default_rng(7)
    lat, keys, qi, w, q = _decode_inputs(rng, TINY, 1, [100])
    cache = _ScatterCache(capacity=TINY.index_topk, entry_bytes=lat[0].shape[-1], seed=0)
    cache.add_request("r", lat[0])
    with pytest.raises(ValueError, match="q must hold finite"):
        D.decode_layer(cache, 0, ["r"], qi, w, keys, np.full_like(q, np.nan), TINY)
    assert not cache.where                                             # nothing was loaded


def _tiered(lens, capacity, seed):
    rng = np.random.default_rng(seed)
    lat, keys, qi, w, q = _decode_inputs(rng, TINY, len(lens), lens)
    cache = TieredCache(TINY, capacity=capacity, backend="numba")
    for b, e in enumerate(lat):
        cache.add_request(f"r{b}", e)
    return cache, lat, keys, qi, w, q


def _same_snapshot(a, b):
    assert a.keys() == b.keys()
    np.testing.assert_array_equal(a["device"], b["device"])
    assert a["free_blocks"] == b["free_blocks"] and a["n_metrics"] == b["n_metrics"]
    for rid, pools in a["pools"].items():
        for pa, pb in zip(pools, b["pools"][rid]):
            np.testing.assert_array_equal(pa["token_of"], pb["token_of"])
            np.testing.assert_array_equal(pa["slot_of"], pb["slot_of"])
            assert pa["steps"] == pb["steps"]
            for key in pa["policy"]:
                np.testing.assert_array_equal(pa["policy"][key], pb["policy"][key])


@pytest.mark.parametrize("bad_at", [0, 1, 2])
@pytest.mark.parametrize("kind", ["unknown_id", "indices_past_tokens"])
def test_decode_step_checks_every_request_before_any_step(bad_at, kind):
    lens = [120, 100, 90]
    K = TINY.index_topk
    cache, lat, keys, qi, w, q = _tiered(lens, K + 5, seed=20 + bad_at)
    ids = ["r0", "r1", "r2"]
    D.decode_layer(cache, 1, ids, qi, w, keys, q, TINY)                     # some residents to disturb
    before = cache.snapshot()
    good = (qi, w, keys)
    if kind == "unknown_id":
        ids[bad_at] = "nobody"
        err, match = ValueError, "unknown request_id 'nobody'"
    elif kind == "indices_past_tokens":                                    # the indexer cache is longer than the
        rng = np.random.default_rng(1)                                     # request's latent cache: top-K picks a
        extra = quant.encode_indexer_keys(rng.standard_normal((30, TINY.index_head_dim)), TINY)  # token past it
        keys = list(keys)
        keys[bad_at] = np.concatenate([keys[bad_at], extra])
        qi = qi.copy()
        w = w.copy()
        w[bad_at] = 1.0
        qi[bad_at] = quant.decode_indexer_keys(extra[-1], TINY)[None] * 10    # so the new last token scores high
        err, match = ValueError, "outside \\[-1, " + str(lens[bad_at]) + "\\)"
    with pytest.raises(err, match=match):
        D.decode_layer(cache, 1, ids, qi, w, keys, q, TINY)
    _same_snapshot(before, cache.snapshot())
    qi, w, keys = good
    with pytest.raises(ValueError, match=f"capacity={K + 5}"):                 # more than the pool holds
        D.decode_layer(cache, 1, ["r0", "r1", "r2"], qi, w, keys, q, TINY, topk=K + 6)
    with pytest.raises(ValueError, match="layer must be in \\[0, 4\\)"):
        D.decode_layer(cache, 4, ["r0", "r1", "r2"], qi, w, keys, q, TINY)
    with pytest.raises(ValueError, match="request_ids must be distinct"):
        D.decode_layer(cache, 0, ["r0", "r1", "r0"], qi, w, keys, q, TINY)
    _same_snapshot(before, cache.snapshot())


def test_decode_step_needs_the_cache_contract():
    rng = np.random.default_rng(13)
    lat, keys, qi, w, q = _decode_inputs(rng, TINY, 1, [50])
    with pytest.raises(TypeError, match=r"cache must follow ess.decode.LatentCache \(entry_bytes, plan, copy, commit, "
                                        r"dtype, device_pool\); SimpleNamespace has no entry_bytes, copy"):
        D.decode_layer(SimpleNamespace(plan=None, commit=None, dtype="fp8", device_pool=None), 0, ["r"], qi, w, keys,
                       q, TINY)


# ---------------------------------------------------------------------------------------------------------------
# decode step through a tiered cache
# ---------------------------------------------------------------------------------------------------------------

class _ScatterCache:
    """A minimal cache with the contract decode_layer uses (ess.decode.LatentCache: plan / copy / commit, the entry
    bytes, the layout and the device pool) that scatters each request's entries over random slots of its own block
    and evicts at random: the decode step must not depend on where rows live."""

    dtype = "fp8"

    def __init__(self, capacity, entry_bytes, seed, max_requests=4):
        self.rng = np.random.default_rng(seed)
        self.capacity, self.entry_bytes = capacity, entry_bytes
        self.device_pool = torch.zeros((max_requests * capacity, entry_bytes), dtype=torch.uint8)
        self.where = {}                                                # (rid, layer, token) -> global slot
        self.host, self.base = {}, {}

    def add_request(self, rid, entries):
        self.base[rid] = len(self.host) * self.capacity
        self.host[rid] = entries

    def plan(self, rid, layer, indices, **_):
        if rid not in self.host:
            raise ValueError(f"unknown request_id {rid!r}")
        if not 0 <= layer < self.host[rid].shape[0] or indices.max() >= self.host[rid].shape[1]:
            raise ValueError("layer or indices out of range")
        where = dict(self.where)                                       # a private copy: plan changes nothing
        needed = {(rid, layer, int(t)) for t in indices if t >= 0}
        block = range(self.base[rid], self.base[rid] + self.capacity)
        slots = np.full(indices.shape, -1, np.int64)
        loads = []
        for j, t in enumerate(indices):
            if t < 0:
                continue
            key = (rid, layer, int(t))
            if key not in where:
                mine = {k: s for k, s in where.items() if k[0] == rid}
                if len(mine) == self.capacity:
                    victims = [k for k in mine if k not in needed]
                    del where[victims[self.rng.integers(len(victims))]]
                used = {s for k, s in where.items() if k[0] == rid}
                free = [s for s in block if s not in used]
                where[key] = free[self.rng.integers(len(free))]
                loads.append((key, where[key]))
            slots[j] = where[key]
        return SimpleNamespace(request_id=rid, indices=indices, slots=slots, where=where, loads=loads,
                               n_misses=len(loads))

    def copy(self, plan):
        for (rid, layer, t), s in plan.loads:
            self.device_pool[s] = torch.from_numpy(self.host[rid][layer, t])

    def commit(self, plan):
        self.where.update({k: s for k, s in plan.where.items() if k[0] == plan.request_id})
        for k in [k for k in self.where if k[0] == plan.request_id and k not in plan.where]:
            del self.where[k]
        return plan


def _decode_inputs(rng, model, B, lens):
    lat = [quant.encode_latent(rng.standard_normal((model.n_layers, L, model.kv_lora_rank)),
                               rng.standard_normal((model.n_layers, L, model.qk_rope_head_dim)), model)
           for L in lens]
    keys = [quant.encode_indexer_keys(rng.standard_normal((L, model.index_head_dim)), model) for L in lens]
    qi = rng.standard_normal((B, model.index_n_heads, model.index_head_dim))
    w = rng.random((B, model.index_n_heads))
    q = rng.standard_normal((B, model.n_heads, model.latent_dim)).astype(np.float32)
    return lat, keys, qi, w, q


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_step_through_a_scattering_cache_is_bitwise_lossless(backend):
    rng = np.random.default_rng(5)
    lens = [150, 90, 40]
    lat, keys, qi, w, q = _decode_inputs(rng, TINY, 3, lens)
    cache = _ScatterCache(capacity=TINY.index_topk + 7, entry_bytes=lat[0].shape[-1], seed=1)
    for r, entries in enumerate(lat):
        cache.add_request(f"r{r}", entries)
    for layer in (0, 2, 0):                                            # repeat layer 0: hits and evictions
        step = D.decode_layer(cache, layer, ["r0", "r1", "r2"], qi, w, keys, q, TINY, backend=backend)
        base = resident_attention(q, [e[layer] for e in lat], step.indices, TINY, backend=backend)
        np.testing.assert_array_equal(step.out, base.out)
        np.testing.assert_array_equal(step.lse, base.lse)
        assert (step.indices[2] >= 0).sum() == 40 and (step.indices[0] >= 0).all()


def _never_read_back(*args):
    raise AssertionError("a decode step copied device rows back to the host")


@settings(max_examples=12, deadline=None)
@given(ratio=st.floats(0.05, 1.0), policy=st.sampled_from(["lru", "fifo", "heat"]), B=st.integers(1, 3),
       backend=st.sampled_from(BACKENDS), seed=st.integers(0, 2 ** 16))
def test_decode_step_through_tiered_cache_is_bitwise_lossless(ratio, policy, B, backend, seed):
    rng = np.random.default_rng(seed)
    K = TINY.index_topk
    lens = [int(x) for x in rng.integers(K + 1, 6 * K, size=B)]
    lat, keys, qi, w, q = _decode_inputs(rng, TINY, B, lens)
    capacity = max(K, math.ceil(ratio * max(lens)))                   # slots per (request, layer); at least one K
    cache = TieredCache(TINY, capacity=capacity, dtype="fp8", policy=policy, backend="numba" if backend != "torch"
                        else "torch")
    ids = [f"req{b}" for b in range(B)]
    for rid, e in zip(ids, lat):
        cache.add_request(rid, e)
    cache.device_rows = _never_read_back                              # attention reads the device pool in place
    misses = 0
    for layer in rng.integers(0, TINY.n_layers, size=3):
        step = D.decode_layer(cache, int(layer), ids, qi, w, keys, q, TINY, backend=backend)
        base = resident_attention(q, [e[int(layer)] for e in lat], step.indices, TINY, backend=backend)
        np.testing.assert_array_equal(step.out, base.out)
        np.testing.assert_array_equal(step.lse, base.lse)
        misses += sum(int(r.miss_pos.size) for r in step.steps)
        qi = qi + rng.standard_normal(qi.shape) * 0.3                  # the next step selects a shifted set
    assert misses > 0                                                  # rows really came in through the cache


def test_a_failed_copy_commits_the_requests_copied_before_it_and_frees_its_slots(monkeypatch):
    lens = [120, 100, 90]
    cache, lat, keys, qi, w, q = _tiered(lens, TINY.index_topk + 5, seed=3)
    ids = ["r0", "r1", "r2"]
    D.decode_layer(cache, 1, ids, qi, w, keys, q, TINY)                    # residents to evict
    calls = {"n": 0}
    real = cache._copy_rows

    def failing(src, src_idx, dst, dst_idx):
        calls["n"] += 1
        if calls["n"] == 2:                                              # the second request's copy fails
            dst[dst_idx[:3]] = 0                                         # after writing part of its rows
            raise OSError("injected: link reset")
        real(src, src_idx, dst, dst_idx)
    monkeypatch.setattr(cache, "_copy_rows", failing)
    before = {rid: cache.n_tokens(rid) for rid in ids}
    n_metrics = len(cache.metrics)
    qi2 = qi + 3.0                                                       # a new selection: misses in every request
    with pytest.raises(TransferError, match="injected: link reset"):
        D.decode_layer(cache, 1, ids, qi2, w, keys, q, TINY)
    assert len(cache.metrics) == n_metrics + 1                           # r0's step committed, nothing else
    assert {rid: cache.n_tokens(rid) for rid in ids} == before
    for rid, e in zip(ids, lat):                                         # every resident row equals its host copy
        m = cache.slot_map(rid, 1)
        toks, slots = np.fromiter(m, np.int64), np.fromiter(m.values(), np.int64)
        np.testing.assert_array_equal(cache.device_rows(slots), e[1][toks])
    monkeypatch.setattr(cache, "_copy_rows", real)
    step = D.decode_layer(cache, 1, ids, qi2, w, keys, q, TINY)          # and the cache works on
    base = resident_attention(q, [e[1] for e in lat], step.indices, TINY)
    np.testing.assert_array_equal(step.out, base.out)


def test_attention_failure_still_commits_the_copied_rows():
    cache, lat, keys, qi, w, q = _tiered([100], TINY.index_topk, seed=4)
    bad = lat[0].copy()
    bad[:, :, 0] = 0x7F                                                  # FP8 NaN in every stored entry
    cache.add_request("bad", bad)
    with pytest.raises(ValueError, match="non-finite"):
        D.decode_layer(cache, 0, ["bad"], qi, w, keys, q, TINY)
    assert cache.metrics.totals()["step"]["misses"] == TINY.index_topk   # the step was committed
    assert len(cache.slot_map("bad", 0)) == TINY.index_topk


def test_write_back_checks_every_request_first_then_appends():
    cache, lat, *_ = _tiered([100, 90], TINY.index_topk, seed=5)
    new = np.arange(2 * 4 * cache.entry_bytes, dtype=np.int64).astype(np.uint8).reshape(2, 4, cache.entry_bytes)
    with pytest.raises(ValueError, match="unknown request_id 'nobody'"):
        D.write_back(cache, ["r0", "nobody"], new)
    assert cache.n_tokens("r0") == 100                                   # nothing was written
    with pytest.raises(ValueError, match="one token per request"):
        D.write_back(cache, ["r0"], new)
    assert D.write_back(cache, ["r0", "r1"], new) == [100, 90]
    np.testing.assert_array_equal(cache.host.entries("r1")[:, 90], new[1])
    assert cache.metrics.totals()["append"]["bytes_d2h"] == 2 * 4 * cache.entry_bytes


@pytest.mark.cuda
def test_decode_step_on_cuda_attends_over_the_device_pool_in_place(monkeypatch):
    # DeepSeek's wiring with the device pool on the GPU: no row comes back to the host (device_rows is never
    # called) and the result is bit for bit the all-resident attention on the GPU
    rng = np.random.default_rng(17)
    lens = [300, 190]
    lat, keys, qi, w, q = _decode_inputs(rng, TINY, 2, lens)
    cache = TieredCache(TINY, capacity=80, device="cuda")
    for b, e in enumerate(lat):
        cache.add_request(f"r{b}", e)
    assert cache.device_pool.is_cuda
    monkeypatch.setattr(cache, "device_rows", lambda *a: pytest.fail("a decode step read device rows back"))
    misses = 0
    for layer in (0, 1, 0):
        step = D.decode_layer(cache, layer, ["r0", "r1"], qi, w, keys, q, TINY, backend="torch", device="cuda")
        base = resident_attention(q, [e[layer] for e in lat], step.indices, TINY, backend="torch", device="cuda")
        np.testing.assert_array_equal(step.out, base.out)
        np.testing.assert_array_equal(step.lse, base.lse)
        misses += sum(int(s.miss_pos.size) for s in step.steps)
        qi = qi + rng.standard_normal(qi.shape) * 0.3
    assert misses > 0
