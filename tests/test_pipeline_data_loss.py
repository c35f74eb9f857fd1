"""The pipeline never deletes what it did not create, and never loses the last complete results.

Two ways `ess reproduce` once lost data, each run here through the real command in a subprocess (with real signals)
on tiny notebooks:

* a build folder that holds the run's input notebooks (a folder ess had marked as its own, holding the notebooks
  the run reads): the run deleted the input notebook before executing it. Now the folder is refused with one line
  (exit 2) before anything is touched.
* a re-run interrupted part-way through a notebook (Ctrl-C, kill -9) or whose notebook fails: the run deleted the
  previous run's complete results, figures and executed notebook before the new ones existed. Now the new ones are
  written beside the old and swapped in only when the notebook completed; the index names the run whose results
  are in place.

The module uses only the command line and the files it writes, so that it runs unchanged against an older ``ess``.
"""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest


def _notebook(folder: Path, name: str, *cells: str) -> Path:
    """A notebook with a literals-only parameters cell, a Recorder, the given code cells and a save."""
    folder.mkdir(parents=True, exist_ok=True)
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("smoke = False\nresults_path = ''")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell(f"# {name}"), params,
                nbformat.v4.new_code_cell(f"from ess.results import Recorder\nrec = Recorder({name!r}, results_path)"),
                *[nbformat.v4.new_code_cell(c) for c in cells], nbformat.v4.new_code_cell("rec.save()")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = folder / f"{name}.ipynb"
    nbformat.write(nb, path)
    return path


def _ess(*args, cwd: Path) -> subprocess.Popen:
    """``ess`` in a child process that takes Ctrl-C as a terminal's foreground process does: with SIGINT at its
    default (a suite started in the background of a non-interactive shell hands its children SIGINT ignored, and
    Python then installs no KeyboardInterrupt handler)."""
    return subprocess.Popen([sys.executable, "-m", "ess", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _files(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_build_folder_that_holds_the_input_notebooks_is_refused_and_nothing_is_deleted(tmp_path):
    build = tmp_path / "out"
    build.mkdir()
    # `out` is an ess build folder (the marker an earlier `ess reproduce --build-dir out` left) that later holds
    # notebooks the user runs from there
    (build / ".ess-build").write_text('{"created_by": "ess"}\n')
    inputs = build / "notebooks"
    _notebook(inputs, "01_mine", "rec.record('y', 2, '')")
    (inputs / "notes.md").write_text("mine")
    before = _files(inputs)
    proc = _ess("reproduce", "--build-dir", str(build), "--notebooks-dir", str(inputs), "--no-book",
                "--no-figures", cwd=tmp_path)
    _, err = proc.communicate(timeout=300)
    after = _files(inputs)
    assert sorted(before) == sorted(after) and before == after, f"inputs changed: {sorted(before)} -> " \
                                                                 f"{sorted(after)}; stderr: {err[-300:]}"
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "an input of this command" in lines[0], err


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"the run ended before {path.name} appeared: {proc.communicate()}"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL", "fails"])
def test_an_interrupted_or_failed_rerun_keeps_the_last_complete_results(tmp_path, how):
    nbdir, build = tmp_path / "nbs", tmp_path / "build"
    keep = ("import plotly.graph_objects as go\nrec.record('x', 1, '')\n"
            "rec.figure('bars', go.Figure(go.Bar(x=['a'], y=[1])))")
    _notebook(nbdir, "01_keep", keep)
    first = _ess("reproduce", "--notebooks-dir", str(nbdir), "--build-dir", str(build), "--no-book",
                 "--no-figures", cwd=tmp_path)
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    before = {k: v for k, v in _files(build).items() if k.startswith(("results/01_keep", "notebooks/01_keep"))}
    assert "results/01_keep.json" in before and "notebooks/01_keep.ipynb" in before
    assert any(k.endswith("/bars.json") for k in before), sorted(before)
    first_id = json.loads(before["results/01_keep.json"])["run"]["run_id"]

    # the same notebook again, now failing, or running until it is stopped part-way
    tail = ("raise RuntimeError('boom')" if how == "fails" else
            "open('started', 'w').close()\nimport time\ntime.sleep(120)")
    _notebook(nbdir, "01_keep", "rec.record('x', 2, '')", tail)
    proc = _ess("reproduce", "--notebooks-dir", str(nbdir), "--build-dir", str(build), "--no-book",
                "--no-figures", cwd=tmp_path)
    if how != "fails":
        _wait_for(build / ".partial" / "01_keep" / "started", proc)
        proc.send_signal(getattr(signal, how))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0, err
    after = _files(build)
    lost = [k for k in before if k not in after or after[k] != before[k]]
    assert lost == [], f"{how}: the earlier run's complete files changed or went: {lost}; stderr {err[-300:]}"

    index = json.loads((build / "results" / "index.json").read_text())
    entry = index["notebooks"]["01_keep"]
    assert entry["status"] == {"SIGINT": "interrupted", "SIGKILL": "running", "fails": "failed"}[how]
    assert entry["in_place"] == {"run_id": first_id, "mode": "full", "this_run": False,
                                 "finished": json.loads(before["results/01_keep.json"])["run"]["finished"],
                                 "results": "results/01_keep.json"}
    assert index["run"]["id"] != first_id

    # a complete re-run swaps the new results in and drops what they replace
    _notebook(nbdir, "01_keep", "rec.record('x', 3, '')")
    proc = _ess("reproduce", "--notebooks-dir", str(nbdir), "--build-dir", str(build), "--no-book",
                "--no-figures", cwd=tmp_path)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    results = json.loads((build / "results" / "01_keep.json").read_text())
    assert [r["value"] for r in results["records"]] == [3] and results["run"]["run_id"] != first_id
    index = json.loads((build / "results" / "index.json").read_text())
    assert index["notebooks"]["01_keep"]["in_place"]["this_run"] is True
    assert sorted(p.name for p in (build / "results").iterdir()) == ["01_keep.json", "index.json"], \
        "the earlier run's figures folder goes with the results it belonged to"
    assert not (build / "notebooks" / "failed" / "01_keep.ipynb").exists()
    assert not (build / ".partial").exists() or list((build / ".partial").iterdir()) == []
