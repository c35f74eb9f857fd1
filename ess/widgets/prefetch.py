"""The prefetch widget (notebook 04): prefetch classes, predictor, pool budget and link bandwidth -> misses and bytes."""
from __future__ import annotations

from functools import lru_cache

import ipywidgets as W

from ..layout import pool_slots
from ..predict import LSTMHeatPredictor
from ..prefetch import PrefetchConfig, simulate_prefetch
from ..specs import model_spec
from ..tracegen import synthetic_trace

__all__ = ["prefetch_view", "prefetch_widget", "PREDICTOR_CHOICES"]

PREDICTOR_CHOICES = ("none", "heat", "lstm")


@lru_cache(maxsize=4)
def _trace(context_len: int, n_layers: int, steps: int, seed: int):
    return synthetic_trace(context_len, n_layers=n_layers, mtp=2, steps=steps, batch=1, seed=seed)


@lru_cache(maxsize=4)
def _lstm(context_len: int, n_layers: int, steps: int, seed: int) -> LSTMHeatPredictor:
    # trained on a trace generated with another seed (never on the trace it is evaluated on)
    train = _trace(context_len, n_layers, steps, seed + 1000)
    seqs = [train.indices[0, l] for l in range(train.n_layers)]
    return LSTMHeatPredictor(history=8, hidden=16, seed=seed).fit(seqs, epochs=4, max_samples=20_000)


def prefetch_view(speculative: bool = True, delayed: bool = True, predictor: str = "heat", ratio: float = 0.2,
                  link_GB_per_s: float = 37.0, *, eviction: str = "lru", context_len: int = 32768, n_layers: int = 4,
                  steps: int = 24, step_time_us: float = 23.1, seed: int = 0) -> tuple:
    """Simulate the prefetch classes on a synthetic trace (K 2048, MTP 2, paper locality, ``n_layers`` layers spread over the
    model's depth, one request) and return ``(figure, summary)``. With ``delayed`` the warmup windows go through
    the delayed class; otherwise they are applied before decoding (the paper's LRU-Warmup)."""
    if predictor not in PREDICTOR_CHOICES:
        raise ValueError(f"predictor must be one of {PREDICTOR_CHOICES}, got {predictor!r}")
    from ..viz.prefetch import fig_prefetch_steps

    trace = _trace(context_len, n_layers, steps, seed)
    cap = pool_slots(model_spec(), ratio, context_len, need=trace.width)
    spec = bool(speculative) and predictor != "none"
    cfg = PrefetchConfig(cap, link_GB_per_s=link_GB_per_s, step_time_us=step_time_us, speculative=spec,
                         delayed=bool(delayed), predictor=predictor, eviction=eviction,
                         warmup_mode="delayed" if delayed else "before")
    lstm = _lstm(context_len, n_layers, steps, seed) if predictor == "lstm" else None
    res = simulate_prefetch(trace, cfg, predictor=lstm)
    s = res.summary()
    s["speculative_on"] = spec
    s["capacity"] = cap
    fig = fig_prefetch_steps(res.misses_per_step / res.pools, res.stall_per_step_s / res.pools,
                             title=f"ratio {ratio:g}, {link_GB_per_s:g} GB/s, predictor {predictor}: hit rate "
                                   f"{s['hit_rate']:.3f}, stall {s['stall_s'] * 1e3:.2f} ms, link use "
                                   f"{s['link_use']:.2f}")
    return fig, s


def prefetch_widget(*, context_len: int = 32768, n_layers: int = 4, steps: int = 24, **defaults) -> W.VBox:
    """Check boxes (speculative, delayed), predictor, ratio and bandwidth -> :func:`prefetch_view` (trace size from
    ``context_len``, ``n_layers``, ``steps``; starting values of the controls from ``defaults``)."""
    v = dict(speculative=True, delayed=True, predictor="heat", ratio=0.2, link_GB_per_s=37.0)
    unknown = set(defaults) - set(v)
    if unknown:
        raise ValueError(f"unknown control(s) {sorted(unknown)}; expected some of {sorted(v)}")
    v.update(defaults)
    spec_w = W.Checkbox(value=v["speculative"], description="speculative class")
    del_w = W.Checkbox(value=v["delayed"], description="delayed class (warmup in background)")
    pred_w = W.Dropdown(options=list(PREDICTOR_CHOICES), value=v["predictor"], description="predictor")
    ratio_w = W.FloatSlider(value=v["ratio"], min=0.15, max=0.9, step=0.05, description="pool ratio")
    bw_w = W.FloatSlider(value=v["link_GB_per_s"], min=1.0, max=64.0, step=1.0, description="link GB/s")
    label = W.HTML()
    out = W.Output()

    def update(_=None):
        fig, s = prefetch_view(spec_w.value, del_w.value, pred_w.value, ratio_w.value, bw_w.value,
                               context_len=context_len, n_layers=n_layers, steps=steps)
        label.value = (f"hit rate <b>{s['hit_rate']:.3f}</b>, stall {s['stall_s'] * 1e3:.2f} ms, moved "
                       f"{s['bytes_moved'] / 1e6:.1f} MB (speculative {s['bytes_speculative'] / 1e6:.1f}, delayed "
                       f"{s['bytes_delayed'] / 1e6:.1f}), prefetched never used "
                       f"{s['bytes_prefetched_unused'] / 1e6:.1f} MB, link use {s['link_use']:.2f}")
        box.summary = s
        out.clear_output(wait=True)
        with out:
            fig.show()

    box = W.VBox([W.HBox([spec_w, del_w, pred_w]), W.HBox([ratio_w, bw_w]), label, out])
    box.summary_label = label
    box.controls = {"speculative": spec_w, "delayed": del_w, "predictor": pred_w, "ratio": ratio_w,
                    "link_GB_per_s": bw_w}
    for w in box.controls.values():
        w.observe(update, names="value")
    update()
    return box
