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
