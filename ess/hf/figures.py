"""Figures of ``ess.hf`` runs (data in, a plotly figure out)."""
from __future__ import annotations

import numpy as np

__all__ = ["fig_rows_read"]


def fig_rows_read(counters: dict, context_len: int, topk: int, title: str = ""):
    """Per decode step, the cache rows one layer read (hits + misses, the mean over layers and requests) against
    the context it could have read (``context_len`` + step: what a dense-masked implementation reads), with K
    marked. ``counters`` as :meth:`ess.hf.SparseCache.counters` returns them."""
    import plotly.graph_objects as go
    read = (np.asarray(counters["cache_hits"]) + np.asarray(counters["cache_misses"])).mean(axis=(1, 2))
    steps = np.arange(read.size)
    fig = go.Figure([go.Bar(x=steps, y=context_len + steps, name="context L (read by a dense-masked step)"),
                     go.Bar(x=steps, y=read, name="latent rows read through the tiered cache")])
    fig.add_hline(y=topk, line_dash="dot", annotation_text=f"K = {topk}")
    fig.update_layout(barmode="overlay", title=title, xaxis_title="decode step", yaxis_title="rows per layer")
    return fig
