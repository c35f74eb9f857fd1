"""Figures of cache misses, replacement policies and prefetch classes (notebook 04). Data in, figure out."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from ._style import COLORS, TEMPLATE as _TEMPLATE, LEGEND, add_band

__all__ = ["fig_misses_per_layer", "fig_warmup_curve", "fig_misses_vs_context", "fig_policies",
           "fig_policies_by_ratio", "fig_prefetch_classes", "fig_prefetch_steps", "fig_locality_profile",
           "fig_hit_rate_against_range"]

def fig_locality_profile(profile: Sequence[float],
                         measured: Sequence[float] | Mapping[str, Sequence[float]] | None = None) -> go.Figure:
    """Adjacent-step overlap per layer: the profile (read by eye from paper Fig. 2) and, optionally, the overlap
    measured on a generated trace (one series, or a mapping name -> series for several trace models)."""
    fig = go.Figure()
    x = np.arange(len(profile))
    fig.add_scatter(x=x, y=profile, mode="lines+markers", name="profile (paper Fig. 2, read by eye)")
    if measured is not None:
        series = measured if isinstance(measured, Mapping) else {"measured on the synthetic trace": measured}
        for (name, y), sym in zip(series.items(), ("x", "circle-open", "diamond-open", "cross")):
            fig.add_scatter(x=x, y=y, mode="markers", marker={"symbol": sym}, name=name)
    fig.update_layout(template=_TEMPLATE, title="Temporal locality per layer",
                      xaxis={"title": "layer"}, yaxis={"title": "overlap of adjacent steps' top-K", "range": [0, 1]},
                      legend=LEGEND)
    return fig


def fig_misses_per_layer(per_ratio: Mapping[float, Sequence[float]], *, title: str = "",
                         bands: Mapping[float, tuple] | None = None) -> go.Figure:
    """Mean misses per request and decode step in each layer, one line per ratio; ``bands`` maps a ratio to its
    ``(low, high)`` per layer (drawn as a shaded band around the line)."""
    fig = go.Figure()
    for i, (ratio, m) in enumerate(per_ratio.items()):
        color = COLORS[i % len(COLORS)]
        if bands and ratio in bands:
            add_band(fig, np.arange(len(m)), *bands[ratio], name=f"ratio {ratio:g}: band", color=color,
                     group=f"r{ratio:g}")
        fig.add_scatter(x=np.arange(len(m)), y=m, mode="lines", name=f"ratio {ratio:g}", line={"color": color},
                        legendgroup=f"r{ratio:g}")
    fig.update_layout(template=_TEMPLATE, title=title or "Misses per layer",
                      xaxis={"title": "layer"}, yaxis={"title": "misses per request per step"}, legend=LEGEND)
    return fig


def fig_warmup_curve(curves: Mapping[str, Sequence[float]], *, title: str = "",
                     bands: Mapping[str, tuple] | None = None) -> go.Figure:
    """Misses per decode step (mean over layers and requests), one line per setting (e.g. with / without warmup);
    ``bands`` maps a setting to its ``(low, high)`` per step (a shaded band around the line)."""
    fig = go.Figure()
    for i, (name, y) in enumerate(curves.items()):
        color = COLORS[i % len(COLORS)]
        if bands and name in bands:
            add_band(fig, np.arange(len(y)), *bands[name], name=f"{name}: band", color=color, group=name)
        fig.add_scatter(x=np.arange(len(y)), y=y, mode="lines", name=name, line={"color": color}, legendgroup=name)
    fig.update_layout(template=_TEMPLATE, title=title or "Misses over the first decode steps",
                      xaxis={"title": "decode step"}, yaxis={"title": "misses per request per layer", "type": "log"},
                      legend=LEGEND)
    return fig


def fig_misses_vs_context(context_lens: Sequence[int], misses: Sequence[float] | Mapping[str, Sequence[float]], *,
                          ratio: float, title: str = "") -> go.Figure:
    """Average misses per request, layer and step against context length at one ratio (one series, or a mapping
    name -> series)."""
    fig = go.Figure()
    series = misses if isinstance(misses, Mapping) else {f"ratio {ratio:g}": misses}
    for name, y in series.items():
        fig.add_scatter(x=list(context_lens), y=list(y), mode="lines+markers+text", name=name,
                        text=[f"{m:.0f}" for m in y], textposition="top center")
    fig.update_layout(template=_TEMPLATE, title=title or f"Average misses against context length (ratio {ratio:g})",
                      xaxis={"title": "context length L (tokens)", "type": "log", "tickvals": list(context_lens),
                             "ticktext": [f"{c // 1024}K" for c in context_lens]},
                      yaxis={"title": "misses per request per layer per step"}, legend=LEGEND)
    return fig


def fig_policies(misses: Mapping[str, float], *, bound: str = "belady", title: str = "") -> go.Figure:
    """Mean misses per policy as bars; the offline bound is drawn as a dashed line."""
    names = list(misses)
    fig = go.Figure()
    fig.add_bar(x=names, y=[misses[n] for n in names], text=[f"{misses[n]:.0f}" for n in names],
                textposition="outside", name="misses")
    if bound in misses:
        fig.add_hline(y=misses[bound], line_dash="dash", annotation_text="Belady (offline optimum)")
    fig.update_layout(template=_TEMPLATE, title=title or "Replacement policies against Belady's bound",
                      xaxis={"title": "policy"}, yaxis={"title": "misses per request per layer per step"},
                      showlegend=False)
    return fig


def fig_policies_by_ratio(ratios: Sequence[float], values: Mapping[str, Sequence[float]], *,
                          bands: Mapping[str, tuple] | None = None, title: str = "",
                          y_title: str = "misses relative to LRU (%)") -> go.Figure:
    """One line per policy against the pool ratio (e.g. each policy's misses relative to LRU's, in per cent);
    ``bands`` maps a policy to its ``(low, high)`` by ratio (a shaded band around the line)."""
    fig = go.Figure()
    for i, (name, y) in enumerate(values.items()):
        color = COLORS[i % len(COLORS)]
        if bands and name in bands:
            add_band(fig, ratios, *bands[name], name=f"{name}: band", color=color, group=name)
        fig.add_scatter(x=list(ratios), y=list(y), mode="lines+markers", name=name, line={"color": color},
                        legendgroup=name)
    fig.update_layout(template=_TEMPLATE, title=title or "Replacement policies against the pool ratio",
                      xaxis={"title": "ratio (pool slots / context)"}, yaxis={"title": y_title}, legend=LEGEND)
    return fig


def fig_prefetch_classes(summaries: Mapping[str, Mapping[str, float]], *, title: str = "") -> go.Figure:
    """Bytes moved per prefetch class (stacked) and the share prefetched but never used, per configuration; the hit rate
    and stall time are in the hover text."""
    names = list(summaries)
    fig = go.Figure()
    for key, label in (("bytes_immediate", "immediate (misses)"), ("bytes_speculative", "speculative"),
                       ("bytes_delayed", "delayed")):
        fig.add_bar(x=names, y=[summaries[n][key] / 1e6 for n in names], name=label)
    fig.add_scatter(x=names, y=[summaries[n]["bytes_prefetched_unused"] / 1e6 for n in names], mode="markers",
                    marker={"symbol": "x", "size": 11, "color": "black"}, name="prefetched, never used")
    hover = [f"hit rate {summaries[n]['hit_rate']:.3f}<br>stall {summaries[n]['stall_s'] * 1e3:.2f} ms<br>"
             f"link use {summaries[n]['link_use']:.2f}" for n in names]
    fig.data[0].hovertext = hover
    fig.update_layout(barmode="stack", template=_TEMPLATE, title=title or "Bytes over the link per prefetch class",
                      xaxis={"title": ""}, yaxis={"title": "MB moved host -> device"}, legend=LEGEND)
    return fig


def fig_prefetch_steps(misses_per_step: Sequence[float], stall_per_step_s: Sequence[float], *,
                       title: str = "") -> go.Figure:
    """Misses per step and the stall they cause (second axis)."""
    fig = go.Figure()
    x = np.arange(len(misses_per_step))
    fig.add_bar(x=x, y=misses_per_step, name="misses (immediate class)")
    fig.add_scatter(x=x, y=np.asarray(stall_per_step_s) * 1e6, mode="lines", name="stall (us)", yaxis="y2")
    fig.update_layout(template=_TEMPLATE, title=title or "Misses and stall per step",
                      xaxis={"title": "decode step"}, yaxis={"title": "misses"},
                      yaxis2={"title": "stall (us)", "overlaying": "y", "side": "right"}, legend=LEGEND)
    return fig


def fig_hit_rate_against_range(hit_rates: Mapping[str, float], low: float, high: float, *, source: str = "",
                               title: str = "") -> go.Figure:
    """Hit rate per trace model (bars) beside an independently reported range (shaded band)."""
    names = list(hit_rates)
    fig = go.Figure()
    fig.add_bar(x=names, y=[hit_rates[n] for n in names], text=[f"{hit_rates[n]:.3f}" for n in names],
                textposition="outside", name="hit rate")
    fig.add_hrect(y0=low, y1=high, fillcolor="green", opacity=0.15, line_width=0,
                  annotation_text=source or f"reported {low:.0%}-{high:.0%}")
    fig.update_layout(template=_TEMPLATE, title=title or "LRU hit rate with a pool of 2 x K",
                      xaxis={"title": "trace model"}, yaxis={"title": "hit rate", "range": [0, 1]},
                      showlegend=False)
    return fig
