"""The operation cost models: measured points reproduced, rooflines, growth with L and K, bad input."""
import dataclasses

import numpy as np
import pytest

from ess.memory import param_counts, weights_per_gpu_bytes
from ess.specs import resolve
from ess.sim.costs import (CostParams, calibration_data, efficiencies, fp8_weight_bytes_per_param, gemm_time_s,
                           kernel_points, layer_costs)
from ess.specs import gpu_spec, model_spec

H800 = gpu_spec("H800")
MODEL = model_spec("deepseek-v3.2-exp")

# [DG] DeepGEMM README, dense FP8 GEMMs on H800: (M, N, K, TFLOPS)
DEEPGEMM = [(64, 2112, 7168, 206), (64, 24576, 1536, 289), (64, 32768, 512, 219), (64, 7168, 16384, 336),
            (64, 4096, 7168, 287), (64, 7168, 2048, 295), (128, 2112, 7168, 352), (128, 24576, 1536, 535),
            (128, 32768, 512, 358), (128, 7168, 16384, 645), (128, 4096, 7168, 533), (128, 7168, 2048, 510),
            (4096, 4096, 7168, 1304), (4096, 7168, 2048, 1025)]


def test_every_kernel_point_has_a_source():
    kp = kernel_points()
    assert set(kp.sources) >= {"fp8_gemm_bandwidth_GB_per_s", "fp8_gemm_TFLOPS", "sparse_mla_TFLOPS",
                               "ep_dispatch_GB_per_s", "ep_combine_GB_per_s", "memory_bound_GB_per_s"}
    assert all(kp.sources.values())


def test_gemm_model_reproduces_deepgemm_on_h800():
    """Interpolating the per-M mean efficiency reproduces each measured shape; the N = 2112 shape is the worst
    (the README's slowest decode shape, 31 % off); the mean error stays near 10 %."""
    errs = []
    for m, n, k, tflops in DEEPGEMM:
        measured = 2 * m * n * k / (tflops * 1e12)
        errs.append(float(gemm_time_s(m, n, k, H800, model=MODEL)) / measured - 1)
    errs = np.abs(errs)
    assert errs.max() < 0.35, errs
    assert errs.mean() < 0.12, errs


def test_sparse_mla_is_compute_bound_and_scales_with_tokens_and_k():
    """Sparse MLA in MQA mode does 128 heads x K x (576 + 512) x 2 flops per query token on K x 656 B: compute-bound
    from one token on. Without the part-batch terms its time doubles with the query tokens, halves with K, and is
    the same on two GPUs of equal BF16 peak whatever their HBM bandwidth (H800, H200); with them, a fixed part per
    launch and per request stays, so doubling the batch less than doubles it and halving K less than halves it."""
    model, dep, *_ = resolve("deepseek-v3.2-exp", "paper-table1", None, None)
    h200 = gpu_spec("H200")
    half_k = dataclasses.replace(model, index_topk=model.index_topk // 2)
    for b in (1, 128):
        off = dict(part_batch_variant="off")
        a = float(layer_costs(model, H800, dep, b, 32768, 2, **off).attn)
        assert float(layer_costs(model, H800, dep, 2 * b, 32768, 2, **off).attn) == pytest.approx(2 * a)
        assert float(layer_costs(model, H800, dep, b, 32768, 4, **off).attn) == pytest.approx(2 * a)
        assert float(layer_costs(half_k, H800, dep, b, 32768, 2, **off).attn) == pytest.approx(a / 2)
        assert float(layer_costs(model, h200, dep, b, 32768, 2, **off).attn) == pytest.approx(a)
        a = float(layer_costs(model, H800, dep, b, 32768, 2).attn)
        assert a < float(layer_costs(model, H800, dep, 2 * b, 32768, 2).attn) < 2 * a
        assert a / 2 < float(layer_costs(half_k, H800, dep, b, 32768, 2).attn) < a
        assert float(layer_costs(model, h200, dep, b, 32768, 2).attn) == pytest.approx(a)


def test_fp8_weight_bytes_agree_with_the_memory_model():
    """The cost model's FP8 bytes per parameter and the memory model's weight bytes per GPU are computed separately
    (the lead is asked to expose one helper in ess.memory); they must agree, and a finer scale block costs more."""
    dep = resolve(MODEL, "paper-table1", None, None)[1]
    p = param_counts(MODEL)
    fp8_params = (p["attention"] + p["indexer"] + p["dense_ffn"] + p["mtp"] + p["shared_experts"] + p["router"]
                  + p["routed_experts"] / dep.ep)
    emb = p["embeddings"] * MODEL.embedding_bytes_per_param
    assert fp8_params * fp8_weight_bytes_per_param(MODEL) + emb == pytest.approx(weights_per_gpu_bytes(MODEL, dep))
    fine = dataclasses.replace(MODEL, weight_scale_block=32)
    assert fp8_weight_bytes_per_param(fine) > fp8_weight_bytes_per_param(MODEL)
    assert gemm_time_s(1, 7168, 2048, H800, model=fine) > gemm_time_s(1, 7168, 2048, H800, model=MODEL)


def test_dispatch_reproduces_deepep_point():
    model, dep, *_ = resolve("deepseek-v3.2-exp", "paper-table1", None, None)
    c = layer_costs(model, H800, dep, 64, 32768, 2)           # 128 tokens per batch, EP 32
    assert float(c.dispatch) * 1e6 == pytest.approx(155, rel=0.05)
    assert float(c.combine) * 1e6 == pytest.approx(273, rel=0.05)


def test_gemm_time_grows_with_m_and_is_memory_bound_when_small():
    g = gpu_spec("H200")
    t = gemm_time_s(np.array([1, 8, 64, 256, 1024, 4096, 16384]), 7168, 2048, g, model=MODEL)
    assert np.all(np.diff(t) >= 0)
    assert t[1] == pytest.approx(t[0], rel=0.01)              # weights dominate at tiny M


def test_indexer_grows_with_context_and_attention_stops_growing_at_k():
    model, dep, gpu, _ = resolve("deepseek-v3.2-exp", "paper-table1", None, None)
    L = np.array([1024, 2048, 8192, 32768, 131072])
    c = layer_costs(model, gpu, dep, 26, L, 2)
    assert np.all(np.diff(c.indexer) > 0)
    assert c.attn[0] < c.attn[1]
    assert c.attn[1] == pytest.approx(c.attn[-1])
    assert c.indexer[-1] / c.indexer[-2] > 3                   # the key scan dominates at long context


def test_bf16_is_slower_than_fp8_and_a100_has_no_fp8():
    g = gpu_spec("H200")
    assert (gemm_time_s(64, 7168, 2048, g, model=MODEL, dtype="bf16")
            > gemm_time_s(64, 7168, 2048, g, model=MODEL, dtype="fp8"))
    a100 = gpu_spec("A100-80G")
    assert gemm_time_s(8192, 7168, 2048, a100, model=MODEL) > gemm_time_s(8192, 7168, 2048, g, model=MODEL)


def test_efficiencies_are_fractions():
    e = efficiencies()
    for arr in (e.gemm_mem[1], e.gemm_compute[1]):
        assert np.all((arr > 0) & (arr < 1))
    assert 0 < e.memory_bound < 1


@pytest.mark.parametrize("kw", [{"compute_scale": 0}, {"comm_scale": -1}, {"fixed_ms": -0.1},
                                {"compute_scale": float("nan")}])
def test_cost_params_reject_bad_values(kw):
    with pytest.raises(ValueError):
        CostParams(**kw)


def test_gemm_rejects_unknown_dtype():
    with pytest.raises(ValueError, match="dtype"):
        gemm_time_s(1, 2, 3, H800, model=MODEL, dtype="int4")


def test_gemm_needs_a_model():
    with pytest.raises(TypeError, match="model"):
        gemm_time_s(1, 2, 3, H800, model="deepseek-v3.2-exp")


def test_calibration_data_loader():
    assert "gpu_power_W" in calibration_data("deployment_assumptions")
    with pytest.raises(ValueError, match="unknown calibration file"):
        calibration_data("nope")


def test_two_expert_parallel_gpus_already_exchange_tokens():
    """The all-to-all runs from EP 2 on (a mistake counting it from EP 3 would give two GPUs a free exchange); one
    GPU (EP 1) exchanges nothing."""
    model, dep, gpu, _ = resolve("deepseek-v3.2-exp", "paper-table1", None, None)
    one, two = (layer_costs(model, gpu, dataclasses.replace(dep, ep=ep), 16, 32768, 2) for ep in (1, 2))
    assert float(np.sum(one.dispatch)) == 0 and float(np.sum(one.combine)) == 0
    assert float(np.min(two.dispatch)) > 0 and float(np.min(two.combine)) > 0
