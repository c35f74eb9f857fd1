import numpy as np
import pytest

from ess import layout
from ess.specs import model_spec

DS = model_spec("deepseek-v3.2-exp")


def test_entry_bytes_are_computed_from_the_geometry():
    assert layout.latent_entry_bytes(DS, "fp8") == 656
    assert layout.latent_entry_bytes(DS, "bf16") == 1152
    assert layout.indexer_entry_bytes(DS) == 132
    assert layout.token_bytes(DS) == 48068


def test_fp8_field_offsets_tile_the_entry():
    lay = layout.latent_layout(DS, "fp8")
    assert (lay.ckv_offset, lay.scale_offset, lay.rope_offset) == (0, 512, 528)
    assert lay.n_scales == 4 and lay.rope_offset + lay.rope_bytes == lay.entry_bytes == 656


def test_tiny_layout_follows_its_own_geometry():
    tiny = model_spec("tiny")
    assert layout.latent_entry_bytes(tiny) == 128 + 4 + 16 * 2
    assert layout.indexer_entry_bytes(tiny) == 32 + 4


@pytest.mark.parametrize("L,gb", [(32768, 1.575), (131072, 6.30)])
def test_request_sizes(L, gb):
    rc = layout.request_cache(DS, L)
    assert rc.total_bytes / 1e9 == pytest.approx(gb, rel=0.002)
    assert rc.indexer_bytes / rc.total_bytes == pytest.approx(132 / 788)


def test_ratio_splits_latent_between_gpu_and_host():
    rc = layout.request_cache(DS, 32768, ratio=0.25)
    assert rc.latent_gpu_bytes == pytest.approx(rc.latent_bytes / 4)
    assert rc.latent_host_bytes == rc.latent_bytes
    assert rc.gpu_bytes == pytest.approx(rc.indexer_bytes + rc.latent_bytes / 4)
    full = layout.request_cache(DS, 32768, ratio=1.0)
    assert full.latent_host_bytes == 0 and full.gpu_bytes == full.total_bytes


def test_context_is_padded_to_pages():
    assert layout.padded_tokens(DS, 1) == 64
    assert layout.padded_tokens(DS, 64) == 64
    assert layout.padded_tokens(DS, 65) == 128


@pytest.mark.parametrize("L,exc,msg", [(0, ValueError, "context_len must be a positive integer, got 0"),
                                       (-5, ValueError, "context_len must be a positive integer, got -5"),
                                       (163841, ValueError, "exceeds the maximum context"),
                                       (1.5, TypeError, "context_len must be an integer")])
def test_bad_context(L, exc, msg):
    with pytest.raises(exc, match=msg):
        layout.request_cache(DS, L)


@pytest.mark.parametrize("ratio,msg", [(0, r"ratio must be in \(0, 1\], got 0"), (-0.1, r"\(0, 1\], got -0.1"),
                                       (1.01, r"\(0, 1\], got 1.01"), (float("nan"), "ratio must be finite")])
def test_bad_ratio(ratio, msg):
    with pytest.raises(ValueError, match=msg):
        layout.request_cache(DS, 1024, ratio=ratio)


def test_bad_dtype():
    with pytest.raises(ValueError, match="dtype must be one of"):
        layout.latent_entry_bytes(DS, "fp4")


def test_pool_slots_pads_to_pages_worked_examples():
    # 1,000 tokens take 16 pages of 64 = 1,024 tokens: floor(0.3 x 1,024) = floor(307.2) = 307
    assert layout.pool_slots(DS, 0.3, 1000) == 307
    # 960 tokens are exactly 15 pages: 0.3 x 960 = 288, although the float product is 287.99999999999997
    assert layout.pool_slots(DS, 0.3, 960) == 288
    # one step selects min(L, mtp x K): 2,048 at 32K (MTP 1), 4,096 with MTP 2, the whole context below K
    assert layout.step_entries(DS, 32768) == 2048 and layout.step_entries(DS, 32768, 2) == 4096
    assert layout.step_entries(DS, 1000, 2) == 1000
    # ratio 0.05 of 32K: floor(0.05 x 32,768) = 1,638 slots, fewer than K = 2,048
    with pytest.raises(ValueError, match="1638 GPU slots .* fewer than the 2048 entries"):
        layout.pool_slots(DS, 0.05, 32768, need=layout.step_entries(DS, 32768))
    with pytest.raises(TypeError, match="ratio"):
        layout.pool_slots(DS, "0.5", 100)


def test_step_entries_is_the_union_of_the_query_tokens_sets_worked_examples():
    # overlap 0.5, K 2,048, MTP 4: each further token adds ceil(0.5 x 2,048) = 1,024 -> 2,048 + 3 x 1,024 = 5,120
    assert layout.step_entries(DS, 32768, 4, overlap=0.5) == 5120
    # overlap 0.9: ceil(0.1 x 2,048) = ceil(204.8) = 205 new per token -> 2,048 + 205 = 2,253 with MTP 2
    assert layout.step_entries(DS, 32768, 2, overlap=0.9) == 2253
    # no locality: the union is mtp x K, as without an overlap; one token: K whatever the overlap
    assert layout.step_entries(DS, 32768, 4, overlap=0.0) == layout.step_entries(DS, 32768, 4) == 8192
    assert layout.step_entries(DS, 32768, 1, overlap=0.3) == 2048
    # never more than the context: 3,000 tokens, overlap 0 -> min(3,000, 2 x 2,048)
    assert layout.step_entries(DS, 3000, 2, overlap=0.0) == 3000
    # one value per layer
    np.testing.assert_array_equal(layout.step_entries(DS, 32768, 2, overlap=[0.0, 0.5, 1.0]), [4096, 3072, 2048])
    with pytest.raises(ValueError, match="overlap"):
        layout.step_entries(DS, 32768, 2, overlap=1.5)


def test_layer_pool_slots_shares_the_ratio_over_the_layers_worked_examples():
    # ratio 0.193 of 32K: 6,324 slots per layer; 3 layers hold 18,972. Needs 8,192 / 2,000 / 2,000: the first takes
    # its 8,192, the other two share 18,972 - 8,192 = 10,780 -> 5,390 each
    np.testing.assert_array_equal(layout.layer_pool_slots(DS, 0.193, 32768, [8192, 2000, 2000]), [8192, 5390, 5390])
    # every need within the even share: the uniform rule, slot for slot
    np.testing.assert_array_equal(layout.layer_pool_slots(DS, 0.193, 32768, [2048, 4096]), [6324, 6324])
    # two layers above the share: 3 x 6,324 = 18,972 - 7,000 - 6,500 = 5,472 for the third
    np.testing.assert_array_equal(layout.layer_pool_slots(DS, 0.193, 32768, [7000, 6500, 100]), [7000, 6500, 5472])
    # together more than the total: refused
    with pytest.raises(ValueError, match="fewer than the 19000 entries"):
        layout.layer_pool_slots(DS, 0.193, 32768, [8000, 8000, 3000])


@pytest.mark.parametrize("ratio", [0.15, 0.2, 0.3, 0.55, 1.0])
@pytest.mark.parametrize("L", [200, 1000, 1500])
def test_one_pool_rule_for_memory_storage_and_cachesim(ratio, L):
    """The storage, the cache simulator and the memory model size the same pool for a ratio: the storage's
    capacity (``capacity_from_ratio``), the simulator's misses at that ratio against an explicit capacity, and the
    memory model's feasibility (slots >= one step's K) all follow ``pool_slots``."""
    from ess import cachesim, memory, tracegen
    tiny = model_spec("tiny")
    slots = layout.pool_slots(tiny, ratio, L)
    need = layout.step_entries(tiny, L)
    if slots < need:
        with pytest.raises(ValueError, match="fewer than"):
            layout.capacity_from_ratio(tiny, ratio, L)
        return
    assert layout.capacity_from_ratio(tiny, ratio, L) == slots
    tr = tracegen.synthetic_trace(tracegen.Workload(L, n_layers=1, k=tiny.index_topk, mtp=1, steps=6, batch=1,
                                                    warmup_windows=0, local_window=4))
    by_ratio = cachesim.trace_misses(tr, ratio=ratio, warmup=False)        # pages of 64 tokens, as tiny's
    assert np.array_equal(by_ratio, cachesim.trace_misses(tr, capacity=slots, warmup=False))
    lim = memory.largest_batch(32768, ratio)
    assert (lim.limited_by == "infeasible" and lim.batch == 0) == (
        layout.pool_slots(DS, ratio, 32768) < layout.step_entries(DS, 32768))
