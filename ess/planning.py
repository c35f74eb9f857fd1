"""Does latent offload pay for my model on my GPU at my context, at which batch and ratio, and how sure is that?
:func:`plan` answers in one call (``ess plan`` on the command line), from the stored calibration and miss tables
(:mod:`ess.sim.store`): about a second in a new process, milliseconds after that.

>>> p = plan("deepseek-v3.2-exp", "H200", 32768)                  # the paper's model, GPU and context
>>> p.batch > p.baseline_batch and p.gain_pct > 0                 # offload holds more requests, and it pays
True
>>> p.limit                                                       # what stops a larger batch
'GPU memory'

The answer is the best cell of notebook 10's grid (:mod:`ess.sim.grid`, the same functions): the best offload batch
and sparse-memory ratio against the best batch without offload, with the calibration band (what the calibration
data leave open) and the extrapolation band (what ess was not calibrated on), the limit that binds, the GPU pool and
host memory the plan needs, the misses per layer, how busy the link is, the link speed below which offload stops
paying and the one from which the overlap strategies stop mattering, and which inputs are calibrated and which
extrapolated. :attr:`Plan.curve` is the whole throughput-per-GPU against tokens-per-second-per-request curve (the
Pareto view), with and without offload; :meth:`Plan.serving` the settings to deploy.

:class:`PlanRequest` and :class:`SimulateRequest` are the typed configuration of the two questions; each field's
help, unit and command-line flag live in its metadata, and the ``ess`` command builds its flags from them.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from . import validate
from .options import option as _meta, parse_tokens
from .specs import DEFAULT_DEPLOYMENT, DEFAULT_MODEL, deployment_spec, list_gpus, list_models, model_spec

__all__ = ["plan", "Plan", "PlanRequest", "SimulateRequest", "simulate_config", "planner_inputs", "parse_tokens",
           "LIMITS", "shipped_tables", "regenerate"]

#: the limit that stops a batch, in words (the grid's names on the left)
LIMITS = {"gpu": "GPU memory", "host": "host memory", "batch cap": "batch cap",
          "throughput": "compute (a larger batch is slower per GPU)"}


def _ratio_arg(value: Any) -> float | str:
    if isinstance(value, str):
        if value.strip().lower() == "best":
            return "best"
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"ratio must be a number in (0, 1) or 'best', got {value!r}") from None
    return validate.real("ratio", value, lo=0.0, hi=1.0, lo_open=True, hi_open=True)


@dataclass(frozen=True)
class PlanRequest:
    """The question :func:`plan` answers (``ess plan``): each field's help, unit and flag in its metadata."""

    model: str = field(default=DEFAULT_MODEL, metadata=_meta(
        "model preset (data/models/)", "name", "--model", choices=list_models))
    gpu: str = field(default="H200", metadata=_meta(
        "GPU preset (data/hardware/gpus.yaml); the deployment is the paper's shape on it", "name", "--gpu",
        choices=list_gpus))
    context_len: int = field(default=32768, metadata=_meta(
        "context length per request", "tokens (32k = 32,768)", "--context", parse=parse_tokens))
    link: str | None = field(default=None, metadata=_meta(
        "host link preset (data/hardware/host_links.yaml; default the GPU's reference link)", "name", "--link"))
    mtp: int | None = field(default=None, metadata=_meta(
        "query tokens per request and step (MTP; default the deployment's, 2)", "tokens", "--mtp", parse=int))
    accept_ratio: float | None = field(default=None, metadata=_meta(
        "accepted tokens per step (default the sourced one for the MTP: 1, 1.7 or 2.8)", "tokens", "--accept-ratio",
        parse=float))
    ratio: float | str = field(default="best", metadata=_meta(
        "sparse-memory ratio: share of each request's latent entries on the GPU, or 'best'", "fraction",
        "--ratio", parse=_ratio_arg))
    strategy: str = field(default="best", metadata=_meta(
        "overlap of copies with compute: none, da, dba, or best (per layer)", "name", "--strategy",
        choices=lambda: ["best", "none", "da", "dba"]))

    def __post_init__(self):
        _check_counts(self)


def _check_counts(request) -> None:
    """A request's counts are integers (never a truncated float): its context, MTP and (``ess simulate``) batch;
    the rest is checked where it is answered (:func:`plan`, :func:`simulate_config`)."""
    validate.positive_int("context_len", request.context_len)
    if request.mtp is not None:
        validate.positive_int("mtp", request.mtp)
    if hasattr(request, "batch"):
        validate.positive_int("batch", request.batch)


@dataclass(frozen=True)
class SimulateRequest:
    """One configuration to simulate (``ess simulate``)."""

    batch: int = field(default=52, metadata=_meta("requests per GPU", "requests", "--batch", parse=int))
    context_len: int = field(default=32768, metadata=PlanRequest.__dataclass_fields__["context_len"].metadata)
    ratio: float = field(default=1.0, metadata=_meta(
        "sparse-memory ratio (1: no offload)", "fraction", "--ratio", parse=float))
    model: str = field(default=DEFAULT_MODEL, metadata=PlanRequest.__dataclass_fields__["model"].metadata)
    gpu: str = field(default="H200", metadata=PlanRequest.__dataclass_fields__["gpu"].metadata)
    link: str | None = field(default=None, metadata=PlanRequest.__dataclass_fields__["link"].metadata)
    mtp: int | None = field(default=None, metadata=PlanRequest.__dataclass_fields__["mtp"].metadata)
    accept_ratio: float | None = field(default=None,
                                       metadata=PlanRequest.__dataclass_fields__["accept_ratio"].metadata)
    strategy: str = field(default="best", metadata=PlanRequest.__dataclass_fields__["strategy"].metadata)

    def __post_init__(self):
        _check_counts(self)


# ------------------------------------------------------------------------------------------------------ inputs
@functools.lru_cache(maxsize=4)
def _inputs(sizes):
    from .sim.grid import grid_inputs
    return grid_inputs(sizes=sizes)


def planner_inputs(*, sizes=None):
    """The grid's inputs as :func:`plan` reads them (:func:`ess.sim.grid.grid_inputs`, stored): one object per
    process and ``sizes`` (:class:`ess.sim.misses.BandSizes`; default :data:`ess.sim.misses.PLANNER_SIZES`, notebook
    10's grid's), so that miss rows computed for one answer serve the next."""
    from .sim.misses import PLANNER_SIZES, _sizes
    return _inputs(_sizes("sizes", sizes, PLANNER_SIZES))


def _check(model, gpu, context_len, link, mtp, accept_ratio, ratio, strategy, *, no_offload: bool = False):
    """Validated arguments: ``(spec, gpu, L, link, T, accept_ratio or None, ratio, strategy)``; ``no_offload``: a
    ratio of 1 (no offload) is allowed."""
    from .sim.grid import accept_ratio_for, grid_deployment, serving_link
    if not isinstance(model, str):
        raise TypeError(f"model must be a preset name (one of {list_models()}), got {type(model).__name__}")
    validate.one_of("model", model, list_models())
    spec = model_spec(model)
    dep = deployment_spec(grid_deployment(gpu))         # a GPU the grid cannot price: a ValueError naming it
    L = validate.integer("context_len", context_len, lo=1, below=spec.max_position_embeddings + 1)
    if link is None:
        from .specs import reference_link
        link = reference_link(gpu)
    link = serving_link(gpu, link)
    T = dep.mtp if mtp is None else validate.positive_int("mtp", mtp)
    if accept_ratio is None:
        try:
            accept_ratio_for(T, dep)
        except ValueError as exc:
            raise ValueError(f"{exc}: pass accept_ratio (accepted tokens per step, 1..{T})") from None
        acc = None
    else:
        acc = validate.real("accept_ratio", accept_ratio, lo=1.0, hi=float(T))
    if no_offload and not isinstance(ratio, (str, bool)) and isinstance(ratio, (int, float, np.number)) \
            and float(ratio) == 1.0:
        ratio = 1.0
    else:
        ratio = _ratio_arg(ratio)
    strategy = validate.one_of("strategy", strategy, ("best", "none", "da", "dba"))
    return spec, gpu, L, link, T, acc, ratio, strategy


# ------------------------------------------------------------------------------------------------------- plan
@dataclass(frozen=True)
class Curve:
    """Throughput per GPU against tokens per second per request, one point per batch (1 up to the limit), with
    offload at the plan's ratio and without: the Pareto view. Arrays; :meth:`to_frame` as one table."""

    batch: tuple
    throughput_per_gpu: tuple
    tokens_per_s_per_request: tuple
    batch_no_offload: tuple
    throughput_per_gpu_no_offload: tuple
    tokens_per_s_per_request_no_offload: tuple

    def to_frame(self) -> pd.DataFrame:
        a = pd.DataFrame({"offload": True, "batch": self.batch, "throughput_per_gpu": self.throughput_per_gpu,
                          "tokens_per_s_per_request": self.tokens_per_s_per_request})
        b = pd.DataFrame({"offload": False, "batch": self.batch_no_offload,
                          "throughput_per_gpu": self.throughput_per_gpu_no_offload,
                          "tokens_per_s_per_request": self.tokens_per_s_per_request_no_offload})
        return pd.concat([a, b], ignore_index=True)


@dataclass(frozen=True)
class Plan:
    """:func:`plan`'s answer (frozen). Throughputs are output tokens per second **per GPU**; bands are
    ``(low, high)``: ``*_band_calibration`` over what the calibration data leave open (the equally good
    calibrations, the part-batch evidence's ends, the locality models), ``*_band`` adds the extrapolation
    variants where the cell leaves what ess was calibrated on (it contains the calibration band)."""

    model: str
    gpu: str
    link: str
    link_GB_per_s: float
    context_len: int
    mtp: int
    accept_ratio: float
    strategy: str
    batch: int | None
    ratio: float | None
    throughput: float | None
    throughput_band_calibration: tuple | None
    throughput_band: tuple | None
    baseline_batch: int | None
    baseline_throughput: float | None
    baseline_limit: str | None
    gain_pct: float | None
    gain_band_calibration: tuple | None
    gain_band: tuple | None
    limit: str | None
    step_ms: float | None
    stall_ms: float | None
    gpu_pool_slots_per_request_per_layer: int | None
    host_memory_GB_per_gpu: float | None
    misses_per_layer: tuple | None
    link_busy_share: float | None
    strategy_per_layer: tuple | None
    link_effective_GB_per_s: float | None
    break_even_GB_per_s: float | None
    break_even_below_span: bool | None
    serial_GB_per_s: float | None
    hidden_GB_per_s: float | None
    calibrated: tuple
    extrapolated: tuple
    curve: Curve | None
    reason: str = ""

    # ------------------------------------------------------------------ words
    def _name(self) -> str:
        return f"{self.model} on {self.gpu} at {_tokens(self.context_len)}"

    @property
    def verdict(self) -> str:
        """``"pays"`` (the whole extrapolation band above 0), ``"may pay"`` (the centre above 0, the band's low end
        not), ``"does not pay"``; ``"no fit"`` where no offload configuration fits."""
        if self.throughput is None:
            return "no fit"
        return "pays" if self.gain_band[0] > 0 else "may pay" if self.gain_pct > 0 else "does not pay"

    def __str__(self) -> str:
        link = f"{self.link}, {self.link_GB_per_s:g} GB/s"
        if self.link_effective_GB_per_s is not None and self.link_effective_GB_per_s < self.link_GB_per_s:
            link += f", {self.link_effective_GB_per_s:g} after the host's memory share"
        if self.throughput is None:
            base = ("" if self.baseline_throughput is None else
                    f" Without offload: batch {self.baseline_batch}, {self.baseline_throughput:,.0f} tok/s per GPU.")
            return f"No offload configuration fits: {self.reason} ({self._name()}, {link}).{base}"
        lo, hi = self.gain_band
        line1 = (f"Offload {self.verdict} for {self._name()} ({link}, MTP {self.mtp}): {self.gain_pct:+.0f} % tokens/s "
                 f"per GPU (band {lo:+.0f} to {hi:+.0f} %).")
        line2 = (f"Run {self.batch} requests per GPU with {self.ratio:g} of each request's cache on the GPU "
                 f"({self.throughput:,.0f} tok/s per GPU), against {self.baseline_batch} without offload "
                 f"({self.baseline_throughput:,.0f}); {self.limit} stops a larger batch.")
        be = ("offload pays on any link in the range searched" if self.break_even_below_span else
              "no link speed in the range searched makes it pay" if self.break_even_GB_per_s is None else
              f"it needs at least {self.break_even_GB_per_s:.3g} GB/s")
        ser = ("" if self.serial_GB_per_s is None else
               f"; from {self.serial_GB_per_s:.3g} GB/s the overlap (DA/DBA) stops mattering")
        line3 = f"The link is busy {self.link_busy_share:.0%} of a step; {be}{ser}."
        return "\n".join((line1, line2, line3))

    def explain(self) -> str:
        """The three lines of ``str()``, then what the plan needs and what its numbers rest on."""
        out = [str(self)]
        if self.throughput is not None:
            out.append(f"GPU pool: {self.gpu_pool_slots_per_request_per_layer:,} slots per request and layer "
                       f"({self.ratio:g} of the context); host memory: "
                       f"{self.host_memory_GB_per_gpu:,.0f} GB per GPU; misses: "
                       f"{np.mean(self.misses_per_layer):,.0f} per request, step and layer (mean over the sparse "
                       f"layers); step {self.step_ms:.1f} ms, of which {self.stall_ms:.1f} ms copies not hidden.")
            c_lo, c_hi = self.throughput_band_calibration
            lo, hi = self.throughput_band
            out.append(f"Throughput {self.throughput:,.0f} tok/s per GPU: calibration band {c_lo:,.0f}-{c_hi:,.0f}, "
                       f"with extrapolation {lo:,.0f}-{hi:,.0f}.")
        out.append("Calibrated: " + "; ".join(self.calibrated) + ".")
        out.append("Extrapolated: " + ("; ".join(self.extrapolated) if self.extrapolated else "nothing") + ".")
        return "\n".join(out)

    def to_dict(self) -> dict:
        """Plain values (JSON-ready: tuples as lists, NaN as None)."""
        return _plain(dataclasses.asdict(self))

    def serving(self) -> dict:
        """The settings to deploy this plan, per GPU: batch, ratio, GPU pool slots per request and layer, host pool,
        the overlap strategy per layer (``book/pages`` maps them to SGLang's and vLLM's options)."""
        if self.throughput is None:
            raise ValueError(f"this plan has no offload configuration to deploy: {self.reason}")
        spec = model_spec(self.model)
        return {"model": self.model, "gpu": self.gpu, "context_len": self.context_len, "mtp": self.mtp,
                "top_k": int(spec.index_topk), "batch_per_gpu": self.batch, "sparse_memory_ratio": self.ratio,
                "gpu_pool_slots_per_request_per_layer": self.gpu_pool_slots_per_request_per_layer,
                "host_pool_GB_per_gpu": self.host_memory_GB_per_gpu,
                "strategy_per_layer": list(self.strategy_per_layer)}

    def figure(self):
        """The Pareto view of :attr:`curve` (:func:`ess.viz.plan.fig_pareto`)."""
        from .viz.plan import fig_pareto
        return fig_pareto(self)


def _tokens(L: int) -> str:
    return f"{L // 1048576}M" if L % 1048576 == 0 else f"{L // 1024}K" if L % 1024 == 0 else f"{L:,} tokens"


def _plain(x):
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return None if not math.isfinite(float(x)) else float(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def _finite(x) -> float | None:
    """``x`` as a float, ``None`` where it is NaN (a link speed the search did not find)."""
    x = float(x)
    return x if math.isfinite(x) else None


def _num(row, col):
    v = row.get(col) if hasattr(row, "get") else None
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return v


def _provenance(spec, gpu: str, T: int, L: int, link: str) -> tuple[tuple, tuple]:
    from .sim.grid import cell_provenance
    from .sim.calibrate import calibration_points
    from .specs import host_link_spec
    cp = cell_provenance(spec.name, gpu)
    extra = list(cp["extrapolated"])
    dep = deployment_spec(DEFAULT_DEPLOYMENT)
    if T != dep.mtp:
        extra.append(f"MTP {T}: the cost model calibrated at MTP {dep.mtp} (paper Fig. 1, Table 2 row 1)")
    ctx = sorted({p.context_len for p in calibration_points()})
    if L not in ctx:
        extra.append(f"context {_tokens(L)}: the communication scale and fixed time calibrated at "
                     f"{', '.join(_tokens(c) for c in ctx)}; the compute scale on DeepSeek's decode cost against "
                     f"position")
    lk = host_link_spec(link)
    if not lk.measured:
        extra.append(f"link {link}: a theoretical figure, not a measured copy rate")
    return tuple(cp["calibrated"]), tuple(extra)


def plan(model: str = DEFAULT_MODEL, gpu: str = "H200", context_len: int = 32768, *, link: str | None = None,
         mtp: int | None = None, accept_ratio: float | None = None, ratio: float | str = "best",
         strategy: str = "best") -> Plan:
    """Does latent offload pay for ``model`` on ``gpu`` at ``context_len`` tokens per request? The best offload
    batch and ratio (``ratio="best"``, or a fixed ratio in (0, 1)) against the best batch without offload, in the
    paper's deployment shape on that GPU (``data/deployments/paper-shape-*.yaml``) over ``link`` (default the GPU's
    reference link), at ``mtp`` query tokens per step (default 2) with ``accept_ratio`` accepted (default the
    sourced value for the MTP), copies overlapped by ``strategy`` (``"best"``: per layer). Returns a
    :class:`Plan`; ``print(plan)`` says the verdict in three lines.

    Everything comes from :mod:`ess.sim.grid` (the same search and bands as notebook 10) on the stored inputs
    (:func:`planner_inputs`); a context, MTP or ratio the store does not hold is computed (seconds to a minute,
    once) and kept in the user cache."""
    args = _check(model, gpu, context_len, link, mtp, accept_ratio, ratio, strategy)
    return _plan(*args[1:], model=model)


@functools.lru_cache(maxsize=256)
def _plan(gpu, L, link, T, acc, ratio, strategy, *, model) -> Plan:
    """:func:`plan` on validated arguments, once per process and question (a :class:`Plan` is frozen)."""
    from .layout import latent_entry_bytes, pool_slots
    from .memory import host_memory_needed_bytes
    from .sim import grid as sgrid
    from .sim.config import STRATEGIES
    from .specs import host_link_spec
    spec = model_spec(model)
    inputs = planner_inputs()
    fixed = None if ratio == "best" else (ratio,)
    cells = sgrid.grid_cells([model], [gpu], [L], links=[link])
    found = sgrid.grid_search(cells, inputs, mtp=T, accept_ratio=acc, strategy=strategy, ratios=fixed)
    grid = sgrid.grid_bands(found, inputs)
    row = grid.iloc[0].to_dict()
    lk = host_link_spec(link)
    cal, extra = _provenance(spec, gpu, T, L, link)
    acc_used = float(row["accept_ratio"])
    common = dict(model=model, gpu=gpu, link=link, link_GB_per_s=float(lk.h2d_GB_per_s), context_len=L, mtp=T,
                  accept_ratio=acc_used, strategy=strategy, calibrated=cal, extrapolated=extra)
    if _num(row, "best_batch") is None:
        inputs.save_tables()
        none = {f.name: None for f in dataclasses.fields(Plan) if f.name not in common}
        return Plan(**{**none, **common, "reason": str(row.get("reason") or "no batch fits"),
                       "baseline_batch": _num(row, "batch_no_offload"),
                       "baseline_throughput": _num(row, "throughput_no_offload"),
                       "baseline_limit": LIMITS.get(row.get("limit_no_offload"), row.get("limit_no_offload"))})
    be, be_below = sgrid.break_even_link(found, inputs, ratios=fixed)
    speeds = sgrid.overlap_links(found, inputs)
    B, r = int(row["best_batch"]), float(row["best_ratio"])
    table = inputs.table(spec)
    misses = np.asarray(table(L, r, T), dtype=float)
    # the best configuration once more, for what the grid's row does not keep: the per-layer strategies, the copies
    sc = sgrid._scenario(model, gpu, inputs.params, strategy=strategy)
    from .sim.timeline import simulate
    res = simulate(B, L, r, misses=misses, mtp=T, accept_ratio=acc_used, h2d_GB_per_s=lk.h2d_GB_per_s,
                   d2h_GB_per_s=lk.d2h_GB_per_s, scenario=sc)
    dep = deployment_spec(sgrid.grid_deployment(gpu))
    entry = latent_entry_bytes(spec, dep.kv_dtype)
    link_eff = float(res.h2d_effective_GB_per_s[0])                           # after the host's DRAM share
    copy_s = float(misses.sum()) * B * entry / (link_eff * 1e9)              # every sparse layer's misses, h2d
    layer_names = tuple(STRATEGIES[int(i)] for i in np.asarray(res.layer_strategy)[0])
    view = sgrid.cell_view(inputs, model, gpu, link, L, T, r, accept_ratio=acc, strategy=strategy)
    curve = Curve(tuple(int(b) for b in view.batches), tuple(float(t) for t in view.throughput),
                  tuple(float(t / b) for t, b in zip(view.throughput, view.batches)),
                  tuple(int(b) for b in view.batches_no_offload),
                  tuple(float(t) for t in view.throughput_no_offload),
                  tuple(float(t / b) for t, b in zip(view.throughput_no_offload, view.batches_no_offload)))
    slots = pool_slots(spec, r, L)
    inputs.save_tables()
    gain = float(row["gain_pct"])
    return Plan(**common, batch=B, ratio=r, throughput=float(row["throughput"]),
                throughput_band_calibration=(float(row["throughput_cal_low"]), float(row["throughput_cal_high"])),
                throughput_band=(float(row["throughput_low"]), float(row["throughput_high"])),
                baseline_batch=int(row["batch_no_offload"]), baseline_throughput=float(row["throughput_no_offload"]),
                baseline_limit=LIMITS.get(row["limit_no_offload"], row["limit_no_offload"]),
                gain_pct=gain, gain_band_calibration=(float(row["gain_pct_cal_low"]), float(row["gain_pct_cal_high"])),
                gain_band=(float(row["gain_pct_low"]), float(row["gain_pct_high"])),
                limit=LIMITS.get(row["limit"], row["limit"]), step_ms=float(row["step_ms"]),
                stall_ms=float(row["stall_ms"]), gpu_pool_slots_per_request_per_layer=int(slots),
                host_memory_GB_per_gpu=float(host_memory_needed_bytes(B, L, model=spec, dtype=dep.kv_dtype) / 1e9),
                misses_per_layer=tuple(float(m) for m in misses),
                link_busy_share=float(min(copy_s / float(res.step_s[0]), 1.0)),
                strategy_per_layer=layer_names, link_effective_GB_per_s=link_eff,
                break_even_GB_per_s=_finite(be.iloc[0]), break_even_below_span=bool(be_below.iloc[0]), serial_GB_per_s=_finite(speeds.serial_GB_per_s.iloc[0]),
                hidden_GB_per_s=_finite(speeds.hidden_GB_per_s.iloc[0]),
                curve=curve)


# --------------------------------------------------------------------------------------------------- simulate
def simulate_config(batch: int, context_len: int, ratio: float = 1.0, *, model: str = DEFAULT_MODEL,
                    gpu: str = "H200", link: str | None = None, mtp: int | None = None,
                    accept_ratio: float | None = None, strategy: str = "best") -> dict:
    """One configuration (``batch`` requests per GPU, ``context_len`` tokens, sparse-memory ``ratio``; 1 is no
    offload) in the grid's scenario with the central calibration and the central miss table: throughput per GPU and
    per node, the step and its stall, the misses per layer (mean), whether it fits and why not (``ess simulate``)."""
    from .sim import grid as sgrid
    from .sim.timeline import simulate
    from .specs import host_link_spec
    spec, gpu, L, link, T, acc, r, strategy = _check(model, gpu, context_len, link, mtp, accept_ratio, ratio,
                                                     strategy, no_offload=True)
    if r == "best":
        raise ValueError("ratio must be a number in (0, 1] (1: no offload) for one configuration, got 'best'")
    B = validate.positive_int("batch", batch)
    dep = deployment_spec(sgrid.grid_deployment(gpu))
    acc = sgrid.accept_ratio_for(T, dep) if acc is None else acc
    inputs = planner_inputs()
    lk = host_link_spec(link)
    sc = sgrid._scenario(model, gpu, inputs.params, strategy=strategy)
    run = lambda m: simulate(B, L, r, misses=m, mtp=T, accept_ratio=acc, h2d_GB_per_s=lk.h2d_GB_per_s,  # noqa: E731
                             d2h_GB_per_s=lk.d2h_GB_per_s, scenario=sc)
    misses = np.zeros(spec.n_sparse_layers)
    res = run(misses)
    if r < 1 and res.feasible[0]:              # the cache simulation only for a configuration that fits
        misses = np.asarray(inputs.table(spec)(L, r, T))
        res = run(misses)
    inputs.save_tables()
    ok = bool(res.feasible[0])
    return _plain({"model": model, "gpu": gpu, "link": link, "batch": B, "context_len": L, "ratio": r, "mtp": T,
                   "accept_ratio": acc, "strategy": strategy, "feasible": ok, "reason": str(res.reason[0]),
                   "throughput_per_gpu": float(res.throughput_per_gpu[0]) if ok else None,
                   "throughput_per_node": float(res.throughput[0]) if ok else None,
                   "step_ms": float(res.step_s[0] * 1e3) if ok else None,
                   "stall_ms": float(res.stall_s[0] * 1e3) if ok else None,
                   "misses_per_layer": float(np.mean(misses)) if ok or r >= 1 else None, "params": inputs.params.to_dict()})


# ------------------------------------------------------------------------------------------------- regenerate
def shipped_tables(models=None, *, sizes=None) -> list:
    """The miss tables ``data/generated/misses`` ships, empty, each with the points it holds
    ``[(table, [(context, mtp, ratios)])]``: for each model of the grid (:data:`ess.sim.grid.GRID_MODELS`, one per
    geometry) the grid's tables (the central locality model's, the band's other locality models', Fig. 2 flat for
    a model other than the paper's; :meth:`ess.sim.grid.GridInputs.table`) at the deployment's MTP over each
    context's ratio grid, and the widget's central tables at the other MTPs of :data:`ess.widgets.grid.MTPS`
    (:data:`~ess.widgets.grid.TABLE_STEPS` x :data:`~ess.widgets.grid.TABLE_BATCH`) over the widget's ratios too;
    every context of :data:`~ess.sim.grid.GRID_CONTEXTS` and :data:`~ess.sim.grid.GRID_LONG_CONTEXTS` the model
    reaches. ``sizes``: the grid's (:class:`ess.sim.misses.BandSizes`, default
    :data:`ess.sim.misses.PLANNER_SIZES`)."""
    from .sim.costs import CostParams
    from .sim.grid import GRID_CONTEXTS, GRID_LONG_CONTEXTS, GRID_MODELS, GridInputs, _variants, ratio_grid
    from .sim.misses import MissesTable
    from .locality import locality_alternatives
    from .widgets.grid import MTPS, RATIOS, TABLE_BATCH, TABLE_STEPS
    inputs = GridInputs(CostParams(), {"central": CostParams()}, {}, list(locality_alternatives()),
                        sizes, store=False)
    dep = deployment_spec(DEFAULT_DEPLOYMENT)
    out, seen = [], set()
    for m in (GRID_MODELS if models is None else models):
        spec = model_spec(m)
        ctx = [L for L in (*GRID_CONTEXTS, *GRID_LONG_CONTEXTS) if L <= spec.max_position_embeddings]
        for loc, prof in dict.fromkeys([(None, "paper")] + [(v[3], v[4]) for v in _variants(inputs, m, dep.gpu)]):
            t = inputs.table(spec, loc, prof)
            if id(t) not in seen:
                seen.add(id(t))
                out.append((t, [(L, dep.mtp, ratio_grid(spec, L, dep.mtp)) for L in ctx]))
        t = MissesTable(steps=TABLE_STEPS, batch=TABLE_BATCH, locality=inputs.localities[0], model=spec)
        out.append((t, [(L, T, tuple(RATIOS) + ratio_grid(spec, L, T)) for T in MTPS if T != dep.mtp for L in ctx]))
    return out


def regenerate(folder=None, *, models=None, calibration: bool = True, progress: bool = True) -> list:
    """Compute and write ``data/generated/`` (or ``folder``): the calibration
    (:func:`ess.sim.store.calibration_payload`), its band's leave-one-out coverage
    (:func:`ess.sim.store.coverage_payload`) and every table of :func:`shipped_tables` at its points. Nothing
    is read from a store. This is ``ess calibrate``: minutes."""
    from tqdm.auto import tqdm

    from .sim import store
    validate.boolean("calibration", calibration)
    validate.boolean("progress", progress)
    written = []
    if calibration:
        written.append(store.write_calibration(store.calibration_payload(), folder))
        written.append(store.write_coverage(store.coverage_payload(), folder))
    tables = shipped_tables(models)
    jobs = [(t, L, T, ratios) for t, points in tables for L, T, ratios in points]
    for t, L, T, ratios in tqdm(jobs, desc="miss tables", disable=not progress):
        t.prefetch((L, r, T) for r in ratios)
    for t, _ in tables:
        written.append(store.save_table(t, folder or store.GENERATED_DIR))
    return written
