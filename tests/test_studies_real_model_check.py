"""The check of the overlap formulas against the engine (ess.studies.real_model: measure, fit, check): how measured operation costs
become a layer's LayerOps and a predicted step, pinned by a worked example computed by hand; the cost fit recovers
known costs; the design's configurations; the whole check on a small engine."""
from types import SimpleNamespace

import numpy as np
import torch
import pytest

from ess.metrics import OpTimer
from ess.studies.real_model.check import CheckDesign, run_check
from ess.studies.real_model.fit import OpCosts, fit_op_costs, nonnegative_lstsq, predict_run
from ess.studies.real_model.measure import FAMILIES, PRODUCTS, CheckConfig, measured_breakdown, product_costs

MS = 1e-3


def _costs():
    z = lambda fam, *c: (fam, tuple(c) + (0.0,) * (1 + len(FAMILIES[fam]) - len(c)))    # noqa: E731
    coef = dict([z("pre_attn", 1 * MS), z("finish", 4 * MS), z("indexer", 0.0, 0.0, 0.01 * MS),
                 z("plan", 0.2 * MS), z("attn", 0.1 * MS, 0.0, 0.1 * MS), z("merge", 0.3 * MS),
                 z("commit", 0.1 * MS), z("embed", 0.0), z("logits", 2 * MS), z("write_back", 0.0), z("other", 0.0)])
    return OpCosts(coef, {"h2d": 0.1 * MS, "d2h": 0.1 * MS}, {}, {}, ())


def _run(schedule):
    # one layer, B = 2 prompts of 10 and 20 tokens, K = 4, 100-byte entries, a 0.0002 GB/s link (200,000 B/s);
    # step 1: request 0 hits 2 and misses 2, request 1 hits 3 and misses 1
    hits = np.array([[[0, 0]], [[2, 3]]])
    misses = np.array([[[0, 0]], [[2, 1]]])
    cfg = {"batch": 2, "schedule": schedule, "link_GB_per_s": 0.0002, "entry_bytes": 100, "mode": "offload",
           "prompt_lens": [10, 20], "topk": 4, "steps": 2}
    return SimpleNamespace(config=cfg, hits=hits, misses=misses, step_times=lambda: np.array([1.0, 0.01]))


# At step 1: tokens 11 + 21 = 32, selected min(4, 11) + min(4, 21) = 8, hits 5, misses 3. One gather-and-score call
# over n entries costs 0.1 + 0.1 n ms.
# serial work: pre_attn 1 + I (indexer 0.32 + plan 0.2) + a (attn 0.1 + 0.8 + merge 0.3) + commit 0.1 + finish 4
# = 6.82 ms; link: h = 0.1 + 300 B / 200,000 B/s = 1.6 ms; d = 0.1 + 200 / 200,000 = 1.1 ms; logits 2 ms per step


def test_none_adds_both_copies():
    # 6.82 + (1.6 + 1.1) + 2 = 11.52 ms
    got = predict_run(_costs(), _run("none"))
    assert got["predicted_s"] == pytest.approx(11.52 * MS) and got["products_s"] == 0.0    # no products' curve


def test_dual_attention_hides_the_copy_behind_the_hits():
    # attn_hit = 0.1 + 5 x 0.1 = 0.6; the misses' call 0.1 + 0.3 = 0.4; DA's extra 0.6 + 0.4 - 0.9 = 0.1 (one call);
    # overhead max(0, 1.6 - 0 - 0.6) + 0.1 + max(0, 1.1 - 4) = 1.1; 6.82 + 1.1 + 2 = 9.92 ms
    assert predict_run(_costs(), _run("da"))["predicted_s"] == pytest.approx(9.92 * MS)


def test_dual_batch_attention_splits_every_operation_in_halves():
    # B0 = request 0 (11 tokens, 2 misses), B1 = request 1 (21 tokens, 1 miss)
    # I0 = 0.11 + 0.2 = 0.31, I1 = 0.21 + 0.2 = 0.41, a0 = a1 = (0.1 + 0.4) + 0.3 = 0.8
    # serial 6.82 as for none; the split's own cost (I0 + I1 - I) + (a0 + a1 - a) = (0.72 - 0.52) + (1.6 - 1.2) = 0.6
    # h0 = 0.1 + 1.0 = 1.1, h1 = 0.1 + 0.5 = 0.6, d = 1.1
    # stalls max(0, 1.1 - 0.41) + max(0, 0.6 - 0 - 0.8) + max(0, 1.1 - 0.8) = 0.69 + 0 + 0.3 = 0.99
    # 6.82 + 0.6 + 0.99 + 2 = 10.41 ms
    assert predict_run(_costs(), _run("dba"))["predicted_s"] == pytest.approx(10.41 * MS)


def _synthetic_run(batch, prompt, misses_per_layer, seed, finish_ms=lambda B: 3.0 * B, full=False):
    """A run whose timed operations cost exactly: indexer 0.1 ms + 2 us per token scanned, attn 0.05 ms + 1 us
    per selected entry, finish ``finish_ms(batch)`` (3 ms per request), other 1 ms; ``full``: every other family
    too (pre_attn, plan, merge, commit per layer; embed, logits, write_back per step), 0.1 ms per request each."""
    rng = np.random.default_rng(seed)
    n_layers, steps, K = 2, 3, 8
    timer = OpTimer()
    hits = np.zeros((steps, n_layers, batch), np.int64)
    misses = np.zeros_like(hits)
    clock, step_s = 0.0, []
    for t in range(steps):
        timer.step = t
        start = clock
        for layer in range(n_layers):
            misses[t, layer] = rng.integers(0, misses_per_layer + 1, batch)
            hits[t, layer] = K - misses[t, layer]
            tokens = batch * (prompt + t)
            for op, sec in (("indexer", 0.1 * MS + 2e-6 * tokens), ("attn", 0.05 * MS + 1e-6 * batch * K),
                            ("finish", finish_ms(batch) * MS)) + (
                    tuple((op, 0.1 * MS * batch) for op in ("pre_attn", "plan", "merge", "commit")) if full else ()):
                timer.add(op, layer, clock, clock + sec)
                clock += sec
        for op in ("embed", "logits", "write_back") if full else ():
            timer.add(op, -1, clock, clock + 0.1 * MS * batch)
            clock += 0.1 * MS * batch
        clock += 1 * MS
        step_s.append(clock - start)
    cfg = {"batch": batch, "schedule": "none", "link_GB_per_s": 1.0, "entry_bytes": 100, "mode": "offload",
           "context_len": prompt, "ratio": 0.5,
           "prompt_lens": [prompt] * batch, "topk": K, "steps": steps}
    return SimpleNamespace(config=cfg, hits=hits, misses=misses, timer=timer, link_records=[],
                           step_times=lambda: np.array(step_s))


def test_the_fit_recovers_the_costs_it_was_given():
    runs = [_synthetic_run(b, p, 3, s) for s, (b, p) in enumerate([(1, 50), (2, 50), (1, 200), (3, 120)])]
    costs = fit_op_costs(runs)
    assert costs.op_s("indexer", requests=1, tokens=1000) == pytest.approx(0.1 * MS + 2e-3, rel=1e-6)
    assert costs.op_s("attn", requests=2, entries=16) == pytest.approx(0.05 * MS + 16e-6, rel=1e-6)
    assert costs.op_s("finish", requests=4) == pytest.approx(12 * MS, rel=1e-6)
    assert costs.op_s("finish", requests=1) == pytest.approx(3 * MS, rel=1e-6)     # no products: linear
    assert costs.op_s("other", requests=2) == pytest.approx(1 * MS, rel=1e-6)


def test_the_products_curve_carries_into_the_prediction():
    """The MLP's products cost 5 ms at 1 row, 8 at 2, 9 at 4 (the curve measured alone) and 11 at 3 (a BLAS kernel
    that costs more at 3 rows than at 4); the engine's finish costs the products plus 0.5 ms per request. Fitted on
    batches 1, 2 and 4 (finish = 5.5, 9 and 11 ms), the rule gives at batch 3: 11 + 1.5 = 12.5 ms; a rule linear in
    the requests through 2 and 4 would give 10 ms."""
    curve = {1: 5 * MS, 2: 8 * MS, 3: 11 * MS, 4: 9 * MS}
    runs = [_synthetic_run(b, 100, 3, s, finish_ms=lambda B: curve[B] / MS + 0.5 * B) for s, b in enumerate([1, 2, 4])]
    costs = fit_op_costs(runs, {"finish": curve})
    assert costs.coef["finish"] == pytest.approx((0.0, 0.5 * MS, 1.0), abs=1e-9)
    assert costs.op_s("finish", requests=3) == pytest.approx(12.5 * MS, rel=1e-6)
    assert costs.op_s("finish", requests=1) == pytest.approx(5.5 * MS, rel=1e-6)
    assert costs.products_part_s("finish", 3) == pytest.approx(11 * MS, rel=1e-6)    # coefficient 1 x the curve
    assert costs.products_part_s("indexer", 3) == 0.0                                 # no products feature
    with pytest.raises(ValueError, match="no product cost measured for finish at 6 rows"):
        costs.op_s("finish", requests=6)
    with pytest.raises(TypeError, match="products must be None or a dict"):
        fit_op_costs(runs, {"mlp": curve})
    with pytest.raises(ValueError, match=r"products\['finish'\]\[2\] must be"):
        fit_op_costs(runs, {"finish": {1: 5 * MS, 2: -1.0}})


def test_no_cost_per_unit_is_negative():
    """Three calibration points (selected s, misses m, seconds y) = (1, 1, 3), (2, 2, 5), (3, 4, 6), where s and m
    move together. Plain least squares solves them exactly: c0 + cs + cm = 3, c0 + 2 cs + 2 cm = 5,
    c0 + 3 cs + 4 cm = 6 give (c0, cs, cm) = (1, 3, -1), a negative cost per miss. Bounded, the best fit with no
    negative cost drops m: y on (1, s) has slope ((-1)(-5/3) + (1)(4/3)) / 2 = 1.5 and intercept 14/3 - 2 x 1.5 =
    5/3 (residual sum of squares 1/6; on (1, m) alone it is 0.64, on (s, m) alone cm = -1.8 < 0)."""
    X = np.array([[1, 1, 1.0], [1, 2, 2], [1, 3, 4]])
    y = np.array([3.0, 5.0, 6.0])
    assert np.linalg.lstsq(X, y, rcond=None)[0] == pytest.approx([1, 3, -1])
    assert nonnegative_lstsq(X, y) == pytest.approx([5 / 3, 1.5, 0.0])
    assert nonnegative_lstsq(X, -y) == pytest.approx([0.0, 0.0, 0.0])   # no non-negative cost fits a negative time


def test_product_costs_on_a_small_model():
    from engine_helpers import small_engine
    eng = small_engine()
    got = product_costs(eng.model, [3, 1, 2], clock="wall", repeats=2)
    assert set(got) == set(PRODUCTS) and all(list(c) == [1, 2, 3] for c in got.values())
    assert all(v > 0 for c in got.values() for v in c.values())
    with pytest.raises(TypeError, match="model must be a model with per-layer weights"):
        product_costs(object(), [1])
    with pytest.raises(ValueError, match=r"rows\[0\] must be a positive integer"):
        product_costs(eng.model, [0])
    with pytest.raises(ValueError, match="clock must be one of"):
        product_costs(eng.model, [1], clock="sun")


def test_a_fit_needs_runs():
    with pytest.raises(ValueError, match="at least one"):
        fit_op_costs([])


def test_the_measured_breakdown_by_hand():
    """Three steps, the first left out: step 1 has attn_b0 2 ms + attn_b1 3 ms + indexer 1 ms, step 2 attn 4 ms +
    indexer 1 ms; per step attn (2 + 3 + 4) / 2 = 4.5 ms, indexer 1 ms; steps of 10 and 8 ms leave
    9 - 5.5 = 3.5 ms outside every span."""
    timer = OpTimer()
    timer.step = 0
    timer.add("attn", 0, 0.0, 0.050)                          # step 0: not counted
    timer.step = 1
    timer.add("attn_b0", 0, 0.0, 0.002)
    timer.add("attn_b1", 0, 0.002, 0.005)
    timer.add("indexer", 0, 0.005, 0.006)
    timer.step = 2
    timer.add("attn", 0, 0.0, 0.004)
    timer.add("indexer", 0, 0.004, 0.005)
    run = SimpleNamespace(config={"steps": 3}, timer=timer, step_times=lambda: np.array([0.1, 0.010, 0.008]))
    got = measured_breakdown(run)
    assert list(got) == ["attn", "indexer", "other"]
    assert got == pytest.approx({"attn": 4.5 * MS, "indexer": 1 * MS, "other": 3.5 * MS})


def _design(**kw):
    base = dict(calibration_contexts=[40, 60], calibration_batches=[1, 2], calibration_ratio=0.5,
                calibration_links_GB_per_s=[0.05, 0.5], held_out_contexts=[50], held_out_batches=[2],
                held_out_ratio=0.75, held_out_links_GB_per_s=[0.1], steps=3)
    return CheckDesign(**{**base, **kw})


def test_the_design_lists_its_configurations():
    d = _design()
    cal = d.calibration()
    # first link: 2 contexts x (batch 1: none, da; batch 2: none, da, dba) = 10; second link at L 60, B 2: 3 more
    assert len(cal) == 13 and all(isinstance(c, CheckConfig) for c in cal)
    assert [(c.context_len, c.batch, c.decode.schedule) for c in cal[:2]] == [(40, 1, "none"), (40, 1, "da")]
    assert {c.decode.link_GB_per_s for c in cal[10:]} == {0.5} and {(c.context_len, c.batch) for c in cal[10:]} == {
        (60, 2)}
    held = d.held_out()
    assert [c.decode.schedule for c in held] == ["none", "da", "dba"] and {c.decode.ratio for c in held} == {0.75}
    assert d.contexts == [40, 50, 60] and d.max_batch == 2 and d.describe()["clock"] == "cpu"
    with pytest.raises(TypeError, match="held_out_batches must be a non-empty list"):
        _design(held_out_batches=[])
    with pytest.raises(ValueError, match="ratio"):
        _design(held_out_ratio=1.5)


def test_a_second_calibration_ratio_adds_the_largest_batch_at_every_context():
    d = _design(calibration_ratio=[0.5, 0.25])
    cal = d.calibration()
    # 10 at ratio 0.5 (as above), then 2 contexts x (B 2: none, da, dba) = 6 at 0.25, then the second link's 3
    assert len(cal) == 19 and d.calibration_ratios == (0.5, 0.25)
    assert [(c.context_len, c.batch, c.decode.ratio) for c in cal[10:16:3]] == [(40, 2, 0.25), (60, 2, 0.25)]
    assert {c.decode.ratio for c in cal[:10] + cal[16:]} == {0.5} and "ratio 0.5 and 0.25" in d.describe()[
        "calibration"]
    assert _design(calibration_ratio=[0.5]).calibration_ratio == 0.5
    with pytest.raises(ValueError, match="must not repeat"):
        _design(calibration_ratio=[0.5, 0.5])
    with pytest.raises(TypeError, match="non-empty list of ratios"):
        _design(calibration_ratio=[])
    with pytest.raises(ValueError, match=r"calibration_ratio\[1\] must be"):
        _design(calibration_ratio=[0.5, 0.0])


def test_the_whole_check_runs_on_a_small_engine():
    from engine_helpers import prompts, small_engine
    eng = small_engine()
    d = _design(clock="wall")
    pre = {L: eng.prefill(prompts([L, L], L), max_new_tokens=d.steps) for L in d.contexts}
    check = run_check(eng, d, pre, progress=False)
    assert len(check.table) == 13 + 3 and (check.table.predicted_ms > 0).all()
    assert len(check.measured_table) == 16 and check.shares.shape == (d.steps, eng.config.n_layers)
    # the prediction's products: the line through the calibration row counts (1, 2) only, of the same measurement
    from ess.studies.real_model.fit import product_line
    cal_rows = {f: {m: c[m] for m in d.calibration_batches} for f, c in check.measured_costs.products.items()}
    assert check.costs.products == product_line(cal_rows, range(1, d.max_batch + 1))
    held = check.held
    assert (held.misses_per_step != held.misses_per_step_measured).any()       # predicted, not counted
    s = check.summary()
    assert {"measured_median", "measured_worst", "measured_goal_met"} <= set(s)
    median, worst = check.held_out_errors()
    assert np.isfinite(median) and worst >= median
    gap, own = check.serial_pricing_gap()
    assert np.isfinite(gap) and np.isfinite(own)
    parts = check.breakdown(50, 2)
    assert set(parts.config) == {f"{w}: {s} 0.1 GB/s" for w in ("measured", "predicted") for s in ("none", "da",
                                                                                                       "dba")}


def _timed_run(schedule, ops_ms):
    """A held-out run of B = 4 prompts of 10 tokens at L 10, two layers, two steps, whose calls cost ``ops_ms``
    (op -> ms per call, every layer and step)."""
    timer = OpTimer()
    clock = 0.0
    for t in range(2):
        timer.step = t
        for layer in range(2):
            for op, ms in ops_ms.items():
                timer.add(op, layer, clock, clock + ms * MS)
                clock += ms * MS
    cfg = {"batch": 4, "context_len": 10, "schedule": schedule, "link_GB_per_s": 0.01, "prompt_lens": [10] * 4,
           "topk": 4, "steps": 2, "ratio": 0.5, "mode": "offload", "entry_bytes": 100}
    zeros = np.zeros((2, 2, 4), np.int64)
    return SimpleNamespace(config=cfg, timer=timer, hits=zeros, misses=zeros, step_times=lambda: np.ones(2))


def test_half_batch_ratios_by_hand():
    """Whole batch: indexer 1.0 + plan 0.2 ms per call, attention 0.5 + merge 0.1. Halves (DBA): indexer 0.6 + plan
    0.15 each, attention 0.3 + merge 0.07 each. Measured half / whole: indexer 0.75 / 1.2 = 0.625, attention
    0.37 / 0.6 = 0.61667. The rule (indexer 0.1 ms + 0.01 ms per token scanned, plan 0.2 ms, attention 0.1 ms per
    request, merge 0): at step 1 the whole batch scans 4 x 11 = 44 tokens, a half 22: indexer
    (0.1 + 0.22 + 0.2) / (0.1 + 0.44 + 0.2) = 0.52 / 0.74 = 0.70270; attention 0.2 / 0.4 = 0.5."""
    from ess.studies.real_model.check import OverlapCheck
    whole = _timed_run("none", {"indexer": 1.0, "plan": 0.2, "attn": 0.5, "merge": 0.1})
    split = _timed_run("dba", {"indexer_b0": 0.6, "plan_b0": 0.15, "indexer_b1": 0.6, "plan_b1": 0.15,
                               "attn_b0": 0.3, "merge_b0": 0.07, "attn_b1": 0.3, "merge_b1": 0.07})
    z = lambda fam, *c: (fam, tuple(c) + (0.0,) * (1 + len(FAMILIES[fam]) - len(c)))    # noqa: E731
    costs = OpCosts(dict([z("indexer", 0.1 * MS, 0.0, 0.01 * MS), z("plan", 0.2 * MS), z("attn", 0.0, 0.1 * MS),
                          z("merge", 0.0)]), {}, {}, {}, ())
    check = OverlapCheck(None, costs, None, [], [whole, split])
    r = check.half_batch_ratios().set_index("operation")
    assert r.loc["indexer", "measured_ratio"] == pytest.approx(0.625)
    assert r.loc["attention", "measured_ratio"] == pytest.approx(0.37 / 0.6)
    assert r.loc["indexer", "rule_ratio"] == pytest.approx(0.52 / 0.74)
    assert r.loc["attention", "rule_ratio"] == pytest.approx(0.5)


def test_the_check_prefills_keep_only_the_requests_their_configurations_decode():
    """Each context is prefilled with the design's largest batch (the same prompts, the same prefill whatever the
    context's configurations) and keeps only the requests they decode: the others' entries are not held through
    the check."""
    from engine_helpers import SMALL, small_engine
    from ess.studies.real_model.check import check_prefills
    eng = small_engine()
    eng.tokenizer = SimpleNamespace(encode=lambda text: [ord(ch) % SMALL.vocab_size for ch in text])
    d = _design(held_out_batches=[3])                   # L 40 and 60 decode batches 1 and 2, L 50 batch 3
    pre = check_prefills(eng, d)
    assert {L: p.batch for L, p in pre.items()} == {40: 2, 50: 3, 60: 2}
    whole = check_prefills(eng, _design(held_out_batches=[3], calibration_batches=[1, 3]))[40]
    assert whole.batch == 3 and whole.prompt_ids[:2] == pre[40].prompt_ids
    assert all(torch.equal(a, b) for a, b in zip(whole.entries, pre[40].entries))


# ------------------------------------------------------------------ the prediction: what a held-out run may lend it

def _perturbed(run, seed):
    """``run`` with its timings scaled (every operation x 3, every step x 3) and its hits and misses redrawn: what a
    held-out run measured, changed entirely."""
    import copy
    rng = np.random.default_rng(seed)
    out = copy.copy(run)
    timer = OpTimer()
    for r in run.timer.records:
        timer.step = r.step
        timer.add(r.op, r.layer, 3 * r.start_s, 3 * r.end_s)
    K = run.config["topk"]
    out.timer, out.misses = timer, rng.integers(0, K + 1, run.misses.shape)
    out.hits = K - out.misses
    times = 3 * run.step_times()
    out.step_times = lambda: times
    return out


def test_nothing_a_held_out_run_measured_enters_the_fit_or_the_prediction():
    """Fitted on calibration runs, the held-out run (batch 3) predicted with miss shares: scaling its timings x 3
    and redrawing its hits and misses leaves every fitted cost and its predicted step unchanged (only the measured
    step moves). Priced with its own counts (the variant with measured inputs), the same perturbation moves the
    prediction: the test can tell."""
    from ess.studies.real_model.fit import check_runs, miss_shares  # noqa: F401
    cal = [_synthetic_run(b, p, 3, s, full=True) for s, (b, p) in enumerate([(1, 50), (2, 50), (1, 200), (2, 120)])]
    held = _synthetic_run(3, 80, 6, 9, full=True)
    shares = np.full((3, 2), 0.25)
    costs, table = check_runs(cal, [held], shares=shares)
    costs2, table2 = check_runs(cal, [_perturbed(held, 1)], shares=shares)
    assert costs.coef == costs2.coef and costs.link_latency_s == costs2.link_latency_s
    a, b = table.iloc[-1], table2.iloc[-1]
    assert a.role == "held out" and a.predicted_ms == b.predicted_ms and b.measured_ms == pytest.approx(
        3 * a.measured_ms)
    assert a.misses_per_step == b.misses_per_step != b.misses_per_step_measured
    _, own = check_runs(cal, [held])
    _, own2 = check_runs(cal, [_perturbed(held, 1)])
    assert own.iloc[-1].predicted_ms != own2.iloc[-1].predicted_ms


def test_predicted_counts_by_hand():
    """Shares 0.25 at step 1 (layer 0) and 0.5 (layer 1); K = 8, prompts of 5 and 20 tokens: at step 1 request 0
    selects min(8, 6) = 6 entries (1.5 and 3 misses), request 1 selects 8 (2 and 4 misses); hits the rest."""
    from ess.studies.real_model.fit import with_predicted_counts
    run = SimpleNamespace(config={"topk": 8, "prompt_lens": [5, 20]}, misses=np.zeros((2, 2, 2)),
                          hits=np.zeros((2, 2, 2)))
    got = with_predicted_counts(run, np.array([[0.0, 0.0], [0.25, 0.5]]))
    assert got.misses[1].tolist() == [[1.5, 2.0], [3.0, 4.0]] and got.hits[1].tolist() == [[4.5, 6.0], [3.0, 4.0]]
    assert run.misses.sum() == 0                                         # the run itself is untouched
    with pytest.raises(ValueError, match="shares must be"):
        with_predicted_counts(run, np.zeros((1, 2)))


def test_the_cache_simulation_replays_the_engines_misses():
    """The top-K sets recorded on the calibration prompts, replayed through a pool of another ratio, give the
    engine's own misses at that ratio: summed over the requests (same prompt lengths), step by step and layer by
    layer, exactly. What the prediction's counts rest on."""
    from engine_helpers import prompts, small_engine
    from ess.studies.real_model.check import record_traces
    from ess.studies.real_model.fit import miss_shares, with_predicted_counts
    eng = small_engine()
    d = _design(clock="wall")
    pre = {L: eng.prefill(prompts([L, L], L), max_new_tokens=d.steps) for L in d.calibration_contexts}
    traces = record_traces(eng, pre, d)
    assert [t.context_len for t in traces] == [40, 60] and all(t.steps == d.steps for t in traces)
    for ratio in (0.5, 0.75):
        run = eng.decode(pre[60], d.steps, ratio=ratio, schedule="da", link_GB_per_s=0.5)
        got = with_predicted_counts(run, miss_shares(traces[1:], eng.format, ratio))
        assert got.misses.sum(axis=2) == pytest.approx(run.misses.sum(axis=2))
        assert run.misses.sum() > 0
    with pytest.raises(ValueError, match="ratio"):
        miss_shares(traces, eng.format, 1.5)
    with pytest.raises(TypeError, match=r"traces\[0\]"):
        miss_shares([object()], eng.format, 0.5)


def test_the_held_out_set_is_the_one_written_down_before_its_first_run():
    """Notebook 09's held-out set is the one in data/calibration/engine_check.yaml, whose hash was written beside it
    before its first run; a set changed in the notebook (or in the file) without a fresh entry fails here."""
    import yaml
    from ess.studies.real_model.check import held_out_sha256
    from ess.studies.real_model.repeat_check import notebook_design
    from ess.specs import DATA_DIR
    entry = yaml.safe_load((DATA_DIR / "calibration" / "engine_check.yaml").read_text())
    assert held_out_sha256(entry["held_out"]["value"]) == entry["held_out"]["sha256"]
    design, _ = notebook_design()
    assert design.held_out_set() == entry["held_out"]["value"]
    assert design.held_out_set() != entry["spent_held_out"]["value"]


# ------------------------------------------------------------------ the pieces under the fit, by hand

def test_each_half_of_a_split_batch_is_sized_by_its_own_requests():
    """B = 3 (halves: requests 0-1 and 2), prompts of 10, 20 and 40 tokens, K = 8, step 1: indexer_b0 scans
    11 + 21 = 32 tokens over 2 requests, indexer_b1 41 over 1; attn_hits gathers the hits (2 + 3 + 4), attn_misses
    the misses (6 + 5 + 4) over all three."""
    from ess.studies.real_model.measure import op_samples
    timer = OpTimer()
    timer.step = 1
    for i, op in enumerate(("indexer_b0", "indexer_b1", "attn_hits", "attn_misses")):
        timer.add(op, 0, i * MS, (i + 1) * MS)
    hits = np.array([[[0, 0, 0]], [[2, 3, 4]]])
    misses = np.array([[[0, 0, 0]], [[6, 5, 4]]])
    run = SimpleNamespace(config={"batch": 3, "prompt_lens": [10, 20, 40], "topk": 8, "steps": 2}, timer=timer,
                          hits=hits, misses=misses, step_times=lambda: np.array([1.0, 0.004]))
    df = op_samples(run).set_index(["family", "requests"])
    ind = op_samples(run)
    ind = ind[ind.family == "indexer"].sort_values("requests")
    assert ind[["requests", "tokens", "selected"]].to_numpy().tolist() == [[1, 41, 8], [2, 32, 16]]
    attn = op_samples(run)
    attn = attn[attn.family == "attn"]
    assert attn.entries.tolist() == [9, 15] and (attn.requests == 3).all()
    assert len(df) == 5                                   # four calls and the step's "other" row


def test_link_jobs_from_the_first_timed_step_by_hand():
    """Steps start at their embed (0 and 10 ms); only jobs submitted from step 1's start count. The job at 11 ms
    waits 0.5 ms to start, crosses 2 ms, and its waiter returns 0.3 ms after it lands; it found the link idle and
    its caller began waiting (1.8 ms before it returned) before it landed: blocked. The next, submitted at 12 ms while
    the first crosses, is not idle, and its caller began waiting after it landed (``waited_s`` is how long the wait
    took)."""
    from ess.studies.real_model.measure import link_samples
    timer = OpTimer()
    for t, start in ((0, 0.0), (1, 0.010)):
        timer.step = t
        timer.add("embed", -1, start, start + 0.0001)
    jobs = [{"kind": "h2d", "layer": 0, "nbytes": 100, "submit_s": 0.001, "start_s": 0.001, "end_s": 0.002,
             "returned_s": 0.002, "waited_s": 0.002},
            {"kind": "h2d", "layer": 0, "nbytes": 2000, "submit_s": 0.011, "start_s": 0.0115, "end_s": 0.0135,
             "returned_s": 0.0138, "waited_s": 0.0018},
            {"kind": "d2h", "layer": 1, "nbytes": 50, "submit_s": 0.012, "start_s": 0.0135, "end_s": 0.014,
             "returned_s": 0.015, "waited_s": 0.0005}]
    run = SimpleNamespace(config={"link_GB_per_s": 0.001}, timer=timer, link_records=jobs)
    df = link_samples(run)
    assert df.bytes.tolist() == [2000, 50]
    assert df.queue_s.tolist() == pytest.approx([0.0005, 0.0015]) and df.cross_s.tolist() == pytest.approx([0.002,
                                                                                                            0.0005])
    assert df.resume_s.tolist() == pytest.approx([0.0003, 0.001])
    assert df.idle.tolist() == [True, False] and df.blocked.tolist() == [True, False]


def test_the_paced_link_latency_by_hand():
    """Paced jobs at 0.001 GB/s (1e6 B/s) crossing bytes / 1e6 + 0.4 ms, each waking 0.1 ms after submission on an
    idle link and returning 0.2 ms after landing to a blocked waiter: latency = wake 0.1 + overshoot 0.4 + resume
    0.2 = 0.7 ms; a 1,000-byte job is then priced 0.7 + 1 = 1.7 ms."""
    from ess.studies.real_model.fit import fit_op_costs
    run = _synthetic_run(2, 50, 3, 0, full=True)
    jobs, t = [], [r.start_s for r in run.timer.records if r.op == "embed"][1]       # from step 1's start on
    for n in (1000, 3000, 500):
        submit, start = t, t + 0.0001
        end = start + n / 1e6 + 0.0004
        jobs.append({"kind": "h2d", "layer": 0, "nbytes": n, "submit_s": submit, "start_s": start, "end_s": end,
                     "returned_s": end + 0.0002, "waited_s": submit})
        t = end + 0.001
    run.link_records = jobs
    run.config["link_GB_per_s"] = 0.001
    costs = fit_op_costs([run])
    assert costs.link_latency_s["h2d"] == pytest.approx(0.0007)
    assert costs.link_s("h2d", 1000, 0.001) == pytest.approx(0.0017)


def test_a_rows_numbers_are_its_prediction_and_measurement():
    """check_runs' row of a configuration: predicted_ms and measured_ms are predict_run's seconds x 1000 and error
    their ratio minus one."""
    from ess.studies.real_model.fit import check_runs
    cal = [_synthetic_run(b, p, 3, s, full=True) for s, (b, p) in enumerate([(1, 50), (2, 50), (1, 200), (2, 120)])]
    held = _synthetic_run(3, 80, 6, 9, full=True)
    costs, table = check_runs(cal, [held])
    p = predict_run(costs, held)
    row = table.iloc[-1]
    assert row.predicted_ms == pytest.approx(p["predicted_s"] * 1e3) and row.measured_ms == pytest.approx(
        p["measured_s"] * 1e3)
    assert row.error == pytest.approx(p["predicted_s"] / p["measured_s"] - 1) and row.measured_ms > 1.0


def test_the_serial_gap_and_the_breakdown_price_the_predicted_counts():
    """A held-out DA run whose own misses (up to 6 per request and layer) differ from the predicted ones (shares 0):
    the serial formula's gap is |predicted / measured - 1| of the run priced with the predicted counts (here: no
    copy at all, so the serial price is the serial work alone), and the breakdown's predicted parts are the same
    run's; priced with its own counts both would differ."""
    from ess.studies.real_model.check import OverlapCheck
    from ess.studies.real_model.fit import check_runs, with_predicted_counts
    cal = [_synthetic_run(b, p, 3, s, full=True) for s, (b, p) in enumerate([(1, 50), (2, 50), (1, 200), (2, 120)])]
    held = _synthetic_run(3, 80, 6, 9, full=True)
    held.config["schedule"] = "da"
    shares = np.zeros((3, 2))
    costs, table = check_runs(cal, [held], shares=shares)
    check = OverlapCheck(None, costs, table, cal, [held], shares=shares)
    priced = with_predicted_counts(held, shares)
    p = predict_run(costs, priced, schedule="none")
    gap, own = check.serial_pricing_gap()
    assert gap == pytest.approx(abs(p["predicted_s"] / p["measured_s"] - 1))
    assert own == pytest.approx(abs(table.iloc[-1].error))
    assert p["predicted_s"] != predict_run(costs, held, schedule="none")["predicted_s"]       # the counts matter
    parts = check.breakdown(80, 3)
    pred = parts[parts.config.str.startswith("predicted")].set_index("part").ms
    assert pred.to_dict() == pytest.approx({k: v * 1e3 for k, v in predict_run(costs, priced)["breakdown_s"].items()})


def test_the_summary_by_hand(monkeypatch):
    """Held-out errors +2 %, -4 %, +10 % (median 4 %, worst 10 % at B=6), calibration errors 1 % and -3 % (median 2 %,
    worst 3 %), measured-input errors 1 %, 2 %, -20 %; products' shares 0.3, 0.5, 0.4."""
    import pandas as pd
    from ess.studies.real_model.check import OverlapCheck
    rows = [("calibration", 1, 0.01, 0.2), ("calibration", 2, -0.03, 0.2), ("held out", 3, 0.02, 0.3),
            ("held out", 4, -0.04, 0.5), ("held out", 6, 0.10, 0.4)]
    table = pd.DataFrame([{"role": r, "batch": b, "context_len": 64, "schedule": "da", "link_GB_per_s": 0.01,
                           "error": e, "products_share": s} for r, b, e, s in rows])
    measured = table.assign(error=[0.0, 0.0, 0.01, 0.02, -0.20])
    check = OverlapCheck(None, None, table, [], [], measured_table=measured)
    monkeypatch.setattr(OverlapCheck, "serial_pricing_gap", lambda self: (0.3, 0.04))
    s = check.summary()
    assert s["median"] == pytest.approx(0.04) and s["worst"] == pytest.approx(0.10)
    assert s["worst_config"] == "B=6 L=64 da link=0.01 (+10.0%)" and s["goal_met"] is True      # 4 <= 5, 10 <= 15
    assert s["calibration_median"] == pytest.approx(0.02) and s["calibration_worst"] == pytest.approx(0.03)
    assert s["products_share_median"] == pytest.approx(0.4) and s["products_share_max"] == pytest.approx(0.5)
    assert s["measured_median"] == pytest.approx(0.02) and s["measured_worst"] == pytest.approx(0.20)
    assert s["measured_goal_met"] is False and (s["serial_gap"], s["own"]) == (0.3, 0.04)


def test_the_products_line_by_hand():
    """Costs 4, 5, 9 at rows 1, 2, 4: the least-squares line through them is a + b m with b = sum (m - 7/3)(y - 6) /
    sum (m - 7/3)^2 = (4/3 x 2 + 1/3 x 1 + 5/3 x 3) / (16/9 + 1/9 + 25/9) = (8/3 + 1/3 + 5) / (42/9) = 8 x 9 / 42 =
    12/7 and a = 6 - 12/7 x 7/3 = 2: at 3 rows 2 + 36/7, at 6 rows 2 + 72/7. A falling curve gets no negative
    slope: 5, 4, 3 at 1, 2, 4 rows give the flat mean 4."""
    from ess.studies.real_model.fit import product_line
    got = product_line({"finish": {1: 4.0, 2: 5.0, 4: 9.0}, "logits": {1: 5.0, 2: 4.0, 4: 3.0}}, [3, 6])
    assert got["finish"] == pytest.approx({3: 2 + 36 / 7, 6: 2 + 72 / 7})
    assert got["logits"] == pytest.approx({3: 4.0, 6: 4.0})
    with pytest.raises(ValueError, match=r"rows\[0\]"):
        product_line({"finish": {1: 1.0}}, [0])


def test_the_trimmed_mean_by_hand():
    """Ten values of 0.001 and 11..20: 10 % each side drops two of each end, leaving eight of 0.001 and 11..18, mean
    (0.008 + 116) / 16 (20 % would drop four a side); fewer than 5 values: the plain mean; from 5 values on at least
    one a side."""
    from ess.studies.real_model.measure import _trimmed_mean
    x = [0.001] * 10 + list(range(11, 21))
    assert _trimmed_mean(x) == pytest.approx((8 * 0.001 + sum(range(11, 19))) / 16)
    assert _trimmed_mean([1, 2, 100]) == pytest.approx(103 / 3)
    assert _trimmed_mean([1, 2, 3, 4, 100]) == pytest.approx(3.0)


def test_a_steps_lanes_are_the_jobs_submitted_while_it_ran():
    """Step 1 runs from 10 to 20 ms (two operations, 10-12 and 18-20 ms): jobs submitted at 11 and 19 ms are its,
    one at 5 ms (step 0) and one at 25 ms (after it) are not."""
    from ess.studies.real_model.measure import step_lanes
    timer = OpTimer()
    timer.step = 0
    timer.add("embed", -1, 0.0, 0.005)
    timer.step = 1
    timer.add("embed", -1, 0.010, 0.012)
    timer.add("attn", 0, 0.018, 0.020)
    job = lambda t: {"kind": "h2d", "layer": 0, "nbytes": 1, "submit_s": t, "start_s": t, "end_s": t,  # noqa: E731
                     "returned_s": t, "waited_s": 0.0}
    run = SimpleNamespace(timer=timer, link_records=[job(0.005), job(0.011), job(0.019), job(0.025)])
    ops, link = step_lanes(run, 1)
    assert list(ops.op) == ["embed", "attn"] and link.submit_s.tolist() == [0.011, 0.019]


def test_product_costs_are_seconds_of_the_products_alone():
    """Each product's cost is the clock's difference over the call (not a sum of clock readings): a small model's
    products take well under a second."""
    from engine_helpers import small_engine
    got = product_costs(small_engine().model, [1, 2], clock="wall", repeats=2)
    assert all(0 < v < 0.5 for c in got.values() for v in c.values())


def test_a_batch_of_two_is_split_too():
    """Dual-batch attention splits a batch of two into two requests of one: its half-batch ratio is measured (only a
    batch of one, never split, is left out)."""
    from ess.studies.real_model.check import OverlapCheck
    runs = []
    for schedule, ops in (("none", {"indexer": 1.0, "plan": 0.2, "attn": 0.5, "merge": 0.1}),
                          ("dba", {"indexer_b0": 0.6, "plan_b0": 0.15, "indexer_b1": 0.6, "plan_b1": 0.15,
                                   "attn_b0": 0.3, "merge_b0": 0.07, "attn_b1": 0.3, "merge_b1": 0.07})):
        r = _timed_run(schedule, ops)
        r.config = {**r.config, "batch": 2, "prompt_lens": [10, 10]}
        runs.append(r)
    costs = OpCosts({f: (0.1 * MS,) + (0.0,) * len(FAMILIES[f]) for f in ("indexer", "plan", "attn", "merge")},
                    {}, {}, {}, ())
    got = OverlapCheck(None, costs, None, [], runs).half_batch_ratios()
    assert set(got.batch) == {2} and got.set_index("operation").loc["indexer", "measured_ratio"] == pytest.approx(
        0.625)


def test_each_layers_operations_are_sized_by_that_layers_counts():
    """Two layers with different hits and misses at step 1: each layer's attention rows carry that layer's own
    counts (a mistake that read layer 0's counts for every layer passes a one-layer run)."""
    from ess.studies.real_model.measure import op_samples
    timer = OpTimer()
    timer.step = 1
    for layer in (0, 1):
        timer.add("attn_hits", layer, layer * MS, (layer + 0.5) * MS)
        timer.add("attn_misses", layer, (layer + 0.5) * MS, (layer + 1) * MS)
    hits = np.array([[[0, 0], [0, 0]], [[2, 3], [6, 7]]])          # (steps, layers, requests)
    misses = np.array([[[0, 0], [0, 0]], [[2, 1], [1, 0]]])
    run = SimpleNamespace(config={"batch": 2, "prompt_lens": [10, 20], "topk": 8, "steps": 2}, timer=timer,
                          hits=hits, misses=misses, step_times=lambda: np.array([1.0, 0.003]))
    attn = op_samples(run)
    attn = attn[attn.family == "attn"].sort_values(["layer", "entries"])
    assert attn[["layer", "entries"]].to_numpy().tolist() == [[0, 3], [0, 5], [1, 1], [1, 13]]


def test_miss_shares_pool_only_the_steps_every_trace_holds():
    """Two traces of 3 and 5 steps: the shares have 3 steps, and equal those of the longer trace cut to 3 steps
    pooled with the shorter (a rule that took the most steps would index past the shorter trace)."""
    from ess.layout import entry_format
    from ess.specs import model_spec
    from ess.studies.real_model.fit import miss_shares
    from ess.traces import Trace
    rng = np.random.default_rng(3)

    def trace(steps, L=64, k=8):
        idx = np.stack([np.sort(rng.choice(L, k, replace=False)) for _ in range(steps)])[None, None]
        return Trace(idx.astype(np.int32), L, k, 1)

    fmt = entry_format(model_spec("tiny"))
    short, long_ = trace(3), trace(5)
    got = miss_shares([short, long_], fmt, 0.25)
    cut = Trace(np.ascontiguousarray(long_.indices[:, :, :3]), 64, 8, 1)
    assert got.shape == (3, 1)
    assert got == pytest.approx(miss_shares([short, cut], fmt, 0.25))
    assert (got > 0).any()
