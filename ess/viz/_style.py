"""Shared look of every figure: one template, one legend style, and the figure that carries only a message."""
import plotly.graph_objects as go

TEMPLATE = "plotly_white"
LEGEND = {"orientation": "h", "y": -0.25}      # one legend style: horizontal, under the plot ...
LEGEND_HIGH = {**LEGEND, "y": -0.2}             # ... closer for a tall figure
LEGEND_LOW = {**LEGEND, "y": -0.3}              # ... lower under long tick labels or a short figure
LEGEND_SHORT = {**LEGEND, "y": -0.5}            # ... below the axis title of a one-bar figure


def fig_message(text: str, *, height: int = 200) -> go.Figure:
    """An empty figure whose title is ``text`` (e.g. why a setting is infeasible)."""
    fig = go.Figure()
    fig.update_layout(title=text, template=TEMPLATE, height=height)
    return fig
