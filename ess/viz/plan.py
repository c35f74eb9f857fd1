"""The plan's figure (:func:`ess.plan`): throughput per GPU against tokens per second per request, one point
per batch, with and without offload -- the Pareto view a serving engineer reads (moving right is a faster reply for
each user, moving up more tokens from the GPU). Data in, plotly figure out."""
from __future__ import annotations

import plotly.graph_objects as go

from ._style import COLORS, TEMPLATE

__all__ = ["fig_pareto"]


def fig_pareto(plan) -> go.Figure:
    """The curve of ``plan`` (:attr:`ess.planning.Plan.curve`): a line per setting over the batch (hover: the batch),
    the plan's point and the best point without offload marked."""
    c = plan.curve
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=c.tokens_per_s_per_request_no_offload, y=c.throughput_per_gpu_no_offload,
                             mode="lines+markers", name="without offload", marker=dict(size=4),
                             line=dict(color=COLORS[0]), customdata=c.batch_no_offload,
                             hovertemplate="batch %{customdata}<br>%{x:.1f} tok/s per request<br>"
                                           "%{y:,.0f} tok/s per GPU<extra></extra>"))
    if c.batch:
        fig.add_trace(go.Scatter(x=c.tokens_per_s_per_request, y=c.throughput_per_gpu, mode="lines+markers",
                                 name=f"offload, ratio {plan.ratio:g}", marker=dict(size=4),
                                 line=dict(color=COLORS[1]), customdata=c.batch,
                                 hovertemplate="batch %{customdata}<br>%{x:.1f} tok/s per request<br>"
                                               "%{y:,.0f} tok/s per GPU<extra></extra>"))
    for name, b, t, color in (("best without offload", plan.baseline_batch, plan.baseline_throughput, COLORS[0]),
                              ("the plan", plan.batch, plan.throughput, COLORS[1])):
        if b:
            fig.add_trace(go.Scatter(x=[t / b], y=[t], mode="markers+text", name=name, text=[f"batch {b}"],
                                     textposition="top center", showlegend=False,
                                     marker=dict(size=12, symbol="star", color=color)))
    top = max([*c.throughput_per_gpu, *c.throughput_per_gpu_no_offload, 1.0])
    fig.update_yaxes(range=[0, top * 1.12])                 # room for the marks' labels above the curves
    fig.update_layout(template=TEMPLATE, height=420,
                      title=f"{plan.model} on {plan.gpu}, {plan.context_len:,} tokens, {plan.link}",
                      xaxis_title="tokens/s per request", yaxis_title="tokens/s per GPU")
    return fig
