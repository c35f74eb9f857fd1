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
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..published import published
from .costs import CostParams
from .timeline import simulate

__all__ = ["CalibrationPoint", "calibration_points", "Calibration", "calibrate", "predict_points",
           "calibration_variants", "calibrated_params"]


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


def _step_without_fixed(points, compute_scale, comm_scale, **kw):
    B = np.array([p.batch for p in points])
    L = np.array([p.context_len for p in points])
    mtp = np.array([p.mtp for p in points])
    a = np.array([p.accept_ratio for p in points])
    res = simulate(B, L, 1.0, mtp=mtp, accept_ratio=a, check_memory=False,
                   params=CostParams(compute_scale, comm_scale, 0.0), **kw)
    return res.step_s


@dataclass(frozen=True)
class Calibration:
    """Fitted parameters and the residuals on every calibration point."""

    params: CostParams
    residuals: pd.DataFrame        # name, batch, published, predicted, rel_error, read_from_chart, source
    rms_rel_error: float
    max_abs_rel_error: float


def predict_points(points, params: CostParams, **kw) -> np.ndarray:
    """Node throughput predicted for calibration-style points (no memory limit, no offload)."""
    step = _step_without_fixed(points, params.compute_scale, params.comm_scale, **kw) + params.fixed_ms * 1e-3
    B = np.array([p.batch for p in points])
    a = np.array([p.accept_ratio for p in points])
    from ..specs import resolve
    dep = resolve("deepseek-v3.2-exp", kw.get("deployment", "paper-table1"), None, None)[1]
    return B * dep.gpus_per_node * a / step


def calibrate(points: list[CalibrationPoint] | None = None, *, table2_weight: float = 5.0,
              scale_range: tuple[float, float] = (0.1, 5.0), grid: int = 24, refine: int = 2, **kw) -> Calibration:
    """Fit ``compute_scale``, ``comm_scale`` and ``fixed_ms`` on the calibration points; return them with the
    residuals (relative throughput errors, ``(predicted - published) / published``)."""
    points = list(points) if points is not None else calibration_points()
    if len(points) < 3:
        raise ValueError(f"calibrate needs at least 3 calibration points, got {len(points)}")
    if table2_weight <= 0:
        raise ValueError(f"table2_weight must be > 0, got {table2_weight}")
    from ..specs import resolve
    dep = resolve("deepseek-v3.2-exp", kw.get("deployment", "paper-table1"), None, None)[1]
    B = np.array([p.batch for p in points], dtype=float)
    a = np.array([p.accept_ratio for p in points])
    obs_step = B * dep.gpus_per_node * a / np.array([p.throughput for p in points])
    w = np.array([1.0 if p.read_from_chart else table2_weight for p in points])

    def evaluate(sc, sm):
        s = _step_without_fixed(points, sc, sm, **kw)
        wi = w / obs_step ** 2
        f = max(float(np.sum(wi * (obs_step - s)) / np.sum(wi)), 0.0)
        err = (s + f - obs_step) / obs_step
        return float(np.sum(w * err ** 2)), f

    lo, hi = np.log(scale_range[0]), np.log(scale_range[1])
    lo_c, hi_c, lo_m, hi_m = lo, hi, lo, hi
    best = (np.inf, 1.0, 1.0, 0.0)
    for _ in range(refine + 1):
        for sc in np.exp(np.linspace(lo_c, hi_c, grid)):
            for sm in np.exp(np.linspace(lo_m, hi_m, grid)):
                loss, f = evaluate(sc, sm)
                if loss < best[0]:
                    best = (loss, sc, sm, f)
        step_c = (hi_c - lo_c) / (grid - 1)
        step_m = (hi_m - lo_m) / (grid - 1)
        lo_c, hi_c = np.log(best[1]) - 2 * step_c, np.log(best[1]) + 2 * step_c
        lo_m, hi_m = np.log(best[2]) - 2 * step_m, np.log(best[2]) + 2 * step_m
    _, sc, sm, f = best
    params = CostParams(float(sc), float(sm), float(f) * 1e3,
                        fitted_on=f"{sum(p.read_from_chart for p in points)} paper Fig. 1 chart points + "
                                  f"{sum(not p.read_from_chart for p in points)} Table 2 rows (paper-facts.md, "
                                  f"Calibration data); Table 2 weight {table2_weight:g}")
    pred = predict_points(points, params, **kw)
    obs = np.array([p.throughput for p in points])
    rel = (pred - obs) / obs
    df = pd.DataFrame({"name": [p.name for p in points], "batch": B.astype(int), "published": obs,
                       "predicted": pred, "rel_error": rel, "read_from_chart": [p.read_from_chart for p in points],
                       "source": [p.source for p in points]})
    return Calibration(params, df, float(np.sqrt(np.mean(rel ** 2))), float(np.max(np.abs(rel))))


_CACHE: dict = {}


def calibrated_params() -> CostParams:
    """The parameters of :func:`calibrate` with its defaults (computed once per process)."""
    if "params" not in _CACHE:
        _CACHE["params"] = calibrate().params
    return _CACHE["params"]


def calibration_variants(**kw) -> dict[str, Calibration]:
    """The fit under other defensible choices, to show how much the choices move the predictions: the default,
    Fig. 1 alone, Table 2's row weighted like one chart point, and like twenty."""
    pts = calibration_points()
    return {"default (Table 2 weight 5)": calibrate(pts, **kw),
            "Fig. 1 only": calibrate([p for p in pts if p.read_from_chart], **kw),
            "Table 2 weight 1": calibrate(pts, table2_weight=1.0, **kw),
            "Table 2 weight 20": calibrate(pts, table2_weight=20.0, **kw)}
