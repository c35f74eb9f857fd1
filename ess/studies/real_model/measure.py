"""What the real-model check (:mod:`ess.studies.real_model.check`) measures on the engine: one row per timed
operation of a decode run with what it worked on (:func:`op_samples`; the families of :data:`FAMILIES`), one row
per link job (:func:`link_samples`), the step's breakdown (:func:`measured_breakdown`), the model's matrix products
alone at each row count (:func:`product_costs`), and the configurations decoded interleaved, step by step
(:class:`CheckConfig`, :func:`run_configs`). The costs fitted on these rows are :mod:`ess.studies.real_model.fit`'s.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import validate
from ...engine.config import DecodeConfig

__all__ = ["FAMILIES", "PRODUCTS", "product_costs", "op_samples", "measured_breakdown", "link_samples", "step_lanes",
           "misses_by_layer", "CheckConfig", "run_configs"]


#: family -> the features its time is linear in (besides a constant)
FAMILIES = {
    "pre_attn": ("requests", "products"), "finish": ("requests", "products"),
    "indexer": ("requests", "tokens"), "plan": ("requests", "selected", "misses"),
    "attn": ("requests", "entries"), "merge": ("requests", "selected"), "commit": ("requests", "selected", "misses"),
    "embed": ("requests",), "logits": ("requests", "products"), "write_back": ("requests",),
    "other": ("requests",),
}

#: family -> the weights its matrix products use (names of each layer's weights, or ``"output"``: the head, once)
PRODUCTS = {"pre_attn": ("w_qkv",), "finish": ("wo", "w_gate_up", "w_down"), "logits": "output"}

_SPLIT = {"indexer_b0": ("indexer", 0), "indexer_b1": ("indexer", 1), "plan_b0": ("plan", 0),
          "plan_b1": ("plan", 1), "attn_b0": ("attn", 0), "attn_b1": ("attn", 1), "merge_b0": ("merge", 0),
          "merge_b1": ("merge", 1), "attn_hits": ("attn", None), "attn_misses": ("attn", None)}

_ENTRIES = {"attn_hits": "hits", "attn_misses": "misses"}             # what each attention call gathers


def _trimmed_mean(x, cut: float = 0.1) -> float:
    """Mean of ``x`` without its lowest and highest ``cut`` share, at least one value each side from 5 values on
    (rare long stalls: a shared machine, a garbage collection)."""
    x = np.sort(np.asarray(x, float))
    k = max(1, int(cut * x.size)) if x.size >= 5 else 0
    return float(x[k:x.size - k].mean())


def product_costs(model, rows, *, clock: str = "cpu", repeats: int = 7) -> dict:
    """What the model's matrix products cost at each row count, alone: ``{family: {rows: seconds}}`` for the
    families of :data:`PRODUCTS` -- per layer (the mean over the layers; a layer's products run one after the other,
    every layer in turn, as a decode step runs them) or per step (the output head). ``model`` is the engine's
    :class:`ess.llm.llama.LlamaModel`; each product multiplies random inputs of ``rows`` rows (made before the clock
    starts) by the model's own weights with ``torch.nn.functional.linear``, the call the model makes. The row
    counts take turns, ``repeats`` times; each value is the median of its repeats, on ``clock``
    (:data:`ess.link.CLOCKS`)."""
    import torch
    import torch.nn.functional as F
    from ...link import CLOCKS
    layers, output = getattr(model, "layers", None), getattr(model, "output", None)
    if not isinstance(layers, list) or not layers or not isinstance(output, torch.Tensor):
        raise TypeError(f"model must be a model with per-layer weights and an output head (ess.llm.llama), got "
                        f"{type(model).__name__}")
    rows = _row_counts(rows)
    repeats = validate.positive_int("repeats", repeats)
    tick = CLOCKS[validate.one_of("clock", clock, tuple(CLOCKS))]
    weights = {fam: [[output]] if names == "output" else [[p[n] for n in names] for p in layers]
               for fam, names in PRODUCTS.items()}
    gen = torch.Generator(device="cpu").manual_seed(0)
    times = {fam: {m: [] for m in rows} for fam in PRODUCTS}
    with torch.inference_mode():
        for _ in range(repeats):
            for m in rows:
                for fam, per_layer in weights.items():
                    xs = [[torch.randn(m, 1, w.shape[1], generator=gen).to(device=w.device, dtype=w.dtype)
                           for w in ws] for ws in per_layer]
                    t0 = tick()
                    for ws, x in zip(per_layer, xs):
                        for w, xi in zip(ws, x):
                            F.linear(xi, w)
                    if output.device.type == "cuda":
                        torch.cuda.synchronize(output.device)
                    times[fam][m].append((tick() - t0) / len(per_layer))
    return {fam: {m: float(np.median(v)) for m, v in per.items()} for fam, per in times.items()}


def _row_counts(rows) -> list:
    if isinstance(rows, (str, bytes)) or not hasattr(rows, "__iter__"):
        raise TypeError(f"rows must be a list of row counts, got {rows!r}")
    out = sorted({validate.positive_int(f"rows[{i}]", r) for i, r in enumerate(rows)})
    if not out:
        raise ValueError("rows must hold at least one row count")
    return out


def _halves(B: int) -> tuple[np.ndarray, np.ndarray]:
    half = (B + 1) // 2                                            # as ess.decode.run_layer splits a batch
    return np.arange(half), np.arange(half, B)


def _sizes(run, t: int, layer: int, rows: np.ndarray) -> dict:
    """What an operation over requests ``rows`` of step ``t`` and ``layer`` works on."""
    cfg = run.config
    n_tok = np.asarray(cfg["prompt_lens"])[rows] + t
    sel = float(np.minimum(cfg["topk"], n_tok).sum())
    return {"requests": float(rows.size), "tokens": float(n_tok.sum()),
            "selected": sel, "entries": sel, "hits": float(run.hits[t, layer, rows].sum()),
            "misses": float(run.misses[t, layer, rows].sum())}


def op_samples(run, skip_steps: int = 1):
    """One row per timed operation of a sparse decode run (steps from ``skip_steps`` on): ``family``, ``seconds``
    and the features of :data:`FAMILIES`; per step one ``other`` row (the step's time outside every span)."""
    import pandas as pd
    df = run.timer.to_frame()
    B = run.config["batch"]
    every = np.arange(B)
    halves = _halves(B)
    rows = []
    for (t, layer, op), sec in zip(zip(df.step, df.layer, df.op), df.seconds):
        if t < skip_steps or op.startswith("wait_"):
            continue
        fam, part = _SPLIT.get(op, (op, None))
        if fam not in FAMILIES:
            continue
        who = every if part is None else halves[part]
        size = _sizes(run, t, max(layer, 0), who)
        size["entries"] = size[_ENTRIES.get(op, "selected")]
        rows.append({"step": t, "layer": layer, "family": fam, "seconds": sec, **size})
    spans = df.groupby("step").seconds.sum()
    for t, step_s in enumerate(run.step_times()):
        if t >= skip_steps:
            rows.append({"step": t, "layer": -1, "family": "other", "seconds": step_s - spans.get(t, 0.0),
                         **_sizes(run, t, 0, every)})
    return pd.DataFrame(rows)


def measured_breakdown(run, skip_steps: int = 1) -> dict:
    """Seconds per step of each timed operation of ``run`` (steps from ``skip_steps`` on, summed over the layers;
    a DBA half's ``_b0``/``_b1`` counted with its operation), the largest first, and ``other``: the mean step time
    outside every timed span."""
    df = run.timer.to_frame()
    df = df[df.step >= skip_steps]
    n = max(run.config["steps"] - skip_steps, 1)
    ops = df.groupby(df.op.str.replace(r"_b[01]$", "", regex=True)).seconds.sum() / n
    out = {k: float(v) for k, v in ops.sort_values(ascending=False).items()}
    out["other"] = float(run.step_times()[skip_steps:].mean()) - sum(out.values())
    return out


def link_samples(run, skip_steps: int = 1):
    """One row per link job of a run from step ``skip_steps`` on: ``kind``, ``bytes``, ``GB_per_s`` (None:
    unpaced), ``queue_s`` (submission to start), ``cross_s`` (start to end), ``resume_s`` (end to the caller's
    return from waiting), ``idle`` (nothing else on the link when submitted), ``blocked`` (the caller began waiting
    before the job landed)."""
    import pandas as pd
    gbps = run.config.get("link_GB_per_s")
    starts = [r.start_s for r in run.timer.records if r.op == "embed"]
    first = starts[skip_steps] if len(starts) > skip_steps else np.inf
    rows, prev_end = [], -np.inf
    for j in run.link_records:
        if j["submit_s"] >= first:
            rows.append({"kind": j["kind"], "layer": j["layer"], "bytes": j["nbytes"], "GB_per_s": gbps,
                         "queue_s": j["start_s"] - j["submit_s"], "cross_s": j["end_s"] - j["start_s"],
                         "resume_s": j["returned_s"] - j["end_s"], "idle": prev_end <= j["submit_s"],
                         "blocked": j["returned_s"] - j["waited_s"] < j["end_s"]})
        prev_end = max(prev_end, j["end_s"])
    return pd.DataFrame(rows, columns=["kind", "layer", "bytes", "GB_per_s", "queue_s", "cross_s", "resume_s",
                                       "idle", "blocked"])


def step_lanes(run, step: int):
    """``(ops, link)`` of one step of a run, for a timeline: the timed operations of that step
    (:meth:`ess.metrics.OpTimer.to_frame`) and the link jobs submitted while they ran."""
    import pandas as pd
    ops = run.timer.to_frame()
    ops = ops[ops.step == step]
    link = pd.DataFrame(run.link_records, columns=["kind", "layer", "nbytes", "submit_s", "start_s", "end_s",
                                                   "returned_s", "waited_s"])
    link = link[(link.submit_s >= ops.start_s.min()) & (link.submit_s <= ops.end_s.max())]
    return ops, link


def misses_by_layer(runs, skip_steps: int = 1):
    """Mean misses per step of each layer (all requests, steps from ``skip_steps`` on), one block of rows per run
    labelled by its ratio and context: columns ``layer``, ``run``, ``misses``."""
    import pandas as pd
    return pd.concat([pd.DataFrame({"layer": range(r.misses.shape[1]),
                                    "run": f"ratio {r.config['ratio']:g}, L {r.config['context_len']}",
                                    "misses": r.misses[skip_steps:].sum(axis=2).mean(axis=0)}) for r in runs],
                     ignore_index=True)


@dataclass(frozen=True)
class CheckConfig:
    """One configuration of the check: the first ``batch`` requests of the prefill at ``context_len`` tokens, decoded
    as ``decode`` says."""

    context_len: int
    batch: int
    decode: DecodeConfig

    def __post_init__(self):
        validate.positive_int("context_len", self.context_len)
        validate.positive_int("batch", self.batch)
        if not isinstance(self.decode, DecodeConfig):
            raise TypeError(f"decode must be an ess.engine.DecodeConfig, got {type(self.decode).__name__}")


def run_configs(engine, prefills: dict, configs, *, steps: int = 4, progress: bool = True) -> list:
    """Decode every configuration (:class:`CheckConfig`), its steps interleaved with every other's: all sessions
    are started, then round by round each advances one step, so that the load of a shared machine falls alike on
    every configuration. ``prefills`` maps each ``context_len`` to a :class:`~ess.engine.Prefilled` (a configuration
    takes its first ``batch`` requests). The garbage collector is off while they run (as :mod:`timeit` does).
    Returns one run per configuration, in order."""
    import gc
    from tqdm.auto import tqdm
    configs = list(configs)
    for i, c in enumerate(configs):
        if not isinstance(c, CheckConfig):
            raise TypeError(f"configs[{i}] must be a CheckConfig, got {type(c).__name__}")
        if c.context_len not in prefills:
            raise ValueError(f"no prefill for context_len={c.context_len!r}; have {sorted(prefills)}")
    sessions = []
    gc_was_on = gc.isenabled()
    gc.disable()                  # as timeit does: a collection would land, long, in one step of one configuration
    try:
        for c in configs:
            sessions.append(engine.start(prefills[c.context_len].select(range(c.batch)), steps, c.decode))
        bar = tqdm(total=steps * len(configs), desc="decode steps", unit="step", disable=not progress)
        for _ in range(steps):
            for s in sessions:
                s.step()
                bar.update(1)
        bar.close()
    finally:
        runs = [s.close() for s in sessions]
        if gc_was_on:
            gc.enable()
    return runs
