"""Strip a notebook to what is committed: its cells' sources, their ids and tags, and the kernelspec. Outputs,
execution counts, widget state and run metadata (papermill, ess, timings) go.

Used as git's clean filter for ``notebooks/*.ipynb`` (``.gitattributes``; ``scripts/ess.sh setup`` registers it), so
that a notebook saved from JupyterLab after a run — with several MB of plotly.js in its outputs — is committed
without them, and the working copy keeps its outputs. Standard library only, so it runs with any Python 3:

    python3 tools/nbstrip.py < notebooks/01_memory_wall.ipynb        # the stripped notebook on stdout
    python3 tools/nbstrip.py notebooks/01_memory_wall.ipynb ...       # strip these files in place

A notebook written by ``tools/nbbuild.py`` comes out byte for byte unchanged.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

KEEP_CELL_METADATA = ("tags",)


def strip(nb: dict) -> dict:
    """The committed form of a notebook (a new dict; ``nb`` is left as it was)."""
    out = {k: v for k, v in nb.items() if k != "cells"}
    meta = dict(nb.get("metadata", {}))
    out["metadata"] = {k: meta[k] for k in ("kernelspec", "language_info") if k in meta}
    if "language_info" in out["metadata"]:
        out["metadata"]["language_info"] = {"name": out["metadata"]["language_info"].get("name", "python")}
    cells = []
    for cell in nb.get("cells", []):
        c = {k: v for k, v in cell.items() if k not in ("outputs", "execution_count", "metadata")}
        c["metadata"] = {k: v for k, v in cell.get("metadata", {}).items() if k in KEEP_CELL_METADATA}
        if cell.get("cell_type") == "code":
            c["outputs"] = []
            c["execution_count"] = None
        cells.append(c)
    out["cells"] = cells
    return out


def dumps(nb: dict) -> str:
    """As `tools/nbbuild.py` writes a notebook (nbformat.writes): one-space indent, sorted keys, UTF-8 kept."""
    return json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False)


def main(argv: list[str]) -> int:
    if not argv:
        sys.stdout.write(dumps(strip(json.load(sys.stdin))))
        return 0
    for name in argv:
        path = Path(name)
        path.write_text(dumps(strip(json.loads(path.read_text(encoding="utf-8")))), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
