"""GPU and host memory planning: weights per GPU, the KV budget, the largest decode batch, and where the bytes of a
batch live (:func:`tier_placement`).

The model of one decode GPU (attention data-parallel, experts split over ``ep`` GPUs)::

    HBM x mem_fraction_static  =  weights on this GPU  +  KV budget
    KV budget                 >=  B x (indexer cache + ratio x latent cache)       (per request, all layers)
    host memory per GPU       >=  B x latent cache                                  (offload only, ratio < 1)

``mem_fraction_static`` is the serving engine's share of HBM for weights plus caches; the rest holds activations,
CUDA graphs and workspace. The offload pool must also hold one step's K selected entries per request and layer.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import validate
from .layout import (check_context_len, latent_entry_bytes, padded_tokens, pool_slots, request_cache,
                     step_entries)
from .specs import DeploymentSpec, GPUSpec, HostSpec, ModelSpec, gpu_spec, model_spec, resolve

__all__ = [
    "GiB", "param_counts", "fp8_weight_bytes", "weights_per_gpu_bytes", "kv_budget_bytes", "BatchLimit", "largest_batch",
    "host_memory_needed_bytes", "fit_mem_fraction_static", "tier_placement",
]

GiB = 2 ** 30


def _linear(fan_in: int, fan_out: int) -> int:
    return fan_in * fan_out


def param_counts(model: ModelSpec) -> dict[str, int]:
    """Parameter counts by group, from the geometry ([DS] inference/model.py: MLA, indexer, MoE, MTP).

    Groups: ``attention`` (MLA projections and norms, all layers), ``indexer``, ``dense_ffn``, ``shared_experts``,
    ``routed_experts`` (all experts, all MoE layers), ``router``, ``embeddings`` (input embedding and output head),
    ``mtp`` (the MTP module's own projection and norms; its decoder block is counted in the groups above).
    """
    h, heads = model.hidden_size, model.n_heads
    attn = (_linear(h, model.q_lora_rank) + model.q_lora_rank
            + _linear(model.q_lora_rank, heads * (model.qk_nope_head_dim + model.qk_rope_head_dim))
            + _linear(h, model.kv_lora_rank + model.qk_rope_head_dim) + model.kv_lora_rank
            + _linear(model.kv_lora_rank, heads * (model.qk_nope_head_dim + model.v_head_dim))
            + _linear(heads * model.v_head_dim, h) + 2 * h)
    indexer = (_linear(model.q_lora_rank, model.index_n_heads * model.index_head_dim)
               + _linear(h, model.index_head_dim) + 2 * model.index_head_dim + _linear(h, model.index_n_heads))
    expert = 3 * _linear(h, model.moe_ffn_dim)
    blocks = model.n_layers + model.n_mtp_layers          # the MTP module carries one more MoE decoder block
    moe_blocks = model.n_moe_layers + model.n_mtp_layers
    return {
        "attention": attn * blocks,
        "indexer": indexer * blocks,
        "dense_ffn": 3 * _linear(h, model.dense_ffn_dim) * model.n_dense_layers,
        "shared_experts": expert * model.n_shared_experts * moe_blocks,
        "routed_experts": expert * model.n_routed_experts * moe_blocks,
        "router": (_linear(h, model.n_routed_experts) + model.n_routed_experts) * moe_blocks,
        "embeddings": 2 * _linear(model.vocab_size, h) + h,
        "mtp": (_linear(2 * h, h) + 3 * h) * model.n_mtp_layers,
    }


def fp8_weight_bytes(model: ModelSpec, params: float) -> float:
    """Bytes of ``params`` FP8 weights plus one float32 scale per ``weight_scale_block`` squared block
    ([DS] weight_block_size [128, 128])."""
    return params * model.weight_bytes_per_param + params / model.weight_scale_block ** 2 * 4


def weights_per_gpu_bytes(model: ModelSpec, deployment: DeploymentSpec) -> float:
    """Weight bytes held by one decode GPU.

    Attention-side weights are replicated on every GPU when attention is data-parallel (split ``tp`` ways
    otherwise); routed experts are split over ``ep`` GPUs; embeddings, the router and the shared experts are
    replicated. Linear weights are FP8 with block scales; embeddings are BF16.
    """
    p = param_counts(model)
    attn_split = 1 if deployment.attention_dp else deployment.tp
    replicated_fp8 = (p["attention"] + p["indexer"] + p["dense_ffn"] + p["mtp"]) / attn_split \
        + p["shared_experts"] + p["router"]
    routed_fp8 = p["routed_experts"] / deployment.ep
    return fp8_weight_bytes(model, replicated_fp8 + routed_fp8) + p["embeddings"] * model.embedding_bytes_per_param


def kv_budget_bytes(model: ModelSpec, deployment: DeploymentSpec, gpu: GPUSpec | None = None) -> float:
    """HBM left for caches on one GPU: ``HBM x mem_fraction_static - weights``.

    Raises ``ValueError`` when the weights alone do not fit.
    """
    gpu = gpu or gpu_spec(deployment.gpu)
    static = gpu.hbm_capacity_GiB * GiB * deployment.mem_fraction_static
    weights = weights_per_gpu_bytes(model, deployment)
    if weights >= static:
        raise ValueError(f"deployment {deployment.name!r}: the weights per GPU ({weights / 1e9:.1f} GB) do not fit in "
                         f"{gpu.name}'s {static / 1e9:.1f} GB (HBM x mem_fraction_static); use more expert-parallel "
                         f"GPUs (ep={deployment.ep}) or a larger GPU")
    return static - weights


@dataclass(frozen=True)
class BatchLimit:
    """The largest decode batch per GPU and what bounds it (``limited_by``: ``"gpu"``, ``"host"`` or, when no
    request fits, ``"infeasible"`` with ``reason``)."""

    batch: int
    limited_by: str
    context_len: int
    ratio: float
    gpu_bytes_per_request: float
    host_bytes_per_request: float
    kv_budget_bytes: float
    host_budget_bytes: float
    batch_gpu: int
    batch_host: int | None
    reason: str = ""


def largest_batch(context_len: int, ratio: float = 1.0, *, model: ModelSpec | str = "deepseek-v3.2-exp",
                  deployment: DeploymentSpec | str = "paper-table1", gpu: GPUSpec | str | None = None,
                  host: HostSpec | str | None = None) -> BatchLimit:
    """The largest batch per GPU for ``context_len`` tokens per request and sparse-memory ``ratio``.

    ``ratio == 1`` is the no-offload baseline (everything on the GPU); ``ratio < 1`` keeps the indexer cache and
    ``ratio`` of the latent cache on the GPU and the whole latent cache in host memory.
    """
    model, deployment, gpu, host = resolve(model, deployment, gpu, host)
    context_len = check_context_len(model, context_len)
    ratio = validate.ratio("ratio", ratio)
    rc = request_cache(model, context_len, ratio, deployment.kv_dtype)
    budget = kv_budget_bytes(model, deployment, gpu)
    host_budget = host.memory_capacity_GB_per_gpu * 1e9
    batch_gpu = int(budget // rc.gpu_bytes)
    batch_host = int(host_budget // rc.latent_host_bytes) if rc.latent_host_bytes else None
    slots = pool_slots(model, ratio, context_len)
    need = step_entries(model, context_len)
    common = dict(context_len=context_len, ratio=ratio, gpu_bytes_per_request=rc.gpu_bytes,
                  host_bytes_per_request=rc.latent_host_bytes, kv_budget_bytes=budget,
                  host_budget_bytes=host_budget, batch_gpu=batch_gpu, batch_host=batch_host)
    if slots < need:
        return BatchLimit(0, "infeasible", reason=f"ratio {ratio} leaves {slots} GPU slots per request and layer, "
                          f"fewer than the {need} entries one step selects (K)", **common)
    batch, limited_by = batch_gpu, "gpu"
    if batch_host is not None and batch_host < batch_gpu:
        batch, limited_by = batch_host, "host"
    if batch == 0:
        return BatchLimit(0, "infeasible", reason=f"one request needs {rc.gpu_bytes / 1e9:.2f} GB of GPU memory, "
                          f"the KV budget is {budget / 1e9:.2f} GB", **common)
    return BatchLimit(batch, limited_by, **common)


def host_memory_needed_bytes(batch: int, context_len: int, *, model: ModelSpec | str = "deepseek-v3.2-exp",
                             dtype: str = "fp8") -> int:
    """Host bytes that hold the whole latent cache of ``batch`` requests of ``context_len`` tokens."""
    model = model_spec(model) if isinstance(model, str) else model
    batch = validate.positive_int("batch", batch)
    context_len = check_context_len(model, context_len)
    return batch * padded_tokens(model, context_len) * latent_entry_bytes(model, dtype) * model.n_layers


def fit_mem_fraction_static(batch_limit: int, context_len: int, *, model: ModelSpec | str = "deepseek-v3.2-exp",
                            deployment: DeploymentSpec | str = "paper-table1") -> float:
    """The ``mem_fraction_static`` that puts the no-offload memory limit at ``batch_limit`` requests of
    ``context_len`` tokens: the budget is set halfway between ``batch_limit`` and ``batch_limit + 1`` requests,
    rounded to 3 decimals (as SGLang rounds it). A calibration: use it only on calibration data."""
    model, deployment, gpu, _ = resolve(model, deployment, None, None)
    batch_limit = validate.positive_int("batch_limit", batch_limit)
    rc = request_cache(model, context_len, 1.0, deployment.kv_dtype)
    static = weights_per_gpu_bytes(model, deployment) + (batch_limit + 0.5) * rc.gpu_bytes
    hbm = gpu.hbm_capacity_GiB * GiB
    if static > hbm:
        raise ValueError(f"batch_limit={batch_limit} requests of {context_len} tokens need {static / 1e9:,.0f} GB "
                         f"(weights and caches) but {gpu.name} has {hbm / 1e9:.0f} GB: no mem_fraction_static <= 1 "
                         f"puts the limit there")
    return round(static / hbm, 3)


def tier_placement(context_len: int, ratio: float, *, batch: int | None = None, model="deepseek-v3.2-exp",
                   deployment="paper-table1", gpu=None, host=None, n_spilled: int = 0):
    """Bytes per GPU in each tier for a decode batch: a DataFrame with columns ``tier`` (``"GPU"``, ``"host"``,
    ``"disk"``), ``part`` and ``bytes``, plus ``.attrs`` with the batch, the pool capacity per (request, layer)
    and what bounds the batch.

    ``batch=None`` takes the largest batch of :func:`largest_batch`. With ``ratio < 1`` the GPU holds
    the indexer cache and :func:`ess.layout.pool_slots` slots per request and layer, the host holds every latent entry;
    ``ratio == 1`` is the no-offload baseline (all latent entries on the GPU, none on the host). ``n_spilled``
    paused requests sit on disk with their whole latent cache."""
    import pandas as pd

    model, dep, gpu_, host_ = resolve(model, deployment, gpu, host)
    lim = largest_batch(context_len, ratio, model=model, deployment=dep, gpu=gpu_, host=host_)
    if batch is None:
        batch = lim.batch
    batch = validate.non_negative_int("batch", batch)
    n_spilled = validate.non_negative_int("n_spilled", n_spilled)
    rc = request_cache(model, context_len, ratio, dep.kv_dtype)
    entry = latent_entry_bytes(model, dep.kv_dtype)
    offload = ratio < 1.0
    capacity = pool_slots(model, ratio, context_len, need=step_entries(model, context_len)) if offload else rc.tokens
    pool = batch * model.n_layers * capacity * entry
    budget = kv_budget_bytes(model, dep, gpu_)
    hbm = gpu_.hbm_capacity_GiB * GiB
    weights = weights_per_gpu_bytes(model, dep)
    host_total = host_.memory_capacity_GB_per_gpu * 1e9
    host_latent = batch * rc.latent_bytes if offload else 0
    rows = [("GPU", "weights", weights), ("GPU", "indexer cache", batch * rc.indexer_bytes),
            ("GPU", "latent pool" if offload else "latent cache (all)", pool),
            ("GPU", "KV budget unused", max(budget - batch * rc.indexer_bytes - pool, 0.0)),
            ("GPU", "runtime reserve", hbm - weights - budget),
            ("host", "latent cache (all)", host_latent),
            ("host", "free", max(host_total - host_latent, 0.0)),
            ("disk", "spilled requests", n_spilled * rc.latent_bytes)]
    df = pd.DataFrame(rows, columns=["tier", "part", "bytes"])
    df.attrs.update(batch=int(batch), capacity=int(capacity), limited_by=lim.limited_by, reason=lim.reason,
                    largest_batch=lim.batch, context_len=int(context_len), ratio=float(ratio), gpu=gpu_.name,
                    deployment=dep.name, entry_bytes=entry, n_layers=model.n_layers)
    return df
