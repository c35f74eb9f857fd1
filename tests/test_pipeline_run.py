"""The pipeline (ess.pipeline): every notebook in smoke mode, records, the run index, the book; failures named; an
interrupted or failed run leaves nothing of its own that looks complete, and loses none of the earlier run's
complete results."""
import html
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

from _smokebuild import smoke_build
from ess import pipeline
from ess.__main__ import main
from ess.pipeline import BuildDir, book
from ess.results import STATUSES, load_records, load_results

ROOT = Path(__file__).resolve().parent.parent
# where this checkout, its parent folder, the home folder and the temporary folder lie on the machine that runs
# the tests: none may appear in a built page
MACHINE_PATHS = (str(ROOT), str(ROOT.parent) + os.sep, str(Path.home()) + os.sep, tempfile.gettempdir() + os.sep)


def _format_like_glue(value, spec: str) -> str:
    """What myst-nb's {glue:text} prints for a value and a format spec (myst_nb.core.variables.format_plain_text)."""
    kind = spec[-1]
    if kind in "bcdoxX":
        value = int(value)
    elif kind in "eEfFgGn%":
        value = float(value)
    return format(value, spec)


@pytest.mark.slow
def test_every_notebook_runs_in_smoke_mode_and_the_book_builds(tmp_path_factory):
    """The main job at CI sizes: every notebook executes (its own checks pass) and records results stamped with the
    run, the index says exactly this run, and the book builds with warnings as errors, its pages quote the
    notebooks' numbers, hide the parameters cells, load nothing from a CDN and print no path of this machine."""
    build, runs = smoke_build(tmp_path_factory)
    names = [p.stem for p in pipeline.list_notebooks()]
    assert [r.name for r in runs] == names and len(names) >= 8
    index = json.loads((build / "results" / "index.json").read_text())
    run_id = index["run"]["id"]
    assert index["run"]["status"] == "complete" and index["run"]["mode"] == "smoke"
    assert index["run"]["finished"] >= index["run"]["started"] and index["run"]["versions"]["papermill"]
    assert list(index["notebooks"]) == names and index["earlier_results"] == {}
    assert index["book"]["status"] == "built"
    for r in runs:
        results = load_results(r.results)
        assert results.run["run_id"] == run_id and results.run["mode"] == "smoke" and results.run["smoke"] is True
        assert index["notebooks"][r.name]["status"] == "complete"
        assert index["notebooks"][r.name]["records"] == len(results.records) > 0
        assert results.status_inferred is False
        for rec in results.records:
            assert isinstance(rec.config, dict) and rec.unit is not None and rec.status in STATUSES
            if rec.published is not None:
                assert rec.source and rec.status != "computed", (r.name, rec.name)
        nb = json.loads(r.output.read_text())
        assert nb["metadata"]["ess"]["status"] == "complete" and nb["metadata"]["ess"]["run_id"] == run_id
        injected = [c for c in nb["cells"] if "injected-parameters" in c["metadata"].get("tags", [])]
        assert f'results_path = "results/{r.name}.json"' in "".join(injected[0]["source"])
        glued = {o["metadata"]["scrapbook"]["name"] for c in nb["cells"] for o in c.get("outputs", [])
                 if "scrapbook" in o.get("metadata", {})}
        assert glued == {rec.name for rec in results.records}, "every record is glued for the book"
    first = {r.name: r for r in load_records(build / "results" / "01_memory_wall.json")}
    assert first["latent_entry_bytes_fp8"].value == 656
    assert first["token_bytes_all_layers"].value == 48068

    site = build / "book" / "_build" / "html"
    pages = {p: p.read_text(encoding="utf-8") for p in site.rglob("*.html")}
    for name in names:
        page = pages[site / "notebooks" / f"{name}.html"]
        assert "plotly-graph-div" in page, f"{name}: figures dropped from the book"
        text = html.unescape(re.sub(r"<[^>]+>", "", page))
        assert not re.search(r"\bresults_path\s*=", text), f"{name}: a parameters cell is shown"
    intro = pages[site / "intro.html"]
    assert "Glossary" in intro and "Smoke sizes" in intro
    results_page = html.unescape(re.sub(r"<[^>]+>", "", pages[site / "results.html"]))   # the page's text
    for r in runs:
        for rec in load_records(r.results):
            assert rec.name in results_page, (r.name, rec.name)
    staged = (build / "book_src" / "results.md").read_text(encoding="utf-8")
    assert "(inferred) |" not in staged, "every status is the record's own field"
    # every number a page quotes with {glue:text} is the notebook's, formatted as asked
    quoted = 0
    for md in [ROOT / "book" / "intro.md", *sorted((ROOT / "book" / "pages").glob("*.md"))]:
        out = site / md.relative_to(ROOT / "book").with_suffix(".html")
        for nb_name, key, spec in re.findall(r"\{glue:text\}`/notebooks/(\w+)\.ipynb::([^`]+):([^:`]+)`",
                                             md.read_text()):
            value = {r.name: r.value for r in load_records(build / "results" / f"{nb_name}.json")}[key]
            assert f'<span class="pasted-text">{_format_like_glue(value, spec)}</span>' in pages[out], (md, key)
            quoted += 1
    assert quoted >= 10
    assert (site / "mathjax" / "MathJax.js").exists()
    for path, text in pages.items():
        remote = re.findall(r'<(?:script|link)\b[^>]*\b(?:src|href)="(https?://[^"]+)"', text)
        assert remote == [], f"{path} loads scripts or styles from another host: {remote[:3]}"
        for machine in (*MACHINE_PATHS, str(build)):
            assert machine not in text, f"{path} prints the machine path {machine}"
    assert "mathjax/MathJax.js" in pages[site / "pages" / "03_attention.html"]


# -- small notebooks for the failure modes --------------------------------------------------------------------------

def _notebook(folder: Path, name: str, *cells: str, recorder: str | None = None) -> Path:
    """A notebook with a literals-only parameters cell, a Recorder, the given code cells and a save."""
    folder.mkdir(parents=True, exist_ok=True)
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("smoke = False\nresults_path = ''")
    params.metadata["tags"] = ["parameters"]
    setup = f"from ess.results import Recorder\nrec = {recorder or f'Recorder({name!r}, results_path)'}"
    nb.cells = [nbformat.v4.new_markdown_cell(f"# {name}"), params, nbformat.v4.new_code_cell(setup),
                *[nbformat.v4.new_code_cell(c) for c in cells], nbformat.v4.new_code_cell("rec.save()")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = folder / f"{name}.ipynb"
    nbformat.write(nb, path)
    return path


def _assert_nothing_looks_complete(build: Path) -> dict:
    """The invariants of an interrupted or failed run; returns the index. A notebook this run did not complete has
    no executed copy or results of this run: only an earlier run's complete ones, which the index names."""
    index = pipeline.load_index(build / "results" / "index.json")
    run_id = index["run"]["id"]
    for name, entry in index["notebooks"].items():
        executed = build / "notebooks" / f"{name}.ipynb"
        results = build / "results" / f"{name}.json"
        if entry["status"] == "complete":
            meta = json.loads(executed.read_text())["metadata"]["ess"]
            assert meta["status"] == "complete" and meta["run_id"] == run_id
            assert load_results(results).run["run_id"] == run_id
            assert entry["in_place"]["run_id"] == run_id and entry["in_place"]["this_run"] is True
        else:
            for kept in (executed, results):
                if kept.exists():
                    earlier = (json.loads(kept.read_text())["metadata"]["ess"] if kept.suffix == ".ipynb"
                               else load_results(kept).run)
                    assert earlier["status"] == "complete" and earlier["run_id"] != run_id, (name, kept)
            if results.exists():
                assert entry["in_place"]["this_run"] is False, name
                assert entry["in_place"]["run_id"] == load_results(results).run["run_id"], name
            else:
                assert entry["in_place"] is None, name
            failed = build / "notebooks" / "failed" / f"{name}.ipynb"
            if failed.exists():
                nb = json.loads(failed.read_text())
                assert nb["metadata"]["ess"]["status"] in ("failed", "interrupted")
                assert "did not finish" in "".join(nb["cells"][0]["source"])
    return index


@pytest.mark.slow
def test_failure_names_the_notebook_and_the_cell_and_keeps_it_apart(tmp_path):
    nbdir, build = tmp_path / "nbs", tmp_path / "build"
    _notebook(nbdir, "01_fine", "rec.record('x', 1, '')")
    _notebook(nbdir, "02_broken", "x = 1", "raise ValueError('boom')")
    _notebook(nbdir, "03_after", "rec.record('y', 2, '')")
    with pytest.raises(pipeline.ReproduceError, match=r"02_broken.ipynb failed in cell 5 .*ValueError: boom"):
        pipeline.run_all(notebooks_dir=nbdir, build_dir=build, book=False, progress=False)
    index = _assert_nothing_looks_complete(build)
    assert index["run"]["status"] == "failed"
    assert [e["status"] for e in index["notebooks"].values()] == ["complete", "failed", "not run"]
    assert "ValueError: boom" in index["notebooks"]["02_broken"]["error"]
    kept = json.loads((build / "notebooks" / "failed" / "02_broken.ipynb").read_text())
    assert kept["metadata"]["ess"]["status"] == "failed"
    ran = [c for c in kept["cells"] if c["cell_type"] == "code"]
    assert ran[-1]["metadata"]["papermill"]["status"] == "not run", "the save after the failure never ran"
    with pytest.raises(pipeline.ReproduceError, match=r"did not finish: 02_broken \(failed: notebook 02_broken"):
        book.check_executed(BuildDir.claim(build))


@pytest.mark.slow
@pytest.mark.parametrize("recorder, match", [("Recorder('someone_else', results_path)", "recorded its results as"),
                                             ("Recorder('01_smoky', results_path, smoke=True)", "says smoke=True")])
def test_results_that_do_not_match_the_run_are_refused(tmp_path, recorder, match):
    _notebook(tmp_path / "nbs", "01_smoky", "rec.record('x', 1, '')", recorder=recorder)
    with pytest.raises(pipeline.ReproduceError, match=match):
        pipeline.run_all(notebooks_dir=tmp_path / "nbs", build_dir=tmp_path / "b", book=False, progress=False)
    assert not (tmp_path / "b" / "results" / "01_smoky.json").exists()


@pytest.mark.slow
def test_a_hanging_cell_fails_instead_of_waiting(tmp_path, capsys):
    _notebook(tmp_path / "nbs", "98_hang", "import time\ntime.sleep(60)")
    with pytest.raises(pipeline.ReproduceError, match="98_hang.ipynb: a cell ran longer than 3 s"):
        pipeline.run_all(notebooks_dir=tmp_path / "nbs", build_dir=tmp_path / "b", book=False, progress=False,
                          cell_timeout_s=3, retries=1)
    assert "retrying 98_hang.ipynb (1/1)" in capsys.readouterr().err
    index = _assert_nothing_looks_complete(tmp_path / "b")
    assert index["notebooks"]["98_hang"]["attempts"] == 2


def _processes_under(folder: Path) -> list[str]:
    """Processes (the notebook runner, its kernel) whose working folder is inside ``folder``."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "cwd", "cmdline"]):
        cwd = proc.info.get("cwd") or ""
        if cwd.startswith(str(folder)):
            found.append(f"{proc.info['pid']} {' '.join(proc.info.get('cmdline') or [])[:120]}")
    return found


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_an_interrupted_run_leaves_nothing_that_looks_complete(tmp_path, sig):
    """`ess reproduce` stopped by Ctrl-C, SIGTERM or kill -9 at a random moment: the notebooks it finished are
    complete and stamped; the one it was running has no executed copy and no results (only a copy marked as
    interrupted, apart), and `ess book` refuses to publish it; no runner or kernel is left running."""
    nbdir, build = tmp_path / "nbs", tmp_path / "build"
    _notebook(nbdir, "01_quick", "rec.record('x', 1, '')")
    _notebook(nbdir, "02_slow", *["import time\ntime.sleep(1)\nrec.record(f'y{len(rec.records)}', 1, '')"] * 5)
    _notebook(nbdir, "03_quick", "rec.record('z', 3, '')")
    seed = random.randrange(10**6)
    delay = random.Random(seed).uniform(0.5, 15.0)
    proc = subprocess.Popen([sys.executable, "-m", "ess", "reproduce", "--notebooks-dir", str(nbdir),
                             "--build-dir", str(build), "--no-book", "--no-figures"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    why = f"signal {sig.name} after {delay:.2f} s (seed {seed}); exit {proc.returncode}; stderr: {err[-500:]}"
    if not (build / "results" / "index.json").exists():
        assert proc.returncode != 0 and not (build / "notebooks").exists(), why     # stopped before it began
        return
    index = _assert_nothing_looks_complete(build)
    statuses = [e["status"] for e in index["notebooks"].values()]
    if index["run"]["status"] == "complete":
        assert proc.returncode == 0 and statuses == ["complete"] * 3, why            # finished before the signal
    else:
        expected = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGKILL: -9}[sig]
        assert proc.returncode == expected, why
        assert index["run"]["status"] == ("running" if sig == signal.SIGKILL else "interrupted"), why
        assert "complete" not in statuses[statuses.index(next(s for s in statuses if s != "complete")):], why
        if sig != signal.SIGKILL:
            assert "Traceback" not in err and "interrupted" in err, why
        unfinished = [n for n, e in index["notebooks"].items() if e["status"] in ("running", "interrupted")]
        if unfinished:
            with pytest.raises(pipeline.ReproduceError, match=f"did not finish: {unfinished[0]}"):
                book.check_executed(BuildDir(build))
    deadline = time.monotonic() + 60
    while _processes_under(build) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _processes_under(build) == [], why


@pytest.mark.slow
def test_an_earlier_runs_results_are_named_as_such_and_the_book_says_so(tmp_path):
    nbdir, build = tmp_path / "nbs", tmp_path / "build"
    _notebook(nbdir, "01_a", "rec.record('a', 1, '', published=2, source='s', role='calibration')")
    _notebook(nbdir, "02_b", "rec.record('b', 5, '', low=1, high=4)")
    pipeline.run_all(notebooks_dir=nbdir, build_dir=build, book=False, progress=False, figures=False)
    first = json.loads((build / "results" / "index.json").read_text())["run"]["id"]
    pipeline.run_all(notebooks_dir=nbdir, build_dir=build, book=False, progress=False, figures=False,
                      only=["02"], smoke=True)
    index = json.loads((build / "results" / "index.json").read_text())
    assert list(index["notebooks"]) == ["02_b"] and index["run"]["only"] == ["02"]
    assert index["earlier_results"] == {"01_a": {"results": "results/01_a.json", "mode": "full",
                                                 "run_id": first, "finished": index["earlier_results"]["01_a"]
                                                 ["finished"]}}
    page = book.results_page(BuildDir(build), book.check_executed(BuildDir(build)))
    section_a = page[page.index("## 01_a"):page.index("## 02_b")]
    assert "an earlier run than the last" in section_a and "**full**" in section_a
    assert "| `a` | calibrated | 1 | 2 | -50.0 % |" in section_a
    assert "| `b` | computed | 5 |  |  |  | \\[1, 4\\] **outside** |" in page     # brackets escaped for MyST
    banner = book._banner(book.check_executed(BuildDir(build)))
    assert "Some notebooks ran with `ess reproduce --smoke`" in banner and "2 different runs" in banner


@pytest.mark.slow
def test_kept_figures_are_rendered_to_png_and_svg(tmp_path):
    if not any(Path(p, "chromium").exists() for p in os.environ.get("PATH", "").split(os.pathsep)):
        if os.environ.get("ESS_REQUIRE_BROWSER"):
            pytest.fail("chromium is not installed (scripts/ess.sh setup installs it)")
        pytest.skip("chromium is not installed")
    nbdir, build = tmp_path / "nbs", tmp_path / "build"
    _notebook(nbdir, "01_fig", "import plotly.graph_objects as go\n"
                               "rec.figure('bars', go.Figure(go.Bar(x=['a', 'b'], y=[1, 3])))")
    pipeline.run_all(notebooks_dir=nbdir, build_dir=build, book=False, progress=False)
    index = json.loads((build / "results" / "index.json").read_text())
    assert index["figures"] == {"status": "rendered", "files": ["figures/01_fig-bars.png", "figures/01_fig-bars.svg"]}
    png = (build / "figures" / "01_fig-bars.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    width = int.from_bytes(png[16:20], "big")
    assert width == 900 * 2, "900 CSS pixels at scale 2"
    assert "<svg" in (build / "figures" / "01_fig-bars.svg").read_text()[:500]


def test_staging_hides_parameters_drops_cdn_scripts_and_widget_state():
    nb = {"metadata": {"widgets": {"state": {}}}, "cells": [
        {"cell_type": "code", "metadata": {"tags": ["parameters"]}, "outputs": [], "source": "smoke = False"},
        {"cell_type": "code", "metadata": {"tags": ["injected-parameters"]}, "outputs": [], "source": "smoke = True"},
        {"cell_type": "code", "metadata": {}, "source": "fig.show()", "outputs": [
            {"output_type": "display_data", "metadata": {}, "data": {"text/html": [
                '<div><script src="https://cdnjs.cloudflare.com/ajax/libs/mathjax/3.2.2/es5/tex-svg.min.js">',
                '</script><div class="plotly-graph-div"></div></div>']}},
            {"output_type": "display_data", "metadata": {}, "data": {
                "application/vnd.jupyter.widget-view+json": {"model_id": "m"}, "text/plain": "VBox()"}}]}]}
    out = book._for_the_book(nb)
    assert [c["metadata"].get("tags") for c in out["cells"]] == [["parameters", "remove-cell"],
                                                                  ["injected-parameters", "remove-cell"], None]
    html_out, widget = out["cells"][2]["outputs"]
    assert html_out["data"]["text/html"] == '<div><div class="plotly-graph-div"></div></div>'
    assert list(widget["data"]) == ["text/markdown"] and "kernel" in widget["data"]["text/markdown"]
    assert "widgets" not in out["metadata"]


@pytest.mark.parametrize("only, match", [(["no-such-notebook"], "matches 0 notebooks"),
                                         (["01", "01_memory_wall"], "a second time"),
                                         ([""], "matches 0 notebooks")])
def test_only_rejects_unknown_and_repeated_names(tmp_path, capsys, only, match):
    argv = ["reproduce", "--build-dir", str(tmp_path / "b")]
    for name in only:
        argv += ["--only", name]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0]
    assert not (tmp_path / "b").exists(), "a wrong --only leaves no build folder behind"


def test_list(capsys):
    assert main(["list"]) == 0
    assert "01_memory_wall" in capsys.readouterr().out


def test_stage_book_needs_executed_notebooks(tmp_path):
    with pytest.raises(pipeline.ReproduceError, match="no executed notebooks"):
        pipeline.stage_book(tmp_path)


def test_the_book_refuses_notebooks_without_a_run_record(tmp_path):
    build = BuildDir.claim(tmp_path / "b")
    (build.sub("notebooks") / "01_by_hand.ipynb").write_text(json.dumps({"metadata": {}, "cells": []}))
    with pytest.raises(pipeline.ReproduceError, match=r"did not finish: 01_by_hand \(no run record\)"):
        book.check_executed(build)


@pytest.mark.slow
def test_relative_build_dir_is_resolved_from_the_caller(tmp_path, monkeypatch):
    _notebook(tmp_path / "nbs", "01_rel", "rec.record('x', 1, '')")
    monkeypatch.chdir(tmp_path)
    runs = pipeline.run_all(notebooks_dir=Path("nbs"), build_dir=Path("rel"), book=False, progress=False)
    assert runs[0].results == tmp_path / "rel" / "results" / "01_rel.json"
    assert runs[0].results.exists()


@pytest.mark.parametrize("value, error", [(0, ValueError), (-1, ValueError), (float("inf"), ValueError),
                                          ("60", TypeError), (True, TypeError)])
def test_cell_timeout_must_be_positive_seconds(value, error, tmp_path):
    with pytest.raises(error, match="cell_timeout_s"):
        pipeline.run_all(cell_timeout_s=value, build_dir=tmp_path / "b", book=False)
    assert not (tmp_path / "b").exists()
    assert pipeline.check_cell_timeout(2.5) == 3


def test_the_pipeline_is_the_top_layer_nothing_in_the_library_imports_it():
    import ast

    offenders = []
    for path in sorted((ROOT / "ess").rglob("*.py")):
        rel = path.relative_to(ROOT / "ess")
        if rel.parts[0] == "pipeline" or rel.name == "__main__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [f"{'.' * node.level}{node.module or ''}"] if isinstance(node, ast.ImportFrom) else [])
            if any("pipeline" in n.split(".") for n in names) or (
                    isinstance(node, ast.ImportFrom) and any(a.name == "pipeline" for a in node.names)):
                offenders.append(f"{rel}:{node.lineno}")
    assert offenders == []


def test_the_results_page_says_when_a_status_was_inferred_and_when_the_last_run_did_not_finish(tmp_path):
    """A results file of the older format (no status field) shows its status as inferred; a notebook whose last
    run failed shows the earlier run's complete results and says so."""
    build = BuildDir.claim(tmp_path / "b")
    nb = {"metadata": {"ess": {"notebook": "01_a", "status": "complete", "run_id": "old1", "mode": "full",
                               "finished": "2026-01-01T00:00:00Z"}}, "cells": [{"cell_type": "markdown",
                                                                                 "source": "# A", "metadata": {}}]}
    (build.sub("notebooks") / "01_a.ipynb").write_text(json.dumps(nb))
    (build.sub("results") / "01_a.json").write_text(json.dumps({
        "format": "ess-results/2", "run": {"notebook": "01_a", "run_id": "old1", "mode": "full"},
        "records": [{"name": "limit", "value": 52, "unit": "", "published": 52, "source": "s",
                     "note": "calibrated: fitted here"}]}))
    (build.path / "results" / "index.json").write_text(json.dumps({
        "format": "ess-index/2", "run": {"id": "new2", "mode": "full", "status": "failed", "started": "x"},
        "notebooks": {"01_a": {"status": "failed", "in_place": {"run_id": "old1", "this_run": False,
                                                                "results": "results/01_a.json"}}}}))
    executed = book.check_executed(build)                # the earlier complete copy may be published ...
    page = book.results_page(build, executed)
    assert "| `limit` | calibrated (inferred) | 52 | 52 |" in page
    assert "did not finish: failed" in page and "run `old1`, left in place" in page      # ... saying so


def test_a_notebooks_folder_that_does_not_exist_or_holds_none_is_a_usage_error(tmp_path, capsys):
    for folder in (tmp_path / "missing", tmp_path):
        argv = ["reproduce", "--notebooks-dir", str(folder), "--build-dir", str(tmp_path / "b")]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and ("is not a folder" in err[0] or "holds no NN_name.ipynb" in err[0]), err
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_only_one_notebook_into_a_fresh_build_folder_builds_the_book_from_what_ran(tmp_path, capsys):
    """`ess reproduce --only 01 --smoke` into a fresh build folder with the book on: the book builds (warnings are
    errors) from notebook 01 alone; a page quoting a notebook that did not run shows that in place of the number
    and says so at its top, and the command says which pages on stderr, one line."""
    build = tmp_path / "b"
    assert main(["reproduce", "--only", "01", "--smoke", "--no-figures", "--build-dir", str(build)]) == 0, \
        capsys.readouterr().err
    err = capsys.readouterr().err
    assert "05_simulator_calibration" in err and "pages/05_simulator.md" in err
    site = build / "book" / "_build" / "html"
    intro = html.unescape(re.sub(r"<[^>]+>", "", (site / "intro.html").read_text(encoding="utf-8")))
    assert "not run: 05_simulator_calibration" in intro and "did not run or record" in intro
    first = {r.name: r.value for r in load_records(build / "results" / "01_memory_wall.json")}
    design = (site / "pages" / "01_design.html").read_text(encoding="utf-8")
    assert f'<span class="pasted-text">{first["indexer_entry_bytes"]}</span>' in design, "01's numbers are quoted"
    assert sorted(p.name for p in (site / "notebooks").glob("*.html")) == ["01_memory_wall.html"]


@pytest.mark.slow
def test_a_smoke_run_injects_the_notebooks_smoke_sizes(tmp_path):
    """Catches a smoke run at full size: the sizes a notebook declares as ``smoke_sizes`` in its parameters cell
    reach the kernel as papermill parameters (the notebook itself never rebinds its globals); a ``smoke_sizes`` that
    names the pipeline's own parameter is refused before anything is written."""
    nbdir, build = tmp_path / "nbs", tmp_path / "build"
    path = _notebook(nbdir, "01_sized", "rec.record('n', n, '')")
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].source += "\nn = 100\nsmoke_sizes = {'n': 3}"
    nbformat.write(nb, path)
    pipeline.run_all(notebooks_dir=nbdir, build_dir=build, book=False, progress=False, figures=False, smoke=True)
    assert [r.value for r in load_records(build / "results" / "01_sized.json")] == [3]
    nb.cells[1].source += "\nsmoke_sizes = {'results_path': 'x'}"
    nbformat.write(nb, path)
    with pytest.raises(pipeline.ReproduceError, match="results_path"):
        pipeline.run_all(notebooks_dir=nbdir, build_dir=tmp_path / "b2", book=False, progress=False, figures=False,
                         smoke=True)
