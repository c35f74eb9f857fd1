"""Hostile-user probes of the reproduction pipeline, the ``ess`` command and ``tools/compare_results.py``
(``tests/hostile.py``): links planted in the build folder, files where folders belong and folders where files belong,
read-only folders, a 2-MB full disk, a pathological ``index.json``, absurd flags, two runs on one build folder.

Every probe runs the real pipeline (``run_all`` through the command's ``main``, in this process) with each
notebook's process replaced by a stand-in that writes a results file (``_pipeline_fakes``: no kernel starts, no
notebook executes) and, where a book is built, jupyter-book replaced likewise. A command that refuses is a clear
error when it printed one line naming what the probe gave it (a traceback, several lines or a line naming nothing is
raw); a command that went through is sensible only after the probe checked what it did, and nothing the user had
(a link's target, an earlier run's complete results) may change.
"""
from __future__ import annotations

import builtins
import contextlib
import errno
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from _pipeline_fakes import (FAKE_CHILD, fake_children, fake_jupyter_book, files, index_of, linked, one_line,
                             reproduce, tiny_notebooks)
from hostile import DataLoss, Probe, ProbeError, bad_rows, guard, run_probes

ROOT = Path(__file__).resolve().parent.parent


class CommandRefused(ValueError):
    """A command that exited non-zero with one line on stderr: that line."""


@contextlib.contextmanager
def _patched():
    """The stand-ins (notebook process, jupyter-book) for one probe."""
    mp = pytest.MonkeyPatch()
    try:
        fake_children(mp)
        mp.built = fake_jupyter_book(mp)          # the staged book sources jupyter-book was given
        yield mp
    finally:
        mp.undo()


def _ess(*argv) -> str:
    """``ess argv`` in this process: its stdout when it succeeded; a :class:`CommandRefused` with its one line when
    it refused; a ``RuntimeError`` (raw) when it printed a traceback or more than one line."""
    rc, out, err = reproduce(*map(str, argv))
    lines = one_line(err)
    if rc != 0:
        if "Traceback" in err or len(lines) != 1:
            raise RuntimeError(f"exit {rc} with {len(lines)} lines on stderr: {err[-400:]!r}")
        raise CommandRefused(lines[0])
    return out


_TEMPLATE: dict = {}


def _setup(tmp: Path) -> tuple[Path, Path]:
    """Notebooks 01_a and 02_b in ``tmp/nbs`` and a build folder ``tmp/b`` after one complete run of them (the
    first probe runs it; the others get a copy)."""
    nbs, build = tmp / "nbs", tmp / "b"
    if "dir" not in _TEMPLATE or not _TEMPLATE["dir"].is_dir():
        tiny_notebooks(nbs, "01_a", "02_b")
        with _patched():
            _ess("reproduce", "--notebooks-dir", nbs, "--build-dir", build, "--no-book", "--no-figures")
        _TEMPLATE["dir"] = tmp / "template"
        shutil.copytree(tmp, tmp / "template", symlinks=True, ignore=shutil.ignore_patterns("template"))
        return nbs, build
    for name in ("nbs", "b"):
        shutil.copytree(_TEMPLATE["dir"] / name, tmp / name, symlinks=True)
    return nbs, build


def _rerun(nbs: Path, build: Path, *extra) -> str:
    with _patched():
        return _ess("reproduce", "--notebooks-dir", nbs, "--build-dir", build, "--no-book", "--no-figures", *extra)


def _kept(before: dict, build: Path, *, except_=()) -> None:
    """Every file of ``before`` (an earlier complete run) is still there, byte for byte (but ``except_``, which the
    new run rewrites)."""
    after = files(build)
    lost = [k for k in before if k not in except_ and after.get(k) != before[k]]
    if lost:
        raise DataLoss(f"the earlier run's files changed or went: {lost}")


def _mine(tmp: Path, name: str = "mine.json", text: str = '{"the user": "data"}') -> Path:
    path = tmp / "user" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# -- links planted in the build folder --------------------------------------------------------------------------------

@guard
def link_index_to_user_file(tmp):
    """results/index.json replaced by a link to the user's file, then a re-run: the link is replaced, the user's file
    untouched."""
    nbs, build = _setup(tmp)
    mine = linked(build / "results" / "index.json", _mine(tmp))
    text = mine.read_text()
    _rerun(nbs, build)
    if mine.read_text() != text:
        return "data loss"
    if (build / "results" / "index.json").is_symlink() or index_of(build)["run"]["status"] != "complete":
        raise ProbeError("the index is not this run's")


@guard
def dangling_link_index(tmp):
    """results/index.json a dangling link into the user's folder: nothing is created there."""
    nbs, build = _setup(tmp)
    (build / "results" / "index.json").unlink()
    target = tmp / "user" / "new.json"
    target.parent.mkdir()
    (build / "results" / "index.json").symlink_to(target)
    _rerun(nbs, build)
    if target.exists():
        raise ProbeError("the run wrote through a dangling link into the user's folder")


def _rerun_with_link(rel: str):
    """A probe: a file of the build replaced by a link to the user's copy of it, then a re-run, which writes
    nothing through the link, and, if it stops there, leaves that notebook's other file the earlier run's (its
    results and executed copy stay a pair)."""
    @guard
    def probe(tmp):
        nbs, build = _setup(tmp)
        before = files(build)
        mine = linked(build / rel, _mine(tmp, Path(rel).name))
        text = mine.read_text()
        try:
            _rerun(nbs, build)
        except CommandRefused:          # the notebook's other file is the earlier run's still
            stem = Path(rel).stem
            _kept({k: v for k, v in before.items() if k != rel and Path(k).stem == stem}, build)
            raise
        finally:
            if mine.read_text() != text:
                return "data loss"
        if (build / rel).is_symlink():
            raise ProbeError(f"the run went through, the link still in place of {rel}")
    probe.__name__ = f"rerun_with_{Path(rel).name}_a_link"
    return probe


@guard
def link_partial_folder_to_user_folder(tmp):
    nbs, build = _setup(tmp)
    user = _mine(tmp, "01_a").parent
    (build / ".partial").symlink_to(user, target_is_directory=True)
    try:
        _rerun(nbs, build)
    finally:
        if (user / "01_a").read_text() != '{"the user": "data"}' or len(list(user.iterdir())) != 1:
            return "data loss"


@guard
def link_failed_folder_to_user_folder(tmp):
    """notebooks/failed a link to the user's folder holding a file of the notebook's name, then a failing run
    (which sets its copy aside there) and a passing one (which removes an earlier failed copy)."""
    nbs, build = _setup(tmp)
    user = _mine(tmp, "01_a.ipynb").parent
    (build / "notebooks" / "failed").symlink_to(user, target_is_directory=True)
    tiny_notebooks(nbs, "01_a", fail=True)
    refused = []
    for _ in range(2):
        try:
            _rerun(nbs, build)
        except CommandRefused as exc:
            refused.append(exc)
        if (user / "01_a.ipynb").read_text() != '{"the user": "data"}' or len(list(user.iterdir())) != 1:
            return "data loss"
        tiny_notebooks(nbs, "01_a")
    if refused:
        raise refused[-1]


@guard
def link_marker_to_user_file(tmp):
    """The build folder's marker a dangling link into the user's folder: nothing is created there."""
    build = tmp / "b"
    build.mkdir()
    target = tmp / "user" / "x"
    target.parent.mkdir()
    (build / ".ess-build").symlink_to(target)
    tiny_notebooks(tmp / "nbs", "01_a")
    try:
        _rerun(tmp / "nbs", build)
    finally:
        if target.exists():
            return "data loss"


@guard
def link_build_folder_itself(tmp):
    """--build-dir a link to a folder: the run goes to the folder it points at."""
    tiny_notebooks(tmp / "nbs", "01_a")
    (tmp / "real").mkdir()
    (tmp / "b").symlink_to(tmp / "real", target_is_directory=True)
    _rerun(tmp / "nbs", tmp / "b")
    if not (tmp / "real" / "results" / "01_a.json").is_file():
        raise ProbeError("no results in the folder the link points at")


def _book_refused(build: Path, why: str) -> None:
    """``ess book`` on ``build``, which must refuse (a :class:`CommandRefused`); a :class:`ProbeError` when it built a
    book although ``why``."""
    with _patched():
        _ess("book", "--build-dir", build)
    raise ProbeError(f"ess book built a book although {why}")


def _book_with_link(rel: str):
    """A probe: ``ess book`` with a file of the build replaced by a link to the user's copy of it."""
    @guard
    def probe(tmp):
        _, build = _setup(tmp)
        mine = linked(build / rel, _mine(tmp))
        text = mine.read_text()
        try:
            _book_refused(build, f"{rel} is a symbolic link")
        finally:
            if mine.read_text() != text:
                return "data loss"
    probe.__name__ = f"book_with_{Path(rel).name}_a_link"
    return probe


# -- folders and files in each other's place; folders that cannot be written ------------------------------------------

@guard
def results_is_a_file(tmp):
    nbs, build = _setup(tmp)
    before = files(build)
    for p in sorted((build / "results").iterdir(), reverse=True):
        p.unlink()
    (build / "results").rmdir()
    (build / "results").write_text("the user's notes")
    try:
        _rerun(nbs, build)
    finally:
        if (build / "results").read_text() != "the user's notes":
            return "data loss"
        _kept({k: v for k, v in before.items() if k.startswith("notebooks/")}, build)


def _folder_in_place(rel: str):
    """A probe: a folder of the user's (holding a file) where ess keeps the file ``rel``, then a re-run."""
    @guard
    def probe(tmp):
        nbs, build = _setup(tmp)
        (build / rel).unlink()
        (build / rel).mkdir()
        (build / rel / "keep.txt").write_text("keep")
        try:
            _rerun(nbs, build)
        finally:
            if (build / rel / "keep.txt").read_text() != "keep":
                return "data loss"
        raise ProbeError(f"the run went through with a folder in place of {rel}")
    probe.__name__ = f"folder_in_place_of_{Path(rel).name}"
    return probe


@guard
def results_file_is_a_pipe(tmp):
    """A named pipe in place of a results file: reading it would wait forever; the run must not."""
    nbs, build = _setup(tmp)
    (build / "results" / "02_b.json").unlink()
    os.mkfifo(build / "results" / "02_b.json")
    _book_refused(build, "a results file is a pipe")


@guard
def marker_is_a_folder(tmp):
    nbs, build = _setup(tmp)
    (build / ".ess-build").unlink()
    (build / ".ess-build").mkdir()
    _rerun(nbs, build)


def _denied(folder_name: str):
    """A probe: a re-run while the file system refuses to create, open for writing or rename anything inside
    ``<build>/<folder_name>`` (``PermissionError``), as for a user on a read-only folder (root writes anywhere, so
    the kernel's refusal is emulated in this process; the notebook's own process is not held back)."""
    @guard
    def probe(tmp):
        nbs, build = _setup(tmp)
        before = files(build)
        folder = build / folder_name
        real_open, real_replace, real_mkdir, real_builtin_open = os.open, os.replace, os.mkdir, builtins.open

        def refuse(path):
            path = os.fsdecode(path)
            if folder in Path(path).parents:
                raise PermissionError(errno.EACCES, "Permission denied", path)

        def open_(path, flags, *args, **kwargs):
            if flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR):
                refuse(path)
            return real_open(path, flags, *args, **kwargs)

        def builtin_open(file, mode="r", *args, **kwargs):
            if isinstance(file, (str, bytes, os.PathLike)) and any(c in mode for c in "wax+"):
                refuse(file)
            return real_builtin_open(file, mode, *args, **kwargs)

        def replace(src, dst, *args, **kwargs):
            refuse(dst)
            return real_replace(src, dst, *args, **kwargs)

        def mkdir(path, *args, **kwargs):
            refuse(path)
            return real_mkdir(path, *args, **kwargs)

        with _patched() as mp:
            for where, name, fn in ((os, "open", open_), (os, "replace", replace), (os, "mkdir", mkdir),
                                    (builtins, "open", builtin_open)):
                mp.setattr(where, name, fn)
            try:
                _ess("reproduce", "--notebooks-dir", nbs, "--build-dir", build, "--no-book", "--no-figures")
            except CommandRefused:
                mp.undo()
                _kept(before, build, except_=("results/index.json",))
                raise
        raise ProbeError(f"the run went through although {folder_name} could not be written")
    probe.__name__ = f"read_only_{folder_name.lstrip('.')}"
    return probe


@guard
def read_only_midway(tmp):
    """The disk refuses the second notebook's results midway through a run (ENOSPC on its rename): one line, the
    first notebook's new results and the second's earlier ones in place, the index says which."""
    nbs, build = _setup(tmp)
    before = files(build)
    tiny_notebooks(nbs, "01_a", "02_b", value=2)
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        if Path(os.fsdecode(dst)).name == "02_b.json":
            raise OSError(errno.ENOSPC, "No space left on device", os.fsdecode(src))
        return real_replace(src, dst, *args, **kwargs)

    with _patched() as mp:
        mp.setattr(os, "replace", replace)
        try:
            _ess("reproduce", "--notebooks-dir", nbs, "--build-dir", build, "--no-book", "--no-figures")
        finally:
            mp.undo()
            _kept({k: v for k, v in before.items() if "02_b" in k}, build)
            index = index_of(build)
            if index["notebooks"]["02_b"]["in_place"]["this_run"] is not False:
                raise ProbeError("the index says the second notebook's results are this run's")


@guard
def disk_full_between_results_and_notebook(tmp):
    """The disk fills after a notebook's new results are in place, before its executed copy is: the index must say
    whose results file is in place (this run's), and the book must not pair it with the earlier copy unsaid."""
    nbs, build = _setup(tmp)
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        if Path(os.fsdecode(dst)).name == "02_b.ipynb":
            raise OSError(errno.ENOSPC, "No space left on device", os.fsdecode(src))
        return real_replace(src, dst, *args, **kwargs)

    with _patched() as mp:
        mp.setattr(os, "replace", replace)
        try:
            _ess("reproduce", "--notebooks-dir", nbs, "--build-dir", build, "--no-book", "--no-figures")
        finally:
            mp.undo()
            in_place = index_of(build)["notebooks"]["02_b"]["in_place"]
            results = json.loads((build / "results" / "02_b.json").read_text())["run"]
            if in_place["run_id"] != results["run_id"]:
                raise ProbeError(f"the index says results of run {in_place['run_id']} are in place; the file is "
                                 f"run {results['run_id']}'s")
            try:
                _book_refused(build, "notebook 02_b's results and executed copy come from two runs")
            except CommandRefused as exc:
                if "02_b" not in str(exc):
                    raise ProbeError(f"ess book refused, naming another file: {exc}") from None


_DISK_SCRIPT = r"""
import json, resource, signal, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import _pipeline_fakes as F
import ess.pipeline.notebook as N
top = Path(sys.argv[2])
# the notebook's process runs on another disk (its soft limit raised back); the pipeline's own writes meet 2 MB
N._CHILD = ("import resource\nresource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)\n"
            + F.FAKE_CHILD)
args = ["reproduce", "--notebooks-dir", str(top / "nbs"), "--build-dir", str(top / "b"), "--no-book", "--no-figures"]
F.tiny_notebooks(top / "nbs", "01_a", "02_b")
first = F.reproduce(*args)
before = F.files(top / "b")
F.tiny_notebooks(top / "nbs", "01_a", "02_b", bytes=3_000_000)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)          # a write past the limit fails (EFBIG) instead of killing
resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, resource.RLIM_INFINITY))
second = F.reproduce(*args)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
after = F.files(top / "b")
lost = [k for k in before if k != "results/index.json" and after.get(k) != before[k]]
print(json.dumps({"first": first[0], "rc": second[0], "err": second[2], "lost": lost}))
"""


@guard
def full_disk_2mb(tmp):
    """A 2-MB disk (RLIMIT_FSIZE in a child process): the results file the pipeline writes does not fit."""
    proc = subprocess.run([sys.executable, "-c", _DISK_SCRIPT, str(ROOT / "tests"), str(tmp)], capture_output=True,
                          text=True, timeout=120, cwd=tmp)
    if proc.returncode != 0:
        raise RuntimeError(f"the probe's process failed: {proc.stderr[-400:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if got["first"] != 0:
        raise RuntimeError(f"the first run failed: {got}")
    if got["lost"]:
        return "data loss"
    lines = one_line(got["err"])
    if got["rc"] == 0:
        raise ProbeError("a run whose results did not fit the disk succeeded")
    if "Traceback" in got["err"] or len(lines) != 1:
        raise RuntimeError(f"not one line: {got['err'][-400:]!r}")
    raise CommandRefused(lines[0])


# -- a pathological index.json ----------------------------------------------------------------------------------------

def _bad_index(label: str, content: str | bytes, command: str = "book"):
    @guard
    def probe(tmp):
        nbs, build = _setup(tmp)
        path = build / "results" / "index.json"
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
        with _patched():
            if command == "book":
                _ess("book", "--build-dir", build)
                raise ProbeError("ess book built a book on a pathological index")
            _ess("reproduce", "--notebooks-dir", nbs, "--build-dir", build, "--no-book", "--no-figures")
        if index_of(build)["run"]["status"] != "complete":          # reproduce writes an index of its own
            raise ProbeError("the re-run's index is not complete")
    probe.__name__ = f"index_{label}_{command}"
    return probe


_GOOD = {"format": "ess-index/2", "run": {"id": "r1", "status": "complete", "started": "x"},
         "notebooks": {"01_a": {"status": "complete"}}}
_BAD_INDEXES = [
    ("not_json", "{'not': json"),
    ("binary", b"\xff\xfe\x00garbage"),
    ("empty", ""),
    ("a_list", "[1, 2, 3]"),
    ("null", "null"),
    ("wrong_format", json.dumps({**_GOOD, "format": "ess-index/99"})),
    ("run_a_number", json.dumps({**_GOOD, "run": 3})),
    ("status_a_list", json.dumps({**_GOOD, "notebooks": {"01_a": {"status": ["complete"]}}})),
    ("run_id_an_object", json.dumps({**_GOOD, "notebooks": {"01_a": {"status": "complete",
                                                                      "in_place": {"run_id": {"a": 1}}}}})),
    ("path_outside", json.dumps({**_GOOD, "notebooks": {"01_a": {"status": "complete",
                                                                  "results": "../../etc/passwd"}}})),
    ("huge_integer", '{"format": "ess-index/2", "run": {}, "notebooks": {"01_a": {"status": "complete", '
                     '"peak_rss_bytes": ' + "9" * 10_000 + "}}}"),
    ("huge_float", '{"format": "ess-index/2", "run": {}, "notebooks": {"01_a": {"status": "complete", '
                   '"peak_rss_bytes": 1e999}}}'),
    ("nested_deep", "[" * 200_000 + "]" * 200_000),
    ("newline_in_a_key", json.dumps({**_GOOD, "notebooks": {"01_a\nsecond line": {"status": "no"}}})),
]


# a re-run writes an index of its own without reading the old one: a few of the indexes are enough there
_REPRODUCE_OVER = ("not_json", "a_list", "nested_deep", "huge_integer")


def fifo_in_place_of_the_index(tmp):
    nbs, build = _setup(tmp)
    (build / "results" / "index.json").unlink()
    os.mkfifo(build / "results" / "index.json")
    _book_refused(build, "its index is a pipe")


def huge_index(tmp):
    """An index of 65 MB (a file of ess's kind, absurdly large): refused before it is read."""
    nbs, build = _setup(tmp)
    with open(build / "results" / "index.json", "wb") as fh:
        fh.truncate(65 << 20)
    _book_refused(build, "its index is 65 MB")


# -- the book vouches for its notebooks -------------------------------------------------------------------------------

def stray_executed_notebook(tmp):
    _, build = _setup(tmp)
    (build / "notebooks" / "07_stray.ipynb").write_bytes((build / "notebooks" / "01_a.ipynb").read_bytes())
    _book_refused(build, "a notebook no run made is there")


def executed_notebook_of_another_run(tmp):
    _, build = _setup(tmp)
    nb = build / "notebooks" / "02_b.ipynb"
    data = json.loads(nb.read_text())
    data["metadata"]["ess"]["run_id"] = "someoneelse"
    nb.write_text(json.dumps(data))
    _book_refused(build, "a notebook names another run")


def executed_notebook_not_json(tmp):
    _, build = _setup(tmp)
    (build / "notebooks" / "02_b.ipynb").write_text("[" * 200_000)
    _book_refused(build, "a notebook is not JSON")


def book_after_only_into_a_fresh_folder(tmp):
    """`ess reproduce --only 01` into a fresh folder with the book on: the book builds from what ran, and its pages
    say which numbers are missing."""
    tiny_notebooks(tmp / "nbs", "01_a", "02_b")
    with _patched() as mp:
        out = _ess("reproduce", "--notebooks-dir", tmp / "nbs", "--build-dir", tmp / "b", "--only", "01",
                   "--no-figures")
    pages = [p.read_text() for p in mp.built[-1].rglob("*.md")]
    if "book:" not in out or any("{glue" in text for text in pages):
        raise ProbeError("a page still quotes a notebook that did not run")
    if not any("not run" in text for text in pages):
        raise ProbeError("no page says which numbers did not run")


def book_with_nothing_executed(tmp):
    from ess.pipeline import BuildDir
    BuildDir.claim(tmp / "b")
    _book_refused(tmp / "b", "nothing was executed")


def book_twice(tmp):
    """`ess book` twice on one build: the second replaces the first's book whole."""
    _, build = _setup(tmp)
    with _patched():
        _ess("book", "--build-dir", build)
        _ess("book", "--build-dir", build)
    if not (build / "book" / "_build" / "html" / "index.html").is_file():
        raise ProbeError("no book after the second build")


# -- absurd flags ----------------------------------------------------------------------------------------------------

def _flags(label: str, *argv: str, where: str = "b"):
    def probe(tmp):
        tiny_notebooks(tmp / "nbs", "01_a", "02_b")
        args = [a.replace("{tmp}", str(tmp)) for a in argv]
        with _patched():
            _ess(*args)
        raise ProbeError(f"ess {' '.join(args)[:80]} went through")
    probe.__name__ = f"flags_{label}"
    return probe


_NB = ("--notebooks-dir", "{tmp}/nbs", "--no-book", "--no-figures")
_FLAG_PROBES = [
    ("cell_timeout_googol", ("--cell-timeout",), ("reproduce", *_NB, "--build-dir", "{tmp}/b", "--cell-timeout",
                                                  "1" + "0" * 400)),
    ("cell_timeout_nan", ("--cell-timeout",), ("reproduce", *_NB, "--build-dir", "{tmp}/b", "--cell-timeout", "nan")),
    ("cell_timeout_negative", ("--cell-timeout",), ("reproduce", *_NB, "--build-dir", "{tmp}/b", "--cell-timeout",
                                                    "-5")),
    ("only_10k_characters", ("--only",), ("reproduce", *_NB, "--build-dir", "{tmp}/b", "--only", "z" * 10_000)),
    ("only_a_path", ("--only",), ("reproduce", *_NB, "--build-dir", "{tmp}/b", "--only", "../../etc/passwd")),
    ("only_empty", ("--only",), ("reproduce", *_NB, "--build-dir", "{tmp}/b", "--only", "")),
    ("only_ambiguous", ("--only",), ("reproduce", *_NB, "--build-dir", "{tmp}/b", "--only", "0")),
    ("only_twice", ("--only",), ("reproduce", *_NB, "--build-dir", "{tmp}/b", "--only", "01", "--only", "01_a")),
    ("build_dir_empty", ("--build-dir",), ("reproduce", *_NB, "--build-dir", "")),
    ("build_dir_nul", ("--build-dir",), ("reproduce", *_NB, "--build-dir", "a\0b")),
    ("build_dir_name_too_long", ("x" * 30,), ("reproduce", *_NB, "--build-dir", "{tmp}/" + "x" * 300)),
    ("build_dir_path_too_long", ("y" * 30,), ("reproduce", *_NB, "--build-dir", "{tmp}/" + "/".join(["y" * 250] * 20))),
    ("build_dir_is_dev_null", ("/dev/null",), ("reproduce", *_NB, "--build-dir", "/dev/null")),
    ("build_dir_in_proc", ("/proc",), ("reproduce", *_NB, "--build-dir", "/proc/self/ess-build")),
    ("build_dir_the_repository", (str(ROOT),), ("reproduce", *_NB, "--build-dir", str(ROOT))),
    ("build_dir_inside_notebooks", ("notebooks",), ("reproduce", "--notebooks-dir", "{tmp}/nbs", "--no-book",
                                                    "--build-dir", "{tmp}/nbs/b")),
    ("build_dir_unknown_user", ("~nosuchuser",), ("reproduce", *_NB, "--build-dir", "~nosuchuser/b")),
    ("notebooks_dir_a_file", ("notebooks_dir", "--notebooks-dir"), ("reproduce", "--notebooks-dir",
                                                                    "{tmp}/nbs/01_a.ipynb", "--build-dir", "{tmp}/b")),
    ("notebooks_dir_name_too_long", ("notebooks_dir",), ("reproduce", "--notebooks-dir", "{tmp}/" + "n" * 300,
                                                         "--build-dir", "{tmp}/b")),
    ("notebooks_dir_empty_folder", ("notebooks_dir",), ("reproduce", "--notebooks-dir", "{tmp}", "--build-dir",
                                                        "{tmp}/b")),
    ("unknown_flag", ("--frobnicate",), ("reproduce", "--frobnicate")),
    ("unknown_command", ("frobnicate",), ("frobnicate",)),
    ("book_build_dir_missing", ("does not exist",), ("book", "--build-dir", "{tmp}/nothing")),
    ("book_build_dir_foreign", ("did not create",), ("book", "--build-dir", "{tmp}/nbs")),
]


# -- two runs on one build folder -------------------------------------------------------------------------------------

def _concurrent(second: str):
    """A run in a second thread holds the build folder (its notebook waits); meanwhile ``second`` (``reproduce`` or
    ``book``) on the same folder is refused with one line; the first run then completes untouched."""
    def probe(tmp):
        from ess import pipeline

        go = tmp / "go"
        tiny_notebooks(tmp / "nbs", "01_a", wait=str(go))
        build = tmp / "b"
        first: dict = {}
        with _patched():
            thread = threading.Thread(target=lambda: first.update(runs=pipeline.run_all(
                notebooks_dir=tmp / "nbs", build_dir=build, book=False, figures=False, progress=False)))
            thread.start()
            try:
                deadline = time.monotonic() + 30
                while not (build / ".partial" / "01_a").exists() and time.monotonic() < deadline:
                    time.sleep(0.01)
                args = (["reproduce", "--notebooks-dir", tmp / "nbs", "--no-book", "--no-figures"]
                        if second == "reproduce" else ["book"])
                try:
                    _ess(*args, "--build-dir", build)
                except CommandRefused:
                    go.touch()
                    thread.join(60)
                    if not first.get("runs") or index_of(build)["run"]["status"] != "complete":
                        raise ProbeError("the first run did not complete after the second was refused")
                    raise
            finally:
                go.touch()
                thread.join(60)
        raise ProbeError(f"a second `ess {second}` ran on a build folder in use")
    probe.__name__ = f"two_commands_{second}_on_one_build"
    return probe


def two_runs_one_after_the_other(tmp):
    """Two complete runs in a row on one folder: the second's results replace the first's, the index names it."""
    nbs, build = _setup(tmp)
    first = index_of(build)["run"]["id"]
    tiny_notebooks(nbs, "01_a", "02_b", value=7)
    _rerun(nbs, build)
    index = index_of(build)
    rec = json.loads((build / "results" / "01_a.json").read_text())
    if index["run"]["id"] == first or rec["records"][0]["value"] != 7 or rec["run"]["run_id"] != index["run"]["id"]:
        raise ProbeError("the second run's results are not in place")


# -- tools/compare_results.py ----------------------------------------------------------------------------------------

def _compare(*argv) -> str:
    sys.path.insert(0, str(ROOT / "tools"))
    import compare_results as C
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = C.main([str(a) for a in argv])
        except SystemExit as exc:
            rc = exc.code
    text = out.getvalue()
    if rc == 0:
        return text
    if "Traceback" in err.getvalue():
        raise RuntimeError(err.getvalue()[-300:])
    last = (one_line(err.getvalue()) or [ln for ln in text.splitlines() if ln.strip()] or ["(nothing)"])[-1]
    raise CommandRefused(last)


def compare_two_empty_folders(tmp):
    (tmp / "a").mkdir()
    (tmp / "b").mkdir()
    _compare(tmp / "a", tmp / "b")


def compare_a_tree_with_itself(tmp):
    _, build = _setup(tmp)
    if "PASS" not in _compare(build / "results", build / "results"):
        raise ProbeError("a tree compared with itself does not pass")


def _compare_bad_file(label: str, content: str | None):
    def probe(tmp):
        _, build = _setup(tmp)
        other = tmp / "other"
        other.mkdir()
        target = other / "01_a.json"
        if content is None:
            os.mkfifo(target)
        else:
            target.write_text(content)
        _compare(build / "results", other)
        raise ProbeError("compared with a file that is no results file")
    probe.__name__ = f"compare_results_file_{label}"
    return probe


PROBES = [
    *(Probe(area="pipeline", name=fn.__name__, fn=fn, names=names, clear_types=(CommandRefused,)) for fn, names in [
        (link_index_to_user_file, ("index.json",)),
        (dangling_link_index, ("index.json",)),
        (_rerun_with_link("results/01_a.json"), ("01_a.json",)),
        (_rerun_with_link("notebooks/02_b.ipynb"), ("02_b.ipynb",)),
        (link_partial_folder_to_user_folder, (".partial",)),
        (link_failed_folder_to_user_folder, ("failed",)),
        (link_marker_to_user_file, (".ess-build",)),
        (link_build_folder_itself, ()),
        (_book_with_link("results/index.json"), ("index.json",)),
        (_book_with_link("results/02_b.json"), ("02_b.json",)),
        (_book_with_link("notebooks/01_a.ipynb"), ("01_a.ipynb",)),
        (results_is_a_file, ("results",)),
        (_folder_in_place("results/index.json"), ("index.json",)),
        (_folder_in_place("results/02_b.json"), ("02_b.json",)),
        (results_file_is_a_pipe, ("02_b.json",)),
        (marker_is_a_folder, (".ess-build",)),
        (_denied("results"), ("results",)),
        (_denied("notebooks"), ("notebooks",)),
        (_denied(".partial"), (".partial",)),
        (read_only_midway, ("02_b.json", "results")),
        (disk_full_between_results_and_notebook, ("notebooks",)),
        (full_disk_2mb, ("results", "build folder")),
        (fifo_in_place_of_the_index, ("index.json",)),
        (huge_index, ("index.json",)),
        (stray_executed_notebook, ("07_stray.ipynb",)),
        (executed_notebook_of_another_run, ("02_b.ipynb",)),
        (executed_notebook_not_json, ("02_b.ipynb",)),
        (book_after_only_into_a_fresh_folder, ()),
        (book_with_nothing_executed, ("no executed notebooks",)),
        (book_twice, ()),
        (_concurrent("reproduce"), ("in use",)),
        (_concurrent("book"), ("in use",)),
        (two_runs_one_after_the_other, ()),
        (compare_two_empty_folders, ("nothing to compare",)),
        (compare_a_tree_with_itself, ()),
        (_compare_bad_file("not_json", "{nope"), ("01_a.json",)),
        (_compare_bad_file("nested_deep", "[" * 200_000 + "]" * 200_000), ("01_a.json",)),
        (_compare_bad_file("huge_integer", "[" + "9" * 10_000 + "]"), ("01_a.json",)),
        (_compare_bad_file("a_pipe", None), ("01_a.json",)),
    ]),
    *(Probe(area="pipeline", name=f"index_{label}_{cmd}", fn=_bad_index(label, content, cmd),
            names=("index.json",), clear_types=(CommandRefused,))
      for label, content in _BAD_INDEXES for cmd in ("book", "reproduce")
      if cmd == "book" or label in _REPRODUCE_OVER),
    *(Probe(area="pipeline", name=f"flags_{label}", fn=_flags(label, *argv), names=names,
            clear_types=(CommandRefused,)) for label, names, argv in _FLAG_PROBES),
]


def test_pipeline_probes(tmp_path_factory):
    rows = run_probes(PROBES, tmp_path_factory.mktemp)
    assert bad_rows(rows) == []
