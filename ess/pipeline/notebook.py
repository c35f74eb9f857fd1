"""One notebook: executed in a process of its own into a scratch folder, swapped into place only when it finished.

:func:`run_notebook` executes ``notebooks/NN_name.ipynb`` with papermill in a child process
(:mod:`ess.pipeline.notebook_process`) into ``build/.partial/<notebook>/``, the kernel's working folder, with
``results_path = "results/<notebook>.json"`` relative to it (no path of this machine lands in the notebook).

Nothing an earlier run left in place is touched while the notebook runs: ``build/notebooks/<notebook>.ipynb``,
``build/results/<notebook>.json`` and its figures stay the last complete ones. Only when the notebook finished and
its results check out (named after the notebook, smoke as asked) are the run's details stamped into the notebook's
metadata (``ess``) and the results file's ``run`` header, and the new files swapped in, with Ctrl-C and SIGTERM
held back meanwhile, in this order:

1. the kept figures, moved to a folder named by the run (``results/<notebook>.figures-<run id>``, which the
   results file names as its ``figures_dir``);
2. the results file, written beside the old one and renamed over it (:mod:`ess.atomic`): from this instant on the
   new results are in place, whole, with their own figures;
3. the executed notebook, the same way;
4. what the new files replace: the earlier run's figures folder, a copy of this notebook set aside as failed.

A kill at any instant leaves a results file whole and its figures folder with it; between 2 and 3 (milliseconds)
the executed notebook is the earlier run's, which its ``run_id`` says. A notebook that fails or is interrupted
(Ctrl-C, SIGTERM) gets a banner cell and ``ess.status`` saying so and is kept under ``build/notebooks/failed/``;
the earlier run's complete results stay in place.

**What a notebook cost**: :class:`NotebookRun` ``seconds``, the wall time from starting its process to its files in
place (kernel start-up included), and ``peak_rss_bytes``, the peak resident memory of the kernel that executed it
(also on :class:`NotebookFailed` when the kernel ran). The peak is the operating system's own high-water mark of the
kernel process, read without touching the notebook: papermill starts the kernel as a child of the notebook's process
and waits for it when the notebook ends (finished, failed or timed out: jupyter_client's ``LocalProvisioner.wait``);
after that, ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` in that process is the largest peak among the children it waited
for (and theirs) -- the kernel, the only child papermill starts, or a process the notebook started and waited for if
one grew larger; a maximum, not a sum, and not papermill's own memory (:func:`_child_main` reads it and writes it
beside the spec). Chosen over polling the kernel's memory (a peak between two polls is missed) and over a last cell
injected into the notebook (it would change the executed notebook and would not run after a failing cell).
"""
from __future__ import annotations

import contextlib
import json
import math
import numbers
import re
import resource
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import validate
from ..atomic import write_json_atomic, write_text_atomic
from ..parameters import smoke_sizes
from ..results import load_results, utc_now
from .build_folder import BuildDir, BuildDirError
from .errors import ReproduceError

__all__ = ["NotebookRun", "run_notebook", "check_cell_timeout", "CELL_TIMEOUT_S", "MAX_CELL_TIMEOUT_S"]

CELL_TIMEOUT_S = 1800   # design choice: the slowest full-size cell takes about a minute here; a hang fails, not waits
MAX_CELL_TIMEOUT_S = 7 * 24 * 3600   # design choice: longer is no timeout at all (and overflows asyncio's timers)
_STOP_GRACE_S = 60      # how long a stopped notebook's child may take to shut its kernel down before it is killed
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_RUN_ID = re.compile(r"^[A-Za-z0-9]{1,64}$")


class NotebookFailed(ReproduceError):
    """A notebook did not finish; ``kind`` says how (``cell_error``, ``timeout``, ``dead_kernel``, ``error``);
    ``peak_rss_bytes`` the kernel's peak memory when it is known (see the module docstring), else None;
    ``executed`` where its executed copy was set aside (None when none was kept). The message is one line: what
    went wrong, then where the copy is."""

    def __init__(self, message: str, kind: str, peak_rss_bytes: int | None = None, executed: Path | None = None):
        super().__init__(message + (f"; executed copy: {executed}" if executed else ""))
        self.reason = message
        self.kind = kind
        self.executed = executed
        self.peak_rss_bytes = peak_rss_bytes


@dataclass(frozen=True)
class NotebookRun:
    """A notebook that finished: its executed copy and results file in place, how many records, ``seconds`` of
    wall time and ``peak_rss_bytes`` of the kernel (None when it could not be read; see the module docstring)."""

    name: str
    output: Path
    results: Path
    n_records: int
    seconds: float
    peak_rss_bytes: int | None = None


# the notebook's process: ess.pipeline.notebook_process, then the kernel's peak memory written beside the spec
_CHILD = "import sys\nfrom ess.pipeline.notebook import _child_main\nsys.exit(_child_main(sys.argv[1:]))\n"


def kernel_peak_rss_bytes() -> int | None:
    """The largest peak resident set size, in bytes, of the child processes this process has waited for and of
    theirs (the kernel, in a notebook's process: see the module docstring); None when it has waited for none."""
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # ru_maxrss is in kibibytes on Linux and the BSDs, in bytes on macOS (their getrusage(2) pages)
    peak = int(peak) * (1 if sys.platform == "darwin" else 1024)
    return peak or None


def _child_main(argv: list[str]) -> int:
    """The notebook's process: :func:`ess.pipeline.notebook_process.main` on the spec ``argv[0]``, then
    ``{"peak_rss_bytes"}`` of the kernel it ran (:func:`kernel_peak_rss_bytes`, once papermill has waited for it)
    written to the spec's ``usage_path``, whether the notebook finished or failed."""
    from . import notebook_process
    rc = notebook_process.main(argv)
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    Path(spec["usage_path"]).write_text(json.dumps({"peak_rss_bytes": kernel_peak_rss_bytes()}), encoding="utf-8")
    return rc


def _read_peak(usage_path: Path) -> int | None:
    """The kernel's peak the notebook's process wrote (None when it wrote none: killed, or an unreadable file)."""
    try:
        peak = json.loads(usage_path.read_text(encoding="utf-8")).get("peak_rss_bytes")
    except (OSError, ValueError, AttributeError):
        return None
    return peak if isinstance(peak, int) and not isinstance(peak, bool) and peak > 0 else None


def check_cell_timeout(seconds) -> int:
    """A cell timeout must be a positive, finite number of seconds, at most a week (fractions round up)."""
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
        raise TypeError(f"cell_timeout_s must be a number of seconds, got {seconds!r}")
    try:
        finite = math.isfinite(seconds)
    except OverflowError:                 # an integer beyond a float's range: finite, and too large below
        finite = True
    if not finite or seconds <= 0:
        raise ValueError(f"cell_timeout_s must be a positive number of seconds, got {seconds!r}")
    if seconds > MAX_CELL_TIMEOUT_S:
        raise ValueError(f"cell_timeout_s must be at most {MAX_CELL_TIMEOUT_S} s (a week), got {seconds!r}")
    return int(math.ceil(seconds))


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
    """What went wrong, in one line (the ``ess`` command prints it as it is)."""
    return " | ".join(line for line in _what_failed(path, error, cell_timeout_s).splitlines() if line.strip())


def _what_failed(path: Path, error: dict, cell_timeout_s: int) -> str:
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
    marks them ``completed`` when a run stops). Returns where it went (None when there was nothing readable).
    The earlier run's complete files stay where they are."""
    import nbformat

    build.sub("notebooks")
    dest = build.own(f"notebooks/failed/{path.name}")
    kept = None
    nb = None
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
    else:
        build.remove(f"notebooks/failed/{path.name}")    # an earlier failure's copy would pass for this one
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
    """Hold Ctrl-C and SIGTERM back while a finished notebook is swapped into place and recorded, so that an
    interrupt never leaves it half there (the signal arrives right after)."""
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def figures_folders(build: BuildDir, name: str) -> list[str]:
    """The names of the figures folders of notebook ``name`` under ``build/results/`` (``<name>.figures`` of an
    older ``ess``, ``<name>.figures-<run id>``)."""
    pattern = re.compile(rf"^{re.escape(name)}\.figures(-[A-Za-z0-9]+)?$")
    folder = build.path / "results"
    return sorted(p.name for p in folder.iterdir() if pattern.match(p.name)) if folder.is_dir() else []


def _check_args(path, build, smoke, kernel_name, run_id, on_complete) -> Path:
    if not isinstance(build, BuildDir):
        raise TypeError(f"build must be a claimed BuildDir (BuildDir.claim), got {type(build).__name__}")
    path = validate.path("path", path)
    if path.suffix != ".ipynb" or not _NAME.match(path.stem) or not path.is_file():
        raise ValueError(f"path must be an existing notebook named like NN_name.ipynb, got {str(path)!r}")
    if not isinstance(smoke, bool):
        raise TypeError(f"smoke must be True or False, got {smoke!r}")
    if not isinstance(kernel_name, str) or not kernel_name:
        raise TypeError(f"kernel_name must be a kernel's name, got {kernel_name!r}")
    if not isinstance(run_id, str) or (run_id and not _RUN_ID.match(run_id)):
        raise ValueError(f"run_id must be letters and digits (1-64), got {run_id!r}")
    if on_complete is not None and not callable(on_complete):
        raise TypeError(f"on_complete must be callable or None, got {type(on_complete).__name__}")
    return path


def run_notebook(path: Path, build: BuildDir, *, smoke: bool = False, kernel_name: str = "python3",
                 cell_timeout_s: int = CELL_TIMEOUT_S, run_id: str = "",
                 on_complete: Callable[[NotebookRun], None] | None = None) -> NotebookRun:
    """Execute one notebook (see the module docstring); raise :class:`NotebookFailed` (a
    :class:`~ess.pipeline.errors.ReproduceError`) naming the failing (or hanging) cell. ``build`` is a claimed
    :class:`~ess.pipeline.build_folder.BuildDir`, held by the caller; ``on_complete(run)`` is called once the
    notebook is in place, before any interrupt held back meanwhile is let through."""
    import nbformat

    path = _check_args(path, build, smoke, kernel_name, run_id, on_complete)
    cell_timeout_s = check_cell_timeout(cell_timeout_s)
    try:
        sizes = smoke_sizes(path) if smoke else {}        # read before anything is written
    except ValueError as exc:
        raise ReproduceError(str(exc)) from None
    run_id = run_id or uuid.uuid4().hex[:12]
    name = path.stem
    for rel in (f"results/{name}.json", f"notebooks/{path.name}"):      # where the finished files go: checked
        target = build.own(rel)                        # before the notebook runs (a link there is refused), so
        if target.is_dir():                            # that neither is replaced without the other
            raise BuildDirError(f"{target} is a folder where ess writes a file; move it")
    build.sub(".partial")
    build.remove(f".partial/{name}")                   # what a killed run left half-done
    work = build.own(f".partial/{name}")
    (work / "results").mkdir(parents=True)
    partial_nb, partial_res = work / path.name, work / "results" / f"{name}.json"
    partial_figs = work / "results" / f"{name}.figures"
    error_path, log_path, usage_path = work / "error.json", work / "papermill.log", work / "usage.json"
    spec = {"input": str(path.resolve()), "output": str(partial_nb), "cwd": str(work),
            "parameters": {**sizes, "smoke": smoke, "results_path": f"results/{name}.json"},
            "kernel_name": kernel_name, "cell_timeout_s": cell_timeout_s, "error_path": str(error_path),
            "usage_path": str(usage_path)}
    (work / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    started, t0 = utc_now(), time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(work / "spec.json")],
                                cwd=work, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_die_with_parent)
        try:
            rc = proc.wait()
        except BaseException as exc:          # Ctrl-C or SIGTERM: stop the child, mark what it left
            _stop(proc)
            why = getattr(exc, "signame", "Ctrl-C") if isinstance(exc, KeyboardInterrupt) else type(exc).__name__
            _set_aside(build, path, partial_nb, "interrupted", f"the run was interrupted ({why})", run_id)
            raise

    peak = _read_peak(usage_path)

    def fail(message: str, kind: str = "error"):
        kept = _set_aside(build, path, partial_nb, "failed", message, run_id)
        return NotebookFailed(message, kind, peak, kept)

    with _signals_deferred():
        if rc != 0:
            error = None
            if error_path.exists():
                try:
                    error = json.loads(error_path.read_text(encoding="utf-8"))
                except ValueError:
                    error = None
            if not isinstance(error, dict):
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
        stamp = {"run_id": run_id, "mode": mode, "smoke": smoke, "started": started, "finished": utc_now(),
                 "status": "complete"}
        raw = json.loads(partial_res.read_text(encoding="utf-8"))
        figures_dir = f"{name}.figures-{run_id}" if partial_figs.is_dir() else None
        raw["run"] = {**raw.get("run", {}), "notebook": name, **stamp}
        raw["run"].pop("figures_dir", None)
        if figures_dir:
            raw["run"]["figures_dir"] = figures_dir
        nb = nbformat.read(partial_nb, as_version=4)
        nb.metadata["ess"] = {"notebook": name, **stamp}
        _scrub_papermill_paths(nb, path)
        nb_text = nbformat.writes(nb)
        # into place (see the module docstring): figures, results (the commit point), the notebook, then what
        # they replace
        build.sub("results")
        build.sub("notebooks")
        if figures_dir:
            build.remove(f"results/{figures_dir}")          # a folder of this very run id (a retry)
            build.move_in(partial_figs, f"results/{figures_dir}")
        results_path = write_json_atomic(build.own(f"results/{name}.json"), raw, allow_nan=True)
        out = write_text_atomic(build.own(f"notebooks/{path.name}"), nb_text)
        for old in figures_folders(build, name):
            if old != figures_dir:
                build.remove(f"results/{old}")
        build.remove(f"notebooks/failed/{path.name}")
        build.remove(f".partial/{name}")
        run = NotebookRun(name, out, results_path, len(results.records), time.perf_counter() - t0, peak)
        if on_complete is not None:
            on_complete(run)
    return run
