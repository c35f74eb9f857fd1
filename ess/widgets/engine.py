"""The real-model widget: sparse-memory ratio, eviction policy, overlap schedule and link bandwidth -> a few decode
steps of the real engine, what they moved and waited for, and whether the output still equals the all-resident
run. :func:`engine_view` is the pure function (it decodes for real); :func:`engine_widget` wraps it."""
from __future__ import annotations

import numpy as np
import torch

from ..policies import ONLINE_POLICIES

__all__ = ["engine_view", "engine_widget", "LINKS_GB_PER_S"]

#: the emulated link speeds the widget offers (GB/s): this CPU's engine moves a few MB per step, so speeds around
#: 0.01-0.1 GB/s make a copy last as long as a layer's compute (what the overlap schedules are about)
LINKS_GB_PER_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def engine_view(engine, pre, ratio: float = 0.25, policy: str = "lru", schedule: str = "da",
                link_GB_per_s: float | None = 0.02, *, steps: int = 4, baseline=None) -> tuple:
    """Decode ``steps`` tokens of the prefilled batch ``pre`` with ``engine`` (:class:`ess.engine.DecodeEngine`)
    at these settings. Returns (figure of misses, bytes, stall and step time per step, summary dict). ``baseline``:
    an all-resident :class:`~ess.engine.DecodeRun` of the same steps (``keep_logits=True``) to compare with
    (``"lossless"`` in the summary: tokens and logits bit for bit the same); ``None``: one is decoded here."""
    from ..viz.engine import fig_engine_steps
    try:
        run = engine.decode(pre, steps, ratio=ratio, policy=policy, schedule=schedule, link_GB_per_s=link_GB_per_s,
                            keep_logits=True)
    except ValueError as exc:                             # e.g. a ratio too small for one step's K entries
        from ..viz import fig_message
        return fig_message(str(exc)), {"reason": str(exc), "step_ms": None}
    if baseline is None:
        baseline = engine.decode(pre, steps, offload=False, keep_logits=True)
    df = run.metrics.to_frame()
    later = df[df.step >= 1] if len(df) > 1 else df
    summary = {"step_ms": float(later.step_s.median() * 1e3), "stall_ms": float(later.stall_s.median() * 1e3),
               "misses_per_step": float(later.misses.mean()), "MB_per_step": float(later.bytes_h2d.mean() / 1e6),
               "link_utilisation": float(later.link_utilisation.mean()),
               "lossless": bool(np.array_equal(run.tokens, baseline.tokens) and torch.equal(run.logits,
                                                                                            baseline.logits)),
               "capacity": run.config["capacity"], "topk": run.config["topk"], "reason": ""}
    link = "unpaced" if link_GB_per_s is None else f"{link_GB_per_s:g} GB/s"
    fig = fig_engine_steps(df, f"ratio {ratio:g} ({run.config['capacity']} slots), {policy}, {schedule}, {link}")
    return fig, summary


def engine_widget(engine, pre, *, steps: int = 4):
    """Controls for :func:`engine_view` (needs a running kernel; each change decodes ``steps`` steps)."""
    import ipywidgets as W

    from ._controls import redraw

    baseline = engine.decode(pre, steps, offload=False, keep_logits=True)
    ratio_w = W.FloatSlider(value=0.25, min=0.05, max=1.0, step=0.05, description="ratio")
    policy_w = W.Dropdown(options=list(ONLINE_POLICIES), value="lru", description="policy")
    schedules = ["none", "da", "dba"] if pre.batch >= 2 else ["none", "da"]
    sched_w = W.Dropdown(options=schedules, value="da", description="schedule")
    # a SelectionSlider shows each value exactly (a log slider would snap 0.02 to 10^-1.7)
    link_w = W.SelectionSlider(options=[(f"{v:g}", v) for v in LINKS_GB_PER_S], value=0.02,
                               description="link GB/s")
    note = W.HTML("" if pre.batch >= 2 else "<i>DBA splits the batch in halves: it needs a batch of 2 or more "
                                             "requests, so it is not offered for this batch of 1.</i>")
    label, out = W.HTML(), W.Output()

    def update(_=None):
        fig, s = engine_view(engine, pre, ratio_w.value, policy_w.value, sched_w.value, link_w.value, steps=steps,
                             baseline=baseline)
        if s["step_ms"] is None:
            label.value = f"<b>not possible</b>: {s['reason']}"
        else:
            label.value = (f"step {s['step_ms']:.0f} ms, stall {s['stall_ms']:.1f} ms, {s['misses_per_step']:.0f} "
                           f"misses ({s['MB_per_step']:.2f} MB) per step, link busy {s['link_utilisation']:.0%}; "
                           f"output {'identical to' if s['lossless'] else '<b>DIFFERENT from</b>'} all-resident")
        redraw(out, fig)

    for w in (ratio_w, policy_w, sched_w, link_w):
        w.observe(update, names="value")
    update()
    box = W.VBox([W.HBox([ratio_w, policy_w]), W.HBox([sched_w, link_w]), label, note, out])
    box.controls = {"ratio": ratio_w, "policy": policy_w, "schedule": sched_w, "link_GB_per_s": link_w}
    box.summary_label = label
    return box
