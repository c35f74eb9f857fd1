"""The memory-budget simulator widget: GPU, ratio, context, MTP, accept ratio, link bandwidth and where the misses
come from -> batch, throughput, OTPS and stall. :func:`sim_budget_view` is the pure function;
:func:`sim_budget_widget` wraps it; :class:`CachesimMisses` gives the cache simulation's misses over the widget's
grid, a (context, MTP) row of ratios at a time."""
from __future__ import annotations

import dataclasses

import numpy as np

from ..layout import pool_slots
from ..memory import largest_batch
from ..sim.costs import CostParams
from ..sim.timeline import simulate
from ..specs import deployment_spec, gpu_spec, link_figures, list_gpus, model_spec, resolve
from ..viz import fig_message
from ..viz.sim import fig_batch_sweep
from ._controls import LABEL, num, redraw

__all__ = ["sim_budget_view", "sim_budget_widget", "CachesimMisses", "link_choices", "MISSES_SOURCES",
           "CONTEXTS", "RATIOS"]

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


class CachesimMisses:
    """Mean misses per request, decode step and layer from the cache simulation
    (:func:`ess.cachesim.sweep_synthetic`: synthetic traces of the locality model ``locality``, default
    :func:`ess.tracegen.default_locality`, the pool of each ratio, ``policy`` with or without LRU-Warmup), the same
    numbers as :func:`ess.sim.scenarios.misses_from_cachesim` gives for the same settings. A (context, MTP) row is
    computed for every ratio of ``ratios`` at once (the trace is generated once for all of them) on first use and
    kept; ratio 1 is no offload (no misses). :meth:`from_fn` takes the settings of a ``misses_from_cachesim``
    function."""

    _KEYS = ("steps", "batch", "seed", "warmup", "policy")

    def __init__(self, ratios=RATIOS, *, steps: int = 64, batch: int = 4, seed: int = 0, warmup: bool = True,
                 policy: str = "lru", locality=None):
        from ..tracegen import LocalityModel, default_locality
        locality = default_locality() if locality is None else locality
        if not isinstance(locality, LocalityModel):
            raise TypeError(f"locality must be an ess.tracegen.LocalityModel, got {type(locality).__name__}")
        self.ratios = sorted({round(float(r), 6) for r in ratios})
        self.locality = locality
        self.config = {"steps": int(steps), "batch": int(batch), "seed": int(seed), "warmup": bool(warmup),
                       "policy": policy, **locality.config()}
        self._rows: dict[tuple[int, int], dict[float, object]] = {}

    @classmethod
    def from_fn(cls, misses_fn, ratios=RATIOS) -> "CachesimMisses":
        """The grid for the settings of ``misses_fn`` (a :func:`ess.sim.scenarios.misses_from_cachesim` function)."""
        config = getattr(misses_fn, "config", None)
        if not isinstance(config, dict) or not hasattr(misses_fn, "locality"):
            raise TypeError("misses_fn must be a function of ess.sim.scenarios.misses_from_cachesim (it has .config "
                            "and .locality)")
        return cls(ratios, locality=misses_fn.locality, **{k: config[k] for k in cls._KEYS if k in config})

    def describe(self) -> str:
        c = self.config
        return (f"cache simulation ({c['policy'].upper()}{' + warmup' if c['warmup'] else ''}, "
                f"{c['locality']} locality model {self.locality.label}, {c['steps']} steps x {c['batch']} requests, "
                f"seed {c['seed']})")

    def has_row(self, context_len: int, mtp: int) -> bool:
        return (int(context_len), int(mtp)) in self._rows

    def row(self, context_len: int, mtp: int, extra=()) -> dict:
        """``{ratio: misses (n_layers,) or the reason it cannot be simulated}`` for every ratio of the grid (and
        ``extra``), computed once per (context, MTP) and kept."""
        from ..cachesim import sweep_synthetic

        key = (int(context_len), int(mtp))
        row = self._rows.setdefault(key, {})
        todo = sorted({round(float(r), 6) for r in (*self.ratios, *extra)} - set(row))
        n_layers = model_spec().n_layers
        for r in [r for r in todo if r >= 1.0]:
            row[r] = np.zeros(n_layers)                          # no offload: nothing misses
        todo = [r for r in todo if r < 1.0]
        for r in list(todo):                                      # pools that cannot hold K entries (no trace needed)
            try:
                pool_slots(model_spec(), r, key[0], need=model_spec().index_topk)
            except ValueError as exc:
                row[r] = str(exc)
                todo.remove(r)
        c = self.config
        while todo:
            # a pool too small for what the layers' steps select together fails the sweep (the smallest ratio first:
            # misses cannot fit a smaller pool if a larger one fails), so the smallest is set apart and the rest tried
            try:
                res = sweep_synthetic(key[0], todo, policies=[c["policy"]], warmups=[c["warmup"]], mtp=key[1],
                                      steps=c["steps"], batch=c["batch"], seed=c["seed"], **self.locality.kwargs())
            except ValueError as exc:
                row[todo.pop(0)] = str(exc)
                continue
            for r in todo:
                row[r] = res[(r, c["policy"], c["warmup"])].mean(axis=1)
            todo = []
        return row

    def __call__(self, context_len: int, ratio: float, mtp: int) -> np.ndarray:
        """Misses per layer (n_layers,) at this setting; ``ValueError`` with the reason when the cache simulation
        cannot run it (the pool cannot hold one step's entries)."""
        r = round(float(ratio), 6)
        got = self.row(context_len, mtp, extra=(r,))[r]
        if isinstance(got, str):
            raise ValueError(got)
        return got


def _infeasible(reason: str) -> tuple:
    return fig_message(f"infeasible: {reason}"), {"batch": 0, "throughput": None, "otps": None, "stall_ms": None,
                                                  "reason": reason, "misses_mean": None}


def sim_budget_view(gpu: str = "H200", ratio: float = 0.2, context_len: int = 32768, mtp: int | None = None,
                    accept_ratio: float | None = None, h2d_GB_per_s: float | None = None, *,
                    hbm_GiB: float | None = None, misses="zero", cachesim: CachesimMisses | None = None,
                    params: CostParams | None = None, deployment: str = "paper-table1") -> tuple:
    """Largest batch for the GPU's memory at this ratio and context, and the simulated step at every batch up to
    it: (figure of throughput and OTPS against batch, summary dict). ``hbm_GiB`` replaces the GPU's memory
    capacity (the rest of the GPU unchanged). ``misses``: ``"zero"`` (a perfect cache: only the write-back of new
    tokens costs link time), ``"cachesim"`` (from ``cachesim``, a :class:`CachesimMisses`, at this context, ratio
    and MTP) or an array (n_layers,); ``params`` defaults to the calibrated ones; ``mtp`` and ``accept_ratio`` to
    the deployment's (the accept ratio must lie in [1, mtp]), ``h2d_GB_per_s`` to the FlashTrans link
    (``links.yaml``). An infeasible setting gives a message figure whose title starts with "infeasible:"."""
    model, dep, gpu_, host = resolve("deepseek-v3.2-exp", deployment, gpu, None)
    mtp = dep.mtp if mtp is None else int(mtp)
    accept_ratio = dep.mtp_accept_ratio if accept_ratio is None else float(accept_ratio)
    if not 1.0 <= accept_ratio <= mtp:
        raise ValueError(f"accept_ratio must lie in [1, mtp = {mtp}] (accepted tokens per step), got {accept_ratio}")
    h2d_GB_per_s = link_figures()["flashtrans"]["h2d_GB_per_s"] if h2d_GB_per_s is None else h2d_GB_per_s
    if hbm_GiB is not None:
        gpu_ = dataclasses.replace(gpu_, hbm_capacity_GiB=float(hbm_GiB))
    try:
        lim = largest_batch(context_len, ratio, model=model, deployment=dep, gpu=gpu_)
    except ValueError as exc:                   # weights do not fit
        return _infeasible(str(exc))
    if lim.batch == 0:
        return _infeasible(lim.reason)
    if isinstance(misses, str):
        if misses not in MISSES_SOURCES:
            raise ValueError(f"misses must be one of {sorted(MISSES_SOURCES)} or an array, got {misses!r}")
        if misses == "cachesim":
            if not isinstance(cachesim, CachesimMisses):
                raise TypeError("misses='cachesim' needs cachesim=, a CachesimMisses")
            try:
                mis = cachesim(context_len, ratio, mtp)
            except ValueError as exc:               # the pool cannot hold what one step selects
                return _infeasible(f"the cache simulation cannot run this pool: {exc}")
        else:
            mis = np.zeros(model.n_layers)
    else:
        mis = np.asarray(misses, dtype=float)
    if params is None:
        from ..sim.calibrate import calibrated_params
        params = calibrated_params()
    B = np.arange(1, lim.batch + 1)
    r = simulate(B, context_len, ratio, misses=mis, mtp=mtp, accept_ratio=accept_ratio,
                 h2d_GB_per_s=h2d_GB_per_s, params=params, model=model, deployment=dep, gpu=gpu_)
    fig = fig_batch_sweep(B, r.throughput, r.otps,
                          title=f"{gpu}: {context_len // 1024}K, ratio {ratio:g}, MTP {mtp} (accept {accept_ratio:g}), "
                                f"{h2d_GB_per_s:g} GB/s, {float(mis.mean()):.0f} misses per layer -> batch {lim.batch}")
    summary = {"batch": lim.batch, "limited_by": lim.limited_by, "throughput": float(r.throughput[-1]),
               "otps": float(r.otps[-1]), "step_ms": float(r.step_s[-1] * 1e3),
               "stall_ms": float(r.stall_s[-1] * 1e3), "reason": "", "misses_mean": float(mis.mean())}
    return fig, summary


def sim_budget_widget(params: CostParams | None = None, misses=None, deployment: str = "paper-table1"):
    """Controls for :func:`sim_budget_view` (needs a running kernel). They start at the deployment's GPU, MTP and
    accept ratio, the FlashTrans link and the cache-simulated misses. ``misses``: a
    :func:`ess.sim.scenarios.misses_from_cachesim` function (its trace settings are used, so the widget agrees
    with the notebook's tables) or a :class:`CachesimMisses`; ``None``: the library's defaults.

    The accept ratio's slider ends at the MTP count (moving MTP below it lowers it, and the summary says so); the
    H2D slider is disabled where nothing crosses the link host to device (no misses, or ratio 1). A (context, MTP)
    the cache simulation has not met yet is simulated once for every ratio (seconds; the summary says so while it
    runs)."""
    import ipywidgets as W

    if misses is None:
        cachesim = CachesimMisses()
    elif isinstance(misses, CachesimMisses):
        cachesim = misses
    else:
        cachesim = CachesimMisses.from_fn(misses)
    dep = deployment_spec(deployment)
    links = link_choices()
    flashtrans = float(link_figures()["flashtrans"]["h2d_GB_per_s"])
    wide = W.Layout(width="auto")
    gpu_w = W.Dropdown(options=list_gpus(), value=dep.gpu, description="GPU", layout=W.Layout(width="160px"))
    hbm_w = W.FloatSlider(value=gpu_spec(dep.gpu).hbm_capacity_GiB, min=40, max=288, step=1, readout_format=".0f",
                          description="HBM GiB", style=LABEL)
    ratio_w = W.SelectionSlider(options=[(f"{r:.2f}", r) for r in RATIOS], value=0.2, description="ratio",
                                style=LABEL)
    ctx_w = W.SelectionSlider(options=[(f"{c // 1024}K", c) for c in CONTEXTS], value=32768, description="context",
                              style=LABEL)
    mtp_w = W.IntSlider(value=dep.mtp, min=1, max=4, description="MTP", style=LABEL)
    acc_w = W.FloatSlider(value=dep.mtp_accept_ratio, min=1.0, max=float(dep.mtp), step=0.1, description="accept",
                          style=LABEL)
    link_w = W.SelectionSlider(options=[(f"{v:g}", v) for v in links], value=flashtrans, description="H2D GB/s",
                               style=LABEL)
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
        if src == "cachesim" and ratio < 1.0 and not cachesim.has_row(ctx, mtp):
            label.value = (f"simulating the cache at {ctx // 1024}K, MTP {mtp} for every ratio at once "
                           f"({cachesim.describe()}) ...")
        fig, s = sim_budget_view(gpu_w.value, ratio, ctx, mtp, acc_w.value, link_w.value, hbm_GiB=hbm_w.value,
                                 misses=src, cachesim=cachesim, params=params, deployment=deployment)
        if ratio >= 1.0:
            notes.append("ratio 1 is no offload: nothing misses and the link speed does not matter")
        elif src == "zero":
            notes.append("no misses: only the write-back of new tokens crosses the link (device to host), so the "
                         "H2D speed does not matter")
        else:
            notes.append(f"misses from the {cachesim.describe()}")
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
    box.cachesim = cachesim
    update()
    return box
