"""Figures of the tiered storage (notebook 02)."""
from __future__ import annotations

import plotly.graph_objects as go

from ..validate import frame, positive_int
from ._style import TEMPLATE as _TEMPLATE, LEGEND, LEGEND_LOW

__all__ = ["fig_tier_bytes", "fig_step_traffic", "fig_layer_misses", "fig_policy_misses"]


def fig_tier_bytes(df, title: str | None = None) -> go.Figure:
    """Stacked bars of GB per tier (from :func:`ess.memory.tier_placement`)."""
    df = frame("df", df, ("tier", "part", "bytes"))
    fig = go.Figure()
    for part, sub in df.groupby("part", sort=False):
        fig.add_bar(y=sub.tier, x=sub.bytes / 1e9, name=part, orientation="h",
                    text=[f"{b / 1e9:.1f}" for b in sub.bytes], textposition="inside")
    a = df.attrs
    fig.update_layout(barmode="stack", template=_TEMPLATE, height=320,
                      title=title or (f"Where the bytes live, per GPU: {a.get('gpu')}, L = "
                                      f"{a.get('context_len', 0) // 1024}K, ratio {a.get('ratio', 0):g}, "
                                      f"batch {a.get('batch')}"),
                      xaxis={"title": "GB"}, yaxis={"categoryorder": "array", "categoryarray": ["disk", "host", "GPU"]},
                      legend=LEGEND_LOW)
    return fig


def fig_step_traffic(runs: dict, *, entry_bytes: int, k: int) -> go.Figure:
    """Misses per decode step (summed over the simulated layers) for each run ``{label: per_step DataFrame}``
    (from :meth:`ess.metrics.MetricsLog.per_step`); the right axis gives the host-to-device MB."""
    if not isinstance(runs, dict):
        raise TypeError(f"runs must be a dict {{label: per_step DataFrame}}, got {type(runs).__name__}")
    runs = {label: frame(f"runs[{label!r}]", df, ("step", "misses", "bytes_h2d")) for label, df in runs.items()}
    entry_bytes, k = positive_int("entry_bytes", entry_bytes), positive_int("k", k)
    fig = go.Figure()
    for label, df in runs.items():
        fig.add_scatter(x=df.step, y=df.misses, mode="lines+markers", name=label,
                        customdata=df.bytes_h2d / 1e6, hovertemplate="step %{x}: %{y} misses, %{customdata:.2f} MB")
    fig.update_layout(template=_TEMPLATE, title=f"Misses per decode step (K = {k} per layer; one miss moves "
                                                f"{entry_bytes} B host to device)",
                      xaxis={"title": "decode step"}, yaxis={"title": "misses (entries loaded)", "rangemode": "tozero"},
                      legend=LEGEND)
    return fig


def fig_layer_misses(df) -> go.Figure:
    """Mean misses per step for each simulated layer and run (columns ``layer``, ``run``, ``misses``,
    ``overlap``)."""
    df = frame("df", df, ("run", "layer", "overlap", "misses"))
    fig = go.Figure()
    for run, sub in df.groupby("run", sort=False):
        fig.add_bar(x=[f"layer {l} (r={o:.2f})" for l, o in zip(sub.layer, sub.overlap)], y=sub.misses, name=run)
    fig.update_layout(template=_TEMPLATE, barmode="group", title="Mean misses per step, by layer",
                      xaxis={"title": "paper layer (adjacent-step overlap r of the synthetic trace)"},
                      yaxis={"title": "misses per step"}, legend=LEGEND_LOW)
    return fig


def fig_policy_misses(df) -> go.Figure:
    """Total misses per eviction policy (columns ``policy``, ``misses``)."""
    df = frame("df", df, ("policy", "misses"))
    fig = go.Figure(go.Bar(x=df.policy, y=df.misses, text=df.misses, textposition="outside"))
    fig.update_layout(template=_TEMPLATE, title="Decode misses by eviction policy (same trace, same capacity)",
                      xaxis={"title": "policy"}, yaxis={"title": "misses, all steps and layers"})
    return fig
