"""The archive of a tiered cache's requests on disk: a :class:`~ess.storage.TieredCache` paired with a
:class:`~ess.disk.DiskTier`.

What it owns: which of the cache's requests are on disk and how current their copies are -- checkpoint (write a
request, keep it in memory), spill (write it, then free its memory), restore (bring it back, host pool and device
pool as they were), verify and repair (the blocks' CRC-32s), discard (delete an archived copy), and crash recovery
(:meth:`Archive.recover`: every request the directory holds, request by request, with what failed and why). The
bytes, the files and their crash consistency are :mod:`ess.disk`'s; the pools and the step are
:mod:`ess.storage`'s; the device-pool state written beside a request's entries, and a request loaded back into the
cache, :mod:`ess.archive_state`'s.

**One owner per directory, nothing replaced by accident.** An archive opens its directory's disk tier, which holds
an exclusive lock on the directory for as long as it is open (:class:`~ess.disk.DiskTier`): a second archive on the
same directory, in this process or another, is refused (:class:`~ess.disk.DirectoryInUseError`). While open, the
archive guards the cache: :meth:`~ess.storage.TieredCache.add_request` refuses an id the directory already holds,
and :meth:`checkpoint` refuses to write over an archived copy this archive did not write or restore, unless told
``overwrite=True``. Bring an archived request back with :meth:`restore` (or :meth:`recover`), or delete its copy
with :meth:`discard`, before reusing its id. :meth:`close` (or leaving a ``with`` block, or the archive being
collected, or the process ending) releases the directory.

>>> import tempfile, numpy as np
>>> from ess.storage import TieredCache
>>> with tempfile.TemporaryDirectory() as folder, Archive(TieredCache("tiny", capacity=4), folder) as archive:
...     archive.cache.add_request("r", np.ones((4, 10, 164), np.uint8))
...     archive.spill("r")
...     archive.restore("r")["tokens"]
10
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from pathlib import Path

from . import archive_state, validate
from .disk import ArchiveError, CorruptBlockError, DiskTier, request_stem
from .kernels.transfer import TransferError
from .storage import TieredCache

__all__ = ["Archive", "Recovery", "ArchiveWriteError"]


class ArchiveWriteError(OSError):
    """A checkpoint the disk could not take (full, a file-size limit, an I/O error): names the request, the archive's
    directory and the file; the request's last good checkpoint is kept."""


def _serial(method):
    """One writer or reader at a time per archive: two threads on one archive take turns (each checkpoint's clean-up
    removes the files its manifest does not name, a concurrent writer's temporary files among them)."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return run


@dataclass
class Recovery:
    """What :meth:`Archive.recover` did: ``recovered`` the request ids restored (as of their last completed
    checkpoint); ``failed`` ``{request id: reason}`` for the requests left out (their files stay); ``degraded``
    ``{request id: reason}`` for recovered requests whose device pool could not be refilled (their entries are
    whole); ``orphans`` the disk tier's files that no checkpoint names (left in place)."""

    recovered: list = field(default_factory=list)
    failed: dict = field(default_factory=dict)
    degraded: dict = field(default_factory=dict)
    orphans: list = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"recovered {len(self.recovered)} request(s): {self.recovered}"]
        lines += [f"failed {rid!r}: {why}" for rid, why in self.failed.items()]
        lines += [f"degraded {rid!r}: {why}" for rid, why in self.degraded.items()]
        if self.orphans:
            lines.append(f"orphan files (no checkpoint names them): {[p.name for p in self.orphans]}")
        return "\n".join(lines)


class Archive:
    """The requests of ``cache`` archived in ``directory`` (see the module docstring).

    Parameters
    ----------
    cache : TieredCache
        The cache whose requests are written and restored; one archive at a time may be open on it.
    directory : str or path
        The disk tier's folder (created if needed), locked while the archive is open.
    block_tokens : int, optional
        Tokens per disk block (default: the entry format's page, 64 for DeepSeek-V3.2-Exp).
    """

    def __init__(self, cache: TieredCache, directory, *, block_tokens: int | None = None):
        if not isinstance(cache, TieredCache):
            raise TypeError(f"cache must be an ess.storage.TieredCache, got {type(cache).__name__}")
        if cache.archive is not None:
            raise ValueError(f"cache already has an open archive in {cache.archive.directory}; close it first")
        bt = cache.format.page_tokens if block_tokens is None else block_tokens
        self.disk = DiskTier(directory, cache.n_layers, cache.entry_bytes, bt)     # takes the directory's lock
        self.cache = cache
        self._spilled: dict = {}          # request id -> None: spilled by this archive, in the order they went
        self._owned: set = set()          # ids whose archived copy this archive wrote or restored
        self._clean: dict = {}            # request id -> tokens on disk and unchanged since (incremental checkpoint)
        self._lock = threading.RLock()
        cache._attach_archive(self)

    # -- the directory -------------------------------------------------------------------------------------------
    @property
    def directory(self) -> Path:
        return self.disk.dir

    @property
    def closed(self) -> bool:
        return self.disk.closed

    def close(self) -> None:
        """Release the directory and unpair from the cache (idempotent); the archive can no longer be used."""
        if self.cache.archive is self:
            self.cache._attach_archive(None)
        self.disk.close()

    def __enter__(self) -> "Archive":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        """Refuse a closed archive, and one used from a process forked from its owner
        (:class:`~ess.disk.DirectoryInUseError`: the directory's lock is the owner's)."""
        if self.disk.closed:
            raise ValueError(f"the archive in {self.disk.dir} is closed")
        self.disk._check_open()

    # -- what is where ------------------------------------------------------------------------------------------
    def requests(self) -> list:
        """Ids of the requests archived in the directory (a manifest each, valid or not: see :meth:`recover`)."""
        self._check_open()
        return self.disk.list_requests()

    @property
    def spilled(self) -> list:
        """Ids of the requests this archive spilled and that are not back in memory, in the order they went."""
        return list(self._spilled)

    def is_spilled(self, request_id) -> bool:
        return isinstance(request_id, (int, str)) and request_id in self._spilled

    def check_new(self, request_id) -> None:
        """Refuse (``ValueError``) a new request ``request_id`` that would replace an archived one or that cannot
        name a file (``TypeError``/``ValueError``); :meth:`ess.storage.TieredCache.add_request` calls it."""
        self._check_open()
        request_id = validate.request_id("request_id", request_id)
        request_stem(request_id)
        if request_id in self._spilled:
            raise ValueError(f"request_id {request_id!r} is spilled to {self.disk.dir}: restore it instead")
        if self.disk.has(request_id):
            raise ValueError(f"request_id {request_id!r} is archived in {self.disk.dir} (by an earlier session): "
                             f"restore it (Archive.restore, Archive.recover), or discard the archived copy "
                             f"(Archive.discard) before adding a new request under that id")

    # -- writing ------------------------------------------------------------------------------------------------
    @_serial
    def checkpoint(self, request_id, *, overwrite: bool = False) -> int:
        """Write a request held in memory to disk (blocks changed since its last checkpoint, the device-pool state
        and the manifest), keeping it in memory. Returns the number of blocks written. An archived copy that this
        archive did not write or restore (another session's request of the same id) is refused unless
        ``overwrite=True``."""
        self._check_open()
        overwrite = validate.boolean("overwrite", overwrite)
        request_stem(request_id)                              # an id that can name a file (ValueError otherwise)
        self.cache.n_tokens(request_id)                       # held in memory (ValueError otherwise)
        request_id = validate.request_id("request_id", request_id)
        if request_id not in self._owned and self.disk.has(request_id) and not overwrite:
            raise ValueError(f"request_id {request_id!r} is already archived in {self.disk.dir} by another session; "
                             f"checkpointing would replace it: restore it first, discard it, or pass "
                             f"overwrite=True")
        if request_id not in self._owned:
            self._clean.pop(request_id, None)
        try:
            n = self.disk.write(request_id, self.cache.host.entries(request_id),
                                archive_state.pool_state(self.cache, request_id),
                                from_token=self._clean.get(request_id, 0))
        except (ArchiveError, TypeError, ValueError):
            raise
        except OSError as exc:                    # a full disk, a file-size limit: name what was being written
            self._clean.pop(request_id, None)     # the next checkpoint writes every block again
            where = f" ({exc.filename})" if exc.filename else ""
            raise ArchiveWriteError(exc.errno, f"checkpoint of request_id {request_id!r} to {self.disk.dir}{where} "
                                               f"failed: {exc.strerror or exc}; its last good checkpoint is kept") \
                from exc
        self._clean[request_id] = self.cache.n_tokens(request_id)
        self._owned.add(request_id)
        return n

    @_serial
    def spill(self, request_id, *, overwrite: bool = False) -> None:
        """Pause a request: :meth:`checkpoint` it, then free its host and device memory."""
        self.checkpoint(request_id, overwrite=overwrite)
        self.cache.remove_request(request_id)
        self._spilled[validate.request_id("request_id", request_id)] = None

    @_serial
    def discard(self, request_id) -> None:
        """Delete the archived copy of a request (its manifest first, then its files); a spilled request is then
        gone. The copy in memory, if any, stays. A ``ValueError`` when the directory holds no such request."""
        self._check_open()
        request_id = validate.request_id("request_id", request_id)
        request_stem(request_id)
        if not self.disk.has(request_id) and request_id not in self._spilled:
            raise ValueError(f"request_id {request_id!r} is not archived in {self.disk.dir}")
        self.disk.remove(request_id)
        self._spilled.pop(request_id, None)
        self._owned.discard(request_id)
        self._clean.pop(request_id, None)

    # -- checking -----------------------------------------------------------------------------------------------
    def verify(self, request_id) -> list[int]:
        """Disk blocks of an archived request that fail their CRC-32 (``-1``: the pool-state file)."""
        self._check_open()
        return self.disk.verify(validate.request_id("request_id", request_id))

    @_serial
    def repair(self, request_id) -> list[int]:
        """Rewrite the damaged disk blocks of a request from its copy in memory (which must be the one this archive
        wrote or restored); returns the blocks that were damaged."""
        self._check_open()
        request_id = validate.request_id("request_id", request_id)
        request_stem(request_id)
        self.cache.n_tokens(request_id)                       # held in memory (ValueError otherwise)
        if request_id not in self._owned:
            raise ValueError(f"request_id {request_id!r} was not written or restored by this archive: its copy in "
                             f"memory may not be the archived one, so it cannot repair it")
        bad = self.disk.verify(request_id)
        if bad:
            good = [b for b in bad if b >= 0]
            first = min(good) * self.disk.block_tokens if good else self.cache.n_tokens(request_id)
            self.disk.write(request_id, self.cache.host.entries(request_id),
                            archive_state.pool_state(self.cache, request_id), from_token=first)
            self._clean[request_id] = self.cache.n_tokens(request_id)
        return bad

    # -- reading ------------------------------------------------------------------------------------------------
    @_serial
    def restore(self, request_id) -> dict:
        """Bring an archived request (spilled, or found on disk after a crash) back into the cache: host pool from
        the disk blocks, each checked against its CRC-32, then the device pool refilled with the resident entries
        it held at the checkpoint. Raises :class:`~ess.disk.CorruptBlockError` (and restores nothing) when a block
        of entries is damaged, and a ``ValueError`` (restoring nothing) when the archive was written by a cache of
        another capacity or policy; when only the pool-state file is damaged (or missing), the entries are restored
        and the device pool starts empty. Returns ``{"tokens", "resident", "bytes_h2d", "pool_state_restored"}``."""
        self._check_open()
        request_id = validate.request_id("request_id", request_id)
        request_stem(request_id)
        if request_id in self.cache.requests():
            raise ValueError(f"request_id {request_id!r} is already in memory")
        if not self.disk.has(request_id):
            raise ValueError(f"request_id {request_id!r} is not on disk in {self.disk.dir}")
        entries, pool_state, bad = self.disk.read(request_id, stop_on_damage=True)   # nothing allocated if damaged
        if [b for b in bad if b >= 0]:
            raise CorruptBlockError(request_id, bad, str(self.disk.block_path(request_id)))
        pool_ok = -1 not in bad
        try:
            info = archive_state.load_request(self.cache, request_id, entries, pool_state if pool_ok else None)
        except TransferError:                         # the entries are in, one layer's pool is empty
            self._restored(request_id, entries.shape[1])
            raise
        except ValueError as exc:
            raise ValueError(f"request_id {request_id!r} in {self.disk.dir}: {exc}") from None
        self._restored(request_id, entries.shape[1])
        return {**info, "pool_state_restored": pool_ok}

    def _restored(self, request_id, n_tokens: int) -> None:
        self._spilled.pop(request_id, None)
        self._owned.add(request_id)
        self._clean[request_id] = n_tokens

    @_serial
    def recover(self) -> Recovery:
        """Restore every request archived in the directory that is not in memory, request by request (after a
        crash: open a new cache with the capacity and policy of the old one, an archive on it, and recover): each
        intact request gets its host and device pools back as of its last completed checkpoint or spill; a request
        whose archive cannot be read (missing or garbage manifest, a file outside the archive, damaged blocks, another
        capacity, a file that cannot be read) is left out and reported with the reason, whatever one request's files
        do, and so are the files no checkpoint names (orphans: nothing is deleted)."""
        self._check_open()
        scan = self.disk.scan()
        out = Recovery([], dict(scan.failed), {}, list(scan.orphans))
        in_memory = set(self.cache.requests())
        for rid in scan.readable:
            if rid in in_memory:
                continue
            try:
                info = self.restore(rid)
            except TransferError as exc:                # entries back, one layer's device pool empty
                out.recovered.append(rid)
                out.degraded[rid] = str(exc)
                continue
            except (CorruptBlockError, ArchiveError, ValueError, OSError) as exc:
                out.failed[rid] = str(exc) if not isinstance(exc, OSError) else \
                    f"request_id {rid!r}: a file cannot be read ({exc})"
                continue
            out.recovered.append(rid)
            if not info["pool_state_restored"]:
                out.degraded[rid] = "the pool-state file is damaged or missing: the device pool starts empty"
        return out
