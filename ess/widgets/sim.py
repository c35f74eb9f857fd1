"""The memory-budget simulator widget: GPU, ratio, context, MTP, accept ratio, link bandwidth and where the misses
come from -> batch, throughput, OTPS and stall. :func:`sim_budget_view` is the pure function of a simulator
:class:`ess.sim.Scenario`; :func:`sim_budget_widget` wraps it. Cache-simulated misses come from an
:class:`ess.sim.misses.MissesTable` over the widget's grid of ratios, a (context, MTP) row at a time."""
from __future__ import annotations

import dataclasses

import numpy as np

from ..memory import largest_batch
from ..sim.config import Scenario
from ..sim.misses import MissesTable
from ..sim.timeline import simulate
from ..specs import gpu_spec, link_figures, list_gpus
from ..viz import fig_message
from ..viz.sim import fig_batch_sweep
from ._controls import LABEL, num, redraw

__all__ = ["sim_budget_view", "sim_budget_widget", "link_choices", "MISSES_SOURCES", "CONTEXTS", "RATIOS"]

CONTEXTS = [8192, 16384, 32768, 65536, 131072]
RATIOS = [round(0.05 * i, 2) for i in range(1, 21)]           # the ratio slider's stops, 0.05 .. 1
MISSES_SOURCES = {"cachesim": "cache simulation", "zero": "none (a perfect cache: the bound)"}
# what-if link speeds between the sourced ones (GB/s); every one below the host's DRAM share of a GPU
_WHAT_IF_GB_PER_S = (1.0, 2.0, 5.0, 20.0, 50.0)
_SOURCED_LINKS = {("flashtrans", "memcpy_per_entry_h2d_GB_per_s"): "one cudaMemcpyAsync per entry",
                  ("pcie", "gen4_measured_a100_bidir_each_GB_per_s"): "PCIe 4 measured, both directions at once",
                  ("pcie", "gen4_measured_a100_h2d_GB_per_s"): "PCIe 4 measured on A100",
                  ("pcie", "gen4_x16_GB_per_s_per_direction"): "PCIe 4 x16 theoretical",
                  ("flashtrans", "h2d_GB_per_s"): "FlashTrans",
                  ("pcie", "gen5_x16_GB_per_s_per_direction"): "PCIe 5 x16 theoretical"}


def link_choices() -> dict[float, str]:
    """The H2D link speeds the widget offers, ``{GB/s: what it is}``: the sourced figures of
    ``data/hardware/links.yaml`` (named, with their source) and a few what-if values between them, ascending."""
    figs = link_figures()
    out = {float(v): "a what-if value" for v in _WHAT_IF_GB_PER_S}
    for (group, key), name in _SOURCED_LINKS.items():
        out[float(figs[group][key])] = f"{name} (data/hardware/links.yaml {group}.{key})"
    return dict(sorted(out.items()))


def _infeasible(reason: str) -> tuple:
    return fig_message(f"infeasible: {reason}"), {"batch": 0, "throughput": None, "otps": None, "stall_ms": None,
                                                  "reason": reason, "misses_mean": None}


def _calibrated_scenario() -> Scenario:
    return Scenario()                           # the default scenario predicts with the central calibration


def sim_budget_view(scenario: Scenario | None = None, ratio: float = 0.2, context_len: int = 32768, *,
                    hbm_GiB: float | None = None, misses="zero", table: MissesTable | None = None) -> tuple:
    """Largest batch for the GPU's memory at this ratio and context (:func:`ess.memory.largest_batch` at the
    scenario's MTP), and the simulated step of ``scenario`` at every batch up to it: (figure of throughput and OTPS
    against batch, summary dict). ``scenario`` (an :class:`ess.sim.Scenario`, default the project's with the
    calibrated cost parameters) gives the GPU, MTP, accept ratio (in [1, mtp]), link and cost parameters;
    ``hbm_GiB`` replaces the GPU's memory capacity (the rest of the GPU unchanged). ``misses``: ``"zero"`` (a
    perfect cache: only the write-back of new tokens costs link time), ``"cachesim"`` (from ``table``, a
    :class:`~ess.sim.misses.MissesTable`, at this context, ratio and MTP) or an array (n_layers,). An infeasible
    setting gives a message figure whose title starts with "infeasible:"."""
    sc = (_calibrated_scenario() if scenario is None else scenario).resolved()
    model, dep, gpu_, host = sc.specs()
    mtp, accept_ratio, h2d_GB_per_s = sc.mtp, sc.accept_ratio, sc.h2d_GB_per_s
    if not 1.0 <= accept_ratio <= mtp:
        raise ValueError(f"accept_ratio must lie in [1, mtp = {mtp}] (accepted tokens per step), got {accept_ratio}")
    if hbm_GiB is not None:
        gpu_ = dataclasses.replace(gpu_, hbm_capacity_GiB=float(hbm_GiB))
        sc = sc.replace(gpu=gpu_)
    try:
        lim = largest_batch(context_len, ratio, mtp=mtp, model=model, deployment=dep, gpu=gpu_, host=host)
    except ValueError as exc:                   # weights do not fit
        return _infeasible(str(exc))
    if lim.batch == 0:
        return _infeasible(lim.reason)
    if isinstance(misses, str):
        if misses not in MISSES_SOURCES:
            raise ValueError(f"misses must be one of {sorted(MISSES_SOURCES)} or an array, got {misses!r}")
        if misses == "cachesim":
            if not isinstance(table, MissesTable):
                raise TypeError("misses='cachesim' needs table=, an ess.sim.misses.MissesTable")
            try:
                mis = table(context_len, ratio, mtp)
            except ValueError as exc:               # the pool cannot hold what one step selects
                return _infeasible(f"the cache simulation cannot run this pool: {exc}")
        else:
            mis = np.zeros(model.n_sparse_layers)
    else:
        mis = np.asarray(misses, dtype=float)
    B = np.arange(1, lim.batch + 1)
    r = simulate(B, context_len, ratio, misses=mis, scenario=sc)
    fig = fig_batch_sweep(B, r.throughput, r.otps,
                          title=f"{gpu_.name}: {context_len // 1024}K, ratio {ratio:g}, MTP {mtp} (accept "
                                f"{accept_ratio:g}), {h2d_GB_per_s:g} GB/s, {float(mis.mean()):.0f} misses per layer "
                                f"-> batch {lim.batch}")
    summary = {"batch": lim.batch, "limited_by": lim.limited_by, "throughput": float(r.throughput[-1]),
               "otps": float(r.otps[-1]), "step_ms": float(r.step_s[-1] * 1e3),
               "stall_ms": float(r.stall_s[-1] * 1e3), "reason": "", "misses_mean": float(mis.mean())}
    return fig, summary


def sim_budget_widget(scenario: Scenario | None = None, misses: MissesTable | None = None):
    """Controls for :func:`sim_budget_view` (needs a running kernel). They start at ``scenario``'s GPU, MTP, accept
    ratio and link (default the project's scenario with the calibrated cost parameters: the deployment's, the
    FlashTrans link) and the cache-simulated misses of ``misses`` (a :class:`~ess.sim.misses.MissesTable`, e.g. the
    notebook's, so that the widget agrees with its tables and reuses what it computed; ``None``: the library's
    defaults), over the widget's ratios.

    The accept ratio's slider ends at the MTP count (moving MTP below it lowers it, and the summary says so); the
    H2D slider is disabled where nothing crosses the link host to device (no misses, or ratio 1). A (context, MTP)
    the cache simulation has not met yet is simulated once for every ratio (seconds; the summary says so while it
    runs)."""
    import ipywidgets as W

    if misses is not None and not isinstance(misses, MissesTable):
        raise TypeError(f"misses must be an ess.sim.misses.MissesTable or None, got {type(misses).__name__}")
    table = (MissesTable() if misses is None else misses).with_ratios(RATIOS)
    base = (_calibrated_scenario() if scenario is None else scenario).resolved()
    links = link_choices()
    if base.h2d_GB_per_s not in links:
        raise ValueError(f"the scenario's link ({base.h2d_GB_per_s:g} GB/s) is not one of the widget's: {list(links)}")
    wide = W.Layout(width="auto")
    gpu_w = W.Dropdown(options=list_gpus(), value=base.gpu.name, description="GPU", layout=W.Layout(width="160px"))
    hbm_w = W.FloatSlider(value=base.gpu.hbm_capacity_GiB, min=40, max=288, step=1, readout_format=".0f",
                          description="HBM GiB", style=LABEL)
    ratio_w = W.SelectionSlider(options=[(f"{r:.2f}", r) for r in RATIOS], value=0.2, description="ratio",
                                style=LABEL)
    ctx_w = W.SelectionSlider(options=[(f"{c // 1024}K", c) for c in CONTEXTS], value=32768, description="context",
                              style=LABEL)
    mtp_w = W.IntSlider(value=base.mtp, min=1, max=4, description="MTP", style=LABEL)
    acc_w = W.FloatSlider(value=base.accept_ratio, min=1.0, max=float(base.mtp), step=0.1, description="accept",
                          style=LABEL)
    link_w = W.SelectionSlider(options=[(f"{v:g}", v) for v in links], value=float(base.h2d_GB_per_s),
                               description="H2D GB/s", style=LABEL)
    src_w = W.Dropdown(options=[(f"{MISSES_SOURCES['cachesim']}", "cachesim"), (MISSES_SOURCES["zero"], "zero")],
                       value="cachesim", description="misses", style=LABEL, layout=wide)
    label, note, out = W.HTML(), W.HTML(), W.Output()
    holding = [False]                           # set while one control adjusts another: one redraw, not two
    lowered: list[str] = []

    def update(_=None):
        if holding[0]:
            return
        ratio, ctx, mtp = ratio_w.value, ctx_w.value, mtp_w.value
        src = src_w.value
        quiet_link = src == "zero" or ratio >= 1.0
        link_w.disabled = quiet_link
        notes = list(lowered)
        lowered.clear()
        if mtp == 1:
            notes.append("accept ratio fixed at 1: with MTP 1 each step verifies one token")
        if src == "cachesim" and ratio < 1.0 and not table.has_row(ctx, mtp):
            label.value = (f"simulating the cache at {ctx // 1024}K, MTP {mtp} for every ratio at once "
                           f"({table.describe()}) ...")
        sc = base.replace(gpu=gpu_w.value, mtp=mtp, accept_ratio=acc_w.value, h2d_GB_per_s=link_w.value)
        fig, s = sim_budget_view(sc, ratio, ctx, hbm_GiB=hbm_w.value, misses=src, table=table)
        if ratio >= 1.0:
            notes.append("ratio 1 is no offload: nothing misses and the link speed does not matter")
        elif src == "zero":
            notes.append("no misses: only the write-back of new tokens crosses the link (device to host), so the "
                         "H2D speed does not matter")
        else:
            notes.append(f"misses from the {table.describe()}")
        notes.append(f"H2D {link_w.value:g} GB/s: {links[link_w.value]}")
        if s["throughput"] is None:
            label.value = f"<b>infeasible</b>: {s['reason']}"
        else:
            label.value = (f"<b>batch {s['batch']}</b> ({s['limited_by']}), {s['throughput']:,.0f} tokens/s per node, "
                           f"OTPS {s['otps']:.1f}, step {s['step_ms']:.1f} ms, stall {num(s['stall_ms'])} ms, "
                           f"{s['misses_mean']:.0f} misses per layer and request")
        note.value = "<br>".join(notes)
        box.summary = s
        redraw(out, fig)

    def mtp_changed(change):
        holding[0] = True
        try:
            before = acc_w.value
            acc_w.max = float(change["new"])         # the slider clamps a value above its new maximum
            acc_w.disabled = change["new"] == 1
            if acc_w.value != before:
                lowered.append(f"accept ratio lowered from {before:g} to {acc_w.value:g}: at most MTP = "
                               f"{change['new']} tokens are accepted per step")
        finally:
            holding[0] = False
        update()

    def gpu_changed(change):
        holding[0] = True
        try:
            hbm_w.value = gpu_spec(change["new"]).hbm_capacity_GiB
        finally:
            holding[0] = False
        update()

    box = W.VBox([W.HBox([gpu_w, hbm_w, ratio_w, ctx_w]), W.HBox([mtp_w, acc_w, link_w]), src_w, label, note, out])
    gpu_w.observe(gpu_changed, names="value")
    mtp_w.observe(mtp_changed, names="value")
    for w in (hbm_w, ratio_w, ctx_w, acc_w, link_w, src_w):
        w.observe(update, names="value")
    box.controls = {"gpu": gpu_w, "hbm_GiB": hbm_w, "ratio": ratio_w, "context_len": ctx_w, "mtp": mtp_w,
                    "accept_ratio": acc_w, "h2d_GB_per_s": link_w, "misses": src_w}
    box.summary_label = label
    box.note = note
    box.table = table
    update()
    return box
