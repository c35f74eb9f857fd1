"""Shared look of every figure: one template, one legend style, and the figure that carries only a message."""
import textwrap

import plotly.graph_objects as go

TEMPLATE = "plotly_white"
LEGEND = {"orientation": "h", "y": -0.25}      # one legend style: horizontal, under the plot ...
LEGEND_HIGH = {**LEGEND, "y": -0.2}             # ... closer for a tall figure
LEGEND_LOW = {**LEGEND, "y": -0.3}              # ... lower under long tick labels or a short figure
LEGEND_SHORT = {**LEGEND, "y": -0.5}            # ... below the axis title of a one-bar figure


def fig_message(text: str, *, height: int | None = None, line_chars: int = 90) -> go.Figure:
    """A figure that carries only ``text`` (e.g. why a setting is infeasible): the title, wrapped at ``line_chars``
    characters so that no part is cut off, no axes, and just the height the lines need (``height`` overrides)."""
    lines = textwrap.wrap(str(text), line_chars) or [""]
    top = 30 + 24 * len(lines)
    fig = go.Figure()
    fig.update_layout(title={"text": "<br>".join(lines), "x": 0.01, "xanchor": "left", "y": 1.0, "yanchor": "top",
                             "pad": {"t": 20}},
                      template=TEMPLATE, height=height or top + 20, margin={"t": top, "b": 10, "l": 20, "r": 20},
                      xaxis={"visible": False}, yaxis={"visible": False})
    return fig


# one colour per series, shared by a line and its band (plotly's default sequence)
COLORS = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880", "#ff97ff",
          "#fecb52")


def _rgba(color: str, alpha: float) -> str:
    h = color.lstrip("#")
    return f"rgba({int(h[0:2], 16)}, {int(h[2:4], 16)}, {int(h[4:6], 16)}, {alpha})"


def add_band(fig: go.Figure, x, low, high, *, name: str, color: str, group: str | None = None,
             show_legend: bool = False, **trace_kw) -> go.Figure:
    """Draw the band ``[low, high]`` over ``x`` as a shaded area (the same ``color`` as its central line, faded),
    legend entry ``name`` grouped with its line by ``group``; points where either end is missing are skipped.
    ``trace_kw`` go to the trace (e.g. ``secondary_y`` placement is not supported). Returns ``fig``."""
    import numpy as np
    x, low, high = (np.asarray(v, dtype=float) for v in (x, low, high))
    ok = np.isfinite(x) & np.isfinite(low) & np.isfinite(high)
    if not ok.any():
        return fig
    x, low, high = x[ok], low[ok], high[ok]
    fig.add_scatter(x=np.r_[x, x[::-1]], y=np.r_[high, low[::-1]], fill="toself", mode="lines",
                    line={"width": 0}, fillcolor=_rgba(color, 0.2), hoverinfo="skip", name=name,
                    legendgroup=group, showlegend=show_legend, **trace_kw)
    return fig
