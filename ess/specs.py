"""Model, hardware and deployment specifications, loaded from ``data/``.

Every value lives in a YAML file under ``data/`` as ``field: {value: ..., source: ...}``; the dataclasses here
are frozen, carry units in their field names, validate themselves in ``__post_init__`` and never touch the disk.
Loading is done by the ``*_spec`` functions, which keep the per-value sources on the returned object
(``spec.sources["hidden_size"]``).

Glossary used across ``ess`` (the book's design page has the full table): B batch (requests per GPU), L context
length (tokens), K top-k (selected tokens per step), H attention heads, mtp (query tokens per request and step),
layer, ratio (sparse-memory ratio: GPU-resident latent entries / all latent entries), slot (one GPU-pool entry),
tier (GPU, CPU host memory, disk).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

DATA_DIR = Path(__file__).resolve().parent.parent / "data"

# The project's defaults, written once: the model ESS is built for (data/models/deepseek-v3.2-exp.yaml, [DS]) and
# the paper's experimental setting (data/deployments/paper-table1.yaml, [ARX] Table 1).
DEFAULT_MODEL = "deepseek-v3.2-exp"
DEFAULT_DEPLOYMENT = "paper-table1"

__all__ = [
    "DATA_DIR", "DEFAULT_MODEL", "DEFAULT_DEPLOYMENT", "ModelSpec", "GPUSpec", "HostSpec", "DeploymentSpec",
    "model_spec", "gpu_spec", "host_spec", "deployment_spec", "link_figures",
    "list_models", "list_gpus", "list_hosts", "list_deployments", "resolve",
]


def _require_positive(obj: Any, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is None or not value > 0:
            raise ValueError(f"{type(obj).__name__}.{name} must be > 0, got {value!r}")


@dataclass(frozen=True)
class ModelSpec:
    """Geometry of a DeepSeek-V3.2-style model (MLA + lightning indexer + MoE). Sizes are counts, not bytes,
    except the ``*_bytes`` fields, which give the storage format of weights and caches."""

    name: str
    vocab_size: int
    hidden_size: int
    n_layers: int
    n_dense_layers: int
    n_mtp_layers: int
    n_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    dense_ffn_dim: int
    moe_ffn_dim: int
    n_routed_experts: int
    n_shared_experts: int
    n_active_experts: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    max_position_embeddings: int
    rope_factor: float
    weight_bytes_per_param: int
    weight_scale_block: int
    embedding_bytes_per_param: int
    cache_fp8_bytes: int
    cache_scale_bytes: int
    cache_rope_bytes: int
    cache_bf16_bytes: int
    latent_fp8_tile: int
    cache_page_tokens: int
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        ints = tuple(f.name for f in dataclasses.fields(self) if f.name not in ("name", "sources", "n_shared_experts",
                                                                              "n_dense_layers", "n_mtp_layers"))
        _require_positive(self, ints)
        if not 0 <= self.n_dense_layers <= self.n_layers:
            raise ValueError(f"ModelSpec.n_dense_layers must be in [0, n_layers={self.n_layers}], got {self.n_dense_layers}")
        if self.kv_lora_rank % self.latent_fp8_tile:
            raise ValueError(f"ModelSpec.kv_lora_rank={self.kv_lora_rank} must be a multiple of latent_fp8_tile="
                             f"{self.latent_fp8_tile} (one FP8 scale per tile)")
        if self.n_active_experts > self.n_routed_experts:
            raise ValueError("ModelSpec.n_active_experts must not exceed n_routed_experts")

    @property
    def latent_dim(self) -> int:
        """Width of one MLA latent entry: c_KV plus the rope key (576 for DeepSeek-V3.2-Exp)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.n_dense_layers


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator. ``fp8_dense_TFLOPS`` is ``None`` for parts without FP8 tensor cores; ``sm_count`` its
    streaming multiprocessors (how many one-block-per-row kernels, such as the indexer's top-K, run in one wave)."""

    name: str
    hbm_capacity_GiB: float
    hbm_bandwidth_GB_per_s: float
    bf16_dense_TFLOPS: float
    fp8_dense_TFLOPS: float | None
    nvlink_GB_per_s: float
    pcie_gen: int
    sm_count: int
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        _require_positive(self, ("hbm_capacity_GiB", "hbm_bandwidth_GB_per_s", "bf16_dense_TFLOPS",
                                 "nvlink_GB_per_s", "sm_count"))
        if self.pcie_gen not in (4, 5):
            raise ValueError(f"GPUSpec.pcie_gen must be 4 or 5, got {self.pcie_gen!r}")

    @property
    def pcie_GB_per_s_per_direction(self) -> float:
        """Theoretical x16 bandwidth of this part's PCIe generation, one direction (data/hardware/links.yaml)."""
        return link_figures()["pcie"][f"gen{self.pcie_gen}_x16_GB_per_s_per_direction"]


@dataclass(frozen=True)
class HostSpec:
    """The CPU side of a node: where the offloaded latent cache lives."""

    name: str
    cpu: str
    sockets: int
    memory_capacity_GB: float
    memory_bandwidth_GB_per_s_per_socket: float
    gpus: int
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        _require_positive(self, ("sockets", "memory_capacity_GB", "memory_bandwidth_GB_per_s_per_socket", "gpus"))

    @property
    def memory_capacity_GB_per_gpu(self) -> float:
        return self.memory_capacity_GB / self.gpus


@dataclass(frozen=True)
class DeploymentSpec:
    """How the model is laid on the machines for decoding.

    ``attention_dp``: attention is data-parallel (each GPU serves its own requests, TP=1 for attention) while the
    MoE experts are split over ``ep`` GPUs. ``mtp`` query tokens are verified per decode step and
    ``mtp_accept_ratio`` of them are accepted on average. ``mem_fraction_static`` is the share of HBM the serving
    engine reserves for weights plus KV cache (the rest holds activations, CUDA graphs and workspace).
    """

    name: str
    gpu: str
    host: str
    nodes: int
    gpus_per_node: int
    tp: int
    ep: int
    attention_dp: bool
    mtp: int
    mtp_accept_ratio: float
    mem_fraction_static: float
    kv_dtype: str
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        _require_positive(self, ("nodes", "gpus_per_node", "tp", "ep", "mtp", "mtp_accept_ratio"))
        if not 0 < self.mem_fraction_static <= 1:
            raise ValueError(f"DeploymentSpec.mem_fraction_static must be in (0, 1], got {self.mem_fraction_static!r}")
        if self.ep > self.n_gpus:
            raise ValueError(f"DeploymentSpec.ep={self.ep} exceeds the {self.n_gpus} GPUs of the deployment")
        if self.mtp_accept_ratio > self.mtp:
            raise ValueError(f"DeploymentSpec.mtp_accept_ratio={self.mtp_accept_ratio} cannot exceed "
                             f"mtp={self.mtp}")
        if self.kv_dtype not in ("fp8", "bf16"):
            raise ValueError(f"DeploymentSpec.kv_dtype must be 'fp8' or 'bf16', got {self.kv_dtype!r}")

    @property
    def n_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def replace(self, **changes: Any) -> "DeploymentSpec":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


# ----------------------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _read_yaml(relpath: str) -> dict:
    path = DATA_DIR / relpath
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _split_sourced(entries: Mapping[str, Any], where: str) -> tuple[dict, dict]:
    values, sources = {}, {}
    for key, entry in entries.items():
        if not isinstance(entry, Mapping) or "value" not in entry or not entry.get("source"):
            raise ValueError(f"{where}: field {key!r} must be {{value: ..., source: ...}} with a non-empty source")
        values[key] = entry["value"]
        sources[key] = entry["source"]
    return values, sources


def _build(cls: type, values: dict, sources: dict, where: str):
    names = {f.name for f in dataclasses.fields(cls)} - {"sources"}
    missing = names - set(values)
    extra = set(values) - names
    if missing or extra:
        raise ValueError(f"{where}: missing fields {sorted(missing)}, unknown fields {sorted(extra)}")
    return cls(**values, sources=sources)


def _names(folder: str) -> list[str]:
    return sorted(p.stem for p in (DATA_DIR / folder).glob("*.yaml"))


def list_models() -> list[str]:
    return _names("models")


def list_deployments() -> list[str]:
    return _names("deployments")


def list_gpus() -> list[str]:
    return sorted(_read_yaml("hardware/gpus.yaml"))


def list_hosts() -> list[str]:
    return sorted(_read_yaml("hardware/hosts.yaml"))


def _check_name(kind: str, name: Any, allowed: list[str]) -> None:
    if not isinstance(name, str):
        raise TypeError(f"{kind} must be a preset name (a string; allowed: {', '.join(allowed)}), got "
                        f"{type(name).__name__} {name!r}")
    if name not in allowed:
        raise ValueError(f"unknown {kind} {name!r}; allowed: {', '.join(allowed)}")


def _preset(kind: str, listing):
    """A cached preset loader that refuses a name which is not a string before the cache hashes it (an unhashable
    name would otherwise fail inside the cache with a bare ``TypeError``); the loader checks the name itself."""
    def wrap(load):
        cached = functools.lru_cache(maxsize=None)(load)

        @functools.wraps(load)
        def get(name: str = load.__defaults__[0]):
            if not isinstance(name, str):
                _check_name(kind, name, listing())
            return cached(name)
        return get
    return wrap


@_preset("model", list_models)
def model_spec(name: str = DEFAULT_MODEL) -> ModelSpec:
    """The model preset ``name`` (``"deepseek-v3.2-exp"`` or ``"tiny"``) from ``data/models/``."""
    _check_name("model", name, list_models())
    values, sources = _split_sourced(_read_yaml(f"models/{name}.yaml"), f"data/models/{name}.yaml")
    return _build(ModelSpec, values, sources, f"data/models/{name}.yaml")


@_preset("gpu", list_gpus)
def gpu_spec(name: str = "H200") -> GPUSpec:
    """The GPU preset ``name`` from ``data/hardware/gpus.yaml``."""
    _check_name("gpu", name, list_gpus())
    values, sources = _split_sourced(_read_yaml("hardware/gpus.yaml")[name], f"gpus.yaml:{name}")
    return _build(GPUSpec, {"name": name, **values}, sources, f"gpus.yaml:{name}")


@_preset("host", list_hosts)
def host_spec(name: str = "dgx-h200") -> HostSpec:
    """The host preset ``name`` from ``data/hardware/hosts.yaml``."""
    _check_name("host", name, list_hosts())
    values, sources = _split_sourced(_read_yaml("hardware/hosts.yaml")[name], f"hosts.yaml:{name}")
    return _build(HostSpec, {"name": name, **values}, sources, f"hosts.yaml:{name}")


@_preset("deployment", list_deployments)
def deployment_spec(name: str = DEFAULT_DEPLOYMENT) -> DeploymentSpec:
    """The deployment preset ``name`` from ``data/deployments/``."""
    _check_name("deployment", name, list_deployments())
    where = f"data/deployments/{name}.yaml"
    values, sources = _split_sourced(_read_yaml(f"deployments/{name}.yaml"), where)
    spec = _build(DeploymentSpec, values, sources, where)
    _check_name("gpu", spec.gpu, list_gpus())
    _check_name("host", spec.host, list_hosts())
    return spec


@functools.lru_cache(maxsize=None)
def link_figures() -> dict[str, dict[str, float]]:
    """Host-device link figures (PCIe theoretical and measured, FlashTrans) as ``{group: {field: value}}``."""
    raw = _read_yaml("hardware/links.yaml")
    return {group: _split_sourced(entries, f"links.yaml:{group}")[0] for group, entries in raw.items()}


def resolve(model, deployment, gpu=None, host=None) -> tuple[ModelSpec, DeploymentSpec, GPUSpec, HostSpec]:
    """Turn preset names into specs (``gpu`` and ``host`` default to the deployment's); a ``TypeError`` for anything
    else than a name or a spec."""
    model = model_spec(model) if isinstance(model, str) else model
    deployment = deployment_spec(deployment) if isinstance(deployment, str) else deployment
    if not isinstance(model, ModelSpec):
        raise TypeError(f"model must be a preset name or ModelSpec, got {type(model).__name__}")
    if not isinstance(deployment, DeploymentSpec):
        raise TypeError(f"deployment must be a preset name or DeploymentSpec, got {type(deployment).__name__}")
    gpu = gpu_spec(gpu or deployment.gpu) if gpu is None or isinstance(gpu, str) else gpu
    host = host_spec(host or deployment.host) if host is None or isinstance(host, str) else host
    if not isinstance(gpu, GPUSpec):
        raise TypeError(f"gpu must be a preset name or GPUSpec, got {type(gpu).__name__}")
    if not isinstance(host, HostSpec):
        raise TypeError(f"host must be a preset name or HostSpec, got {type(host).__name__}")
    return model, deployment, gpu, host
