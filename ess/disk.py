"""The disk tier of the latent cache: a cold archive of requests, crash-consistent.

Per request (file stem ``req-i<int>`` or ``req-s<str>``, :func:`request_stem`) the tier keeps

* ``<stem>.g<G>.blocks`` -- a block file: blocks of ``block_tokens`` tokens x all layers (zero-padded), each in a
  slot of ``block_bytes`` bytes;
* ``<stem>.p<S>.npz`` -- the device-pool state of checkpoint ``S``;
* ``<stem>.json`` -- the manifest, the **commit point**: which slot of which block file holds each block, one CRC-32
  per block, the pool file and its CRC-32, and a CRC-32 of the manifest itself.

**Crash consistency.** A checkpoint never writes a byte that the current manifest points to: changed blocks go to
slots past every slot the manifest knows (the block file grows), or, when a request is written from its first block
(or the file holds more dead slots than live ones), to a new block file ``G + 1``; the pool state goes to a new file
``S + 1``. Both are flushed to disk (``fsync``), then the new manifest is written to a temporary file, flushed,
renamed over the old one and the directory flushed. Only then are the files the new manifest no longer needs
deleted -- and only files with this tier's names for that request. A process killed at any instant therefore
leaves either the old or the new checkpoint complete, plus at most some unreferenced files, which
:meth:`DiskTier.scan` reports as orphans.

**The tier owns its directory.** While a :class:`DiskTier` is open it holds an exclusive lock on the directory
(``fcntl.flock`` on ``.ess-disk.lock`` there; POSIX, a local file system), so that no second tier -- in this
process or another -- writes, reads or cleans the same archive meanwhile: opening one is refused with a
:class:`DirectoryInUseError` naming the directory and the holder (recorded in ``.ess-disk.holder``). The lock goes
with :meth:`DiskTier.close`, the tier's collection, or the process's end (``kill -9`` included: the kernel drops it).
Every operation, orphan clean-up included, therefore runs under the lock. A closed tier refuses every call, and so
does a tier used from a process forked from the one that opened it (:class:`DirectoryInUseError`): the child
inherits the lock's descriptor, not its ownership, and two writers would interleave blocks and manifests.

**Nothing it did not create is followed, chosen, replaced or deleted.** Block and pool files are created with
``O_CREAT | O_EXCL | O_NOFOLLOW`` under a number above every name of the request's pattern in the directory,
whatever that name holds (a link -- dangling or not --, a folder: skipped, never opened); a block file is grown in
place only when it is a regular file itself (opened with ``O_NOFOLLOW``), else the checkpoint starts a new one;
every file is read through ``O_NOFOLLOW``. Only regular files of the tier's names are ever deleted. A link or a
folder under a request's manifest name makes :meth:`DiskTier.write` and :meth:`DiskTier.remove` refuse (a
``ValueError``) before anything is written or removed; one under the lock or holder file's name makes opening the
tier refuse. Int request ids have at most 100 digits (string ids at most 100 characters), so that every file name
fits the file system.

**Sizes read from disk are checked before they are allocated.** A manifest is at most 64 MiB; a request's blocks
occupy distinct slots, and its entries are read into an array only when the block file holds every block the
manifest claims; a pool file's arrays must be as large as their headers say; one block
(``n_layers x block_tokens x entry_bytes``) must fit in a quarter of the machine's memory.

**Paths read from a manifest stay in the archive.** A manifest names its block and pool files; each must be a plain
file name of this tier's pattern for that request (``<stem>.g<G>.blocks``, ``<stem>.p<S>.npz``) resolving inside the
directory. Anything else -- ``"../x"``, an absolute path, another request's file, a link out of the directory -- makes
the archive corrupt (:class:`ArchiveError` naming the request and the path), reported by :meth:`DiskTier.scan`.

:class:`ess.archive.Archive` pairs a tier with a :class:`ess.storage.TieredCache` (checkpoint, spill, restore,
recover); this module knows files, blocks and checksums, nothing about pools.
"""
from __future__ import annotations

import datetime
import errno
import io
import json
import math
import os
import re
import socket
import stat
import weakref
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .atomic import fsync_dir, write_json_atomic, write_text_atomic
from .validate import (entries as _entries, fits_in_memory, non_negative_int, positive_int,
                       request_id as _request_id)

__all__ = ["DiskTier", "DiskScan", "CorruptBlockError", "ArchiveError", "DirectoryInUseError", "request_stem",
           "request_id_of_stem", "LOCK_FILE"]

LOCK_FILE = ".ess-disk.lock"          # the lock a tier holds on its directory while open
_HOLDER_FILE = ".ess-disk.holder"     # who holds it: {"pid", "host", "opened"}, written by the holder

_FORMAT = "ess-disk-v2"
_MANIFEST_MAX = 64 << 20              # bytes: no manifest is larger (2 million blocks take about 30 MB)
_INT_DIGITS = 100                     # an int request id has at most this many digits (its file names must fit)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)        # a FIFO planted under a file's name must not hang the open
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class CorruptBlockError(RuntimeError):
    """Disk blocks whose checksum does not match and that could not be restored from a host copy."""

    def __init__(self, request_id, blocks: list[int], path: str):
        self.request_id, self.blocks, self.path = request_id, list(blocks), path
        super().__init__(f"request {request_id!r}: disk block(s) {self.blocks} in {path} fail their CRC-32 check "
                         f"and no host copy is left to restore them from")


class DirectoryInUseError(ValueError):
    """The directory of a disk tier is already held by another open tier (this process's or another's), or a tier
    is used from a process forked from the one that opened it (the lock is the opener's)."""

    def __init__(self, directory, holder: str, message: str | None = None):
        self.directory, self.holder = str(directory), holder
        super().__init__(message or f"directory {self.directory!r} is in use by another disk tier ({holder}); close "
                                    f"that tier (Archive.close / DiskTier.close) or use another directory")


class ArchiveError(ValueError):
    """A request's archive cannot be read: its manifest is missing, not valid, or names a file that is not there."""

    def __init__(self, request_id, reason: str):
        self.request_id, self.reason = request_id, reason
        super().__init__(f"request_id {request_id!r}: {reason}")


_SAFE = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")
_STEM = re.compile(r"^req-(i-?[0-9]{1,100}|s[A-Za-z0-9_.\-]{1,100})$")
# every file name this tier creates: the manifest (and its temporaries, ".<stem>.json.<random>.tmp" from
# ess.atomic), block files, pool files
_FILE = re.compile(r"^\.?(?P<stem>req-(?:i-?[0-9]{1,100}|s[A-Za-z0-9_.\-]{1,100}?))"
                   r"(?P<kind>\.json|\.json\.[A-Za-z0-9_]+\.tmp|\.g[0-9]+\.blocks|\.p[0-9]+\.npz)$")


def request_stem(request_id) -> str:
    """The file stem of a request's archive (``req-i<int>`` or ``req-s<str>``); a ``TypeError`` for an id that is
    not an int or a str, a ``ValueError`` for a string that cannot name a file."""
    request_id = _request_id("request_id", request_id)
    if isinstance(request_id, int):
        if abs(request_id) < 10 ** _INT_DIGITS:
            return f"req-i{request_id}"
        digits = len(str(abs(request_id))) if request_id.bit_length() < 13000 else None
        shown = (f"{str(request_id)[:24]}... ({digits} digits)" if digits is not None
                 else f"<an int of {request_id.bit_length()} bits>")
        raise ValueError(f"request_id {shown} cannot name a disk file: an int id has at most {_INT_DIGITS} digits "
                         f"(its file names would be too long)")
    if _SAFE.match(request_id):
        return f"req-s{request_id}"
    raise ValueError(f"request_id {request_id!r} cannot name a disk file: use an int or a string of 1 to 100 "
                     f"letters, digits, '_', '.', '-'")


def request_id_of_stem(stem: str):
    """The request id a stem names (the inverse of :func:`request_stem`); a ``ValueError`` for another name."""
    if not isinstance(stem, str) or not _STEM.match(stem):
        raise ValueError(f"{stem!r} is not a request stem of the disk tier (req-i<int> or req-s<str>)")
    return int(stem[5:]) if stem[4] == "i" else stem[5:]


def _kind(mode: int) -> str:
    """What a directory entry is, in words (from its ``lstat`` mode)."""
    for test, what in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return what
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def _lstat(path) -> os.stat_result | None:
    """``os.lstat`` (the entry itself, a link not followed), ``None`` when nothing has that name."""
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _is_regular(path) -> bool:
    """Whether ``path`` names a regular file itself (not a link to one, not a folder)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode)


class _NotRegular(OSError):
    """A name of the tier's that holds something else than a regular file (a link, a folder, a FIFO ...)."""


def _open_regular(path, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """A descriptor on the regular file ``path`` (a link there is not followed, a FIFO does not block):
    ``FileNotFoundError`` when nothing has that name, :class:`_NotRegular` when something else does, another
    ``OSError`` when it cannot be opened."""
    try:
        fd = os.open(path, flags | _NOFOLLOW | _NONBLOCK | _CLOEXEC, mode)
    except OSError as exc:
        st = _lstat(path) if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO) else None
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise _NotRegular(exc.errno, f"it is {_kind(st.st_mode)}", str(path)) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _NotRegular(errno.EINVAL, f"it is {_kind(mode)}", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _create_exclusive(path) -> int:
    """A descriptor on a new file ``path``, created by this call (``FileExistsError`` when anything -- a file, a
    link, dangling or not, a folder -- has that name: nothing is followed or replaced)."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o666)


def _write_all(fd: int, data, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _pool_arrays(raw: bytes) -> dict | None:
    """The arrays of a pool file's bytes, or ``None`` when they are not a pool file ess writes (an uncompressed npz
    of numeric arrays, each as large as its header says): sizes are checked before anything is allocated."""
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as z:
            for info in z.infolist():
                if info.compress_type != zipfile.ZIP_STORED or not info.filename.endswith(".npy"):
                    return None
                with z.open(info) as fh:
                    version = np.lib.format.read_magic(fh)
                    if version == (1, 0):
                        shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
                    elif version == (2, 0):
                        shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
                    else:
                        return None
                if dtype.hasobject or math.prod(shape) * dtype.itemsize > info.file_size:
                    return None
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception:                       # noqa: BLE001 -- bytes its own checksum vouches for, yet no npz
        return None


def _manifest_crc(body: dict) -> int:
    return zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def _is_int(x, lo: int = 0, below: int | None = None) -> bool:
    return type(x) is int and x >= lo and (below is None or x < below)


def _consistent(m: dict, request_id) -> bool:
    """A manifest body's fields have their types and agree with each other (its paths are checked apart)."""
    try:
        n_blocks = len(m["block_crc32"])
        return (type(m["request_id"]) is type(request_id) and m["request_id"] == request_id
                and all(_is_int(m[k], 1) for k in ("n_layers", "entry_bytes", "block_tokens"))
                and _is_int(m["n_tokens"]) and _is_int(m["next_slot"]) and _is_int(m["sequence"])
                and _is_int(m["pool_crc32"], 0, 1 << 32)
                and isinstance(m["block_slots"], list) and isinstance(m["block_crc32"], list)
                and len(m["block_slots"]) == n_blocks and -(-m["n_tokens"] // m["block_tokens"]) == n_blocks
                and all(_is_int(s, 0, m["next_slot"]) for s in m["block_slots"])
                and len(set(m["block_slots"])) == n_blocks                  # one slot per block
                and all(_is_int(c, 0, 1 << 32) for c in m["block_crc32"])
                and "blocks_file" in m and "pool_file" in m)
    except (KeyError, TypeError):
        return False


def _unlock(fd: int, holder: str, pid: int) -> None:
    """Release a tier's lock: the holder record goes first (while the lock is still held, so that it never removes a
    later holder's), then the descriptor (which drops the lock). In a forked child only the descriptor is closed:
    the lock is the parent's."""
    if os.getpid() == pid:
        try:
            os.unlink(holder)
        except OSError:
            pass
    os.close(fd)


@dataclass
class DiskScan:
    """What :meth:`DiskTier.scan` found: ``readable`` request ids whose manifest is valid, ``failed`` ``{request id:
    reason}`` for requests whose archive cannot be read (missing or garbage manifest, a file it names missing),
    ``orphans`` the tier's files that no valid manifest names (left by a crash, or by a failed request)."""

    readable: list = field(default_factory=list)
    failed: dict = field(default_factory=dict)
    orphans: list = field(default_factory=list)


class DiskTier:
    """A crash-consistent cold archive of requests in ``directory`` (see the module docstring for the files).

    ``n_layers`` x ``block_tokens`` x ``entry_bytes`` bytes per block; the directory is created if needed and locked
    until :meth:`close` (the tier is also a context manager); a directory another open tier holds is refused
    (:class:`DirectoryInUseError`)."""

    def __init__(self, directory, n_layers: int, entry_bytes: int, block_tokens: int = 64):
        self.n_layers = positive_int("n_layers", n_layers)
        self.entry_bytes = positive_int("entry_bytes", entry_bytes)
        self.block_tokens = positive_int("block_tokens", block_tokens)
        fits_in_memory(f"one disk block (n_layers={self.n_layers} x block_tokens={self.block_tokens} x "
                       f"entry_bytes={self.entry_bytes})", self.block_bytes, "it")
        self._release = None                            # set once the lock is taken
        self._pid = os.getpid()                         # the process that holds the lock (set again when taken)
        if not isinstance(directory, (str, os.PathLike)) or isinstance(directory, bytes):
            raise TypeError(f"directory must be a path, got {type(directory).__name__}")
        self.dir = Path(directory)
        if str(directory) == "" or "\0" in str(directory):
            raise ValueError(f"directory must name a folder, got {str(directory)!r}")
        if self.dir.exists() and not self.dir.is_dir():
            raise ValueError(f"directory {str(self.dir)!r} exists and is not a folder")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"directory {str(self.dir)!r} cannot be created ({exc.strerror or exc})") from None
        self._real_dir = self.dir.resolve()
        self._lock()

    # -- the directory's lock --------------------------------------------------------------------------------------
    def _lock(self) -> None:
        """Take the directory's lock (refused when another open tier holds it) and record the holder."""
        try:
            import fcntl
        except ImportError:                     # not POSIX: no lock, so no tier (two could destroy each other's files)
            raise RuntimeError("the disk tier locks its directory with fcntl.flock, which this platform lacks") from None
        try:                                    # the lock file stays between sessions: created once, never followed
            fd = _open_regular(self.dir / LOCK_FILE, os.O_RDWR | os.O_CREAT)
        except _NotRegular as exc:
            raise ValueError(f"directory {str(self.dir)!r} cannot be locked: {LOCK_FILE} there is not a regular file "
                             f"({exc.strerror}; not created by ess): remove it") from None
        except OSError as exc:
            raise ValueError(f"directory {str(self.dir)!r} cannot be locked ({exc.strerror or exc})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise DirectoryInUseError(self.dir, self._holder()) from None
        pid = os.getpid()
        holder = self.dir / _HOLDER_FILE
        try:
            st = _lstat(holder)
            if st is not None and not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{_HOLDER_FILE} there is {_kind(st.st_mode)}, not the holder record ess writes: "
                                 f"remove it")
            opened = datetime.datetime.now().isoformat(timespec="seconds")
            write_json_atomic(holder, {"pid": pid, "host": socket.gethostname(), "opened": opened})
        except (OSError, ValueError) as exc:
            os.close(fd)                        # the lock goes with the refused tier
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ValueError(f"directory {str(self.dir)!r} cannot be written: its holder record {_HOLDER_FILE} "
                             f"({why})") from None
        self._pid = pid
        self._release = weakref.finalize(self, _unlock, fd, str(holder), pid)

    def _holder(self) -> str:
        """Who holds the directory's lock, as its holder recorded it."""
        try:
            fd = _open_regular(self.dir / _HOLDER_FILE)
            with os.fdopen(fd, "rb") as fh:
                doc = json.loads(fh.read(1 << 16).decode("utf-8"))
            pid, host, opened = int(doc["pid"]), str(doc["host"]), str(doc["opened"])
        except (OSError, ValueError, KeyError, TypeError):
            return "holder not recorded"
        who = "this process" if pid == os.getpid() and host == socket.gethostname() else "process"
        return f"{who} pid {pid} on {host}, opened {opened}"

    @property
    def closed(self) -> bool:
        return self._release is None or not self._release.alive

    def close(self) -> None:
        """Release the directory (idempotent); the tier refuses every call afterwards."""
        if self._release is not None:
            self._release()

    def __enter__(self) -> "DiskTier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        """Refuse a closed tier, and a tier used from a process forked from the one that opened it: the child
        inherits the descriptor, not the ownership -- with both writing, manifests and blocks would interleave."""
        if self.closed:
            raise ValueError(f"the disk tier on {str(self.dir)!r} is closed")
        if os.getpid() != self._pid:
            raise DirectoryInUseError(
                self.dir, f"process pid {self._pid}",
                f"the disk tier on {str(self.dir)!r} belongs to process pid {self._pid}, which opened it and holds "
                f"its lock; this process (pid {os.getpid()}) is a fork of it and may not use it (two writers would "
                f"corrupt the archive): use the archive from pid {self._pid} only, or give the child its own "
                f"directory")

    @property
    def block_bytes(self) -> int:
        return self.n_layers * self.block_tokens * self.entry_bytes

    # -- names ---------------------------------------------------------------------------------------------------
    def _manifest_path(self, request_id) -> Path:
        self._check_open()
        return self.dir / f"{request_stem(request_id)}.json"

    def has(self, request_id) -> bool:
        """Whether something has the name of the request's manifest (a manifest, valid or not, or anything planted
        under that name: the id is not free)."""
        return os.path.lexists(self._manifest_path(request_id))

    def _check_manifest_name(self, request_id) -> Path:
        """The manifest's path, when it is free or holds a regular file (ess's manifest, or a damaged one); anything
        else under that name (a link, a folder ...) was not created by this tier: a ``ValueError``, nothing
        written, replaced or deleted."""
        path = self._manifest_path(request_id)
        st = _lstat(path)
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise ValueError(f"request_id {request_id!r}: {path.name} in {self.dir} is {_kind(st.st_mode)}, not a "
                             f"manifest this tier wrote: refused (nothing written or removed); remove it yourself "
                             f"or use another request id")
        return path

    def list_requests(self) -> list:
        """Ids of the requests that have a manifest (valid or not: see :meth:`scan`), in file-name order."""
        self._check_open()
        out = []
        for p in sorted(self.dir.glob("req-*.json")):
            try:
                out.append(request_id_of_stem(p.name[:-len(".json")]))
            except ValueError:
                continue
        return out

    # -- the manifest --------------------------------------------------------------------------------------------
    def manifest(self, request_id) -> dict:
        """The request's manifest, checked: an :class:`ArchiveError` (a ``ValueError``) when it is missing, not
        JSON, fails its own CRC-32, has another format, names a file outside this archive, or describes another
        layout than this tier's."""
        path = self._manifest_path(request_id)
        request_id = _request_id("request_id", request_id)
        try:
            fd = _open_regular(path)
        except FileNotFoundError:
            raise ArchiveError(request_id, f"no manifest {path.name} in {self.dir}") from None
        except OSError as exc:
            raise ArchiveError(request_id, f"manifest {path.name} cannot be read ({exc.strerror or exc})") from None
        try:
            with os.fdopen(fd, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size > _MANIFEST_MAX:
                    raise ArchiveError(request_id, f"manifest {path.name} holds {size} bytes, more than any manifest "
                                                   f"({_MANIFEST_MAX} bytes at most): refused as corrupt")
                text = fh.read(_MANIFEST_MAX + 1).decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ArchiveError(request_id, f"manifest {path.name} cannot be read ({exc})") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ArchiveError(request_id, f"manifest {path.name} is not valid JSON ({exc.msg} at line {exc.lineno} "
                                           f"column {exc.colno})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("body"), dict) or "crc32" not in doc:
            raise ArchiveError(request_id, f"manifest {path.name} is not an {_FORMAT} manifest")
        m = doc["body"]
        if doc["crc32"] != _manifest_crc(m):
            raise ArchiveError(request_id, f"manifest {path.name} fails its CRC-32 check")
        if m.get("format") != _FORMAT:
            raise ArchiveError(request_id, f"manifest {path.name} has format {m.get('format')!r}, expected {_FORMAT!r}")
        if not _consistent(m, request_id):
            raise ArchiveError(request_id, f"manifest {path.name} is inconsistent (request id, block count, slots)")
        stem = request_stem(request_id)
        for key, kind, doc in (("blocks_file", r"\.g[0-9]+\.blocks", ".g<n>.blocks"),
                               ("pool_file", r"\.p[0-9]+\.npz", ".p<n>.npz")):
            name = m[key]
            what = ""
            if isinstance(name, str) and re.fullmatch(re.escape(stem) + kind, name):
                st = _lstat(self.dir / name)                  # missing: reported when read
                if st is not None and not stat.S_ISREG(st.st_mode):
                    what = f", which is {_kind(st.st_mode)}"
                elif st is not None and (self.dir / name).resolve().parent != self._real_dir:
                    what = " outside the directory"
            else:
                what = " (another name)"
            if what:
                raise ArchiveError(request_id, f"manifest {path.name} names {key} {name!r}{what}, not a file of this "
                                               f"archive ({stem}{doc} in {self.dir}): refused as corrupt")
        if (m["n_layers"], m["entry_bytes"], m["block_tokens"]) != (self.n_layers, self.entry_bytes,
                                                                    self.block_tokens):
            raise ArchiveError(request_id, f"archived with layout {m['n_layers']} layers x {m['entry_bytes']} B x "
                                           f"{m['block_tokens']}-token blocks; this tier expects {self.n_layers} x "
                                           f"{self.entry_bytes} B x {self.block_tokens}")
        return m

    def _commit(self, request_id, body: dict) -> None:
        """Write ``body`` as the request's manifest: temporary file, flushed, renamed over the manifest, directory
        flushed."""
        write_text_atomic(self._manifest_path(request_id),
                          json.dumps({"body": body, "crc32": _manifest_crc(body)}, sort_keys=True))

    # -- locations -----------------------------------------------------------------------------------------------
    def block_path(self, request_id) -> Path:
        """The block file of a request's current checkpoint (a ``ValueError`` when it has none)."""
        return self.dir / self.manifest(request_id)["blocks_file"]

    def block_location(self, request_id, block: int) -> tuple[Path, int]:
        """``(file, byte offset)`` of block ``block`` of the current checkpoint; each block is
        ``(n_layers, block_tokens, entry_bytes)`` uint8. A request written from its first block holds block ``b``
        at offset ``b * block_bytes``."""
        m = self.manifest(request_id)
        block = non_negative_int("block", block)
        if block >= len(m["block_slots"]):
            raise ValueError(f"block must be < {len(m['block_slots'])} (the request's blocks), got {block}")
        return self.dir / m["blocks_file"], int(m["block_slots"][block]) * self.block_bytes

    def pool_path(self, request_id) -> Path:
        """The pool-state file of the current checkpoint."""
        return self.dir / self.manifest(request_id)["pool_file"]

    def _view(self, mm: np.ndarray, slot: int) -> np.ndarray:
        return mm[slot * self.block_bytes:(slot + 1) * self.block_bytes].reshape(
            self.n_layers, self.block_tokens, self.entry_bytes)

    def _map_blocks(self, request_id, name: str) -> np.ndarray:
        """A read-only map of the block file ``name`` of a request (a link there is not followed): an
        :class:`ArchiveError` naming the file when it is missing, empty, not a regular file or unreadable."""
        try:
            fd = _open_regular(self.dir / name)
        except FileNotFoundError:
            raise ArchiveError(request_id, f"block file {name} named by the manifest is missing or empty") from None
        except OSError as exc:
            raise ArchiveError(request_id, f"block file {name} cannot be read ({exc.strerror or exc})") from None
        try:
            with os.fdopen(fd, "rb") as fh:
                if os.fstat(fh.fileno()).st_size == 0:
                    raise ArchiveError(request_id, f"block file {name} named by the manifest is missing or empty")
                return np.memmap(fh, dtype=np.uint8, mode="r")
        except OSError as exc:
            raise ArchiveError(request_id, f"block file {name} cannot be read ({exc.strerror or exc})") from None

    # -- writing -------------------------------------------------------------------------------------------------
    def _block_bytes_of(self, entries: np.ndarray, b: int) -> bytes:
        lo, hi = b * self.block_tokens, min((b + 1) * self.block_tokens, entries.shape[1])
        block = np.zeros((self.n_layers, self.block_tokens, self.entry_bytes), np.uint8)
        block[:, :hi - lo] = entries[:, lo:hi]
        return block.tobytes()

    def write(self, request_id, entries: np.ndarray, pool_state: dict, *, from_token: int = 0) -> int:
        """Checkpoint a request: ``entries`` ``(n_layers, n_tokens, entry_bytes)`` uint8 and ``pool_state`` (arrays
        by name). Blocks before the one holding ``from_token`` are taken as unchanged; from there on, each block
        whose bytes differ from the checkpoint's is written to a fresh slot (see the module docstring), then the
        pool state, then the manifest. Returns the number of blocks written."""
        self._check_open()
        stem = request_stem(request_id)
        request_id = _request_id("request_id", request_id)
        entries = _entries("entries", entries, (self.n_layers, None, self.entry_bytes), ndim=3,
                           shape_doc=f"(n_layers={self.n_layers}, n_tokens, {self.entry_bytes})")
        if not isinstance(pool_state, Mapping):
            raise TypeError(f"pool_state must be a dict of arrays, got {type(pool_state).__name__}")
        for key, value in pool_state.items():
            if not (isinstance(key, str) and key.isidentifier()):
                raise ValueError(f"pool_state keys must be identifiers (the pool file's array names), got {key!r}")
            if not isinstance(value, np.ndarray) or value.dtype.kind not in "iuf":
                what = f"dtype {value.dtype}" if isinstance(value, np.ndarray) else type(value).__name__
                raise TypeError(f"pool_state[{key!r}] must be a NumPy array of numbers, got {what}")
        from_token = non_negative_int("from_token", from_token)
        self._check_manifest_name(request_id)           # a link or folder there: refused before any file is written
        n_tokens = entries.shape[1]
        n_blocks = -(-n_tokens // self.block_tokens)
        try:
            old = self.manifest(request_id) if self.has(request_id) else None
        except ArchiveError:
            old = None                       # unreadable: start a new block file, never touch the old one
        # new files get numbers above every name of this request's pattern in the directory (orphans, and anything
        # planted under such a name -- a link, a folder -- included), and are created exclusively (O_EXCL,
        # O_NOFOLLOW): nothing is followed, overwritten or replaced
        gens, seqs = [-1], [-1]
        for name in self._names(stem):
            kind = name[len(stem):]
            if kind.endswith(".blocks"):
                gens.append(int(kind[2:-len(".blocks")]))
            elif kind.endswith(".npz"):
                seqs.append(int(kind[2:-len(".npz")]))
        fd = None
        rewrite = True
        if old is not None:
            first = min(from_token // self.block_tokens, len(old["block_slots"]), n_blocks)
            blocks_file, next_slot = old["blocks_file"], int(old["next_slot"])
            slots = [int(s) for s in old["block_slots"][:first]]
            crcs = [int(c) for c in old["block_crc32"][:first]]
            dead = next_slot - len(old["block_slots"])
            rewrite = first == 0 or dead > max(n_blocks, 4)      # many dead slots: compact into a new file
            if not rewrite:
                try:                                             # the manifest's own block file, grown in place
                    fd = _open_regular(self.dir / blocks_file, os.O_RDWR)
                except OSError:                                  # gone or replaced since: start a new file
                    rewrite = True
        if rewrite:
            fd, blocks_file = self._create_next(stem, ".g", ".blocks", max(gens) + 1)
            next_slot, first, slots, crcs = 0, 0, [], []
        written = 0
        try:
            for b in range(first, n_blocks):
                data = self._block_bytes_of(entries, b)
                crc = zlib.crc32(data)
                if not rewrite and b < len(old["block_crc32"]) and int(old["block_crc32"][b]) == crc:
                    s = int(old["block_slots"][b])
                    if os.pread(fd, self.block_bytes, s * self.block_bytes) == data:
                        slots.append(s)                          # unchanged on disk: keep its slot
                        crcs.append(crc)
                        continue
                _write_all(fd, data, next_slot * self.block_bytes)
                slots.append(next_slot)
                crcs.append(crc)
                next_slot += 1
                written += 1
            os.fsync(fd)
        finally:
            os.close(fd)
        buf = io.BytesIO()
        np.savez(buf, **pool_state)
        raw = buf.getvalue()
        pool_crc = zlib.crc32(raw)
        fd, pool_file = self._create_next(stem, ".p", ".npz", max(seqs) + 1)
        seq = int(pool_file[len(stem) + 2:-len(".npz")])
        try:
            _write_all(fd, raw, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(self.dir)                                    # the new files' names are durable ...
        self._commit(request_id, {
            "format": _FORMAT, "request_id": request_id, "n_layers": self.n_layers, "entry_bytes": self.entry_bytes,
            "block_tokens": self.block_tokens, "n_tokens": int(n_tokens), "sequence": seq,
            "blocks_file": blocks_file, "next_slot": next_slot, "block_slots": slots, "block_crc32": crcs,
            "pool_file": pool_file, "pool_crc32": pool_crc})      # ... before the manifest that names them
        self._remove_unreferenced(stem, {blocks_file, pool_file, f"{stem}.json"})
        return written

    def _create_next(self, stem: str, infix: str, suffix: str, number: int) -> tuple[int, str]:
        """Create ``<stem><infix><n><suffix>`` for the first ``n >= number`` free name (exclusively: a name taken
        meanwhile is skipped, never opened); returns ``(descriptor, name)``."""
        for n in range(number, number + 1000):
            name = f"{stem}{infix}{n}{suffix}"
            try:
                return _create_exclusive(self.dir / name), name
            except FileExistsError:
                continue
        raise ValueError(f"no free file name {stem}{infix}<n>{suffix} in {self.dir} from n = {number} on: the "
                         f"directory is full of names this tier did not create")

    def _names(self, stem: str) -> list[str]:
        """Every name of this tier's pattern for one request stem, whatever it holds (a file, a link, a folder)."""
        out = []
        with os.scandir(self.dir) as it:
            for e in it:
                m = _FILE.match(e.name)
                if m and m.group("stem") == stem:
                    out.append(e.name)
        return out

    def _own_files(self, stem: str) -> list[Path]:
        """The files of this tier's naming for one request stem: regular files only -- a link or a folder under such
        a name was not created by this tier, and is never deleted by it."""
        return [self.dir / n for n in self._names(stem) if _is_regular(self.dir / n)]

    def _remove_unreferenced(self, stem: str, keep: set) -> None:
        for p in self._own_files(stem):
            if p.name not in keep:
                p.unlink(missing_ok=True)

    # -- reading -------------------------------------------------------------------------------------------------
    def verify(self, request_id) -> list[int]:
        """Blocks whose CRC-32 does not match the manifest (the pool file counts as block ``-1``); an
        :class:`ArchiveError` when the manifest cannot be read."""
        return self._read(request_id, want_entries=False)[2]

    def _read(self, request_id, want_entries: bool, stop_on_damage: bool = False):
        """The blocks' CRC-32s are checked first, without allocating anything the manifest claims; the entries
        (``want_entries``) are then read into an array no larger than the block file (a manifest claiming more
        blocks than its file holds is an :class:`ArchiveError`), or not at all when a block is bad and
        ``stop_on_damage``."""
        m = self.manifest(request_id)
        n, name, bb = int(m["n_tokens"]), m["blocks_file"], self.block_bytes
        mm = self._map_blocks(request_id, name) if m["block_slots"] else None
        bad = [b for b, (slot, crc) in enumerate(zip(m["block_slots"], m["block_crc32"]))
               if (slot + 1) * bb > mm.size or zlib.crc32(mm[slot * bb:(slot + 1) * bb]) != crc]
        out = None
        if want_entries and not (stop_on_damage and bad):
            size = 0 if mm is None else mm.size
            if len(m["block_slots"]) * bb > size:              # slots are distinct: some block is past the end
                raise ArchiveError(request_id, f"block file {name} holds {size} bytes, fewer than the "
                                               f"{len(m['block_slots'])} blocks of {bb} bytes its manifest claims: "
                                               f"refused as corrupt (DiskTier.verify names the missing blocks)")
            out = np.zeros((self.n_layers, n, self.entry_bytes), np.uint8)
            for b, slot in enumerate(m["block_slots"]):
                lo, hi = b * self.block_tokens, min((b + 1) * self.block_tokens, n)
                out[:, lo:hi] = self._view(mm, slot)[:, :hi - lo]
        del mm
        pool, raw = {}, None
        try:
            fd = _open_regular(self.dir / m["pool_file"])
            with os.fdopen(fd, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                fits_in_memory("pool_file", size)
                raw = fh.read()
        except (OSError, ValueError):                      # missing, unreadable, not a file, absurdly large
            raw = None
        if raw is None or zlib.crc32(raw) != m["pool_crc32"]:
            bad.append(-1)
        elif want_entries and not (stop_on_damage and bad):
            pool = _pool_arrays(raw)
            if pool is None:
                pool = {}
                bad.append(-1)
        return out, pool, bad

    def read(self, request_id, *, stop_on_damage: bool = False) -> tuple[np.ndarray | None, dict, list[int]]:
        """``(entries (n_layers, n_tokens, W), pool_state, bad_blocks)``; the rows of bad blocks are as found,
        ``pool_state`` is empty when the pool file is bad (block ``-1``). A manifest claiming more blocks than its
        block file holds is an :class:`ArchiveError` (nothing allocated for them: :meth:`verify` names the missing
        blocks). With ``stop_on_damage=True``, a bad block of entries returns ``(None, {}, bad_blocks)`` without
        reading the entries (what :meth:`ess.archive.Archive.restore` does)."""
        if not isinstance(stop_on_damage, bool):
            raise TypeError(f"stop_on_damage must be True or False, got {type(stop_on_damage).__name__}")
        return self._read(request_id, want_entries=True, stop_on_damage=stop_on_damage)

    # -- the whole directory -------------------------------------------------------------------------------------
    def scan(self) -> DiskScan:
        """Every request archived here, one by one: which manifests are readable, which requests cannot be read
        and why (a missing manifest is found from the request's other files), and the orphan files."""
        self._check_open()
        out = DiskScan()
        referenced: set = set()
        stems: dict = {}
        for p in sorted(self.dir.iterdir()):
            m = _FILE.match(p.name)
            if m and _is_regular(p):                 # a link or folder under such a name is not the tier's
                stems.setdefault(m.group("stem"), []).append(p)
        for stem, files in stems.items():
            rid = request_id_of_stem(stem)
            if not any(p.name == f"{stem}.json" for p in files):
                out.failed[rid] = (f"no manifest {stem}.json: its files "
                                   f"{sorted(p.name for p in files)} belong to no complete checkpoint")
                continue
            try:
                m = self.manifest(rid)
            except ArchiveError as exc:
                out.failed[rid] = exc.reason
                continue
            referenced |= {f"{stem}.json", m["blocks_file"], m["pool_file"]}
            if m["block_slots"] and not _is_regular(self.dir / m["blocks_file"]):
                out.failed[rid] = f"block file {m['blocks_file']} named by the manifest is missing"
                continue
            out.readable.append(rid)
        for files in stems.values():
            out.orphans += [p for p in files if p.name not in referenced]
        return out

    def remove(self, request_id) -> None:
        """Delete a request's archive: the manifest first (so no half-deleted archive looks complete), then the
        tier's other files of that request."""
        stem = request_stem(request_id)
        self._check_manifest_name(request_id).unlink(missing_ok=True)
        fsync_dir(self.dir)
        self._remove_unreferenced(stem, set())

    def remove_orphans(self) -> list[Path]:
        """Delete the orphan files :meth:`scan` reports (only files with this tier's names); returns them."""
        orphans = self.scan().orphans
        for p in orphans:
            p.unlink(missing_ok=True)
        return orphans
