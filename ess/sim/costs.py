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

**Part batches.** A kernel's time is not proportional to the batch it runs on (``data/calibration/part_batch.yaml``,
each value with its source, :func:`part_batch`): every launch has a fixed part (the indexer's logits kernel about
8 us, sparse MLA its launch plus FlashMLA's per-part scheduler overhead, the merge its launch); the indexer's top-K
runs one block per query row and one block per SM, so it costs one row's latency (13 us at 4K to 67 us at 128K on an
H200) per wave of ``sm_count`` rows, flat in the batch until a wave fills; sparse MLA weighs each request's entry
blocks plus a fixed overhead of 5 blocks, as FlashMLA's scheduler does. So halving the batch (dual-batch attention)
leaves most of the indexer's cost in each half, and running a kernel as two launches pays its fixed part twice
(:mod:`ess.sim.timeline`). The small GEMMs of PreAttn and O_proj are already nearly flat below M = 64: their time is
the weights' read (DeepGEMM's points start at M = 64 and are held below it).

Glossary: B batch per GPU, b = B/2 micro-batch, mtp query tokens per request per step, L context length, K top-k.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import yaml

from ..layout import indexer_entry_bytes, latent_entry_bytes
from ..memory import fp8_weight_bytes
from ..specs import DATA_DIR, DeploymentSpec, GPUSpec, ModelSpec, gpu_spec
from ..validate import MAX_EXACT_COUNT, number_array, one_of, positive_int, real

__all__ = ["KernelPoints", "kernel_points", "calibration_data", "CostParams", "Efficiencies", "efficiencies",
           "PART_BATCH_VARIANTS", "PartBatch", "part_batch", "fp8_weight_bytes_per_param", "gemm_time_s",
           "memory_time_s", "LayerCosts", "layer_costs", "lm_head_time_s"]

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
    sparse_mla_point: Mapping[str, int]
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
        values[key] = _table(v) if isinstance(v, Mapping) and key != "sparse_mla_point" else v
        sources[key] = entry["source"]
    return KernelPoints(**values, sources=sources)


@dataclass(frozen=True)
class Efficiencies:
    """Fractions of peak, from the measured points (x: tokens M, or EP size, as in the yaml)."""

    gemm_mem: tuple[np.ndarray, np.ndarray]      # attained HBM fraction of FP8 GEMMs against M
    gemm_compute: tuple[np.ndarray, np.ndarray]  # attained FP8 tensor fraction against M
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
    return Efficiencies(mem, comp, kp.memory_bound_GB_per_s / ref.hbm_bandwidth_GB_per_s,
                        kp.ep_dispatch_GB_per_s, kp.ep_combine_GB_per_s)


@dataclass(frozen=True)
class CostParams:
    """The simulator's free parameters. Defaults are the unfitted model; :func:`ess.sim.calibrate.calibrate`
    returns fitted values (and says on which data).

    ``compute_scale`` multiplies every compute-lane kernel time, ``comm_scale`` the expert-parallel all-to-all
    times, ``fixed_ms`` is the per-step time outside the layers (scheduling, sampling, launch gaps).
    ``part_batch`` picks which end of the part-batch evidence the kernels are priced with
    (:func:`part_batch`: ``"central"``, ``"low"``, ``"high"``; ``"off"`` drops every fixed part, the model
    without it, for comparison); the calibration is fitted under it."""

    compute_scale: float = 1.0
    comm_scale: float = 1.0
    fixed_ms: float = 0.0
    fitted_on: str = "unfitted"
    part_batch: str = "central"

    def __post_init__(self) -> None:
        for name in ("compute_scale", "comm_scale"):
            real(f"CostParams.{name}", getattr(self, name), lo=0.0, lo_open=True)
        real("CostParams.fixed_ms", self.fixed_ms, lo=0.0)
        if not isinstance(self.fitted_on, str):
            raise TypeError(f"CostParams.fitted_on must be a string, got {type(self.fitted_on).__name__}")
        one_of("CostParams.part_batch", self.part_batch, PART_BATCH_VARIANTS)

    def to_dict(self) -> dict:
        """The parameters and what they were fitted on, for a record's configuration."""
        return {"compute_scale": self.compute_scale, "comm_scale": self.comm_scale, "fixed_ms": self.fixed_ms,
                "fitted_on": self.fitted_on, "part_batch": self.part_batch}


# ----------------------------------------------------------------------------------------------------------------
# Part batches: the fixed part of each launch
# ----------------------------------------------------------------------------------------------------------------

#: which end of ``data/calibration/part_batch.yaml`` a cost model uses; ``"off"``: no fixed parts, no top-K term
PART_BATCH_VARIANTS = ("central", "low", "high", "off")


@dataclass(frozen=True)
class PartBatch:
    """The part-batch evidence of ``data/calibration/part_batch.yaml`` at one end of its band (seconds).

    * the indexer's logits kernel costs ``logits_launch_s`` per launch on top of its roofline, and reads each
      request's keys once (``index_rows_read_keys == "request"``) or once per query row (``"row"``);
    * its top-K costs the latency of one row (``topk_row_s``: contexts, seconds, interpolated) per wave of
      ``topk_rows_per_sm x sm_count`` rows (rows = requests x MTP): flat in the batch until a wave fills;
    * sparse MLA (FlashMLA's scheduler): ``mla_launch_s`` per launch, and work counted in blocks of
      ``mla_block_entries`` entries x ``mla_heads_per_block`` heads of one query token, each request weighing its
      blocks plus ``mla_overhead_blocks_per_request``, spread over the SMs, plus ``mla_overhead_blocks_per_part``;
    * the log-sum-exp merge of two attention parts: ``merge_launch_s`` per launch on top of its bytes."""

    variant: str
    logits_launch_s: float
    topk_row_s: tuple
    topk_rows_per_sm: int
    index_rows_read_keys: str
    mla_launch_s: float
    mla_block_entries: int
    mla_heads_per_block: int
    mla_overhead_blocks_per_request: float
    mla_overhead_blocks_per_part: float
    merge_launch_s: float

    def topk_latency_s(self, context_len):
        """Seconds of one top-K row over ``context_len`` columns: linear between the measured contexts and along
        the end segments beyond them (never below 0)."""
        xs, ys = self.topk_row_s
        L = np.asarray(context_len, dtype=float)
        lo = ys[0] + (L - xs[0]) * (ys[1] - ys[0]) / (xs[1] - xs[0])
        hi = ys[-1] + (L - xs[-1]) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        out = np.where(L < xs[0], lo, np.where(L > xs[-1], hi, np.interp(L, xs, ys)))
        return np.maximum(out, 0.0)


def part_batch(variant: str = "central") -> PartBatch:
    """The part-batch evidence at ``variant`` (:data:`PART_BATCH_VARIANTS`): each entry's ``value``, or its ``low``
    / ``high`` end; ``"off"`` zeroes every fixed part (launches, scheduler overheads, the top-K term) -- the cost
    model as it was before part batches were priced."""
    return _part_batch(one_of("variant", variant, PART_BATCH_VARIANTS))


@functools.lru_cache(maxsize=None)
def _part_batch(variant: str) -> PartBatch:
    raw = calibration_data("part_batch")

    def pick(key):
        e = raw[key]
        return e.get(variant, e["value"]) if variant in ("low", "high") else e["value"]

    us = 1e-6
    xs, ys = _table(raw["topk_row_latency_us"]["value"])
    scale = pick("topk_row_latency_us") if variant in ("low", "high") else 1.0
    off = variant == "off"
    return PartBatch(variant=variant,
                     logits_launch_s=0.0 if off else float(pick("logits_launch_us")) * us,
                     topk_row_s=(xs, ys * us * (0.0 if off else float(scale))),
                     topk_rows_per_sm=int(raw["topk_rows_per_sm"]["value"]),
                     index_rows_read_keys=str(pick("index_rows_read_keys")),
                     mla_launch_s=0.0 if off else float(pick("mla_launch_us")) * us,
                     mla_block_entries=int(raw["mla_block_entries"]["value"]),
                     mla_heads_per_block=int(raw["mla_heads_per_block"]["value"]),
                     mla_overhead_blocks_per_request=0.0 if off else float(
                         raw["mla_overhead_blocks_per_request"]["value"]),
                     mla_overhead_blocks_per_part=0.0 if off else float(raw["mla_overhead_blocks_per_part"]["value"]),
                     merge_launch_s=0.0 if off else float(pick("merge_launch_us")) * us)


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
    one_of("dtype", dtype, ("fp8", "bf16"))
    if not isinstance(model, ModelSpec):
        raise TypeError(f"model must be a ModelSpec, got {type(model).__name__}")
    m = number_array("m", m, positive=False, at_least=0, at_most=MAX_EXACT_COUNT, max_ndim=None)
    n, k, groups = positive_int("n", n), positive_int("k", k), positive_int("groups", groups)
    for name, v in (("n", n), ("k", k), ("groups", groups)):
        if v > MAX_EXACT_COUNT:                                   # float64 arithmetic below (OverflowError)
            raise ValueError(f"{name} must be a positive integer <= 2**53, got one of {len(str(v))} digits")
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
    tokens = number_array("tokens", tokens, positive=False, at_least=0, at_most=MAX_EXACT_COUNT, max_ndim=None)
    if not isinstance(model, ModelSpec):
        raise TypeError(f"model must be a ModelSpec, got {type(model).__name__}")
    return gemm_time_s(tokens, model.vocab_size, model.hidden_size, gpu, model=model, dtype="bf16")


# ----------------------------------------------------------------------------------------------------------------
# One layer, one micro-batch
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LayerCosts:
    """Seconds per micro-batch and layer (arrays broadcast over the configurations).

    ``indexer`` the whole selection of the micro-batch: projections, the FP8 logits kernel over L cached keys and
    the top-K over the logits; ``indexer_split`` its part that dual-batch attention runs per half batch (logits and
    top-K: the projections run once for the micro-batch) and ``indexer_half`` that part on half the micro-batch;
    ``pre_attn`` (norms, q/kv projections, q absorption), ``attn`` (sparse MLA over min(K, L) entries per query
    token) and ``attn_half`` (the same on half the micro-batch), ``o_proj`` (value absorption and output
    projection), ``ffn_dense`` (dense FFN of the first layers), ``moe`` (router, shared and routed experts),
    ``dispatch`` and ``combine`` (expert-parallel all-to-all), ``merge`` (log-sum-exp merge of two attention
    partials, used by dual attention).

    Sparse MLA over any part of the entries, for dual attention's two launches (:meth:`attention`):
    ``attn_fixed + n x attn_block x (e / block_entries + attn_overhead_blocks)`` seconds for ``n`` requests of
    ``e`` entries per query token; ``entries`` = min(K, L) per query token, ``selected`` = mtp x entries per
    request and step."""

    indexer: np.ndarray
    indexer_split: np.ndarray
    indexer_half: np.ndarray
    pre_attn: np.ndarray
    attn: np.ndarray
    attn_half: np.ndarray
    o_proj: np.ndarray
    ffn_dense: np.ndarray
    moe: np.ndarray
    dispatch: np.ndarray
    combine: np.ndarray
    merge: np.ndarray
    attn_fixed: np.ndarray
    attn_block: np.ndarray
    attn_overhead_blocks: float
    block_entries: int
    entries: np.ndarray
    selected: np.ndarray

    @property
    def attention_block(self):
        """Indexer + PreAttn + Attn + O_proj: the part the offload strategies rearrange."""
        return self.indexer + self.pre_attn + self.attn + self.o_proj

    def attention(self, requests, entries):
        """Seconds of one sparse-MLA launch over ``requests`` requests (of this micro-batch's MTP) each reading
        ``entries`` entries per query token (the class docstring's rule; ``attention(b, self.entries)`` is
        ``attn``)."""
        return self.attn_fixed + requests * self.attn_block * (entries / self.block_entries
                                                                + self.attn_overhead_blocks)

    def scaled(self, compute_scale: float, comm_scale: float) -> "LayerCosts":
        """Every compute-lane time x ``compute_scale``, the all-to-all x ``comm_scale``; counts unchanged."""
        c, m = compute_scale, comm_scale
        return dataclasses.replace(
            self, indexer=self.indexer * c, indexer_split=self.indexer_split * c, indexer_half=self.indexer_half * c,
            pre_attn=self.pre_attn * c, attn=self.attn * c, attn_half=self.attn_half * c, o_proj=self.o_proj * c,
            ffn_dense=self.ffn_dense * c, moe=self.moe * c, dispatch=self.dispatch * m, combine=self.combine * m,
            merge=self.merge * c, attn_fixed=self.attn_fixed * c, attn_block=self.attn_block * c)


def layer_costs(model: ModelSpec, gpu: GPUSpec, deployment: DeploymentSpec, micro_batch, context_len, mtp, *,
                part_batch_variant: str = "central") -> LayerCosts:
    """Operation costs of one layer for a micro-batch of ``micro_batch`` requests, ``context_len`` tokens of
    context and ``mtp`` query tokens per request (arrays broadcast), with the part-batch evidence at
    ``part_batch_variant`` (:func:`part_batch`). Geometry from [DS]. ``micro_batch > 0`` (half a request is a
    micro-batch of a batch of one), ``context_len >= 1``, ``mtp`` a whole number >= 1."""
    for name, spec, cls in (("model", model, ModelSpec), ("gpu", gpu, GPUSpec), ("deployment", deployment,
                                                                                DeploymentSpec)):
        if not isinstance(spec, cls):
            raise TypeError(f"{name} must be a {cls.__name__}, got {type(spec).__name__}")
    b = number_array("micro_batch", micro_batch, at_most=MAX_EXACT_COUNT, max_ndim=None)
    L = number_array("context_len", context_len, at_least=1, at_most=model.max_position_embeddings, max_ndim=None)
    mtp = number_array("mtp", mtp, whole=True, at_least=1, at_most=model.max_position_embeddings, max_ndim=None)
    pb = _part_batch(one_of("part_batch_variant", part_batch_variant, PART_BATCH_VARIANTS))
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

    # Indexer: projections (q from the q-LoRA output, one key per token, per-head weights) for the micro-batch,
    # then the split part: the FP8 MQA logits over all L cached keys (DeepGEMM fp8_paged_mqa_logits, M = index
    # heads x mtp per request; its keys read once per request or once per query row, its fp32 logits written and
    # read back) plus its launch, and the top-K, one row per query token, a wave of rows per sm_count
    # (data/calibration/part_batch.yaml).
    ih, idim = model.index_n_heads, model.index_head_dim
    proj = (gemm_time_s(n, ih * idim, model.q_lora_rank, gpu, model=model, dtype=fp8)
            + gemm_time_s(n, idim, h, gpu, model=model, dtype=fp8)
            + gemm_time_s(n, ih, h, gpu, model=model, dtype="bf16"))
    peak8 = (gpu.fp8_dense_TFLOPS or gpu.bf16_dense_TFLOPS) * 1e12
    rows_per_wave = pb.topk_rows_per_sm * gpu.sm_count
    t_row = pb.topk_latency_s(L)

    def split_part(req):                                          # logits + top-K of ``req`` requests
        rows = req * mtp
        reads = req if pb.index_rows_read_keys == "request" else rows
        scan_bytes = reads * L * indexer_entry_bytes(model) + rows * L * 4.0 * 2
        scan_flops = 2.0 * rows * ih * idim * L
        logits = pb.logits_launch_s + np.maximum(scan_bytes / bw,
                                                 scan_flops / (peak8 * np.interp(ih * mtp, *eff.gemm_compute)))
        return logits + np.ceil(rows / rows_per_wave - 1e-9) * t_row

    split, half = split_part(b), split_part(b / 2)

    # Sparse MLA (FlashMLA, MQA mode), as its scheduler counts the work: blocks of 64 selected entries x 64 query
    # heads of one query token, each request its blocks plus a fixed overhead, spread over the SMs, plus a fixed
    # overhead per SM part and the launch. The time of one block comes from the measured point (kernel_points.yaml:
    # 410 TFLOPS on H800 at batch 128, s_q 2), moved to this GPU by its BF16 peak; a memory floor (each query token
    # reads its own entries) never binds on the GPUs of data/ (compute is 3-4x longer).
    kp = kernel_points()
    pt, ref = kp.sparse_mla_point, gpu_spec(kp.measured_on)
    t_pt = (2.0 * pt["batch"] * pt["s_q"] * pt["heads"] * pt["topk"] * (pt["qk_dim"] + pt["v_dim"])
            / (float(kp.sparse_mla_TFLOPS[1][0]) * 1e12))
    units_pt = (pt["batch"] * pt["s_q"] * pt["heads"] / pb.mla_heads_per_block
                * (pt["topk"] / pb.mla_block_entries + pb.mla_overhead_blocks_per_request) / ref.sm_count
                + pb.mla_overhead_blocks_per_part)
    unit = (t_pt - pb.mla_launch_s) / units_pt * ref.bf16_dense_TFLOPS / gpu.bf16_dense_TFLOPS
    ksel = np.minimum(float(model.index_topk), L)
    block_compute = unit * mtp * H / pb.mla_heads_per_block / gpu.sm_count       # per request and entry block
    block_memory = (mtp * pb.mla_block_entries * latent_entry_bytes(model, deployment.kv_dtype)) / bw
    attn_block = np.maximum(block_compute, block_memory)
    attn_fixed = pb.mla_launch_s + pb.mla_overhead_blocks_per_part * unit
    ovh = pb.mla_overhead_blocks_per_request
    attn_of = lambda req: attn_fixed + req * attn_block * (ksel / pb.mla_block_entries + ovh)   # noqa: E731

    # O_proj: value absorption (bf16 bmm per head) then wo.
    o_proj = (gemm_time_s(n, model.v_head_dim, model.kv_lora_rank, gpu, model=model, groups=H, dtype="bf16")
              + gemm_time_s(n, h, H * model.v_head_dim, gpu, model=model, dtype=fp8))

    # Dual attention merges two partial outputs (bf16, H x kv_lora_rank per token) with their log-sum-exp:
    # read two, write one; plus its launch.
    merge = pb.merge_launch_s + memory_time_s(n * 3 * H * model.kv_lora_rank * 2.0, gpu)

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
    return LayerCosts(indexer=proj + split + z, indexer_split=split + z, indexer_half=half + z, pre_attn=pre + z,
                      attn=attn_of(b) + z, attn_half=attn_of(b / 2) + z, o_proj=o_proj + z, ffn_dense=ffn_dense + z,
                      moe=moe + z, dispatch=dispatch + z, combine=combine + z, merge=merge + z,
                      attn_fixed=attn_fixed + z, attn_block=attn_block + z, attn_overhead_blocks=float(ovh),
                      block_entries=int(pb.mla_block_entries), entries=ksel + z, selected=mtp * ksel + z)
