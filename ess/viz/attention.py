"""Figures of sparse attention (notebook 03)."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._style import TEMPLATE as _TEMPLATE, LEGEND, LEGEND_HIGH

__all__ = ["fig_indexer_selection", "fig_attention_cost", "fig_storage_precision"]


def fig_indexer_selection(example: dict) -> go.Figure:
    """Indexer scores (query position x token, causal) with the top-K picks marked, from
    :func:`ess.studies.attention.indexer_selection_example`."""
    scores, idx = example["scores"], example["indices"]
    T, L = scores.shape
    z = np.where(np.isfinite(scores), scores, np.nan)
    fig = go.Figure(go.Heatmap(z=z, colorscale="Blues", colorbar={"title": "score"}, hoverongaps=False))
    ts, ss = np.nonzero(idx >= 0)
    fig.add_scatter(x=idx[ts, ss], y=ts, mode="markers", marker={"symbol": "x", "size": 4, "color": "crimson"},
                    name=f"top-{idx.shape[1]} pick")
    fig.update_layout(template=_TEMPLATE, title=f"Lightning-indexer scores and the top-{idx.shape[1]} picks "
                                                f"(synthetic: query t looks back {example.get('lag', '?')} tokens)",
                      xaxis={"title": "token s"}, yaxis={"title": "query position t", "autorange": "reversed"},
                      legend=LEGEND_HIGH)
    return fig


def fig_attention_cost(df) -> go.Figure:
    """Per-step time and cumulative time over a sequence, dense against sparse, from
    the ``attention_cost`` benchmark (``benchmarks/attention_cost.py``)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("one decode step", "all decode steps up to L"))
    series = (("dense_s", "dense MLA over L entries"), ("sparse_total_s", "sparse: indexer + MLA over K"),
              ("sparse_s", "sparse MLA over K only"), ("indexer_s", "indexer over L"))
    colors = ("#d62728", "#1f77b4", "#17becf", "#9467bd")
    for (col, name), color in zip(series, colors):
        fig.add_scatter(x=df.context_len, y=df[col] * 1e3, mode="lines+markers", name=name, legendgroup=col,
                        line={"color": color}, row=1, col=1)
        fig.add_scatter(x=df.context_len, y=df["cumulative_" + col], mode="lines+markers", name=name,
                        legendgroup=col, showlegend=False, line={"color": color}, row=1, col=2)
    cfg = df.attrs.get("config", {})
    fig.update_xaxes(title="context length L (tokens)", type="log")
    fig.update_yaxes(title="ms", type="log", row=1, col=1)
    fig.update_yaxes(title="s (trapezoid over measured L)", type="log", row=1, col=2)
    fig.update_layout(template=_TEMPLATE, legend=LEGEND,
                      title=f"Dense against sparse attention, measured ({cfg.get('backend', '')}, H={cfg.get('H')}, "
                            f"K={cfg.get('K')}, FP8 entries)")
    return fig


def fig_storage_precision(df) -> go.Figure:
    """Bytes per entry and attention output error, FP8 against BF16, from :func:`ess.studies.attention.storage_precision`."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("bytes per latent entry", "relative RMS output error"))
    labels = [d.upper() for d in df.dtype]
    fig.add_bar(x=labels, y=df.entry_bytes, text=df.entry_bytes, textposition="outside", showlegend=False,
                row=1, col=1)
    fig.add_bar(x=labels, y=df.rel_rms_error * 100, text=[f"{v:.2%}" for v in df.rel_rms_error],
                textposition="outside", showlegend=False, row=1, col=2)
    fig.update_yaxes(title="B", row=1, col=1)
    fig.update_yaxes(title="% of ||o||", row=1, col=2)
    fig.update_layout(template=_TEMPLATE, title="FP8 against BF16 latent storage (synthetic inputs; output error, "
                                                "not task accuracy)")
    return fig
