"""The reproduction pipeline: execute every notebook with papermill, record the run, render figures, build the book.

``ess reproduce`` (or ``python -m ess reproduce``):

1. claims the build folder (:mod:`ess.builddir`: one ``ess`` created, or an empty or new one; never the sources)
   and holds it for the run;
2. writes ``build/results/index.json`` at once (status ``running``), after each notebook and at the end: which
   notebooks, smoke or full, start and end times, the status of each notebook and of the run, versions; results
   of earlier runs still in the folder are listed apart, as earlier;
3. for each notebook (sorted): removes what an earlier run left for it, executes it with papermill in a child
   process (:mod:`ess.nbrun`) into ``build/.partial/<notebook>/``, the kernel's working folder, with
   ``results_path = "results/<notebook>.json"`` relative to it (no path of this machine lands in the notebook);
   only when it finished are the run's details stamped into the notebook's metadata (``ess``) and the results
   file's ``run`` header, and both moved to ``build/notebooks/`` and ``build/results/``. A notebook that fails or
   is interrupted (Ctrl-C, SIGTERM) gets a banner cell and ``ess.status`` saying so, is moved to
   ``build/notebooks/failed/``, and the run stops; nothing of it is left that looks complete;
4. renders the figures the notebooks kept with ``Recorder.figure`` to ``build/figures/`` (:mod:`ess.static_figures`);
5. builds the book (:mod:`ess.book`).

A failing notebook stops the run with an error that names the notebook and the cell.
"""
from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .builddir import ROOT, BuildDir, BuildDirError, ReproduceError
from .atomic import write_json_atomic, write_text_atomic
from .results import load_results, utc_now

__all__ = ["ROOT", "ReproduceError", "BuildDirError", "RunInterrupted", "NotebookRun", "list_notebooks",
           "run_notebook", "run_all", "build_book", "stage_book", "CELL_TIMEOUT_S", "INDEX_FORMAT"]

CELL_TIMEOUT_S = 1800   # design choice: the slowest full-size cell takes about a minute here; a hang fails, not waits
INDEX_FORMAT = "ess-index/1"
_STOP_GRACE_S = 60      # how long a stopped notebook's child may take to shut its kernel down before it is killed


class RunInterrupted(KeyboardInterrupt):
    """The run was stopped by a signal (SIGTERM); Ctrl-C raises a plain ``KeyboardInterrupt``."""

    def __init__(self, signame: str):
        super().__init__(signame)
        self.signame = signame


class _NotebookFailed(ReproduceError):
    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


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


def check_cell_timeout(seconds) -> int:
    """A cell timeout must be a positive, finite number of seconds (fractions round up)."""
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
        raise TypeError(f"cell_timeout_s must be a number of seconds, got {seconds!r}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"cell_timeout_s must be a positive number of seconds, got {seconds!r}")
    return int(math.ceil(seconds))


# -- one notebook -------------------------------------------------------------------------------------------------

def _stop(proc: subprocess.Popen) -> None:
    """Stop a notebook's child: SIGTERM (nbclient shuts the kernel down), then SIGKILL after a grace period."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _die_with_parent() -> None:
    """In the child, before exec: on Linux, get SIGTERM when the pipeline dies (even by SIGKILL), so that no
    notebook runs on as an orphan; nbclient then shuts its kernel down."""
    if sys.platform.startswith("linux"):
        import ctypes
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))


def _describe(path: Path, error: dict, cell_timeout_s: int) -> str:
    kind = error.get("kind")
    if kind == "cell_error":
        return (f"notebook {path.name} failed in cell {error['cell_index']} (execution count {error['exec_count']}): "
                f"{error['ename']}: {error['evalue']}")
    if kind == "timeout":
        return (f"notebook {path.name}: a cell ran longer than {cell_timeout_s} s and was stopped "
                f"({error.get('preview', '')})")
    if kind == "dead_kernel":
        return f"notebook {path.name}: the kernel died ({error.get('message', '')})"
    return f"notebook {path.name}: {error.get('message', 'failed')}"


def _set_aside(build: BuildDir, path: Path, partial_nb: Path, status: str, message: str, run_id: str) -> Path | None:
    """Keep a notebook that did not finish under ``build/notebooks/failed/``, marked so that it cannot pass for a
    complete one: a banner cell, ``metadata.ess.status``, and its never-run cells marked ``not run`` (papermill
    marks them ``completed`` when a run stops). Returns where it went (None when there was nothing readable)."""
    import nbformat

    dest = build.sub("notebooks") / "failed" / path.name
    dest.parent.mkdir(exist_ok=True)
    build.remove(f"notebooks/failed/{path.name}")
    kept = None
    if partial_nb.exists():
        try:
            nb = nbformat.read(partial_nb, as_version=4)
        except Exception:  # noqa: BLE001 - a notebook torn by a kill is not kept: it could not be read anyway
            nb = None
        if nb is not None:
            for cell in nb.cells:
                if cell.cell_type == "code" and cell.get("execution_count") is None:
                    cell.metadata.setdefault("papermill", {})["status"] = "not run"
            banner = nbformat.v4.new_markdown_cell(
                f"**This notebook did not finish: {status}.** {message}. Its outputs stop where the run stopped, "
                f"and none of its results were kept.")
            banner.metadata["tags"] = ["ess-run-status"]
            nb.cells.insert(0, banner)
            nb.metadata["ess"] = {"status": status, "message": message, "run_id": run_id, "stopped": utc_now()}
            _scrub_papermill_paths(nb, path)
            write_text_atomic(dest, nbformat.writes(nb))
            kept = dest
    build.remove(f".partial/{path.stem}")
    return kept


def _scrub_papermill_paths(nb, path: Path) -> None:
    """papermill stores the absolute input and output paths in the notebook's metadata: keep them relative (the
    source under the repository, the copy under the build folder), so no path of this machine is published."""
    meta = nb.metadata.get("papermill")
    if meta is not None:
        meta["input_path"] = f"notebooks/{path.name}"
        meta["output_path"] = f"notebooks/{path.name}"


@contextlib.contextmanager
def _signals_deferred():
    """Hold Ctrl-C and SIGTERM back while a finished notebook is moved into place and recorded, so that an interrupt
    never leaves it half there (the signal arrives right after)."""
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def run_notebook(path: Path, build: BuildDir, *, smoke: bool = False, kernel_name: str = "python3",
                 cell_timeout_s: int = CELL_TIMEOUT_S, run_id: str = "",
                 on_complete: Callable[[NotebookRun], None] | None = None) -> NotebookRun:
    """Execute one notebook (see the module docstring); raise :class:`ReproduceError` naming the failing (or
    hanging) cell. ``build`` is a claimed :class:`~ess.builddir.BuildDir`; ``on_complete(run)`` is called once the
    notebook is in place, before any interrupt held back meanwhile is let through."""
    import nbformat

    name = path.stem
    work = build.sub(".partial") / name
    build.remove(f".partial/{name}")
    (work / "results").mkdir(parents=True)
    partial_nb, partial_res = work / path.name, work / "results" / f"{name}.json"
    partial_figs = work / "results" / f"{name}.figures"
    error_path, log_path = work / "error.json", work / "papermill.log"
    # this run replaces what an earlier run left for this notebook: nothing stale stays beside a failure
    for rel in (f"notebooks/{path.name}", f"results/{name}.json", f"results/{name}.figures",
                f"notebooks/failed/{path.name}"):
        build.remove(rel)
    spec = {"input": str(path.resolve()), "output": str(partial_nb), "cwd": str(work),
            "parameters": {"smoke": smoke, "results_path": f"results/{name}.json"},
            "kernel_name": kernel_name, "cell_timeout_s": cell_timeout_s, "error_path": str(error_path)}
    (work / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    started, t0 = utc_now(), time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ess.nbrun", str(work / "spec.json")], cwd=work,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_die_with_parent)
        try:
            rc = proc.wait()
        except BaseException as exc:          # Ctrl-C or SIGTERM: stop the child, mark what it left
            _stop(proc)
            why = getattr(exc, "signame", "Ctrl-C") if isinstance(exc, KeyboardInterrupt) else type(exc).__name__
            _set_aside(build, path, partial_nb, "interrupted", f"the run was interrupted ({why})", run_id)
            raise

    def fail(message: str, kind: str = "error"):
        kept = _set_aside(build, path, partial_nb, "failed", message, run_id)
        where = f"\n  executed copy: {kept}" if kept else ""
        return _NotebookFailed(message + where, kind)

    with _signals_deferred():
        if rc != 0:
            if error_path.exists():
                error = json.loads(error_path.read_text(encoding="utf-8"))
            else:
                tail = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-3:]
                error = {"kind": "error", "message": f"its runner exited with {rc}: " + " | ".join(tail)}
            raise fail(_describe(path, error, cell_timeout_s), error.get("kind", "error"))
        if not partial_res.exists():
            raise fail(f"notebook {path.name} ran but recorded no results (expected results/{name}.json); it must "
                       f"call Recorder.save()")
        try:
            results = load_results(partial_res)
        except ValueError as exc:
            raise fail(f"notebook {path.name}: {exc}") from None
        said = results.run.get("smoke")
        if results.run.get("notebook") != name:
            raise fail(f"notebook {path.name} recorded its results as {results.run.get('notebook')!r}; the Recorder "
                       f"must be named {name!r}")
        if said is not None and said != smoke:
            raise fail(f"notebook {path.name} says smoke={said} but ran with smoke={smoke}")
        mode = "smoke" if smoke else "full"
        finished = utc_now()
        stamp = {"run_id": run_id, "mode": mode, "smoke": smoke, "started": started, "finished": finished,
                 "status": "complete"}
        raw = json.loads(partial_res.read_text(encoding="utf-8"))
        raw["run"] = {**raw.get("run", {}), "notebook": name, **stamp}
        write_json_atomic(partial_res, raw)
        nb = nbformat.read(partial_nb, as_version=4)
        nb.metadata["ess"] = {"notebook": name, **stamp}
        _scrub_papermill_paths(nb, path)
        write_text_atomic(partial_nb, nbformat.writes(nb))
        # into place: figures, results, then the notebook (what the book reads) last
        out = build.sub("notebooks") / path.name
        results_path = build.sub("results") / f"{name}.json"
        if partial_figs.exists():
            os.replace(partial_figs, build.path / "results" / f"{name}.figures")
        os.replace(partial_res, results_path)
        os.replace(partial_nb, out)
        build.remove(f".partial/{name}")
        run = NotebookRun(name, out, results_path, len(results.records), time.perf_counter() - t0)
        if on_complete is not None:
            on_complete(run)
    return run


# -- the run and its index ----------------------------------------------------------------------------------------

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


class _RunIndex:
    """``build/results/index.json``: exactly the current run, rewritten atomically at every change."""

    def __init__(self, build: BuildDir, notebooks: list[Path], *, run_id: str, smoke: bool, book: bool,
                 figures: bool, cell_timeout_s: int, only: list[str] | None):
        self.path = build.sub("results") / "index.json"
        names = [p.stem for p in notebooks]
        self.data = {
            "format": INDEX_FORMAT,
            "run": {"id": run_id, "mode": "smoke" if smoke else "full", "smoke": smoke, "started": utc_now(),
                    "finished": None, "status": "running", "only": only or None, "cell_timeout_s": cell_timeout_s,
                    "versions": _versions()},
            "notebooks": {n: {"status": "pending"} for n in names},
            "earlier_results": self._earlier(build, set(names)),
            "figures": {"status": "pending" if figures else "skipped"},
            "book": {"status": "pending" if book else "skipped"},
        }
        self.write()

    @staticmethod
    def _earlier(build: BuildDir, names: set[str]) -> dict:
        """Results files of earlier runs that this run leaves in place (it does not run their notebooks)."""
        earlier = {}
        for p in sorted((build.path / "results").glob("[0-9][0-9]_*.json")):
            if p.stem in names:
                continue
            try:
                run = load_results(p).run
                earlier[p.stem] = {"results": f"results/{p.name}", "mode": run.get("mode", "unknown"),
                                   "run_id": run.get("run_id"), "finished": run.get("finished")}
            except ValueError as exc:
                earlier[p.stem] = {"results": f"results/{p.name}", "error": str(exc)}
        return earlier

    def write(self) -> None:
        write_json_atomic(self.path, self.data)

    def notebook(self, name: str, **fields) -> None:
        self.data["notebooks"][name].update(fields)
        self.write()

    def part(self, key: str, **fields) -> None:
        self.data[key] = fields
        self.write()

    def end(self, status: str) -> None:
        for entry in self.data["notebooks"].values():
            if entry["status"] in ("pending", "running"):
                entry["status"] = "not run" if entry["status"] == "pending" else status
        for key in ("figures", "book"):
            if self.data[key]["status"] == "pending":
                self.data[key] = {"status": "not run"}
        self.data["run"].update(finished=utc_now(), status=status)
        self.write()


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


def run_all(*, smoke: bool = False, only: list[str] | None = None, book: bool = True,
            build_dir: Path | None = None, notebooks_dir: Path | None = None, progress: bool = True,
            cell_timeout_s: int = CELL_TIMEOUT_S, retries: int = 1, figures: bool = True) -> list[NotebookRun]:
    """Execute the notebooks (all, or ``only`` some), render their kept figures, then build the book.

    A notebook whose cell times out is run again up to ``retries`` times; any other failure stops the run.
    ``build/results/index.json`` says at every moment what this run did and is doing."""
    cell_timeout_s = check_cell_timeout(cell_timeout_s)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be a non-negative integer, got {retries!r}")
    notebooks = _select(list_notebooks(notebooks_dir), only)
    if not notebooks:
        raise ReproduceError(f"no notebooks found in {notebooks_dir or ROOT / 'notebooks'}")
    build = BuildDir.claim(build_dir)
    with build.lock(), _sigterm_interrupts():
        return _run(build, notebooks, smoke=smoke, only=only, book=book, progress=progress,
                    cell_timeout_s=cell_timeout_s, retries=retries, figures=figures)


def _run(build: BuildDir, notebooks: list[Path], *, smoke, only, book, progress, cell_timeout_s, retries,
         figures) -> list[NotebookRun]:
    from tqdm.auto import tqdm

    run_id = uuid.uuid4().hex[:12]
    index = _RunIndex(build, notebooks, run_id=run_id, smoke=smoke, book=book, figures=figures,
                      cell_timeout_s=cell_timeout_s, only=only)
    runs, current = [], None

    def complete(run: NotebookRun, attempt: int) -> None:
        nonlocal current
        index.notebook(run.name, status="complete", finished=utc_now(), seconds=round(run.seconds, 2),
                       records=run.n_records, attempts=attempt + 1, results=f"results/{run.results.name}",
                       executed=f"notebooks/{run.output.name}")
        runs.append(run)
        current = None

    try:
        build.remove(".partial")                 # what a killed run left half-done
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
                except _NotebookFailed as exc:
                    # nbclient occasionally never sees the reply of a cell that displays widgets
                    # (jupyter/nbclient#312, open): a timed-out cell is run again from a fresh kernel; a cell that
                    # raised is not.
                    if exc.kind != "timeout" or attempt == retries:
                        index.notebook(current, status="failed", finished=utc_now(), attempts=attempt + 1,
                                       error=str(exc).splitlines()[0])
                        raise ReproduceError(str(exc)) from None
                    print(f"\n{exc}\nretrying {path.name} ({attempt + 1}/{retries})", file=sys.stderr)
        if figures:
            from .static_figures import render_figures
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
            index.notebook(current, status="interrupted", finished=utc_now())
        index.end("interrupted")
        raise
    except BaseException:
        index.end("failed")
        raise
    index.end("complete")
    return runs


def stage_book(build_dir=None, book_dir: Path | None = None) -> Path:
    """See :func:`ess.book.stage_book`."""
    from .book import stage_book as stage
    return stage(build_dir, book_dir)


def build_book(*, build_dir=None, book_dir: Path | None = None) -> Path:
    """See :func:`ess.book.build_book`."""
    from .book import build_book as build
    return build(build_dir=build_dir, book_dir=book_dir)
