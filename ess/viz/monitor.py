"""The monitoring view of a decode (live in a notebook, static in the book): link utilisation, hit rate, stall and
misses per layer, step by step -- the figure of an :class:`ess.monitor.StepSeries` (the rows and their protocol are
:mod:`ess.monitor`'s, the live widget around this figure :mod:`ess.widgets.monitor`'s)."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._style import TEMPLATE

__all__ = ["fig_monitor"]


def fig_monitor(df, misses_by_layer, *, total_steps: int | None = None, layer_labels=None,
                title: str = "") -> go.Figure:
    """Four panels over the decode steps so far: host-to-device link utilisation, hit rate, stall (ms) and misses per
    layer (a heat map). ``df`` one row per step (columns ``step``, ``link_utilisation``, ``hit_rate``,
    ``stall_s``, as :meth:`ess.monitor.StepSeries.frame`), ``misses_by_layer`` (layers, steps); the step axes run
    from the first step to ``total_steps`` steps on, so that a live view fills from the left."""
    from ..validate import positive_int
    total_steps = None if total_steps is None else positive_int("total_steps", total_steps)
    steps = np.asarray(df.step)
    first = int(steps.min()) if steps.size else 1                  # a replay counts from 1, an engine from 0
    last = max(first + int(total_steps or 1) - 1, int(steps.max()) if steps.size else 1)
    fig = make_subplots(rows=2, cols=2, vertical_spacing=0.16, horizontal_spacing=0.1,
                        subplot_titles=("link utilisation, host to device", "hit rate", "stall per step",
                                        "misses per layer"))
    fig.add_scatter(x=steps, y=np.asarray(df.link_utilisation), mode="lines+markers", name="link utilisation",
                    row=1, col=1)
    fig.add_scatter(x=steps, y=np.asarray(df.hit_rate), mode="lines+markers", name="hit rate", row=1, col=2)
    fig.add_bar(x=steps, y=np.asarray(df.stall_s) * 1e3, name="stall (ms)", row=2, col=1)
    m = np.asarray(misses_by_layer)
    labels = list(layer_labels) if layer_labels is not None else [str(i) for i in range(m.shape[0])]
    fig.add_heatmap(x=steps, y=labels, z=m, name="misses", colorscale="Blues", zmin=0,
                    colorbar={"title": "misses", "len": 0.42, "y": 0.2}, row=2, col=2)
    span = [first - 0.5, last + 0.5]
    for row, col in ((1, 1), (1, 2), (2, 1), (2, 2)):
        fig.update_xaxes(range=span, title_text="decode step" if row == 2 else None, row=row, col=col)
    fig.update_yaxes(rangemode="tozero", title_text="busy / step time", row=1, col=1)
    fig.update_yaxes(range=[0, 1.02], title_text="hits / selected", row=1, col=2)
    fig.update_yaxes(rangemode="tozero", title_text="ms", row=2, col=1)
    fig.update_yaxes(type="category", row=2, col=2)
    fig.update_layout(template=TEMPLATE, height=560, title=title or "Decode monitor", showlegend=False)
    return fig
