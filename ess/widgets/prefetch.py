"""The prefetch widget (notebook 04): the speculative class and its predictor, where the warmup windows go, the pool
and the link bandwidth -> misses, stall and bytes per class."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..layout import pool_slots
from ..heat_predictor import LSTMHeatPredictor
from ..prefetch import PrefetchConfig, simulate_prefetch
from ..specs import model_spec
from ..tracegen import Workload, synthetic_trace
from ._controls import LABEL, num, redraw

__all__ = ["prefetch_view", "prefetch_widget", "SPECULATIVE_CHOICES", "WARMUP_CHOICES"]

SPECULATIVE_CHOICES = {"off": "off", "heat": "heat predictor", "lstm": "LSTM predictor"}
WARMUP_CHOICES = {"before": "before decoding (LRU-Warmup, in prefill)", "delayed": "delayed class (while decoding)",
                  "none": "not loaded"}


@lru_cache(maxsize=4)
def _trace(context_len: int, n_layers: int, steps: int, seed: int):
    return synthetic_trace(Workload(context_len, n_layers=n_layers, mtp=2, steps=steps, batch=1, seed=seed))


@lru_cache(maxsize=4)
def _lstm(context_len: int, n_layers: int, steps: int, seed: int) -> LSTMHeatPredictor:
    # trained on a trace generated with another seed (never on the trace it is evaluated on)
    train = _trace(context_len, n_layers, steps, seed + 1000)
    seqs = [train.indices[0, l] for l in range(train.n_layers)]
    return LSTMHeatPredictor(history=8, hidden=16, seed=seed).fit(seqs, epochs=4, max_samples=20_000)


@lru_cache(maxsize=512)
def _simulate(capacity: int, link_GB_per_s: float, step_time_us: float, speculative: str, warmup: str,
              eviction: str, trace_key: tuple):
    """One simulation, kept: a setting seen before redraws without simulating again."""
    cfg = PrefetchConfig(capacity, link_GB_per_s=link_GB_per_s, step_time_us=step_time_us,
                         speculative=speculative != "off", delayed=warmup == "delayed",
                         predictor="none" if speculative == "off" else speculative, eviction=eviction,
                         warmup_mode=warmup)
    lstm = _lstm(*trace_key) if speculative == "lstm" else None
    return cfg, simulate_prefetch(_trace(*trace_key), cfg, predictor=lstm)


def prefetch_view(speculative: str = "heat", warmup: str = "before", ratio: float = 0.2, link_GB_per_s: float = 37.0,
                  *, eviction: str = "lru", context_len: int = 32768, n_layers: int = 4, steps: int = 24,
                  step_time_us: float = 23.1, seed: int = 0) -> tuple:
    """Simulate the prefetch classes on a synthetic trace (K 2048, MTP 2, paper locality, ``n_layers`` layers spread
    over the model's depth, one request) and return ``(figure, summary)``.

    ``speculative``: ``"off"``, or the predictor that picks its loads (``"heat"``, ``"lstm"``; the predictor is used
    by nothing else); ``warmup``: the LRU-Warmup windows are loaded ``"before"`` decoding (free: done during prefill,
    as the paper), sent by the ``"delayed"`` class while decoding (link time left over, free slots only), or
    ``"none"``. ``step_time_us`` default: 73.3 ms step / 61 layers / batch 52 (paper Table 2, as
    :class:`ess.prefetch.PrefetchConfig`). The summary adds ``first_step_misses`` and ``first_step_entries`` (all
    pools) and ``explain``, a sentence on what the warmup setting does to the first steps."""
    from ..validate import integer, positive_int
    context_len, n_layers, steps = (positive_int(n, v) for n, v in (("context_len", context_len),
                                                                    ("n_layers", n_layers), ("steps", steps)))
    seed = integer("seed", seed)
    if speculative not in SPECULATIVE_CHOICES:
        raise ValueError(f"speculative must be one of {sorted(SPECULATIVE_CHOICES)}, got {speculative!r}")
    if warmup not in WARMUP_CHOICES:
        raise ValueError(f"warmup must be one of {sorted(WARMUP_CHOICES)}, got {warmup!r}")
    from ..viz.prefetch import fig_prefetch_steps

    key = (int(context_len), int(n_layers), int(steps), int(seed))
    trace = _trace(*key)
    cap = pool_slots(model_spec(), ratio, context_len, need=trace.width)
    cfg, res = _simulate(cap, float(link_GB_per_s), float(step_time_us), speculative, warmup, eviction, key)
    s = res.summary()
    s["capacity"] = cap
    s["first_step_misses"] = int(res.misses_per_step[0])
    s["first_step_entries"] = int((trace.indices[:, :, 0] >= 0).sum())
    s["later_misses_per_step"] = float(np.mean(res.misses_per_step[1:])) if res.steps > 1 else 0.0
    s["explain"] = _explain(warmup, s, cfg.budget_entries, res.pools)
    fig = fig_prefetch_steps(res.misses_per_step / res.pools, res.stall_per_step_s / res.pools,
                             title=f"ratio {ratio:g}, {link_GB_per_s:g} GB/s, speculative {speculative}, warmup "
                                   f"{warmup}: hit rate {s['hit_rate']:.3f}, stall {num(s['stall_s'] * 1e3)} ms, "
                                   f"link use {s['link_use']:.2f}")
    return fig, s


def _explain(warmup: str, s: dict, budget: int, pools: int) -> str:
    first = f"step 0 misses {s['first_step_misses']:,} of the {s['first_step_entries']:,} entries it selects"
    if warmup == "before":
        return (f"{first}: the warmup windows were loaded before decoding (during prefill, not charged to the link "
                f"here), so the first step finds most of its entries resident")
    if warmup == "delayed":
        return (f"{first}: the pool starts empty, because the delayed class sends the warmup windows only while "
                f"decoding, with the link time the step leaves ({budget:,} entries per step and pool, less what the "
                f"speculative class takes), into free slots and at the cold end of the LRU order. Loading them before "
                f"decoding costs no link time here, so that setting has the higher hit rate; later steps miss "
                f"{s['later_misses_per_step'] / pools:,.0f} entries per pool")
    return f"{first}: nothing is warmed up, so the first step loads its whole set"


def prefetch_widget(*, context_len: int = 32768, n_layers: int = 4, steps: int = 24, **defaults):
    """The speculative class (off or its predictor), where the warmup windows go, the pool ratio and the link
    bandwidth -> :func:`prefetch_view` (trace size from ``context_len``, ``n_layers``, ``steps``; starting values of
    the controls from ``defaults``)."""
    import ipywidgets as W
    from ..validate import positive_int
    context_len, n_layers, steps = (positive_int(n, v) for n, v in (("context_len", context_len),
                                                                    ("n_layers", n_layers), ("steps", steps)))
    v = dict(speculative="heat", warmup="before", ratio=0.2, link_GB_per_s=37.0)
    unknown = set(defaults) - set(v)
    if unknown:
        raise ValueError(f"unknown control(s) {sorted(unknown)}; expected some of {sorted(v)}")
    v.update(defaults)
    spec_w = W.Dropdown(options=[(t, k) for k, t in SPECULATIVE_CHOICES.items()], value=v["speculative"],
                        description="speculative class", style=LABEL, layout=W.Layout(width="auto"))
    warm_w = W.Dropdown(options=[(t, k) for k, t in WARMUP_CHOICES.items()], value=v["warmup"],
                        description="warmup windows", style=LABEL, layout=W.Layout(width="auto"))
    ratio_w = W.FloatSlider(value=v["ratio"], min=0.15, max=0.9, step=0.05, description="pool ratio", style=LABEL)
    bw_w = W.FloatSlider(value=v["link_GB_per_s"], min=1.0, max=64.0, step=1.0, description="link GB/s", style=LABEL)
    label, note = W.HTML(), W.HTML()
    out = W.Output()

    def update(_=None):
        fig, s = prefetch_view(spec_w.value, warm_w.value, ratio_w.value, bw_w.value,
                               context_len=context_len, n_layers=n_layers, steps=steps)
        label.value = (f"hit rate <b>{s['hit_rate']:.3f}</b>, stall {num(s['stall_s'] * 1e3)} ms, moved "
                       f"{s['bytes_moved'] / 1e6:.1f} MB (speculative {s['bytes_speculative'] / 1e6:.1f}, delayed "
                       f"{s['bytes_delayed'] / 1e6:.1f}), prefetched never used "
                       f"{s['bytes_prefetched_unused'] / 1e6:.1f} MB, link use {s['link_use']:.2f}")
        note.value = s["explain"]
        box.summary = s
        redraw(out, fig)

    box = W.VBox([W.HBox([spec_w, warm_w]), W.HBox([ratio_w, bw_w]), label, note, out])
    box.summary_label = label
    box.note = note
    box.controls = {"speculative": spec_w, "warmup": warm_w, "ratio": ratio_w, "link_GB_per_s": bw_w}
    for w in box.controls.values():
        w.observe(update, names="value")
    update()
    return box
