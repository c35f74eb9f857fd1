"""The memory-budget simulator widget: GPU, ratio, context, MTP, accept ratio and link bandwidth -> batch,
throughput, OTPS and stall. :func:`sim_budget_view` is the pure function; :func:`sim_budget_widget` wraps it."""
from __future__ import annotations

import dataclasses

import numpy as np

from ..memory import largest_batch
from ..sim.costs import CostParams
from ..sim.timeline import simulate
from ..specs import deployment_spec, gpu_spec, link_figures, list_gpus, resolve
from ..viz import fig_message
from ..viz.sim import fig_batch_sweep

__all__ = ["sim_budget_view", "sim_budget_widget"]

CONTEXTS = [8192, 16384, 32768, 65536, 131072]


def sim_budget_view(gpu: str = "H200", ratio: float = 0.2, context_len: int = 32768, mtp: int | None = None,
                    accept_ratio: float | None = None, h2d_GB_per_s: float | None = None, *,
                    hbm_GiB: float | None = None,
                    misses=None, params: CostParams | None = None, deployment: str = "paper-table1") -> tuple:
    """Largest batch for the GPU's memory at this ratio and context, and the simulated step at every batch up to
    it: (figure of throughput and OTPS against batch, summary dict). ``hbm_GiB`` replaces the GPU's memory
    capacity (the rest of the GPU unchanged). ``misses`` (n_layers,) defaults to zeros
    (a perfect cache: only the write-back of new tokens costs link time); ``params`` to the calibrated ones;
    ``mtp`` and ``accept_ratio`` to the deployment's, ``h2d_GB_per_s`` to the FlashTrans link (``links.yaml``)."""
    model, dep, gpu_, host = resolve("deepseek-v3.2-exp", deployment, gpu, None)
    mtp = dep.mtp if mtp is None else mtp
    accept_ratio = dep.mtp_accept_ratio if accept_ratio is None else accept_ratio
    h2d_GB_per_s = link_figures()["flashtrans"]["h2d_GB_per_s"] if h2d_GB_per_s is None else h2d_GB_per_s
    if hbm_GiB is not None:
        gpu_ = dataclasses.replace(gpu_, hbm_capacity_GiB=float(hbm_GiB))
    try:
        lim = largest_batch(context_len, ratio, model=model, deployment=dep, gpu=gpu_)
    except ValueError as exc:                   # weights do not fit
        return fig_message(str(exc)), {"batch": 0, "throughput": None, "otps": None, "stall_ms": None,
                                       "reason": str(exc)}
    if lim.batch == 0:
        return fig_message(lim.reason), {"batch": 0, "throughput": None, "otps": None, "stall_ms": None,
                                         "reason": lim.reason}
    mis = np.zeros(model.n_layers) if misses is None else np.asarray(misses, dtype=float)
    if params is None:
        from ..sim.calibrate import calibrated_params
        params = calibrated_params()
    B = np.arange(1, lim.batch + 1)
    r = simulate(B, context_len, ratio, misses=mis, mtp=mtp, accept_ratio=accept_ratio,
                 h2d_GB_per_s=h2d_GB_per_s, params=params, model=model, deployment=dep, gpu=gpu_)
    fig = fig_batch_sweep(B, r.throughput, r.otps,
                          title=f"{gpu}: {context_len // 1024}K, ratio {ratio:g}, MTP {mtp} (accept {accept_ratio:g}), "
                                f"{h2d_GB_per_s:g} GB/s -> batch {lim.batch}")
    summary = {"batch": lim.batch, "limited_by": lim.limited_by, "throughput": float(r.throughput[-1]),
               "otps": float(r.otps[-1]), "step_ms": float(r.step_s[-1] * 1e3),
               "stall_ms": float(r.stall_s[-1] * 1e3), "reason": ""}
    return fig, summary


def sim_budget_widget(params: CostParams | None = None, misses=None, deployment: str = "paper-table1"):
    """Sliders for :func:`sim_budget_view` (needs a running kernel); they start at the deployment's GPU, MTP and
    accept ratio and the FlashTrans link."""
    import ipywidgets as W

    dep = deployment_spec(deployment)
    gpu_w = W.Dropdown(options=list_gpus(), value=dep.gpu, description="GPU")
    hbm_w = W.FloatSlider(value=gpu_spec(dep.gpu).hbm_capacity_GiB, min=40, max=288, step=1, description="HBM GiB")
    ratio_w = W.FloatSlider(value=0.2, min=0.05, max=1.0, step=0.05, description="ratio")
    ctx_w = W.SelectionSlider(options=[(f"{c // 1024}K", c) for c in CONTEXTS], value=32768, description="context")
    mtp_w = W.IntSlider(value=dep.mtp, min=1, max=4, description="MTP")
    acc_w = W.FloatSlider(value=dep.mtp_accept_ratio, min=1.0, max=4.0, step=0.1, description="accept")
    link_w = W.FloatLogSlider(value=link_figures()["flashtrans"]["h2d_GB_per_s"], base=10, min=0, max=2.5,
                              description="H2D GB/s")
    label, out = W.HTML(), W.Output()

    def update(_=None):
        acc = min(acc_w.value, mtp_w.value)
        fig, s = sim_budget_view(gpu_w.value, ratio_w.value, ctx_w.value, mtp_w.value, acc, link_w.value,
                                 hbm_GiB=hbm_w.value, misses=misses, params=params, deployment=deployment)
        if s["throughput"] is None:
            label.value = f"<b>infeasible</b>: {s['reason']}"
        else:
            label.value = (f"<b>batch {s['batch']}</b> ({s['limited_by']}), {s['throughput']:,.0f} tokens/s per node, "
                           f"OTPS {s['otps']:.1f}, step {s['step_ms']:.1f} ms, stall {s['stall_ms']:.2f} ms")
        out.clear_output(wait=True)
        with out:
            fig.show()

    def gpu_changed(_=None):
        hbm_w.value = gpu_spec(gpu_w.value).hbm_capacity_GiB        # triggers update

    gpu_w.observe(gpu_changed, names="value")
    for w in (hbm_w, ratio_w, ctx_w, mtp_w, acc_w, link_w):
        w.observe(update, names="value")
    update()
    box = W.VBox([W.HBox([gpu_w, hbm_w, ratio_w]), W.HBox([ctx_w, mtp_w, acc_w, link_w]), label, out])
    box.controls = {"gpu": gpu_w, "hbm_GiB": hbm_w, "ratio": ratio_w, "context_len": ctx_w, "mtp": mtp_w,
                    "accept_ratio": acc_w, "h2d_GB_per_s": link_w}
    box.summary_label = label
    return box
