"""Static checks of the notebooks: in step with their sources, a kernelspec, one literals-only parameters cell."""
import ast
import json
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
    cells = lambda p: [(c["cell_type"], "".join(c["source"])) for c in json.loads(p.read_text())["cells"]]
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
