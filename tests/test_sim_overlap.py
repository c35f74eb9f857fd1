"""The overlap formulas (none / DA / DBA) pinned by worked examples computed by hand, so that a wrong edit of any
term fails here: the one implementation in ess.sim.timeline.overlap_overhead_s, and the cost model's way into it."""
from types import SimpleNamespace

import numpy as np
import pytest

from ess.sim import Scenario
from ess.sim.timeline import LayerOps, offload_overhead_s, overlap_overhead_s, simulate

# milliseconds, to keep the arithmetic readable: I 4, p 2, a 6, a_hit 3, o 5, merge 1, h 10, d 7
OPS = dict(indexer=4.0, pre_attn=2.0, attn=6.0, attn_hit=3.0, o_proj=5.0, merge=1.0, h2d=10.0, d2h=7.0)


def test_none_is_the_two_copies_in_series():
    # h + d = 10 + 7
    assert overlap_overhead_s(LayerOps(**OPS))["none"] == pytest.approx(17.0)


def test_dual_attention_hides_the_copy_behind_pre_attention_and_the_hits():
    # max(0, h - p - a_hit) + merge + max(0, d - o) = max(0, 10 - 2 - 3) + 1 + max(0, 7 - 5) = 5 + 1 + 2
    assert overlap_overhead_s(LayerOps(**OPS))["da"] == pytest.approx(8.0)


def test_dual_attention_hides_everything_when_the_copies_are_short():
    # h = 4 <= p + a_hit = 5 and d = 3 <= o = 5: only the merge is left
    ops = LayerOps(**{**OPS, "h2d": 4.0, "d2h": 3.0})
    assert overlap_overhead_s(ops)["da"] == pytest.approx(1.0)


def test_dual_batch_attention_with_even_halves():
    # I1 = I/2 = 2, h0 = h1 = h/2 = 5, a0 = a1 = a/2 = 3:
    # max(0, h0 - I1) + max(0, h1 - p - a0) + max(0, d - a1) = max(0, 5 - 2) + max(0, 5 - 2 - 3) + max(0, 7 - 3)
    # = 3 + 0 + 4
    assert overlap_overhead_s(LayerOps(**OPS))["dba"] == pytest.approx(7.0)


def test_dual_batch_attention_with_uneven_halves():
    # I1 3, a0 2, a1 4, h0 6, h1 4: max(0, 6 - 3) + max(0, 4 - 2 - 2) + max(0, 7 - 4) = 3 + 0 + 3
    ops = LayerOps(**OPS, indexer_b1=3.0, attn_b0=2.0, attn_b1=4.0, h2d_b0=6.0, h2d_b1=4.0)
    assert overlap_overhead_s(ops)["dba"] == pytest.approx(6.0)


def test_arrays_broadcast_per_layer():
    h = np.array([0.0, 5.0, 10.0])                                  # three layers
    out = overlap_overhead_s(LayerOps(**{**OPS, "h2d": h}))
    # da: max(0, h - 5) + 1 + 2 -> 3, 3, 8; none: h + 7
    assert out["da"] == pytest.approx([3.0, 3.0, 8.0])
    assert out["none"] == pytest.approx([7.0, 12.0, 17.0])


def test_ops_must_be_layer_ops():
    with pytest.raises(TypeError, match="LayerOps"):
        overlap_overhead_s(OPS)


def test_cost_model_feeds_the_formulas_as_stated():
    # b = 2 requests, m = 100 misses each, T = 1, 656-B entries, 37 GB/s H2D, 43 GB/s D2H:
    # h = 100 x 2 x 656 / 37e9 = 3.54595e-6 s; d = 2 x 656 / 43e9 = 3.05116e-8 s
    # Attn_hit = 2e-6 x (1 - 100 / 2048) = 1.90234e-6 s
    costs = SimpleNamespace(indexer=3e-6, pre_attn=1e-6, attn=2e-6, o_proj=1e-6, merge=0.1e-6, selected=2048.0)
    out = offload_overhead_s(costs, 2.0, np.array([[100.0, 0.0]]), 1.0, 37.0, 43.0, 656)
    h, d = 100 * 2 * 656 / 37e9, 2 * 656 / 43e9
    assert out["none"][0] == pytest.approx([h + d, d])
    # da: max(0, 3.54595e-6 - 1e-6 - 1.90234e-6) + 0.1e-6 + max(0, d - 1e-6) = 0.64361e-6 + 0.1e-6;
    # no misses: no merge, d hidden
    assert out["da"][0] == pytest.approx([0.74361e-6, 0.0], rel=1e-4, abs=1e-15)
    # dba: max(0, h/2 - 1.5e-6) + max(0, h/2 - 1e-6 - 1e-6) + max(0, d - 1e-6) = 0.27297e-6 + 0 + 0
    assert out["dba"][0] == pytest.approx([0.27297e-6, 0.0], rel=1e-4, abs=1e-15)


def test_simulate_adds_both_micro_batches_overheads_to_the_step():
    # the step with offload minus the step without is the sum over layers of 2 x (one micro-batch's overhead)
    m = np.full(61, 300.0)
    r = simulate(64, 32768, 0.2, misses=m, scenario=Scenario(strategy="none", h2d_GB_per_s=37.0, d2h_GB_per_s=43.0,
                                                             mtp=1, accept_ratio=1.0, check_memory=False,
                                                             host_memory_cap=False))
    # none: per micro-batch (b = 32) and layer h + d = 300 x 32 x 656 / 37e9 + 32 x 656 / 43e9
    per_layer = 300 * 32 * 656 / 37e9 + 32 * 656 / 43e9
    assert r.stall_s[0] == pytest.approx(61 * 2 * per_layer, rel=1e-9)
