"""The overlap formulas (none / DA / DBA) pinned by worked examples computed by hand, so that a wrong edit of any
term fails here: the one implementation in ess.sim.timeline.overlap_overhead_s, and the cost model's way into it."""
import dataclasses

import numpy as np
import pytest

from ess.sim import Scenario
from ess.sim.costs import LayerCosts
from ess.sim.timeline import LayerOps, offload_overhead_s, overlap_overhead_s, simulate

# milliseconds, to keep the arithmetic readable:
# I 4 (I0 3, I1 3: the halves keep most of it), p 2, a 6 (a0 4, a1 4), a_hit 4, a_miss 3, merge 1, o 5,
# h 10 (h0 6, h1 4), d 7
OPS = dict(indexer=4.0, indexer_b0=3.0, indexer_b1=3.0, pre_attn=2.0, attn=6.0, attn_b0=4.0, attn_b1=4.0,
           attn_hit=4.0, attn_miss=3.0, merge=1.0, o_proj=5.0, h2d=10.0, h2d_b0=6.0, h2d_b1=4.0, d2h=7.0)


def test_none_is_the_two_copies_in_series():
    # h + d = 10 + 7
    assert overlap_overhead_s(LayerOps(**OPS))["none"] == pytest.approx(17.0)


def test_dual_attention_pays_its_second_launch_and_the_merge_and_hides_the_copy_behind_p_and_the_hits():
    # (a_hit + a_miss - a) + merge + max(0, h - p - a_hit) + max(0, d - o)
    # = (4 + 3 - 6) + 1 + max(0, 10 - 2 - 4) + max(0, 7 - 5) = 1 + 1 + 4 + 2
    assert overlap_overhead_s(LayerOps(**OPS))["da"] == pytest.approx(8.0)


def test_dual_attention_costs_its_own_split_when_the_copies_are_short():
    # h = 4 <= p + a_hit = 6 and d = 3 <= o = 5: the copies hide, the split (1) and the merge (1) are left
    ops = LayerOps(**{**OPS, "h2d": 4.0, "d2h": 3.0})
    assert overlap_overhead_s(ops)["da"] == pytest.approx(2.0)


def test_dual_batch_attention_pays_the_split_and_hides_b0s_copy_behind_b1s_whole_indexer():
    # (I0 + I1 - I) + (a0 + a1 - a) + max(0, h0 - I1) + max(0, h1 - p - a0) + max(0, d - a1)
    # = (3 + 3 - 4) + (4 + 4 - 6) + max(0, 6 - 3) + max(0, 4 - 2 - 4) + max(0, 7 - 4) = 2 + 2 + 3 + 0 + 3
    assert overlap_overhead_s(LayerOps(**OPS))["dba"] == pytest.approx(10.0)


def test_dual_batch_attention_with_halves_that_really_halve_costs_only_the_stalls():
    # I0 = I1 = 2, a0 = a1 = 3 (the old proportional split): no split cost;
    # max(0, 6 - 2) + max(0, 4 - 2 - 3) + max(0, 7 - 3) = 4 + 0 + 4
    ops = LayerOps(**{**OPS, "indexer_b0": 2.0, "indexer_b1": 2.0, "attn_b0": 3.0, "attn_b1": 3.0})
    assert overlap_overhead_s(ops)["dba"] == pytest.approx(8.0)


def test_arrays_broadcast_per_layer():
    h = np.array([0.0, 5.0, 10.0])                                  # three layers
    out = overlap_overhead_s(LayerOps(**{**OPS, "h2d": h}))
    # da: 1 + 1 + max(0, h - 6) + 2 -> 4, 4, 8; none: h + 7
    assert out["da"] == pytest.approx([4.0, 4.0, 8.0])
    assert out["none"] == pytest.approx([7.0, 12.0, 17.0])


def test_ops_must_be_layer_ops():
    with pytest.raises(TypeError, match="LayerOps"):
        overlap_overhead_s(OPS)


def _costs(**kw):
    """A LayerCosts of one configuration, in microseconds (only what offload_overhead_s reads is meaningful)."""
    us = 1e-6
    base = dict(indexer=5 * us, indexer_split=3 * us, indexer_half=2.5 * us, pre_attn=1 * us, attn=0.0,
                attn_half=0.0, o_proj=1 * us, ffn_dense=0.0, moe=0.0, dispatch=0.0, combine=0.0, merge=0.1 * us,
                attn_fixed=0.5 * us, attn_block=0.01 * us, attn_overhead_blocks=5.0, block_entries=64,
                entries=2048.0, selected=2048.0)
    base.update(kw)
    c = LayerCosts(**{k: np.array(v) if k not in ("attn_overhead_blocks", "block_entries") else v
                      for k, v in base.items()})
    # attention over everything (one launch) and over half the requests, by the class's own rule
    return dataclasses.replace(c, attn=c.attention(2.0, 2048.0), attn_half=c.attention(1.0, 2048.0))


def test_cost_model_feeds_the_formulas_as_stated():
    # b = 2 requests, m = 128 misses each (of 2048 selected), T = 1, 656-B entries, 37 GB/s H2D, 43 GB/s D2H.
    # attention(n, e) = 0.5 + n x 0.01 x (e / 64 + 5) us:
    #   a = 0.5 + 2 x 0.01 x (32 + 5) = 1.24; a_hit (1920 entries) = 0.5 + 0.02 x (30 + 5) = 1.2;
    #   a_miss (128) = 0.5 + 0.02 x (2 + 5) = 0.64; a_half = 0.5 + 0.01 x 37 = 0.87
    # h = 128 x 2 x 656 / 37e9 = 4.53881 us; d = 2 x 656 / 43e9 = 0.0305116 us
    c = _costs()
    assert float(c.attn) == pytest.approx(1.24e-6) and float(c.attn_half) == pytest.approx(0.87e-6)
    out = offload_overhead_s(c, 2.0, np.array([[128.0, 0.0]]), 1.0, 37.0, 43.0, 656)
    h, d = 128 * 2 * 656 / 37e9, 2 * 656 / 43e9
    assert out["none"][0] == pytest.approx([h + d, d])
    # da, 128 misses: (1.2 + 0.64 - 1.24) + 0.1 + max(0, 4.53881 - 1 - 1.2) + max(0, d - 1) = 0.6 + 0.1 + 2.33881
    # da, no misses: a_hit = a, a_miss = 0.5 + 0.02 x 5 = 0.6: still the second launch and the merge, 0.7
    assert out["da"][0] == pytest.approx([3.03881e-6, 0.7e-6], rel=1e-5)
    # dba: (2.5 + 2.5 - 3) + (0.87 + 0.87 - 1.24) + max(0, h/2 - 2.5) + max(0, h/2 - 1 - 0.87) + max(0, d - 0.87)
    # = 2 + 0.5 + 0 (2.2694 < 2.5) + 0.3994 + 0 = 2.89941; no misses: the split alone, 2.5
    assert out["dba"][0] == pytest.approx([2.89941e-6, 2.5e-6], rel=1e-5)


def test_rows_without_offload_cost_nothing_whatever_the_strategy():
    out = offload_overhead_s(_costs(), 2.0, np.array([[128.0, 0.0]]), 1.0, 37.0, 43.0, 656, offload=False)
    for name in ("none", "da", "dba"):
        assert out[name][0] == pytest.approx([0.0, 0.0], abs=0.0)


def test_simulate_adds_both_micro_batches_overheads_to_the_step():
    # the step with offload minus the step without is the sum over layers of 2 x (one micro-batch's overhead)
    m = np.full(61, 300.0)
    r = simulate(64, 32768, 0.2, misses=m, scenario=Scenario(strategy="none", h2d_GB_per_s=37.0, d2h_GB_per_s=43.0,
                                                             mtp=1, accept_ratio=1.0, check_memory=False,
                                                             host_memory_cap=False))
    # none: per micro-batch (b = 32) and layer h + d = 300 x 32 x 656 / 37e9 + 32 x 656 / 43e9
    per_layer = 300 * 32 * 656 / 37e9 + 32 * 656 / 43e9
    assert r.stall_s[0] == pytest.approx(61 * 2 * per_layer, rel=1e-9)
