"""Operation cost models for one decode step of DeepSeek-V3.2-Exp on one GPU (attention data-parallel, experts split
over ``ep`` GPUs), as rooflines with efficiencies interpolated over measured kernel points.

Every operation is priced as ``max(bytes / (HBM bandwidth x eta_mem), flops / (peak x eta_compute))``; the
efficiencies ``eta`` come from kernel measurements published by the kernel authors on an H800
(``data/calibration/kernel_points.yaml``: DeepGEMM FP8 GEMMs, FlashMLA sparse decode, DeepEP low-latency all-to-all),
turned into fractions of the H800's peaks and linearly interpolated over the GEMM's M (tokens). The simulated GPU's
own peaks (``data/hardware/gpus.yaml``) are multiplied by those fractions (assumption: same Hopper SM design).

Costs are computed **per micro-batch** of ``b`` requests (Two-Batch Overlap splits the batch in two), each request
carrying ``mtp`` query tokens per step (MTP: 1 verified token + mtp-1 drafts), so a micro-batch has ``n = b x mtp``
tokens. Everything is vectorised: ``b``, ``context_len`` and ``mtp`` may be numpy arrays that broadcast together.

Glossary: B batch per GPU, b = B/2 micro-batch, mtp query tokens per request per step, L context length, K top-k.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import yaml

from ..layout import indexer_entry_bytes, latent_entry_bytes
from ..memory import fp8_weight_bytes
from ..specs import DATA_DIR, DeploymentSpec, GPUSpec, ModelSpec, gpu_spec
from ..validate import number_array, positive_int, real

__all__ = ["KernelPoints", "kernel_points", "calibration_data", "CostParams", "Efficiencies", "efficiencies",
           "fp8_weight_bytes_per_param", "gemm_time_s", "memory_time_s", "LayerCosts", "layer_costs", "lm_head_time_s"]

# float32: the format of the per-block scales of FP8 weights and FP8 activations ([DS] model.py; DeepEP FP8 dispatch)
_SCALE_BYTES = np.dtype(np.float32).itemsize


@functools.lru_cache(maxsize=None)
def calibration_data(name: str) -> dict:
    """The entries of ``data/calibration/<name>.yaml`` (``kernel_points``, ``deployment_assumptions``), each
    ``{value: ..., source: ...}``; raises ``ValueError`` for an unknown name or an entry without a value and a
    source."""
    folder = DATA_DIR / "calibration"
    allowed = sorted(p.stem for p in folder.glob("*.yaml"))
    if name not in allowed:
        raise ValueError(f"unknown calibration file {name!r}; allowed: {', '.join(allowed)}")
    raw = yaml.safe_load((folder / f"{name}.yaml").read_text(encoding="utf-8"))
    for key, entry in raw.items():
        if not isinstance(entry, Mapping) or "value" not in entry or not entry.get("source"):
            raise ValueError(f"data/calibration/{name}.yaml: {key!r} needs value and source")
    return raw


def fp8_weight_bytes_per_param(model: ModelSpec) -> float:
    """Bytes per FP8 weight including its share of the block scales: ``weight_bytes_per_param`` plus one float32
    scale per ``weight_scale_block`` x ``weight_scale_block`` block ([DS] weight_block_size). The same rule as
    ``ess.memory``'s weight bytes, which it calls."""
    return fp8_weight_bytes(model, 1.0)


# ----------------------------------------------------------------------------------------------------------------
# Measured points
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KernelPoints:
    """The measured kernel points of ``data/calibration/kernel_points.yaml`` (``{x: y}`` tables as sorted arrays)."""

    measured_on: str
    fp8_gemm_bandwidth_GB_per_s: tuple[np.ndarray, np.ndarray]
    fp8_gemm_TFLOPS: tuple[np.ndarray, np.ndarray]
    sparse_mla_TFLOPS: tuple[np.ndarray, np.ndarray]
    memory_bound_GB_per_s: float
    ep_dispatch_GB_per_s: tuple[np.ndarray, np.ndarray]
    ep_combine_GB_per_s: tuple[np.ndarray, np.ndarray]
    ep_tokens_per_batch: int
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)


def _table(value) -> tuple[np.ndarray, np.ndarray]:
    items = sorted((float(k), float(v)) for k, v in value.items())
    return np.array([k for k, _ in items]), np.array([v for _, v in items])


@functools.lru_cache(maxsize=None)
def kernel_points() -> KernelPoints:
    """Load the measured kernel points (cached)."""
    raw = calibration_data("kernel_points")
    values, sources = {}, {}
    for key, entry in raw.items():
        v = entry["value"]
        values[key] = _table(v) if isinstance(v, Mapping) else v
        sources[key] = entry["source"]
    return KernelPoints(**values, sources=sources)


@dataclass(frozen=True)
class Efficiencies:
    """Fractions of peak, from the measured points (x: tokens M, or EP size, as in the yaml)."""

    gemm_mem: tuple[np.ndarray, np.ndarray]      # attained HBM fraction of FP8 GEMMs against M
    gemm_compute: tuple[np.ndarray, np.ndarray]  # attained FP8 tensor fraction against M
    mla_compute: float                           # sparse MLA, fraction of BF16 dense peak
    memory_bound: float                          # streaming kernels, fraction of HBM bandwidth
    ep_dispatch_GB_per_s: tuple[np.ndarray, np.ndarray]
    ep_combine_GB_per_s: tuple[np.ndarray, np.ndarray]


@functools.lru_cache(maxsize=None)
def efficiencies() -> Efficiencies:
    """Measured points divided by the peaks of the machine they were measured on (``gpus.yaml``)."""
    kp = kernel_points()
    ref = gpu_spec(kp.measured_on)
    x, y = kp.fp8_gemm_bandwidth_GB_per_s
    mem = (x, y / ref.hbm_bandwidth_GB_per_s)
    x2, y2 = kp.fp8_gemm_TFLOPS
    comp = (x2, y2 / ref.fp8_dense_TFLOPS)
    mla = float(kp.sparse_mla_TFLOPS[1][0]) / ref.bf16_dense_TFLOPS     # one point: constant
    return Efficiencies(mem, comp, mla, kp.memory_bound_GB_per_s / ref.hbm_bandwidth_GB_per_s,
                        kp.ep_dispatch_GB_per_s, kp.ep_combine_GB_per_s)


@dataclass(frozen=True)
class CostParams:
    """The simulator's free parameters. Defaults are the unfitted model; :func:`ess.sim.calibrate.calibrate`
    returns fitted values (and says on which data).

    ``compute_scale`` multiplies every compute-lane kernel time, ``comm_scale`` the expert-parallel all-to-all
    times, ``fixed_ms`` is the per-step time outside the layers (scheduling, sampling, launch gaps)."""

    compute_scale: float = 1.0
    comm_scale: float = 1.0
    fixed_ms: float = 0.0
    fitted_on: str = "unfitted"

    def __post_init__(self) -> None:
        for name in ("compute_scale", "comm_scale"):
            real(f"CostParams.{name}", getattr(self, name), lo=0.0, lo_open=True)
        real("CostParams.fixed_ms", self.fixed_ms, lo=0.0)
        if not isinstance(self.fitted_on, str):
            raise TypeError(f"CostParams.fitted_on must be a string, got {type(self.fitted_on).__name__}")

    def to_dict(self) -> dict:
        """The parameters and what they were fitted on, for a record's configuration."""
        return {"compute_scale": self.compute_scale, "comm_scale": self.comm_scale, "fixed_ms": self.fixed_ms,
                "fitted_on": self.fitted_on}


# ----------------------------------------------------------------------------------------------------------------
# Rooflines
# ----------------------------------------------------------------------------------------------------------------

def _gpu(gpu) -> GPUSpec:
    if not isinstance(gpu, GPUSpec):
        raise TypeError(f"gpu must be a GPUSpec (ess.specs.gpu_spec), got {type(gpu).__name__}")
    return gpu


def memory_time_s(nbytes, gpu: GPUSpec):
    """A streaming (memory-bound) kernel: ``bytes / (HBM bandwidth x measured fraction)``; ``nbytes >= 0``."""
    nbytes = number_array("nbytes", nbytes, positive=False, at_least=0, max_ndim=None)
    return nbytes / (_gpu(gpu).hbm_bandwidth_GB_per_s * 1e9 * efficiencies().memory_bound)


def gemm_time_s(m, n: int, k: int, gpu: GPUSpec, *, model: ModelSpec, groups: int = 1, dtype: str = "fp8"):
    """One (grouped) GEMM ``[m, k] x [k, n]`` per group: weights ``groups x n x k``, activations in, BF16 out.

    ``dtype`` is the weight format: ``"fp8"`` (DeepGEMM, the model's FP8 bytes per parameter plus its block scales,
    :func:`fp8_weight_bytes_per_param`) or ``"bf16"`` (2 B/param).
    FP8 on a GPU without FP8 tensor cores runs at the BF16 rate (weights dequantised on the fly).
    Efficiencies are the DeepGEMM points interpolated linearly over ``m`` (clamped at the ends)."""
    if dtype not in ("fp8", "bf16"):
        raise ValueError(f"dtype must be 'fp8' or 'bf16', got {dtype!r}")
    if not isinstance(model, ModelSpec):
        raise TypeError(f"model must be a ModelSpec, got {type(model).__name__}")
    m = number_array("m", m, positive=False, at_least=0, max_ndim=None)
    n, k, groups = positive_int("n", n), positive_int("k", k), positive_int("groups", groups)
    _gpu(gpu)
    eff = efficiencies()
    wbytes = fp8_weight_bytes_per_param(model) if dtype == "fp8" else 2.0
    abytes = 1.0 if dtype == "fp8" else 2.0
    nbytes = groups * (n * k * wbytes + m * k * abytes + m * n * 2.0)
    flops = 2.0 * groups * m * n * k
    peak = gpu.fp8_dense_TFLOPS if (dtype == "fp8" and gpu.fp8_dense_TFLOPS) else gpu.bf16_dense_TFLOPS
    bw = gpu.hbm_bandwidth_GB_per_s * 1e9 * np.interp(m, *eff.gemm_mem)
    tf = peak * 1e12 * np.interp(m, *eff.gemm_compute)
    return np.maximum(nbytes / bw, flops / tf)


def lm_head_time_s(tokens, model: ModelSpec, gpu: GPUSpec):
    """The output head for ``tokens`` rows (BF16 weights, [DS] embeddings and head kept in bf16); ``tokens >= 0``."""
    tokens = number_array("tokens", tokens, positive=False, at_least=0, max_ndim=None)
    return gemm_time_s(tokens, model.vocab_size, model.hidden_size, gpu, model=model, dtype="bf16")


# ----------------------------------------------------------------------------------------------------------------
# One layer, one micro-batch
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LayerCosts:
    """Seconds per micro-batch and layer (arrays broadcast over the configurations).

    ``indexer`` (projections, FP8 key scan over L, logits write and top-k read), ``pre_attn`` (norms, q/kv
    projections, q absorption), ``attn`` (sparse MLA over min(K, L) entries per token), ``o_proj`` (value absorption
    and output projection), ``ffn_dense`` (dense FFN of the first layers), ``moe`` (router, shared and routed
    experts), ``dispatch`` and ``combine`` (expert-parallel all-to-all), ``merge`` (log-sum-exp merge of two
    attention partials, used by dual attention)."""

    indexer: np.ndarray
    pre_attn: np.ndarray
    attn: np.ndarray
    o_proj: np.ndarray
    ffn_dense: np.ndarray
    moe: np.ndarray
    dispatch: np.ndarray
    combine: np.ndarray
    merge: np.ndarray
    selected: np.ndarray          # latent entries selected per request per step (mtp x min(K, L))

    @property
    def attention_block(self):
        """Indexer + PreAttn + Attn + O_proj: the part the offload strategies rearrange."""
        return self.indexer + self.pre_attn + self.attn + self.o_proj

    def scaled(self, compute_scale: float, comm_scale: float) -> "LayerCosts":
        c, m = compute_scale, comm_scale
        return LayerCosts(self.indexer * c, self.pre_attn * c, self.attn * c, self.o_proj * c, self.ffn_dense * c,
                          self.moe * c, self.dispatch * m, self.combine * m, self.merge * c, self.selected)


def layer_costs(model: ModelSpec, gpu: GPUSpec, deployment: DeploymentSpec, micro_batch, context_len, mtp,
                ) -> LayerCosts:
    """Operation costs of one layer for a micro-batch of ``micro_batch`` requests, ``context_len`` tokens of
    context and ``mtp`` query tokens per request (arrays broadcast). Geometry from [DS]. ``micro_batch > 0`` (half a
    request is a micro-batch of a batch of one), ``context_len >= 1``, ``mtp`` a whole number >= 1."""
    for name, spec, cls in (("model", model, ModelSpec), ("gpu", gpu, GPUSpec), ("deployment", deployment,
                                                                                DeploymentSpec)):
        if not isinstance(spec, cls):
            raise TypeError(f"{name} must be a {cls.__name__}, got {type(spec).__name__}")
    b = number_array("micro_batch", micro_batch, max_ndim=None)
    L = number_array("context_len", context_len, at_least=1, max_ndim=None)
    mtp = number_array("mtp", mtp, whole=True, at_least=1, max_ndim=None)
    n = b * mtp                                                   # tokens in the micro-batch
    h, H = model.hidden_size, model.n_heads
    fp8 = "fp8" if model.weight_bytes_per_param == 1 else "bf16"
    eff = efficiencies()
    bw = gpu.hbm_bandwidth_GB_per_s * 1e9 * eff.memory_bound

    # PreAttn: 4 RMSNorm-like passes read and write bf16 vectors (attn_norm h, q_norm q_lora, kv_norm kv_lora,
    # ffn_norm h), then q and kv projections; q_nope absorbed into the latent space per head (bf16 bmm, [DS]
    # model.py dequantises wkv_b for the absorbed path).
    norms = memory_time_s(n * 2 * 2 * (2 * h + model.q_lora_rank + model.kv_lora_rank), gpu)
    qk = model.qk_nope_head_dim + model.qk_rope_head_dim
    pre = (norms + gemm_time_s(n, model.q_lora_rank, h, gpu, model=model, dtype=fp8)
           + gemm_time_s(n, model.latent_dim, h, gpu, model=model, dtype=fp8)
           + gemm_time_s(n, H * qk, model.q_lora_rank, gpu, model=model, dtype=fp8)
           + gemm_time_s(n, model.kv_lora_rank, model.qk_nope_head_dim, gpu, model=model, groups=H,
                         dtype="bf16"))

    # Indexer: projections (q from the q-LoRA output, one key per token, per-head weights), the FP8 MQA logits
    # over all L cached keys (DeepGEMM fp8_paged_mqa_logits: M = index heads x mtp per request), then the fp32
    # logits are written and read back by top-k.
    ih, idim = model.index_n_heads, model.index_head_dim
    proj = (gemm_time_s(n, ih * idim, model.q_lora_rank, gpu, model=model, dtype=fp8)
            + gemm_time_s(n, idim, h, gpu, model=model, dtype=fp8)
            + gemm_time_s(n, ih, h, gpu, model=model, dtype="bf16"))
    scan_bytes = b * L * indexer_entry_bytes(model) + n * L * 4.0 * 2
    peak8 = (gpu.fp8_dense_TFLOPS or gpu.bf16_dense_TFLOPS) * 1e12
    scan_flops = 2.0 * n * ih * idim * L
    scan = np.maximum(scan_bytes / bw, scan_flops / (peak8 * np.interp(ih * mtp, *eff.gemm_compute)))
    indexer = proj + scan

    # Sparse MLA (FlashMLA, MQA mode): each query token reads its own min(K, L) latent entries; QK over 576 dims
    # and PV over 512 dims for every head, at the measured sparse-decode efficiency.
    ksel = np.minimum(float(model.index_topk), L)
    attn_bytes = n * ksel * latent_entry_bytes(model, deployment.kv_dtype) + n * H * model.latent_dim * 2.0
    attn_flops = 2.0 * n * H * ksel * (model.latent_dim + model.kv_lora_rank)
    attn = np.maximum(attn_bytes / bw, attn_flops / (gpu.bf16_dense_TFLOPS * 1e12 * eff.mla_compute))

    # O_proj: value absorption (bf16 bmm per head) then wo.
    o_proj = (gemm_time_s(n, model.v_head_dim, model.kv_lora_rank, gpu, model=model, groups=H, dtype="bf16")
              + gemm_time_s(n, h, H * model.v_head_dim, gpu, model=model, dtype=fp8))

    # Dual attention merges two partial outputs (bf16, H x kv_lora_rank per token) with their log-sum-exp:
    # read two, write one.
    merge = memory_time_s(n * 3 * H * model.kv_lora_rank * 2.0, gpu)

    # FFNs. Dense layers: up (gate+up fused) and down. MoE layers: router (bf16), shared expert, and the local
    # experts as grouped GEMMs with M = tokens each expert receives from all ep GPUs.
    f, fm = model.dense_ffn_dim, model.moe_ffn_dim
    ffn_dense = (gemm_time_s(n, 2 * f, h, gpu, model=model, dtype=fp8)
                 + gemm_time_s(n, h, f, gpu, model=model, dtype=fp8))
    e_local = max(model.n_routed_experts // deployment.ep, 1)
    m_exp = deployment.ep * n * model.n_active_experts / model.n_routed_experts
    moe = (gemm_time_s(n, model.n_routed_experts, h, gpu, model=model, dtype="bf16")
           + model.n_shared_experts * (gemm_time_s(n, 2 * fm, h, gpu, model=model, dtype=fp8)
                                       + gemm_time_s(n, h, fm, gpu, model=model, dtype=fp8))
           + gemm_time_s(m_exp, 2 * fm, h, gpu, model=model, groups=e_local, dtype=fp8)
           + gemm_time_s(m_exp, h, fm, gpu, model=model, groups=e_local, dtype=fp8))

    # EP all-to-all (DeepEP low-latency): every token goes to its k experts; FP8 dispatch (values + one fp32 scale
    # per 128) and BF16 combine, at the bandwidth measured for this EP size (interpolated over EP sizes).
    if deployment.ep > 1:
        d_bw = np.interp(deployment.ep, *eff.ep_dispatch_GB_per_s) * 1e9
        c_bw = np.interp(deployment.ep, *eff.ep_combine_GB_per_s) * 1e9
        k_act = model.n_active_experts
        # FP8 dispatch: one float32 scale per weight_scale_block values ([DS] model.py act_quant uses the weights'
        # block size for activations)
        dispatch = n * k_act * (h + h / model.weight_scale_block * _SCALE_BYTES) / d_bw
        combine = n * k_act * h * 2.0 / c_bw
    else:
        dispatch = combine = np.zeros_like(n)
    z = np.zeros(np.broadcast(b, L, mtp).shape)
    return LayerCosts(indexer + z, pre + z, attn + z, o_proj + z, ffn_dense + z, moe + z, dispatch + z, combine + z,
                      merge + z, mtp * ksel + z)
