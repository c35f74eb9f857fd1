"""Data to plotly figures: every function takes data (a DataFrame or arrays produced by ``ess``) and returns a
``plotly.graph_objects.Figure``; nothing here computes a result. One submodule per topic (``memory``, ``storage``,
``attention``, ``prefetch``, ``sim``, ``engine``, ``monitor``, ``grid``), re-exported here."""
import plotly.io as _pio

from . import attention, engine, grid, memory, monitor, prefetch, sim, storage  # noqa: F401
from ._style import fig_message  # noqa: F401
from .attention import fig_attention_cost, fig_indexer_selection, fig_storage_precision  # noqa: F401
from .engine import (fig_engine_breakdown, fig_engine_layers, fig_engine_steps, fig_engine_timeline,  # noqa: F401
                     fig_engine_validation)
from .grid import fig_break_even, fig_cell, fig_gain_heatmap  # noqa: F401
from .memory import fig_batch_limits, fig_batch_vs_context, fig_cache_bytes, fig_gpu_memory  # noqa: F401
from .monitor import fig_monitor  # noqa: F401
from .prefetch import (fig_hit_rate_against_range, fig_locality_profile, fig_misses_per_layer,  # noqa: F401
                       fig_misses_vs_context, fig_policies, fig_prefetch_classes, fig_prefetch_steps, fig_warmup_curve)
from .sim import (fig_batch_sweep, fig_calibration, fig_deployment, fig_overlap_vs_misses, fig_residuals,  # noqa: F401
                  fig_sim_misses_per_layer, fig_step_breakdown, fig_table2)
from .storage import fig_layer_misses, fig_policy_misses, fig_step_traffic, fig_tier_bytes  # noqa: F401


def use_notebook_renderer() -> None:
    """Render figures as self-contained HTML in notebook outputs, so the static book shows them (plotly.js is
    embedded once per notebook; no CDN is needed)."""
    _pio.renderers.default = "notebook"
