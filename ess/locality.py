"""The synthetic locality models and their calibration: which models exist, which is central and which make every
offload prediction's band, and the drift model's per-layer score correlation solved for a target overlap.

A model is a trace model of :data:`TRACE_MODELS` (``"uniform"`` or ``"drift"``), a reading of the paper's Fig. 2
(:data:`READINGS`) and, for drift, its noise correlation ``rho``: a :class:`LocalityModel`. The models, readings and
the drift model's ``rho`` were fitted and chosen on the evidence by the rule of ``data/locality/README.md``; the
result is ``data/locality/fit.yaml`` (:func:`locality_fit`): :func:`default_locality` (the central model) and
:func:`locality_alternatives` (the models behind every prediction's band). :func:`drift_calibration` solves the drift
model's adjacent-token score correlation for a layer's overlap on the drift generator's calibration stream.

The generators that run a model are :mod:`ess.tracegen`'s (it reads its defaults here); the cache simulation
(:mod:`ess.cachesim`), the simulator's miss tables (:mod:`ess.sim.misses`) and the notebooks name a model here.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

import yaml

from .specs import DATA_DIR
from .traces import MAX_POSITIONS
from .validate import fraction, integer, one_of, real

__all__ = ["TRACE_MODELS", "FIT_HIT_RATE", "READINGS", "LocalityModel", "locality_fit", "fitted_drift_rho",
           "default_locality", "locality_alternatives", "locality_named", "locality_names", "default_trace_model",
           "check_trace_model", "check_reading", "drift_calibration"]

TRACE_MODELS = ("uniform", "drift")
# Fig. 2's metric: the overlap fraction |A & B| / |B|, or (one summary) the Jaccard index |A & B| / |A | B|
READINGS = ("fraction", "jaccard")


# ------------------------------------------------------------------------------------------- the fitted models
@dataclass(frozen=True)
class LocalityModel:
    """One synthetic locality model: a trace model, a reading of Fig. 2, and (drift) its noise correlation ``rho``.
    ``name`` says what it is in the band (``"central"`` or which alternative), ``rests_on`` which evidence fixed
    it. A synthetic trace's :class:`ess.tracegen.Workload` carries one; :meth:`of` makes one from a trace model
    and reading with the fitted defaults."""

    name: str
    trace_model: str
    reading: str
    drift_rho: float | None = None
    rests_on: str = ""

    def __post_init__(self) -> None:
        for name in ("name", "rests_on"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"LocalityModel.{name} must be a str, got {type(getattr(self, name)).__name__}")
        check_trace_model(self.trace_model)
        if not isinstance(self.reading, str) or self.reading not in READINGS:
            raise ValueError(f"LocalityModel.reading must be one of {READINGS}, got {self.reading!r}")
        if (self.trace_model == "drift") != (self.drift_rho is not None):
            raise ValueError("LocalityModel.drift_rho is given for trace_model='drift' and only for it")
        if self.drift_rho is not None:
            real("LocalityModel.drift_rho", self.drift_rho, lo=0.0, hi=1.0, hi_open=True)

    @property
    def label(self) -> str:
        rho = "" if self.drift_rho is None else f", rho {self.drift_rho:.3g}"
        return f"{self.trace_model} ({self.reading}{rho})"

    @classmethod
    def of(cls, trace_model: str | None = None, reading: str | None = None, drift_rho: float | None = None,
           name: str | None = None) -> "LocalityModel":
        """A model from its parts, each ``None`` taking the default: the central model's trace model and reading
        (:func:`default_locality`) and, for drift, the ``rho`` fitted for the reading (:func:`fitted_drift_rho`).
        ``drift_rho`` belongs to the drift model only. ``name`` defaults to the trace model's."""
        trace_model, reading = check_trace_model(trace_model), check_reading(reading)
        if drift_rho is not None and trace_model != "drift":
            raise ValueError(f"drift_rho belongs to trace_model='drift', got trace_model={trace_model!r}")
        if trace_model == "drift" and drift_rho is None:
            drift_rho = fitted_drift_rho(reading)
        return cls(trace_model if name is None else name, trace_model, reading, drift_rho)

    def config(self) -> dict:
        """What identifies the model in a recorded configuration."""
        out = {"locality": self.name, "trace_model": self.trace_model, "reading": self.reading}
        if self.drift_rho is not None:
            out["drift_rho"] = self.drift_rho
        return out


@lru_cache(maxsize=None)
def locality_fit() -> dict:
    """``data/locality/fit.yaml``: the drift model's ``rho`` fitted on vLLM's hit rate per reading and the default
    chosen by the rule of ``data/locality/README.md``, each ``{value, source}`` (``ValueError`` when missing)."""
    path = DATA_DIR / "locality" / "fit.yaml"
    if not path.exists():
        raise ValueError(f"{path.name} is missing from data/locality; regenerate it with tools/fit_locality.py")
    with open(path, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)
    for key in ("drift_rho", "default"):
        if key not in raw or "value" not in raw[key] or not raw[key].get("source"):
            raise ValueError(f"data/locality/fit.yaml: {key!r} needs value and source")
    return raw


# the 2 x K hit rates rho is fitted to: the middle of vLLM's 80-90 % (central) and its ends (the band), by the rule of
# data/locality/README.md (vLLM RFC #48203 via paper-facts.md)
FIT_HIT_RATE = {"central": 0.85, "at_80": 0.80, "at_90": 0.90}


def fitted_drift_rho(reading: str, at: str = "central") -> float:
    """The drift model's ``rho`` fitted for ``reading``: ``at`` ``"central"`` (2 x K hit rate 0.85), ``"at_80"`` or
    ``"at_90"`` (the ends of vLLM's range), from ``data/locality/fit.yaml``."""
    one_of("reading", reading, READINGS)
    values = locality_fit()["drift_rho"]["value"][reading]
    one_of("at", at, sorted(values))
    return float(values[at])


def _fitted_model(name: str, trace_model: str, reading: str, at: str = "central") -> LocalityModel:
    if trace_model == "uniform":
        return LocalityModel(name, "uniform", reading, None, f"E1 ({reading} reading of Fig. 2)")
    rho = fitted_drift_rho(reading, at)
    return LocalityModel(name, "drift", reading, rho,
                         f"E1 ({reading} reading of Fig. 2) per layer; rho on E2 (2 x K hit rate {FIT_HIT_RATE[at]:.2f})")


def default_locality() -> LocalityModel:
    """The central locality model chosen by the rule of ``data/locality/README.md`` (``data/locality/fit.yaml``)."""
    d = locality_fit()["default"]["value"]
    return _fitted_model("central", d["trace_model"], d["reading"])


def locality_alternatives() -> list[LocalityModel]:
    """The models behind every offload prediction's band (``data/locality/README.md``, "Bands"): the central model
    first, then its model and reading with rho at the ends of vLLM's range (drift), then the other reading; models
    that coincide are listed once."""
    c = default_locality()
    other = [r for r in READINGS if r != c.reading][0]
    out = [c]
    if c.trace_model == "drift":
        out += [_fitted_model("rho at hit rate 0.80", "drift", c.reading, "at_80"),
                _fitted_model("rho at hit rate 0.90", "drift", c.reading, "at_90")]
    out.append(_fitted_model(f"{other} reading", c.trace_model, other))
    seen, unique = set(), []
    for m in out:
        key = (m.trace_model, m.reading, m.drift_rho)
        if key not in seen:
            seen.add(key)
            unique.append(m)
    return unique


def locality_named(name: Any) -> LocalityModel:
    """The model of the band named ``name`` (:func:`locality_alternatives`: ``"central"``, ...) or a trace model
    of :data:`TRACE_MODELS` with its defaults (:meth:`LocalityModel.of`)."""
    models = {m.name: m for m in locality_alternatives()}
    if isinstance(name, str) and name in models:
        return models[name]
    if isinstance(name, str) and name in TRACE_MODELS:
        return LocalityModel.of(name)
    raise ValueError(f"locality must be one of {sorted(models) + list(TRACE_MODELS)}, got {name!r}")


def locality_names() -> list[str]:
    """The names :func:`locality_named` accepts."""
    return [m.name for m in locality_alternatives()] + list(TRACE_MODELS)


def default_trace_model() -> str:
    """The default synthetic trace model (:func:`default_locality`), chosen by the rule in
    ``data/locality/README.md``."""
    return default_locality().trace_model


def check_trace_model(trace_model: Any) -> str:
    """``trace_model`` when it is one of :data:`TRACE_MODELS`; ``None`` gives :func:`default_trace_model`."""
    if trace_model is None:
        return default_trace_model()
    if not isinstance(trace_model, str) or trace_model not in TRACE_MODELS:
        raise ValueError(f"trace_model must be one of {TRACE_MODELS} (the synthetic trace model), got {trace_model!r}")
    return trace_model


def check_reading(reading: Any) -> str:
    """``reading`` when it is one of :data:`READINGS`; ``None`` gives the default model's reading."""
    if reading is None:
        return default_locality().reading
    if not isinstance(reading, str) or reading not in READINGS:
        raise ValueError(f"reading must be one of {READINGS} (how Fig. 2's metric is read), got {reading!r}")
    return reading


# ----------------------------------------------------------------------------------------- drift calibration
def drift_calibration(r: float, context_len: int, k: int | None = None, n_sinks: int | None = None,
                      local_window: int | None = None, rho: float | None = None) -> dict:
    """Solve the score-drift model's adjacent-token score correlation ``c`` for a target overlap ``r``.

    Bisection (16 halvings of [0, 1]) on the mean overlap of adjacent query tokens (the metric of Fig. 2, MTP 1) of
    one calibration stream: context ``context_len``, K ``k``, 17 query tokens, a fixed seed (the same random
    numbers at every trial, so the overlap is a smooth function of ``c``). Returns ``{"c", "pi", "rho", "overlap",
    "floor"}``: ``overlap`` reached, ``floor`` the overlap at c = 0 (sinks, the shifted window and chance: a target
    below it gives c = 0). Cached; the only quantity of the model fitted to anything, and it is fitted to the
    locality profile only. The stream is the drift generator's (:mod:`ess.tracegen`, imported when called: the
    generator reads its defaults from this module).
    """
    from .tracegen import _CALIB_QUERIES, _structure, geometry
    context_len = integer("context_len", context_len, lo=1, below=MAX_POSITIONS - _CALIB_QUERIES + 1)
    k = integer("k", geometry(k=k)[1], lo=1)
    if k > context_len:
        raise ValueError(f"k (top-K) = {k} is larger than the context ({context_len} tokens); expected k <= context_len")
    n_sinks, local_window = _structure(n_sinks, local_window, context_len)
    rho = real("drift_rho", fitted_drift_rho(check_reading(None)) if rho is None else rho, lo=0.0, hi=1.0,
               hi_open=True)
    r = fraction("r (the target overlap)", r)
    return _drift_calibration(r, context_len, k, n_sinks, local_window, rho)


@lru_cache(maxsize=1024)
def _drift_calibration(r: float, context_len: int, k: int, n_sinks: int, local_window: int, rho: float) -> dict:
    from .tracegen import _drift_overlap_at, _drift_params
    f = partial(_drift_overlap_at, rho=rho, context_len=context_len, k=k, n_sinks=n_sinks, window=local_window)
    floor = f(0.0)
    if r <= floor:
        c = 0.0
    elif r >= f(1.0):
        c = 1.0
    else:
        lo, hi = 0.0, 1.0
        for _ in range(16):
            mid = 0.5 * (lo + hi)
            if f(mid) < r:
                lo = mid
            else:
                hi = mid
        c = lo if abs(f(lo) - r) <= abs(f(hi) - r) else hi
    pi, rl = _drift_params(c, rho)
    return {"c": c, "pi": pi, "rho": rl, "overlap": f(c), "floor": floor}
