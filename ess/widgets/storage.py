"""The storage-budget widget (notebook 02): where the bytes live for a GPU, context, ratio and paused requests."""
from __future__ import annotations

import ipywidgets as W

from ..specs import list_gpus
from ..memory import tier_placement
from ..validate import one_of, real
from ..viz import fig_message
from ..viz.storage import fig_tier_bytes
from ._controls import LABEL, redraw

__all__ = ["storage_budget_view", "storage_budget_widget"]

CONTEXTS = [8192, 16384, 32768, 65536, 131072]


def storage_budget_view(gpu: str = "H200", context_len: int = 32768, ratio: float = 0.2, n_spilled: int = 0, *,
                        deployment: str = "paper-table1") -> tuple:
    """The tier figure and a summary dict (batch, slots per request and layer, GB per tier) for one setting.
    An infeasible setting (the pool cannot hold one step's K entries) gives a figure with the reason as title."""
    try:
        df = tier_placement(context_len, ratio, gpu=gpu, deployment=deployment, n_spilled=n_spilled)
    except ValueError as exc:
        return fig_message(f"infeasible: {exc}"), {"feasible": False, "reason": str(exc)}
    gb = df.groupby("tier", sort=False).bytes.sum() / 1e9
    a = df.attrs
    summary = {"feasible": a["batch"] > 0, "batch": a["batch"], "limited_by": a["limited_by"],
               "slots_per_request_layer": a["capacity"], "reason": a["reason"],
               **{f"{t}_GB": float(v) for t, v in gb.items()},
               "latent_pool_GB": float(df[df.part.str.startswith("latent")].query("tier == 'GPU'").bytes.sum() / 1e9),
               "host_latent_GB": float(df[(df.tier == "host") & (df.part == "latent cache (all)")].bytes.sum() / 1e9)}
    return fig_tier_bytes(df), summary


def storage_budget_widget(gpu: str = "H200", context_len: int = 32768, ratio: float = 0.2) -> W.VBox:
    """GPU dropdown, context, ratio and paused-request sliders -> :func:`storage_budget_view`. The starting values
    must be among the controls' choices: a GPU of :func:`ess.specs.list_gpus`, a context of :data:`CONTEXTS`, a
    ratio in [0.05, 1]."""
    one_of("gpu", gpu, list_gpus())
    one_of("context_len", context_len, CONTEXTS)
    ratio = real("ratio", ratio, lo=0.05, hi=1.0)
    gpu_w = W.Dropdown(options=list_gpus(), value=gpu, description="GPU", style=LABEL)
    ctx_w = W.SelectionSlider(options=[(f"{c // 1024}K", c) for c in CONTEXTS], value=context_len,
                              description="context L", style=LABEL)
    ratio_w = W.FloatSlider(value=ratio, min=0.05, max=1.0, step=0.05, description="ratio", style=LABEL)
    spill_w = W.IntSlider(value=0, min=0, max=64, description="paused", style=LABEL)
    label = W.HTML()
    out = W.Output()

    def update(_=None):
        fig, s = storage_budget_view(gpu_w.value, ctx_w.value, ratio_w.value, spill_w.value)
        if s["feasible"]:
            label.value = (f"<b>batch {s['batch']}</b> per GPU (bounded by {s['limited_by']}); "
                           f"{s['slots_per_request_layer']} GPU slots per request and layer; latent pool "
                           f"{s['latent_pool_GB']:.1f} GB on the GPU, {s['host_latent_GB']:.0f} GB in host memory")
        else:
            label.value = f"<b>infeasible</b>: {s['reason']}"
        redraw(out, fig)

    for w in (gpu_w, ctx_w, ratio_w, spill_w):
        w.observe(update, names="value")
    update()
    box = W.VBox([W.HBox([gpu_w, ctx_w]), W.HBox([ratio_w, spill_w]), label, out])
    box.summary_label = label
    box.controls = {"gpu": gpu_w, "context_len": ctx_w, "ratio": ratio_w, "n_spilled": spill_w}
    return box
