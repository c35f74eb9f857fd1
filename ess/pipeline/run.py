"""The run: every notebook (or ``only`` some) executed, its figures rendered, the book built.

``ess reproduce`` (or ``python -m ess reproduce``) calls :func:`run_all`, which

1. checks every argument, then claims the build folder (:mod:`ess.pipeline.build_folder`: one ``ess`` created, or
   an empty or new one; never the sources, never a folder that holds an input) and holds it for the run;
2. writes ``build/results/index.json`` (:mod:`ess.pipeline.index`) at once, after each notebook and at the end:
   which notebooks, smoke or full, start and end times, the status of each notebook and of the run, versions, per
   notebook its wall time and its kernel's peak memory, and whose results are in place (this run's, or an earlier
   run's that this one did not replace);
3. executes each notebook (sorted) in a process of its own (:mod:`ess.pipeline.notebook`); its new results and
   executed copy replace the earlier run's only once it finished, so that a failure or an interrupt (Ctrl-C,
   SIGTERM, kill -9) leaves the last complete results in place; a timed-out cell is retried from a fresh kernel,
   any other failure stops the run with the notebook and cell named;
4. renders the figures the notebooks kept with ``Recorder.figure`` to ``build/figures/``
   (:mod:`ess.pipeline.figures`);
5. builds the book (:mod:`ess.pipeline.book`).
"""
from __future__ import annotations

import contextlib
import os
import platform
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

from ..results import utc_now
from ..validate import path as _folder
from .build_folder import ROOT, BuildDir, shorten
from .errors import ReproduceError, RunInterrupted
from .index import RunIndex
from .notebook import CELL_TIMEOUT_S, NotebookFailed, NotebookRun, check_cell_timeout, run_notebook

__all__ = ["run_all", "list_notebooks", "select_notebooks"]


def list_notebooks(notebooks_dir: str | os.PathLike | None = None) -> list[Path]:
    """The notebooks the pipeline runs, in order (``NN_name.ipynb`` in ``notebooks_dir``, default the
    repository's ``notebooks/``); a ``ValueError`` when the folder does not exist."""
    folder = ROOT / "notebooks" if notebooks_dir is None else _folder("notebooks_dir", notebooks_dir)
    try:
        if not folder.is_dir():
            raise ValueError(f"notebooks_dir {shorten(folder)} is not a folder")
        return sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb") if p.is_file())
    except OSError as exc:                            # a name too long for the file system, an unreadable folder
        raise ValueError(f"notebooks_dir {shorten(folder)}: {exc.strerror or exc}") from None


def select_notebooks(notebooks: list[Path], only: list[str] | None) -> list[Path]:
    """The notebooks ``only`` names (each by its number ``01``, a prefix, its full name or its name without the
    number), in the order given; all of them when ``only`` is None or empty. A name that matches none or several,
    or a notebook named twice, is a ``ValueError``."""
    if only is None:
        return notebooks
    if isinstance(only, (str, bytes)) or not isinstance(only, (list, tuple)):
        raise TypeError(f"only must be a list of notebook names, got {type(only).__name__} {only!r}")
    if not only:
        return notebooks
    names = {p.stem: p for p in notebooks}
    chosen: list[Path] = []
    for want in only:
        if not isinstance(want, str):
            raise TypeError(f"only must hold notebook names (strings), got {want!r}")
        hits = [p for stem, p in names.items() if want and (stem == want or stem.startswith(want)
                                                              or stem[3:] == want)]
        shown = repr(want) if len(want) <= 80 else f"{want[:60]!r}... ({len(want)} characters)"
        if len(hits) != 1:
            raise ValueError(f"--only {shown} matches {len(hits)} notebooks; choose one of: {', '.join(names)}")
        if hits[0] in chosen:
            raise ValueError(f"--only {shown} names {hits[0].stem} a second time")
        chosen.append(hits[0])
    return chosen


def _versions() -> dict:
    from importlib import metadata

    out = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("ess", "numpy", "numba", "torch", "pandas", "plotly", "papermill", "nbclient", "ipykernel",
                 "jupyter-book", "myst-nb", "kaleido"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30)
        if head.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=60).stdout.strip()
            out["git_commit"] = head.stdout.strip() + ("+uncommitted changes" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        pass
    return out


@contextlib.contextmanager
def _sigterm_interrupts():
    """SIGTERM (and SIGHUP) raise :class:`RunInterrupted` in the main thread, as Ctrl-C raises KeyboardInterrupt,
    so that an interrupted run is recorded and its partial notebook marked."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_interrupted(signum, frame):
        raise RunInterrupted(signal.Signals(signum).name)

    old = {s: signal.signal(s, raise_interrupted) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def run_all(*, smoke: bool = False, only: list[str] | None = None, book: bool = True,
            build_dir: str | os.PathLike | None = None, notebooks_dir: str | os.PathLike | None = None,
            progress: bool = True, cell_timeout_s: int = CELL_TIMEOUT_S, retries: int = 1,
            figures: bool = True) -> list[NotebookRun]:
    """Execute the notebooks (all, or ``only`` some), render their kept figures, then build the book (see the
    module docstring). Every argument is checked before the build folder is touched: a ``TypeError`` /
    ``ValueError`` naming it, or a :class:`~ess.pipeline.build_folder.BuildDirError` for the folder."""
    for name, value in (("smoke", smoke), ("book", book), ("progress", progress), ("figures", figures)):
        _flag(name, value)
    cell_timeout_s = check_cell_timeout(cell_timeout_s)
    if isinstance(retries, bool) or not isinstance(retries, int):
        raise TypeError(f"retries must be a non-negative integer, got {retries!r}")
    if not 0 <= retries <= 10:
        raise ValueError(f"retries must be between 0 and 10, got {retries!r}")
    if build_dir is not None and not isinstance(build_dir, BuildDir):
        build_dir = _folder("build_dir", build_dir)
    source = ROOT / "notebooks" if notebooks_dir is None else _folder("notebooks_dir", notebooks_dir)
    notebooks = select_notebooks(list_notebooks(source), only)
    if not notebooks:
        raise ValueError(f"notebooks_dir {source} holds no NN_name.ipynb notebooks")
    build = BuildDir.claim(build_dir, inputs=[source, *notebooks])
    with build.lock(), _sigterm_interrupts():
        return _run(build, notebooks, smoke=smoke, only=list(only) if only else None, book=book, progress=progress,
                    cell_timeout_s=cell_timeout_s, retries=retries, figures=figures)


def _run(build: BuildDir, notebooks: list[Path], *, smoke, only, book, progress, cell_timeout_s, retries,
         figures) -> list[NotebookRun]:
    from tqdm.auto import tqdm

    run_id = uuid.uuid4().hex[:12]
    build.remove(".partial")                     # what a killed run left half-done (never complete results)
    index = RunIndex(build, [p.stem for p in notebooks], run_id=run_id, smoke=smoke, book=book, figures=figures,
                     cell_timeout_s=cell_timeout_s, only=only, versions=_versions())
    runs, current = [], None
    mode = "smoke" if smoke else "full"

    def complete(run: NotebookRun, attempt: int) -> None:
        nonlocal current
        index.completed(run.name, mode=mode, finished=utc_now(), seconds=round(run.seconds, 2),
                        peak_rss_bytes=run.peak_rss_bytes, records=run.n_records, attempts=attempt + 1,
                        results=f"results/{run.results.name}", executed=f"notebooks/{run.output.name}")
        runs.append(run)
        current = None

    try:
        bar = tqdm(notebooks, desc="notebooks", unit="nb", disable=not progress, file=sys.stderr)
        for path in bar:
            current = path.stem
            bar.set_postfix_str(current)
            index.notebook(current, status="running", started=utc_now())
            for attempt in range(1 + retries):
                try:
                    run_notebook(path, build, smoke=smoke, cell_timeout_s=cell_timeout_s, run_id=run_id,
                                 on_complete=lambda run, a=attempt: complete(run, a))
                    break
                except NotebookFailed as exc:
                    # nbclient occasionally never sees the reply of a cell that displays widgets
                    # (jupyter/nbclient#312, open): a timed-out cell is run again from a fresh kernel; a cell that
                    # raised is not.
                    if exc.kind != "timeout" or attempt == retries:
                        index.notebook(current, status="failed", finished=utc_now(), attempts=attempt + 1,
                                       peak_rss_bytes=exc.peak_rss_bytes, error=exc.reason)
                        raise ReproduceError(str(exc)) from None
                    print(f"\n{exc}\nretrying {path.name} ({attempt + 1}/{retries})", file=sys.stderr)
        if figures:
            from .figures import render_figures
            index.part("figures", status="rendering")
            index.part("figures", **render_figures(build, [r.name for r in runs]))
        if book:
            from .book import build_book
            index.part("book", status="building")
            try:
                html = build_book(build_dir=build)
            except ReproduceError as exc:
                index.part("book", status="failed", error=str(exc).splitlines()[0])
                raise
            index.part("book", status="built", html=str(html.relative_to(build.path)))
        build.remove(".partial")
    except KeyboardInterrupt:
        if current:
            index.recheck_in_place(build, current)
            index.notebook(current, status="interrupted", finished=utc_now())
        index.end("interrupted")
        raise
    except BaseException:
        try:
            if current:
                index.recheck_in_place(build, current)
            index.end("failed")
        except OSError:              # the index cannot be written either (a full disk, a read-only folder): the
            pass                     # first error is the one to report
        raise
    index.end("complete")
    return runs
