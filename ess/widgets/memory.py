"""The memory-budget widget (notebook 01)."""
from __future__ import annotations

import ipywidgets as W

from ..layout import request_cache
from ..memory import GiB, largest_batch
from ..specs import DEFAULT_DEPLOYMENT, DEFAULT_MODEL, list_gpus, resolve
from ..viz.memory import fig_gpu_memory
from ._controls import LABEL, redraw

__all__ = ["memory_budget_view", "memory_budget_widget"]

CONTEXTS = [4096, 8192, 16384, 32768, 65536, 131072]


def memory_budget_view(gpu: str = "H200", context_len: int = 32768, ratio: float = 0.2, *,
                       deployment: str = DEFAULT_DEPLOYMENT) -> tuple:
    """Where one GPU's memory goes for a context length and ratio: a stacked bar and a summary dict."""
    model, dep, gpu_, host = resolve(DEFAULT_MODEL, deployment, gpu, None)
    lim = largest_batch(context_len, ratio, model=model, deployment=dep, gpu=gpu_)
    base = largest_batch(context_len, 1.0, model=model, deployment=dep, gpu=gpu_)
    rc = request_cache(model, context_len, ratio, dep.kv_dtype)
    hbm = gpu_.hbm_capacity_GiB * GiB / 1e9
    weights = hbm * dep.mem_fraction_static - lim.kv_budget_bytes / 1e9
    parts = {"weights": weights, "indexer cache": lim.batch * rc.indexer_bytes / 1e9,
             "latent pool (GPU)": lim.batch * rc.latent_gpu_bytes / 1e9,
             "runtime reserve": hbm * (1 - dep.mem_fraction_static)}
    parts["free"] = max(hbm - sum(parts.values()), 0.0)
    fig = fig_gpu_memory(parts, gpu, title=f"{gpu}: L = {context_len // 1024}K, ratio {ratio:g} -> batch "
                                          f"{lim.batch} (no offload: {base.batch})")
    summary = {"batch": lim.batch, "batch_no_offload": base.batch, "limited_by": lim.limited_by,
               "host_GB_per_gpu": lim.batch * rc.latent_host_bytes / 1e9, "reason": lim.reason}
    return fig, summary


def memory_budget_widget(gpu: str = "H200", context_len: int = 32768, ratio: float = 0.2) -> W.VBox:
    """Dropdown (GPU), context and ratio sliders -> the :func:`memory_budget_view` figure and summary."""
    from ..validate import one_of, positive_int
    one_of("context_len", positive_int("context_len", context_len), CONTEXTS)
    gpu_w = W.Dropdown(options=list_gpus(), value=gpu, description="GPU", style=LABEL)
    ctx_w = W.SelectionSlider(options=[(f"{c // 1024}K", c) for c in CONTEXTS], value=context_len,
                              description="context L", style=LABEL)
    ratio_w = W.FloatSlider(value=ratio, min=0.05, max=1.0, step=0.05, description="ratio", style=LABEL)
    label = W.HTML()
    out = W.Output()

    def update(_=None):
        fig, s = memory_budget_view(gpu_w.value, ctx_w.value, ratio_w.value)
        label.value = (f"<b>batch {s['batch']}</b> per GPU (no offload {s['batch_no_offload']}), bounded by "
                       f"{s['limited_by']}; host memory {s['host_GB_per_gpu']:.0f} GB per GPU"
                       + (f"<br><b>no request fits</b>: {s['reason']}" if s["batch"] == 0 else ""))
        redraw(out, fig)

    for w in (gpu_w, ctx_w, ratio_w):
        w.observe(update, names="value")
    update()
    box = W.VBox([W.HBox([gpu_w, ctx_w, ratio_w]), label, out])
    box.summary_label = label
    box.controls = {"gpu": gpu_w, "context_len": ctx_w, "ratio": ratio_w}
    return box
