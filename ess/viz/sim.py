"""Figures of the simulator (notebooks 05-08): calibration fit, step breakdown, Table 2 predictions, overlap
overhead against misses, and deployment ratios. Data in, plotly figure out."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._style import COLORS, TEMPLATE as _TEMPLATE, LEGEND, LEGEND_LOW, add_band

__all__ = ["fig_calibration", "fig_residuals", "fig_step_breakdown", "fig_table2", "fig_overlap_vs_misses",
           "fig_sim_misses_per_layer", "fig_deployment", "fig_batch_sweep"]


def fig_calibration(residuals, curve=None, unfitted=None, *, limits=None,
                    title="Decode throughput against batch (calibration data)") -> go.Figure:
    """Published calibration points (Fig. 1 read by eye, Table 2 row 1) and the fitted model's curve
    (``curve``: DataFrame with batch, throughput; ``unfitted`` likewise, optional). ``limits`` maps a label to a
    batch drawn as a vertical reference line (e.g. the memory limits)."""
    fig = go.Figure()
    chart = residuals[residuals.read_from_chart]
    exact = residuals[~residuals.read_from_chart]
    fig.add_scatter(x=chart.batch, y=chart.published, mode="markers", name="paper Fig. 1 (read by eye)",
                    marker={"size": 8})
    fig.add_scatter(x=exact.batch, y=exact.published, mode="markers", name="paper Table 2 row 1",
                    marker={"symbol": "x", "size": 12, "color": "black"})
    if curve is not None:
        fig.add_scatter(x=curve.batch, y=curve.throughput, mode="lines", name="ess, calibrated")
    if unfitted is not None:
        fig.add_scatter(x=unfitted.batch, y=unfitted.throughput, mode="lines", line={"dash": "dot"},
                        name="ess, unfitted (kernel points only)")
    for label, b in (limits or {}).items():
        fig.add_vline(x=b, line={"dash": "dash", "color": "grey"}, annotation_text=label)
    fig.update_layout(template=_TEMPLATE, title=title,
                      xaxis={"title": "batch per GPU"}, yaxis={"title": "tokens/s per node"},
                      legend=LEGEND)
    return fig


def fig_residuals(residuals) -> go.Figure:
    """Relative error of the calibrated model on each calibration point."""
    fig = go.Figure()
    fig.add_bar(x=residuals.name, y=residuals.rel_error * 100,
                marker={"color": np.where(residuals.read_from_chart, "#636efa", "black")})
    fig.update_layout(template=_TEMPLATE, title="Calibration residuals (predicted - published) / published",
                      xaxis={"title": "calibration point"}, yaxis={"title": "%"})
    return fig


def fig_step_breakdown(df) -> go.Figure:
    """Stacked step time per component (``df``: index = configuration label, columns = components in ms)."""
    fig = go.Figure()
    for col in df.columns:
        fig.add_bar(x=[str(i) for i in df.index], y=df[col], name=col)
    fig.update_layout(barmode="stack", template=_TEMPLATE, title="Where one decode step goes (per GPU)",
                      xaxis={"title": "configuration"}, yaxis={"title": "ms per step"},
                      legend=LEGEND_LOW)
    return fig


def fig_table2(t2, context_len: int) -> go.Figure:
    """Predicted node throughput against batch for each MTP setting at the paper's (batch, ratio) rows (solid:
    cache-simulated misses, with the band of ``throughput_low`` / ``throughput_high`` shaded where the frame has
    it; dotted: no misses, write-back only) and, where the frame has them (``setting == "ess"``), at the ratio ess's
    memory rule gives each batch (dashed). An accept ratio that is a configuration rather than a published value
    (its ``accept_ratio_source`` differs from the row's ``source``) is labelled so."""
    from ..validate import positive_int
    context_len = positive_int("context_len", context_len)    # a float would match no row: an empty figure
    sub = t2[t2.context_len == context_len]
    setting = sub.setting if "setting" in sub else pd.Series("paper", index=sub.index)
    fig = go.Figure()
    for i, ((mtp, acc), part) in enumerate(sub.groupby(["mtp", "accept_ratio"])):
        color = COLORS[i % len(COLORS)]
        name = f"MTP {mtp}, accept {acc:g}"
        if "accept_ratio_source" in part and (part.accept_ratio_source != part.source).any():
            name += " (a configuration)"
        paper = part[setting[part.index] == "paper"].sort_values("batch")
        ess = part[(setting[part.index] == "ess") | (part.ratio >= 1)].sort_values("batch")
        if "throughput" in part:
            if "throughput_low" in part:
                add_band(fig, paper.batch, paper.throughput_low, paper.throughput_high, name=name + " (band)",
                         color=color, group=name, show_legend=True)
            fig.add_scatter(x=paper.batch, y=paper.throughput, mode="lines+markers",
                            name=name + ", paper's ratio (simulated misses)", line={"color": color}, legendgroup=name)
            if (setting[part.index] == "ess").any():
                fig.add_scatter(x=ess.batch, y=ess.throughput, mode="lines+markers", marker={"symbol": "diamond"},
                                name=name + ", ess's ratio", line={"color": color, "dash": "dash"}, legendgroup=name)
        fig.add_scatter(x=paper.batch, y=paper.throughput_no_miss, mode="lines", line={"dash": "dot", "color": color},
                        name=name + " (no misses)", legendgroup=name)
    pub = sub[sub.published.notna()]
    fig.add_scatter(x=pub.batch, y=pub.published, mode="markers", marker={"symbol": "x", "size": 12, "color": "black"},
                    name="paper Table 2 row 1 (calibration)")
    fig.update_layout(template=_TEMPLATE, title=f"Table 2 predicted: {context_len // 1024}K, the paper's (batch, "
                                                "ratio) rows", xaxis={"title": "batch per GPU"},
                      yaxis={"title": "tokens/s per node"}, legend=LEGEND_LOW)
    return fig


_AXIS_TITLES = {"misses_per_layer": "misses per request, step and layer", "overhead_pct": "step-time overhead, %",
                "overhead_us_per_layer": "extra us per layer and micro-batch", "h2d_GB_per_s": "host-to-device GB/s",
                "throughput": "tokens/s per node"}


def fig_overlap_vs_misses(df, title: str = "Offload overhead against misses", *, value: str = "overhead_pct",
                          x: str = "misses_per_layer", log_x: bool = False) -> go.Figure:
    """``value`` (default the overhead in % of the no-offload step; ``"overhead_us_per_layer"``: the paper's units,
    extra microseconds per layer and micro-batch) per strategy against ``x`` (default the mean misses per request,
    step and layer), with the band of ``<value>_low`` / ``<value>_high`` shaded where the frame has it."""
    from ..validate import boolean
    log_x = boolean("log_x", log_x)
    fig = go.Figure()
    for i, (s, part) in enumerate(df.groupby("strategy", sort=False)):
        color = COLORS[i % len(COLORS)]
        part = part.sort_values(x)
        if f"{value}_low" in part:
            add_band(fig, part[x], part[f"{value}_low"], part[f"{value}_high"], name=f"{s} (band)", color=color,
                     group=s)
        fig.add_scatter(x=part[x], y=part[value], mode="lines+markers", name=s, line={"color": color},
                        legendgroup=s)
    fig.update_layout(template=_TEMPLATE, title=title,
                      xaxis={"title": _AXIS_TITLES.get(x, x), "type": "log" if log_x else "linear"},
                      yaxis={"title": _AXIS_TITLES.get(value, value)}, legend=LEGEND)
    return fig


def fig_strategy_map(df, title: str = "The cheapest strategy") -> go.Figure:
    """Which overlap strategy is cheapest (``best``: ``"none"``, ``"da"``, ``"dba"``) at each batch (y) and miss
    count (x) of ``df`` (:func:`ess.sim.predictions.strategy_map`), with its overhead in the hover text."""
    order = ("none", "da", "dba")
    piv = df.pivot(index="batch", columns="misses_per_layer", values="best")
    over = df.pivot(index="batch", columns="misses_per_layer", values="best_us_per_layer")
    z = piv.apply(lambda col: col.map(order.index)).to_numpy(dtype=float)
    text = [[f"{piv.iloc[i, j]}: {over.iloc[i, j]:.1f} us" for j in range(piv.shape[1])] for i in range(piv.shape[0])]
    colors = [COLORS[0], COLORS[1], COLORS[2]]
    scale = [[0.0, colors[0]], [1 / 3, colors[0]], [1 / 3, colors[1]], [2 / 3, colors[1]], [2 / 3, colors[2]],
             [1.0, colors[2]]]
    fig = go.Figure(go.Heatmap(z=z, x=[str(int(c)) for c in piv.columns], y=[str(int(b)) for b in piv.index],
                               zmin=-0.5, zmax=2.5, colorscale=scale, text=text, hoverinfo="text",
                               colorbar={"tickvals": [0, 1, 2], "ticktext": list(order), "title": "cheapest"}))
    fig.update_layout(template=_TEMPLATE, title=title, xaxis={"title": "misses per request, step and layer"},
                      yaxis={"title": "batch per GPU"})
    return fig


def fig_sim_misses_per_layer(misses: dict, bands: dict | None = None) -> go.Figure:
    """Per-layer miss counts behind the simulator's offload rows, one line per label, with ``bands[label] = (low,
    high)`` shaded around it where given (named apart from ``ess.viz.prefetch.fig_misses_per_layer``, which takes
    ratios as keys)."""
    fig = go.Figure()
    for i, (label, m) in enumerate(misses.items()):
        color = COLORS[i % len(COLORS)]
        if bands and label in bands:
            add_band(fig, np.arange(len(m)), *bands[label], name=f"{label}: band", color=color, group=label)
        fig.add_scatter(x=np.arange(len(m)), y=m, mode="lines", name=label, line={"color": color}, legendgroup=label)
    fig.update_layout(template=_TEMPLATE, title="Misses per request and step, by layer (cache simulation)",
                      xaxis={"title": "layer"}, yaxis={"title": "misses"}, legend=LEGEND)
    return fig


def fig_deployment(df) -> go.Figure:
    """After/before ratio of each deployment claim: the article's against ours."""
    sub = df[df.article_ratio.notna()]
    fig = go.Figure()
    fig.add_bar(x=sub.claim, y=sub.article_ratio, name="article")
    fig.add_bar(x=sub.claim, y=sub.ours_ratio, name="ess (simulated)")
    fig.add_hline(y=1, line={"color": "grey"})
    fig.update_layout(barmode="group", template=_TEMPLATE, title="Deployment benefits: after / before",
                      yaxis={"title": "ratio"}, legend=LEGEND)
    return fig


def fig_batch_sweep(batches, throughput, otps, *, title: str = "") -> go.Figure:
    """Node throughput (left axis) and OTPS (right axis) against the batch per GPU."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_scatter(x=batches, y=throughput, name="throughput (tokens/s per node)")
    fig.add_scatter(x=batches, y=otps, name="OTPS (tokens/s per request)", secondary_y=True)
    fig.update_layout(template=_TEMPLATE, height=340, title=title, xaxis={"title": "batch per GPU"},
                      legend=LEGEND_LOW)
    fig.update_yaxes(title_text="tokens/s per node", secondary_y=False)
    fig.update_yaxes(title_text="OTPS", secondary_y=True)
    return fig


def fig_loo_coverage(loo, widen: float = 0.0, title: str = "") -> go.Figure:
    """Each calibration point left out of a refit (:func:`ess.sim.calibrate.leave_one_out`): its published value
    against the band the other points give it (``low``-``high``, the central prediction marked), inside in one
    colour, outside in another; with ``widen`` > 0 the widened band dotted. Throughput against batch."""
    fig = go.Figure()
    x = loo.batch.to_numpy()
    fig.add_scatter(x=x, y=loo.predicted, mode="markers", name="refit without the point (central)",
                    marker={"symbol": "line-ew-open", "size": 14, "color": COLORS[0]},
                    error_y={"type": "data", "symmetric": False, "array": loo.high - loo.predicted,
                             "arrayminus": loo.predicted - loo.low, "color": COLORS[0], "thickness": 2})
    if widen > 0:
        lo, hi = loo.low * (1 - widen), loo.high * (1 + widen)
        fig.add_scatter(x=x + 2, y=loo.predicted, mode="markers", name=f"widened by {widen:.1%}",
                        marker={"size": 1, "color": COLORS[4]},
                        error_y={"type": "data", "symmetric": False, "array": hi - loo.predicted,
                                 "arrayminus": loo.predicted - lo, "color": COLORS[4], "thickness": 1})
    for inside, name, color in ((True, "published, inside its band", COLORS[2]),
                                (False, "published, outside", COLORS[1])):
        part = loo[loo.inside == inside]
        fig.add_scatter(x=part.batch, y=part.published, mode="markers", name=name,
                        marker={"size": 8, "color": color}, text=part.name,
                        hovertemplate="%{text}: %{y:,.0f} tokens/s")
    fig.update_layout(template=_TEMPLATE, height=420, legend=LEGEND,
                      title=title or "Leave one out: is each calibration point inside the band the others give it?",
                      xaxis={"title": "batch per GPU"}, yaxis={"title": "tokens/s per node"})
    return fig
