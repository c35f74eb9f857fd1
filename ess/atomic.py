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

Bad arguments get a ``TypeError`` / ``ValueError`` naming them before anything is written: a path that is not a
path (or is empty, or holds a NUL byte, or a file name longer than the file system allows), bytes that are not
bytes, text that is not text, JSON data JSON cannot hold (NaN and infinities included: JSON has no such numbers).
An error of the file system itself (no permission, a full disk) is an ``OSError``, as always.
"""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from . import validate

__all__ = ["atomic_path", "write_bytes_atomic", "write_text_atomic", "write_json_atomic", "fsync_dir",
           "fsync_file"]

_NAME_MAX = 255          # bytes in one file name on Linux's file systems (ext4, xfs, btrfs, tmpfs: NAME_MAX)
_TMP_NAME_KEEP = 120     # how much of a long destination name the temporary file's name repeats


def _path(name: str, value: Any) -> Path:
    """``value`` as a :class:`Path` to a file: a string or path-like, not empty, no NUL byte, a file name that
    fits the file system."""
    path = validate.path(name, value)
    if not path.name or path.name in (".", ".."):
        raise ValueError(f"{name} must name a file, got {str(path)!r}")
    if len(os.fsencode(path.name)) > _NAME_MAX:
        raise ValueError(f"{name}: the file name is longer than {_NAME_MAX} bytes ({path.name[:40]!r}...)")
    return path


def fsync_file(path: str | Path) -> None:
    """Flush a file's bytes to disk (an ``OSError`` when it does not exist)."""
    fd = os.open(_path("path", path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | Path) -> None:
    """Flush a folder's entries to disk (a no-op where the platform has no directory handles, or the folder
    cannot be opened)."""
    path = validate.path("path", path)
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
    permissions of an ordinary new file (not :func:`tempfile.mkstemp`'s 0600). The temporary name is
    ``.<name>.<random><suffix>`` (a long ``name`` shortened, so that the temporary name fits the file system)."""
    path = _path("path", path)
    if not isinstance(suffix, str):
        raise TypeError(f"suffix must be a string, got {type(suffix).__name__}")
    if os.sep in suffix or "\0" in suffix or len(suffix) > 16:
        raise ValueError(f"suffix must be a short file-name ending without {os.sep!r}, got {suffix!r}")
    if path.is_dir():
        raise ValueError(f"path {str(path)!r} is a folder, not a file")
    path.parent.mkdir(parents=True, exist_ok=True)
    stem = path.name if len(os.fsencode(path.name)) <= _TMP_NAME_KEEP else path.name[:_TMP_NAME_KEEP // 4]
    fd, name = tempfile.mkstemp(prefix=f".{stem}.", suffix=suffix, dir=path.parent)
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
    """Write ``data`` (bytes) to ``path`` atomically (:func:`atomic_path`)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes, got {type(data).__name__}")
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_path`)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a string, got {type(text).__name__}")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:                 # lone surrogates
        raise ValueError(f"text cannot be written as UTF-8 ({exc.reason} at {exc.start})") from None
    return write_bytes_atomic(path, data)


def write_json_atomic(path: str | Path, data: Any, *, indent: int | None = 1, **kwargs) -> Path:
    """Write ``data`` as JSON to ``path`` atomically (:func:`atomic_path`); ``kwargs`` go to :func:`json.dumps`
    (NaN and infinities are refused unless ``allow_nan=True`` is passed: they are not JSON)."""
    _path("path", path)
    if indent is not None:
        from .validate import non_negative_int
        indent = non_negative_int("indent", indent)
    kwargs.setdefault("allow_nan", False)
    try:
        text = json.dumps(data, indent=indent, **kwargs)
    except TypeError as exc:
        raise TypeError(f"data must be JSON data: {exc}") from None
    except ValueError as exc:                         # NaN / inf, or a circular reference
        raise ValueError(f"data cannot be written as JSON: {exc}") from None
    except RecursionError:
        raise ValueError("data is nested too deeply to be written as JSON") from None
    return write_text_atomic(path, text)
