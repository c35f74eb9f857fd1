"""The one way ess writes a file: a new file beside the old one, flushed to disk, then renamed over it.

A crash (``kill -9``, a power cut) at any instant leaves either the old file or the new one, never a torn one, and
two writers of the same path never share a temporary file (each gets its own, named by :func:`tempfile.mkstemp`):
the last rename wins, whole. Every writer of ess goes through :func:`atomic_path` -- results and executed notebooks
(:mod:`ess.results`, the pipeline), the real model's weight cache, recorded traces, the disk tier's manifests.

* :func:`atomic_path` -- a context manager that yields a temporary path in the destination's folder for any writer
  (NumPy's ``savez``, a stream of chunks ...), then fsyncs it, renames it over the destination and fsyncs the
  folder; on an exception the temporary file goes and the destination is untouched;
* :func:`write_bytes_atomic`, :func:`write_text_atomic`, :func:`write_json_atomic` -- the common cases;
* :func:`fsync_dir` -- make a folder's entries (new names, renames) durable.
"""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

__all__ = ["atomic_path", "write_bytes_atomic", "write_text_atomic", "write_json_atomic", "fsync_dir",
           "fsync_file"]


def fsync_file(path: str | Path) -> None:
    """Flush a file's bytes to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | Path) -> None:
    """Flush a folder's entries to disk (a no-op where the platform has no directory handles)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | Path, *, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a fresh temporary path in ``path``'s folder (created if missing); when the block ends without an
    exception, the file written there is flushed, renamed over ``path`` and the folder flushed. ``suffix`` ends the
    temporary name (``".npz"`` for :func:`numpy.savez`, which would otherwise add one). The file gets the
    permissions of an ordinary new file (not :func:`tempfile.mkstemp`'s 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    tmp = Path(name)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        os.close(fd)
        yield tmp
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (:func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_path`)."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | Path, data: Any, *, indent: int | None = 1, **kwargs) -> Path:
    """Write ``data`` as JSON to ``path`` atomically (:func:`atomic_path`); ``kwargs`` go to :func:`json.dumps`."""
    return write_text_atomic(path, json.dumps(data, indent=indent, **kwargs))
