"""The storage as the engine uses it: entry formats other than DeepSeek's, the all-resident cache (offload off), the
K/V entry layout, the FP8 indexer keys against ess.quant, and the device-resident indexer cache (its kernels:
tests/test_kernels_gqa_indexer.py)."""
import numpy as np
import pytest
import torch

from ess.attention import topk_indices
from ess.engine.indexer import IndexerCache, indexer_key_bytes, quantize_keys, selection_mass
from ess.kernels.gqa_indexer import gqa_indexer_scores
from ess.engine.kv import kv_entries, kv_entry_format, kv_view
from ess.layout import EntryFormat, entry_format, pool_slots
from ess.llm import LlamaConfig
from ess.quant import quantize_fp8_tiles
from ess.specs import model_spec
from ess.storage import ResidentCache, TieredCache

SMOL = LlamaConfig(n_layers=30, d_model=576, d_ffn=1536, n_heads=9, n_kv_heads=3, head_dim=64, rope_base=1e5,
                   rms_eps=1e-5, context_length=8192, vocab_size=49152)
FMT = EntryFormat("test", n_layers=2, entry_bytes=8, page_tokens=4, max_context=100, dtype="u8")


def test_smollm2_entry_and_indexer_key_bytes():
    f = kv_entry_format(SMOL)
    assert f.entry_bytes == 2 * 3 * 64 * 4 == 1536 and f.n_layers == 30 and f.max_context == 8192
    assert indexer_key_bytes(3, 64) == 3 * 64 + 3 * 4 == 204


def test_deepseek_format_is_what_it_was():
    f = entry_format(model_spec("deepseek-v3.2-exp"))
    assert (f.entry_bytes, f.page_tokens, f.n_layers) == (656, 64, 61)
    with pytest.raises(TypeError, match="ModelSpec or an EntryFormat"):
        entry_format("deepseek-v3.2-exp")


def test_pool_slots_follow_the_format_page():
    # 10 tokens round up to 12 (pages of 4): ratio 0.5 -> 6 slots
    assert pool_slots(FMT, 0.5, 10) == 6
    with pytest.raises(ValueError, match="exceeds the maximum context of test"):
        pool_slots(FMT, 0.5, 101)


def test_tiered_cache_over_any_format():
    c = TieredCache(FMT, capacity=3)
    assert (c.entry_bytes, c.n_layers, c.dtype, c.model) == (8, 2, "u8", None)
    e = np.arange(2 * 5 * 8, dtype=np.uint8).reshape(2, 5, 8)
    c.add_request("r", e, reserve_tokens=9)
    assert c.host.layer_rows("r", 0).shape[0] == 9                  # room reserved: appends will not grow it
    r = c.step("r", 1, np.array([4, -1, 2], np.int64))
    np.testing.assert_array_equal(c.device_pool[r.slots[r.slots >= 0]], e[1, [4, 2]])
    with pytest.raises(ValueError, match="do not pass dtype"):
        TieredCache(FMT, capacity=3, dtype="bf16")
    with pytest.raises(ValueError, match="reserve_tokens"):
        c.add_request("s", e, reserve_tokens=2)


def test_resident_cache_speaks_the_step_protocol():
    c = ResidentCache(FMT, max_requests=2, max_tokens=10)
    e = np.arange(2 * 5 * 8, dtype=np.uint8).reshape(2, 5, 8)
    c.add_request("a", e)
    plan = c.plan("a", 1, np.array([3, -1, 0], np.int64))
    assert plan.n_misses == 0 and plan.hit_pos.tolist() == [0, 2]
    np.testing.assert_array_equal(c.device_pool[plan.slots[plan.hit_pos]], e[1, [3, 0]])
    step = c.commit(plan)
    assert (step.n_hits, step.n_misses, step.bytes_h2d) == (2, 0, 0)
    assert c.append_token("a", np.full((2, 8), 7, np.uint8)) == 5
    p2 = c.plan("a", 0, np.array([5], np.int64))
    assert (c.device_pool[p2.slots] == 7).all()
    with pytest.raises(ValueError, match="outside"):
        c.plan("a", 0, np.array([6], np.int64))
    with pytest.raises(ValueError, match="unknown request_id"):
        c.plan("b", 0, np.array([0], np.int64))
    with pytest.raises(ValueError, match="max_tokens"):
        ResidentCache(FMT, max_requests=1, max_tokens=101)


def test_kv_entries_are_k_then_v_in_float32():
    k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    e = kv_entries(k, v)                                           # (B, T, 2 x 3 x 4 x 4 bytes)
    assert e.dtype == torch.uint8 and e.shape == (2, 5, 96)
    view = kv_view(e, 3, 4)
    assert torch.equal(view[:, :, 0], k.transpose(1, 2)) and torch.equal(view[:, :, 1], v.transpose(1, 2))
    with pytest.raises(ValueError, match="float32"):
        kv_entries(k.double(), v.double())


def test_indexer_keys_are_ess_quant_fp8_bit_for_bit():
    g = torch.Generator().manual_seed(1)
    k = torch.randn(300, 3, 64, generator=g) * torch.rand(300, 3, 1, generator=g) * 50
    k[7, 1] = 0.0                                                  # an all-zero head: scale 1
    codes, scales = quantize_keys(k)
    want_codes, want_scales = quantize_fp8_tiles(k.reshape(300, 192).numpy(), 64)
    np.testing.assert_array_equal(codes.numpy(), want_codes)
    np.testing.assert_array_equal(scales.numpy(), want_scales)


def test_indexer_cache_holds_keys_per_request_and_layer():
    ic = IndexerCache(2, 3, 64, max_requests=2, capacity=7)
    k = torch.randn(2, 5, 3, 64)
    codes, scales = quantize_keys(k)
    ic.add_request("a", codes, scales)
    ic.add_request("b", codes[:, :3], scales[:, :3])
    ic.append_tokens(["a", "b"], torch.randn(2, 2, 3, 64))
    assert (ic.n_tokens("a"), ic.n_tokens("b")) == (6, 4)
    c1, s1 = ic.keys("a", 1)
    assert c1.shape == (6, 192) and s1.shape == (6, 3)
    np.testing.assert_array_equal(c1[:5], codes[1].numpy())
    assert ic.lengths.tolist() == [6, 4]
    assert ic.nbytes == (6 + 4) * 2 * 204
    ic.append_tokens(["a"], torch.randn(2, 1, 3, 64))
    with pytest.raises(ValueError, match="capacity"):
        ic.append_tokens(["a"], torch.randn(2, 1, 3, 64))
    with pytest.raises(ValueError, match="shapes"):
        IndexerCache(2, 3, 64, max_requests=1, capacity=7).add_request("b", codes[:, :, :10], scales)
    with pytest.raises(ValueError, match="unknown request_id"):
        ic.keys("c", 0)
    with pytest.raises(ValueError, match="max_requests=2"):
        ic.add_request("c", codes, scales)


@pytest.mark.parametrize("backend", ["reference", "numba", "torch"])
def test_indexer_cache_scores_are_the_kernel_over_each_request_s_own_tokens(backend):
    # two requests of 5 and 3 tokens in one cache of capacity 7: each scored over its own tokens, -inf after them,
    # bit for bit the kernel over that request alone (a request's scores do not depend on the batch: a DBA half
    # must select what the whole batch selects)
    g = torch.Generator().manual_seed(4)
    ic = IndexerCache(1, 2, 8, max_requests=2, capacity=7, backend=backend)
    keys = [torch.randn(1, n, 2, 8, generator=g) for n in (5, 3)]
    for rid, k in zip("ab", keys):
        ic.add_request(rid, *quantize_keys(k))
    q = torch.randn(2, 6, 8, generator=g)
    got = ic.scores(0, q, slice(0, 2))
    assert got.shape == (2, 7) and torch.isneginf(got[0, 5:]).all() and torch.isneginf(got[1, 3:]).all()
    for b, k in enumerate(keys):
        codes, scales = quantize_keys(k[0])
        alone = gqa_indexer_scores(q[b:b + 1].contiguous(), codes[None], scales[None], torch.tensor([k.shape[1]]),
                                   backend=backend)
        torch.testing.assert_close(got[b, :k.shape[1]], alone[0], rtol=0, atol=0)
        assert float(got[b, :k.shape[1]].sum()) == pytest.approx(6.0, rel=1e-5)   # 6 heads' probabilities
    assert topk_indices(got, 2, backend=backend).shape == (2, 2)


def test_selection_mass_of_a_peaked_query():
    # one key per head aligned with its query: every rule keeps it, and it holds most of the mass
    g = torch.Generator().manual_seed(0)
    k = torch.randn(200, 3, 64, generator=g) * 0.1
    q = torch.zeros(9, 64)
    for h in range(9):
        q[h, h] = 20.0
        k[40 + h, h // 3, h] = 3.0
    mass = selection_mass(q, k, 9)
    assert mass["exact"] > 0.9 and mass["probability_sum"] > 0.9
