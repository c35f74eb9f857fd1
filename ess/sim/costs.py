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
           "PART_BATCH_VARIANTS", "EFFICIENCY_VARIANTS", "ATTENTION_TRANSFERS", "PartBatch", "part_batch",
           "fp8_weight_bytes_per_param", "gemm_time_s", "memory_time_s", "LayerCosts", "layer_costs",
           "lm_head_time_s", "nvlink_all_to_all_GB_per_s", "sparse_mla_point"]

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


#: which end of the measured kernel points' spread the GEMM efficiencies come from (``kernel_points.yaml``: each
#: point the mean over the shapes measured at it, or the slowest / the fastest of them)
EFFICIENCY_VARIANTS = ("central", "low", "high")
#: how sparse attention's measured efficiency moves to another GPU: ``"hopper"`` its fraction of the BF16 peak as
#: measured on an H800, on every GPU; ``"b200-measured"`` on a Blackwell GPU the fraction FlashMLA measured on a
#: B200 (``data/calibration/extrapolation.yaml``), Hopper's elsewhere
ATTENTION_TRANSFERS = ("hopper", "b200-measured")
# kernel_points.yaml entries that are not {x: y} tables, or that only the NVLink all-to-all reads
_NOT_KERNEL_POINTS = ("sparse_mla_point", "ep_nvlink_dispatch_GB_per_s", "ep_nvlink_combine_GB_per_s",
                      "ep_rdma_throughput_dispatch_GB_per_s", "ep_rdma_throughput_combine_GB_per_s")


@functools.lru_cache(maxsize=None)
def kernel_points(variant: str = "central") -> KernelPoints:
    """Load the measured kernel points (cached); ``variant`` (:data:`EFFICIENCY_VARIANTS`) takes each table's
    ``low`` or ``high`` end where it has one (the slowest / the fastest shape measured at each point)."""
    if variant not in EFFICIENCY_VARIANTS:
        raise ValueError(f"variant must be one of {EFFICIENCY_VARIANTS}, got {variant!r}")
    raw = calibration_data("kernel_points")
    values, sources = {}, {}
    for key, entry in raw.items():
        if key in _NOT_KERNEL_POINTS[1:]:
            continue
        v = entry.get(variant, entry["value"]) if variant != "central" else entry["value"]
        values[key] = _table(v) if isinstance(v, Mapping) and key != "sparse_mla_point" else v
        sources[key] = entry["source"]
    return KernelPoints(**values, sources=sources)


@functools.lru_cache(maxsize=None)
def nvlink_all_to_all_GB_per_s(ep: int) -> tuple[float, float]:
    """Dispatch and combine bandwidth (GB/s) of a decode-size all-to-all over ``ep`` GPUs of one NVLink domain:
    DeepEP's NVLink figures (B200, EP 8, 8K tokens per batch) times the share of a link's throughput-mode bandwidth
    that its low-latency kernels reach at a decode batch over RDMA at this EP size (``kernel_points.yaml``; an
    extrapolation, stated there)."""
    raw = calibration_data("kernel_points")
    ep = float(ep)
    share = []
    for what in ("dispatch", "combine"):
        ll = _table(raw[f"ep_{what}_GB_per_s"]["value"])
        tp = _table(raw[f"ep_rdma_throughput_{what}_GB_per_s"]["value"])
        share.append(np.interp(ep, *ll) / np.interp(ep, *tp))
    return (float(raw["ep_nvlink_dispatch_GB_per_s"]["value"]) * float(share[0]),
            float(raw["ep_nvlink_combine_GB_per_s"]["value"]) * float(share[1]))


@dataclass(frozen=True)
class Efficiencies:
    """Fractions of peak, from the measured points (x: tokens M, or EP size, as in the yaml)."""

    gemm_mem: tuple[np.ndarray, np.ndarray]      # attained HBM fraction of FP8 GEMMs against M
    gemm_compute: tuple[np.ndarray, np.ndarray]  # attained FP8 tensor fraction against M
    memory_bound: float                          # streaming kernels, fraction of HBM bandwidth
    ep_dispatch_GB_per_s: tuple[np.ndarray, np.ndarray]
    ep_combine_GB_per_s: tuple[np.ndarray, np.ndarray]


@functools.lru_cache(maxsize=None)
def efficiencies(variant: str = "central") -> Efficiencies:
    """Measured points divided by the peaks of the machine they were measured on (``gpus.yaml``); ``variant``
    picks the end of the points' spread (:func:`kernel_points`)."""
    kp = kernel_points(variant)
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
    efficiency: str = "central"
    attention_transfer: str = "hopper"

    def __post_init__(self) -> None:
        for name in ("compute_scale", "comm_scale"):
            real(f"CostParams.{name}", getattr(self, name), lo=0.0, lo_open=True)
        real("CostParams.fixed_ms", self.fixed_ms, lo=0.0)
        if not isinstance(self.fitted_on, str):
            raise TypeError(f"CostParams.fitted_on must be a string, got {type(self.fitted_on).__name__}")
        one_of("CostParams.part_batch", self.part_batch, PART_BATCH_VARIANTS)
        one_of("CostParams.efficiency", self.efficiency, EFFICIENCY_VARIANTS)
        one_of("CostParams.attention_transfer", self.attention_transfer, ATTENTION_TRANSFERS)

    def to_dict(self) -> dict:
        """The parameters and what they were fitted on, for a record's configuration."""
        return {"compute_scale": self.compute_scale, "comm_scale": self.comm_scale, "fixed_ms": self.fixed_ms,
                "fitted_on": self.fitted_on, "part_batch": self.part_batch, "efficiency": self.efficiency,
                "attention_transfer": self.attention_transfer}

    def cost_kw(self) -> dict:
        """The keywords of :func:`layer_costs` that these parameters choose (the evidence's ends)."""
        return {"part_batch_variant": self.part_batch, "efficiency_variant": self.efficiency,
                "attention_transfer": self.attention_transfer}


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


def memory_time_s(nbytes, gpu: GPUSpec, *, variant: str = "central"):
    """A streaming (memory-bound) kernel: ``bytes / (HBM bandwidth x measured fraction)``; ``nbytes >= 0``."""
    nbytes = number_array("nbytes", nbytes, positive=False, at_least=0, max_ndim=None)
    return nbytes / (_gpu(gpu).hbm_bandwidth_GB_per_s * 1e9 * efficiencies(variant).memory_bound)


def gemm_time_s(m, n: int, k: int, gpu: GPUSpec, *, model: ModelSpec, groups: int = 1, dtype: str = "fp8",
                weight_bytes: float | None = None, variant: str = "central"):
    """One (grouped) GEMM ``[m, k] x [k, n]`` per group: weights ``groups x n x k``, activations in, BF16 out.

    ``dtype`` is the weight format: ``"fp8"`` (DeepGEMM, the model's FP8 bytes per parameter plus its block scales,
    :func:`fp8_weight_bytes_per_param`) or ``"bf16"`` (2 B/param); ``weight_bytes`` overrides the bytes per weight
    (a model's FP4 experts, at the FP8 rate as DeepGEMM's FP8 x FP4 GEMMs run).
    FP8 on a GPU without FP8 tensor cores runs at the BF16 rate (weights dequantised on the fly).
    Efficiencies are the DeepGEMM points interpolated linearly over ``m`` (clamped at the ends), at ``variant``'s
    end of their spread (:func:`efficiencies`)."""
    one_of("dtype", dtype, ("fp8", "bf16"))
    if not isinstance(model, ModelSpec):
        raise TypeError(f"model must be a ModelSpec, got {type(model).__name__}")
    m = number_array("m", m, positive=False, at_least=0, at_most=MAX_EXACT_COUNT, max_ndim=None)
    n, k, groups = positive_int("n", n), positive_int("k", k), positive_int("groups", groups)
    for name, v in (("n", n), ("k", k), ("groups", groups)):
        if v > MAX_EXACT_COUNT:                                   # float64 arithmetic below (OverflowError)
            raise ValueError(f"{name} must be a positive integer <= 2**53, got one of {len(str(v))} digits")
    _gpu(gpu)
    eff = efficiencies(variant)
    wbytes = fp8_weight_bytes_per_param(model) if dtype == "fp8" else 2.0
    if weight_bytes is not None:
        wbytes = real("weight_bytes", weight_bytes, lo=0.0, lo_open=True)
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

    ``indexer`` the whole selection of the micro-batch: projections, the FP8 logits kernel over the L cached keys
    (a compressed model's rows) and the top-K over the logits; ``indexer_split`` its part that dual-batch attention
    runs per half batch (logits and top-K: the projections run once for the micro-batch) and ``indexer_half`` that
    part on half the micro-batch (all three 0 on a layer without an indexer); ``pre_attn`` (norms, q/kv projections,
    q absorption), ``attn`` (sparse MLA over ``entries`` entries per query token) and ``attn_half`` (the same on half
    the micro-batch), ``o_proj`` (value absorption and output projection), ``ffn_dense`` (dense FFN of the first
    layers), ``moe`` (router, shared and routed experts), ``dispatch`` and ``combine`` (expert-parallel all-to-all),
    ``merge`` (log-sum-exp merge of two attention partials, used by dual attention).

    Sparse MLA over any part of the entries, for dual attention's two launches (:meth:`attention`):
    ``attn_fixed + n x attn_block x (e / block_entries + attn_overhead_blocks)`` seconds for ``n`` requests of
    ``e`` entries per query token; ``entries`` = what one query token attends (min(K, L) for a DSA layer; a
    compressed model's selected rows plus its window), ``sparse_entries`` the part of it the indexer selected
    (what can miss), ``selected`` = mtp x sparse_entries per request and step."""

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
    sparse_entries: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.sparse_entries is None:                        # a DSA layer: every attended entry was selected
            object.__setattr__(self, "sparse_entries", self.entries)

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


def sparse_mla_point(gpu: GPUSpec, attention_transfer: str = "hopper") -> tuple[float, GPUSpec]:
    """The measured sparse-decode point a GPU's attention is priced from: ``(TFLOPS, machine)``. FlashMLA's H800
    point (``kernel_points.yaml``) on every GPU, except, with ``attention_transfer="b200-measured"``, FlashMLA's
    B200 figure on a Blackwell GPU (``data/calibration/extrapolation.yaml``)."""
    if attention_transfer not in ATTENTION_TRANSFERS:
        raise ValueError(f"attention_transfer must be one of {ATTENTION_TRANSFERS}, got {attention_transfer!r}")
    if attention_transfer == "b200-measured" and gpu.architecture == "blackwell":
        e = calibration_data("extrapolation")["blackwell_sparse_decode_TFLOPS"]
        return float(e["b200_measured"]), gpu_spec("B200")
    kp = kernel_points()
    return float(kp.sparse_mla_TFLOPS[1][0]), gpu_spec(kp.measured_on)


def layer_costs(model: ModelSpec, gpu: GPUSpec, deployment: DeploymentSpec, micro_batch, context_len, mtp, *,
                part_batch_variant: str = "central", efficiency_variant: str = "central",
                attention_transfer: str = "hopper", kind: str = "sparse", compress_ratio: int | None = None
                ) -> LayerCosts:
    """Operation costs of one layer for a micro-batch of ``micro_batch`` requests, ``context_len`` tokens of
    context and ``mtp`` query tokens per request (arrays broadcast), with the part-batch evidence at
    ``part_batch_variant`` (:func:`part_batch`), the kernel efficiencies at ``efficiency_variant``
    (:func:`efficiencies`) and sparse attention moved to the GPU by ``attention_transfer`` (:func:`sparse_mla_point`).
    Geometry from the model's spec ([DS] for DeepSeek-V3.2-Exp): every operation is counted from it, so another
    model (GLM-5's 64 heads, q-LoRA 2,048, qk_nope 192, v 256, 32 indexer heads) is priced by its own counts.

    ``kind`` is the layer's (:data:`ess.specs.LAYER_KINDS`): ``"sparse"`` (the indexer scans the layer's rows --
    tokens, or ``context_len // sparse_compress_ratio`` compressed rows -- and attention reads its top-K rows plus
    the model's sliding window), ``"dense"`` (no indexer; attention reads every row of ratio ``compress_ratio`` and
    the window), ``"window"`` (no indexer; attention reads the window). ``micro_batch > 0`` (half a request is a
    micro-batch of a batch of one), ``context_len >= 1``, ``mtp`` a whole number >= 1."""
    for name, spec, cls in (("model", model, ModelSpec), ("gpu", gpu, GPUSpec), ("deployment", deployment,
                                                                                DeploymentSpec)):
        if not isinstance(spec, cls):
            raise TypeError(f"{name} must be a {cls.__name__}, got {type(spec).__name__}")
    one_of("kind", kind, ("sparse", "dense", "window"))
    if kind == "dense" or compress_ratio is not None:      # given where it does not apply: still a whole number
        compress_ratio = positive_int("compress_ratio", compress_ratio)
    b = number_array("micro_batch", micro_batch, at_most=MAX_EXACT_COUNT, max_ndim=None)
    L = number_array("context_len", context_len, at_least=1, at_most=model.max_position_embeddings, max_ndim=None)
    mtp = number_array("mtp", mtp, whole=True, at_least=1, at_most=model.max_position_embeddings, max_ndim=None)
    pb = _part_batch(one_of("part_batch_variant", part_batch_variant, PART_BATCH_VARIANTS))
    ev = efficiency_variant
    n = b * mtp                                                   # tokens in the micro-batch
    if np.any(n > MAX_EXACT_COUNT):
        raise ValueError(f"micro_batch x mtp must be <= {MAX_EXACT_COUNT:,} (tokens counted exactly), got "
                         f"{np.max(n):.6g}")
    h, H = model.hidden_size, model.n_heads
    fp8 = "fp8" if model.weight_bytes_per_param == 1 else "bf16"
    eff = efficiencies(ev)
    bw = gpu.hbm_bandwidth_GB_per_s * 1e9 * eff.memory_bound
    gemm = functools.partial(gemm_time_s, gpu=gpu, model=model, variant=ev)
    z = np.zeros(np.broadcast(b, L, mtp).shape)

    # PreAttn: 4 RMSNorm-like passes read and write bf16 vectors (attn_norm h, q_norm q_lora, kv_norm kv_lora,
    # ffn_norm h), then q and kv projections; q_nope absorbed into the latent space per head (bf16 bmm, [DS]
    # model.py dequantises wkv_b for the absorbed path) -- a shared-KV model (DeepSeek-V4) reads its KV row as the
    # key directly: no absorption.
    norms = memory_time_s(n * 2 * 2 * (2 * h + model.q_lora_rank + model.kv_lora_rank), gpu, variant=ev)
    qk = model.qk_nope_head_dim + model.qk_rope_head_dim
    pre = (norms + gemm(n, model.q_lora_rank, h, dtype=fp8) + gemm(n, model.latent_dim, h, dtype=fp8)
           + gemm(n, H * qk, model.q_lora_rank, dtype=fp8))
    if not model.kv_shared:
        pre = pre + gemm(n, model.kv_lora_rank, model.qk_nope_head_dim, groups=H, dtype="bf16")

    # The window every layer of a compressed model attends besides its rows (0 for a DSA model).
    window = np.minimum(float(model.sliding_window), L) if model.sliding_window else 0.0 * L
    if kind == "sparse":
        rows = np.floor(L / model.sparse_compress_ratio)          # the rows the indexer scans (tokens for DSA)
        ksel = np.minimum(float(model.index_topk), rows)
    elif kind == "dense":
        rows = np.floor(L / compress_ratio)
        ksel = 0.0 * L
    else:
        rows = ksel = 0.0 * L
    entries = (ksel + window) if kind == "sparse" else (rows + window if kind == "dense" else window)

    # Indexer (sparse layers only): projections (q from the q-LoRA output, one key per row, per-head weights) for
    # the micro-batch, then the split part: the FP8 MQA logits over all cached rows (DeepGEMM fp8_paged_mqa_logits,
    # M = index heads x mtp per request; its keys read once per request or once per query row, its fp32 logits
    # written and read back) plus its launch, and the top-K, one row per query token, a wave of rows per sm_count
    # (data/calibration/part_batch.yaml; the row latency measured on an H200 over that many columns, kept on every
    # GPU).
    ih, idim = model.index_n_heads, model.index_head_dim
    peak8 = (gpu.fp8_dense_TFLOPS or gpu.bf16_dense_TFLOPS) * 1e12
    rows_per_wave = pb.topk_rows_per_sm * gpu.sm_count
    if kind == "sparse":
        proj = (gemm(n, ih * idim, model.q_lora_rank, dtype=fp8) + gemm(n, idim, h, dtype=fp8)
                + gemm(n, ih, h, dtype="bf16"))
        t_row = pb.topk_latency_s(rows)

        def split_part(req):                                      # logits + top-K of ``req`` requests
            q_rows = req * mtp
            reads = req if pb.index_rows_read_keys == "request" else q_rows
            scan_bytes = reads * rows * indexer_entry_bytes(model) + q_rows * rows * 4.0 * 2
            scan_flops = 2.0 * q_rows * ih * idim * rows
            logits = pb.logits_launch_s + np.maximum(scan_bytes / bw,
                                                     scan_flops / (peak8 * np.interp(ih * mtp, *eff.gemm_compute)))
            return logits + np.ceil(q_rows / rows_per_wave - 1e-9) * t_row

        split, half = split_part(b), split_part(b / 2)
    else:
        proj = split = half = z

    # Sparse MLA (FlashMLA, MQA mode), as its scheduler counts the work: blocks of 64 attended entries x 64 query
    # heads of one query token, each request its blocks plus a fixed overhead, spread over the SMs, plus a fixed
    # overhead per SM part and the launch. The time of one block comes from a measured point (kernel_points.yaml:
    # 410 TFLOPS on H800 at batch 128, s_q 2, top-k 2048; sparse_mla_point), moved to this GPU by its BF16 peak per
    # SM (the blocks are spread over this GPU's SMs) and to this model by its head dims (QK and V widths against the
    # point's 576 and 512: a shared-KV model's row is both); a memory floor (each query token reads its own entries)
    # never binds on the GPUs of data/ (compute is 3-4x longer).
    kp = kernel_points()
    pt = kp.sparse_mla_point
    tflops, ref = sparse_mla_point(gpu, attention_transfer)
    t_pt = 2.0 * pt["batch"] * pt["s_q"] * pt["heads"] * pt["topk"] * (pt["qk_dim"] + pt["v_dim"]) / (tflops * 1e12)
    units_pt = (pt["batch"] * pt["s_q"] * pt["heads"] / pb.mla_heads_per_block
                * (pt["topk"] / pb.mla_block_entries + pb.mla_overhead_blocks_per_request) / ref.sm_count
                + pb.mla_overhead_blocks_per_part)
    per_sm = (ref.bf16_dense_TFLOPS / ref.sm_count) / (gpu.bf16_dense_TFLOPS / gpu.sm_count)
    v_dim = model.latent_dim if model.kv_shared else model.kv_lora_rank
    dims = (model.latent_dim + v_dim) / (pt["qk_dim"] + pt["v_dim"])
    unit = (t_pt - pb.mla_launch_s) / units_pt * per_sm * dims
    block_compute = unit * mtp * H / pb.mla_heads_per_block / gpu.sm_count       # per request and entry block
    block_memory = (mtp * pb.mla_block_entries * latent_entry_bytes(model, deployment.kv_dtype)) / bw
    attn_block = np.maximum(block_compute, block_memory)
    attn_fixed = pb.mla_launch_s + pb.mla_overhead_blocks_per_part * unit
    ovh = pb.mla_overhead_blocks_per_request
    attn_of = lambda req: attn_fixed + req * attn_block * (entries / pb.mla_block_entries + ovh)   # noqa: E731

    # O_proj: value absorption (bf16 bmm per head) then wo; a shared-KV model's attention output is already per head
    # (no absorption), and a grouped low-rank output projection maps each group's heads to o_lora_rank, then all
    # groups to the hidden size (DeepSeek-V4).
    if model.o_lora_rank:
        g = model.o_groups
        o_proj = (gemm(n, model.o_lora_rank, H // g * model.v_head_dim, groups=g, dtype=fp8)
                  + gemm(n, h, g * model.o_lora_rank, dtype=fp8))
    else:
        o_proj = gemm(n, h, H * model.v_head_dim, dtype=fp8)
    if not model.kv_shared:
        o_proj = o_proj + gemm(n, model.v_head_dim, model.kv_lora_rank, groups=H, dtype="bf16")

    # Dual attention merges two partial outputs (bf16, H x the attention output width per token) with their
    # log-sum-exp: read two, write one; plus its launch.
    merge = pb.merge_launch_s + memory_time_s(n * 3 * H * v_dim * 2.0, gpu, variant=ev)

    # FFNs. Dense layers: up (gate+up fused) and down. MoE layers: router (bf16), shared expert, and the local
    # experts as grouped GEMMs with M = tokens each expert receives from all ep GPUs (in the model's expert format:
    # FP4 experts read half a byte per weight plus their scales, at the FP8 rate).
    f, fm = model.dense_ffn_dim, model.moe_ffn_dim
    ffn_dense = gemm(n, 2 * f, h, dtype=fp8) + gemm(n, h, f, dtype=fp8)
    e_local = max(model.n_routed_experts // deployment.ep, 1)
    m_exp = deployment.ep * n * model.n_active_experts / model.n_routed_experts
    ewb = None
    if model.expert_bytes_per_param is not None:
        ewb = model.expert_bytes_per_param + (1.0 / model.expert_scale_group if model.expert_scale_group else 0.0)
    moe = (gemm(n, model.n_routed_experts, h, dtype="bf16")
           + model.n_shared_experts * (gemm(n, 2 * fm, h, dtype=fp8) + gemm(n, h, fm, dtype=fp8))
           + gemm(m_exp, 2 * fm, h, groups=e_local, dtype=fp8, weight_bytes=ewb)
           + gemm(m_exp, h, fm, groups=e_local, dtype=fp8, weight_bytes=ewb))

    # EP all-to-all: every token goes to its k experts; FP8 dispatch (values + one fp32 scale per 128) and BF16
    # combine. Over RDMA (DeepEP low-latency) at the bandwidth measured for this EP size (interpolated over EP
    # sizes); inside one NVLink domain (ep_transport "nvlink", a GB200 NVL72 rack) at DeepEP's NVLink figures scaled to
    # a decode-size batch (nvlink_all_to_all_GB_per_s).
    if deployment.ep > 1:
        if deployment.ep_transport == "nvlink":
            d_bw, c_bw = (x * 1e9 for x in nvlink_all_to_all_GB_per_s(deployment.ep))
        else:
            d_bw = np.interp(deployment.ep, *eff.ep_dispatch_GB_per_s) * 1e9
            c_bw = np.interp(deployment.ep, *eff.ep_combine_GB_per_s) * 1e9
        k_act = model.n_active_experts
        # FP8 dispatch: one float32 scale per weight_scale_block values ([DS] model.py act_quant uses the weights'
        # block size for activations)
        dispatch = n * k_act * (h + h / model.weight_scale_block * _SCALE_BYTES) / d_bw
        combine = n * k_act * h * 2.0 / c_bw
    else:
        dispatch = combine = np.zeros_like(n)
    return LayerCosts(indexer=proj + split + z, indexer_split=split + z, indexer_half=half + z, pre_attn=pre + z,
                      attn=attn_of(b) + z, attn_half=attn_of(b / 2) + z, o_proj=o_proj + z, ffn_dense=ffn_dense + z,
                      moe=moe + z, dispatch=dispatch + z, combine=combine + z, merge=merge + z,
                      attn_fixed=attn_fixed + z, attn_block=attn_block + z, attn_overhead_blocks=float(ovh),
                      block_entries=int(pb.mla_block_entries), entries=entries + z, selected=mtp * ksel + z,
                      sparse_entries=ksel + z)
