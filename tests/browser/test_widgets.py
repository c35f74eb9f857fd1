"""Every notebook with a widget, run in JupyterLab in a real browser (smoke sizes): each control is moved with the
keyboard, mouse or a selection, and the page must then show what the library's pure view function gives for the
new setting — the plotly figure's data read from its DOM element, and the summary text. The time from the control's
event to the new figure drawn is measured and written to ``build/screenshots/timings.json`` (the goal is 200 ms;
it is reported, never asserted).

Known faults of the widgets are checked as they should behave and marked ``xfail(strict=True)``: they flip to
failures (XPASS) when the widgets are fixed, so the marks come off then."""
from __future__ import annotations

import json

import pytest

import widget_notebooks as W
from ess.widgets.memory import CONTEXTS as MEMORY_CONTEXTS
from ess.widgets.memory import memory_budget_view
from ess.widgets.prefetch import prefetch_view
from ess.widgets.sim import CONTEXTS as SIM_CONTEXTS
from ess.widgets.sim import sim_budget_view
from ess.widgets.storage import CONTEXTS as STORAGE_CONTEXTS
from ess.widgets.storage import storage_budget_view

COVERED = {"01_memory_wall": "memory_budget_widget", "02_tiered_storage": "storage_budget_widget",
           "04_prefetching": "prefetch_widget", "08_128k_and_deployment": "sim_budget_widget"}


def test_every_widget_notebook_is_covered():
    assert W.widget_notebooks() == COVERED, "a notebook shows a widget these tests do not drive: add its checks"


@pytest.fixture(scope="session")
def opened(browser, lab):
    """``opened(stem) -> (page, widget root)``: the notebook opened in JupyterLab and run, once per session; the
    sliders' readouts as first shown are in ``opened.first[stem]``."""
    pages, contexts = {}, []

    def get(stem):
        if stem not in pages:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
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
        spec = W.checkbox(root, "speculative class").locator("input").is_checked()
        delayed = W.checkbox(root, "delayed class").locator("input").is_checked()
        fig, s = prefetch_view(spec, delayed, W.dropdown_value(root, "predictor"),
                               W.slider_value(root, "pool ratio"), W.slider_value(root, "link GB/s"))
        W.assert_same_figure(shown, fig)
        assert f"hit rate {s['hit_rate']:.3f}, stall {s['stall_s'] * 1e3:.2f} ms" in shown["label"]

    _move_each(page, root, "04_prefetching", [
        ("pool ratio", W.press(root, "pool ratio", "ArrowRight"), True),
        ("link GB/s", W.press(root, "link GB/s", "ArrowLeft"), True),
        ("speculative class", W.toggle(root, "speculative class"), True),
        ("delayed class", W.toggle(root, "delayed class"), True),
        # with the speculative class off the predictor is not used: the library gives the same numbers
        ("predictor", W.choose(root, "predictor", "none"), False),
    ], expected, measurements, out_dir)


@pytest.fixture(scope="module")
def calibrated():
    from ess.sim.calibrate import calibrate
    return calibrate().params                     # as notebook 08 gives its widget


def _sim_expected(root, calibrated):
    def expected(shown):
        mtp = int(W.slider_value(root, "MTP"))
        fig, s = sim_budget_view(W.dropdown_value(root, "GPU"), W.slider_value(root, "ratio"),
                                 SIM_CONTEXTS[int(W.slider_position(root, "context"))], mtp,
                                 min(W.slider_value(root, "accept"), mtp),
                                 10 ** W.slider_position(root, "H2D GB/s"), hbm_GiB=W.slider_value(root, "HBM GiB"),
                                 params=calibrated)
        W.assert_same_figure(shown, fig)
        if s["throughput"] is None:
            assert f"infeasible: {s['reason']}" in shown["label"]
        else:
            assert f"batch {s['batch']} ({s['limited_by']}), {s['throughput']:,.0f} tokens/s per node" in shown["label"]
    return expected


def test_simulator_widget(opened, measurements, out_dir, calibrated):
    page, root = opened("08_128k_and_deployment")
    _move_each(page, root, "08_128k_and_deployment", [
        ("ratio", W.press(root, "ratio", "ArrowRight"), True),
        ("context", W.press(root, "context", "ArrowRight"), True),
        ("MTP", W.press(root, "MTP", "ArrowRight"), True),
        ("accept", W.press(root, "accept", "ArrowRight"), True),
        ("HBM GiB", W.press(root, "HBM GiB", "End"), True),
        ("GPU (sets HBM GiB)", W.choose(root, "GPU", "H100"), True),
        # H2D is timed and checked against the library here; whether it changes anything is the known fault below
        ("H2D GB/s", W.press(root, "H2D GB/s", "ArrowLeft"), None),
    ], _sim_expected(root, calibrated), measurements, out_dir)


@pytest.mark.xfail(strict=True, reason="known fault: the simulator widget is built with zero misses, so the link "
                                       "speed changes nothing (every H2D GB/s gives the same tokens/s)")
def test_simulator_link_speed_changes_the_prediction(opened, calibrated):
    page, root = opened("08_128k_and_deployment")
    W.select_to(page, root, "GPU", "H200")
    W.step_to(page, root, "ratio", 0.25)               # a pool that misses
    before = W.state(root)
    for _ in range(3):
        W.redraw(page, root, W.press(root, "H2D GB/s", "ArrowLeft"))
    assert not W.same_numbers(before, W.state(root)), "a slower link must lower throughput when entries miss"


@pytest.mark.xfail(strict=True, reason="known fault: the log slider snaps the FlashTrans 37 GB/s to 10^1.6 = 39.8")
def test_simulator_link_slider_starts_at_the_links_value(opened):
    from ess.specs import link_figures

    opened("08_128k_and_deployment")
    assert float(opened.first["08_128k_and_deployment"]["H2D GB/s"]) == link_figures()["flashtrans"]["h2d_GB_per_s"]


@pytest.mark.xfail(strict=True, reason="known fault: an accept ratio above the MTP count is silently replaced by "
                                       "the MTP count (the slider says 4.00, the model uses 2)")
def test_simulator_accept_ratio_above_mtp_is_refused_or_explained(opened):
    page, root = opened("08_128k_and_deployment")
    W.step_to(page, root, "ratio", 0.2)
    W.step_to(page, root, "MTP", 2)
    W.step_to(page, root, "accept", 4.0)
    shown, accept = W.state(root), float(W.readout(root, "accept"))
    assert accept <= 2 or "accept" in shown["label"], f"accept {accept} with MTP 2: {shown['label']!r}"


@pytest.mark.xfail(strict=True, reason="known fault: an infeasible setting draws an empty full-size plot; the reason "
                                       "is only in the summary line")
def test_simulator_infeasible_setting_shows_the_reason_in_the_figure(opened):
    page, root = opened("08_128k_and_deployment")
    W.step_to(page, root, "ratio", 0.05)                               # fewer slots than K
    shown = W.state(root)
    assert "infeasible" in shown["label"]
    assert shown["traces"] or "infeasible" in shown["title"], "an empty plot with no word of why"


def _cut_labels(root) -> list[str]:
    return root.evaluate("""(root) => [...root.querySelectorAll('.widget-label, .widget-label-basic')]
        .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1).map(e => e.textContent)""")


@pytest.mark.parametrize("stem", ["01_memory_wall", "02_tiered_storage", "08_128k_and_deployment"])
def test_labels_are_readable(opened, stem):
    page, root = opened(stem)
    assert _cut_labels(root) == []


@pytest.mark.xfail(strict=True, reason="known fault: the check-box label is cut off ('delayed class (warmup in ba…')")
def test_prefetch_labels_are_readable(opened):
    page, root = opened("04_prefetching")
    assert _cut_labels(root) == []


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
    # the copy JupyterLab ran has smoke = True in its parameters cell; otherwise it is the committed notebook
    source = (W.ROOT / "notebooks" / "01_memory_wall.ipynb").read_bytes()
    assert committed.replace(b"smoke = True", b"smoke = False") == source
