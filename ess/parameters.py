"""A notebook's parameters cell, read without running it: the cell tagged ``parameters`` (papermill's convention),
each assignment a Python literal. The pipeline injects a notebook's CI sizes (its ``smoke_sizes``) from here, the
repeated real-model check reads its design from here, and the browser tests' notebook copies take both."""
from __future__ import annotations

import ast
from pathlib import Path

from . import validate

__all__ = ["notebook_parameters", "smoke_sizes", "RESERVED"]

#: the parameters the pipeline sets itself; a notebook's ``smoke_sizes`` may not name them
RESERVED = ("smoke", "results_path", "smoke_sizes")


def notebook_parameters(path) -> dict:
    """``{name: value}`` of the notebook's parameters cell (the first code cell tagged ``parameters``), each value a
    Python literal; a ``ValueError`` naming the notebook when it has no such cell or an assignment is not a
    literal, ``FileNotFoundError`` when there is no notebook at ``path``."""
    import nbformat
    path = validate.path("path", path)
    if not path.is_file():
        raise FileNotFoundError(f"no notebook at {path}")
    nb = nbformat.read(str(path), as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and "parameters" in c.get("metadata", {}).get("tags", [])]
    if not cells:
        raise ValueError(f"{path.name} has no cell tagged 'parameters'")
    out = {}
    for node in ast.parse(cells[0].source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                raise ValueError(f"{path.name}: parameter {node.targets[0].id} is not a literal") from None
    return out


def smoke_sizes(path) -> dict:
    """The CI sizes the notebook declares as ``smoke_sizes`` in its parameters cell (``{}`` without them): what a
    smoke run injects beside ``smoke=True``, so that a notebook never rebinds its own globals. A ``ValueError``
    naming the notebook when they are not a dict of parameter names or name one of :data:`RESERVED`."""
    sizes = notebook_parameters(path).get("smoke_sizes", {})
    name = Path(path).name
    if not isinstance(sizes, dict) or not all(isinstance(k, str) and k.isidentifier() for k in sizes):
        raise ValueError(f"{name}: smoke_sizes must be a dict of parameter names to values")
    clash = sorted(set(sizes) & set(RESERVED))
    if clash:
        raise ValueError(f"{name}: smoke_sizes may not set the pipeline's own {clash}")
    return sizes
