"""The build folder: the only place the ``ess`` command writes, and the only place it deletes from.

A build folder is one ``ess`` created (it holds the marker file ``.ess-build``) or an empty or new folder, which
``ess`` then marks. ``ess`` refuses, with a one-line :class:`BuildDirError` and before it writes anything, the
repository itself or a folder that holds it, a folder that holds one of the run's inputs or lies inside one (the
notebooks it runs, ``book/``, ``data/``, the repository's ``notebooks/``: a marker does not make them ess's), a
folder holding files tracked by git, a non-empty folder without the marker, a marker that is a symbolic link or
not a file, a file or a symbolic link in the way of a folder ess writes, a missing parent folder, a name the file
system cannot hold, and a folder it cannot write to (the build folder, or one ess writes into that is there). It deletes only what it creates
there: the folders named in :data:`CREATED` and files inside them, never through a symbolic link.

The repository's own ``build/`` from before the marker existed is adopted when it holds nothing but those folders
and the decoded-weight cache ``ess.llm`` keeps there (:data:`REPO_BUILD_ALSO`).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable

from .. import validate
from ..atomic import fsync_dir
from .errors import ReproduceError

__all__ = ["BuildDir", "BuildDirError", "MARKER", "CREATED", "ROOT", "INPUTS"]

ROOT = Path(__file__).resolve().parent.parent.parent
MARKER = ".ess-build"
# what ess creates inside a build folder (the browser tests add their screenshots)
CREATED = ("notebooks", "results", "book", "book_src", "figures", "screenshots", ".partial")
# the repository's folders every run reads (the notebooks, the book's pages, the data the notebooks load)
INPUTS = ("notebooks", "book", "data")
# what else ess itself writes into the repository's own build/ without the pipeline: ess.llm's decoded-weight cache
# (build/cache/llm, ess.llm.weight_cache.CACHE_DIR); never deleted by the pipeline
REPO_BUILD_ALSO = ("cache",)


_PROBE = ".ess-probe-"


def shorten(path, keep: int = 120) -> str:
    """A path for a one-line message: as it is, or its start and end around ``...`` when it is longer than
    ``keep`` characters."""
    text = str(path)
    return text if len(text) <= keep else f"{text[:keep // 2]}...{text[-keep // 2:]}"


class BuildDirError(ReproduceError, ValueError):
    """The build folder cannot be used (one line: which folder and why); a ``ValueError`` too (a bad argument)."""


def _resolved(path: Path) -> Path:
    try:
        return path.expanduser().resolve()
    except (OSError, RuntimeError) as exc:            # a loop of symbolic links, an unreadable folder
        raise BuildDirError(f"build folder {path}: {getattr(exc, 'strerror', None) or exc}") from None


def _tracked_files(folder: Path) -> list[str]:
    """Files tracked by git under ``folder`` (empty when git is missing or the folder is in no repository)."""
    try:
        proc = subprocess.run(["git", "-C", str(folder), "ls-files", "-z", "--", "."], capture_output=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if proc.returncode != 0:
        return []
    return [p for p in proc.stdout.decode(errors="replace").split("\0") if p]


class BuildDir:
    """A claimed build folder. :meth:`claim` checks and marks it; :meth:`remove` deletes what ``ess`` created."""

    def __init__(self, path: Path):
        self.path = path
        self._lock_fh = None

    # -- claiming -------------------------------------------------------------------------------------------
    @classmethod
    def claim(cls, path: str | os.PathLike | None = None, *, create: bool = True,
              inputs: Iterable[str | os.PathLike] = ()) -> "BuildDir":
        """Check ``path`` (default ``<repository>/build``) as a build folder and mark it; with ``create=False``
        it must already exist (``ess book`` reads a build, it does not start one). ``inputs`` are further folders
        or files the command reads (``--notebooks-dir``, a book folder): like the repository's :data:`INPUTS`,
        none may lie inside the build folder, nor the build folder inside one. Every refusal comes before
        anything is created or written."""
        if isinstance(path, BuildDir):
            path = path.path
        path = _resolved(ROOT / "build" if path is None else validate.path("build_dir", path))
        try:
            return cls._claim(path, create, inputs)
        except BuildDirError:
            raise
        except OSError as exc:                        # a name too long for the file system, a folder it cannot read
            raise BuildDirError(f"build folder {shorten(path)}: {exc.strerror or exc}") from None

    @classmethod
    def _claim(cls, path: Path, create, inputs) -> "BuildDir":
        if not isinstance(create, bool):
            raise TypeError(f"create must be True or False, got {create!r}")
        if isinstance(inputs, (str, bytes, os.PathLike)):
            raise TypeError("inputs must be a list of paths, not one path")
        if path == ROOT or path in ROOT.parents:
            raise BuildDirError(f"build folder {path} is the repository or holds it; choose a new folder, "
                                f"e.g. {ROOT / 'build'}")
        for given in [*(ROOT / name for name in INPUTS), *(validate.path("inputs", p) for p in inputs)]:
            source = _resolved(given)
            if source == path or path in source.parents:
                raise BuildDirError(f"build folder {path} holds {source}, an input of this command; ess clears "
                                    f"parts of its build folder, so choose one that holds no input")
            if source in path.parents:
                raise BuildDirError(f"build folder {path} lies inside {source}, an input of this command; "
                                    f"choose a folder outside the inputs")
        if path.exists() and not path.is_dir():
            raise BuildDirError(f"build folder {path} is a file, not a folder; move it or choose another path")
        if not path.exists():
            if not create:
                raise BuildDirError(f"build folder {path} does not exist; run `ess reproduce` first")
            parent = path.parent
            if not parent.is_dir():
                what = "is a file" if parent.exists() else "does not exist"
                raise BuildDirError(f"build folder {path}: its parent folder {parent} {what}")
            try:
                path.mkdir()
            except OSError as exc:
                raise BuildDirError(f"build folder {path} cannot be created: {exc.strerror or exc}") from None
        build = cls(path)
        marker = path / MARKER
        if marker.is_symlink() or (marker.exists() and not marker.is_file()):
            what = "a symbolic link" if marker.is_symlink() else "not a file"
            raise BuildDirError(f"build folder {path}: its marker {MARKER} is {what} (ess writes nothing through "
                                f"it); remove it")
        if not marker.exists():
            # (a probe file is another ess command's check that the folder is writable, at this very moment)
            entries = sorted(p.name for p in path.iterdir() if not p.name.startswith(_PROBE))
            legacy = path == ROOT / "build" and set(entries) <= set(CREATED) | set(REPO_BUILD_ALSO)
            if entries and not legacy:
                shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
                raise BuildDirError(f"build folder {path} holds files ess did not create ({shown}) and no "
                                    f"{MARKER} marker; choose an empty or new folder")
        tracked = _tracked_files(path)
        if tracked:
            raise BuildDirError(f"build folder {path} holds files tracked by git ({tracked[0]}, ...); "
                                f"choose a folder outside the sources")
        for name in CREATED:
            sub = path / name
            if sub.is_symlink():
                raise BuildDirError(f"build folder {path}: {sub} is a symbolic link in the way of the folder ess "
                                    f"writes there (ess writes nothing through it); remove the link")
            if sub.exists() and not sub.is_dir():
                raise BuildDirError(f"build folder {path}: {sub} is a file in the way of the folder ess writes "
                                    f"there; move it")
        build._check_writable()
        if not marker.exists():
            build._write_marker()
        return build

    def _check_writable(self) -> None:
        """The build folder, and each folder ess writes into that is there already, takes a new file."""
        for folder in [self.path, *(self.path / n for n in CREATED if (self.path / n).is_dir())]:
            try:
                fd, probe = tempfile.mkstemp(prefix=_PROBE, dir=folder)
                os.close(fd)
                os.unlink(probe)
            except OSError as exc:
                where = "" if folder == self.path else f": {folder}"
                raise BuildDirError(f"build folder {self.path}{where} is not writable: {exc.strerror or exc}") \
                    from None

    def _write_marker(self) -> None:
        text = json.dumps({"created_by": "ess", "note": "a build folder of the ess command; it deletes only the "
                           "folders it creates here: " + ", ".join(CREATED)}) + "\n"
        try:
            (self.path / MARKER).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise BuildDirError(f"build folder {self.path} is not writable: {exc.strerror or exc}") from None

    # -- the one writer at a time ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self):
        """Hold the build folder for one run: a second ``ess`` command on the same folder is refused."""
        fh = open(self.path / MARKER, "a", encoding="utf-8")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            raise BuildDirError(f"build folder {self.path} is in use by another ess command; wait for it or "
                                f"choose another folder") from None
        try:
            yield self
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()

    # -- paths and removal ----------------------------------------------------------------------------------
    def sub(self, name: str) -> Path:
        """``<build>/<name>``, created, for a name in :data:`CREATED`."""
        folder = self._own(name)
        if folder.is_symlink():
            raise BuildDirError(f"{folder} is a symbolic link; ess writes nothing through it")
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _own(self, rel: str | os.PathLike) -> Path:
        if isinstance(rel, bytes) or not isinstance(rel, (str, os.PathLike)):
            raise TypeError(f"rel must be a path inside the build folder, got {type(rel).__name__}")
        rel = Path(rel)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts or rel.parts[0] not in CREATED:
            raise ValueError(f"{rel} is not something ess creates in a build folder ({', '.join(CREATED)})")
        if not (self.path / MARKER).exists():
            raise BuildDirError(f"build folder {self.path} lost its {MARKER} marker; ess deletes nothing there")
        target = self.path / rel
        # no step of the way may be a symbolic link (it could point at the user's files)
        step = self.path
        for part in rel.parts[:-1]:
            step = step / part
            if step.is_symlink():
                raise BuildDirError(f"{step} is a symbolic link; ess deletes nothing through it")
        return target

    def own(self, rel: str | os.PathLike) -> Path:
        """``<build>/<rel>`` for a path inside a folder ess creates, checked: no step of the way a symbolic link,
        nor the target itself (ess writes nothing through a link)."""
        target = self._own(rel)
        if target.is_symlink():
            raise BuildDirError(f"{target} is a symbolic link; ess writes nothing through it")
        return target

    def remove(self, rel: str | os.PathLike) -> None:
        """Delete ``<build>/<rel>`` (a folder ess creates, or a file or folder inside one); a symbolic link is
        removed, never followed. Nothing happens when it does not exist."""
        target = self._own(rel)
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()

    def move_in(self, source: Path, rel: str | os.PathLike) -> Path:
        """Move ``source`` (a file or folder this run made under ``<build>/.partial``) to ``<build>/<rel>`` with
        one rename (:func:`os.replace`: the old file is replaced whole, never torn), then make the rename durable.
        A folder's ``rel`` must not exist yet (the pipeline names them by run)."""
        source = Path(source)
        partial = self.path / ".partial"
        if partial not in source.parents or source.is_symlink():
            raise ValueError(f"{source} is not something this run made under {partial}")
        target = self.own(rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, target)
        fsync_dir(target.parent)
        return target

    def __repr__(self) -> str:
        return f"BuildDir({str(self.path)!r})"
