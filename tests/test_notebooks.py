"""Static checks of the notebooks: in step with their sources, a kernelspec, one literals-only parameters cell, no
outputs committed."""
import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import nbbuild  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_matches_its_source(nb, tmp_path):
    src = ROOT / "notebooks" / "src" / f"{nb.stem}.py"
    assert src.exists(), f"{nb.name} has no source {src.name}"
    out = tmp_path / nb.name
    nbbuild.build(src, out)
    cells = lambda p: [(c["cell_type"], "".join(c["source"]), c.get("metadata", {}).get("tags", []))
                       for c in json.loads(p.read_text())["cells"]]
    assert cells(nb) == cells(out), f"{nb.name} differs from {src.name}: run tools/nbbuild.py"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_shape(nb):
    data = json.loads(nb.read_text())
    assert data["metadata"]["kernelspec"]["name"] == "python3"
    params = [c for c in data["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1, "exactly one cell tagged 'parameters'"
    tree = ast.parse("".join(params[0]["source"]))
    names = set()
    for stmt in tree.body:
        assert isinstance(stmt, ast.Assign), "the parameters cell holds assignments only"
        ast.literal_eval(stmt.value)                      # literals only: papermill does not recompute
        names |= {t.id for t in stmt.targets}
    assert {"smoke", "results_path"} <= names
    for cell in data["cells"]:
        if cell["cell_type"] == "code":
            for node in ast.walk(ast.parse("".join(cell["source"]))):
                assert not isinstance(node, (ast.FunctionDef, ast.ClassDef)), "no def/class in notebooks"
    first = data["cells"][0]
    assert first["cell_type"] == "markdown" and "".join(first["source"]).startswith("# ")


def _committed(nb: Path) -> str:
    """The notebook as committed (git's index, through the clean filter), or the file outside a git checkout."""
    rel = nb.relative_to(ROOT).as_posix()
    try:
        proc = subprocess.run(["git", "-C", str(ROOT), "show", f":{rel}"], capture_output=True, timeout=60)
    except OSError:
        return nb.read_text(encoding="utf-8")
    return proc.stdout.decode("utf-8") if proc.returncode == 0 else nb.read_text(encoding="utf-8")


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_outputs_are_committed(nb):
    """A notebook saved after a run carries MB of outputs (plotly.js in every figure): never committed."""
    data = json.loads(_committed(nb))
    for cell in data["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, f"{nb.name}: outputs committed"
        assert set(cell.get("metadata", {})) <= {"tags"}, f"{nb.name}: cell metadata {cell['metadata']}"
    assert not {"widgets", "papermill", "ess"} & set(data["metadata"]), f"{nb.name}: run metadata committed"


def test_the_clean_filter_strips_a_run_and_keeps_the_sources(tmp_path):
    """tools/nbstrip.py (git's clean filter, .gitattributes) leaves a committed notebook byte for byte as it is and
    takes a run's outputs, counts and metadata off, keeping every source, id and tag."""
    import nbstrip

    attributes = (ROOT / ".gitattributes").read_text()
    assert "notebooks/*.ipynb filter=ess-nbstrip" in attributes
    for nb in NOTEBOOKS:
        text = nb.read_text(encoding="utf-8")
        assert nbstrip.dumps(nbstrip.strip(json.loads(text))) == text, nb.name
    ran = json.loads(NOTEBOOKS[0].read_text())
    for i, cell in enumerate(ran["cells"]):
        cell["metadata"]["papermill"] = {"status": "completed"}
        cell["metadata"]["execution"] = {"iopub.status.idle": "2026-01-01"}
        if cell["cell_type"] == "code":
            cell["execution_count"] = i
            cell["outputs"] = [{"output_type": "display_data", "metadata": {},
                                "data": {"text/html": "<script>" + "x" * 100_000 + "</script>"}}]
    ran["metadata"].update(widgets={"application/vnd.jupyter.widget-state+json": {}}, papermill={"x": 1},
                           language_info={"name": "python", "version": "3.11.7", "codemirror_mode": {}})
    path = tmp_path / "ran.ipynb"
    path.write_text(json.dumps(ran))
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "nbstrip.py")], input=path.read_text(),
                          capture_output=True, text=True, check=True)
    assert proc.stdout == NOTEBOOKS[0].read_text(encoding="utf-8")


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_never_rebinds_its_globals_and_its_ci_sizes_are_parameters(nb):
    """The CI sizes reach a smoke run as papermill parameters (ess.parameters.smoke_sizes); a notebook that
    rebinds its own globals hides them from the reader and from papermill's record of the run."""
    src = nb.parent / "src" / f"{nb.stem}.py"
    assert "globals().update" not in src.read_text() and "globals()[" not in src.read_text()
    from ess.parameters import notebook_parameters, smoke_sizes
    params = notebook_parameters(nb)
    assert set(smoke_sizes(nb)) <= set(params), "a CI size names no parameter of the notebook"
