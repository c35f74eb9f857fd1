"""The real-model check's cost model: per-operation costs fitted on the calibration runs' measurements
(:mod:`ess.studies.real_model.measure`) and a run's step time predicted from them with the simulator's overlap
formulas (:func:`ess.sim.timeline.overlap_overhead_s`).

**Operation costs.** Every operation the engine times (:class:`ess.metrics.OpTimer`) is a linear function of what it
works on -- a fixed part per call plus a part per request, per token scanned, per entry -- fitted on the
calibration runs' records (one record per operation, layer and step) by least squares with every coefficient
non-negative (a cost per request, token or entry is never negative; without the bound, features that move together
in the calibration runs, such as the selected entries and the misses at one ratio, trade signs). The operations
built on the model's matrix products (the projections, the MLP, the output head) are not linear in the rows: on a
CPU a product of 3 rows can cost more than one of 4 (the BLAS library picks its kernel by the row count). Their
``products`` feature is what the model's own products cost at that row count, measured in isolation by
:func:`product_costs` (the products alone, on random inputs; no decode step), the way the DeepSeek cost model reads
a kernel's benchmark curve: in the prediction, a line through the costs at the calibration row counts
(:func:`product_line`); in the variant with measured inputs, the cost at every row count. No time measured in a
decode run at a held-out configuration enters either.

=============== ============================================================ =================================
family          records                                                       features (besides a constant)
=============== ============================================================ =================================
``pre_attn``    norm, q/k/v projections, RoPE                                 requests, products
``indexer``     indexer scan and top-K (``indexer``, ``indexer_b0/_b1``)      requests, cached tokens scanned
``plan``        the cache's plans                                             requests, selected entries, misses
``attn``        one gather-and-score call over some entries: every selected   requests, entries
                one (``attn``, ``attn_b0/_b1``), DA's hits (``attn_hits``)
                or misses (``attn_misses``) -- the same code on other rows
``merge``       softmax and weighted sum over the step's columns              requests, selected entries
``commit``      the plans applied                                             requests, selected entries, misses
``finish``      output projection and MLP                                     requests, products
``logits``      final norm and output head (per step)                         requests, products
``embed``, ``write_back``, ``other`` (per step; ``other`` is the step's       requests
                time outside every timed span)
=============== ============================================================ =================================

**The link.** A job of ``n`` bytes takes ``lambda + n / bandwidth`` on an emulated link and ``lambda + c n`` unpaced,
as the compute lane sees it: ``lambda`` is the copy worker's wake-up (submission to start, on an idle link), its
sleep overshoot (crossing time beyond ``n / bandwidth``) and the waiting thread's wake-up (end to the return of the
wait), each the mean over the calibration jobs of that direction (a step adds up dozens of jobs, so their mean, not
their median, is what it sees); ``lambda`` is floored at 0 and the unpaced ``c`` fitted non-negative (a link job
takes no negative time, whatever the noise of a few jobs says).

**A step, predicted.** Per layer the serial work ``pre_attn + I + a + commit + finish`` (``I`` = indexer + plan,
``a`` = attn + merge; under DBA the same per half batch) plus the formula's overhead of the schedule, from a
:class:`ess.sim.timeline.LayerOps` with ``indexer = I``, ``pre_attn = 0`` (this model's indexer needs the
attention queries, so nothing is left between selection and attention), ``attn = a``, ``attn_hit`` = the hits'
gather and score, ``merge`` = DA's extra (hits + misses - all), ``o_proj = finish``, ``h2d`` / ``d2h`` the link
jobs; then the per-step operations.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ... import validate
from ...sim.timeline import LayerOps, overlap_overhead_s
from .measure import FAMILIES, PRODUCTS, _halves, _row_counts, _sizes, _trimmed_mean, link_samples, op_samples

__all__ = ["OpCosts", "nonnegative_lstsq", "fit_op_costs", "product_line", "miss_shares", "with_predicted_counts",
           "predict_run", "check_runs"]


_PER_STEP = ("embed", "logits", "write_back", "other")


@dataclass(frozen=True)
class OpCosts:
    """Fitted costs: ``coef[family]`` (constant, then one per feature of :data:`FAMILIES`); ``link_latency_s`` per
    direction (paced links), ``unpaced`` per direction ``(a, c)`` (seconds = a + c bytes), the RMS relative residual
    of each family's fit, which runs they came from, and ``products``: the model's matrix products at each row count
    (:func:`product_costs`), the ``products`` feature."""

    coef: dict
    link_latency_s: dict
    unpaced: dict
    residual: dict
    calibrated_on: tuple
    products: dict = field(default_factory=dict)

    def product_s(self, family: str, requests) -> float:
        """What ``family``'s matrix products cost on ``requests`` rows (:attr:`products`)."""
        return _product_s(self.products, family, requests)

    def products_part_s(self, family: str, requests) -> float:
        """The part of one call of ``family`` on ``requests`` rows that its ``products`` feature carries (0 for a
        family without one, or without a measured curve)."""
        feats = FAMILIES[family]
        if "products" not in feats or not self.products or family not in self.coef:
            return 0.0
        return self.coef[family][1 + feats.index("products")] * self.product_s(family, requests)

    def op_s(self, family: str, **sizes) -> float:
        """Seconds of one call of ``family`` on ``sizes`` (the features of :data:`FAMILIES`; ``products`` follows
        from ``requests`` when not given)."""
        feats = FAMILIES[family]
        if "products" in feats and "products" not in sizes:
            sizes["products"] = self.product_s(family, sizes["requests"]) if self.products else 0.0
        c = self.coef[family]
        return float(c[0] + sum(ci * sizes[f] for ci, f in zip(c[1:], feats)))

    def link_s(self, kind: str, nbytes: float, GB_per_s) -> float:
        if GB_per_s is None:
            a, c = self.unpaced.get(kind, (0.0, 0.0))
            return a + c * nbytes
        return self.link_latency_s.get(kind, 0.0) + nbytes / (GB_per_s * 1e9)


def _product_s(products: dict, family: str, requests) -> float:
    """``family``'s matrix products on ``requests`` rows, from a curve of :func:`product_costs`."""
    curve = products.get(family, {})
    m = int(round(float(requests)))
    if m not in curve:
        raise ValueError(f"no product cost measured for {family} at {m} rows (requests={requests!r}); measured: "
                         f"{sorted(curve)} -- measure every row count the runs use (product_costs)")
    return curve[m]


def _describe(run) -> str:
    c = run.config
    return (f"B={c['batch']} L={c['context_len']} ratio={c['ratio']:g} {c['schedule']} "
            f"link={c['link_GB_per_s'] if c['link_GB_per_s'] is not None else 'unpaced'}")


def nonnegative_lstsq(X, y) -> np.ndarray:
    """The least-squares ``c`` of ``X c ~ y`` with every ``c >= 0`` (few columns: every set of columns allowed to be
    non-zero is solved, the best solution with no negative coefficient kept; all zero when none is)."""
    X, y = np.asarray(X, float), np.asarray(y, float)
    n = X.shape[1]
    best, best_c = np.inf, np.zeros(n)
    for mask in range(1, 2 ** n):
        cols = [j for j in range(n) if mask >> j & 1]
        sub, *_ = np.linalg.lstsq(X[:, cols], y, rcond=None)
        if (sub < 0).any():
            continue
        c = np.zeros(n)
        c[cols] = sub
        r = float(np.sum((X @ c - y) ** 2))
        if r < best:
            best, best_c = r, c
    return best_c


def fit_op_costs(runs, products: dict | None = None) -> OpCosts:
    """Fit every family on the calibration ``runs`` (sparse decode runs of one engine), robust to the load of a
    shared machine: per run and family the trimmed mean (10 % each side) over its steps of the mean time per record,
    against the run's mean features, then least squares with non-negative coefficients across runs (one point per
    run and family, :func:`nonnegative_lstsq`). ``products`` (:func:`product_costs`) gives the ``products`` feature
    at every batch the runs (and the runs to be predicted) use; without it, that feature is 0 (the rule linear in the
    requests)."""
    import pandas as pd
    if not runs:
        raise ValueError("runs must hold at least one calibration run")
    products = _products_arg(products)
    points = []
    for i, run in enumerate(runs):
        df = op_samples(run)
        per_step = df.groupby(["family", "step"]).mean(numeric_only=True).reset_index()
        for fam, part in per_step.groupby("family"):
            feats = part[[f for f in FAMILIES[fam] if f != "products"]].mean().to_dict()
            if "products" in FAMILIES[fam]:
                feats["products"] = _product_s(products, fam, feats["requests"]) if products else 0.0
            points.append({"run": i, "family": fam, "seconds": _trimmed_mean(part.seconds), **feats})
    points = pd.DataFrame(points)
    coef, residual = {}, {}
    for fam, feats in FAMILIES.items():
        part = points[points.family == fam]
        if part.empty:
            continue
        y = part.seconds.to_numpy()
        X = np.column_stack([np.ones(len(part))] + [part[f].to_numpy(float) for f in feats])
        c = nonnegative_lstsq(X, y)
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
            latency[kind] = max(wake + float(over.mean()) + resume, 0.0)     # noise can make the mean < 0
        free = part[part.GB_per_s.isna()]
        if len(free):
            X = np.column_stack([np.ones(len(free)), free.bytes.to_numpy(float)])
            a, c = nonnegative_lstsq(X, free.cross_s.to_numpy())
            unpaced[kind] = (wake + float(a) + resume, float(c))
    return OpCosts(coef, latency, unpaced, residual, tuple(_describe(r) for r in runs), products)


def _products_arg(products) -> dict:
    """``products`` as :func:`product_costs` gives it (``None``: none), checked."""
    if products is None:
        return {}
    if not isinstance(products, dict) or set(products) - set(PRODUCTS):
        raise TypeError(f"products must be None or a dict {{family: {{rows: seconds}}}} for the families "
                        f"{sorted(PRODUCTS)} (product_costs), got {products!r:.80}")
    out = {}
    for fam, curve in products.items():
        if not isinstance(curve, dict) or not curve:
            raise TypeError(f"products[{fam!r}] must be a non-empty dict {{rows: seconds}}, got {curve!r:.80}")
        out[fam] = {validate.positive_int(f"products[{fam!r}] rows", m):
                    validate.real(f"products[{fam!r}][{m!r}]", v, lo=0.0) for m, v in curve.items()}
    return out


def product_line(products: dict, rows) -> dict:
    """The matrix products' rule of the prediction: per family the least-squares line ``a + b m`` (``a, b >= 0``,
    :func:`nonnegative_lstsq`) through the costs measured at the row counts of ``products`` (the calibration
    batches; :func:`product_costs`), evaluated at every row count of ``rows``: ``{family: {m: seconds}}``, the form
    :func:`fit_op_costs` takes. Why a line (chosen before the held-out set's first run): at a few rows a product reads
    each weight matrix once (``a``) and does the same flops per row (``b m``); the BLAS library's choice of kernel
    by row count is what it cannot see.

    >>> line = product_line({"finish": {1: 3.0, 2: 5.0, 4: 9.0}}, [1, 3, 6])     # 1 + 2 m through all three
    >>> {m: round(v, 9) for m, v in line["finish"].items()}
    {1: 3.0, 3: 7.0, 6: 13.0}
    """
    products = _products_arg(products)
    rows = _row_counts(rows)
    out = {}
    for fam, curve in products.items():
        m = np.array(sorted(curve), float)
        y = np.array([curve[int(k)] for k in m])
        a, b = nonnegative_lstsq(np.column_stack([np.ones_like(m), m]), y)
        out[fam] = {r: float(a + b * r) for r in rows}
    return out


def miss_shares(traces, entry_format, ratio: float, *, policy: str = "lru") -> np.ndarray:
    """The misses' share of the selected entries per step and layer, ``(steps, n_layers)``, for a pool of ``ratio``:
    every trace (:func:`record_traces`) replayed by :func:`ess.cachesim.trace_misses` through ``policy`` with the
    slots the engine gives ``ratio`` at that trace's context (:func:`ess.layout.pool_slots` of ``entry_format``, at
    least K), its LRU-Warmup windows first; the misses over the selected entries of every request and trace
    (pooled). The steps are the fewest any trace holds."""
    from ...cachesim import trace_misses
    from ...layout import pool_slots
    from ...traces import Trace
    ratio = validate.ratio("ratio", ratio)
    traces = list(traces) if isinstance(traces, (list, tuple)) else [traces]
    if not traces:
        raise ValueError("traces must hold at least one trace")
    for i, tr in enumerate(traces):
        if not isinstance(tr, Trace):
            raise TypeError(f"traces[{i}] must be an ess.traces.Trace, got {type(tr).__name__}")
    steps = min(tr.steps for tr in traces)
    missed = selected = 0.0
    for tr in traces:
        cap = pool_slots(entry_format, ratio, tr.context_len, need=min(tr.k, tr.context_len))
        m = trace_misses(tr, policy, capacity=cap, warmup=tr.windows is not None)        # (B, n_layers, steps)
        missed = missed + m[:, :, :steps].sum(axis=0).T
        selected = selected + (tr.indices[:, :, :steps] >= 0).sum(axis=(0, 3)).T
    return np.asarray(missed, float) / np.maximum(selected, 1)


def with_predicted_counts(run, shares: np.ndarray):
    """A copy of ``run`` whose hits and misses are predicted, not counted: the misses of request ``b`` at step ``t``
    and layer ``l`` are ``shares[t, l]`` (:func:`miss_shares`) times its selected entries ``min(K, prompt + t)``,
    the rest hits (fractional: expected counts). Everything else is the run's."""
    import copy
    shares = np.asarray(shares, float)
    c = run.config
    steps, n_layers = run.misses.shape[:2]
    if shares.ndim != 2 or shares.shape[0] < steps or shares.shape[1] != n_layers:
        raise ValueError(f"shares must be (steps >= {steps}, {n_layers}) like miss_shares gives, got "
                         f"{shares.shape}")
    sel = np.minimum(c["topk"], np.asarray(c["prompt_lens"])[None, :] + np.arange(steps)[:, None])   # (steps, B)
    misses = shares[:steps, :, None] * sel[:, None, :]
    out = copy.copy(run)
    out.misses, out.hits = misses, sel[:, None, :] - misses
    return out


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
    ``skip_steps`` on, the predicted breakdown per step (seconds per part, summed over layers), and ``products_s``:
    the part of the predicted step its matrix products' curve carries (:meth:`OpCosts.products_part_s`). ``schedule``
    prices the runs with another schedule's formula (what a wrong formula would predict)."""
    runs = runs if isinstance(runs, (list, tuple)) else [runs]
    preds, measured, parts_sum, products = [], [], {}, []
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
                v = costs.op_s(fam, requests=float(B))
                total += v
                parts_sum[fam] = parts_sum.get(fam, 0.0) + v
            preds.append(total)
            products.append(sum(costs.products_part_s(fam, B) * (1 if fam in _PER_STEP else n_layers)
                                for fam in PRODUCTS))
        measured.extend(run.step_times()[skip_steps:])
    return {"predicted_s": float(np.mean(preds)), "measured_s": _trimmed_mean(measured),
            "breakdown_s": {k: v / len(preds) for k, v in parts_sum.items()},
            "products_s": float(np.mean(products))}


def check_runs(calibration, held_out, products: dict | None = None, *, shares=None):
    """Fit the costs on the ``calibration`` runs (with the matrix products' costs ``products``,
    :func:`fit_op_costs`), predict every configuration: ``calibration`` and ``held_out`` are lists of
    configurations, each a run or a list of runs of that configuration (repeats). With ``shares``
    (:func:`miss_shares`) the held-out runs are priced with predicted hits and misses
    (:func:`with_predicted_counts`), not their own. One row per configuration with its settings,
    ``misses_per_step`` (the counts priced) and ``misses_per_step_measured`` (the run's own), ``predicted_ms``,
    ``measured_ms``, ``error`` (predicted / measured - 1), ``products_share`` (the share of the predicted step priced
    from the matrix products' curve) and ``role``. Nothing of a held-out run but its configuration enters the fit or,
    with ``shares``, its prediction. Returns (costs, DataFrame)."""
    import pandas as pd
    listed = lambda x: list(x) if isinstance(x, (list, tuple)) else [x]          # noqa: E731
    costs = fit_op_costs([r for runs in calibration for r in listed(runs)], products)
    rows = []
    for role, configs in (("calibration", calibration), ("held out", held_out)):
        for own in map(listed, configs):
            runs = [with_predicted_counts(r, shares) for r in own] if shares is not None and role == "held out" \
                else own
            p = predict_run(costs, runs)
            c = runs[0].config
            rows.append({"role": role, "batch": c["batch"], "context_len": c["context_len"], "ratio": c["ratio"],
                         "link_GB_per_s": c["link_GB_per_s"], "schedule": c["schedule"], "mode": c["mode"],
                         "runs": len(runs),
                         "misses_per_step": float(np.mean([r.misses[1:].sum(axis=(1, 2)).mean() for r in runs])),
                         "misses_per_step_measured": float(np.mean([r.misses[1:].sum(axis=(1, 2)).mean()
                                                                    for r in own])),
                         "predicted_ms": p["predicted_s"] * 1e3, "measured_ms": p["measured_s"] * 1e3,
                         "error": p["predicted_s"] / p["measured_s"] - 1.0,
                         "products_share": p["products_s"] / p["predicted_s"]})
    return costs, pd.DataFrame(rows)
