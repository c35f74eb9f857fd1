"""Figures of the memory model (notebook 01)."""
from __future__ import annotations

import plotly.graph_objects as go

from ._style import TEMPLATE as _TEMPLATE, LEGEND, LEGEND_SHORT

__all__ = ["fig_cache_bytes", "fig_batch_limits", "fig_batch_vs_context", "fig_gpu_memory"]


def fig_cache_bytes(df) -> go.Figure:
    """Cache GB per request against context length (from :func:`ess.tables.kv_bytes_by_context`)."""
    fig = go.Figure()
    fp8 = df[df.dtype == "fp8"]
    fig.add_bar(x=fp8.context_len, y=fp8.indexer_bytes / 1e9, name="indexer cache (GPU)")
    fig.add_bar(x=fp8.context_len, y=fp8.latent_bytes / 1e9, name="latent cache, FP8 656 B")
    bf16 = df[df.dtype == "bf16"]
    if len(bf16):
        fig.add_scatter(x=bf16.context_len, y=bf16.total_bytes / 1e9, name="total with BF16 latent",
                        mode="lines+markers", line={"dash": "dash"})
    fig.update_layout(barmode="stack", template=_TEMPLATE, title="Cache per request, all layers",
                      xaxis={"title": "context length L (tokens)", "type": "log", "tickvals": list(fp8.context_len)},
                      yaxis={"title": "GB per request"}, legend=LEGEND)
    return fig


def fig_batch_limits(df, context_len: int) -> go.Figure:
    """Largest batch per GPU preset at one context length, one bar per ratio (from
    :func:`ess.tables.batch_limits_by_gpu`)."""
    from ..validate import positive_int
    context_len = positive_int("context_len", context_len)    # a float would match no row: an empty figure
    sub = df[df.context_len == context_len]
    fig = go.Figure()
    for ratio, part in sub.groupby("ratio", sort=False):
        label = "no offload (ratio 1)" if ratio == 1.0 else f"offload, ratio {ratio:g}"
        fig.add_bar(x=part.gpu, y=part.batch, name=label, text=part.batch, textposition="outside",
                    hovertext=part.limited_by)
    fig.update_layout(barmode="group", template=_TEMPLATE, title=f"Largest batch per GPU at L = {context_len // 1024}K",
                      xaxis={"title": "GPU"}, yaxis={"title": "requests per GPU"}, legend=LEGEND)
    return fig


def fig_batch_vs_context(df, gpu: str, published: dict | None = None) -> go.Figure:
    """Largest batch against context length for one GPU, a line per ratio, both axes logarithmic; ``published`` marks
    ``{label: (context_len, batch)}`` points. A context where a ratio fits no request (batch 0: the pool cannot
    hold one step's K entries, or the weights do not fit) has no point (a log axis has no 0); the legend names
    those contexts. Ticks only at the contexts drawn and at 1-2-5 steps of the batch."""
    sub = df[df.gpu == gpu]
    fig = go.Figure()
    for ratio, part in sub.groupby("ratio", sort=False):
        label = "no offload" if ratio == 1.0 else f"ratio {ratio:g}"
        ok = part[part.batch > 0]
        none = part[part.batch <= 0]
        if len(none):
            label += f" (no request fits at {', '.join(_k(L) for L in none.context_len)})"
        fig.add_scatter(x=ok.context_len, y=ok.batch, mode="lines+markers", name=label,
                        hovertemplate="L = %{x}: batch %{y}")
    for label, (L, b) in (published or {}).items():
        fig.add_scatter(x=[L], y=[b], mode="markers", marker={"symbol": "x", "size": 12, "color": "black"},
                        name=label)
    contexts = sorted(set(sub.context_len) | {L for L, _ in (published or {}).values()})
    batches = [b for b in list(sub.batch) + [b for _, b in (published or {}).values()] if b > 0]
    fig.update_layout(template=_TEMPLATE, title=f"Largest batch per GPU, {gpu}",
                      xaxis={"title": "context length L (tokens)", "type": "log", "tickvals": contexts,
                             "ticktext": [_k(L) for L in contexts], "minor": {"showgrid": False}},
                      yaxis={"title": "requests per GPU", "type": "log", "tickvals": _one_two_five(batches),
                             "minor": {"showgrid": False}},
                      legend=LEGEND)
    return fig


def _k(tokens: int) -> str:
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)


def _one_two_five(values) -> list[int]:
    """1, 2, 5, 10, 20, 50 ... from below the smallest of ``values`` to above the largest."""
    if not values:
        return []
    lo, hi = min(values), max(values)
    out, decade = [], 1
    while decade <= 10 * hi:
        out += [m * decade for m in (1, 2, 5) if lo / 2 <= m * decade <= 2 * hi]
        decade *= 10
    return out


def fig_gpu_memory(parts: dict, gpu: str, *, title: str = "") -> go.Figure:
    """Where one GPU's memory goes: a stacked horizontal bar of ``parts`` ``{name: GB}``."""
    fig = go.Figure()
    for name, gb in parts.items():
        fig.add_bar(y=[gpu], x=[gb], name=name, orientation="h", text=f"{gb:.1f} GB", textposition="inside")
    fig.update_layout(barmode="stack", template=_TEMPLATE, height=260, title=title or f"{gpu}: memory",
                      xaxis={"title": "GB of HBM"}, legend=LEGEND_SHORT)
    return fig
