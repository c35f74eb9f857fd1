"""Driving a notebook's widget in JupyterLab from playwright: open, run all, find the widget, move its controls,
read what the page shows (the plotly figure's data from its DOM element, the summary text) and how long each
redraw took, from the control's event to the new figure drawn."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
_WIDGET_CALL = re.compile(r"\b(\w+_widget)\(")


def widget_notebooks() -> dict[str, str]:
    """``{notebook stem: widget function}`` for every notebook that shows a widget of ``ess.widgets``."""
    found = {}
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                for name in _WIDGET_CALL.findall("".join(cell["source"])):
                    found[path.stem] = name
    return found


def notebook_parameters(stem: str, smoke: bool = True) -> dict:
    """The values of the notebook's parameters cell (literals only), with its ``smoke_sizes`` applied when
    ``smoke`` (what the copies :func:`prepare` writes run with)."""
    from ess.parameters import notebook_parameters as read
    values = read(ROOT / "notebooks" / f"{stem}.ipynb")
    if smoke:
        values.update(values.get("smoke_sizes", {}), smoke=True)
    return values


def prepared(stem: str) -> str:
    """The notebook as a smoke run executes it (JSON text): papermill's own parameter injection of ``smoke = True``
    and the notebook's CI sizes (:func:`ess.parameters.smoke_sizes`), a cell after the parameters cell."""
    import nbformat
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    from ess.parameters import smoke_sizes
    path = ROOT / "notebooks" / f"{stem}.ipynb"
    nb = parameterize_notebook(load_notebook_node(str(path)), {**smoke_sizes(path), "smoke": True})
    for cell in nb.cells:                  # papermill draws the injected cell's id at random: one id, every call
        if "injected-parameters" in cell.metadata.get("tags", []):
            cell.id = "injected-parameters"
    return nbformat.writes(nb)


def prepare(root: Path) -> None:
    """Copies of the widget notebooks as a smoke run executes them (:func:`prepared`), into ``root``."""
    root.mkdir(parents=True)
    for stem in widget_notebooks():
        (root / f"{stem}.ipynb").write_text(prepared(stem), encoding="utf-8")


_CURRENT = "window.jupyterapp.shell.currentWidget"
_DONE = f"""() => {{
    const w = {_CURRENT};
    const kernel = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
    if (!kernel || kernel.status !== 'idle') return false;
    const cells = w.content.widgets.filter(c => c.model.type === 'code');
    const failed = cells.some(c => c.model.outputs.toJSON().some(o => o.output_type === 'error'));
    const ran = cells.every(c => c.model.sharedModel.getSource().trim() === '' || c.model.executionCount !== null);
    return failed || ran;
}}"""
_ERRORS = f"""() => {{
    const cells = {_CURRENT}.content.widgets.filter(c => c.model.type === 'code');
    return cells.flatMap((c, i) => [
        ...c.model.outputs.toJSON().filter(o => o.output_type === 'error').map(o => `cell ${{i}}: ${{o.ename}}: ${{o.evalue}}`),
        ...(c.model.sharedModel.getSource().trim() !== '' && c.model.executionCount === null ? [`cell ${{i}} not run`] : [])]);
}}"""


def open_and_run(page, lab, stem: str, timeout_s: float = 900) -> None:
    """Open ``stem.ipynb`` in JupyterLab, wait for its kernel, run all cells and wait until they finished; an
    AssertionError lists any cell that raised or did not run."""
    page.goto(lab.url(f"{stem}.ipynb"))
    page.wait_for_function(f"() => window.jupyterapp && {_CURRENT} && {_CURRENT}.sessionContext && {_CURRENT}.sessionContext.session && "
                           f"{_CURRENT}.sessionContext.session.kernel && "
                           f"{_CURRENT}.sessionContext.session.kernel.status === 'idle'", timeout=120_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_timeout(1000)
    page.wait_for_function(_DONE, timeout=timeout_s * 1000, polling=500)
    errors = page.evaluate(_ERRORS)
    assert not errors, f"{stem} in JupyterLab: {errors}"


def save(page) -> None:
    """Save the open notebook as a user would (File > Save)."""
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function(f"() => !{_CURRENT}.context.model.dirty", timeout=60_000)


def widget(page):
    """The widget's root box (the first ipywidgets VBox of the notebook), scrolled into view, with its figure drawn."""
    root = page.locator(".jp-OutputArea-output .widget-vbox").first
    root.wait_for(state="visible", timeout=60_000)
    root.scroll_into_view_if_needed()
    root.locator(".widget-output .plotly-graph-div .main-svg").first.wait_for(timeout=60_000)
    return root


# one plotly figure element -> its title and traces: names as given (gd.data); numbers as plotly.js decoded them
# (gd._fullData: arrays arrive base64-encoded)
_FIGURE = """(gd) => {
    const arr = v => (v === undefined || v === null) ? null : Array.from(v);
    const title = gd && gd.layout && gd.layout.title;
    return {
        title: title ? (typeof title === 'string' ? title : (title.text || '')) : '',
        traces: gd ? gd.data.map((t, i) => ({name: t.name === undefined ? null : t.name,
                                             x: arr(gd._fullData[i].x), y: arr(gd._fullData[i].y)})) : [],
        height: gd ? gd.getBoundingClientRect().height : 0,
    };
}"""
_STATE = f"""(root) => {{
    const html = root.querySelector('.widget-html .widget-html-content');
    const gd = root.querySelector('.widget-output .plotly-graph-div');
    return {{
        label: html ? html.innerText : '',
        // every text line of the widget (summary, notes), in page order
        texts: [...root.querySelectorAll('.widget-html .widget-html-content')].map(e => e.innerText),
        ...({_FIGURE})(gd),
    }};
}}"""


def state(root) -> dict:
    """What the page shows: the summary text, the figure's title and traces (from the plotly element's data)."""
    return root.evaluate(_STATE)


_ARM = """(root) => {
    const out = root.querySelector('.widget-output');
    const before = out.querySelector('.plotly-graph-div');
    window.__essT0 = null;
    const mark = e => { if (window.__essT0 === null) window.__essT0 = e.timeStamp; };
    for (const kind of ['keydown', 'pointerdown', 'change']) root.addEventListener(kind, mark, {capture: true});
    window.__essRedraw = new Promise(resolve => {
        const check = () => {
            const gd = out.querySelector('.plotly-graph-div');
            if (gd && gd !== before && gd._fullLayout && gd.querySelector('.main-svg')) {
                observer.disconnect();
                requestAnimationFrame(() => resolve(performance.now() - window.__essT0));
            }
        };
        const observer = new MutationObserver(check);
        observer.observe(out, {childList: true, subtree: true});
    });
}"""


def redraw(page, root, action, timeout_s: float = 120) -> float:
    """Do ``action()`` (a real key press, click or selection on a control) and return the milliseconds from the
    control's event to the new figure drawn in the page."""
    root.evaluate(_ARM)
    action()
    page.wait_for_function("() => window.__essT0 !== null", timeout=10_000)
    return float(page.evaluate("() => Promise.race([window.__essRedraw, new Promise((_, no) => "
                               f"setTimeout(() => no(new Error('no redraw')), {int(timeout_s * 1000)}))])"))


# -- controls -------------------------------------------------------------------------------------------------------

def _by_label(root, kind: str, description: str):
    loc = root.locator(kind).filter(has=root.page.locator(".widget-label", has_text=re.compile(
        rf"^\s*{re.escape(description)}\s*$")))
    assert loc.count() == 1, f"{loc.count()} controls {kind} labelled {description!r}"
    return loc


def slider(root, description: str):
    return _by_label(root, ".widget-slider", description)


def slider_position(root, description: str) -> float:
    """The slider's position as its handle states it (``aria-valuenow``, one decimal): the option's index for a
    SelectionSlider, the exponent for a FloatLogSlider (both exact at one decimal here)."""
    return float(slider(root, description).locator(".noUi-handle").get_attribute("aria-valuenow"))


def slider_value(root, description: str) -> float:
    """A FloatSlider's or IntSlider's value as its readout shows it (two decimals: exact for these steps)."""
    return float(readout(root, description))


def readout(root, description: str) -> str:
    return slider(root, description).locator(".widget-readout").inner_text().strip()


def press(root, description: str, key: str):
    """A key press on the slider's handle (ArrowRight / ArrowLeft move it one step, Home / End to the ends)."""
    handle = slider(root, description).locator(".noUi-handle")

    def act():
        handle.focus()
        root.page.keyboard.press(key)
    return act


def choose(root, description: str, option: str):
    select = _by_label(root, ".widget-dropdown", description).locator("select")
    return lambda: select.select_option(option)


def checkbox(root, description: str):
    return root.locator(".widget-checkbox").filter(has_text=description)


def toggle(root, description: str):
    box = checkbox(root, description).locator("input[type=checkbox]")
    return lambda: box.click()


def dropdown_value(root, description: str) -> str:
    return _by_label(root, ".widget-dropdown", description).locator("select").input_value()


# -- the page against the library -----------------------------------------------------------------------------------

def _values(v):
    if v is None:
        return None
    return np.asarray(v).tolist() if not isinstance(v, (list, tuple)) else list(v)


def assert_same_figure(shown: dict, fig) -> None:
    """The figure in the page is the library's ``fig``: same title, same traces, same numbers."""
    assert shown["title"] == (fig.layout.title.text or ""), (shown["title"], fig.layout.title.text)
    assert len(shown["traces"]) == len(fig.data), (shown["traces"], fig.data)
    for got, want in zip(shown["traces"], fig.data):
        assert got["name"] == want.name, (got["name"], want.name)
        for axis in ("x", "y"):
            a, b = got[axis], _values(getattr(want, axis))
            if b is None:
                continue
            assert len(a) == len(b), (want.name, axis, a, b)
            for u, w in zip(a, b):
                if isinstance(w, (int, float)) and not isinstance(w, bool):
                    assert u == w or abs(u - w) <= 1e-9 * max(abs(w), 1.0), (want.name, axis, u, w)
                else:
                    assert u == w, (want.name, axis, u, w)


def same_numbers(a: dict, b: dict) -> bool:
    """Whether two page states show the same figure numbers."""
    return [(t["x"], t["y"]) for t in a["traces"]] == [(t["x"], t["y"]) for t in b["traces"]]


def step_to(page, root, description: str, position: float, limit: int = 100, read=slider_value) -> None:
    """Move a slider with the arrow keys until ``read`` (its value by default) gives ``position``, waiting for each
    redraw."""
    for _ in range(limit):
        now = read(root, description)
        if abs(now - position) < 1e-9:
            return
        redraw(page, root, press(root, description, "ArrowRight" if now < position else "ArrowLeft"))
    raise AssertionError(f"slider {description!r} did not reach {position}")


def select_to(page, root, description: str, option: str) -> None:
    """Choose ``option`` in a dropdown (waiting for the redraw) unless it is chosen already."""
    if dropdown_value(root, description) != option:
        redraw(page, root, choose(root, description, option))


def readouts(root) -> dict[str, str]:
    """Every slider's readout, by its label."""
    return root.evaluate("""(root) => Object.fromEntries([...root.querySelectorAll('.widget-slider')].map(s =>
        [s.querySelector('.widget-label').textContent.trim(), s.querySelector('.widget-readout').textContent.trim()]))""")


# -- the live monitor -----------------------------------------------------------------------------------------------

# Installed in the page before the notebook runs (an init script): while a monitor (.ess-monitor) exists, every
# 20 ms it notes each newly drawn figure's number of steps (the points of its first trace) and each new width of
# the progress bar, so a test can see afterwards how the view grew while the cell ran.
MONITOR_RECORDER = """
window.__essMonitor = {lengths: [], progress: []};
(() => {
    let last = null;
    setInterval(() => {
        const root = document.querySelector('.ess-monitor');
        if (!root) return;
        const rec = window.__essMonitor;
        const gd = root.querySelector('.widget-output .plotly-graph-div');
        if (gd && gd !== last && gd._fullData && gd.querySelector('.main-svg')) {
            last = gd;
            const x = gd._fullData[0].x;
            rec.lengths.push(x ? x.length : 0);
        }
        const bar = root.querySelector('.progress-bar');
        if (bar && rec.progress[rec.progress.length - 1] !== bar.style.width) rec.progress.push(bar.style.width);
    }, 20);
})();
"""


def monitor_record(page) -> dict:
    """What :data:`MONITOR_RECORDER` saw: ``lengths`` (steps in each drawn figure) and ``progress`` (bar widths)."""
    return page.evaluate("() => ({lengths: window.__essMonitor.lengths, progress: window.__essMonitor.progress})")


def figure_state(element) -> dict:
    """The title and traces of one plotly figure element (as :func:`state` reads a widget's)."""
    return element.evaluate(_FIGURE)
