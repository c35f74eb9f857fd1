"""Hostile probes of the what-if grid (ess.sim.grid) and the planner (ess.plan): what a careless or hostile user
passes to a grid entry -- contexts of 0, fractions, NaN or text, a ratio ceiling above 1, a reversed link-speed span,
zero or a billion bisection steps, a GPU on a link it cannot use, a GPU the grid has no deployment for, frames
without the grid's columns, several threads on one set of inputs -- each classified by :mod:`hostile`. Random junk
is drawn from a fixed seed; the miss tables are fakes (no cache simulation), so that the whole file runs in
seconds."""
from __future__ import annotations

import math
import threading

import numpy as np
import pandas as pd
import pytest

import ess
from ess.sim import grid as sgrid
from ess.sim.costs import CostParams
from ess.sim.misses import BandSizes
from ess.specs import gpu_spec, host_link_spec, list_deployments, list_gpus, list_host_links
from ess.locality import locality_alternatives
from hostile import Probe, ProbeError, bad_rows, run_probes
from test_sim_grid import FakeTable

MODEL = "deepseek-v3.2"
SEED = 20260
_INPUTS: list = []


def inputs() -> sgrid.GridInputs:
    """One set of grid inputs on fake miss tables, made on first use."""
    if not _INPUTS:
        p = CostParams(0.6, 1.2, 46.0, fitted_on="a probe")
        locs = list(locality_alternatives())
        inp = sgrid.GridInputs(p, {"central": p}, {}, locs, BandSizes(steps=8, batch=1, band_batch=1))
        for i, loc in enumerate(locs):
            inp.tables[(MODEL, loc.name, "paper")] = FakeTable(MODEL, 1.0 + 0.3 * i)
        inp.tables[(MODEL, locs[0].name, "flat")] = FakeTable(MODEL, 0.7)
        _INPUTS.append(inp)
    return _INPUTS[0]


def found() -> pd.DataFrame:
    cells = sgrid.grid_cells([MODEL], ["H200"], [32768], links=["pcie5-flashtrans"])
    return sgrid.grid_search(cells, inputs())


def cells(L=32768, **kw):
    return lambda tmp: sgrid.grid_cells([MODEL], ["H200"], [L], **kw)


def _all_refused(calls, words):
    """Every call raises a TypeError / ValueError naming one of ``words``; the first that does not is re-raised
    or reported as silent."""
    for i, call in enumerate(calls):
        try:
            out = call()
        except (TypeError, ValueError) as exc:
            if not any(w in str(exc) for w in words):
                raise
            continue
        raise ProbeError(f"case {i} accepted: {out!r:.120}")


def random_fractional_contexts(tmp):
    rng = np.random.default_rng(SEED)
    values = list(rng.uniform(1, 200000, 20)) + [float(x) + 0.5 for x in rng.integers(1, 10 ** 5, 5)]
    _all_refused([lambda v=v: sgrid.grid_cells([MODEL], ["H200"], [v]) for v in values], ("contexts[0]",))
    _all_refused([lambda v=v: sgrid.ratio_grid(MODEL, v, 2) for v in values], ("context_len",))
    _all_refused([lambda v=v: ess.plan(MODEL, "H200", v) for v in values[:5]], ("context_len",))


def random_spans(tmp):
    """Reversed, empty, non-positive or non-finite spans, drawn at random: each refused naming ``span``."""
    rng = np.random.default_rng(SEED + 1)
    a, b = np.sort(rng.uniform(0.1, 100.0, (2, 10)), axis=0)
    spans = [(hi, lo) for lo, hi in zip(a, b)] + [(x, x) for x in a[:3]] + [(-x, 1.0) for x in a[:3]] \
        + [(x, math.inf) for x in a[:2]] + [(math.nan, x) for x in b[:2]]
    f = found()
    _all_refused([lambda s=s: sgrid.break_even_link(f, inputs(), span=s) for s in spans], ("span",))
    _all_refused([lambda s=s: sgrid.overlap_links(f, inputs(), span=s) for s in spans], ("span",))


def every_listed_gpu(tmp):
    """Every GPU of list_gpus(): priced by the grid and the planner, or refused naming it."""
    for g in list_gpus():
        if g != "H200" and f"paper-shape-{g.lower()}" not in list_deployments():
            _all_refused([lambda: sgrid.grid_cells([MODEL], [g], [32768]), lambda: ess.plan(MODEL, g, 32768),
                          lambda: sgrid.cell_provenance(MODEL, g)], (repr(g),))
            continue
        if sgrid.grid_cells([MODEL], [g], [32768]).empty:
            raise ProbeError(f"{g}: no cell")


def every_link_that_cannot_serve(tmp):
    """Each (GPU, link) pair where the link cannot serve the GPU: refused by the cell view, the evaluation and the
    planner, naming the link."""
    pairs = [(g, ln) for g in ("H200", "GB200", "B300") for ln in list_host_links()
             if not host_link_spec(ln).serves(gpu_spec(g))]
    if not pairs:
        raise ProbeError("no pair to probe")
    calls = []
    for g, ln in pairs:
        calls += [lambda g=g, ln=ln: sgrid.cell_view(inputs(), MODEL, g, ln, 32768, 2),
                  lambda g=g, ln=ln: sgrid.evaluate_configs(inputs(), MODEL, g, ln, 32768, [8], [0.5]),
                  lambda g=g, ln=ln: ess.plan(MODEL, g, 32768, link=ln)]
    _all_refused(calls, ("link",))


def threads_agree(tmp):
    """Four threads asking the cell view of one set of inputs give what one thread gives."""
    args = [(L, r) for L in (16384, 32768) for r in (0.2, 0.5)]
    serial = [sgrid.cell_view(inputs(), MODEL, "H200", "pcie5", L, 2, r).best_throughput for L, r in args]
    got = [None] * len(args)

    def work(i):
        L, r = args[i]
        got[i] = sgrid.cell_view(inputs(), MODEL, "H200", "pcie5", L, 2, r).best_throughput

    ts = [threading.Thread(target=work, args=(i,)) for i in range(len(args))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if got != serial:
        raise ProbeError(f"threads gave {got}, one thread {serial}")


def a_valid_cell(tmp):
    """The sensible case next to the hostile ones: a cell's view and its evaluation agree, and pay."""
    v = sgrid.cell_view(inputs(), MODEL, "H200", "pcie5", 32768, 2, 0.3)
    ev = sgrid.evaluate_configs(inputs(), MODEL, "H200", "pcie5", 32768, [v.best_batch], [0.3])
    if not (v.gain_pct and v.gain_pct > 0 and math.isclose(ev.throughput_per_gpu.iloc[0], v.best_throughput,
                                                             rel_tol=1e-9)):
        raise ProbeError(f"view {v.best_throughput} against evaluation {ev.throughput_per_gpu.iloc[0]}")


def duplicated_ratios(tmp):
    """The same ratio twice is searched once (not a second row, not an error)."""
    c = sgrid.grid_cells([MODEL], ["H200"], [32768], links=["pcie5"])
    a = sgrid.grid_search(c, inputs(), ratios=[0.5, 0.5, 0.3])
    b = sgrid.grid_search(c, inputs(), ratios=[0.3, 0.5])
    if a.ratios_tried.iloc[0] != [0.3, 0.5] or a.throughput.iloc[0] != b.throughput.iloc[0]:
        raise ProbeError(f"{a.ratios_tried.iloc[0]}: {a.throughput.iloc[0]} against {b.throughput.iloc[0]}")


def _inputs_with(**kw):
    p = CostParams(0.6, 1.2, 46.0)
    base = {"sizes": BandSizes(steps=8, batch=1, band_batch=1), "store": False, **kw}
    return lambda tmp: sgrid.GridInputs(p, {"central": p}, {}, list(locality_alternatives()), **base)


def refused(name: str, fn, names: tuple) -> Probe:
    """A probe whose call must be refused with an error naming one of ``names``: an answer is silent."""
    def probe(tmp):
        fn(tmp)
        return "silent"
    return Probe("grid", name, probe, names)


G = "grid"
PROBES = [
    # contexts
    refused("cells: context 0", cells(0), ("contexts",)),
    refused("cells: context -32768", cells(-32768), ("contexts",)),
    refused("cells: context 2.5", cells(2.5), ("contexts",)),
    refused("cells: context NaN", cells(math.nan), ("contexts",)),
    refused("cells: context '32k'", cells("32k"), ("contexts",)),
    refused("cells: context True", cells(True), ("contexts",)),
    refused("cells: long context 1.5M", lambda tmp: sgrid.grid_cells([MODEL], ["H200"], [32768],
                                                                       long_contexts=[1.5 * 2 ** 20]),
          ("long_contexts",)),
    refused("cells: contexts past the model", cells(10 ** 9), ("contexts", MODEL)),
    refused("cells: gpus as one string", lambda tmp: sgrid.grid_cells([MODEL], "H200", [32768]), ("gpus",)),
    refused("cells: contexts as one string", lambda tmp: sgrid.grid_cells([MODEL], ["H200"], "32768"),
          ("contexts",)),
    Probe(G, "cells: random fractional contexts", random_fractional_contexts),
    refused("ratio grid: context NaN", lambda tmp: sgrid.ratio_grid(MODEL, math.nan, 2), ("context_len",)),
    refused("cell view: context -1", lambda tmp: sgrid.cell_view(inputs(), MODEL, "H200", "pcie5", -1, 2),
          ("context_len",)),
    refused("evaluate: context 32768.5", lambda tmp: sgrid.evaluate_configs(inputs(), MODEL, "H200", "pcie5",
                                                                               32768.5, [8], [0.5]), ("context_len",)),
    refused("plan: context 2**40", lambda tmp: ess.plan(MODEL, "H200", 2 ** 40), ("context_len",)),
    refused("plan: context '32k' as a number", lambda tmp: ess.plan(MODEL, "H200", "32k"), ("context_len",)),
    # ratios and their ceiling
    refused("ratio grid: ceiling 1.5", lambda tmp: sgrid.ratio_grid(MODEL, 32768, 2, top=1.5), ("top",)),
    refused("ratio grid: ceiling NaN", lambda tmp: sgrid.ratio_grid(MODEL, 32768, 2, top=math.nan), ("top",)),
    refused("ratio grid: a billion ratios", lambda tmp: sgrid.ratio_grid(MODEL, 32768, 2, n=10 ** 9), ("n",)),
    refused("search: ratio 1.5", lambda tmp: sgrid.grid_search(cells()(tmp), inputs(), ratios=[1.5]),
          ("ratios",)),
    refused("search: ratio NaN", lambda tmp: sgrid.grid_search(cells()(tmp), inputs(), ratios=[math.nan]),
          ("ratios",)),
    Probe(G, "search: the same ratio twice", duplicated_ratios),
    refused("cell view: ratio True", lambda tmp: sgrid.cell_view(inputs(), MODEL, "H200", "pcie5", 32768, 2,
                                                                  True), ("ratio",)),
    refused("plan: ratio 1.5", lambda tmp: ess.plan(MODEL, "H200", 32768, ratio=1.5), ("ratio",)),
    refused("plan: ratio NaN", lambda tmp: ess.plan(MODEL, "H200", 32768, ratio=math.nan), ("ratio",)),
    # counts and flags
    refused("search: n_ratios 0", lambda tmp: sgrid.grid_search(cells()(tmp), inputs(), n_ratios=0),
          ("n_ratios",)),
    refused("search: check_memory 'no'", lambda tmp: sgrid.grid_search(cells()(tmp), inputs(), check_memory="no"),
          ("check_memory",)),
    refused("search: mtp 2.5", lambda tmp: sgrid.grid_search(cells()(tmp), inputs(), mtp=2.5), ("mtp",)),
    refused("plan: mtp True", lambda tmp: ess.plan(MODEL, "H200", 32768, mtp=True), ("mtp",)),
    refused("plan: mtp 2.0", lambda tmp: ess.plan(MODEL, "H200", 32768, mtp=2.0), ("mtp",)),
    refused("break-even: iterations 0", lambda tmp: sgrid.break_even_link(found(), inputs(), iterations=0),
          ("iterations",)),
    refused("break-even: iterations -3", lambda tmp: sgrid.break_even_link(found(), inputs(), iterations=-3),
          ("iterations",)),
    refused("break-even: a billion iterations",
          lambda tmp: sgrid.break_even_link(found(), inputs(), iterations=10 ** 9), ("iterations",)),
    refused("overlap: iterations 2.5", lambda tmp: sgrid.overlap_links(found(), inputs(), iterations=2.5),
          ("iterations",)),
    refused("inputs: sizes steps 2.5", lambda tmp: BandSizes(steps=2.5), ("steps",)),
    refused("inputs: sizes a tuple", _inputs_with(sizes=(8, 1, 1)), ("sizes",)),
    refused("inputs: store 'no'", _inputs_with(store="no"), ("store",)),
    refused("grid_inputs: stored 0", lambda tmp: sgrid.grid_inputs(stored=0), ("stored",)),
    # tolerances and spans
    refused("overlap: tolerance -0.1", lambda tmp: sgrid.overlap_links(found(), inputs(), tolerance=-0.1),
          ("tolerance",)),
    refused("overlap: tolerance NaN", lambda tmp: sgrid.overlap_links(found(), inputs(), tolerance=math.nan),
          ("tolerance",)),
    refused("overlap: tolerance '1%'", lambda tmp: sgrid.overlap_links(found(), inputs(), tolerance="1%"),
          ("tolerance",)),
    refused("break-even: span reversed", lambda tmp: sgrid.break_even_link(found(), inputs(), span=(5000, 0.5)),
          ("span",)),
    refused("overlap: span of one value", lambda tmp: sgrid.overlap_links(found(), inputs(), span=(10.0,)),
          ("span",)),
    refused("break-even: span as text", lambda tmp: sgrid.break_even_link(found(), inputs(), span="ab"),
          ("span",)),
    Probe(G, "random spans", random_spans),
    # GPUs and links
    Probe(G, "every listed GPU", every_listed_gpu),
    Probe(G, "every link that cannot serve", every_link_that_cannot_serve),
    refused("cells: a link no GPU here uses", lambda tmp: sgrid.grid_cells([MODEL], ["H200"], [32768],
                                                                            links=["c2c-gb300"]), ("links",)),
    refused("cells: an unknown link", lambda tmp: sgrid.grid_cells([MODEL], ["H200"], [32768], links=["pcie9"]),
          ("pcie9",)),
    refused("plan: an unknown GPU", lambda tmp: ess.plan(MODEL, "H9000", 32768), ("gpu",)),
    refused("plan: a GPU as a list", lambda tmp: ess.plan(MODEL, ["H200"], 32768), ("gpu",)),
    # frames
    refused("search: an empty frame", lambda tmp: sgrid.grid_search(pd.DataFrame(), inputs()), ("cells",)),
    refused("break-even: a frame without the search's columns",
          lambda tmp: sgrid.break_even_link(cells()(tmp), inputs()), ("found",)),
    refused("bands: a frame without the search's columns", lambda tmp: sgrid.grid_bands(cells()(tmp), inputs()),
          ("found",)),
    # what works
    Probe(G, "a valid cell", a_valid_cell),
    Probe(G, "threads on one set of inputs", threads_agree),
]


def test_grid_probes(tmp_path_factory):
    rows = run_probes(PROBES, lambda name: tmp_path_factory.mktemp("grid"))
    assert len(rows) == len(PROBES) and {r["area"] for r in rows} == {"grid"}
    assert bad_rows(rows) == []
