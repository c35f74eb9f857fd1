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
    "HostLinkSpec", "model_spec", "gpu_spec", "host_spec", "deployment_spec", "host_link_spec", "reference_link",
    "link_figures",
    "list_models", "list_gpus", "list_hosts", "list_deployments", "list_host_links", "resolve", "LAYER_KINDS",
    "PCIE_GENERATIONS", "HOST_INTERFACES", "EP_TRANSPORTS",
]

#: what a layer's cache holds (:attr:`ModelSpec.layer_kinds`): ``"sparse"`` rows the indexer selects top-K of (every
#: DSA layer; DeepSeek-V4's C4 layers), ``"dense"`` compressed rows attended in full (V4's C128 layers), ``"window"``
#: only the last ``sliding_window`` raw tokens (V4's first layers)
LAYER_KINDS = ("sparse", "dense", "window")
PCIE_GENERATIONS = (4, 5, 6)
#: how a GPU reaches host memory: over PCIe, or over NVLink-C2C to its Grace CPU (GH200, GB200)
HOST_INTERFACES = ("pcie", "nvlink-c2c")
#: how the expert-parallel all-to-all travels: over the NICs (RDMA, the paper's 4 nodes) or inside one NVLink domain
EP_TRANSPORTS = ("rdma", "nvlink")


def _check_field_types(obj: Any) -> None:
    """Each field annotated ``int`` (or ``int | None``) holds an integer, never a float a later ``int()`` would
    truncate; each annotated ``bool`` a bool (``"no"`` is truthy). The message names ``Class.field``."""
    from .validate import boolean, integer
    for f in dataclasses.fields(obj):
        value, kind = getattr(obj, f.name), str(f.type)
        if kind in ("int", "int | None") and not (value is None and kind == "int | None"):
            integer(f"{type(obj).__name__}.{f.name}", value)
        elif kind == "bool":
            boolean(f"{type(obj).__name__}.{f.name}", value)


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
    # -- fields a DSA model (DeepSeek-V3.2, GLM-5) leaves at their defaults; compressed models (DeepSeek-V4) set them
    layer_compress_ratios: tuple | None = None
    sparse_compress_ratio: int = 1
    sliding_window: int = 0
    latent_pad_bytes: int = 0
    indexer_scale_bytes: int | None = None
    kv_shared: bool = False
    o_groups: int = 1
    o_lora_rank: int = 0
    expert_bytes_per_param: float | None = None
    expert_scale_group: int | None = None
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check_field_types(self)
        optional = {"layer_compress_ratios", "sparse_compress_ratio", "sliding_window", "latent_pad_bytes",
                    "indexer_scale_bytes", "kv_shared", "o_groups", "o_lora_rank", "expert_bytes_per_param",
                    "expert_scale_group"}
        ints = tuple(f.name for f in dataclasses.fields(self) if f.name not in ("name", "sources", "n_shared_experts",
                                                                              "n_dense_layers", "n_mtp_layers")
                     and f.name not in optional)
        _require_positive(self, ints)
        self._check_compressed()
        if not 0 <= self.n_dense_layers <= self.n_layers:
            raise ValueError(f"ModelSpec.n_dense_layers must be in [0, n_layers={self.n_layers}], got {self.n_dense_layers}")
        if self.kv_lora_rank % self.latent_fp8_tile:
            raise ValueError(f"ModelSpec.kv_lora_rank={self.kv_lora_rank} must be a multiple of latent_fp8_tile="
                             f"{self.latent_fp8_tile} (one FP8 scale per tile)")
        if self.n_active_experts > self.n_routed_experts:
            raise ValueError("ModelSpec.n_active_experts must not exceed n_routed_experts")

    def _check_compressed(self) -> None:
        """The fields of compressed and shared-KV models: each a whole number in its range, the per-layer ratios one
        per layer, at least one layer the indexer selects from."""
        for name, lo in (("sparse_compress_ratio", 1), ("sliding_window", 0), ("latent_pad_bytes", 0),
                         ("o_groups", 1), ("o_lora_rank", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"ModelSpec.{name} must be a whole number >= {lo}, got {v!r}")
        if not isinstance(self.kv_shared, bool):
            raise TypeError(f"ModelSpec.kv_shared must be True or False, got {self.kv_shared!r}")
        for name in ("indexer_scale_bytes", "expert_scale_group"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"ModelSpec.{name} must be a whole number >= 1 or None, got {v!r}")
        e = self.expert_bytes_per_param
        if e is not None and (isinstance(e, bool) or not isinstance(e, (int, float)) or not e > 0):
            raise ValueError(f"ModelSpec.expert_bytes_per_param must be > 0 or None, got {e!r}")
        if self.n_heads % self.o_groups:
            raise ValueError(f"ModelSpec.o_groups={self.o_groups} must divide n_heads={self.n_heads}")
        if (self.o_groups > 1) != (self.o_lora_rank > 0):
            raise ValueError("ModelSpec.o_groups > 1 and o_lora_rank > 0 go together (a grouped low-rank output "
                             "projection)")
        ratios = self.layer_compress_ratios
        if ratios is None:
            if self.sparse_compress_ratio != 1 or self.sliding_window:
                raise ValueError("ModelSpec: sparse_compress_ratio and sliding_window need layer_compress_ratios")
            return
        ratios = tuple(ratios)
        if len(ratios) not in (self.n_layers, self.n_layers + self.n_mtp_layers) or any(
                isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in ratios):
            raise ValueError(f"ModelSpec.layer_compress_ratios must give one whole number >= 0 per layer "
                             f"({self.n_layers}, or {self.n_layers + self.n_mtp_layers} with the MTP blocks), got "
                             f"{ratios!r}")
        if self.sparse_compress_ratio not in ratios[:self.n_layers]:
            raise ValueError(f"ModelSpec.layer_compress_ratios has no layer at sparse_compress_ratio="
                             f"{self.sparse_compress_ratio} (the layers the indexer selects from)")
        if 0 in ratios and not self.sliding_window:
            raise ValueError("ModelSpec: a window-only layer (compress ratio 0) needs sliding_window > 0")
        object.__setattr__(self, "layer_compress_ratios", ratios)

    @property
    def latent_dim(self) -> int:
        """Width of one MLA latent entry: c_KV plus the rope key (576 for DeepSeek-V3.2-Exp)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.n_dense_layers

    def _kinds(self, ratios) -> tuple:
        return tuple("window" if r == 0 else "sparse" if r == self.sparse_compress_ratio else "dense" for r in ratios)

    @property
    def layer_kinds(self) -> tuple:
        """What each layer's cache holds (:data:`LAYER_KINDS`): every layer ``"sparse"`` for a DSA model; for a
        compressed one, ``"sparse"`` where the ratio is ``sparse_compress_ratio``, ``"window"`` where it is 0,
        ``"dense"`` elsewhere."""
        if self.layer_compress_ratios is None:
            return ("sparse",) * self.n_layers
        return self._kinds(self.layer_compress_ratios[:self.n_layers])

    @property
    def mtp_kinds(self) -> tuple:
        """The kind of each MTP block's layer: as the model's layers for a DSA model (DeepSeek-V3.2's MTP block is a
        DSA layer); for a compressed model the ratios after the ``n_layers`` first (DeepSeek-V4-Flash's 44th
        compress ratio, 0: a window-only block), ``"window"`` where none is given."""
        if self.layer_compress_ratios is None:
            return ("sparse",) * self.n_mtp_layers
        tail = self.layer_compress_ratios[self.n_layers:]
        return self._kinds(tail) + ("window",) * (self.n_mtp_layers - len(tail))

    @property
    def sparse_layers(self) -> tuple:
        """Indices of the layers whose rows the indexer selects: the ones offload moves to host memory."""
        return tuple(i for i, k in enumerate(self.layer_kinds) if k == "sparse")

    @property
    def n_sparse_layers(self) -> int:
        return len(self.sparse_layers)

    @property
    def dense_compress_ratios(self) -> tuple:
        """The compress ratio of every ``"dense"`` layer (rows attended in full, kept on the GPU)."""
        return tuple(r for r, k in zip((self.layer_compress_ratios or ())[:self.n_layers], self.layer_kinds)
                     if k == "dense")

    @property
    def n_window_layers(self) -> int:
        """Layers that keep only the sliding window."""
        return self.layer_kinds.count("window")

    def sparse_rows(self, context_len):
        """Rows one sparse layer holds for ``context_len`` tokens: the tokens themselves for a DSA model, one row per
        ``sparse_compress_ratio`` completed tokens for a compressed one (a row is written when its tokens are all
        there). Works on numbers and integer arrays."""
        return context_len // self.sparse_compress_ratio


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
    tdp_W: float | None = None
    host_interface: str = "pcie"
    architecture: str = "hopper"
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check_field_types(self)
        _require_positive(self, ("hbm_capacity_GiB", "hbm_bandwidth_GB_per_s", "bf16_dense_TFLOPS",
                                 "nvlink_GB_per_s", "sm_count"))
        if self.pcie_gen not in PCIE_GENERATIONS:
            raise ValueError(f"GPUSpec.pcie_gen must be one of {PCIE_GENERATIONS}, got {self.pcie_gen!r}")
        if self.tdp_W is not None:
            _require_positive(self, ("tdp_W",))
        if self.host_interface not in HOST_INTERFACES:
            raise ValueError(f"GPUSpec.host_interface must be one of {HOST_INTERFACES}, got {self.host_interface!r}")
        if self.architecture not in ("ampere", "hopper", "blackwell"):
            raise ValueError(f"GPUSpec.architecture must be 'ampere', 'hopper' or 'blackwell', got "
                             f"{self.architecture!r}")

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
        _check_field_types(self)
        _require_positive(self, ("sockets", "memory_capacity_GB", "memory_bandwidth_GB_per_s_per_socket", "gpus"))

    @property
    def memory_capacity_GB_per_gpu(self) -> float:
        return self.memory_capacity_GB / self.gpus

    @property
    def memory_bandwidth_GB_per_s_per_gpu(self) -> float:
        """Each GPU's share of the host's DRAM bandwidth: ``sockets x per-socket bandwidth / gpus``."""
        return self.sockets * self.memory_bandwidth_GB_per_s_per_socket / self.gpus


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
    ep_transport: str = "rdma"
    max_batch_per_gpu: int | None = None
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check_field_types(self)
        _require_positive(self, ("nodes", "gpus_per_node", "tp", "ep", "mtp", "mtp_accept_ratio"))
        if self.ep_transport not in EP_TRANSPORTS:
            raise ValueError(f"DeploymentSpec.ep_transport must be one of {EP_TRANSPORTS}, got {self.ep_transport!r}")
        if self.max_batch_per_gpu is not None and (isinstance(self.max_batch_per_gpu, bool)
                                                   or not isinstance(self.max_batch_per_gpu, int)
                                                   or self.max_batch_per_gpu < 1):
            raise ValueError(f"DeploymentSpec.max_batch_per_gpu must be a whole number >= 1 or None, got "
                             f"{self.max_batch_per_gpu!r}")
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


@dataclass(frozen=True)
class HostLinkSpec:
    """One way of moving cache entries between host memory and a GPU, per direction (GB/s, GB = 1e9 bytes):
    ``interface`` (``"pcie4"``, ``"pcie5"``, ``"pcie6"`` or ``"nvlink-c2c"``), ``measured`` (a copy rate measured
    on a real machine, or a theoretical figure) and what it is (``label``). A PCIe link serves a GPU whose PCIe
    generation reaches it; an NVLink-C2C link a GPU that reaches its host over C2C (:meth:`serves`).
    ``reference_for``: the GPUs whose summary figures take this link (:func:`reference_link`)."""

    name: str
    label: str
    interface: str
    h2d_GB_per_s: float
    d2h_GB_per_s: float
    measured: bool
    reference_for: tuple = ()
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check_field_types(self)
        _require_positive(self, ("h2d_GB_per_s", "d2h_GB_per_s"))
        object.__setattr__(self, "reference_for", tuple(self.reference_for or ()))
        if self.interface not in ("pcie4", "pcie5", "pcie6", "nvlink-c2c"):
            raise ValueError(f"HostLinkSpec.interface must be pcie4, pcie5, pcie6 or nvlink-c2c, got "
                             f"{self.interface!r}")
        if not isinstance(self.measured, bool):
            raise TypeError(f"HostLinkSpec.measured must be True or False, got {self.measured!r}")

    def serves(self, gpu: "GPUSpec") -> bool:
        """Whether ``gpu`` can use this link: its host interface, and for PCIe a generation it supports."""
        if self.interface == "nvlink-c2c":
            return gpu.host_interface == "nvlink-c2c"
        return gpu.host_interface == "pcie" and int(self.interface[-1]) <= gpu.pcie_gen


# ----------------------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------------------

class _FrozenDict(dict):
    """A dict no caller can change: the loaders cache each spec, so one caller's change to a spec's ``sources``
    would reach every later caller. It still copies, pickles and writes as JSON like a dict."""

    def _read_only(self, *args, **kwargs):
        raise TypeError("a preset spec's sources are read-only (shared by every caller): copy them with dict(...)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _read_only
    __ior__ = _read_only

    def __reduce__(self):
        return (type(self), (dict(self),))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


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
    fields = [f for f in dataclasses.fields(cls) if f.name != "sources"]
    names = {f.name for f in fields}
    required = {f.name for f in fields if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING}
    missing = required - set(values)
    extra = set(values) - names
    if missing or extra:
        raise ValueError(f"{where}: missing fields {sorted(missing)}, unknown fields {sorted(extra)}")
    return cls(**values, sources=_FrozenDict(sources))


def _names(folder: str) -> list[str]:
    return sorted(p.stem for p in (DATA_DIR / folder).glob("*.yaml"))


def list_models() -> list[str]:
    """The model presets' names (``data/models/*.yaml``), sorted: each one a name for :func:`model_spec`.

    >>> "deepseek-v3.2-exp" in list_models() and "tiny" in list_models()
    True
    """
    return _names("models")


def list_deployments() -> list[str]:
    """The deployment presets' names (``data/deployments/*.yaml``), sorted: each one a name for
    :func:`deployment_spec`.

    >>> DEFAULT_DEPLOYMENT in list_deployments()
    True
    """
    return _names("deployments")


def list_gpus() -> list[str]:
    """The GPU presets' names (``data/hardware/gpus.yaml``), sorted: each one a name for :func:`gpu_spec`.

    >>> "H200" in list_gpus()
    True
    """
    return sorted(_read_yaml("hardware/gpus.yaml"))


def list_hosts() -> list[str]:
    """The host presets' names (``data/hardware/hosts.yaml``), sorted: each one a name for :func:`host_spec`."""
    return sorted(_read_yaml("hardware/hosts.yaml"))


def list_host_links() -> list[str]:
    """The host-link presets' names in the order of ``data/hardware/host_links.yaml``: each one a name for
    :func:`host_link_spec`."""
    return list(_read_yaml("hardware/host_links.yaml"))


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
    """The model preset ``name`` (e.g. ``"deepseek-v3.2-exp"`` or ``"tiny"``; :func:`list_models` names them all)
    from ``data/models/``."""
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


@_preset("host link", list_host_links)
def host_link_spec(name: str = "pcie5-flashtrans") -> HostLinkSpec:
    """The host-link preset ``name`` from ``data/hardware/host_links.yaml``."""
    _check_name("host link", name, list_host_links())
    values, sources = _split_sourced(_read_yaml("hardware/host_links.yaml")[name], f"host_links.yaml:{name}")
    return _build(HostLinkSpec, {"name": name, **values}, sources, f"host_links.yaml:{name}")


def reference_link(gpu: str) -> str:
    """The host link a GPU's summary figures take (``reference_for`` in ``data/hardware/host_links.yaml``: the
    paper's measured kernel copy rate on a PCIe host, the rate measured on its own platform on a Grace system)."""
    for name in list_host_links():
        if gpu in host_link_spec(name).reference_for:
            return name
    raise ValueError(f"no host link in data/hardware/host_links.yaml names {gpu!r} in its reference_for")


def link_figures() -> dict[str, dict[str, float]]:
    """Host-device link figures (PCIe theoretical and measured, FlashTrans) as ``{group: {field: value}}`` (a fresh
    copy per call: a caller's change stays its own)."""
    return {group: dict(figures) for group, figures in _link_figures().items()}


@functools.lru_cache(maxsize=None)
def _link_figures() -> dict[str, dict[str, float]]:
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
