"""Figures of the simulator (notebooks 05-08): calibration fit, step breakdown, Table 2 predictions, overlap
overhead against misses, and deployment ratios. Data in, plotly figure out."""
from __future__ import annotations

import numpy as np
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
    """Predicted node throughput against batch for each MTP setting (solid: cache-simulated misses, with the band
    of ``throughput_low`` / ``throughput_high`` shaded where the frame has it; dotted: no misses, write-back only).
    An accept ratio that is a configuration rather than a published value (its ``accept_ratio_source`` differs from
    the row's ``source``) is labelled so."""
    sub = t2[t2.context_len == context_len]
    if "row" in sub:                                  # one line per MTP setting: the paper's batch rule only
        sub = sub[~sub.row.str.endswith("_host_capped")]
    fig = go.Figure()
    for i, ((mtp, acc), part) in enumerate(sub.groupby(["mtp", "accept_ratio"])):
        part = part.sort_values("batch")
        color = COLORS[i % len(COLORS)]
        name = f"MTP {mtp}, accept {acc:g}"
        if "accept_ratio_source" in part and (part.accept_ratio_source != part.source).any():
            name += " (a configuration)"
        if "throughput" in part:
            if "throughput_low" in part:
                add_band(fig, part.batch, part.throughput_low, part.throughput_high, name=name + " (band)",
                         color=color, group=name, show_legend=True)
            fig.add_scatter(x=part.batch, y=part.throughput, mode="lines+markers", name=name + " (simulated misses)",
                            line={"color": color}, legendgroup=name)
        fig.add_scatter(x=part.batch, y=part.throughput_no_miss, mode="lines", line={"dash": "dot", "color": color},
                        name=name + " (no misses)", legendgroup=name)
    pub = sub[sub.published.notna()]
    fig.add_scatter(x=pub.batch, y=pub.published, mode="markers", marker={"symbol": "x", "size": 12, "color": "black"},
                    name="paper Table 2 row 1 (calibration)")
    fig.update_layout(template=_TEMPLATE, title=f"Table 2 predicted: {context_len // 1024}K, ratio each batch needs",
                      xaxis={"title": "batch per GPU"}, yaxis={"title": "tokens/s per node"},
                      legend=LEGEND_LOW)
    return fig


def fig_overlap_vs_misses(df, title: str = "Offload overhead against misses") -> go.Figure:
    """Overhead (% of the no-offload step) per strategy against mean misses per request, step and layer, with the
    band of ``overhead_pct_low`` / ``overhead_pct_high`` shaded where the frame has it."""
    fig = go.Figure()
    for i, (s, part) in enumerate(df.groupby("strategy", sort=False)):
        color = COLORS[i % len(COLORS)]
        if "overhead_pct_low" in part:
            add_band(fig, part.misses_per_layer, part.overhead_pct_low, part.overhead_pct_high, name=f"{s} (band)",
                     color=color, group=s)
        fig.add_scatter(x=part.misses_per_layer, y=part.overhead_pct, mode="lines+markers", name=s,
                        line={"color": color}, legendgroup=s)
    fig.update_layout(template=_TEMPLATE, title=title, xaxis={"title": "misses per request, step and layer"},
                      yaxis={"title": "step-time overhead, %"}, legend=LEGEND)
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
