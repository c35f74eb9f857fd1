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


@pytest.mark.parametrize("L,exc,msg", [(0, ValueError, "context_len must be > 0"),
                                       (-5, ValueError, "context_len must be > 0"),
                                       (163841, ValueError, "exceeds the maximum context"),
                                       (1.5, TypeError, "context_len must be an integer")])
def test_bad_context(L, exc, msg):
    with pytest.raises(exc, match=msg):
        layout.request_cache(DS, L)


@pytest.mark.parametrize("ratio", [0, -0.1, 1.01, float("nan")])
def test_bad_ratio(ratio):
    with pytest.raises(ValueError, match=r"ratio.*\(0, 1\]"):
        layout.request_cache(DS, 1024, ratio=ratio)


def test_bad_dtype():
    with pytest.raises(ValueError, match="dtype must be one of"):
        layout.latent_entry_bytes(DS, "fp4")


@pytest.mark.parametrize("ratio", [0.15, 0.2, 0.3, 0.55, 1.0])
@pytest.mark.parametrize("L", [20000, 32768, 100001])
def test_one_pool_rule_for_memory_storage_and_cachesim(ratio, L):
    from ess.cachesim import capacity_for
    from ess.storage import capacity_from_ratio

    slots = layout.pool_slots(ratio, layout.padded_tokens(DS, L))
    assert slots == capacity_for(ratio, L) == capacity_from_ratio(DS, ratio, L)
    assert layout.pool_slots(0.3, 1000) == 300                     # no float truncation
