"""The cost model's bytes and flops, computed by hand from DeepSeek-V3.2-Exp's geometry (data/models/
deepseek-v3.2-exp.yaml: hidden 7,168, 128 heads, q-LoRA 1,536, kv-LoRA 512, rope 64, nope 128, v 128, 64 indexer heads
of 128 dims, top-k 2,048, 256 routed experts of 2,048, 8 active, FP8 weights with one fp32 scale per 128 x 128) and
the measured points (data/calibration/kernel_points.yaml, on an H800: 3,350 GB/s HBM, 989 BF16 / 1,979 FP8 TFLOPS).

Attainable rates on an H200 (data/hardware/gpus.yaml: 4,800 GB/s, 989 BF16 / 1,979 FP8 TFLOPS):
* streaming kernels: 3,000 / 3,350 of HBM (FlashMLA's memory-bound point) = 4,800 x 0.89552 = 4,298.5 GB/s;
* FP8 GEMM below M = 512: 978 / 1,979 of the FP8 peak (DeepGEMM's M = 512 point, clamped) = 978 TFLOPS;
* sparse MLA: FlashMLA's sparse decode point (410 TFLOPS on an H800 at batch 128, s_q 2, 128 heads, top-k 2,048) cut
  into its scheduler's blocks (data/calibration/part_batch.yaml), on a GPU of the same BF16 peak;
* EP 32 all-to-all: dispatch 48 GB/s, combine 53 GB/s (DeepEP's low-latency table).

Part batches (data/calibration/part_batch.yaml, central): the logits kernel's launch 8 us, the top-K's row latency 13 /
16 / 38 us at 4K / 16K / 64K (one wave per 132 rows on Hopper), sparse MLA's launch 4 us and 5 overhead blocks per
request and per SM part, the merge's launch 3 us."""
import dataclasses

import numpy as np
import pytest

from ess.sim.costs import (CostParams, LayerCosts, gemm_time_s, layer_costs, lm_head_time_s, memory_time_s,
                           part_batch)
from ess.specs import deployment_spec, gpu_spec, model_spec

M = model_spec("deepseek-v3.2-exp")
H200, H800 = gpu_spec("H200"), gpu_spec("H800")
DEP = deployment_spec("paper-table1")                   # EP 32, FP8 cache
STREAM = 4800e9 * 3000 / 3350                           # B/s
FP8_GEMM = 978e12                                       # flop/s below M = 512
MLA = 410e12                                            # flop/s at FlashMLA's measured point
US = 1e-6
# FlashMLA's point: 2 x 128 x 2 x 128 x 2,048 x 1,088 flops / 410 TFLOPS = 356.168 us, counted as 128 requests x 2
# tokens x 2 head groups x (2,048 / 64 + 5) blocks / 132 SMs + 5 = 148.515 blocks after the 4-us launch:
T_POINT = 2 * 128 * 2 * 128 * 2048 * 1088 / MLA
UNIT = (T_POINT - 4 * US) / (128 * 2 * 2 * 37 / 132 + 5)       # 2.37126 us per block on an H800 (and an H200)


def test_indexer_key_scan_reads_132_bytes_per_key_and_writes_fp32_logits():
    """One request, one query token (mtp 1), without the part-batch terms: each cached token costs a 132-B FP8 key
    (128 values + a 4-B scale) and a 4-B fp32 logit written then read back: 140 B. Going from 64K to 128K adds
    65,536 x 140 = 9,175,040 B, read at 4,298.5 GB/s = 2.1345 us; the scan's flops (2 x 64 heads x 128 dims = 16,384
    per key, 1.07 Gflop, 1.10 us at 978 TFLOPS) are below it, so the scan is memory-bound and the difference is all
    bytes."""
    off = dict(part_batch_variant="off")
    d = (layer_costs(M, H200, DEP, 1, 131072, 1, **off).indexer - layer_costs(M, H200, DEP, 1, 65536, 1, **off).indexer)
    assert float(d) == pytest.approx(65536 * 140 / STREAM, rel=1e-9)
    assert float(d) * 1e6 == pytest.approx(2.1345, abs=1e-4)


def test_indexer_key_scan_becomes_compute_bound_with_four_query_tokens():
    """mtp 4: per key 132 B + 4 x 8 B = 164 B (0.0382 ns) but 4 x 16,384 = 65,536 flops (0.0670 ns at 978
    TFLOPS, M = 64 heads x 4 = 256 < 512): 65,536 more keys add 65,536 x 65,536 flops / 978 TFLOPS = 4.3916 us."""
    off = dict(part_batch_variant="off")
    d = (layer_costs(M, H200, DEP, 1, 131072, 4, **off).indexer - layer_costs(M, H200, DEP, 1, 65536, 4, **off).indexer)
    assert float(d) == pytest.approx(65536 * 65536 / FP8_GEMM, rel=1e-9)


def test_the_top_k_costs_one_row_latency_per_wave_of_132_rows():
    """The indexer with the part-batch terms minus without: the logits kernel's launch (8 us) and the top-K, one
    row's latency per wave of 132 rows. At 32K the row latency is 16 + (32,768 - 16,384) / 49,152 x 22 = 23.333 us
    (between the 16K and 64K points); at 128K 38 + 65,536 x 22 / 49,152 = 67.333 us (the last segment extended).
    64 requests x 2 tokens = 128 rows: one wave; 80 x 2 = 160 rows: two; half of 80 (40 x 2 = 80 rows): one."""
    def extra(b, L, mtp=2):
        return float(layer_costs(M, H200, DEP, b, L, mtp).indexer
                     - layer_costs(M, H200, DEP, b, L, mtp, part_batch_variant="off").indexer) / US
    assert extra(64, 32768) == pytest.approx(8 + 23.3333, abs=1e-3)
    assert extra(80, 32768) == pytest.approx(8 + 2 * 23.3333, abs=1e-3)
    assert extra(64, 131072) == pytest.approx(8 + 67.3333, abs=1e-3)
    c = layer_costs(M, H200, DEP, 80, 32768, 2)
    off = layer_costs(M, H200, DEP, 80, 32768, 2, part_batch_variant="off")
    # the split part (logits + top-K) on half the micro-batch: half the scan bytes, one launch, one wave
    assert float(c.indexer_half - off.indexer_half) / US == pytest.approx(8 + 23.3333, abs=1e-3)
    assert float(off.indexer_half) == pytest.approx(float(off.indexer_split) / 2, rel=1e-12)
    # on an H20 (78 SMs) 80 rows take two waves
    h20 = gpu_spec("H20")
    assert float(layer_costs(M, h20, DEP, 40, 32768, 2).indexer
                 - layer_costs(M, h20, DEP, 40, 32768, 2, part_batch_variant="off").indexer) / US == \
        pytest.approx(8 + 2 * 23.3333, abs=1e-3)


def test_sparse_attention_is_counted_in_flashmla_blocks_by_hand():
    """A micro-batch of 64 requests x 2 tokens, 128 heads (two groups of 64), each token over 2,048 entries (32
    blocks of 64): per request 2 x 2 x (32 + 5) / 132 SMs = 1.12121 block-times of 2.37126 us = 2.65868 us (the
    memory floor, 2 x 64 x 656 B per block at 4,298.5 GB/s = 0.0195 us per block, is 3.7 x below). Fixed: the 4-us
    launch + 5 blocks per SM part = 15.856 us. So attn(64) = 15.856 + 64 x 2.65868 = 186.012 us, attn on half the
    micro-batch 15.856 + 32 x 2.65868 = 100.934 us: a half keeps 0.54 of the whole."""
    c = layer_costs(M, H200, DEP, 64, 32768, 2)
    per_request = UNIT * 2 * 2 * 37 / 132
    fixed = 4 * US + 5 * UNIT
    assert float(c.attn) == pytest.approx(fixed + 64 * per_request, rel=1e-9)
    assert float(c.attn) / US == pytest.approx(186.012, abs=1e-3)
    assert float(c.attn_half) / US == pytest.approx(100.934, abs=1e-3)
    # DA's launches split the entries, each paying the fixed part and the 5 overhead blocks per request:
    # 1,920 hits + 128 misses -> (15.856 + 64 x 0.0718553 x 35) + (15.856 + 64 x 0.0718553 x 7) = 224.86 us
    blk = UNIT * 2 * 2 / 132
    assert float(c.attention(64, 1920) + c.attention(64, 128)) == pytest.approx(
        2 * fixed + 64 * blk * (30 + 5 + 2 + 5), rel=1e-9)
    assert float(c.attention(64, 1920) + c.attention(64, 128)) / US == pytest.approx(224.86, abs=1e-2)
    # past K the attention stops growing: 32K and 128K cost the same; below K (1,024 entries, 16 blocks) less
    assert float(layer_costs(M, H200, DEP, 64, 131072, 2).attn) == pytest.approx(float(c.attn), rel=1e-12)
    assert float(layer_costs(M, H200, DEP, 64, 1024, 2).attn) == pytest.approx(fixed + 64 * blk * 21, rel=1e-9)
    assert int(c.selected) == 2 * 2048 and int(c.entries) == 2048
    # the measured point itself: 128 requests, s_q 2, on an H800 (same BF16 peak) come back at 410 TFLOPS
    assert float(layer_costs(M, H800, DEP, 128, 32768, 2).attn) == pytest.approx(T_POINT, rel=1e-9)


def test_dual_attention_merge_reads_two_partials_and_writes_one():
    """128 query tokens x 128 heads x 512 values x 2 B (bf16), three times (read two partial outputs, write one):
    50,331,648 B at 4,298.5 GB/s = 11.709 us, plus the 3-us launch."""
    c = layer_costs(M, H200, DEP, 64, 32768, 2)
    assert float(c.merge) == pytest.approx(3 * US + 128 * 3 * 128 * 512 * 2 / STREAM, rel=1e-9)
    assert float(c.merge) * 1e6 == pytest.approx(14.709, abs=1e-3)


def test_all_to_all_bytes_by_hand():
    """128 tokens, each sent to 8 experts: FP8 dispatch carries 7,168 values + 7,168 / 128 fp32 scales = 7,392 B,
    BF16 combine 14,336 B: 7,569,408 B at 48 GB/s = 157.696 us and 14,680,064 B at 53 GB/s = 276.982 us."""
    c = layer_costs(M, H200, DEP, 64, 32768, 2)
    assert float(c.dispatch) * 1e6 == pytest.approx(128 * 8 * 7392 / 48e9 * 1e6, rel=1e-9)
    assert float(c.combine) * 1e6 == pytest.approx(128 * 8 * 14336 / 53e9 * 1e6, rel=1e-9)
    one_gpu = DEP.replace(ep=1, nodes=1, gpus_per_node=1)
    assert float(layer_costs(M, H200, one_gpu, 64, 32768, 2).dispatch) == 0.0     # no expert parallelism


def test_fp8_gemm_by_hand():
    """DeepGEMM's decode shape M = 64, N = 2,112, K = 7,168 on an H800: weights 2,112 x 7,168 x (1 + 4 / 16,384)
    B (FP8 plus one fp32 scale per 128 x 128 block) = 15,142,605.6 B, activations 64 x 7,168 x 1 B = 458,752 B,
    bf16 output 64 x 2,112 x 2 B = 270,336 B; 15,871,693.6 B at the M = 64 point (2,291 GB/s) = 6.9278 us; flops
    2 x 64 x 2,112 x 7,168 = 1.94 Gflop (1.98 us at 978 TFLOPS) are below it."""
    nbytes = 2112 * 7168 * (1 + 4 / 16384) + 64 * 7168 + 64 * 2112 * 2
    assert float(gemm_time_s(64, 2112, 7168, H800, model=M)) == pytest.approx(nbytes / 2291e9, rel=1e-9)
    # BF16 weights: 2 B per weight and per activation value -> 2 x 15,138,816 + 2 x 458,752 + 270,336 B
    bf16 = 2 * 2112 * 7168 + 2 * 64 * 7168 + 64 * 2112 * 2
    assert float(gemm_time_s(64, 2112, 7168, H800, model=M, dtype="bf16")) == pytest.approx(bf16 / 2291e9, rel=1e-9)
    # compute-bound at M = 4,096: 2 x 4,096 x 7,168 x 2,048 flops at the M = 4,096 point (1,054 TFLOPS)
    assert float(gemm_time_s(4096, 7168, 2048, H800, model=M)) == pytest.approx(2 * 4096 * 7168 * 2048 / 1054e12,
                                                                                rel=1e-9)


def gemm(m, n, k, **kw):
    return float(gemm_time_s(m, n, k, H200, model=M, **kw))


def test_each_operation_is_the_gemms_of_the_architecture():
    """The GEMMs of one layer for n = 128 tokens, by their shapes in DeepSeek's model.py (MLA with absorbed
    q_nope and value projections, the indexer's projections, FP8 except the bmm's and the router)."""
    n = 128
    c = layer_costs(M, H200, DEP, 64, 32768, 2)
    # PreAttn: four bf16 norm passes (read + write 2 B each) over 2 x 7,168 + 1,536 + 512 = 16,384 values per
    # token; wq_a 7,168 -> 1,536; wkv_a 7,168 -> 576; wq_b 1,536 -> 128 x 192; q_nope absorbed per head 128 -> 512
    pre = (float(memory_time_s(n * 2 * 2 * 16384, H200)) + gemm(n, 1536, 7168) + gemm(n, 576, 7168)
           + gemm(n, 128 * 192, 1536) + gemm(n, 512, 128, groups=128, dtype="bf16"))
    assert float(c.pre_attn) == pytest.approx(pre, rel=1e-12)
    # O_proj: values absorbed per head 512 -> 128 (bf16 bmm), wo 128 x 128 -> 7,168
    assert float(c.o_proj) == pytest.approx(gemm(n, 128, 512, groups=128, dtype="bf16") + gemm(n, 7168, 128 * 128),
                                            rel=1e-12)
    # dense FFN: gate and up fused 7,168 -> 2 x 18,432, down 18,432 -> 7,168
    assert float(c.ffn_dense) == pytest.approx(gemm(n, 2 * 18432, 7168) + gemm(n, 7168, 18432), rel=1e-12)
    # MoE: bf16 router 7,168 -> 256; one shared expert; 256 / 32 = 8 local experts, each receiving
    # 32 GPUs x 128 tokens x 8 / 256 = 128 tokens
    moe = (gemm(n, 256, 7168, dtype="bf16") + gemm(n, 2 * 2048, 7168) + gemm(n, 7168, 2048)
           + gemm(128, 2 * 2048, 7168, groups=8) + gemm(128, 7168, 2048, groups=8))
    assert float(c.moe) == pytest.approx(moe, rel=1e-12)
    # indexer projections: wq 1,536 -> 64 x 128, wk 7,168 -> 128, head weights 7,168 -> 64 (bf16), then the scan
    # (plus its 8-us launch) and the top-K (one wave of 128 rows at 32K: 23.333 us)
    proj = gemm(n, 64 * 128, 1536) + gemm(n, 128, 7168) + gemm(n, 64, 7168, dtype="bf16")
    scan = max((64 * 32768 * 132 + n * 32768 * 8) / STREAM, 2 * n * 64 * 128 * 32768 / FP8_GEMM)
    topk = (16 + 16384 / 49152 * 22) * US
    assert float(c.indexer) == pytest.approx(proj + 8 * US + scan + topk, rel=1e-12)
    assert float(c.indexer_split) == pytest.approx(8 * US + scan + topk, rel=1e-12)


def test_output_head_is_a_bf16_gemm_over_the_vocabulary():
    """8 rows x 7,168 -> 129,280 in bf16: weights 2 x 926,679,040 B dominate; 565.26 us on an H200 at the M = 64
    point (2,291 / 3,350 of 4,800 GB/s)."""
    bw = 4800e9 * 2291 / 3350
    nbytes = 2 * 7168 * 129280 + 2 * 8 * 7168 + 2 * 8 * 129280
    assert float(lm_head_time_s(8, M, H200)) == pytest.approx(nbytes / bw, rel=1e-9)


@pytest.mark.parametrize("call,err,match", [
    (lambda: layer_costs(M, H200, DEP, -4, 32768, 2), ValueError, "micro_batch must be finite and > 0"),
    (lambda: layer_costs(M, H200, DEP, 4, float("nan"), 2), ValueError, "context_len must be finite"),
    (lambda: layer_costs(M, H200, DEP, 4, 32768, 0), ValueError, "mtp must be finite and > 0"),
    (lambda: layer_costs(M, H200, DEP, 4, 32768, 1.5), ValueError, "mtp must hold whole numbers"),
    (lambda: layer_costs(M, "H200", DEP, 4, 32768, 2), TypeError, "gpu must be a GPUSpec"),
    (lambda: memory_time_s(-1e9, H200), ValueError, "nbytes must be >= 0"),
    (lambda: memory_time_s("1e9", H200), TypeError, "nbytes must be a number"),
    (lambda: gemm_time_s(-1, 10, 10, H200, model=M), ValueError, "m must be >= 0"),
    (lambda: gemm_time_s(1, 10.5, 10, H200, model=M), TypeError, "n must be an integer"),
    (lambda: gemm_time_s(1, 10, 10, H200, model=M, groups=0), ValueError, "groups must be a positive integer"),
    (lambda: lm_head_time_s(-5, M, H200), ValueError, "tokens must be >= 0"),
])
def test_negative_or_meaningless_sizes_are_refused(call, err, match):
    with pytest.raises(err, match=match):
        call()
    assert np.isfinite(float(memory_time_s(0, H200)))          # zero bytes is a valid (free) kernel


def test_the_attention_block_and_the_scales_by_hand():
    """Indexer 1 + PreAttn 2 + Attn 3 + O_proj 4 = an attention block of 10; a compute scale of 2 doubles every
    compute kernel (merge 0.5 -> 1, the attention's fixed part 0.25 -> 0.5 and block 0.01 -> 0.02), a communication
    scale of 0.5 halves dispatch 7 and combine 8; counts (entries, selected) stay."""
    v = dict(indexer=1.0, indexer_split=0.75, indexer_half=0.5, pre_attn=2.0, attn=3.0, attn_half=1.75, o_proj=4.0,
             ffn_dense=10.0, moe=20.0, dispatch=7.0, combine=8.0, merge=0.5, attn_fixed=0.25, attn_block=0.01,
             entries=2048.0, selected=4096.0)
    c = LayerCosts(**{k: np.array(x) for k, x in v.items()}, attn_overhead_blocks=5.0, block_entries=64)
    assert float(c.attention_block) == 10.0
    # one launch over 3 requests of 640 entries: 0.25 + 3 x 0.01 x (640 / 64 + 5) = 0.7
    assert float(c.attention(3, 640)) == pytest.approx(0.7)
    s = c.scaled(2.0, 0.5)
    compute = ("indexer", "indexer_split", "indexer_half", "pre_attn", "attn", "attn_half", "o_proj", "ffn_dense",
               "moe", "merge", "attn_fixed", "attn_block")
    assert [float(getattr(s, f)) for f in compute] == [2 * v[f] for f in compute]
    assert (float(s.dispatch), float(s.combine)) == (3.5, 4.0)
    assert (float(s.entries), float(s.selected), s.attn_overhead_blocks, s.block_entries) == (2048.0, 4096.0, 5.0, 64)


def test_cost_params_name_what_they_were_fitted_on():
    with pytest.raises(TypeError, match="fitted_on must be a string"):
        CostParams(fitted_on=3)


def test_the_default_parameters_are_the_unfitted_model():
    """CostParams() leaves every kernel as the cost model prices it (scales 1) and adds no fixed time."""
    c = layer_costs(M, H200, DEP, 26, 32768, 2)
    p = CostParams()
    s = c.scaled(p.compute_scale, p.comm_scale)
    for f in ("indexer", "attn", "attn_fixed", "moe", "dispatch", "combine"):
        assert float(getattr(s, f)) == float(getattr(c, f)), f
    assert p.fixed_ms == 0.0 and p.part_batch == "central"


def test_the_top_k_latency_below_the_first_point_follows_the_first_segment():
    """Below 4K the row latency extends the 4K -> 16K segment (13 -> 16 us): at 2,048 columns
    13 - 2,048 x 3 / 12,288 = 12.5 us; never below zero."""
    pb = part_batch()
    assert float(pb.topk_latency_s(2048)) / US == pytest.approx(12.5)
    assert float(pb.topk_latency_s(1)) / US == pytest.approx(13 - 4095 * 3 / 12288)
    assert float(pb.topk_latency_s(16384)) / US == pytest.approx(16.0)


def test_sparse_attention_is_memory_bound_on_a_slow_memory():
    """On a GPU whose HBM moves 100 GB/s (an H200 with slow memory), a block of 64 entries x 2 query tokens x 656 B
    takes 83,968 B / (100 GB/s x 3,000 / 3,350) = 0.93764 us per request, more than its compute (0.0718553 us):
    the memory floor binds."""
    slow = dataclasses.replace(H200, hbm_bandwidth_GB_per_s=100.0)
    c = layer_costs(M, slow, DEP, 64, 32768, 2)
    per_block = 2 * 64 * 656 / (100e9 * 3000 / 3350)
    assert float(c.attn_block) == pytest.approx(per_block, rel=1e-9)
    assert float(c.attn_block) / US == pytest.approx(0.93764, abs=1e-5)
