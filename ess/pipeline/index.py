"""``build/results/index.json``: what the last run did, and which run each results file in place comes from.

The run writes it at once (status ``running``), after each change and at the end, always whole
(:mod:`ess.atomic`)::

    {"format": "ess-index/2",
     "run": {"id", "mode", "smoke", "started", "finished", "status", "only", "cell_timeout_s", "versions"},
     "notebooks": {"01_memory_wall": {"status": "complete", "started", "finished", "seconds",
                                      "peak_rss_bytes", "records", "attempts",
                                      "results": "results/01_memory_wall.json",
                                      "executed": "notebooks/01_memory_wall.ipynb",
                                      "in_place": {"run_id", "mode", "finished", "this_run": true,
                                                   "results": "results/01_memory_wall.json"}}, ...},
     "earlier_results": {"<notebook not in this run>": {"results", "mode", "run_id", "finished"}},
     "figures": {"status", "files"}, "book": {"status", "html"}}

A notebook's ``seconds`` is its wall time (its process started to its files in place, the kernel's start-up
included) and ``peak_rss_bytes`` the peak resident memory of the kernel that executed it, the operating system's
high-water mark of that process (:mod:`ess.pipeline.notebook`; ``null`` when it could not be read); a notebook that
failed has ``peak_rss_bytes`` too when its kernel ran.

A notebook's ``status`` is this run's (``pending``, ``running``, ``complete``, ``failed``, ``interrupted``,
``not run``); ``in_place`` says whose results file is in ``build/results/`` now: this run's (``this_run``) once the
notebook completed, else the earlier run's it left in place (``null`` when there is none), so that a run that was
interrupted or failed says honestly that the results beside it are older. :func:`load_index` reads the file back
(this format or ``ess-index/1``) and refuses one of the wrong shape, or one whose paths lead outside the build
folder.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import PurePosixPath, Path

from .. import validate
from ..atomic import write_json_atomic
from ..results import load_results, utc_now
from .build_folder import BuildDir

__all__ = ["RunIndex", "load_index", "results_in_place", "regular_file_problem", "INDEX_FORMAT",
           "NOTEBOOK_STATUSES", "MAX_INDEX_BYTES"]

INDEX_FORMAT = "ess-index/2"
_OLDER = ("ess-index/1",)
NOTEBOOK_STATUSES = ("pending", "running", "complete", "failed", "interrupted", "not run")
MAX_INDEX_BYTES = 64 << 20    # design choice: an index of the ten notebooks takes a few KB; more is not one


def regular_file_problem(path: Path) -> str | None:
    """Why ``path`` is not a plain file ess can read (a symbolic link, a folder, a device or pipe, missing,
    unreadable), or None when it is one. ess reads nothing of its own through a link, and a pipe or a device
    (``/dev/zero``) would hang or fill the memory."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return exc.strerror or str(exc)
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link where ess keeps a file of its own (ess reads nothing through it); remove the link"
    if stat.S_ISDIR(st.st_mode):
        return "a folder where ess keeps a file; move it"
    if not stat.S_ISREG(st.st_mode):
        return "not a plain file (a device, pipe or socket); move it"
    return None


def results_in_place(build: BuildDir, name: str) -> dict | None:
    """Whose results file for notebook ``name`` is in ``build/results/`` now: ``{"run_id", "mode", "finished",
    "results"}``, ``{"results", "error"}`` when it cannot be read, None when there is none."""
    path = build.path / "results" / f"{name}.json"
    if not path.exists() and not path.is_symlink():
        return None
    why = regular_file_problem(path)
    if why:
        return {"results": f"results/{name}.json", "error": f"{path}: {why}"}
    try:
        run = load_results(path).run
    except (ValueError, RecursionError) as exc:       # (RecursionError: JSON nested past Python's limit)
        return {"results": f"results/{name}.json", "error": str(exc) if isinstance(exc, ValueError) else
                f"{path}: not a results file (nested too deeply)"}
    return {"run_id": run.get("run_id"), "mode": run.get("mode", "unknown"), "finished": run.get("finished"),
            "results": f"results/{name}.json"}


class RunIndex:
    """The index of the run in progress, rewritten atomically at every change."""

    def __init__(self, build: BuildDir, notebooks: list[str], *, run_id: str, smoke: bool, book: bool,
                 figures: bool, cell_timeout_s: int, only: list[str] | None, versions: dict):
        self.path = build.sub("results") / "index.json"
        self.run_id = run_id
        self.data = {
            "format": INDEX_FORMAT,
            "run": {"id": run_id, "mode": "smoke" if smoke else "full", "smoke": smoke, "started": utc_now(),
                    "finished": None, "status": "running", "only": only or None, "cell_timeout_s": cell_timeout_s,
                    "versions": versions},
            "notebooks": {n: {"status": "pending", "in_place": self._earlier_in_place(build, n)} for n in notebooks},
            "earlier_results": self._earlier(build, set(notebooks)),
            "figures": {"status": "pending" if figures else "skipped"},
            "book": {"status": "pending" if book else "skipped"},
        }
        self.write()

    @staticmethod
    def _earlier_in_place(build: BuildDir, name: str) -> dict | None:
        found = results_in_place(build, name)
        if found is not None:
            found["this_run"] = False
        return found

    @staticmethod
    def _earlier(build: BuildDir, names: set[str]) -> dict:
        """Results files of earlier runs that this run leaves in place (it does not run their notebooks)."""
        earlier = {}
        for p in sorted((build.path / "results").glob("[0-9][0-9]_*.json")):
            if p.stem not in names:
                found = results_in_place(build, p.stem)
                earlier[p.stem] = {"results": found.pop("results"), **found}
        return earlier

    def write(self) -> None:
        write_json_atomic(self.path, self.data)

    def notebook(self, name: str, **fields) -> None:
        self.data["notebooks"][name].update(fields)
        self.write()

    def completed(self, name: str, *, mode: str, **fields) -> None:
        """Notebook ``name`` completed in this run: its results are now the ones in place."""
        self.notebook(name, status="complete", in_place={"run_id": self.run_id, "mode": mode,
                                                         "finished": fields.get("finished"), "this_run": True,
                                                         "results": fields.get("results")}, **fields)

    def recheck_in_place(self, build: BuildDir, name: str) -> None:
        """Read again whose results file for ``name`` is in place (a run stopped while it swapped that notebook's
        files in: its results may be this run's while its executed copy is not)."""
        found = results_in_place(build, name)
        if found is not None:
            found["this_run"] = found.get("run_id") == self.run_id
        self.data["notebooks"][name]["in_place"] = found

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


def _strings(path: Path, where: str, holder: dict, keys) -> None:
    """Each of ``keys`` in ``holder`` is a string or null (what the pipeline writes there)."""
    for key in keys:
        value = holder.get(key)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{path}: {where}.{key} must be a string or null, got {value!r}"[:300])


def _inside(path: Path, where: str, value) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{path}: {where} must be a path (a string), got {value!r}")
    rel = PurePosixPath(value)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts or "\\" in value or "\0" in value:
        raise ValueError(f"{path}: {where} must be a path inside the build folder, got {value!r}")


def load_index(path: str | os.PathLike) -> dict:
    """Read ``index.json`` (this format or ``ess-index/1``); a ``ValueError`` naming the file when it is not one:
    not a plain file (a folder, a pipe, a device), larger than :data:`MAX_INDEX_BYTES`, invalid JSON (or nested
    past Python's limit, or an integer of more digits than Python converts), a part missing or of the wrong type, a
    status the pipeline does not write, a path that leads outside the build folder."""
    path = validate.path("path", path)
    try:
        st = path.stat()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the run index ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path}: not a run index (a folder, device or pipe, not a file)")
    if st.st_size > MAX_INDEX_BYTES:
        raise ValueError(f"{path}: not a run index ({st.st_size:,} bytes; an index takes a few KB)")
    try:
        with open(path, "rb") as fh:
            text = fh.read(MAX_INDEX_BYTES + 1).decode("utf-8")
        data = json.loads(text)
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a run index (not UTF-8 text)") from None
    except ValueError as exc:              # invalid JSON, or an integer of more digits than Python converts
        raise ValueError(f"{path}: not a run index (invalid JSON: {str(exc)[:200]})") from None
    except RecursionError:
        raise ValueError(f"{path}: not a run index (JSON nested too deeply)") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the run index ({exc.strerror or exc})") from None
    if not isinstance(data, dict) or data.get("format") not in (INDEX_FORMAT, *_OLDER):
        raise ValueError(f"{path}: not a run index (expected an object with format {INDEX_FORMAT!r})")
    run, notebooks = data.get("run"), data.get("notebooks")
    if not isinstance(run, dict):
        raise ValueError(f"{path}: 'run' must be an object, got {type(run).__name__}")
    if not isinstance(notebooks, dict):
        raise ValueError(f"{path}: 'notebooks' must be an object, got {type(notebooks).__name__}")
    for key in ("id", "mode", "status", "started"):
        if key in run and run[key] is not None and not isinstance(run[key], str):
            raise ValueError(f"{path}: run.{key} must be a string, got {run[key]!r}")
    for name, entry in notebooks.items():
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: notebooks.{name} must be an object, got {type(entry).__name__}")
        if entry.get("status") not in NOTEBOOK_STATUSES:
            raise ValueError(f"{path}: notebooks.{name}.status must be one of {NOTEBOOK_STATUSES}, got "
                             f"{entry.get('status')!r}")
        peak = entry.get("peak_rss_bytes")
        if peak is not None and (isinstance(peak, bool) or not isinstance(peak, int) or peak <= 0):
            raise ValueError(f"{path}: notebooks.{name}.peak_rss_bytes must be a positive number of bytes or null, "
                             f"got {peak!r}")
        in_place = entry.get("in_place")
        if in_place is not None and not isinstance(in_place, dict):
            raise ValueError(f"{path}: notebooks.{name}.in_place must be an object or null")
        _strings(path, f"notebooks.{name}", entry, ("started", "finished", "error"))
        _strings(path, f"notebooks.{name}.in_place", in_place or {}, ("run_id", "mode", "finished", "error"))
        for where, holder in ((f"notebooks.{name}", entry), (f"notebooks.{name}.in_place", in_place or {})):
            for key in ("results", "executed"):
                if key in holder:
                    _inside(path, f"{where}.{key}", holder[key])
    earlier = data.get("earlier_results", {})
    if not isinstance(earlier, dict) or not all(isinstance(e, dict) for e in earlier.values()):
        raise ValueError(f"{path}: 'earlier_results' must map notebooks to objects")
    for name, entry in earlier.items():
        _strings(path, f"earlier_results.{name}", entry, ("run_id", "mode", "finished", "error"))
        if "results" in entry:
            _inside(path, f"earlier_results.{name}.results", entry["results"])
    for part in ("figures", "book"):
        value = data.get(part, {})
        if not isinstance(value, dict):
            raise ValueError(f"{path}: '{part}' must be an object, got {type(value).__name__}")
        for f in value.get("files", []) if isinstance(value.get("files", []), list) else [None]:
            _inside(path, f"{part}.files", f)
        if "html" in value:
            _inside(path, f"{part}.html", value["html"])
    return data
