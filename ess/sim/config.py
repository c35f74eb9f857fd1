"""Typed configuration of the throughput simulator: :class:`Scenario`, everything one simulated decode step needs
besides the per-configuration axes (batch, context length, ratio) and the miss counts, with the project's defaults
written once.

A scenario is passed whole to :func:`ess.sim.simulate`, :func:`ess.sim.timeline.best_batch`, the helpers of
:mod:`ess.sim.predictions`, the tables of :mod:`ess.tables.sim` and the simulator widget; ``scenario.replace(...)``
changes a field, ``scenario.to_dict()`` is what a record stores as its configuration. Construction validates every
field; fields left ``None`` are filled from ``data/`` only when the scenario is used (:meth:`Scenario.resolved`;
the deployment's GPU, host, MTP and accept ratio, the FlashTrans link). The cost parameters default to the central
calibration (stored in ``data/generated/calibration.json``, read once per process): a default scenario predicts
with fitted costs, never with the unfitted ones unless the caller passes ``CostParams()``.

>>> Scenario(mtp=4, accept_ratio=2.8).replace(strategy="da").strategy
'da'
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..specs import (DEFAULT_DEPLOYMENT, DEFAULT_MODEL, DeploymentSpec, GPUSpec, HostSpec, ModelSpec,
                     deployment_spec, gpu_spec, host_spec, link_figures, list_deployments, list_gpus, list_hosts,
                     list_models, model_spec, resolve)
from ..validate import positive_int, real
from .costs import CostParams

__all__ = ["STRATEGIES", "Scenario", "as_scenario", "default_link_GB_per_s"]

# the overlap strategies of one layer (paper's strategies, paper-facts.md "Overlap strategies"); "best" is the
# per-layer choice among them
STRATEGIES = ("none", "da", "dba")

_SPECS = {"model": ModelSpec, "deployment": DeploymentSpec, "gpu": GPUSpec, "host": HostSpec}
_LOADERS = {"model": model_spec, "deployment": deployment_spec, "gpu": gpu_spec, "host": host_spec}


def _calibrated() -> CostParams:
    from .calibrate import calibrated_params             # (calibrate imports this module)
    return calibrated_params()


def default_link_GB_per_s() -> tuple[float, float]:
    """The simulator's default host-to-device and device-to-host link speeds: FlashTrans's figures
    (``data/hardware/links.yaml``, ``flashtrans``, [BLOG])."""
    ft = link_figures()["flashtrans"]
    return ft["h2d_GB_per_s"], ft["d2h_GB_per_s"]


def _link(name: str, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, (float, np.floating)) and math.isinf(value) and value > 0:
        return float(value)                                   # an infinitely fast link (a bound); only a float is inf
    return real(name, value, lo=0.0, lo_open=True)


@dataclass(frozen=True)
class Scenario:
    """One simulator scenario (frozen; validated on construction, which never touches the disk).

    * ``model``, ``deployment`` (preset names or specs, default the project's: DeepSeek-V3.2-Exp on the paper's
      Table 1 setting), ``gpu`` and ``host`` (names or specs; ``None``: the deployment's);
    * ``mtp`` query tokens per request and step and ``accept_ratio`` accepted tokens per step (``None``: the
      deployment's; ``1 <= accept_ratio <= mtp``);
    * ``h2d_GB_per_s`` / ``d2h_GB_per_s`` the host-to-device and device-to-host link speeds (``None``: FlashTrans;
      ``math.inf``: an infinitely fast link);
    * ``strategy``: ``"none"``, ``"da"``, ``"dba"``, ``"best"`` (the per-layer cheapest) or one name per layer;
    * ``params``: the cost model's free parameters (:class:`ess.sim.costs.CostParams`; default the central
      calibration, :func:`ess.sim.store.stored_calibration`, read once per process; pass ``CostParams()`` for the
      unfitted model);
    * ``check_memory``: a batch beyond the memory model's limit is infeasible (off: the paper's Fig. 1 "no memory
      limit" curve, or a stress configuration); ``host_memory_cap``: each GPU's link is capped at its share of the
      host's DRAM bandwidth.
    """

    model: str | ModelSpec = DEFAULT_MODEL
    deployment: str | DeploymentSpec = DEFAULT_DEPLOYMENT
    gpu: str | GPUSpec | None = None
    host: str | HostSpec | None = None
    mtp: int | None = None
    accept_ratio: float | None = None
    h2d_GB_per_s: float | None = None
    d2h_GB_per_s: float | None = None
    strategy: str | tuple = "best"
    params: CostParams = field(default_factory=lambda: _calibrated())
    check_memory: bool = True
    host_memory_cap: bool = True

    def __post_init__(self) -> None:
        for name, cls in _SPECS.items():
            value = getattr(self, name)
            if value is None and name in ("gpu", "host"):
                continue
            if not isinstance(value, (str, cls)):
                raise TypeError(f"Scenario.{name} must be a preset name or a {cls.__name__}, got "
                                f"{type(value).__name__}")
        if self.mtp is not None:
            object.__setattr__(self, "mtp", positive_int("Scenario.mtp", self.mtp))
        if self.accept_ratio is not None:
            acc = real("Scenario.accept_ratio", self.accept_ratio, lo=1.0)
            if self.mtp is not None and acc > self.mtp:
                raise ValueError(f"Scenario.accept_ratio must lie in [1, mtp = {self.mtp}] (accepted tokens per "
                                 f"step), got {acc:g}")
            object.__setattr__(self, "accept_ratio", acc)
        for name in ("h2d_GB_per_s", "d2h_GB_per_s"):
            object.__setattr__(self, name, _link(f"Scenario.{name}", getattr(self, name)))
        if isinstance(self.strategy, str):
            if self.strategy != "best" and self.strategy not in STRATEGIES:
                raise ValueError(f"Scenario.strategy must be one of {STRATEGIES + ('best',)} or one name per layer, "
                                 f"got {self.strategy!r}")
        else:
            try:
                names = tuple(self.strategy)
            except TypeError:
                raise TypeError(f"Scenario.strategy must be a name or a sequence of names, got "
                                f"{type(self.strategy).__name__}") from None
            if not names or any(not isinstance(s, str) or s not in STRATEGIES for s in names):
                raise ValueError(f"a per-layer Scenario.strategy must list names from {STRATEGIES}, got {names!r}")
            object.__setattr__(self, "strategy", names)
        if not isinstance(self.params, CostParams):
            raise TypeError(f"Scenario.params must be a CostParams, got {type(self.params).__name__}")
        for name in ("check_memory", "host_memory_cap"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Scenario.{name} must be True or False, got {getattr(self, name)!r}")

    def replace(self, **changes) -> "Scenario":
        """A copy with ``changes`` (validated like a new scenario)."""
        return dataclasses.replace(self, **changes)

    def specs(self) -> tuple[ModelSpec, DeploymentSpec, GPUSpec, HostSpec]:
        """The model, deployment, GPU and host as specs (:func:`ess.specs.resolve`; reads ``data/``)."""
        return resolve(self.model, self.deployment, self.gpu, self.host)

    def resolved(self) -> "Scenario":
        """The same scenario with every default filled in: specs for the four presets, the deployment's MTP and
        accept ratio, the FlashTrans link (reads ``data/``)."""
        model, dep, gpu, host = self.specs()
        h2d, d2h = default_link_GB_per_s()
        return dataclasses.replace(
            self, model=model, deployment=dep, gpu=gpu, host=host,
            mtp=dep.mtp if self.mtp is None else self.mtp,
            accept_ratio=dep.mtp_accept_ratio if self.accept_ratio is None else self.accept_ratio,
            h2d_GB_per_s=h2d if self.h2d_GB_per_s is None else self.h2d_GB_per_s,
            d2h_GB_per_s=d2h if self.d2h_GB_per_s is None else self.d2h_GB_per_s)

    def to_dict(self) -> dict:
        """The scenario as plain values for a record's configuration, every default filled in: presets by name (a
        spec that differs from its preset in full), the cost parameters with what they were fitted on."""
        r = self.resolved()
        out: dict[str, Any] = {}
        for name, load in _LOADERS.items():
            spec, given = getattr(r, name), getattr(self, name)
            named = (isinstance(given, str) or given is None
                     or (spec.name in _preset_names(name) and load(spec.name) == spec))
            out[name] = spec.name if named else {k: v for k, v in dataclasses.asdict(spec).items() if k != "sources"}
        out.update(mtp=r.mtp, accept_ratio=r.accept_ratio, h2d_GB_per_s=r.h2d_GB_per_s, d2h_GB_per_s=r.d2h_GB_per_s,
                   strategy=r.strategy if isinstance(r.strategy, str) else list(r.strategy),
                   params=self.params.to_dict(), check_memory=self.check_memory,
                   host_memory_cap=self.host_memory_cap)
        return out


def _preset_names(kind: str) -> list[str]:
    return {"model": list_models, "deployment": list_deployments, "gpu": list_gpus, "host": list_hosts}[kind]()


def as_scenario(scenario: Scenario | None) -> Scenario:
    """``scenario``, or the default :class:`Scenario` for ``None``; a ``TypeError`` for anything else."""
    if scenario is None:
        return Scenario()
    if not isinstance(scenario, Scenario):
        raise TypeError(f"scenario must be an ess.sim.Scenario, got {type(scenario).__name__}")
    return scenario
