"""The beyond-the-paper widget (notebook 10): model, GPU, host link, context, MTP and ratio (or the best one) ->
throughput per GPU against batch with and without offload, the gain and what binds. :func:`grid_view` is the pure
function (:func:`ess.sim.grid.cell_view`, one vectorised simulate call); :func:`grid_widget` wraps it. Every miss
count it reads is computed before it is shown (:func:`prepare_tables`), so that a move redraws from the simulator
alone."""
from __future__ import annotations

from ..sim import grid as sgrid
from ..sim.misses import MissesTable
from ..specs import gpu_spec, host_link_spec, list_host_links, model_spec, reference_link
from ..viz.grid import context_label, fig_cell
from ._controls import LABEL, redraw

__all__ = ["RATIOS", "MTPS", "grid_view", "grid_widget", "prepare_tables", "widget_contexts", "widget_links"]

#: the ratio control's stops besides "best" (each one's misses are computed up front)
RATIOS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8)
#: the MTP settings with a sourced accept ratio (:func:`ess.sim.grid.accept_ratio_for`)
MTPS = (1, 2, 4)
#: the cache-simulation sizes of the widget's tables at the MTPs other than the deployment's (notebook 10's
#: ``widget_cachesim_steps`` / ``widget_cachesim_batch``; the stored tables of ``data/generated`` are at these)
TABLE_STEPS, TABLE_BATCH = 16, 1


def widget_contexts(model: str, contexts) -> list:
    """The contexts of ``contexts`` the model reaches."""
    top = model_spec(model).max_position_embeddings
    return [int(L) for L in contexts if int(L) <= top]


def widget_links(gpu: str) -> list:
    """The host links that serve ``gpu`` (:meth:`ess.specs.HostLinkSpec.serves`)."""
    g = gpu_spec(gpu)
    return [n for n in list_host_links() if host_link_spec(n).serves(g)]


def prepare_tables(inputs: "sgrid.GridInputs", models, contexts, *, mtps=MTPS, ratios=RATIOS, steps: int | None = None,
                   batch: int | None = None, n_ratios: int = 8) -> dict:
    """The miss tables the widget reads, ``{(model, mtp): MissesTable}``, every point it can show computed now: at
    the deployment's MTP the grid's own central table (``inputs.table``), at the other MTPs a central table of
    ``steps`` x ``batch`` (default the grid's sizes), each for every context the model reaches, at the widget's
    ratios and the grid's ratios (:func:`ess.sim.grid.ratio_grid`), one sweep per (model, context, MTP)."""
    from ..specs import DEFAULT_DEPLOYMENT, deployment_spec
    from ..validate import integer, positive_int
    steps = None if steps is None else positive_int("steps", steps)
    batch = None if batch is None else positive_int("batch", batch)
    n_ratios = integer("n_ratios", n_ratios, lo=1, below=sgrid.MAX_RATIOS + 1)
    base_mtp = deployment_spec(DEFAULT_DEPLOYMENT).mtp
    out = {}
    for m in models:
        for T in mtps:
            if T == base_mtp:
                t = inputs.table(m)
            else:
                t = MissesTable(steps=steps or inputs.sizes.steps, batch=batch or inputs.sizes.batch,
                                locality=inputs.localities[0], model=m)
                if inputs.store:                         # the rows kept for these settings
                    from ..sim.store import seed_table
                    seed_table(t)
            before = t.n_points
            for L in widget_contexts(m, contexts):
                t.prefetch((L, r, T) for r in (*ratios, *sgrid.ratio_grid(m, L, T, n_ratios)))
            if inputs.store and T != base_mtp and t.n_points > before:
                from ..sim.store import save_table
                save_table(t)
            out[(m, T)] = t
    return out


def grid_view(inputs: "sgrid.GridInputs", model: str, gpu: str, link: str, context_len: int, mtp: int = 2,
              ratio="best", *, tables: dict | None = None, n_ratios: int = 8) -> tuple:
    """One cell at one MTP and ratio: ``(figure, summary)`` -- the figure of :func:`ess.viz.grid.fig_cell` and a
    dict with the best batch and ratio with and without offload, the throughputs per GPU, the gain, what binds,
    the mean misses per layer and a ``reason`` where nothing with offload fits. ``n_ratios``: the size of the ratio
    grid "best" searches (:func:`ess.sim.grid.ratio_grid`; the one :func:`prepare_tables` computed)."""
    if link not in widget_links(gpu):
        raise ValueError(f"link {link!r} does not serve {gpu}; it takes {widget_links(gpu)}")
    view = sgrid.cell_view(inputs, model, gpu, link, context_len, mtp, ratio, tables=tables, n_ratios=n_ratios)
    summary = {"ratio": view.ratio, "batch": view.best_batch, "throughput": view.best_throughput,
               "batch_no_offload": view.batch_no_offload, "throughput_no_offload": view.best_no_offload,
               "gain_pct": view.gain_pct, "limit": view.limit, "limit_no_offload": view.limit_no_offload,
               "misses_per_layer": view.misses_per_layer, "reason": view.reason,
               "accept_ratio": view.accept_ratio}
    return fig_cell(view), summary


def summary_text(s: dict) -> str:
    """The summary line the widget shows (and the browser test reads)."""
    if s["throughput"] is None:
        return f"<b>infeasible</b>: {s['reason']}"
    base = (f"without offload batch {s['batch_no_offload']} ({s['limit_no_offload']}), "
            f"{s['throughput_no_offload']:,.0f} tok/s per GPU" if s["throughput_no_offload"] else
            "nothing fits without offload")
    gain = "n/a" if s["gain_pct"] is None else f"{s['gain_pct']:+.1f} %"
    return (f"<b>offload: ratio {s['ratio']:g}, batch {s['batch']} ({s['limit']})</b>, {s['throughput']:,.0f} tok/s "
            f"per GPU, {s['misses_per_layer']:.0f} misses per layer; {base}; gain {gain}")


def grid_widget(inputs: "sgrid.GridInputs", tables: dict, models, gpus, contexts, *, model: str | None = None,
                gpu: str | None = None, context_len: int | None = None, n_ratios: int = 8):
    """Controls for :func:`grid_view` (needs a running kernel): model, GPU, link (the ones serving the GPU),
    context (the model's), MTP (1, 2, 4) and ratio ("best" or a stop of :data:`RATIOS`); ``tables`` from
    :func:`prepare_tables` (with the same ``n_ratios``), so that no move simulates the cache."""
    import ipywidgets as W

    from ..validate import integer, positive_int
    context_len = None if context_len is None else positive_int("context_len", context_len)
    n_ratios = integer("n_ratios", n_ratios, lo=1, below=sgrid.MAX_RATIOS + 1)

    models, gpus = list(models), list(gpus)
    model = model or models[0]
    gpu = gpu or gpus[0]
    ctxs = widget_contexts(model, contexts)
    model_w = W.Dropdown(options=models, value=model, description="model", style=LABEL)
    gpu_w = W.Dropdown(options=gpus, value=gpu, description="GPU", style=LABEL)
    link_w = W.Dropdown(options=[(n, n) for n in widget_links(gpu)], value=reference_link(gpu), description="link",
                        style=LABEL, layout=W.Layout(width="280px"))
    # a dropdown, not a slider: the contexts offered follow the model, and a slider of one stop (a model that
    # reaches one context of the list) cannot be drawn by the page's slider library (its range would be empty)
    ctx_w = W.Dropdown(options=[(context_label(L), L) for L in ctxs],
                       value=context_len if context_len in ctxs else ctxs[0], description="context", style=LABEL,
                       layout=W.Layout(width="160px"))
    mtp_w = W.SelectionSlider(options=[(str(t), t) for t in MTPS], value=2, description="MTP", style=LABEL)
    ratio_w = W.SelectionSlider(options=[("best", "best")] + [(f"{r:g}", r) for r in RATIOS], value="best",
                                description="ratio", style=LABEL)
    label, note, out = W.HTML(), W.HTML(), W.Output()
    holding = [False]

    def update(_=None):
        if holding[0]:
            return
        fig, s = grid_view(inputs, model_w.value, gpu_w.value, link_w.value, ctx_w.value, mtp_w.value,
                           ratio_w.value, tables=tables, n_ratios=n_ratios)
        label.value = summary_text(s)
        lk = host_link_spec(link_w.value)
        note.value = (f"link: {lk.label}, {lk.h2d_GB_per_s:g} GB/s host to device, {lk.d2h_GB_per_s:g} back; "
                      f"accept ratio {s['accept_ratio']:g} at MTP {mtp_w.value}; misses from "
                      f"{tables[(model_w.value, mtp_w.value)].describe()}")
        box.summary = s
        redraw(out, fig)

    def refill(control, options, fallback):
        """New choices for ``control`` without a redraw of its own: its value kept where it stays a choice."""
        holding[0] = True
        try:
            values = [v for _, v in options]
            keep = control.value if control.value in values else fallback
            control.options = options
            control.value = keep
        finally:
            holding[0] = False
        update()

    def gpu_changed(change):
        refill(link_w, [(n, n) for n in widget_links(change["new"])], reference_link(change["new"]))

    def model_changed(change):
        options = widget_contexts(change["new"], contexts)
        refill(ctx_w, [(context_label(L), L) for L in options], options[-1])

    box = W.VBox([W.HBox([model_w, gpu_w, link_w]), W.HBox([ctx_w, mtp_w, ratio_w]), label, note, out])
    gpu_w.observe(gpu_changed, names="value")
    model_w.observe(model_changed, names="value")
    for w in (link_w, ctx_w, mtp_w, ratio_w):
        w.observe(update, names="value")
    box.controls = {"model": model_w, "gpu": gpu_w, "link": link_w, "context_len": ctx_w, "mtp": mtp_w,
                    "ratio": ratio_w}
    box.summary_label = label
    box.note = note
    update()
    return box
