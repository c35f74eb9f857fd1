"""The check of the simulator's overlap formulas against the real engine: per-operation costs measured on some
decode runs (the calibration runs), the step time of other runs (held out) predicted from them with the formulas
that also price DeepSeek (:func:`ess.sim.timeline.overlap_overhead_s`), and set beside the step time measured.

**The check as a whole** (what notebook 09 calls): :class:`CheckDesign` says which configurations calibrate and which
are held out, :func:`check_prefills` prefills their prompts, :func:`run_check` decodes them all (interleaved, step
by step), fits the costs and predicts every configuration, and returns an :class:`OverlapCheck` (the table, the
runs, the held-out errors, the step's breakdown, the serial formula's gap).

**Operation costs.** Every operation the engine times (:class:`ess.metrics.OpTimer`) is a linear function of what it
works on -- a fixed part per call plus a part per request, per token scanned, per entry -- fitted by least squares
on the calibration runs' records (one record per operation, layer and step). The operations that depend on the
batch size alone (the projections, the MLP, the output head) run a matrix-vector product for one request and a
matrix product above (a different BLAS path), so their rule has a constant of its own at batch 1 (``single``).
Every operation of a held-out run is priced from that rule: no time measured at a held-out batch enters its
prediction.

=============== ============================================================ =================================
family          records                                                       features (besides a constant)
=============== ============================================================ =================================
``pre_attn``    norm, q/k/v projections, RoPE                                 requests, single
``indexer``     indexer scan and top-K (``indexer``, ``indexer_b0/_b1``)      requests, cached tokens scanned
``plan``        the cache's plans                                             requests, selected entries, misses
``attn``        one gather-and-score call over some entries: every selected   requests, entries
                one (``attn``, ``attn_b0/_b1``), DA's hits (``attn_hits``)
                or misses (``attn_misses``) -- the same code on other rows
``merge``       softmax and weighted sum over the step's columns              requests, selected entries
``commit``      the plans applied                                             requests, selected entries, misses
``finish``      output projection and MLP                                     requests, single
``embed``, ``logits``, ``write_back``, ``other`` (per step; ``other`` is      requests, single
                the step's time outside every timed span)
=============== ============================================================ =================================

**The link.** A job of ``n`` bytes takes ``lambda + n / bandwidth`` on an emulated link and ``lambda + c n`` unpaced,
as the compute lane sees it: ``lambda`` is the copy worker's wake-up (submission to start, on an idle link), its
sleep overshoot (crossing time beyond ``n / bandwidth``) and the waiting thread's wake-up (end to the return of the
wait), each the mean over the calibration jobs of that direction (a step adds up dozens of jobs, so their mean, not
their median, is what it sees).

**A step, predicted.** Per layer the serial work ``pre_attn + I + a + commit + finish`` (``I`` = indexer + plan,
``a`` = attn + merge; under DBA the same per half batch) plus the formula's overhead of the schedule, from a
:class:`ess.sim.timeline.LayerOps` with ``indexer = I``, ``pre_attn = 0`` (this model's indexer needs the
attention queries, so nothing is left between selection and attention), ``attn = a``, ``attn_hit`` = the hits'
gather and score, ``merge`` = DA's extra (hits + misses - all), ``o_proj = finish``, ``h2d`` / ``d2h`` the link
jobs; then the per-step operations. The misses of each layer and request are the run's own (the check is of the
timeline, not of the cache's miss count).

What the check covers: the none / DA / DBA formulas on one compute lane and one link, with per-operation costs
measured on this machine. What it does not: DeepSeek's Two-Batch Overlap (two micro-batches, the all-to-all
lane), MoE and the MTP draft passes, and GPU kernels (a CUDA run of the same engine can be checked the same way).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import validate
from ..sim.timeline import LayerOps, overlap_overhead_s
from .config import DecodeConfig

__all__ = ["FAMILIES", "op_samples", "link_samples", "measured_breakdown", "OpCosts", "fit_op_costs", "predict_run",
           "check_runs", "CheckConfig", "run_configs", "CheckDesign", "check_prefills", "OverlapCheck", "run_check",
           "step_lanes", "misses_by_layer"]

#: family -> the features its time is linear in (besides a constant)
FAMILIES = {
    "pre_attn": ("requests", "single"), "finish": ("requests", "single"),
    "indexer": ("requests", "tokens"), "plan": ("requests", "selected", "misses"),
    "attn": ("requests", "entries"), "merge": ("requests", "selected"), "commit": ("requests", "selected", "misses"),
    "embed": ("requests", "single"), "logits": ("requests", "single"), "write_back": ("requests", "single"),
    "other": ("requests", "single"),
}
_PER_STEP = ("embed", "logits", "write_back", "other")
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


def _halves(B: int) -> tuple[np.ndarray, np.ndarray]:
    half = (B + 1) // 2                                            # as ess.decode.run_layer splits a batch
    return np.arange(half), np.arange(half, B)


def _sizes(run, t: int, layer: int, rows: np.ndarray) -> dict:
    """What an operation over requests ``rows`` of step ``t`` and ``layer`` works on."""
    cfg = run.config
    n_tok = np.asarray(cfg["prompt_lens"])[rows] + t
    sel = float(np.minimum(cfg["topk"], n_tok).sum())
    return {"requests": float(rows.size), "single": float(rows.size == 1), "tokens": float(n_tok.sum()),
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


@dataclass(frozen=True)
class OpCosts:
    """Fitted costs: ``coef[family]`` (constant, then one per feature of :data:`FAMILIES`); ``link_latency_s`` per
    direction (paced links), ``unpaced`` per direction ``(a, c)`` (seconds = a + c bytes), the RMS relative residual
    of each family's fit, and which runs they came from."""

    coef: dict
    link_latency_s: dict
    unpaced: dict
    residual: dict
    calibrated_on: tuple

    def op_s(self, family: str, **sizes) -> float:
        """Seconds of one call of ``family`` on ``sizes`` (the features of :data:`FAMILIES`; ``single`` follows from
        ``requests`` when not given)."""
        sizes.setdefault("single", float(sizes.get("requests") == 1))
        c = self.coef[family]
        return float(c[0] + sum(ci * sizes[f] for ci, f in zip(c[1:], FAMILIES[family])))

    def link_s(self, kind: str, nbytes: float, GB_per_s) -> float:
        if GB_per_s is None:
            a, c = self.unpaced.get(kind, (0.0, 0.0))
            return a + c * nbytes
        return self.link_latency_s.get(kind, 0.0) + nbytes / (GB_per_s * 1e9)


def _describe(run) -> str:
    c = run.config
    return (f"B={c['batch']} L={c['context_len']} ratio={c['ratio']:g} {c['schedule']} "
            f"link={c['link_GB_per_s'] if c['link_GB_per_s'] is not None else 'unpaced'}")


def fit_op_costs(runs) -> OpCosts:
    """Fit every family on the calibration ``runs`` (sparse decode runs of one engine), robust to the load of a
    shared machine: per run and family the trimmed mean (10 % each side) over its steps of the mean time per record,
    against the run's mean features, then least squares across runs (one point per run and family)."""
    import pandas as pd
    if not runs:
        raise ValueError("runs must hold at least one calibration run")
    points = []
    for i, run in enumerate(runs):
        df = op_samples(run)
        per_step = df.groupby(["family", "step"]).mean(numeric_only=True).reset_index()
        for fam, part in per_step.groupby("family"):
            feats = part[list(FAMILIES[fam])].mean()
            points.append({"run": i, "family": fam, "seconds": _trimmed_mean(part.seconds), **feats.to_dict()})
    points = pd.DataFrame(points)
    coef, residual = {}, {}
    for fam, feats in FAMILIES.items():
        part = points[points.family == fam]
        if part.empty:
            continue
        y = part.seconds.to_numpy()
        X = np.column_stack([np.ones(len(part))] + [part[f].to_numpy(float) for f in feats])
        c, *_ = np.linalg.lstsq(X, y, rcond=None)
        coef[fam] = tuple(float(v) for v in c)
        residual[fam] = float(np.sqrt(np.mean(((X @ c - y) / np.maximum(y, 1e-9)) ** 2)))
    links = pd.concat([link_samples(r) for r in runs], ignore_index=True)
    latency, unpaced = {}, {}
    for kind, part in links.groupby("kind"):
        wake = float(part.queue_s[part.idle].mean()) if part.idle.any() else 0.0
        resume = float(part.resume_s[part.blocked].mean()) if part.blocked.any() else 0.0
        paced = part[part.GB_per_s.notna()]
        if len(paced):
            over = paced.cross_s - paced.bytes / (paced.GB_per_s.astype(float) * 1e9)
            latency[kind] = wake + float(over.mean()) + resume
        free = part[part.GB_per_s.isna()]
        if len(free):
            X = np.column_stack([np.ones(len(free)), free.bytes.to_numpy(float)])
            a, c = np.linalg.lstsq(X, free.cross_s.to_numpy(), rcond=None)[0]
            unpaced[kind] = (wake + float(a) + resume, float(c))
    return OpCosts(coef, latency, unpaced, residual, tuple(_describe(r) for r in runs))


def _layer(costs: OpCosts, run, t: int, layer: int, schedule: str | None = None) -> tuple[float, dict]:
    """Predicted seconds of one layer of step ``t``: the serial work of its schedule (or of ``schedule``) plus the
    formula's overhead; and the parts (for the breakdown)."""
    cfg = run.config
    B, gbps, E = cfg["batch"], cfg["link_GB_per_s"], cfg["entry_bytes"]
    sched = schedule or cfg["schedule"]
    offload = cfg["mode"] == "offload"
    every = np.arange(B)
    s = _sizes(run, t, layer, every)
    op = costs.op_s
    pre, fin = op("pre_attn", **s), op("finish", **s)
    commit = op("commit", **s)
    sel_all = op("indexer", **s) + op("plan", **s)
    attn_all = op("attn", **s) + op("merge", **s)
    h = costs.link_s("h2d", s["misses"] * E, gbps) if offload else 0.0
    d = costs.link_s("d2h", B * E, gbps) if offload else 0.0
    parts = {"pre_attn": pre, "finish": fin, "commit": commit, "select": sel_all, "attention": attn_all}
    hits_s = op("attn", requests=s["requests"], entries=s["hits"])
    misses_s = op("attn", requests=s["requests"], entries=s["misses"])
    merge_s = op("merge", **s)
    s0, s1 = (_sizes(run, t, layer, r) for r in _halves(B)) if B > 1 else (s, s)
    I0, I1 = (op("indexer", **x) + op("plan", **x) for x in (s0, s1))
    a0, a1 = (op("attn", **x) + op("merge", **x) for x in (s0, s1))
    # the merge runs once over every column whatever the schedule: DA's two gather-and-score calls are its own cost
    ops = LayerOps(indexer=sel_all, indexer_b0=I0, indexer_b1=I1, pre_attn=0.0, attn=attn_all, attn_b0=a0,
                   attn_b1=a1, attn_hit=hits_s, attn_miss=misses_s + merge_s, merge=0.0, o_proj=fin, h2d=h,
                   h2d_b0=costs.link_s("h2d", s0["misses"] * E, gbps),
                   h2d_b1=costs.link_s("h2d", s1["misses"] * E, gbps), d2h=d)
    over = float(overlap_overhead_s(ops)[sched]) if offload else 0.0
    parts["overhead"] = over
    return sum(parts.values()), parts


def predict_run(costs: OpCosts, runs, skip_steps: int = 1, schedule: str | None = None) -> dict:
    """Predicted and measured step time of one configuration, from one or more runs of it (``runs``: a run or a
    list): the mean predicted step and the trimmed mean (10 % each side) of the measured steps, from step
    ``skip_steps`` on, and the predicted breakdown per step (seconds per part, summed over layers). ``schedule``
    prices the runs with another schedule's formula (what a wrong formula would predict)."""
    runs = runs if isinstance(runs, (list, tuple)) else [runs]
    preds, measured, parts_sum = [], [], {}
    for run in runs:
        n_layers = run.misses.shape[1]
        B = run.config["batch"]
        for t in range(skip_steps, run.config["steps"]):
            total = 0.0
            for layer in range(n_layers):
                sec, parts = _layer(costs, run, t, layer, schedule)
                total += sec
                for k, v in parts.items():
                    parts_sum[k] = parts_sum.get(k, 0.0) + v
            for fam in _PER_STEP:
                v = costs.op_s(fam, requests=float(B), single=float(B == 1))
                total += v
                parts_sum[fam] = parts_sum.get(fam, 0.0) + v
            preds.append(total)
        measured.extend(run.step_times()[skip_steps:])
    return {"predicted_s": float(np.mean(preds)), "measured_s": _trimmed_mean(measured),
            "breakdown_s": {k: v / len(preds) for k, v in parts_sum.items()}}


def check_runs(calibration, held_out):
    """Fit the costs on the ``calibration`` runs, predict every configuration: ``calibration`` and ``held_out``
    are lists of configurations, each a run or a list of runs of that configuration (repeats). One row per configuration
    with its settings, ``predicted_ms``, ``measured_ms``, ``error`` (predicted / measured - 1) and ``role``.
    Returns (costs, DataFrame)."""
    import pandas as pd
    listed = lambda x: list(x) if isinstance(x, (list, tuple)) else [x]          # noqa: E731
    costs = fit_op_costs([r for runs in calibration for r in listed(runs)])
    rows = []
    for role, configs in (("calibration", calibration), ("held out", held_out)):
        for runs in map(listed, configs):
            p = predict_run(costs, runs)
            c = runs[0].config
            rows.append({"role": role, "batch": c["batch"], "context_len": c["context_len"], "ratio": c["ratio"],
                         "link_GB_per_s": c["link_GB_per_s"], "schedule": c["schedule"], "mode": c["mode"],
                         "runs": len(runs),
                         "misses_per_step": float(np.mean([r.misses[1:].sum(axis=(1, 2)).mean() for r in runs])),
                         "predicted_ms": p["predicted_s"] * 1e3, "measured_ms": p["measured_s"] * 1e3,
                         "error": p["predicted_s"] / p["measured_s"] - 1.0})
    return costs, pd.DataFrame(rows)


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


@dataclass(frozen=True)
class CheckDesign:
    """Which configurations calibrate the costs and which are held out (predicted, never fitted).

    Calibration: every context of ``calibration_contexts`` x batch of ``calibration_batches`` x schedule (none, DA,
    and DBA from batch 2) at ``calibration_ratio`` on the first link of ``calibration_links_GB_per_s``, and every
    schedule at the longest context and largest batch on each further link. Held out: every context of
    ``held_out_contexts`` x batch of ``held_out_batches`` x link of ``held_out_links_GB_per_s`` x schedule at
    ``held_out_ratio``. Every configuration decodes ``steps`` steps on ``clock`` (:data:`ess.link.CLOCKS`)."""

    calibration_contexts: tuple
    calibration_batches: tuple
    calibration_ratio: float
    calibration_links_GB_per_s: tuple
    held_out_contexts: tuple
    held_out_batches: tuple
    held_out_ratio: float
    held_out_links_GB_per_s: tuple
    steps: int
    clock: str = "cpu"

    def __post_init__(self):
        for name in ("calibration_contexts", "calibration_batches", "calibration_links_GB_per_s",
                     "held_out_contexts", "held_out_batches", "held_out_links_GB_per_s"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or getattr(value, "ndim", 1) != 1 \
                    or len(value) == 0:
                raise TypeError(f"{name} must be a non-empty list, got {value!r}")
            if name.endswith("GB_per_s"):                 # link speeds (None: the machine's own copy speed)
                value = [None if v is None else validate.real(f"{name}[{i}]", v, lo=0.0, lo_open=True)
                         for i, v in enumerate(value)]
            else:                                          # contexts and batches: counts
                value = [validate.positive_int(f"{name}[{i}]", v) for i, v in enumerate(value)]
            object.__setattr__(self, name, tuple(value))
        object.__setattr__(self, "steps", validate.positive_int("steps", self.steps))
        DecodeConfig(ratio=self.calibration_ratio, clock=self.clock)           # checks the ratio and the clock
        DecodeConfig(ratio=self.held_out_ratio)

    def _configs(self, contexts, batches, ratio, links) -> list:
        out = []
        for L in contexts:
            for B in batches:
                for bw in links:
                    for s in ("none", "da", "dba"):
                        if s == "dba" and B < 2:
                            continue
                        out.append(CheckConfig(L, B, DecodeConfig(ratio=ratio, schedule=s, link_GB_per_s=bw,
                                                                  clock=self.clock)))
        return out

    def calibration(self) -> list:
        """The calibration configurations (:class:`CheckConfig`), in the order they are decoded."""
        first = self._configs(self.calibration_contexts, self.calibration_batches, self.calibration_ratio,
                              self.calibration_links_GB_per_s[:1])
        more = self._configs((max(self.calibration_contexts),), (max(self.calibration_batches),),
                             self.calibration_ratio, self.calibration_links_GB_per_s[1:])
        return first + more

    def held_out(self) -> list:
        """The held-out configurations (:class:`CheckConfig`)."""
        out = []
        for L in self.held_out_contexts:
            for B in self.held_out_batches:
                out += self._configs((L,), (B,), self.held_out_ratio, self.held_out_links_GB_per_s)
        return out

    @property
    def contexts(self) -> list:
        return sorted(set(self.calibration_contexts + self.held_out_contexts))

    @property
    def max_batch(self) -> int:
        return max(self.calibration_batches + self.held_out_batches)

    def describe(self) -> dict:
        """The design as record fields (``calibration``, ``held_out``, ``steps``, ``clock``)."""
        return {"steps": self.steps, "clock": self.clock,
                "calibration": f"L {list(self.calibration_contexts)}, B {list(self.calibration_batches)}, ratio "
                               f"{self.calibration_ratio}, links {list(self.calibration_links_GB_per_s)}",
                "held_out": f"L {list(self.held_out_contexts)}, B {list(self.held_out_batches)}, ratio "
                            f"{self.held_out_ratio}, links {list(self.held_out_links_GB_per_s)}"}


def check_prefills(engine, design: CheckDesign) -> dict:
    """One prefill per context of the design, of ``design.max_batch`` requests of real text (request ``b`` reads
    :func:`ess.llm.reference_text_ids` from token ``2000 + 9000 b``), room for ``design.steps`` steps."""
    from ..llm import reference_text_ids
    n = design.max_batch
    return {L: engine.prefill([reference_text_ids(engine.tokenizer, L, skip_tokens=2000 + 9000 * b)
                               for b in range(n)], max_new_tokens=design.steps) for L in design.contexts}


@dataclass
class OverlapCheck:
    """What :func:`run_check` found: ``costs`` (:class:`OpCosts`) fitted on the calibration runs, ``table`` one
    row per configuration (:func:`check_runs`), and the runs of both roles."""

    design: CheckDesign
    costs: OpCosts
    table: object
    calibration_runs: list
    held_out_runs: list

    @property
    def held(self):
        """The held-out rows of :attr:`table`."""
        return self.table[self.table.role == "held out"]

    def held_out_errors(self) -> tuple[float, float]:
        """``(median, worst)`` of ``|predicted / measured - 1|`` over the held-out configurations."""
        err = self.held.error.abs()
        return float(err.median()), float(err.max())

    def serial_pricing_gap(self) -> tuple[float, float]:
        """``(gap, own)``: the median ``|predicted / measured - 1|`` of the held-out DA and DBA runs priced with the
        serial (``"none"``) formula, and with their own (could the check tell a wrong formula from the right
        one?)."""
        wrong = [predict_run(self.costs, r, schedule="none") for r in self.held_out_runs
                 if r.config["schedule"] != "none"]
        gap = float(np.median([abs(p["predicted_s"] / p["measured_s"] - 1) for p in wrong]))
        own = float(self.held[self.held.schedule != "none"].error.abs().median())
        return gap, own

    def half_batch_ratios(self):
        """What a half batch costs on this engine: for every held-out context and batch with both a ``none`` run
        (every operation on the whole batch) and a ``dba`` run (the selection and attention per half), the measured
        mean time of one call of the indexer (with its plan) and of attention (gather, score and merge) on a half,
        over the same on the whole batch, beside the fitted rule's ratio for the same sizes (step 1). Columns
        ``context_len``, ``batch``, ``operation``, ``measured_ratio``, ``rule_ratio``."""
        import pandas as pd
        fams = {"indexer": ("indexer", "plan"), "attention": ("attn", "merge")}
        rows = []
        for whole in self.select(schedule="none"):
            c = whole.config
            split = self.select(schedule="dba", batch=c["batch"], context_len=c["context_len"],
                                link_GB_per_s=c["link_GB_per_s"])
            if not split or c["batch"] < 2:
                continue
            w, h = whole.timer.to_frame(), split[0].timer.to_frame()
            w, h = w[w.step >= 1], h[h.step >= 1]
            B = c["batch"]
            s_all = _sizes(whole, 1, 0, np.arange(B))
            s_half = _sizes(whole, 1, 0, _halves(B)[0])
            for name, (sel, extra) in fams.items():
                per_call = lambda df, tags: float(df[df.op.isin(tags)].groupby(["step", "layer"]).seconds.sum().mean())  # noqa: E731,E501
                whole_s = per_call(w, (sel,)) + per_call(w, (extra,))
                half_s = (per_call(h, (f"{sel}_b0", f"{sel}_b1")) + per_call(h, (f"{extra}_b0", f"{extra}_b1"))) / 2
                rule = sum(self.costs.op_s(f, **s_half) for f in (sel, extra)) / sum(
                    self.costs.op_s(f, **s_all) for f in (sel, extra))
                rows.append({"context_len": c["context_len"], "batch": B, "link_GB_per_s": c["link_GB_per_s"],
                             "operation": name, "whole_ms": whole_s * 1e3, "half_ms": half_s * 1e3,
                             "measured_ratio": half_s / whole_s, "rule_ratio": rule})
        return pd.DataFrame(rows, columns=["context_len", "batch", "link_GB_per_s", "operation", "whole_ms",
                                           "half_ms", "measured_ratio", "rule_ratio"])

    def select(self, role: str = "held out", **match) -> list:
        """The runs of ``role`` (``"held out"`` or ``"calibration"``) whose record (``run.config``) has every value
        of ``match`` (e.g. ``schedule="da"``), in order."""
        runs = {"held out": self.held_out_runs, "calibration": self.calibration_runs}[validate.one_of(
            "role", role, ("held out", "calibration"))]
        return [r for r in runs if all(r.config.get(k) == v for k, v in match.items())]

    def breakdown(self, context_len: int, batch: int):
        """Per part of a step, ms (columns ``config``, ``part``, ``ms``), measured (the engine's timer,
        :func:`measured_breakdown`) and predicted (the formula's parts) for the held-out runs at ``context_len`` and
        ``batch``."""
        import pandas as pd
        rows = []
        for run in self.held_out_runs:
            c = run.config
            if c["context_len"] != context_len or c["batch"] != batch:
                continue
            name = f"{c['schedule']} {c['link_GB_per_s']:g} GB/s"
            rows += [{"config": f"measured: {name}", "part": k, "ms": v * 1e3}
                     for k, v in measured_breakdown(run).items()]
            rows += [{"config": f"predicted: {name}", "part": k, "ms": v * 1e3}
                     for k, v in predict_run(self.costs, run)["breakdown_s"].items()]
        return pd.DataFrame(rows, columns=["config", "part", "ms"])


def run_check(engine, design: CheckDesign, prefills: dict | None = None, *, progress: bool = True) -> OverlapCheck:
    """The whole check: prefill (unless ``prefills`` are given, :func:`check_prefills`), decode every configuration
    of ``design`` interleaved (:func:`run_configs`), fit the costs on the calibration runs and predict every
    configuration (:func:`check_runs`)."""
    if not isinstance(design, CheckDesign):
        raise TypeError(f"design must be a CheckDesign, got {type(design).__name__}")
    prefills = check_prefills(engine, design) if prefills is None else prefills
    cal, held = design.calibration(), design.held_out()
    runs = run_configs(engine, prefills, cal + held, steps=design.steps, progress=progress)
    cal_runs, held_runs = runs[:len(cal)], runs[len(cal):]
    costs, table = check_runs(cal_runs, held_runs)
    return OverlapCheck(design, costs, table, cal_runs, held_runs)


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
