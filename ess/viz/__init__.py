"""Data to plotly figures: every function takes data (a DataFrame or arrays produced by ``ess``) and returns a
``plotly.graph_objects.Figure``; nothing here computes a result. One submodule per topic; the common names are
re-exported here."""
import plotly.io as _pio

from .memory import fig_batch_limits, fig_batch_vs_context, fig_cache_bytes  # noqa: F401


def use_notebook_renderer() -> None:
    """Render figures as self-contained HTML in notebook outputs, so the static book shows them (plotly.js is
    embedded once per notebook; no CDN is needed)."""
    _pio.renderers.default = "notebook"
