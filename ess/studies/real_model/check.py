"""The check of the simulator's overlap formulas against the real engine: per-operation costs measured on some
decode runs (the calibration runs), the step time of other runs (held out) predicted from them with the formulas
that also price DeepSeek (:func:`ess.sim.timeline.overlap_overhead_s`), and set beside the step time measured.

**The check as a whole** (what notebook 09 calls): :class:`CheckDesign` says which configurations calibrate and which
are held out, :func:`check_prefills` prefills their prompts, :func:`run_check` decodes them all (interleaved, step
by step), fits the costs and predicts every configuration, and returns an :class:`OverlapCheck` (the table, the
runs, the held-out errors, the step's breakdown, the serial formula's gap). What is measured on the engine is
:mod:`ess.studies.real_model.measure`'s; the operation costs, their fit and the prediction of a step are
:mod:`ess.studies.real_model.fit`'s.

**Two variants.** The *prediction* (the headline) prices a held-out run from what was measured at calibration
configurations only: the matrix products from a rule over row counts fitted on the calibration row counts
(:func:`product_line`: a line through the costs measured alone at the calibration batches), and its hits and misses
from the cache simulation of top-K sets recorded on the calibration prompts (:func:`record_traces`,
:func:`miss_shares`, :func:`with_predicted_counts`), never counted in the held-out run. The variant *with measured
inputs* takes the products' costs measured alone at every row count (the held-out batches' included) and each run's
own hits and misses: what measuring those inputs buys. Both rules were chosen, and the held-out set written down
with its hash, before the set's first run (``data/calibration/engine_check.yaml``).

What the check covers: the none / DA / DBA formulas on one compute lane and one link, with per-operation costs
measured on this machine. What it does not: DeepSeek's Two-Batch Overlap (two micro-batches, the all-to-all
lane), MoE and the MTP draft passes, and GPU kernels (a CUDA run of the same engine can be checked the same way).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import validate
from ...engine.config import DecodeConfig
from .fit import OpCosts, check_runs, miss_shares, predict_run, product_line, with_predicted_counts
from .measure import CheckConfig, _halves, _sizes, _trimmed_mean, measured_breakdown, product_costs, run_configs

__all__ = ["GOAL", "held_out_sha256", "record_traces", "CheckDesign", "check_prefills", "OverlapCheck", "run_check"]


#: what the check is held to: the median and the worst |predicted / measured - 1| over the held-out configurations
#: (the target set for the check when its held-out design was chosen; README, notebook 09)
GOAL = {"median": 0.05, "worst": 0.15}


def held_out_sha256(held: dict) -> str:
    """SHA-256 of a held-out set written as JSON with sorted keys and no spaces (:meth:`CheckDesign.held_out_set`;
    the hash written beside the set in ``data/calibration/engine_check.yaml`` before its first run).

    >>> held_out_sha256({"contexts": [320, 640], "batches": [3, 6], "ratio": 0.5, "links_GB_per_s": [0.003, 0.03],
    ...                  "steps": 7})[:12]
    '3e8df8b8ffe6'
    """
    import hashlib
    import json
    if not isinstance(held, dict):
        raise TypeError(f"held must be a dict (CheckDesign.held_out_set), got {type(held).__name__}")
    return hashlib.sha256(json.dumps(held, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def record_traces(engine, prefills: dict, design) -> list:
    """The top-K sets the model selects on the calibration prompts: per calibration context, the first
    ``max(design.calibration_batches)`` requests of ``prefills[context]`` decoded ``design.steps`` steps with every
    entry resident (offload changes nothing that is selected) through an :class:`ess.traces.TraceRecorder` (the
    LRU-Warmup windows too). One :class:`ess.traces.Trace` per calibration context; what :func:`miss_shares` replays."""
    from ...traces import TraceRecorder
    from ...engine.config import default_topk
    if not isinstance(design, CheckDesign):
        raise TypeError(f"design must be a CheckDesign, got {type(design).__name__}")
    B = max(design.calibration_batches)
    out = []
    for L in design.calibration_contexts:
        if L not in prefills:
            raise ValueError(f"no prefill for calibration context {L}; have {sorted(prefills)}")
        pre = prefills[L].select(range(B))
        K = default_topk(max(pre.lengths))
        rec = TraceRecorder(context_len=max(pre.lengths), k=K, n_layers=engine.config.n_layers, batch=B,
                            meta={"what": "the check's calibration prompts"})
        engine.decode(pre, design.steps, offload=False, recorder=rec, timing=False, clock=design.clock)
        out.append(rec.to_trace())
    return out


@dataclass(frozen=True)
class CheckDesign:
    """Which configurations calibrate the costs and which are held out (predicted, never fitted).

    Calibration: every context of ``calibration_contexts`` x batch of ``calibration_batches`` x schedule (none, DA,
    and DBA from batch 2) at the first ratio of ``calibration_ratio`` (a ratio or a list of them) on the first link of
    ``calibration_links_GB_per_s``; every context x schedule at the largest batch at each further ratio (the first
    link), so that the fit can tell a cost per selected entry from a cost per miss (at one ratio the two move
    together); and every schedule at the longest context and largest batch on each further link (the first ratio).
    Held out: every context of ``held_out_contexts`` x batch of ``held_out_batches`` x link of
    ``held_out_links_GB_per_s`` x schedule at ``held_out_ratio``. Every configuration decodes ``steps`` steps on
    ``clock`` (:data:`ess.link.CLOCKS`)."""

    calibration_contexts: tuple
    calibration_batches: tuple
    calibration_ratio: float | tuple
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
        ratios = self.calibration_ratio
        if isinstance(ratios, (list, tuple)):
            if not ratios:
                raise TypeError("calibration_ratio must be a ratio or a non-empty list of ratios, got []")
            ratios = tuple(validate.ratio(f"calibration_ratio[{i}]", r) for i, r in enumerate(ratios))
            if len(set(ratios)) != len(ratios):
                raise ValueError(f"calibration_ratio must not repeat a ratio, got {list(ratios)}")
        else:
            ratios = (validate.ratio("calibration_ratio", ratios),)
        object.__setattr__(self, "calibration_ratio", ratios[0] if len(ratios) == 1 else ratios)
        DecodeConfig(ratio=ratios[0], clock=self.clock)                       # checks the clock
        DecodeConfig(ratio=self.held_out_ratio)

    @property
    def calibration_ratios(self) -> tuple:
        """The calibration ratios, the first the main one."""
        r = self.calibration_ratio
        return r if isinstance(r, tuple) else (r,)

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
        main, *others = self.calibration_ratios
        first = self._configs(self.calibration_contexts, self.calibration_batches, main,
                              self.calibration_links_GB_per_s[:1])
        ratios = [c for r in others for c in self._configs(self.calibration_contexts, (max(self.calibration_batches),),
                                                           r, self.calibration_links_GB_per_s[:1])]
        more = self._configs((max(self.calibration_contexts),), (max(self.calibration_batches),), main,
                             self.calibration_links_GB_per_s[1:])
        return first + ratios + more

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

    def held_out_set(self) -> dict:
        """The held-out set as ``data/calibration/engine_check.yaml`` writes it down (its hash:
        :func:`held_out_sha256`)."""
        return {"contexts": list(self.held_out_contexts), "batches": list(self.held_out_batches),
                "ratio": self.held_out_ratio, "links_GB_per_s": list(self.held_out_links_GB_per_s),
                "steps": self.steps}

    def describe(self) -> dict:
        """The design as record fields (``calibration``, ``held_out``, ``steps``, ``clock``)."""
        return {"steps": self.steps, "clock": self.clock,
                "calibration": f"L {list(self.calibration_contexts)}, B {list(self.calibration_batches)}, ratio "
                               f"{' and '.join(f'{r:g}' for r in self.calibration_ratios)}, links "
                               f"{list(self.calibration_links_GB_per_s)}",
                "held_out": f"L {list(self.held_out_contexts)}, B {list(self.held_out_batches)}, ratio "
                            f"{self.held_out_ratio}, links {list(self.held_out_links_GB_per_s)}"}


def check_prefills(engine, design: CheckDesign) -> dict:
    """One prefill per context of the design, of ``design.max_batch`` requests of real text (request ``b`` reads
    :func:`ess.llm.reference_text_ids` from token ``2000 + 9000 b``), room for ``design.steps`` steps. Each keeps only
    the requests its configurations decode (:meth:`ess.engine.Prefilled.select`; a configuration of batch ``B`` takes
    the first ``B``): the other requests' entries would be held, unused, through the whole check."""
    from ...llm import reference_text_ids
    n = design.max_batch
    used = {}
    for c in design.calibration() + design.held_out():
        used[c.context_len] = max(used.get(c.context_len, 0), c.batch)
    out = {}
    for L in design.contexts:
        pre = engine.prefill([reference_text_ids(engine.tokenizer, L, skip_tokens=2000 + 9000 * b)
                              for b in range(n)], max_new_tokens=design.steps)
        out[L] = pre if used.get(L, n) == n else pre.select(range(used[L]))
    return out


@dataclass
class OverlapCheck:
    """What :func:`run_check` found: the prediction -- ``costs`` (:class:`OpCosts`) fitted on the calibration runs
    with the products' rule of the calibration row counts, ``table`` one row per configuration
    (:func:`check_runs`, held-out hits and misses from ``shares``) -- the variant with measured inputs
    (``measured_costs``, ``measured_table``: the products' costs at every row count, each run's own counts), and the
    runs of both roles. Without ``shares`` the held-out runs are priced with their own counts."""

    design: CheckDesign
    costs: OpCosts
    table: object
    calibration_runs: list
    held_out_runs: list
    measured_costs: OpCosts | None = None
    measured_table: object = None
    shares: np.ndarray | None = None

    @property
    def held(self):
        """The held-out rows of :attr:`table` (the prediction)."""
        return self.table[self.table.role == "held out"]

    @property
    def held_measured(self):
        """The held-out rows of :attr:`measured_table` (the variant with measured inputs; None without it)."""
        t = self.measured_table
        return None if t is None else t[t.role == "held out"]

    def _priced(self) -> list:
        """The held-out runs as the prediction prices them (with predicted counts when there are ``shares``)."""
        if self.shares is None:
            return list(self.held_out_runs)
        return [with_predicted_counts(r, self.shares) for r in self.held_out_runs]

    def held_out_errors(self) -> tuple[float, float]:
        """``(median, worst)`` of ``|predicted / measured - 1|`` over the held-out configurations."""
        err = self.held.error.abs()
        return float(err.median()), float(err.max())

    def serial_pricing_gap(self) -> tuple[float, float]:
        """``(gap, own)``: the median ``|predicted / measured - 1|`` of the held-out DA and DBA runs priced with the
        serial (``"none"``) formula, and with their own (could the check tell a wrong formula from the right
        one?)."""
        wrong = [predict_run(self.costs, r, schedule="none") for r in self._priced()
                 if r.config["schedule"] != "none"]
        gap = float(np.median([abs(p["predicted_s"] / p["measured_s"] - 1) for p in wrong]))
        own = float(self.held[self.held.schedule != "none"].error.abs().median())
        return gap, own

    def summary(self) -> dict:
        """The check in a few numbers: ``median`` and ``worst`` held-out |error| and ``worst_config`` (the
        configuration of the worst), ``goal_met`` (both within :data:`GOAL`), ``calibration_median`` /
        ``calibration_worst`` (the fitted rule on its own calibration runs: a run whose calibration points are off
        was a noisy one), ``serial_gap`` / ``own`` (:meth:`serial_pricing_gap`), ``products_share_median`` /
        ``products_share_max`` over the held-out configurations; with the variant with measured inputs, its
        ``measured_median``, ``measured_worst`` and ``measured_goal_met``."""
        import pandas as pd
        median, worst = self.held_out_errors()
        held = self.held
        w = held.loc[held.error.abs().idxmax()]
        cal = self.table[self.table.role == "calibration"].error.abs()
        gap, own = self.serial_pricing_gap()
        link = "unpaced" if pd.isna(w.link_GB_per_s) else f"{w.link_GB_per_s:g}"
        out = {"median": median, "worst": worst,
                "worst_config": f"B={w.batch} L={w.context_len} {w.schedule} link={link} ({w.error:+.1%})",
                "goal_met": bool(median <= GOAL["median"] and worst <= GOAL["worst"]),
                "calibration_median": float(cal.median()), "calibration_worst": float(cal.max()),
                "serial_gap": gap, "own": own, "products_share_median": float(held.products_share.median()),
                "products_share_max": float(held.products_share.max())}
        m = self.held_measured
        if m is not None:
            err = m.error.abs()
            out["measured_median"], out["measured_worst"] = float(err.median()), float(err.max())
            out["measured_goal_met"] = bool(err.median() <= GOAL["median"] and err.max() <= GOAL["worst"])
        return out

    def half_batch_ratios(self):
        """What a half batch costs on this engine: for every held-out context and batch with both a ``none`` run
        (every operation on the whole batch) and a ``dba`` run (the selection and attention per half), the measured
        mean time of one call of the indexer (with its plan) and of attention (gather, score and merge) on a half,
        over the same on the whole batch (each the trimmed mean over its steps and layers, :func:`_trimmed_mean`: a
        stall of the shared machine in one call does not set the ratio), beside the fitted rule's ratio for the same
        sizes (step 1). Columns
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
                per_call = lambda df, tags: _trimmed_mean(df[df.op.isin(tags)].groupby(["step", "layer"]).seconds.sum())  # noqa: E731,E501
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
        context_len = validate.positive_int("context_len", context_len)
        batch = validate.positive_int("batch", batch)
        rows = []
        for run, priced in zip(self.held_out_runs, self._priced()):
            c = run.config
            if c["context_len"] != context_len or c["batch"] != batch:
                continue
            name = f"{c['schedule']} {c['link_GB_per_s']:g} GB/s"
            rows += [{"config": f"measured: {name}", "part": k, "ms": v * 1e3}
                     for k, v in measured_breakdown(run).items()]
            rows += [{"config": f"predicted: {name}", "part": k, "ms": v * 1e3}
                     for k, v in predict_run(self.costs, priced)["breakdown_s"].items()]
        return pd.DataFrame(rows, columns=["config", "part", "ms"])


def run_check(engine, design: CheckDesign, prefills: dict | None = None, *, progress: bool = True) -> OverlapCheck:
    """The whole check: prefill (unless ``prefills`` are given, :func:`check_prefills`), record the top-K sets of
    the calibration prompts (:func:`record_traces`), decode every configuration of ``design`` interleaved
    (:func:`run_configs`), measure the model's matrix products at every row count up to the design's largest batch
    before and after the runs (:func:`product_costs`, 9 repeats each; the lower of the two medians), then both
    variants (:func:`check_runs`): the prediction -- the products' line through the calibration row counts
    (:func:`product_line`), the held-out counts from the cache simulation (:func:`miss_shares`) -- and the variant
    with measured inputs."""
    if not isinstance(design, CheckDesign):
        raise TypeError(f"design must be a CheckDesign, got {type(design).__name__}")
    prefills = check_prefills(engine, design) if prefills is None else prefills
    cal, held = design.calibration(), design.held_out()
    shares = miss_shares(record_traces(engine, prefills, design), engine.format, design.held_out_ratio,
                         policy=held[0].decode.policy)
    rows = range(1, design.max_batch + 1)
    before = product_costs(engine.model, rows, clock=design.clock, repeats=9)
    runs = run_configs(engine, prefills, cal + held, steps=design.steps, progress=progress)
    cal_runs, held_runs = runs[:len(cal)], runs[len(cal):]
    after = product_costs(engine.model, rows, clock=design.clock, repeats=9)
    # measured before and after the decode runs, the lower median kept: a stall of a shared machine during one
    # of the two measurements does not set the curve
    products = {fam: {m: min(before[fam][m], after[fam][m]) for m in curve} for fam, curve in before.items()}
    line = product_line({fam: {m: curve[m] for m in design.calibration_batches} for fam, curve in products.items()},
                        rows)
    costs, table = check_runs(cal_runs, held_runs, line, shares=shares)
    measured_costs, measured_table = check_runs(cal_runs, held_runs, products)
    return OverlapCheck(design, costs, table, cal_runs, held_runs, measured_costs, measured_table, shares)
