"""A notebook's parameters cell read without running it (ess.parameters): literals only, the first tagged cell,
the CI sizes checked."""
import nbformat
import pytest

from ess.parameters import RESERVED, notebook_parameters, smoke_sizes


def _nb(tmp_path, source, tagged=True, name="a.ipynb"):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(source)
    if tagged:
        cell.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_code_cell("x = 1"), cell, nbformat.v4.new_code_cell("smoke_sizes = {'z': 1}")]
    path = tmp_path / name
    nbformat.write(nb, path)
    return path


def test_the_tagged_cells_literals_and_nothing_else(tmp_path):
    p = _nb(tmp_path, "smoke = False\nn = 100  # a comment\nsizes = [1, 2]\nsmoke_sizes = {'n': 3, 'sizes': [1]}")
    assert notebook_parameters(p) == {"smoke": False, "n": 100, "sizes": [1, 2],
                                      "smoke_sizes": {"n": 3, "sizes": [1]}}
    assert smoke_sizes(p) == {"n": 3, "sizes": [1]}                      # not the untagged cell's
    assert smoke_sizes(_nb(tmp_path, "smoke = False", name="b.ipynb")) == {}


@pytest.mark.parametrize("source,match", [
    ("n = len('abc')", "not a literal"),
    ("smoke_sizes = [1, 2]", "dict of parameter names"),
    ("smoke_sizes = {'not a name': 1}", "dict of parameter names"),
    *[(f"smoke_sizes = {{'{k}': 1}}", "own") for k in RESERVED],
])
def test_what_cannot_be_read_is_refused_by_notebook(tmp_path, source, match):
    with pytest.raises(ValueError, match=match) as info:
        smoke_sizes(_nb(tmp_path, source))
    assert "a.ipynb" in str(info.value)


def test_no_tagged_cell_or_no_notebook(tmp_path):
    with pytest.raises(ValueError, match="no cell tagged"):
        notebook_parameters(_nb(tmp_path, "n = 1", tagged=False))
    with pytest.raises(FileNotFoundError):
        notebook_parameters(tmp_path / "missing.ipynb")
    with pytest.raises(TypeError, match="path"):
        notebook_parameters(3)
