"""The cache of the models beyond the paper's, computed by hand from their specs (data/models/):

* DeepSeek-V3.2 (final): V3.2-Exp's network, so V3.2-Exp's bytes exactly;
* GLM-5: the same DSA entries (656-B latent, 132-B indexer key) on 78 layers: 78 x 788 = 61,464 B per token;
* DeepSeek-V4-Flash: a 584-B row (448 FP8 NoPE + 64 x 2 B RoPE + 7 one-byte scales + 1 pad byte) per 4 tokens on
  its 21 C4 layers, with a 132-B indexer key (128 FP8 + a 4-B float32 scale) per row; a row per 128 tokens on its 20
  C128 layers; the last 128 tokens on all 43 layers. Offload moves only the C4 rows."""
import dataclasses

import pytest

from ess import layout, memory
from ess.specs import deployment_spec, model_spec

V32, V32X, GLM, V4 = (model_spec(n) for n in ("deepseek-v3.2", "deepseek-v3.2-exp", "glm-5", "deepseek-v4-flash"))


def test_v32_final_is_v32_exp_byte_for_byte():
    assert dataclasses.replace(V32, name="") == dataclasses.replace(V32X, name="")
    for L in (4096, 32768, 131072):
        assert layout.request_cache(V32, L) == layout.request_cache(V32X, L)


def test_glm5_entries_are_v32s_on_78_layers():
    assert (layout.latent_entry_bytes(GLM), layout.indexer_entry_bytes(GLM)) == (656, 132)
    assert layout.token_bytes(GLM) == 78 * 788 == 61464
    rc = layout.request_cache(GLM, 131072)
    assert rc.total_bytes == 131072 * 61464 and rc.resident_bytes == 0
    assert rc.latent_bytes == 131072 * 656 * 78


def test_v4_row_and_key_by_hand():
    assert layout.latent_entry_bytes(V4) == 448 + 64 * 2 + 448 // 64 * 1 + 1 == 584
    assert layout.indexer_entry_bytes(V4) == 128 + 4 == 132
    assert layout.latent_layout(V4).n_scales == 7


def test_v4_kinds_and_bytes_per_token_by_hand():
    kinds = V4.layer_kinds
    assert (kinds.count("sparse"), kinds.count("dense"), kinds.count("window")) == (21, 20, 2)
    assert V4.sparse_layers == tuple(range(2, 43, 2)) and V4.mtp_kinds == ("window",)
    assert layout.token_bytes(V4) == 21 * (584 + 132) / 4 + 20 * 584 / 128 == 3850.25


def test_v4_request_cache_at_1m_by_hand():
    """1M tokens: 262,144 C4 rows (whole pages of 64) on 21 layers; 8,192 C128 rows on 20; 128 window tokens on
    43."""
    rc = layout.request_cache(V4, 1048576)
    assert rc.tokens == 262144
    assert rc.latent_bytes == 262144 * 584 * 21 == 3214934016            # what offload moves
    assert rc.indexer_bytes == 262144 * 132 * 21
    assert rc.resident_bytes == 8192 * 584 * 20 + 43 * 128 * 584
    assert rc.total_bytes == rc.latent_bytes + rc.indexer_bytes + rc.resident_bytes
    half = layout.request_cache(V4, 1048576, ratio=0.5)
    assert half.gpu_bytes == rc.indexer_bytes + rc.resident_bytes + 0.5 * rc.latent_bytes
    assert half.latent_host_bytes == rc.latent_bytes


def test_v4_rows_are_padded_to_whole_pages_and_a_short_context_keeps_its_window():
    rc = layout.request_cache(V4, 1000)              # 250 C4 rows -> 256 (4 pages); 7 C128 rows -> one page
    assert rc.tokens == 256
    assert rc.resident_bytes == 20 * 64 * 584 + 43 * 128 * 584
    short = layout.request_cache(V4, 100)            # 25 rows -> 64; no C128 row yet; the window holds 100 tokens
    assert short.tokens == 64 and short.resident_bytes == 43 * 100 * 584


def test_pool_slots_count_rows_for_a_compressed_model():
    assert layout.pool_slots(V4, 0.25, 32768) == 2048                   # a quarter of 8,192 rows
    assert layout.pool_slots(V32, 0.25, 32768) == 8192                  # tokens for a DSA model
    with pytest.raises(ValueError, match="fewer than the 512"):
        layout.pool_slots(V4, 0.05, 32768, need=V4.index_topk)


def test_v4_step_reads_by_hand():
    """One decode step per request and C4 layer reads its top-512 rows (512 x 584 = 299,008 B; V3.2: 2,048 x 656 =
    1,343,488 B) and the indexer scans L / 4 keys of 132 B."""
    assert V4.index_topk * layout.latent_entry_bytes(V4) == 299008
    assert V32.index_topk * layout.latent_entry_bytes(V32) == 1343488
    assert V4.sparse_rows(131072) * layout.indexer_entry_bytes(V4) == 32768 * 132


def test_the_memory_rule_holds_v4s_resident_rows_on_the_gpu():
    dep = "paper-table1"
    budget = memory.kv_budget_bytes(V4, deployment_spec(dep))
    rc = layout.request_cache(V4, 1048576, ratio=0.1)
    lim = memory.largest_batch(1048576, 0.1, model=V4, deployment=dep)
    assert lim.batch_gpu == int(budget // rc.gpu_bytes)
    assert lim.host_bytes_per_request == rc.latent_host_bytes
    assert lim.limited_by == "host" and lim.batch == lim.batch_host == int(256e9 // rc.latent_bytes)
    B = 60                                            # below the host's limit: the KV budget sets the ratio
    r = float(memory.ratio_for_batch(B, 1048576, model=V4, deployment=dep))
    # the largest ratio (4 decimals) at which that batch fits: budget / B = indexer + resident + r x latent
    assert B * (rc.indexer_bytes + rc.resident_bytes + r * rc.latent_bytes) <= budget
    assert B * (rc.indexer_bytes + rc.resident_bytes + (r + 2e-4) * rc.latent_bytes) > budget


def test_v4_needs_its_rows_not_tokens_in_the_pool_for_a_step():
    """One step with MTP 1 selects min(512, rows) rows per C4 layer."""
    assert memory.step_slots_needed(V4, 32768, 1) == 512
    assert memory.step_slots_needed(V4, 1024, 1) == 256
    assert memory.step_slots_needed(V32, 1024, 1) == 1024


def test_a_compressed_spec_is_validated():
    with pytest.raises(ValueError, match="one whole number >= 0 per layer"):
        dataclasses.replace(V4, layer_compress_ratios=(4, 128))
    with pytest.raises(ValueError, match="no layer at sparse_compress_ratio"):
        dataclasses.replace(V4, sparse_compress_ratio=8)
    with pytest.raises(ValueError, match="needs sliding_window"):
        dataclasses.replace(V4, sliding_window=0)
    with pytest.raises(ValueError, match="o_groups"):
        dataclasses.replace(V4, o_groups=7)
    with pytest.raises(TypeError, match="kv_shared"):
        dataclasses.replace(V4, kv_shared=1)
    with pytest.raises(ValueError, match="need layer_compress_ratios"):
        dataclasses.replace(V32, sliding_window=128)
