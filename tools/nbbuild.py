"""Write a notebook from a light "percent" script: cells start with ``# %%`` (code), ``# %% [markdown]`` or
``# %% [parameters]`` (the papermill parameters cell) or ``# %% [hide-input]`` (a code cell whose input the book folds
away, e.g. long set-up). Used by authors to keep notebooks reviewable as text:

    python tools/nbbuild.py notebooks/src/01_memory_wall.py notebooks/01_memory_wall.ipynb
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import nbformat


def build(src: Path, dst: Path) -> None:
    cells, kind, lines = [], None, []

    def flush():
        if kind is None:
            return
        text = "\n".join(lines).strip("\n")
        if kind == "markdown":
            text = "\n".join(l[2:] if l.startswith("# ") else l.lstrip("#") for l in text.splitlines())
            cells.append(nbformat.v4.new_markdown_cell(text))
        else:
            cell = nbformat.v4.new_code_cell(text)
            if kind in ("parameters", "hide-input"):
                cell.metadata["tags"] = [kind]
            cells.append(cell)

    for line in src.read_text(encoding="utf-8").splitlines():
        if line.startswith("# %%"):
            flush()
            tag = line[4:].strip()
            kind = {"[markdown]": "markdown", "[parameters]": "parameters", "[hide-input]": "hide-input"}.get(
                tag, "code")
            lines = []
        else:
            lines.append(line)
    flush()
    seen: dict = {}                             # stable ids from the cell's text: rebuilding changes nothing, and
    for cell in cells:                          # inserting a cell elsewhere leaves the other ids (and merges) alone
        n = seen[cell.source] = seen.get(cell.source, 0) + 1
        cell["id"] = hashlib.sha1(f"{src.stem}:{n}:{cell.source}".encode()).hexdigest()[:12]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ess)", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.validate(nb)
    dst.write_text(nbformat.writes(nb), encoding="utf-8")


if __name__ == "__main__":
    build(Path(sys.argv[1]), Path(sys.argv[2]))
