"""GPU and host memory planning: weights per GPU, the KV budget, the largest decode batch, and where the bytes of a
batch live (:func:`tier_placement`).

The model of one decode GPU (attention data-parallel, experts split over ``ep`` GPUs)::

    HBM x mem_fraction_static  =  weights on this GPU  +  KV budget
    KV budget                 >=  B x (indexer cache + ratio x latent cache)       (per request, all layers)
    host memory per GPU       >=  B x latent cache                                  (offload only, ratio < 1)

``mem_fraction_static`` is the serving engine's share of HBM for weights plus caches; the rest holds activations,
CUDA graphs and workspace. The offload pool must also hold what one step selects per request and layer: K entries,
or with MTP the union of the query tokens' top-K sets (on average over the layers, which share the ratio's slots).
:func:`batch_limits` is that rule for many configurations at once; :func:`largest_batch` is one configuration of it.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from . import validate
from .layout import (check_context_len, check_model, latent_entry_bytes, padded_tokens, pool_slots,
                     request_cache, step_entries)
from .specs import (DEFAULT_DEPLOYMENT, DEFAULT_MODEL, DeploymentSpec, GPUSpec, HostSpec, ModelSpec, gpu_spec,
                    model_spec, resolve)

__all__ = [
    "GiB", "param_counts", "fp8_weight_bytes", "expert_weight_bytes", "weights_per_gpu_bytes", "kv_budget_bytes", "BatchLimit", "BatchLimits",
    "batch_limits", "largest_batch", "step_slots_needed", "group_rows", "ratio_for_batch", "smallest_step_ratio",
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
    check_model(model)
    h, heads = model.hidden_size, model.n_heads
    # a shared-KV model (DeepSeek-V4) uses its one KV row as K and V: no up-projection of the latent; a grouped
    # low-rank output projection maps each group's heads to o_lora_rank, then all groups to the hidden size
    kv_up = 0 if model.kv_shared else _linear(model.kv_lora_rank, heads * (model.qk_nope_head_dim + model.v_head_dim))
    out = (_linear(heads * model.v_head_dim, model.o_lora_rank) + _linear(model.o_groups * model.o_lora_rank, h)
           if model.o_lora_rank else _linear(heads * model.v_head_dim, h))
    attn = (_linear(h, model.q_lora_rank) + model.q_lora_rank
            + _linear(model.q_lora_rank, heads * (model.qk_nope_head_dim + model.qk_rope_head_dim))
            + _linear(h, model.kv_lora_rank + model.qk_rope_head_dim) + model.kv_lora_rank
            + kv_up + out + 2 * h)
    indexer = (_linear(model.q_lora_rank, model.index_n_heads * model.index_head_dim)
               + _linear(h, model.index_head_dim) + 2 * model.index_head_dim + _linear(h, model.index_n_heads))
    expert = 3 * _linear(h, model.moe_ffn_dim)
    blocks = model.n_layers + model.n_mtp_layers          # the MTP module carries one more MoE decoder block
    moe_blocks = model.n_moe_layers + model.n_mtp_layers
    # an indexer on every layer the indexer selects from (every DSA layer and its MTP block; V4's C4 layers)
    indexed = model.n_sparse_layers + model.mtp_kinds.count("sparse")
    return {
        "attention": attn * blocks,
        "indexer": indexer * indexed,
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
    check_model(model)
    params = validate.real("params", params, lo=0.0)
    return params * model.weight_bytes_per_param + params / model.weight_scale_block ** 2 * 4


def expert_weight_bytes(model: ModelSpec, params: float) -> float:
    """Bytes of ``params`` routed-expert weights: FP8 with block scales (:func:`fp8_weight_bytes`), unless the model
    stores its experts in a format of their own (``expert_bytes_per_param``; DeepSeek-V4: FP4, 0.5 B) with one
    1-byte scale per ``expert_scale_group`` values."""
    if model.expert_bytes_per_param is None:
        return fp8_weight_bytes(model, params)
    group = model.expert_scale_group
    return params * model.expert_bytes_per_param + (params / group if group else 0.0)


def weights_per_gpu_bytes(model: ModelSpec, deployment: DeploymentSpec) -> float:
    """Weight bytes held by one decode GPU.

    Attention-side weights are replicated on every GPU when attention is data-parallel (split ``tp`` ways
    otherwise); routed experts are split over ``ep`` GPUs; embeddings, the router and the shared experts are
    replicated. Linear weights are FP8 with block scales; embeddings are BF16.
    """
    _check_deployment(deployment)
    p = param_counts(model)
    attn_split = 1 if deployment.attention_dp else deployment.tp
    replicated_fp8 = (p["attention"] + p["indexer"] + p["dense_ffn"] + p["mtp"]) / attn_split \
        + p["shared_experts"] + p["router"]
    routed = p["routed_experts"] / deployment.ep
    return (fp8_weight_bytes(model, replicated_fp8) + expert_weight_bytes(model, routed)
            + p["embeddings"] * model.embedding_bytes_per_param)


def _check_deployment(deployment) -> None:
    if not isinstance(deployment, DeploymentSpec):
        raise TypeError(f"deployment must be a DeploymentSpec, got {type(deployment).__name__}")


def kv_budget_bytes(model: ModelSpec, deployment: DeploymentSpec, gpu: GPUSpec | None = None) -> float:
    """HBM left for caches on one GPU: ``HBM x mem_fraction_static - weights``.

    Raises ``ValueError`` when the weights alone do not fit.
    """
    _check_deployment(deployment)
    gpu = gpu_spec(deployment.gpu) if gpu is None else gpu_spec(gpu) if isinstance(gpu, str) else gpu
    if not isinstance(gpu, GPUSpec):
        raise TypeError(f"gpu must be a preset name or GPUSpec, got {type(gpu).__name__}")
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
    request fits, ``"infeasible"`` with ``reason``): one configuration of :class:`BatchLimits`."""

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
    mtp: int = 1


_PER_CONFIGURATION = ("batch", "limited_by", "reason", "context_len", "ratio", "mtp", "gpu_bytes_per_request",
                      "host_bytes_per_request", "batch_gpu", "batch_host")


@dataclass(frozen=True, eq=False)
class BatchLimits:
    """The largest decode batch per GPU for many configurations at once, and what bounds each: arrays of one shape
    (``shape``, the broadcast shape of the arguments of :func:`batch_limits`) read as attributes -- ``batch``
    (int64), ``limited_by`` (``"gpu"``, ``"host"`` or ``"infeasible"``: batch 0, with ``reason``), ``reason``,
    ``context_len``, ``ratio``, ``mtp``, ``gpu_bytes_per_request``, ``host_bytes_per_request``, ``batch_gpu`` and
    ``batch_host`` (-1 where nothing lives in host memory: ratio 1). The rule is evaluated once per distinct
    (context, ratio, MTP): ``groups`` holds each array per distinct configuration and ``inverse`` maps every
    configuration to its group, so an attribute is built when it is read. ``kv_budget_bytes`` is NaN when the
    weights alone do not fit (every configuration is then infeasible). :meth:`at` gives one configuration as a
    :class:`BatchLimit`."""

    groups: dict
    inverse: np.ndarray
    shape: tuple
    kv_budget_bytes: float
    host_budget_bytes: float

    def __getattr__(self, name):
        if name in _PER_CONFIGURATION:
            return self.groups[name][np.ravel(self.inverse)].reshape(self.shape)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def weights_fit(self) -> bool:
        return not np.isnan(self.kv_budget_bytes)

    def at(self, index=()) -> BatchLimit:
        """Configuration ``index`` (default: the only one of a scalar call) as a :class:`BatchLimit`."""
        index = index if isinstance(index, tuple) else (index,)
        if len(index) != len(self.shape):
            raise ValueError(f"index must have {len(self.shape)} entries (the shape is {self.shape}), got {index!r}")
        index = tuple(validate.integer(f"index[{d}]", i, lo=-n, below=n) % n
                      for d, (i, n) in enumerate(zip(index, self.shape)))
        i = int(np.ravel(self.inverse)[np.ravel_multi_index(index, self.shape) if self.shape else 0])
        g = {k: v[i] for k, v in self.groups.items()}
        host = int(g["batch_host"])
        return BatchLimit(int(g["batch"]), str(g["limited_by"]), int(g["context_len"]), float(g["ratio"]),
                          float(g["gpu_bytes_per_request"]), float(g["host_bytes_per_request"]),
                          float(self.kv_budget_bytes), float(self.host_budget_bytes), int(g["batch_gpu"]),
                          None if host < 0 else host, str(g["reason"]), int(g["mtp"]))


def step_slots_needed(model: ModelSpec, context_len: int, mtp: int = 1) -> int:
    """Slots per layer a request needs, on average over the layers, for one step's union of ``mtp`` top-K sets: with
    one query token ``min(K, L)``; with MTP, :func:`ess.layout.step_entries` under the default locality model's
    per-layer overlaps (paper Fig. 2, ``data/locality/``), averaged and rounded up. The layers share the ratio's
    slots (:func:`ess.layout.layer_pool_slots`), so a ratio is feasible when its even share reaches this mean."""
    check_model(model)
    context_len = check_context_len(model, context_len)
    mtp = validate.integer("mtp", mtp, lo=1, below=model.max_position_embeddings + 1)
    return _step_slots_needed(model, context_len, mtp)


@lru_cache(maxsize=256)
def _step_slots_needed(model: ModelSpec, context_len: int, mtp: int) -> int:
    rows = model.sparse_rows(context_len)                   # a compressed model's pools hold rows
    if mtp == 1:
        return step_entries(model, rows)
    from .tracegen import locality_profile
    # Fig. 2's profile mapped onto the model's depth, at its sparse layers (every layer of a DSA model)
    overlap = locality_profile("paper", model.n_layers)[list(model.sparse_layers)]
    need = step_entries(model, rows, mtp, overlap=overlap)
    return int(np.ceil(np.mean(need)))


def group_rows(*cols):
    """Group rows by the values of ``cols`` (1-D arrays of one length): ``(first, inverse)``, the index of each
    group's first row and each row's group. Hash-based (pandas.factorize), so that grouping a million rows costs a
    few tens of ms. The memory rule evaluates the layout once per group; the simulator prices each group once."""
    import pandas as pd
    if not cols:
        raise ValueError("group_rows needs at least one column (cols)")
    cols = [np.ravel(validate.number_array(f"cols[{i}]", c, positive=False, allow_inf=True, max_ndim=None))
            for i, c in enumerate(cols)]
    if any(c.size != cols[0].size for c in cols):
        raise ValueError(f"cols must be 1-D arrays of one length, got lengths {[c.size for c in cols]}")
    code = np.zeros(cols[0].size, dtype=np.int64)
    for c in cols:
        ci, uniq = pd.factorize(c, sort=False)
        code = code * len(uniq) + ci
    inv, uniq = pd.factorize(code, sort=False)
    first = np.empty(len(uniq), dtype=np.int64)
    first[inv[::-1]] = np.arange(inv.size - 1, -1, -1)          # the last write wins: each group's first row
    return first, inv


def _limits(model: ModelSpec, dep: DeploymentSpec, gpu: GPUSpec, host: HostSpec, L, r, T) -> BatchLimits:
    """The rule of :func:`batch_limits` on validated, broadcast arrays (``L``, ``T`` int64, ``r`` float64). The
    layout rules (page padding, per-request bytes, pool slots, a step's need) are evaluated once per distinct
    (context, ratio, MTP) with the scalar helpers of :mod:`ess.layout`; only the divisions by the budgets are
    vectorised."""
    shape = L.shape
    host_budget = host.memory_capacity_GB_per_gpu * 1e9
    try:
        budget = kv_budget_bytes(model, dep, gpu)
        weights_reason = ""
    except ValueError as exc:                                     # the weights alone do not fit
        budget, weights_reason = float("nan"), str(exc)
    first, inv = group_rows(L, r, T)
    Lg, rg, Tg = (np.ravel(x)[first] for x in (L, r, T))
    n = len(first)
    gpu_b, host_b = np.empty(n), np.empty(n)
    slots, need = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    for i, (Li, ri, Ti) in enumerate(zip(Lg, rg, Tg)):
        rc = request_cache(model, int(Li), float(ri), dep.kv_dtype)
        gpu_b[i], host_b[i] = rc.gpu_bytes, rc.latent_host_bytes
        slots[i], need[i] = pool_slots(model, float(ri), int(Li)), _step_slots_needed(model, int(Li), int(Ti))
    if weights_reason:
        batch_gpu = np.zeros(n, dtype=np.int64)
    else:
        batch_gpu = np.floor_divide(budget, gpu_b).astype(np.int64)
    offload = host_b > 0
    batch_host = np.where(offload, np.floor_divide(host_budget, np.where(offload, host_b, 1.0)), -1).astype(np.int64)
    host_binds = offload & (batch_host < batch_gpu)
    batch = np.where(host_binds, batch_host, batch_gpu)
    few = slots < need
    batch = np.where(few, 0, batch)
    limited_by = np.where(host_binds, "host", "gpu").astype(object)
    limited_by[batch == 0] = "infeasible"
    reason = np.full(n, "", dtype=object)
    for i in np.flatnonzero(batch == 0):                          # one string per distinct configuration
        if weights_reason:
            reason[i] = weights_reason
        elif few[i]:
            what = ("one step selects (K)" if Tg[i] == 1 else
                    f"one step selects on average over the layers (the union of {int(Tg[i])} top-K sets)")
            reason[i] = (f"ratio {rg[i]:g} leaves {slots[i]} GPU slots per request and layer, fewer than the "
                         f"{need[i]} entries {what}")
        elif batch_gpu[i] == 0:
            reason[i] = (f"one request needs {gpu_b[i] / 1e9:.2f} GB of GPU memory, the KV budget is "
                         f"{budget / 1e9:.2f} GB")
        else:
            reason[i] = (f"one request needs {host_b[i] / 1e9:.2f} GB of host memory, the host holds "
                         f"{host_budget / 1e9:.0f} GB per GPU")
    groups = dict(batch=batch, limited_by=limited_by, reason=reason, context_len=Lg, ratio=rg, mtp=Tg,
                  gpu_bytes_per_request=gpu_b, host_bytes_per_request=host_b, batch_gpu=batch_gpu,
                  batch_host=batch_host)
    return BatchLimits(groups, inv.reshape(shape), shape, budget, host_budget)


def batch_limits(context_len, ratio=1.0, *, mtp=1, model: ModelSpec | str = DEFAULT_MODEL,
                 deployment: DeploymentSpec | str = DEFAULT_DEPLOYMENT, gpu: GPUSpec | str | None = None,
                 host: HostSpec | str | None = None) -> BatchLimits:
    """The largest batch per GPU for ``context_len`` tokens per request, sparse-memory ``ratio`` and ``mtp`` query
    tokens per request and step, for every configuration at once (arguments broadcast; see the module docstring):

    * ``batch_gpu = floor(KV budget / GPU bytes per request)`` (the indexer cache and ``ratio`` of the latent cache,
      :func:`ess.layout.request_cache`);
    * with offload (``ratio < 1``) ``batch_host = floor(host memory per GPU / latent bytes per request)``, and the
      batch is the smaller of the two (``limited_by`` says which);
    * infeasible (batch 0, with the reason) when the pool of a (request, layer) -- :func:`ess.layout.pool_slots` --
      cannot hold what one step selects (:func:`step_slots_needed`: K, or with MTP the union of the query tokens'
      sets on average over the layers), when one request does not fit, or when the weights alone do not fit.

    ``ratio == 1`` is the no-offload baseline (everything on the GPU). :func:`largest_batch` is one configuration of
    this rule."""
    model, dep, gpu, host = resolve(model, deployment, gpu, host)
    L = validate.number_array("context_len", context_len, whole=True, max_ndim=None)
    r = validate.number_array("ratio", ratio, max_ndim=None)
    T = validate.number_array("mtp", mtp, whole=True, max_ndim=None)
    if (T > model.max_position_embeddings).any():       # a step decodes at most a whole context
        raise ValueError(f"mtp must not exceed the maximum context of {model.name} "
                         f"({model.max_position_embeddings} tokens), got {mtp!r}")
    if (r > 1).any():
        raise ValueError(f"ratio must be in (0, 1], got {ratio!r}")
    if (L > model.max_position_embeddings).any():
        raise ValueError(f"context_len must not exceed the maximum context of {model.name} "
                         f"({model.max_position_embeddings} tokens), got {context_len!r}")
    try:
        L, r, T = np.broadcast_arrays(L, r, T)
    except ValueError:
        raise ValueError(f"context_len, ratio and mtp must broadcast to one shape, got {np.shape(L)}, "
                         f"{np.shape(r)} and {np.shape(T)}") from None
    return _limits(model, dep, gpu, host, L.astype(np.int64), r.astype(float), T.astype(np.int64))


def largest_batch(context_len: int, ratio: float = 1.0, *, mtp: int = 1, model: ModelSpec | str = DEFAULT_MODEL,
                  deployment: DeploymentSpec | str = DEFAULT_DEPLOYMENT, gpu: GPUSpec | str | None = None,
                  host: HostSpec | str | None = None) -> BatchLimit:
    """The largest batch per GPU for one configuration: :func:`batch_limits` for scalars, as a
    :class:`BatchLimit`. Raises ``ValueError`` when the weights alone do not fit (:func:`kv_budget_bytes`)."""
    model, deployment, gpu, host = resolve(model, deployment, gpu, host)
    context_len = check_context_len(model, context_len)
    ratio = validate.ratio("ratio", ratio)
    mtp = validate.positive_int("mtp", mtp)
    lim = batch_limits(context_len, ratio, mtp=mtp, model=model, deployment=deployment, gpu=gpu, host=host)
    if not lim.weights_fit:
        raise ValueError(str(lim.reason[()]))
    return lim.at()


def ratio_for_batch(batch, context_len, *, mtp=1, model: ModelSpec | str = DEFAULT_MODEL,
                    deployment: DeploymentSpec | str = DEFAULT_DEPLOYMENT, gpu=None, host=None,
                    decimals: int = 4):
    """The largest sparse-memory ratio (rounded down to ``decimals``) at which ``batch`` requests of
    ``context_len`` tokens fit in the KV budget: ``batch x (indexer + ratio x latent) <= budget`` (the rule the
    paper's configurations follow, paper-facts.md), with the per-request bytes of :func:`ess.layout.request_cache`;
    the result is then checked against :func:`batch_limits` (host memory, pool slots for a step of ``mtp`` query
    tokens). 1.0 when no offload is needed; NaN when no ratio fits."""
    model, dep, gpu, host = resolve(model, deployment, gpu, host)
    B = validate.number_array("batch", batch, whole=True, max_ndim=None)
    L = validate.number_array("context_len", context_len, whole=True, max_ndim=None)
    if (L > model.max_position_embeddings).any():
        raise ValueError(f"context_len must not exceed the maximum context of {model.name} "
                         f"({model.max_position_embeddings} tokens), got {context_len!r}")
    L = L.astype(np.int64)
    # a float64 ratio carries about 15 significant digits: more decimals would round nothing
    decimals = validate.integer("decimals", decimals, lo=0, below=16)
    try:
        B, L = np.broadcast_arrays(B, L)
    except ValueError:
        raise ValueError(f"batch and context_len must broadcast to one shape, got {np.shape(B)} and "
                         f"{np.shape(L)}") from None
    budget = kv_budget_bytes(model, dep, gpu)
    Lu, inv = np.unique(L.ravel(), return_inverse=True)
    caches = [request_cache(model, int(x), 1.0, dep.kv_dtype) for x in Lu]
    # what stays on the GPU whatever the ratio: the indexer keys (and a compressed model's resident rows)
    idx = np.array([c.indexer_bytes + c.resident_bytes for c in caches], dtype=float)[np.ravel(inv)].reshape(L.shape)
    lat = np.array([c.latent_bytes for c in caches], dtype=float)[np.ravel(inv)].reshape(L.shape)
    with np.errstate(divide="ignore"):
        r = (budget / B - idx) / lat
    r = np.floor(r * 10 ** decimals) / 10 ** decimals
    r = np.where(r >= 1.0, 1.0, r)
    ok = r > 0
    r = np.where(ok, r, np.nan)
    lim = batch_limits(L, np.where(ok, r, 1.0), mtp=mtp, model=model, deployment=dep, gpu=gpu, host=host)
    return np.where(ok & (lim.batch >= B), r, np.nan)


def smallest_step_ratio(context_len: int, mtp: int = 1, *, model: ModelSpec | str = DEFAULT_MODEL,
                        step: float = 0.01) -> float:
    """The smallest ratio on a grid of ``step`` whose pools (:func:`ess.layout.pool_slots`) hold one step
    (:func:`step_slots_needed`: K, or the union of ``mtp`` top-K sets on average over the layers); 1.0 if none
    below 1 does."""
    model = check_model(model_spec(model) if isinstance(model, str) else model)
    step = validate.real("step", step, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    if step < 1e-4:                                       # the grid is walked point by point
        raise ValueError(f"step must be at least 1e-4 (a grid of at most 10,000 ratios), got {step:g}")
    need = step_slots_needed(model, context_len, mtp)
    for r in np.arange(step, 1.0, step):
        r = round(float(r), 6)
        if pool_slots(model, r, context_len) >= need:
            return r
    return 1.0


def host_memory_needed_bytes(batch: int, context_len: int, *, model: ModelSpec | str = DEFAULT_MODEL,
                             dtype: str = "fp8") -> int:
    """Host bytes that hold the whole latent cache of ``batch`` requests of ``context_len`` tokens."""
    model = check_model(model_spec(model) if isinstance(model, str) else model)
    batch = validate.positive_int("batch", batch)
    context_len = check_context_len(model, context_len)
    return batch * request_cache(model, context_len, 1.0, dtype).latent_bytes


def fit_mem_fraction_static(batch_limit: int, context_len: int, *, model: ModelSpec | str = DEFAULT_MODEL,
                            deployment: DeploymentSpec | str = DEFAULT_DEPLOYMENT) -> float:
    """The ``mem_fraction_static`` that puts the no-offload memory limit at ``batch_limit`` requests of
    ``context_len`` tokens: the budget is set halfway between ``batch_limit`` and ``batch_limit + 1`` requests,
    rounded to 3 decimals (as SGLang rounds it). A calibration: use it only on calibration data."""
    model, deployment, gpu, _ = resolve(model, deployment, None, None)
    batch_limit = validate.positive_int("batch_limit", batch_limit)
    rc = request_cache(model, context_len, 1.0, deployment.kv_dtype)
    hbm = gpu.hbm_capacity_GiB * GiB
    static = weights_per_gpu_bytes(model, deployment) + (min(batch_limit, hbm // rc.gpu_bytes + 1) + 0.5) * rc.gpu_bytes
    if static > hbm:
        raise ValueError(f"batch_limit={batch_limit} requests of context_len={context_len} tokens need at least {static / 1e9:,.0f} GB "
                         f"(weights and caches) but {gpu.name} has {hbm / 1e9:.0f} GB: no mem_fraction_static <= 1 "
                         f"puts the limit there")
    return round(static / hbm, 3)


def tier_placement(context_len: int, ratio: float, *, batch: int | None = None, model=DEFAULT_MODEL,
                   deployment=DEFAULT_DEPLOYMENT, gpu=None, host=None, n_spilled: int = 0):
    """Bytes per GPU in each tier for a decode batch: a DataFrame with columns ``tier`` (``"GPU"``, ``"host"``,
    ``"disk"``), ``part`` and ``bytes``, plus ``.attrs`` with the batch, the pool capacity per (request, layer)
    and what bounds the batch.

    ``batch=None`` takes the largest batch of :func:`largest_batch`. With ``ratio < 1`` the GPU holds
    the indexer cache and :func:`ess.layout.pool_slots` slots per request and layer, the host holds every latent entry;
    ``ratio == 1`` is the no-offload baseline (all latent entries on the GPU, none on the host). ``n_spilled``
    paused requests sit on disk with their whole latent cache. A ``batch`` above the largest one that fits is a
    ``ValueError`` (its bytes would not fit in the GPU's or the host's memory)."""
    import pandas as pd

    model, dep, gpu_, host_ = resolve(model, deployment, gpu, host)
    lim = largest_batch(context_len, ratio, model=model, deployment=dep, gpu=gpu_, host=host_)
    if batch is None:
        batch = lim.batch
    batch = validate.non_negative_int("batch", batch)
    if batch > lim.batch:
        raise ValueError(f"batch={batch} does not fit: at context_len={lim.context_len} and ratio {lim.ratio:g} the "
                         f"largest batch on {gpu_.name} is {lim.batch} (limited by {lim.limited_by}"
                         f"{': ' + lim.reason if lim.reason else ''})")
    n_spilled = validate.integer("n_spilled", n_spilled, lo=0, below=2 ** 63)       # a count of requests (int64)
    rc = request_cache(model, context_len, ratio, dep.kv_dtype)
    entry = latent_entry_bytes(model, dep.kv_dtype)
    offload = ratio < 1.0
    capacity = pool_slots(model, ratio, context_len, need=step_entries(model, context_len)) if offload else rc.tokens
    pool = batch * model.n_sparse_layers * capacity * entry
    budget = kv_budget_bytes(model, dep, gpu_)
    hbm = gpu_.hbm_capacity_GiB * GiB
    weights = weights_per_gpu_bytes(model, dep)
    host_total = host_.memory_capacity_GB_per_gpu * 1e9
    host_latent = batch * rc.latent_bytes if offload else 0
    kept = batch * (rc.indexer_bytes + rc.resident_bytes)     # on the GPU whatever the ratio
    rows = [("GPU", "weights", weights), ("GPU", "indexer cache", batch * rc.indexer_bytes)]
    if rc.resident_bytes:                                      # a compressed model's dense rows and windows
        rows.append(("GPU", "dense rows and windows", batch * rc.resident_bytes))
    rows += [("GPU", "latent pool" if offload else "latent cache (all)", pool),
            ("GPU", "KV budget unused", max(budget - kept - pool, 0.0)),
            ("GPU", "runtime reserve", hbm - weights - budget),
            ("host", "latent cache (all)", host_latent),
            ("host", "free", max(host_total - host_latent, 0.0)),
            ("disk", "spilled requests", n_spilled * float(rc.latent_bytes))]
    df = pd.DataFrame(rows, columns=["tier", "part", "bytes"])
    df.attrs.update(batch=int(batch), capacity=int(capacity), limited_by=lim.limited_by, reason=lim.reason,
                    largest_batch=lim.batch, context_len=int(context_len), ratio=float(ratio), gpu=gpu_.name,
                    deployment=dep.name, entry_bytes=entry, n_layers=model.n_sparse_layers)
    return df
