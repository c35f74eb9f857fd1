"""Calibration of the simulator's free parameters on the paper's calibration data only.

Calibration data (paper-facts.md, "Calibration data"; ``role: calibration`` in ``data/published/``):

* paper Fig. 1, throughput against batch at 32K, MTP 2, accept ratio 1.7, no memory limit (19 points read by eye);
* paper Table 2, first row: batch 52, 32K, MTP 2, accept 1.7, no offload -> 9,647.71 tokens/s.

Fitted parameters (:class:`~ess.sim.costs.CostParams`): ``compute_scale`` (multiplies every compute kernel time),
``comm_scale`` (multiplies the all-to-all times) and ``fixed_ms`` (per-step time outside the layers). Everything
else in the cost model comes from the specs and the measured kernel points. The objective is the weighted sum of
squared relative step-time errors (relative throughput errors, to first order); Table 2's first row, an exact
number, is weighted like ``table2_weight`` chart points. The scales are found by a coarse-to-fine grid search and
``fixed_ms`` in closed form for each pair (weighted least squares, clipped at 0); nothing held back is used.

Throughput alone cannot tell a slow kernel from a fixed time per step, so ``compute_scale`` is pinned by public
per-operation evidence (``data/calibration/README.md``, "The operation split"): DeepSeek's decode cost against the
token's position (``data/calibration/decode_cost.yaml``), whose growth from 4K to 128K is the indexer's O(L) scan
(:func:`cost_growth_evidence`, :func:`cost_growth_ms`, :func:`compute_scale_from_cost`); ``comm_scale`` and
``fixed_ms`` are then fitted on the throughput data with ``compute_scale`` fixed. :func:`calibration_set` returns
the equally good calibrations behind every prediction's band and the central one (:func:`calibrated_params`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..published import published
from ..validate import integer, real
from .config import Scenario, as_scenario
from .costs import CostParams, calibration_data
from .timeline import simulate


def _fit_scenario(scenario: Scenario | None) -> Scenario:
    """The scenario a fit runs in: ``scenario``, or the default one with *unfitted* cost parameters (a fit replaces
    the values it fits, and the default scenario's own parameters are this module's result)."""
    return Scenario(params=CostParams()) if scenario is None else as_scenario(scenario)

__all__ = ["CalibrationPoint", "calibration_points", "Calibration", "calibrate", "predict_points",
           "calibration_variants", "calibrated_params", "cost_growth_evidence", "cost_growth_ms",
           "compute_scale_from_cost", "CalibrationSet", "calibration_set", "calibration_spread", "EQUALLY_GOOD_RMS_PP",
           "leave_one_out", "band_coverage", "BAND_NOMINAL", "band_widening", "widen_band"]

# RMS differences below 1 percentage point are within the precision of a chart read by eye: such fits are equally
# good (a choice, data/calibration/README.md, "The operation split")
EQUALLY_GOOD_RMS_PP = 1.0
#: the share of left-out calibration points a calibration band is held to contain (a choice: a band is read as "the
#: value is likely here", held to four in five); below it the band is widened (:func:`band_coverage`)
BAND_NOMINAL = 0.8
# bounds of calibrate's search on run time only (the default is a 24-point grid refined twice)
_MAX_GRID, _MAX_REFINE = 64, 8


@dataclass(frozen=True)
class CalibrationPoint:
    name: str
    batch: int
    context_len: int
    ratio: float
    mtp: int
    accept_ratio: float
    throughput: float
    read_from_chart: bool
    source: str

    def __post_init__(self):
        from ..validate import boolean, positive_int, ratio
        for name in ("batch", "context_len", "mtp"):
            positive_int(name, getattr(self, name))
        ratio("ratio", self.ratio)
        real("accept_ratio", self.accept_ratio, lo=1.0, hi=float(self.mtp))
        real("throughput", self.throughput, lo=0.0, lo_open=True)
        boolean("read_from_chart", self.read_from_chart)


def calibration_points() -> list[CalibrationPoint]:
    """Every entry with ``role: calibration`` in ``data/published/paper_fig1.yaml`` and ``paper_table2.yaml``."""
    pts = []
    for doc in ("paper_fig1", "paper_table2"):
        for key, e in published(doc).items():
            if e["role"] != "calibration":
                continue
            pts.append(CalibrationPoint(key, int(e["batch"]), int(e["context_len"]), float(e.get("ratio", 1.0)),
                                        int(e["mtp"]), float(e["accept_ratio"]), float(e["value"]),
                                        bool(e.get("read_from_chart", False)), e["source"]))
    return pts


def _with(params: CostParams, compute_scale: float, comm_scale: float, fixed_ms: float, **kw) -> CostParams:
    """``params`` with these fitted values: the evidence's ends it was chosen under (part batches, kernel
    efficiencies, attention transfer) kept."""
    return dataclasses.replace(params, compute_scale=float(compute_scale), comm_scale=float(comm_scale),
                               fixed_ms=float(fixed_ms), fitted_on=kw.get("fitted_on", "unfitted"))


def _step_without_fixed(points, compute_scale, comm_scale, scenario: Scenario):
    B = np.array([p.batch for p in points])
    L = np.array([p.context_len for p in points])
    mtp = np.array([p.mtp for p in points])
    a = np.array([p.accept_ratio for p in points])
    res = simulate(B, L, 1.0, mtp=mtp, accept_ratio=a,
                   scenario=scenario.replace(params=_with(scenario.params, compute_scale, comm_scale, 0.0),
                                             check_memory=False))
    return res.step_s


@dataclass(frozen=True)
class Calibration:
    """Fitted parameters and the residuals on every calibration point."""

    params: CostParams
    residuals: pd.DataFrame        # name, batch, published, predicted, rel_error, read_from_chart, source
    rms_rel_error: float
    max_abs_rel_error: float


def predict_points(points, params: CostParams, *, scenario: Scenario | None = None) -> np.ndarray:
    """Node throughput predicted for calibration-style points (no memory limit, no offload) in ``scenario`` (its
    deployment, GPU and links; its own cost parameters are replaced by ``params``)."""
    points = _points(points)
    if not isinstance(params, CostParams):
        raise TypeError(f"params must be an ess.sim.costs.CostParams, got {type(params).__name__}")
    scen = _fit_scenario(scenario)
    step = _step_without_fixed(points, params.compute_scale, params.comm_scale, scen) + params.fixed_ms * 1e-3
    B = np.array([p.batch for p in points])
    a = np.array([p.accept_ratio for p in points])
    dep = scen.specs()[1]
    return B * dep.gpus_per_node * a / step


def _points(points) -> list[CalibrationPoint]:
    """``points`` as a list of :class:`CalibrationPoint`; a ``TypeError`` naming ``points`` otherwise."""
    if isinstance(points, (str, bytes, dict, np.ndarray)) or not hasattr(points, "__iter__"):
        raise TypeError(f"points must be a list of CalibrationPoint, got {type(points).__name__}")
    points = list(points)
    bad = next((p for p in points if not isinstance(p, CalibrationPoint)), None)
    if bad is not None:
        raise TypeError(f"points must be a list of CalibrationPoint, found a {type(bad).__name__}")
    return points


def calibrate(points: list[CalibrationPoint] | None = None, *, table2_weight: float = 5.0,
              scale_range: tuple[float, float] = (0.1, 5.0), grid: int = 24, refine: int = 2,
              compute_scale: float | None = None, scenario: Scenario | None = None) -> Calibration:
    """Fit ``compute_scale``, ``comm_scale`` and ``fixed_ms`` on the calibration points; return them with the
    residuals (relative throughput errors, ``(predicted - published) / published``). A given ``compute_scale``
    is held fixed (pinned by other evidence, :func:`compute_scale_from_cost`) and only the other two are fitted.
    ``scenario``: the deployment, GPU and links the points are simulated in (default the project's)."""
    points = _points(points) if points is not None else calibration_points()
    if len(points) < 3:
        raise ValueError(f"calibrate needs at least 3 calibration points, got {len(points)}")
    table2_weight = real("table2_weight", table2_weight, lo=0.0, lo_open=True)
    if isinstance(scale_range, (str, bytes)) or not isinstance(scale_range, (tuple, list)) or len(scale_range) != 2:
        raise TypeError(f"scale_range must be a pair (low, high) of scales, got {scale_range!r}")
    lo_s = real("scale_range[0]", scale_range[0], lo=0.0, lo_open=True)
    hi_s = real("scale_range[1]", scale_range[1], lo=0.0, lo_open=True)
    if not lo_s < hi_s:
        raise ValueError(f"scale_range must be (low, high) with low < high: a range to fit in, got {scale_range!r}")
    # one grid point is no search; the bounds keep a run under grid**2 x (refine + 1) = 37k simulations (minutes)
    grid = integer("grid", grid, lo=2, below=_MAX_GRID + 1)
    refine = integer("refine", refine, lo=0, below=_MAX_REFINE + 1)
    if compute_scale is not None:
        compute_scale = real("compute_scale", compute_scale, lo=0.0, lo_open=True)
    scen = _fit_scenario(scenario)
    dep = scen.specs()[1]
    B = np.array([p.batch for p in points], dtype=float)
    a = np.array([p.accept_ratio for p in points])
    obs_step = B * dep.gpus_per_node * a / np.array([p.throughput for p in points])
    w = np.array([1.0 if p.read_from_chart else table2_weight for p in points])

    def evaluate(sc, sm):
        s = _step_without_fixed(points, sc, sm, scen)
        wi = w / obs_step ** 2
        with np.errstate(over="ignore", invalid="ignore"):   # a scale far out of range: an infinite loss, skipped
            f = max(float(np.sum(wi * (obs_step - s)) / np.sum(wi)), 0.0)
            err = (s + f - obs_step) / obs_step
            loss = float(np.sum(w * err ** 2))
        return (loss if np.isfinite(loss) else np.inf), f

    lo, hi = np.log(lo_s), np.log(hi_s)
    lo_c, hi_c, lo_m, hi_m = lo, hi, lo, hi
    if compute_scale is not None:
        lo_c = hi_c = float(np.log(compute_scale))
    best = (np.inf, 1.0, 1.0, 0.0)
    for _ in range(refine + 1):
        for sc in np.exp(np.linspace(lo_c, hi_c, grid if compute_scale is None else 1)):
            for sm in np.exp(np.linspace(lo_m, hi_m, grid)):
                loss, f = evaluate(sc, sm)
                if loss < best[0]:
                    best = (loss, sc, sm, f)
        step_c = (hi_c - lo_c) / (grid - 1)
        step_m = (hi_m - lo_m) / (grid - 1)
        lo_c, hi_c = np.log(best[1]) - 2 * step_c, np.log(best[1]) + 2 * step_c
        lo_m, hi_m = np.log(best[2]) - 2 * step_m, np.log(best[2]) + 2 * step_m
    if not np.isfinite(best[0]):
        held = "" if compute_scale is None else f" with compute_scale {compute_scale:g} held fixed"
        raise ValueError(f"no parameters in scale_range {scale_range!r}{held} give a finite loss on the points: "
                         f"nothing was fitted")
    _, sc, sm, f = best
    if compute_scale is not None:
        sc = float(compute_scale)
    pinned = "" if compute_scale is None else f"; compute_scale {compute_scale:.4g} held fixed"
    variants = "" if scen.params.efficiency == "central" else f"; kernel efficiencies {scen.params.efficiency}"
    params = _with(scen.params, float(sc), float(sm), float(f) * 1e3,
                   fitted_on=f"{sum(p.read_from_chart for p in points)} paper Fig. 1 chart points + "
                             f"{sum(not p.read_from_chart for p in points)} Table 2 rows (paper-facts.md, "
                             f"Calibration data); Table 2 weight {table2_weight:g}{pinned}; part-batch "
                             f"evidence {scen.params.part_batch}{variants}")
    pred = predict_points(points, params, scenario=scen)
    obs = np.array([p.throughput for p in points])
    rel = (pred - obs) / obs
    df = pd.DataFrame({"name": [p.name for p in points], "batch": B.astype(int), "published": obs,
                       "predicted": pred, "rel_error": rel, "read_from_chart": [p.read_from_chart for p in points],
                       "source": [p.source for p in points]})
    return Calibration(params, df, float(np.sqrt(np.mean(rel ** 2))), float(np.max(np.abs(rel))))


def calibration_variants(points: list[CalibrationPoint] | None = None, **kw) -> dict[str, Calibration]:
    """The fit under other defensible choices, to show how much the choices move the predictions: the default,
    Fig. 1 alone, Table 2's row weighted like one chart point, and like twenty, on ``points`` (default every
    calibration point; :func:`leave_one_out` passes all but one). ``kw`` go to :func:`calibrate` (e.g. a pinned
    ``compute_scale``)."""
    pts = calibration_points() if points is None else _points(points)
    return {"default (Table 2 weight 5)": calibrate(pts, **kw),
            "Fig. 1 only": calibrate([p for p in pts if p.read_from_chart], **kw),
            "Table 2 weight 1": calibrate(pts, table2_weight=1.0, **kw),
            "Table 2 weight 20": calibrate(pts, table2_weight=20.0, **kw)}


# ----------------------------------------------------------------------------------------------------------------
# Per-operation evidence: DeepSeek's decode cost against the token's position
# ----------------------------------------------------------------------------------------------------------------

def cost_growth_evidence() -> dict:
    """GPU time per output token that DeepSeek's V3.2-Exp decode cost adds between its short and long positions
    (``data/calibration/decode_cost.yaml``): ``(cost_long - cost_short) x 1e-6 USD / (USD per GPU-hour / 3600 s)``
    in ms, ``central`` from the values read, ``low`` and ``high`` from the reading precision (the short value read
    high and the long low, and the reverse). Also the positions and the machine."""
    d = calibration_data("decode_cost")
    v = {k: e["value"] for k, e in d.items()}
    per_usd_ms = 3600.0 / v["gpu_hour_usd"] * 1e-6 * 1e3          # ms of GPU time per USD-per-million-tokens
    grow = v["v32_decode_long_usd_per_mtok"] - v["v32_decode_short_usd_per_mtok"]
    slack = v["long_reading_precision_usd_per_mtok"] + v["short_reading_precision_usd_per_mtok"]
    return {"central": grow * per_usd_ms, "low": (grow - slack) * per_usd_ms, "high": (grow + slack) * per_usd_ms,
            "short_position": int(v["v32_decode_short_position"]), "long_position": int(v["v32_decode_long_position"]),
            "machine": v["machine"]}


def cost_growth_ms(params: CostParams, *, scenario: Scenario | None = None) -> float:
    """The simulator's counterpart of :func:`cost_growth_evidence`: GPU time per output token added between the
    short and the long position, ``(step(long) - step(short)) / (batch x accept ratio)`` in ms, on the evidence's
    machine (H800), without offload, memory not checked, at Table 2 row 1's batch, MTP and accept ratio
    (``data/calibration/README.md``, C3); ``scenario`` gives the model and the deployment (its GPU, cost parameters
    and memory check are replaced)."""
    ev = cost_growth_evidence()
    row = published("paper_table2")["t2_32k_mtp2_b52_r1"]
    B, acc = int(row["batch"]), float(row["accept_ratio"])
    scen = _fit_scenario(scenario).replace(params=params, gpu=ev["machine"], check_memory=False)
    r = simulate(B, [ev["short_position"], ev["long_position"]], 1.0, mtp=int(row["mtp"]), accept_ratio=acc,
                 scenario=scen)
    return float((r.step_s[1] - r.step_s[0]) / (B * acc) * 1e3)


def compute_scale_from_cost(target_ms: float, *, lo: float = 0.05, hi: float = 5.0,
                            scenario: Scenario | None = None) -> float:
    """The ``compute_scale`` at which :func:`cost_growth_ms` (``comm_scale`` 1, ``fixed_ms`` 0: the fixed time
    cancels in the difference) equals ``target_ms``, by bisection to 1e-4 relative (the growth rises with the
    scale)."""
    target_ms = real("target_ms", target_ms)
    lo, hi = real("lo", lo, lo=0.0, lo_open=True), real("hi", hi, lo=0.0, lo_open=True)
    if not lo < hi:
        raise ValueError(f"lo must be below hi (the compute_scale range to search), got lo={lo:g}, hi={hi:g}")
    base = _fit_scenario(scenario).params
    f = lambda s: cost_growth_ms(_with(base, s, 1.0, 0.0), scenario=scenario) - target_ms      # noqa: E731
    if f(lo) > 0 or f(hi) < 0:
        raise ValueError(f"no compute_scale in [lo={lo:g}, hi={hi:g}] gives a growth of target_ms={target_ms:.4g} ms per "
                         f"token")
    while hi / lo > 1 + 1e-4:
        mid = np.sqrt(lo * hi)
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return float(np.sqrt(lo * hi))


@dataclass(frozen=True)
class CalibrationSet:
    """The calibrations of ``data/calibration/README.md`` ("The operation split"): ``fits`` by name (compute
    scale pinned at each of ``compute_scales`` x the four fitting choices), ``free`` the four fits with a free
    compute scale, ``kept`` the names of the equally good ones (RMS at most the lowest of the pinned fits plus
    :data:`EQUALLY_GOOD_RMS_PP`; a free fit also needs its compute scale inside the evidence's range),
    ``central`` the name of the central one."""

    fits: dict
    kept: tuple
    central: str
    compute_scales: dict
    growth_evidence: dict
    free: dict

    @property
    def params(self) -> CostParams:
        return self.fits[self.central].params

    def kept_params(self) -> dict:
        """``{name: CostParams}`` of the equally good calibrations, the central first."""
        every = {**self.fits, **self.free}
        return {n: every[n].params for n in (self.central,) + tuple(k for k in self.kept if k != self.central)}

    def kept_range(self, column: str) -> tuple[float, float]:
        """The lowest and highest value of ``column`` of :meth:`to_frame` over the equally good calibrations (the
        band of a calibrated quantity)."""
        kept = self.to_frame()
        if column not in kept:
            raise ValueError(f"column must be one of {list(kept.columns)}, got {column!r}")
        kept = kept[kept.kept][column]
        return float(kept.min()), float(kept.max())

    def to_frame(self) -> pd.DataFrame:
        rows = []
        lo, hi = self.compute_scales["low"], self.compute_scales["high"]
        for group, fits in (("pinned", self.fits), ("free", self.free)):
            for name, c in fits.items():
                q = c.params
                rows.append({"fit": name, "compute scale": group, "compute_scale": q.compute_scale,
                             "comm_scale": q.comm_scale, "fixed_ms": q.fixed_ms, "rms_rel_error": c.rms_rel_error,
                             "max_abs_rel_error": c.max_abs_rel_error,
                             "compute_scale_in_C3_range": lo - 1e-9 <= q.compute_scale <= hi + 1e-9,
                             "kept": name in self.kept, "central": name == self.central})
        return pd.DataFrame(rows).set_index("fit")


_CACHE: dict = {}


def calibration_set(**kw) -> CalibrationSet:
    """The calibrations behind every prediction (``data/calibration/README.md``): ``compute_scale`` from DeepSeek's
    decode cost (:func:`compute_scale_from_cost` at the evidence's central value and the ends of its reading
    precision), ``comm_scale`` and ``fixed_ms`` fitted on Fig. 1 and Table 2 row 1 with it fixed, under each of the
    four fitting choices (:func:`calibration_variants`); ``kw`` go to :func:`calibrate` (e.g. a coarser ``grid``).
    Cached per keyword set within a process."""
    key = ("set", tuple(sorted(kw.items())))
    if key in _CACHE:
        return _CACHE[key]
    ev = cost_growth_evidence()
    scales = {at: compute_scale_from_cost(ev[at], scenario=kw.get("scenario")) for at in ("low", "central", "high")}
    fits = {}
    for at, sc in scales.items():
        for name, c in calibration_variants(compute_scale=sc, **kw).items():
            fits[f"compute {at} ({sc:.3f}), {name}"] = c
    central = f"compute central ({scales['central']:.3f}), default (Table 2 weight 5)"
    limit = min(c.rms_rel_error for c in fits.values()) + EQUALLY_GOOD_RMS_PP / 100
    free = {f"free compute ({c.params.compute_scale:.3f}), {name}": c for name, c in calibration_variants(**kw).items()}
    in_range = lambda c: scales["low"] - 1e-9 <= c.params.compute_scale <= scales["high"] + 1e-9     # noqa: E731
    kept = tuple(n for n, c in fits.items() if c.rms_rel_error <= limit)
    kept += tuple(n for n, c in free.items() if c.rms_rel_error <= limit and in_range(c))
    if central not in kept:
        kept = (central,) + kept
    out = CalibrationSet(fits, kept, central, scales, ev, free)
    _CACHE[key] = out
    return out


def calibration_spread(calibrations: dict, *, scenario: Scenario | None = None) -> pd.DataFrame:
    """No-offload predictions under every calibration (``{name: CostParams}``, e.g.
    :meth:`CalibrationSet.kept_params`), one row each, in ``scenario`` (its cost parameters replaced): the 128K row at
    the paper's 128K memory limit, Table 2 row 1 (32K, batch 52), and MTP 4 at batch 52 at each accept ratio Table 2
    lists among its MTP 4 settings, as a gain over row 1 (``data/published/``). Columns ``tput_<L>k_b<B>`` and
    ``mtp4_acc<a>_gain_pct``; the spread over the rows is the calibration part of every later band."""
    sc = _fit_scenario(scenario)
    t2 = published("paper_table2")
    row, mtp4, lim128 = t2["t2_32k_mtp2_b52_r1"], t2["t2_32k_mtp4"], published("paper")["batch_limit_128k"]
    B1, L32 = row["batch"], row["context_len"]
    B128, L128 = lim128["value"], lim128["context_len"]
    accs = mtp4["accept_ratios"]
    n = len(accs)
    rows = []
    for name, q in calibrations.items():
        r = simulate([B128, B1] + [B1] * n, [L128, L32] + [L32] * n, 1.0,
                     mtp=[row["mtp"]] * 2 + [mtp4["mtp"]] * n,
                     accept_ratio=[row["accept_ratio"]] * 2 + list(accs), scenario=sc.replace(params=q))
        rows.append({"fit": name, "compute_scale": q.compute_scale, "comm_scale": q.comm_scale, "fixed_ms": q.fixed_ms,
                     f"tput_{L128 // 1024}k_b{B128}": r.throughput[0], f"tput_{L32 // 1024}k_b{B1}": r.throughput[1],
                     **{f"mtp4_acc{a:g}_gain_pct": (r.throughput[2 + i] / r.throughput[1] - 1) * 100
                        for i, a in enumerate(accs)}})
    return pd.DataFrame(rows).set_index("fit")


def calibrated_params() -> CostParams:
    """The central calibration (:func:`calibration_set`'s, as :func:`ess.sim.store.stored_calibration` keeps it:
    read from ``data/generated/calibration.json`` while that matches today's inputs, else computed once)."""
    from .store import stored_calibration
    return stored_calibration()["central"]


# ----------------------------------------------------------------------------------------------------------------
# Coverage: is a left-out calibration point inside the band the others give it?
# ----------------------------------------------------------------------------------------------------------------

def leave_one_out(*, part_batch_band: bool = True, progress: bool = False, **kw) -> pd.DataFrame:
    """Leave-one-out over the calibration points: for each point, the calibration band refitted without it -- the
    compute scale pinned at each of the decode-cost evidence's central value and ends (:func:`calibration_set`; the
    evidence does not depend on the points) under each of the four fitting choices (:func:`calibration_variants`),
    the equally good ones kept (RMS on the remaining points at most the lowest plus :data:`EQUALLY_GOOD_RMS_PP`),
    and with ``part_batch_band`` the central fit under each end of the part-batch evidence (as
    :func:`ess.sim.predictions.band_inputs` adds them) -- and the left-out point predicted by each: ``predicted``
    (the central fit's), ``low`` / ``high`` (over the kept fits), ``inside`` (the published value within), and
    ``outside_rel`` (how far outside, relative to the nearer end; 0 inside). The four fits with a free compute scale
    are left out (seconds each, and the full set keeps one of them). ``kw`` go to :func:`calibrate` (e.g. a coarser
    ``grid``). One row per point."""
    from tqdm.auto import tqdm
    from ..validate import boolean
    part_batch_band = boolean("part_batch_band", part_batch_band)
    progress = boolean("progress", progress)
    pts = calibration_points()
    ev = cost_growth_evidence()
    scales = {at: compute_scale_from_cost(ev[at], scenario=kw.get("scenario")) for at in ("low", "central", "high")}
    extra = {}
    if part_batch_band:
        for end in ("low", "high"):
            scen = Scenario(params=CostParams(part_batch=end))
            extra[f"part-batch {end}"] = (scen, compute_scale_from_cost(ev["central"], scenario=scen))
    rows = []
    for i in tqdm(range(len(pts)), desc="leave one out", unit="point", disable=not progress):
        rest, out = pts[:i] + pts[i + 1:], pts[i]
        fits = {}
        for at, sc in scales.items():
            for name, c in calibration_variants(rest, compute_scale=sc, **kw).items():
                fits[f"compute {at}, {name}"] = c
        limit = min(c.rms_rel_error for c in fits.values()) + EQUALLY_GOOD_RMS_PP / 100
        central = f"compute central, default (Table 2 weight 5)"
        kept = {n: c.params for n, c in fits.items() if c.rms_rel_error <= limit or n == central}
        for name, (scen, sc) in extra.items():
            kept[name] = calibrate(rest, compute_scale=sc, scenario=scen, **{k: v for k, v in kw.items()
                                                                             if k != "scenario"}).params
        preds = {}
        for n, q in kept.items():
            scen = extra[n][0] if n in extra else kw.get("scenario")
            preds[n] = float(predict_points([out], q, scenario=scen)[0])
        lo, hi = min(preds.values()), max(preds.values())
        obs = out.throughput
        outside = 0.0 if lo <= obs <= hi else (lo - obs) / lo if obs < lo else (obs - hi) / hi
        rows.append({"name": out.name, "batch": out.batch, "published": obs, "read_from_chart": out.read_from_chart,
                     "predicted": preds[central], "low": lo, "high": hi, "band_size": len(preds),
                     "rel_error": preds[central] / obs - 1, "inside": lo <= obs <= hi, "outside_rel": outside})
    return pd.DataFrame(rows)


def band_coverage(loo: pd.DataFrame, nominal: float) -> dict:
    """The share of left-out points inside their band (:func:`leave_one_out`) against ``nominal``, and the one rule
    that widens a band that covers less: every band's ends moved out by the same relative margin ``widen`` (low x
    (1 - widen), high x (1 + widen)), the smallest margin that puts ``ceil(nominal x (n + 1))`` of the ``n`` left-out
    points inside (the jackknife's finite-sample rank; 0 when the band already covers ``nominal``), and the coverage
    it gives. Never point by point.

    >>> loo = pd.DataFrame({"inside": [True, True, False, False], "outside_rel": [0.0, 0.0, 0.02, 0.05]})
    >>> c = band_coverage(loo, 0.6)          # ceil(0.6 x 5) = 3 points inside: the 2 % one joins
    >>> c["coverage"], c["widen"], c["coverage_widened"]
    (0.5, 0.02, 0.75)
    """
    nominal = real("nominal", nominal, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    if not isinstance(loo, pd.DataFrame) or not {"inside", "outside_rel"} <= set(loo.columns) or loo.empty:
        raise TypeError("loo must be the non-empty frame of leave_one_out (columns inside, outside_rel)")
    n = len(loo)
    d = np.sort(loo.outside_rel.to_numpy(float))
    need = min(int(np.ceil(nominal * (n + 1))), n)
    cover = float(loo.inside.mean())
    widen = 0.0 if cover >= nominal else float(d[need - 1])
    return {"points": n, "nominal": nominal, "coverage": cover, "widen": widen,
            "coverage_widened": float(np.mean(d <= widen + 1e-12))}


def band_widening() -> float:
    """The relative margin every throughput's calibration band is widened by (:func:`band_coverage` of the stored
    leave-one-out, :func:`ess.sim.store.stored_coverage`; 0 when the band covers :data:`BAND_NOMINAL`)."""
    from .store import stored_coverage
    return float(stored_coverage()["widen"])


def widen_band(low, high, widen: float | None = None):
    """``(low x (1 - widen), high x (1 + widen))`` (default :func:`band_widening`): the one rule that widens a
    throughput's calibration band to its nominal coverage. Arrays or numbers; NaN stays NaN.

    >>> widen_band(100.0, 110.0, 0.05)
    (95.0, 115.5)
    """
    w = band_widening() if widen is None else real("widen", widen, lo=0.0, hi=1.0, hi_open=True)
    return low * (1 - w), high * (1 + w)
