"""Every notebook with a widget, run in JupyterLab in a real browser (smoke sizes): each control is moved with the
keyboard, mouse or a selection, and the page must then show what the library's pure view function gives for the
new setting — the plotly figure's data read from its DOM element, and the summary and note text. The time from the
control's event to the new figure drawn is measured and written to ``build/screenshots/timings.json`` (the goal is
200 ms; it is reported, never asserted). The live monitor of notebook 02 is watched while its cell runs: its figure
must grow step by step and its progress bar reach the end.

The faults these tests once marked as known (a link slider that changed nothing, a log slider that snapped 37 to
39.8, an accept ratio above MTP silently replaced, an empty plot for an infeasible setting, a cut-off label) are
checked as the widgets now behave."""
from __future__ import annotations

import json

import pytest

import widget_notebooks as W
from ess.widgets.memory import CONTEXTS as MEMORY_CONTEXTS
from ess.widgets.memory import memory_budget_view
from ess.widgets.prefetch import SPECULATIVE_CHOICES, WARMUP_CHOICES, prefetch_view
from ess.widgets.sim import CONTEXTS as SIM_CONTEXTS
from ess.sim import Scenario
from ess.sim.misses import NOTEBOOK_SIZES, PLANNER_SIZES, MissesTable
from ess.widgets.sim import MISSES_SOURCES, RATIOS, sim_budget_view
from ess.widgets.storage import CONTEXTS as STORAGE_CONTEXTS
from ess.widgets.storage import storage_budget_view

COVERED = {"01_memory_wall": "memory_budget_widget", "02_tiered_storage": "storage_budget_widget",
           "04_prefetching": "prefetch_widget", "08_128k_and_deployment": "sim_budget_widget",
           "09_real_model": "engine_widget", "10_beyond_the_paper": "grid_widget"}
MONITORED = {"02_tiered_storage"}            # notebooks that show a LiveMonitor


def _key(choices: dict, label: str) -> str:
    """The value behind a dropdown's shown label."""
    return {v: k for k, v in choices.items()}[label]


def test_every_widget_notebook_is_covered():
    assert W.widget_notebooks() == COVERED, "a notebook shows a widget these tests do not drive: add its checks"
    shown = {p.stem for p in (W.ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb") if "LiveMonitor(" in p.read_text()}
    assert shown == MONITORED, "a notebook shows a live monitor these tests do not watch: add its checks"


@pytest.fixture(scope="session")
def opened(browser, lab):
    """``opened(stem) -> (page, widget root)``: the notebook opened in JupyterLab and run, once per session; the
    sliders' readouts as first shown are in ``opened.first[stem]``. Each page records how a live monitor grows
    (:data:`widget_notebooks.MONITOR_RECORDER`)."""
    pages, contexts = {}, []

    def get(stem):
        if stem not in pages:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            context.add_init_script(W.MONITOR_RECORDER)
            contexts.append(context)
            page = context.new_page()
            W.open_and_run(page, lab, stem)
            root = W.widget(page)
            get.first[stem] = W.readouts(root)
            pages[stem] = (page, root)
        return pages[stem]
    get.first = {}
    try:
        yield get
    finally:
        for context in contexts:
            context.close()


def _move_each(page, root, stem, steps, expected, measurements, out_dir):
    """For each ``(control, action, changes)``: do it, time the redraw, check the page against ``expected()`` (the
    library's figure and summary for the controls' new values) and whether the numbers changed."""
    before = W.state(root)
    expected(before)
    root.screenshot(path=str(out_dir / f"{stem}-start.png"))
    for control, action, changes in steps:
        ms = W.redraw(page, root, action)
        measurements.add("redraw_ms", f"{stem}: {control}", round(ms, 1))
        after = W.state(root)
        expected(after)
        if changes is not None:
            assert (not W.same_numbers(before, after)) == changes, f"{stem}: moving {control!r}"
        before = after
    root.screenshot(path=str(out_dir / f"{stem}-moved.png"))


def test_memory_widget(opened, measurements, out_dir):
    page, root = opened("01_memory_wall")

    def expected(shown):
        gpu = W.dropdown_value(root, "GPU")
        context_len = MEMORY_CONTEXTS[int(W.slider_position(root, "context L"))]
        fig, s = memory_budget_view(gpu, context_len, W.slider_value(root, "ratio"))
        W.assert_same_figure(shown, fig)
        assert f"batch {s['batch']} per GPU (no offload {s['batch_no_offload']})" in shown["label"]

    assert (W.dropdown_value(root, "GPU"), W.readout(root, "context L"), W.readout(root, "ratio")) == \
        ("H200", "32K", "0.20")
    _move_each(page, root, "01_memory_wall", [
        ("ratio", W.press(root, "ratio", "ArrowRight"), True),
        ("context L", W.press(root, "context L", "ArrowRight"), True),
        ("GPU", W.choose(root, "GPU", "H20"), True),
    ], expected, measurements, out_dir)


def test_storage_widget(opened, measurements, out_dir):
    page, root = opened("02_tiered_storage")

    def expected(shown):
        gpu = W.dropdown_value(root, "GPU")
        context_len = STORAGE_CONTEXTS[int(W.slider_position(root, "context L"))]
        fig, s = storage_budget_view(gpu, context_len, W.slider_value(root, "ratio"),
                                     int(W.slider_value(root, "paused")))
        W.assert_same_figure(shown, fig)
        if s["feasible"]:
            assert f"batch {s['batch']} per GPU" in shown["label"]
            assert f"{s['slots_per_request_layer']} GPU slots per request and layer" in shown["label"]
        else:
            assert f"infeasible: {s['reason']}" in shown["label"]

    _move_each(page, root, "02_tiered_storage", [
        ("ratio", W.press(root, "ratio", "ArrowRight"), True),
        ("paused", W.press(root, "paused", "ArrowRight"), True),
        ("context L", W.press(root, "context L", "ArrowLeft"), True),
        ("GPU", W.choose(root, "GPU", "H100"), True),
        ("ratio to its minimum (infeasible)", W.press(root, "ratio", "Home"), True),
    ], expected, measurements, out_dir)
    assert "infeasible" in W.state(root)["title"], "an infeasible setting says why in the figure"


def test_prefetch_widget(opened, measurements, out_dir):
    page, root = opened("04_prefetching")

    def expected(shown):
        spec = _key(SPECULATIVE_CHOICES, W.dropdown_value(root, "speculative class"))
        warmup = _key(WARMUP_CHOICES, W.dropdown_value(root, "warmup windows"))
        fig, s = prefetch_view(spec, warmup, W.slider_value(root, "pool ratio"), W.slider_value(root, "link GB/s"))
        W.assert_same_figure(shown, fig)
        assert f"hit rate {s['hit_rate']:.3f}, stall " in shown["label"]
        assert s["explain"] in shown["texts"], "the note says what the warmup setting does to the first steps"

    _move_each(page, root, "04_prefetching", [
        ("pool ratio", W.press(root, "pool ratio", "ArrowRight"), True),
        ("link GB/s", W.press(root, "link GB/s", "ArrowLeft"), True),
        ("speculative class: off", W.choose(root, "speculative class", SPECULATIVE_CHOICES["off"]), True),
        ("warmup windows: delayed class", W.choose(root, "warmup windows", WARMUP_CHOICES["delayed"]), True),
        ("warmup windows: not loaded", W.choose(root, "warmup windows", WARMUP_CHOICES["none"]), True),
        ("speculative class: heat", W.choose(root, "speculative class", SPECULATIVE_CHOICES["heat"]), True),
        ("speculative class: LSTM (trained on first use)",
         W.choose(root, "speculative class", SPECULATIVE_CHOICES["lstm"]), True),
    ], expected, measurements, out_dir)


def test_prefetch_widget_explains_the_delayed_class(opened):
    """Sending the warmup windows with the delayed class lowers the hit rate against loading them before decoding;
    the page says why (the first step finds an empty pool)."""
    page, root = opened("04_prefetching")
    rates = {}
    for warmup in ("before", "delayed"):
        W.select_to(page, root, "warmup windows", WARMUP_CHOICES[warmup])
        shown = W.state(root)
        rates[warmup] = float(shown["label"].split("hit rate ")[1].split(",")[0])
    assert rates["delayed"] < rates["before"]
    assert any("the pool starts empty" in t and "step 0 misses" in t for t in shown["texts"]), shown["texts"]


@pytest.fixture(scope="module")
def calibrated():
    """The central calibration notebook 08 gives its widget, at the smoke sizes the browser runs it with."""
    from ess.sim.calibrate import calibration_set
    return calibration_set(**W.notebook_parameters("08_128k_and_deployment")["variant_fit"]).params


@pytest.fixture(scope="module")
def sim_misses():
    """The cache simulation notebook 08 gives its widget, at the smoke sizes the browser runs it with."""
    sizes = NOTEBOOK_SIZES.replace(**W.notebook_parameters("08_128k_and_deployment")["band_sizes"])
    return MissesTable(RATIOS, steps=sizes.steps, batch=sizes.batch)


def _sim_expected(root, calibrated, sim_misses):
    def expected(shown):
        sc = Scenario(gpu=W.dropdown_value(root, "GPU"), mtp=int(W.slider_value(root, "MTP")),
                      accept_ratio=W.slider_value(root, "accept"), h2d_GB_per_s=W.slider_value(root, "H2D GB/s"),
                      params=calibrated)
        fig, s = sim_budget_view(sc, W.slider_value(root, "ratio"),
                                 SIM_CONTEXTS[int(W.slider_position(root, "context"))],
                                 hbm_GiB=W.slider_value(root, "HBM GiB"),
                                 misses=_key(MISSES_SOURCES, W.dropdown_value(root, "misses")), table=sim_misses)
        W.assert_same_figure(shown, fig)
        if s["throughput"] is None:
            assert f"infeasible: {s['reason']}" in shown["label"]
        else:
            assert f"batch {s['batch']} ({s['limited_by']}), {s['throughput']:,.0f} tokens/s per node" in shown["label"]
            assert "-0.00" not in shown["label"]
    return expected


def test_simulator_widget(opened, measurements, out_dir, calibrated, sim_misses):
    page, root = opened("08_128k_and_deployment")
    _move_each(page, root, "08_128k_and_deployment", [
        ("ratio", W.press(root, "ratio", "ArrowRight"), True),
        ("context (a new context: its cache simulation runs once)", W.press(root, "context", "ArrowRight"), True),
        ("MTP (a new MTP: its cache simulation runs once)", W.press(root, "MTP", "ArrowRight"), True),
        ("accept", W.press(root, "accept", "ArrowRight"), True),
        ("HBM GiB", W.press(root, "HBM GiB", "End"), True),
        ("GPU (sets HBM GiB)", W.choose(root, "GPU", "H100"), True),
        ("H2D GB/s", W.press(root, "H2D GB/s", "ArrowLeft"), True),
        ("misses: none", W.choose(root, "misses", MISSES_SOURCES["zero"]), True),
        ("misses: cache simulation", W.choose(root, "misses", MISSES_SOURCES["cachesim"]), True),
        ("MTP back (simulated before: no new simulation)", W.press(root, "MTP", "ArrowLeft"), True),
        ("context back (simulated before: no new simulation)", W.press(root, "context", "ArrowLeft"), True),
    ], _sim_expected(root, calibrated, sim_misses), measurements, out_dir)


def test_simulator_link_speed_changes_the_prediction(opened):
    page, root = opened("08_128k_and_deployment")
    W.select_to(page, root, "GPU", "H200")
    W.select_to(page, root, "misses", MISSES_SOURCES["cachesim"])
    W.step_to(page, root, "ratio", 0.25)               # a pool that misses
    before = W.state(root)
    for _ in range(3):
        W.redraw(page, root, W.press(root, "H2D GB/s", "ArrowLeft"))
    assert not W.same_numbers(before, W.state(root)), "a slower link must lower throughput when entries miss"
    # with no misses nothing crosses the link host to device: the slider is disabled and the page says why
    W.redraw(page, root, W.choose(root, "misses", MISSES_SOURCES["zero"]))
    assert W.slider(root, "H2D GB/s").locator(".noUi-target").get_attribute("disabled") is not None
    assert any("H2D speed does not matter" in t for t in W.state(root)["texts"])
    W.redraw(page, root, W.choose(root, "misses", MISSES_SOURCES["cachesim"]))


def test_simulator_link_slider_starts_at_the_links_value(opened):
    from ess.specs import link_figures

    opened("08_128k_and_deployment")
    assert float(opened.first["08_128k_and_deployment"]["H2D GB/s"]) == link_figures()["flashtrans"]["h2d_GB_per_s"]
    assert opened.first["08_128k_and_deployment"]["accept"] == "1.70"             # the deployment's, exactly


def test_simulator_accept_ratio_above_mtp_is_refused_or_explained(opened):
    page, root = opened("08_128k_and_deployment")
    W.select_to(page, root, "GPU", "H200")
    W.step_to(page, root, "ratio", 0.2)
    W.step_to(page, root, "MTP", 3)
    W.step_to(page, root, "accept", 3.0)
    handle = W.slider(root, "accept").locator(".noUi-handle")
    assert float(handle.get_attribute("aria-valuemax")) == 3, "the accept slider ends at MTP"
    W.redraw(page, root, W.press(root, "MTP", "ArrowLeft"))               # MTP 2, below the accept ratio 3
    shown, accept = W.state(root), float(W.readout(root, "accept"))
    assert accept == 2.0 and float(handle.get_attribute("aria-valuemax")) == 2
    assert any("accept ratio lowered from 3 to 2" in t for t in shown["texts"]), shown["texts"]


def test_simulator_infeasible_setting_shows_the_reason_in_the_figure(opened):
    page, root = opened("08_128k_and_deployment")
    W.step_to(page, root, "ratio", 0.05)                               # fewer slots than K
    shown = W.state(root)
    assert "infeasible" in shown["label"]
    assert not shown["traces"] and shown["title"].startswith("infeasible"), "an empty plot with no word of why"
    assert shown["height"] < 200, "a message, not an empty full-size plot"
    W.step_to(page, root, "ratio", 0.2)


def test_engine_widget(opened, measurements, out_dir):
    """The real model decodes for real on every change, so its step times differ from any rerun: the page must show
    the settings chosen (the figure's title names ratio, policy, schedule and link) and say, each time, that the
    output is identical to the all-resident run."""
    page, root = opened("09_real_model")
    first = opened.first["09_real_model"]
    assert (first["ratio"], first["link GB/s"]) == ("0.25", "0.02"), first      # shown exactly
    assert W.dropdown_value(root, "policy") == "lru" and W.dropdown_value(root, "schedule") == "da"

    def expected(shown):
        ratio, link = W.readout(root, "ratio"), W.readout(root, "link GB/s")
        policy, schedule = W.dropdown_value(root, "policy"), W.dropdown_value(root, "schedule")
        assert shown["title"].startswith(f"ratio {float(ratio):g} ("), shown["title"]
        assert f"{policy}, {schedule}, {float(link):g} GB/s" in shown["title"], shown["title"]
        assert "identical to all-resident" in shown["label"], shown["label"]

    _move_each(page, root, "09_real_model", [
        ("ratio", W.press(root, "ratio", "ArrowRight"), None),
        ("policy", W.choose(root, "policy", "fifo"), None),
        ("schedule", W.choose(root, "schedule", "none"), None),
        ("link GB/s", W.press(root, "link GB/s", "ArrowLeft"), None),
    ], expected, measurements, out_dir)


@pytest.fixture(scope="module")
def grid_setup():
    """What notebook 10 gives its widget, at the smoke sizes the browser runs it with: the calibration and miss
    tables (computed here the same way), the models and contexts of its parameters."""
    from ess.sim import grid as sgrid
    from ess.widgets.grid import prepare_tables
    p = W.notebook_parameters("10_beyond_the_paper")
    inputs = sgrid.grid_inputs(variant_fit=p["variant_fit"], sizes=PLANNER_SIZES.replace(**p["band_sizes"]),
                               extrapolate=False)
    contexts = list(p["contexts"]) + list(p["long_contexts"])
    tables = prepare_tables(inputs, p["models"], contexts, steps=p["widget_cachesim_steps"],
                            batch=p["widget_cachesim_batch"], n_ratios=p["n_ratios"])
    return inputs, tables, contexts, p["n_ratios"]


def test_grid_widget(opened, measurements, out_dir, grid_setup):
    """Notebook 10's widget: every control moved (a GPU with another host interface changes the links offered, a
    model with another maximum context the contexts offered), and the page then shows what ess.widgets.grid's pure
    view gives for the new setting -- the figure's numbers and the summary line."""
    import re

    from ess.viz.grid import context_label
    from ess.widgets.grid import MTPS, RATIOS, grid_view, summary_text, widget_contexts
    inputs, tables, contexts, n_ratios = grid_setup
    page, root = opened("10_beyond_the_paper")

    def expected(shown):
        model = W.dropdown_value(root, "model")
        ctx = {context_label(L): L for L in widget_contexts(model, contexts)}[W.dropdown_value(root, "context")]
        mtp = MTPS[int(W.slider_position(root, "MTP"))]
        ratio = (["best"] + list(RATIOS))[int(W.slider_position(root, "ratio"))]
        fig, s = grid_view(inputs, model, W.dropdown_value(root, "GPU"), W.dropdown_value(root, "link"), ctx, mtp,
                           ratio, tables=tables, n_ratios=n_ratios)
        W.assert_same_figure(shown, fig)
        assert shown["label"].strip() == re.sub(r"<[^>]+>", "", summary_text(s)).strip()

    assert (W.dropdown_value(root, "model"), W.dropdown_value(root, "GPU"), W.dropdown_value(root, "link")) == \
        ("deepseek-v3.2", "H200", "pcie5-flashtrans")
    _move_each(page, root, "10_beyond_the_paper", [
        ("MTP", W.press(root, "MTP", "ArrowLeft"), True),
        ("ratio (0.05: too small a pool at 8K, the reason shown)", W.press(root, "ratio", "ArrowRight"), None),
        ("ratio back to best", W.press(root, "ratio", "Home"), True),
        ("GPU (the links follow)", W.choose(root, "GPU", "GB200"), True),
        ("link", W.choose(root, "link", "c2c-gh200"), None),
        ("model (the contexts follow)", W.choose(root, "model", "deepseek-v4-flash"), True),
        ("context (1M)", W.choose(root, "context", "1M"), True),
        ("MTP to 4", W.press(root, "MTP", "End"), True),
    ], expected, measurements, out_dir)
    assert W.dropdown_value(root, "link") == "c2c-gh200"


def _cut_labels(root) -> list[str]:
    return root.evaluate("""(root) => [...root.querySelectorAll('.widget-label, .widget-label-basic')]
        .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1).map(e => e.textContent)""")


@pytest.mark.parametrize("stem", sorted(COVERED))
def test_labels_are_readable(opened, stem):
    page, root = opened(stem)
    assert _cut_labels(root) == []


def test_live_monitor_grew_step_by_step(opened, out_dir):
    """Notebook 02's replay, watched while its cell ran: every figure the page drew held more steps than the one
    before, there were several, the last held them all, the progress bar reached its end, and the live view's last
    figure is the plain figure the notebook draws next (the one the book shows)."""
    page, _ = opened("02_tiered_storage")
    steps = W.notebook_parameters("02_tiered_storage")["trace_steps"]
    seen = W.monitor_record(page)
    lengths = seen["lengths"]
    assert len(lengths) >= 3, f"the page drew the monitor only {len(lengths)} times: {lengths}"
    assert all(a < b for a, b in zip(lengths, lengths[1:])), lengths
    assert lengths[-1] == steps and seen["progress"][-1] == "100%", seen
    monitor = page.locator(".ess-monitor")
    monitor.scroll_into_view_if_needed()
    assert _cut_labels(monitor) == []
    assert f"step {steps} of {steps}" in monitor.inner_text()
    live = W.figure_state(monitor.locator(".plotly-graph-div").first)
    figures = page.locator(".jp-OutputArea-output .plotly-graph-div").all()
    static = [f for f in figures if not f.evaluate("gd => !!gd.closest('.ess-monitor')")
              and W.figure_state(f)["title"] == live["title"]]
    assert len(static) == 1, "the notebook draws the whole run once more as a plain figure"
    assert W.figure_state(static[0])["traces"] == live["traces"]
    monitor.screenshot(path=str(out_dir / "02_tiered_storage-monitor.png"))


def test_autosaved_notebook_size_and_what_git_commits(opened, lab, measurements):
    """A notebook saved from JupyterLab after a run: its size on disk (plotly.js is in its outputs) and what git
    commits through the clean filter (tools/nbstrip.py): exactly the committed notebook, so a session in JupyterLab
    leaves nothing to commit."""
    import subprocess
    import sys

    page, _ = opened("01_memory_wall")
    W.save(page)
    saved = lab.root / "01_memory_wall.ipynb"
    committed = subprocess.run([sys.executable, str(W.ROOT / "tools" / "nbstrip.py")], input=saved.read_bytes(),
                               capture_output=True, check=True).stdout
    measurements.add("saved_notebook_bytes", "01_memory_wall: saved from JupyterLab after a run", saved.stat().st_size)
    measurements.add("saved_notebook_bytes", "01_memory_wall: committed through the clean filter", len(committed))
    assert any(c.get("outputs") for c in json.loads(saved.read_text())["cells"]), "the run's outputs were saved"
    # what git commits of the saved copy is what git commits of the copy JupyterLab was given (the committed notebook
    # with the smoke run's injected parameters): the run and the save add nothing
    given = subprocess.run([sys.executable, str(W.ROOT / "tools" / "nbstrip.py")],
                           input=W.prepared("01_memory_wall").encode(), capture_output=True, check=True).stdout
    assert committed == given
