"""Figures of the real model decoding through the tiered cache (notebook 09): what each step moved and waited for,
the misses per layer, where a step's time goes, one step's timeline on the compute lane and the link, and the
step time the overlap formulas predict against the one measured."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._style import COLORS, LEGEND, LEGEND_LOW, LEGEND_SHORT, TEMPLATE

__all__ = ["fig_engine_steps", "fig_engine_layers", "fig_engine_breakdown", "fig_engine_timeline",
           "fig_engine_validation", "fig_product_costs"]


def fig_engine_steps(df, title: str = "") -> go.Figure:
    """Per decode step (a :meth:`ess.metrics.DecodeMetricsLog.to_frame`): misses, and the kB they moved host to
    device on their own axis (left), stall and step time in ms (right)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("misses and bytes copied", "step time and stall"),
                        specs=[[{"secondary_y": True}, {}]])
    fig.add_scatter(x=df.step, y=df.misses, name="misses (all layers)", mode="lines+markers", row=1, col=1)
    fig.add_scatter(x=df.step, y=df.bytes_h2d / 1e3, name="kB host to device (right axis)", mode="lines",
                    line={"dash": "dot"}, row=1, col=1, secondary_y=True)
    fig.add_scatter(x=df.step, y=df.step_s * 1e3, name="step ms", mode="lines+markers", row=1, col=2)
    fig.add_scatter(x=df.step, y=df.stall_s * 1e3, name="stall ms (waiting for the link)", mode="lines",
                    row=1, col=2)
    fig.update_xaxes(title_text="decode step", dtick=1)                 # whole steps, even for two of them
    fig.update_yaxes(title_text="misses", row=1, col=1, secondary_y=False)
    fig.update_yaxes(title_text="kB", row=1, col=1, secondary_y=True, showgrid=False)
    fig.update_yaxes(title_text="ms", row=1, col=2)
    fig.update_layout(template=TEMPLATE, height=360, title=title or "Each decode step", legend=LEGEND)
    return fig


def fig_engine_layers(df, title: str = "") -> go.Figure:
    """Mean misses per step of each layer (columns ``layer``, ``misses``, optional ``run`` for several bars)."""
    fig = go.Figure()
    groups = df.groupby("run", sort=False) if "run" in df else [("misses", df)]
    for name, sub in groups:
        fig.add_bar(x=sub.layer, y=sub.misses, name=str(name))
    fig.update_layout(template=TEMPLATE, barmode="group", height=340, title=title or "Misses per step, by layer",
                      xaxis={"title": "layer"}, yaxis={"title": "misses per step (all requests)"}, legend=LEGEND)
    return fig


def fig_engine_breakdown(df, title: str = "") -> go.Figure:
    """Stacked ms per step of each part (columns ``config``, ``part``, ``ms``), e.g. measured operations beside
    the predicted ones."""
    fig = go.Figure()
    for part, sub in df.groupby("part", sort=False):
        fig.add_bar(x=sub.config, y=sub.ms, name=part)
    fig.update_layout(template=TEMPLATE, barmode="stack", height=420, title=title or "Where a step's time goes",
                      yaxis={"title": "ms per step"}, legend=LEGEND_LOW)
    return fig


def fig_engine_timeline(ops, link, title: str = "") -> go.Figure:
    """One step on two lanes: the compute lane's operations (columns ``layer``, ``op``, ``start_s``, ``end_s``)
    and the link's jobs (columns ``kind``, ``layer``, ``start_s``, ``end_s``), times relative to the step's
    start."""
    t0 = min(ops.start_s.min(), link.start_s.min() if len(link) else ops.start_s.min())
    fig = go.Figure()
    for op, sub in ops.groupby("op", sort=False):
        fig.add_bar(y=["compute"] * len(sub), x=(sub.end_s - sub.start_s) * 1e3, base=(sub.start_s - t0) * 1e3,
                    orientation="h", name=op, customdata=sub.layer,
                    hovertemplate=op + ", layer %{customdata}: %{x:.3f} ms")
    for kind, sub in link.groupby("kind", sort=False):
        fig.add_bar(y=["link"] * len(sub), x=(sub.end_s - sub.start_s) * 1e3, base=(sub.start_s - t0) * 1e3,
                    orientation="h", name=kind, customdata=sub.layer,
                    hovertemplate=kind + ", layer %{customdata}: %{x:.3f} ms")
    fig.update_layout(template=TEMPLATE, barmode="overlay", height=300, title=title or "One decode step",
                      xaxis={"title": "ms since the step began"}, legend=LEGEND_SHORT)
    return fig


def fig_engine_validation(df, title: str = "") -> go.Figure:
    """Predicted against measured step time (columns ``predicted_ms``, ``measured_ms``, ``schedule``, ``role``:
    ``calibration``, ``held out`` or ``held out, measured inputs``), with the line where they agree."""
    fig = go.Figure()
    symbols = {"calibration": "circle-open", "held out": "circle", "held out, measured inputs": "x"}
    for (role, sched), sub in df.groupby(["role", "schedule"], sort=False):
        label = [f"B={b}, L={c}, ratio {r:g}, link {l}" for b, c, r, l in
                 zip(sub.batch, sub.context_len, sub.ratio, sub.link_GB_per_s)]
        fig.add_scatter(x=sub.measured_ms, y=sub.predicted_ms, mode="markers", name=f"{sched} ({role})",
                        marker={"symbol": symbols.get(role, "circle"), "size": 9}, text=label,
                        hovertemplate="%{text}<br>measured %{x:.1f} ms, predicted %{y:.1f} ms")
    lo = float(min(df.measured_ms.min(), df.predicted_ms.min())) * 0.9
    hi = float(max(df.measured_ms.max(), df.predicted_ms.max())) * 1.1
    fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="predicted = measured", line={"dash": "dot"})
    fig.update_layout(template=TEMPLATE, height=420,
                      title=title or "Step time: the overlap formulas against the engine",
                      xaxis={"title": "measured ms per step"}, yaxis={"title": "predicted ms per step"}, legend=LEGEND)
    return fig


def fig_product_costs(products: dict, title: str = "", rule: dict | None = None) -> go.Figure:
    """What the model's matrix products cost against the rows they run on (``{family: {rows: seconds}}``,
    :func:`ess.studies.real_model.measure.product_costs`), one line per family, ms on a log axis; ``rule`` (the same
    form, :func:`ess.studies.real_model.fit.product_line`) drawn dotted beside each."""
    fig = go.Figure()
    for i, (fam, curve) in enumerate(products.items()):
        rows = sorted(curve)
        color = COLORS[i % len(COLORS)]
        fig.add_scatter(x=rows, y=[curve[m] * 1e3 for m in rows], mode="lines+markers", name=f"{fam}, measured",
                        line={"color": color}, hovertemplate=fam + ", %{x} rows: %{y:.3f} ms")
        if rule and fam in rule:
            r = sorted(rule[fam])
            fig.add_scatter(x=r, y=[rule[fam][m] * 1e3 for m in r], mode="lines", name=f"{fam}, rule",
                            line={"color": color, "dash": "dot"}, hovertemplate=fam + " rule, %{x} rows: %{y:.3f} ms")
    fig.update_layout(template=TEMPLATE, height=360,
                      title=title or "The model's matrix products against the rows they run on",
                      xaxis={"title": "rows (requests)", "dtick": 1}, yaxis={"title": "ms per call", "type": "log"},
                      legend=LEGEND)
    return fig
