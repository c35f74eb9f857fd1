"""Figures of the beyond-the-paper grid (notebook 10): the gain of offload over GPU x context for each model with
its band, the break-even link speed against context, and one cell's throughput against batch (the widget's figure).
Data in, plotly figure out."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._style import COLORS, LEGEND_LOW, TEMPLATE, fig_message

__all__ = ["context_label", "fig_gain_heatmap", "fig_gain_vs_context", "fig_break_even", "fig_cell"]


def context_label(L: int) -> str:
    """``8192 -> "8K"``, ``1048576 -> "1M"``."""
    from ..validate import positive_int
    L = positive_int("L", L)
    return f"{L // 1048576}M" if L >= 1048576 and L % 1048576 == 0 else f"{L // 1024}K"


def _pct(x) -> str:
    return "n/a" if x is None or pd.isna(x) else f"{x:+.0f}"


def fig_gain_heatmap(cells: pd.DataFrame, *, paper: tuple | None = None,
                     title: str = "Throughput gain of latent offload over no offload (per GPU, %)") -> go.Figure:
    """One heat map per model of the gain over GPU (rows) x context (columns) of ``cells`` (one row per model, GPU
    and context: :func:`ess.tables.grid.reference_cells`), each cell written with its extrapolation band
    (``gain_pct_low`` / ``_high``) and what binds the offload batch; ``paper`` = ``(model, gpu, context_len)`` marks
    the paper's own configuration with a box. Colours: 0 white, gains red, losses blue."""
    models = list(dict.fromkeys(cells.model))
    gpus = list(dict.fromkeys(cells.gpu))
    ctxs = sorted(cells.context_len.unique())
    lim = float(np.nanmax(np.abs(cells.gain_pct))) if cells.gain_pct.notna().any() else 1.0
    fig = make_subplots(rows=1, cols=len(models), subplot_titles=models, shared_yaxes=True,
                        horizontal_spacing=0.04)
    for j, m in enumerate(models, start=1):
        part = cells[cells.model == m].set_index(["gpu", "context_len"])
        z, text = [], []
        for g in gpus:
            zr, tr = [], []
            for L in ctxs:
                if (g, L) in part.index:
                    r = part.loc[(g, L)]
                    zr.append(r.gain_pct)
                    tr.append(f"{_pct(r.gain_pct)}<br>[{_pct(r.get('gain_pct_low'))}, "
                              f"{_pct(r.get('gain_pct_high'))}]")
                else:
                    zr.append(None)
                    tr.append("")
            z.append(zr)
            text.append(tr)
        fig.add_trace(go.Heatmap(z=z, x=[context_label(L) for L in ctxs], y=gpus, text=text,
                                 texttemplate="%{text}", textfont={"size": 9}, zmid=0, zmin=-lim, zmax=lim,
                                 colorscale="RdBu_r", showscale=j == len(models),
                                 colorbar={"title": "gain %"}, hovertemplate="%{y}, %{x}: %{z:.1f} %<extra></extra>"),
                      row=1, col=j)
        if paper is not None and paper[0] == m and paper[1] in gpus and paper[2] in ctxs:
            x0, y0 = ctxs.index(paper[2]), gpus.index(paper[1])
            fig.add_shape(type="rect", x0=x0 - 0.5, x1=x0 + 0.5, y0=y0 - 0.5, y1=y0 + 0.5,
                          line={"color": "black", "width": 3}, row=1, col=j)
    fig.update_layout(template=TEMPLATE, title=title, height=120 + 48 * len(gpus))
    fig.update_xaxes(title_text="context")
    return fig


def _model_panels(cells: pd.DataFrame):
    """A figure of one panel per model (shared y axis) and the ``(column, gpu, color, rows)`` to draw in it: each
    GPU's cells of that model, sorted by context, one color per GPU across the panels."""
    models = list(dict.fromkeys(cells.model))
    fig = make_subplots(rows=1, cols=len(models), subplot_titles=models, shared_yaxes=True,
                        horizontal_spacing=0.04)
    panels = [(j, g, COLORS[i % len(COLORS)],
               cells[(cells.model == m) & (cells.gpu == g)].sort_values("context_len"))
              for i, g in enumerate(dict.fromkeys(cells.gpu)) for j, m in enumerate(models, start=1)]
    return fig, panels


def fig_gain_vs_context(cells: pd.DataFrame, *,
                        title: str = "Gain of offload against context, with the extrapolation band") -> go.Figure:
    """The gain (%) against context, one line per GPU and one panel per model, the extrapolation band
    (``gain_pct_low`` / ``_high``) shaded around each line and the calibration band (``gain_pct_cal_low`` /
    ``_high``) as error bars."""
    from ._style import add_band
    fig, panels = _model_panels(cells)
    for j, g, color, part in panels:
        x = np.log2(part.context_len.to_numpy(dtype=float))
        if "gain_pct_low" in part:
            before = len(fig.data)
            add_band(fig, x, part.gain_pct_low, part.gain_pct_high, name=f"{g} (extrapolation band)",
                     color=color, group=g)
            for tr in fig.data[before:]:
                tr.update(xaxis=f"x{'' if j == 1 else j}", yaxis=f"y{'' if j == 1 else j}")
        err = None
        if "gain_pct_cal_low" in part:
            err = {"type": "data", "symmetric": False, "array": part.gain_pct_cal_high - part.gain_pct,
                   "arrayminus": part.gain_pct - part.gain_pct_cal_low, "color": color, "thickness": 1}
        fig.add_scatter(x=x, y=part.gain_pct, mode="lines+markers", name=g, legendgroup=g,
                        showlegend=j == 1, line={"color": color}, error_y=err, row=1, col=j)
    ticks = sorted(cells.context_len.unique())
    fig.update_xaxes(tickvals=np.log2(np.array(ticks, dtype=float)), ticktext=[context_label(L) for L in ticks],
                     title_text="context")
    fig.add_hline(y=0, line={"color": "grey", "width": 1})
    fig.update_yaxes(title_text="gain over no offload, %", row=1, col=1)
    fig.update_layout(template=TEMPLATE, title=title, legend=LEGEND_LOW, height=440)
    return fig


def fig_break_even(cells: pd.DataFrame, *, links: dict | None = None, span: tuple = (0.5, 5000.0),
                   title: str = "Link speed below which offload stops paying") -> go.Figure:
    """The break-even host-to-device speed (``break_even_GB_per_s``) against context, one line per GPU, one panel
    per model (log scale); a cell where offload pays even at the span's lower end is drawn there, one where it
    never pays is left out. ``links`` (``{label: GB/s}``) are drawn as dotted reference lines."""
    fig, panels = _model_panels(cells)
    models = list(dict.fromkeys(cells.model))
    for j, g, color, part in panels:
        fig.add_scatter(x=[context_label(L) for L in part.context_len], y=part.break_even_GB_per_s,
                        mode="lines+markers", name=g, legendgroup=g, showlegend=j == 1, line={"color": color},
                        row=1, col=j)
    for label, v in (links or {}).items():
        for j in range(1, len(models) + 1):
            fig.add_hline(y=v, line={"dash": "dot", "color": "grey", "width": 1}, row=1, col=j,
                          annotation_text=label if j == len(models) else None, annotation_font_size=9)
    fig.update_yaxes(type="log", range=[np.log10(span[0]) - 0.1, np.log10(span[1])], row=1, col=1,
                     title_text="host-to-device GB/s")
    fig.update_xaxes(title_text="context")
    fig.update_layout(template=TEMPLATE, title=title, legend=LEGEND_LOW, height=420)
    return fig


def fig_cell(view) -> go.Figure:
    """One cell of the grid at one MTP and ratio (:class:`ess.sim.grid.CellView`): throughput per GPU against
    batch without offload and with offload at the view's ratio, the best point of each marked; a message figure
    (title starting "infeasible:") where the view has a reason and no offload curve."""
    head = (f"{view.model} on {view.gpu}, {view.link}, {context_label(view.context_len)}, MTP {view.mtp} "
            f"(accept {view.accept_ratio:g})")
    if view.reason and not len(view.batches):
        return fig_message(f"infeasible: {view.reason} ({head})")
    fig = go.Figure()
    if len(view.batches_no_offload):
        fig.add_scatter(x=view.batches_no_offload, y=view.throughput_no_offload, mode="lines", name="no offload",
                        line={"color": COLORS[0]})
    fig.add_scatter(x=view.batches, y=view.throughput, mode="lines", name=f"offload, ratio {view.ratio:g}",
                    line={"color": COLORS[1]})
    if view.batch_no_offload is not None:
        fig.add_scatter(x=[view.batch_no_offload], y=[view.best_no_offload], mode="markers",
                        name=f"best without offload: batch {view.batch_no_offload} ({view.limit_no_offload})",
                        marker={"color": COLORS[0], "size": 10})
    fig.add_scatter(x=[view.best_batch], y=[view.best_throughput], mode="markers",
                    name=f"best with offload: batch {view.best_batch} ({view.limit})",
                    marker={"color": COLORS[1], "size": 10, "symbol": "diamond"})
    gain = view.gain_pct
    fig.update_layout(template=TEMPLATE, title=f"{head}: {'n/a' if gain is None else f'{gain:+.1f} %'}",
                      xaxis={"title": "batch per GPU"}, yaxis={"title": "tokens/s per GPU"}, legend=LEGEND_LOW,
                      height=420)
    return fig
