"""The reproduction pipeline: execute every notebook with papermill, collect the records, build the book.

``ess reproduce`` (or ``python -m ess reproduce``):

1. for each ``notebooks/NN_name.ipynb`` (sorted): papermill injects ``smoke`` and ``results_path`` into the cell
   tagged ``parameters`` and writes the executed notebook to ``build/notebooks/``; the notebook records its
   numbers into ``build/results/NN_name.json``;
2. writes ``build/results/index.json`` (per notebook: records, seconds, status);
3. stages ``book/`` with the executed notebooks into ``build/book_src/`` (the table of contents is generated:
   the intro, then ``book/pages/*.md``, then the notebooks) and builds it with Jupyter Book 1.x, warnings as errors,
   into ``build/book/`` (open ``build/book/_build/html/index.html``).

A failing notebook stops the run with an error that names the notebook and the cell.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

__all__ = ["ROOT", "ReproduceError", "NotebookRun", "list_notebooks", "run_notebook", "run_all", "build_book"]

ROOT = Path(__file__).resolve().parent.parent


class ReproduceError(RuntimeError):
    """A notebook failed, or the book did not build."""


@dataclass(frozen=True)
class NotebookRun:
    name: str
    output: Path
    results: Path
    n_records: int
    seconds: float


def list_notebooks(notebooks_dir: Path | None = None) -> list[Path]:
    """The notebooks the pipeline runs, in order (``NN_name.ipynb``)."""
    notebooks_dir = Path(notebooks_dir or ROOT / "notebooks")
    return sorted(p for p in notebooks_dir.glob("[0-9][0-9]_*.ipynb"))


def _select(notebooks: list[Path], only: list[str] | None) -> list[Path]:
    if not only:
        return notebooks
    names = {p.stem: p for p in notebooks}
    chosen = []
    for want in only:
        hits = [p for stem, p in names.items() if stem == want or stem.startswith(want) or stem[3:] == want]
        if len(hits) != 1:
            raise ValueError(f"--only {want!r} matches {len(hits)} notebooks; choose one of: {', '.join(names)}")
        chosen.append(hits[0])
    return chosen


CELL_TIMEOUT_S = 1800   # design choice: the slowest full-size cell takes about a minute here; a hang fails, not waits


def run_notebook(path: Path, build_dir: Path, *, smoke: bool = False, kernel_name: str = "python3",
                 cell_timeout_s: int = CELL_TIMEOUT_S) -> NotebookRun:
    """Execute one notebook with papermill; raise :class:`ReproduceError` naming the failing (or hanging) cell."""
    import papermill as pm
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    name = path.stem
    out = build_dir / "notebooks" / path.name
    results = build_dir / "results" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    results.parent.mkdir(parents=True, exist_ok=True)
    results.unlink(missing_ok=True)
    start = time.perf_counter()
    try:
        pm.execute_notebook(str(path), str(out), parameters={"smoke": smoke, "results_path": str(results)},
                            kernel_name=kernel_name, progress_bar=False, cwd=str(path.parent),
                            execution_timeout=cell_timeout_s)
    except PapermillExecutionError as exc:
        raise ReproduceError(f"notebook {path.name} failed in cell {exc.cell_index} (execution count "
                             f"{exc.exec_count}): {exc.ename}: {exc.evalue}\n  executed copy: {out}") from None
    except CellTimeoutError as exc:
        preview = " | ".join(line for line in str(exc).splitlines()[4:7] if line.strip("-"))
        raise ReproduceError(f"notebook {path.name}: a cell ran longer than {cell_timeout_s} s and was stopped "
                             f"({preview})\n  executed copy: {out}") from None
    except DeadKernelError as exc:
        raise ReproduceError(f"notebook {path.name}: the kernel died ({exc})\n  executed copy: {out}") from None
    seconds = time.perf_counter() - start
    if not results.exists():
        raise ReproduceError(f"notebook {path.name} ran but recorded no results (expected {results}); "
                             f"it must call Recorder.save()")
    n_records = len(json.loads(results.read_text(encoding="utf-8")))
    return NotebookRun(name, out, results, n_records, seconds)


def run_all(*, smoke: bool = False, only: list[str] | None = None, book: bool = True,
            build_dir: Path | None = None, notebooks_dir: Path | None = None, progress: bool = True,
            cell_timeout_s: int = CELL_TIMEOUT_S, retries: int = 1) -> list[NotebookRun]:
    """Execute the notebooks (all, or ``only`` some), write the results index, then build the book.

    A notebook whose cell times out is run again up to ``retries`` times; any other failure stops the run."""
    from tqdm.auto import tqdm

    build_dir = Path(build_dir or ROOT / "build").resolve()
    notebooks = _select(list_notebooks(notebooks_dir), only)
    if not notebooks:
        raise ReproduceError(f"no notebooks found in {notebooks_dir or ROOT / 'notebooks'}")
    runs = []
    bar = tqdm(notebooks, desc="notebooks", unit="nb", disable=not progress, file=sys.stderr)
    for path in bar:
        bar.set_postfix_str(path.stem)
        for attempt in range(1 + retries):
            try:
                runs.append(run_notebook(path, build_dir, smoke=smoke, cell_timeout_s=cell_timeout_s))
                break
            except ReproduceError as exc:
                # nbclient occasionally never sees the reply of a cell that displays widgets (jupyter/nbclient#312,
                # open): a timed-out cell is run again from a fresh kernel; a cell that raised is not.
                if "ran longer than" not in str(exc) or attempt == retries:
                    raise
                print(f"\n{exc}\nretrying {path.name} ({attempt + 1}/{retries})", file=sys.stderr)
    index_path = build_dir / "results" / "index.json"
    index = json.loads(index_path.read_text(encoding="utf-8")) if index_path.exists() else {}
    for r in runs:
        index[r.name] = {"records": r.n_records, "seconds": round(r.seconds, 2), "smoke": smoke,
                         "results": str(r.results.relative_to(build_dir))}
    index_path.write_text(json.dumps(index, indent=1, sort_keys=True), encoding="utf-8")
    if book:
        build_book(build_dir=build_dir)
    return runs


def _title(notebook: Path) -> str:
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            for line in "".join(cell.get("source", "")).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return notebook.stem


def stage_book(build_dir: Path, book_dir: Path | None = None) -> Path:
    """Copy ``book/`` and the executed notebooks into ``build/book_src`` and write its ``_toc.yml``."""
    book_dir = Path(book_dir or ROOT / "book")
    src = build_dir / "book_src"
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(book_dir, src)
    executed = sorted((build_dir / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if not executed:
        raise ReproduceError(f"no executed notebooks in {build_dir / 'notebooks'}: run the notebooks first")
    (src / "notebooks").mkdir(exist_ok=True)
    for nb in executed:
        shutil.copy2(nb, src / "notebooks" / nb.name)
    pages = sorted((src / "pages").glob("*.md")) if (src / "pages").exists() else []
    parts = []
    if pages:
        parts.append({"caption": "Background", "chapters": [{"file": f"pages/{p.stem}"} for p in pages]})
    parts.append({"caption": "Notebooks", "chapters": [{"file": f"notebooks/{nb.stem}"} for nb in executed]})
    toc = {"format": "jb-book", "root": "intro", "parts": parts}
    (src / "_toc.yml").write_text(yaml.safe_dump(toc, sort_keys=False), encoding="utf-8")
    return src


def build_book(*, build_dir: Path | None = None, book_dir: Path | None = None) -> Path:
    """Build the Jupyter Book (1.x) from ``book/`` plus the executed notebooks; warnings are errors."""
    build_dir = Path(build_dir or ROOT / "build").resolve()
    src = stage_book(build_dir, book_dir)
    out = build_dir / "book"
    if out.exists():
        shutil.rmtree(out)
    exe = Path(sys.executable).parent / "jupyter-book"
    cmd = [str(exe) if exe.exists() else "jupyter-book", "build", str(src), "--path-output", str(out),
           "-W", "-n", "--keep-going"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise ReproduceError(f"the book did not build (jupyter-book exit {proc.returncode}):\n{tail}")
    html = out / "_build" / "html" / "index.html"
    if not html.exists():
        raise ReproduceError(f"jupyter-book succeeded but {html} is missing")
    return html
