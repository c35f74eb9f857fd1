"""The cost model on models and GPUs it was not calibrated on, by hand: every operation counted from the other
model's geometry (GLM-5: hidden 6,144, 64 heads, q-LoRA 2,048, qk_nope 192, v 256, 32 indexer heads; DeepSeek-V4-
Flash: a shared 512-wide KV row, a grouped low-rank output projection, FP4 experts, rows of 4 tokens on its C4
layers), and moved to another GPU by its peaks: sparse attention by its whole BF16 peak (its blocks spread over
the GPU's SMs), the top-K by a wave of ``sm_count`` rows; the all-to-all inside an NVLink domain."""
import numpy as np
import pytest

from ess import memory
from ess.sim import Scenario, simulate
from ess.sim.costs import (CostParams, efficiencies, gemm_time_s, layer_costs, lm_head_time_s, memory_time_s,
                           nvlink_all_to_all_GB_per_s, part_batch)
from ess.sim.timeline import offload_overhead_s
from ess.specs import deployment_spec, gpu_spec, model_spec

V32, GLM, V4 = (model_spec(n) for n in ("deepseek-v3.2-exp", "glm-5", "deepseek-v4-flash"))
H200, H800, H20, B200 = (gpu_spec(g) for g in ("H200", "H800", "H20", "B200"))
DEP = deployment_spec("paper-table1")


def test_glm5_operations_are_its_own_gemms():
    """b = 8 requests x MTP 2 = 16 tokens: PreAttn is the norms, q_a (6,144 -> 2,048), kv_a (6,144 -> 576), q_b
    (2,048 -> 64 x 256) and the absorption (64 groups of 192 -> 512); O_proj the value absorption (64 groups of
    512 -> 256) and wo (64 x 256 -> 6,144); the indexer's projections 2,048 -> 32 x 128, 6,144 -> 128, 6,144 -> 32."""
    n, c = 16, layer_costs(GLM, H200, DEP, 8, 32768, 2)
    g = lambda *a, **k: gemm_time_s(*a, gpu=H200, model=GLM, **k)                      # noqa: E731
    norms = memory_time_s(n * 2 * 2 * (2 * 6144 + 2048 + 512), H200)
    pre = norms + g(n, 2048, 6144) + g(n, 576, 6144) + g(n, 64 * 256, 2048) + g(n, 512, 192, groups=64, dtype="bf16")
    assert np.isclose(c.pre_attn, pre, rtol=1e-12)
    o = g(n, 6144, 64 * 256) + g(n, 256, 512, groups=64, dtype="bf16")
    assert np.isclose(c.o_proj, o, rtol=1e-12)
    proj = g(n, 32 * 128, 2048) + g(n, 128, 6144) + g(n, 32, 6144, dtype="bf16")
    assert np.isclose(c.indexer - c.indexer_split, proj, rtol=1e-12)


def test_glm5_scan_has_half_of_v32s_indexer_flops_and_the_same_keys():
    """32 indexer heads instead of 64: the same keys (132 B each) and logits, half the flops. At MTP 4 and 64
    requests the scan is compute-bound on an H200 for V3.2; GLM-5's is not slower than V3.2's."""
    a, b = (layer_costs(m, H200, DEP, 64, 65536, 4, part_batch_variant="off") for m in (V32, GLM))
    assert b.indexer_split <= a.indexer_split
    a1, b1 = (layer_costs(m, H200, DEP, 1, 65536, 1, part_batch_variant="off") for m in (V32, GLM))
    assert np.isclose(a1.indexer_split, b1.indexer_split, rtol=1e-12)          # memory-bound: the same bytes


def test_attention_scales_with_heads_and_head_dims():
    """On one GPU, compute-bound: a block of V4 (64 heads, a 512-wide row as K and V: 512 + 512) costs
    64 / 128 x 1,024 / 1,088 of V3.2's (128 heads, 576 + 512); GLM-5's (64 heads, V3.2's MLA widths) half."""
    a, g, v = (layer_costs(m, H200, DEP, 8, 32768, 2) for m in (V32, GLM, V4))
    assert np.isclose(g.attn_block / a.attn_block, 0.5, rtol=1e-12)
    assert np.isclose(v.attn_block / a.attn_block, 0.5 * 1024 / 1088, rtol=1e-12)


def test_attention_moves_to_another_gpu_by_its_whole_bf16_peak():
    """FlashMLA's blocks spread over the GPU's SMs: its time per block scales with the BF16 peak per SM and the
    blocks with 1 / sm_count, so a compute-bound attention scales with the whole BF16 peak: an H20 (148 TFLOPS, 78
    SMs) is 989 / 148 times an H800 (989, 132 SMs), not 989 / 148 x 132 / 78."""
    a, b = (layer_costs(V32, gpu, DEP, 8, 32768, 2) for gpu in (H800, H20))
    assert np.isclose(b.attn_block / a.attn_block, 989 / 148, rtol=1e-12)
    pb = part_batch()
    assert np.isclose(b.attn_fixed - pb.mla_launch_s, (a.attn_fixed - pb.mla_launch_s) * (989 / 132) / (148 / 78),
                      rtol=1e-12)


def test_blackwell_attention_at_the_measured_b200_point():
    """``attention_transfer="b200-measured"``: a Blackwell GPU's sparse attention priced from FlashMLA's 350 TFLOPS
    on a B200 (148 SMs) instead of its 410 on an H800 (132 SMs) moved by the BF16 peak per SM. The point (batch
    128, s_q 2, 128 heads, top-k 2,048, 576 + 512 dims) takes 2 x 128 x 2 x 128 x 2,048 x 1,088 flops; less the
    4-us launch it is 128 x 2 x 2 x 37 blocks over the point machine's SMs + 5: the time of one block."""
    flops = 2 * 128 * 2 * 128 * 2048 * 1088
    unit = lambda tflops, sm: (flops / (tflops * 1e12) - 4e-6) / (128 * 2 * 2 * 37 / sm + 5)     # noqa: E731
    hop_unit = unit(410, 132) * (989 / 132) / (2250 / 148)           # the H800 block moved to a B200's SM
    meas_unit = unit(350, 148)
    hop = layer_costs(V32, B200, DEP, 8, 32768, 2)
    meas = layer_costs(V32, B200, DEP, 8, 32768, 2, attention_transfer="b200-measured")
    assert np.isclose(meas.attn_block / hop.attn_block, meas_unit / hop_unit, rtol=1e-12)
    assert 2.6 < meas_unit / hop_unit < 2.7                       # about (410 / 989) / (350 / 2,250) = 2.665
    same = layer_costs(V32, H200, DEP, 8, 32768, 2, attention_transfer="b200-measured")
    assert np.isclose(same.attn_block, layer_costs(V32, H200, DEP, 8, 32768, 2).attn_block, rtol=1e-12)


def test_top_k_waves_count_the_gpus_sms():
    """The top-K runs one row per SM: 140 rows (70 requests x MTP 2) are one wave on a B200 (148 SMs), two on an
    H200 (132)."""
    off = dict(part_batch_variant="central")
    t_row = part_batch().topk_latency_s(32768)
    for gpu, waves in ((B200, 1), (H200, 2)):
        c = layer_costs(V32, gpu, DEP, 70, 32768, 2, **off)
        logits = c.indexer_split - waves * t_row
        c2 = layer_costs(V32, gpu, DEP, 70, 32768, 2, part_batch_variant="off")
        assert np.isclose(logits - part_batch().logits_launch_s, c2.indexer_split, rtol=1e-9)


def test_v4_layer_kinds_by_hand():
    """At 32K: a C4 layer's indexer scans 8,192 rows and attention reads 512 selected rows + 128 window tokens; a
    C128 layer has no indexer and reads 256 rows + 128; a window layer reads 128; only the selected rows can miss."""
    sp = layer_costs(V4, H200, DEP, 8, 32768, 2)
    de = layer_costs(V4, H200, DEP, 8, 32768, 2, kind="dense", compress_ratio=128)
    wi = layer_costs(V4, H200, DEP, 8, 32768, 2, kind="window")
    assert (float(sp.entries), float(sp.sparse_entries), float(sp.selected)) == (640, 512, 1024)
    assert (float(de.entries), float(de.selected), float(de.indexer)) == (384, 0, 0)
    assert (float(wi.entries), float(wi.indexer)) == (128, 0)
    off = layer_costs(V4, H200, DEP, 1, 32768, 1, part_batch_variant="off")
    scan = memory_time_s(8192 * (132 + 8.0), H200)                # one request, one query row: keys + fp32 logits
    assert np.isclose(off.indexer_split, scan, rtol=1e-12)


def test_v4_projections_and_fp4_experts_by_hand():
    """No absorption (the row is K and V); the output in 8 groups of 8 heads x 512 -> 1,024, then 8 x 1,024 ->
    4,096; the routed experts read 0.5 + 1 / 32 B per weight (FP4 with a UE8M0 scale per 32)."""
    n, c = 16, layer_costs(V4, H200, DEP, 8, 32768, 2)
    g = lambda *a, **k: gemm_time_s(*a, gpu=H200, model=V4, **k)                     # noqa: E731
    norms = memory_time_s(n * 2 * 2 * (2 * 4096 + 1024 + 448), H200)
    assert np.isclose(c.pre_attn, norms + g(n, 1024, 4096) + g(n, 512, 4096) + g(n, 64 * 512, 1024), rtol=1e-12)
    assert np.isclose(c.o_proj, g(n, 1024, 8 * 512, groups=8) + g(n, 4096, 8 * 1024), rtol=1e-12)
    m_exp = 32 * n * 6 / 256
    ew = 0.5 + 1 / 32
    moe = (g(n, 256, 4096, dtype="bf16") + g(n, 2 * 2048, 4096) + g(n, 4096, 2048)
           + g(m_exp, 2 * 2048, 4096, groups=8, weight_bytes=ew) + g(m_exp, 4096, 2048, groups=8, weight_bytes=ew))
    assert np.isclose(c.moe, moe, rtol=1e-12)


def test_v4_parameter_counts_by_hand():
    p = memory.param_counts(V4)
    attn = (4096 * 1024 + 1024 + 1024 * 64 * 512 + 4096 * 512 + 448 + 64 * 512 * 1024 + 8 * 1024 * 4096 + 2 * 4096)
    assert p["attention"] == attn * 44                                 # 43 layers + the MTP block
    assert p["indexer"] == (1024 * 64 * 128 + 4096 * 128 + 2 * 128 + 4096 * 64) * 21     # C4 layers only
    assert p["routed_experts"] == 3 * 4096 * 2048 * 256 * 44
    routed = p["routed_experts"] / 32
    assert np.isclose(memory.expert_weight_bytes(V4, routed), routed * (0.5 + 1 / 32))
    assert memory.param_counts(V32)["indexer"] == (1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64) * 62


def test_nvlink_all_to_all_by_hand():
    """DeepEP's NVLink figures (726 / 740 GB/s, 8K tokens) times the share a decode batch reaches over RDMA at EP 32
    (48 / 61 dispatch, 53 / 61 combine)."""
    d, c = nvlink_all_to_all_GB_per_s(32)
    assert np.isclose(d, 726 * 48 / 61) and np.isclose(c, 740 * 53 / 61)
    gb = deployment_spec("paper-shape-gb200")
    nv = layer_costs(V32, gpu_spec("GB200"), gb, 8, 32768, 2)
    rd = layer_costs(V32, gpu_spec("GB200"), gb.replace(ep_transport="rdma"), 8, 32768, 2)
    assert np.isclose(rd.dispatch / nv.dispatch, d / 48) and np.isclose(rd.combine / nv.combine, c / 53)


def test_kernel_efficiency_ends_bracket_the_central_points():
    lo, mid, hi = (efficiencies(v) for v in ("low", "central", "high"))
    for a, b, c in ((lo.gemm_mem, mid.gemm_mem, hi.gemm_mem), (lo.gemm_compute, mid.gemm_compute, hi.gemm_compute)):
        assert (a[1] <= b[1]).all() and (b[1] <= c[1]).all()
        assert (a[1] < c[1]).any()                      # the ends are the data's ends, not the central points again
    with pytest.raises(ValueError, match="efficiency"):
        CostParams(efficiency="fast")
    with pytest.raises(ValueError, match="attention_transfer"):
        CostParams(attention_transfer="b100")


def test_v4_step_is_its_layers_by_hand():
    """Without offload V4's step sums its 21 C4 layers, 20 C128 layers and 2 window layers, each max(compute,
    all-to-all) over both micro-batches, plus the heads and one MTP draft through a window-only block; with offload
    only the 21 C4 layers stall (the reference formulas of ess.sim.timeline.offload_overhead_s)."""
    q = CostParams(0.8, 1.1, 40.0)
    sc = Scenario(model="deepseek-v4-flash", params=q, check_memory=False, strategy="da")
    B, L, T = 40, 131072, 2
    kw = q.cost_kw()
    lay = lambda **k: layer_costs(V4, H200, DEP, B / 2, L, T, **kw, **k).scaled(0.8, 1.1)     # noqa: E731
    moe = lambda c: np.maximum(2 * (c.attention_block + c.moe), 2 * (c.dispatch + c.combine))  # noqa: E731
    sp, de, wi = lay(), lay(kind="dense", compress_ratio=128), lay(kind="window")
    r0 = simulate(B, L, 1.0, scenario=sc, mtp=T, accept_ratio=1.7)
    r1 = simulate(B, L, 0.2, misses=np.full(21, 100.0), scenario=sc, mtp=T, accept_ratio=1.7)
    layers0 = 21 * moe(sp) + 20 * moe(de) + 2 * moe(wi)
    c1 = layer_costs(V4, H200, DEP, B / 2, L, 1, kind="window", **kw).scaled(0.8, 1.1)
    # the draft's eh_proj and the heads run on the whole batch (the draft's layer per micro-batch)
    draft = moe(c1) + 0.8 * (gemm_time_s(B, 4096, 8192, H200, model=V4) + lm_head_time_s(B, V4, H200))
    heads = 0.8 * lm_head_time_s(B * T, V4, H200) + (T - 1) * draft
    assert np.isclose(r0.step_s[0], float(layers0 + heads + 0.040), rtol=1e-12)
    over = offload_overhead_s(sp, B / 2, np.full((1, 21), 100.0), T, 37.0, 43.0, 584)["da"][0]
    layers1 = np.sum(np.maximum(2 * (sp.attention_block + sp.moe) + 2 * over, 2 * (sp.dispatch + sp.combine))) \
        + 20 * moe(de) + 2 * moe(wi)
    assert np.isclose(r1.step_s[0] - r1.step_no_offload_s[0], float(layers1 - layers0), rtol=1e-9)
    with pytest.raises(ValueError, match=r"shape \(21,\)"):
        simulate(B, L, 0.2, misses=np.zeros(43), scenario=sc)
