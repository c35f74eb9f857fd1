"""Hostile-user probes of the archive (``ess.archive`` over ``ess.disk``: checkpoint, spill, restore and recover a
tiered cache's requests on disk; ``tests/hostile.py``). Each probe does what a careless or hostile user would -- a
link or a folder planted under the name of the next block, pool, manifest or lock file, a forked child writing
through its parent's archive, an unreadable, truncated or bit-flipped file, absurd sizes claimed by a manifest, a
pool file or ``block_tokens``, request ids that cannot name a file or that collide, a 2-MB full disk in the middle
of a checkpoint, ``kill -9`` in the middle of a checkpoint loop, two threads checkpointing, wrong argument types --
and checks the answer: a refusal must name the argument or the file, a call that goes through must leave the right
bytes, and a stored request whose bytes are gone or changed is ``data loss``. Fixed seeds; a few seconds in all.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from ess.archive import Archive
from ess.disk import CorruptBlockError, DirectoryInUseError
from ess.specs import model_spec
from ess.storage import ResidentCache, TieredCache

from hostile import DataLoss, Probe, ProbeError, bad_rows, guard, run_probes

ROOT = Path(__file__).resolve().parent.parent
TINY = model_spec("tiny")
W = 164                                          # bytes of one tiny FP8 entry
BT = 4                                           # tokens per disk block in most probes (several blocks per request)


def entries(n, seed):
    return np.random.default_rng(seed).integers(0, 256, (TINY.n_layers, n, W), dtype=np.uint8)


def new_archive(folder, capacity=4, **kw):
    return Archive(TieredCache(TINY, capacity=capacity), folder, **kw)


def check(ok, what):
    if not ok:
        raise ProbeError(what)


def _sensible(fn):
    """A probe body for a call that must go through: a refusal (or an error of the library underneath) is a wrong
    answer (``silent``, or ``raw`` for what the harness calls raw), a data-loss finding ``"data loss"``."""
    def body(tmp):
        try:
            return fn(tmp)
        except (TypeError, ValueError, CorruptBlockError) as exc:
            raise ProbeError(f"a call that should go through was refused: {type(exc).__name__}: {exc}") from None
    body.__name__ = fn.__name__
    return guard(body)


def _kept(folder, want: dict, **kw) -> None:
    """A new session on ``folder`` recovers every request of ``want`` ({id: entries}) byte for byte (``DataLoss``
    otherwise)."""
    with new_archive(folder, block_tokens=kw.pop("block_tokens", BT), **kw) as b:
        rec = b.recover()
        for rid, e in want.items():
            if rid not in rec.recovered or not np.array_equal(b.cache.host.entries(rid), e):
                raise DataLoss(f"request {rid!r}: {rec}")


def _stored(folder, **requests) -> dict:
    """Checkpoint requests ({id: seed}, 10 tokens each) in ``folder`` and close; returns {id: entries}."""
    want = {rid: entries(10, seed) for rid, seed in requests.items()}
    with new_archive(folder, block_tokens=BT) as a:
        for rid, e in want.items():
            a.cache.add_request(rid, e)
            a.checkpoint(rid)
    return want


def _refused_then(call, after):
    """Run ``call``; whether it went through or was refused, run ``after`` (the checks of what is left) first."""
    try:
        call()
    except Exception:
        after()
        raise
    after()


def _outside(tmp):
    outside = tmp / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"precious bytes")
    return outside


def _outside_untouched(outside):
    if sorted(p.name for p in outside.iterdir()) != ["precious"] or \
            (outside / "precious").read_bytes() != b"precious bytes":
        raise DataLoss(f"the folder outside the archive changed: {sorted(p.name for p in outside.iterdir())}")


def _plant(path, kind, outside):
    if kind == "dangling_link":
        path.symlink_to(outside / "not-yet")
    elif kind == "link_to_a_file":
        path.symlink_to(outside / "precious")
    elif kind == "folder":
        path.mkdir()
        (path / "inside").write_bytes(b"keep")
    elif kind == "link_to_a_folder":
        path.symlink_to(outside)


def _planted_still_there(path, kind):
    if kind == "folder":
        ok = path.is_dir() and not path.is_symlink() and (path / "inside").read_bytes() == b"keep"
    else:
        ok = path.is_symlink()
    if not ok:
        raise DataLoss(f"{path.name}, planted by the user, was replaced or deleted")


def _rewrite_manifest(path, **changes):
    """Change fields of a manifest body and give it a matching CRC (a careless or hostile writer)."""
    doc = json.loads(path.read_text())
    doc["body"].update(changes)
    doc["crc32"] = zlib.crc32(json.dumps(doc["body"], sort_keys=True, separators=(",", ":")).encode())
    path.write_text(json.dumps(doc))


# -- links and folders planted under the archive's names ------------------------------------------------------------

def _planted_next_file(name, kind):
    """Something planted under the name of the first block or pool file: the spill skips it, follows nothing, and a
    new session gets the request back; the planted thing and what it points to stay as they were."""
    @_sensible
    def probe(tmp):
        arch, outside = tmp / "arch", _outside(tmp)
        arch.mkdir()
        _plant(arch / name, kind, outside)
        want = entries(10, 1)
        try:
            with new_archive(arch, block_tokens=BT) as a:
                a.cache.add_request("a", want)
                a.spill("a")
                m = a.disk.manifest("a")
                check(name not in (m["blocks_file"], m["pool_file"]), f"the planted {name} was chosen")
        finally:                                               # bytes written outside: data loss, whatever else
            _outside_untouched(outside)
            _planted_still_there(arch / name, kind)
        _kept(arch, {"a": want})
        _planted_still_there(arch / name, kind)
        _outside_untouched(outside)
    probe.__name__ = f"planted_{kind}_as_{name}"
    return probe


@_sensible
def planted_names_of_a_later_checkpoint(tmp):
    """A new session overwriting a request (told ``overwrite=True``) writes it from its first block, to the block
    file G + 1 and the pool file S + 1: both names planted (links out of the folder) after the first checkpoint."""
    arch, outside = tmp / "arch", _outside(tmp)
    _stored(arch, a=1)
    (arch / "req-sa.g1.blocks").symlink_to(outside / "precious")
    (arch / "req-sa.p1.npz").symlink_to(outside / "not-yet")
    c = TieredCache(TINY, capacity=4)
    c.add_request("a", entries(12, 2))                        # added with no archive open
    try:
        with Archive(c, arch, block_tokens=BT) as a:
            a.checkpoint("a", overwrite=True)
            m = a.disk.manifest("a")
            check(m["blocks_file"] not in ("req-sa.g0.blocks", "req-sa.g1.blocks")
                  and m["pool_file"] != "req-sa.p1.npz", f"a planted name was chosen: {m['blocks_file']}, {m['pool_file']}")
    finally:
        _outside_untouched(outside)
        _planted_still_there(arch / "req-sa.g1.blocks", "link_to_a_file")
    _kept(arch, {"a": entries(12, 2)})


def _planted_manifest(kind):
    """Something planted under a request's manifest name: a checkpoint told to overwrite and a discard are refused
    naming the file; nothing is written through it, replaced or deleted."""
    @guard
    def probe(tmp):
        arch, outside = tmp / "arch", _outside(tmp)
        arch.mkdir()
        _plant(arch / "req-sa.json", kind, outside)
        c = TieredCache(TINY, capacity=4)
        c.add_request("a", entries(10, 1))
        with Archive(c, arch, block_tokens=BT) as a:
            def after():
                _outside_untouched(outside)
                _planted_still_there(arch / "req-sa.json", kind)
                check(sorted(p.name for p in arch.iterdir() if not p.name.startswith(".ess-disk.")) == ["req-sa.json"],
                      f"files written: {sorted(p.name for p in arch.iterdir())}")
                check(np.array_equal(c.host.entries("a"), entries(10, 1)), "the request in memory changed")
            try:
                a.discard("a")
            except ValueError as exc:
                check("req-sa.json" in str(exc), f"the refused discard names no file: {exc}")
            else:
                raise ProbeError("a discard deleted something ess did not create")
            _refused_then(lambda: a.checkpoint("a", overwrite=True), after)
    probe.__name__ = f"planted_{kind}_as_the_manifest"
    return probe


def _planted_lock(name, kind, what):
    """Something planted under the lock or the holder record's name: opening an archive is refused naming it, the
    link is not followed, and once it is gone an archive opens (the refused one kept no lock)."""
    @guard
    def probe(tmp):
        arch, outside = tmp / "arch", _outside(tmp)
        arch.mkdir()
        _plant(arch / name, kind, outside)

        def after():
            _outside_untouched(outside)
            _planted_still_there(arch / name, kind)
            if kind == "folder":
                (arch / name / "inside").unlink()
                (arch / name).rmdir()
            else:
                (arch / name).unlink()
            new_archive(arch).close()
        try:
            opened = new_archive(arch)
        except Exception:
            after()
            raise
        opened.close()
        _outside_untouched(outside)
        raise ProbeError(f"an archive opened over the planted {name}")
    probe.__name__ = f"planted_{kind}_as_{what}"
    return probe


@_sensible
def block_file_replaced_by_a_link_to_another_request(tmp):
    """The block file a manifest names, replaced by a link to another request's block file: the next (incremental)
    checkpoint neither appends through the link nor deletes it, and both requests come back whole."""
    want = _stored(tmp, a=1, b=2)
    b_bytes = (tmp / "req-sb.g0.blocks").read_bytes()
    with new_archive(tmp, block_tokens=BT) as a:
        check(sorted(a.recover().recovered) == ["a", "b"], "the two requests did not recover")
        (tmp / "req-sa.g0.blocks").unlink()
        (tmp / "req-sa.g0.blocks").symlink_to("req-sb.g0.blocks")
        for t in range(3):
            a.cache.append_token("a", entries(3, 5)[:, t])
        a.checkpoint("a")
        want["a"] = np.concatenate([want["a"], entries(3, 5)], axis=1)
    if (tmp / "req-sb.g0.blocks").read_bytes() != b_bytes:
        raise DataLoss("another request's block file was written through a link")
    check((tmp / "req-sa.g0.blocks").is_symlink(), "the planted link was deleted")
    _kept(tmp, want)


# -- a forked child ---------------------------------------------------------------------------------------------------

def _in_child(calls) -> list[str]:
    """Run ``calls`` in a child forked from this process; what each did, as the child reports it through a pipe."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            results = []
            for call in calls:
                try:
                    call()
                    results.append("done")
                except Exception as exc:                          # noqa: BLE001 -- reported to the parent
                    results.append(f"{type(exc).__name__}: {exc}")
            os.write(write_end, pickle.dumps(results))
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        results = pickle.loads(fh.read())
    os.waitpid(pid, 0)
    return results


@guard
def forked_child_writes_through_its_parents_archive(tmp):
    """A child forked from the archive's owner checkpoints, spills, discards, recovers and cleans: each refused
    naming the fork and the directory; the parent goes on and a new session gets its bytes back."""
    a = new_archive(tmp, block_tokens=BT)
    a.cache.add_request("a", entries(10, 1))
    a.checkpoint("a")
    results = _in_child([lambda: a.checkpoint("a"),
                         lambda: (a.cache.append_token("a", entries(1, 9)[:, 0]), a.checkpoint("a")),
                         lambda: a.spill("a"), lambda: a.discard("a"), lambda: a.disk.remove_orphans(),
                         lambda: a.recover(), lambda: a.disk.write("a", entries(3, 7), {})])
    a.cache.append_token("a", entries(1, 5)[:, 0])
    a.checkpoint("a")
    a.close()
    _kept(tmp, {"a": np.concatenate([entries(10, 1), entries(1, 5)], axis=1)})
    for r in results:
        check(r.startswith("DirectoryInUseError") and "a fork of" in r and str(tmp) in r,
              f"the child was not refused: {r}")
    raise DirectoryInUseError(tmp, "", results[0].split(": ", 1)[1])   # the child's refusal, as it read


@_sensible
def forked_child_closes_its_parents_archive(tmp):
    """A child closing the archive it inherited does not release the parent's lock: a second archive on the folder
    is still refused, and the parent still checkpoints."""
    a = new_archive(tmp, block_tokens=BT)
    a.cache.add_request("a", entries(10, 1))
    a.checkpoint("a")
    results = _in_child([a.close])
    check(results == ["done"], f"the child's close: {results}")
    try:
        new_archive(tmp).close()
    except DirectoryInUseError:
        pass
    else:
        raise ProbeError("a child's close released its parent's lock")
    a.cache.append_token("a", entries(1, 5)[:, 0])
    a.checkpoint("a")
    a.close()
    _kept(tmp, {"a": np.concatenate([entries(10, 1), entries(1, 5)], axis=1)})


# -- damaged files: recover reports request by request ---------------------------------------------------------------

@contextlib.contextmanager
def _unreadable(name):
    """Opening a file called ``name`` raises PermissionError (what chmod 000 does for a user other than root)."""
    mp = pytest.MonkeyPatch()

    def guard(real):
        def opener(file, *args, **kwargs):
            if isinstance(file, (str, os.PathLike)) and os.path.basename(os.fspath(file)) == name:
                raise PermissionError(13, "Permission denied", os.fspath(file))
            return real(file, *args, **kwargs)
        return opener
    try:
        mp.setattr(os, "open", guard(os.open))
        mp.setattr(io, "open", guard(io.open))
        yield
    finally:
        mp.undo()


def _recover_damaged(damage, outcome, names):
    """Two requests stored; ``damage(folder)`` hurts request a's files; recover gets b back whole and reports a
    (``failed`` naming one of ``names``, or ``degraded`` with its entries whole)."""
    @_sensible
    def probe(tmp):
        want = _stored(tmp, a=1, b=2)
        with new_archive(tmp, block_tokens=BT) as a:
            with damage(tmp):
                rec = a.recover()
            if "b" not in rec.recovered or not np.array_equal(a.cache.host.entries("b"), want["b"]):
                raise DataLoss(f"an intact request did not come back: {rec}")
            if outcome == "failed":
                check(rec.recovered == ["b"] and list(rec.failed) == ["a"], f"{rec}")
                check(any(n in rec.failed["a"] for n in names), f"the reason names no file: {rec.failed['a']}")
            else:
                check(rec.recovered == ["a", "b"] and list(rec.degraded) == ["a"], f"{rec}")
                if not np.array_equal(a.cache.host.entries("a"), want["a"]):
                    raise DataLoss("a degraded request's entries changed")
    return probe


def _damage(fn):
    @contextlib.contextmanager
    def cm(folder):
        fn(folder)
        yield
    return cm


def _truncate(folder):
    p = folder / "req-sa.g0.blocks"
    with open(p, "r+b") as fh:
        fh.truncate(p.stat().st_size // 2)


def _flip(name, offset):
    def fn(folder):
        p = folder / name
        raw = bytearray(p.read_bytes())
        raw[offset] ^= 0x10
        p.write_bytes(bytes(raw))
    return fn


def _oversized_manifest(folder):
    with open(folder / "req-sa.json", "r+b") as fh:       # 300 MB, sparse: no manifest is that large
        fh.truncate(300 * 2 ** 20)


def _huge_block_claim(folder):
    n = 100_000                                            # 262 MB claimed for a file of 3 blocks
    _rewrite_manifest(folder / "req-sa.json", n_tokens=BT * n, next_slot=n, block_slots=list(range(n)),
                      block_crc32=[0] * n)


def _huge_pool_claim(folder):
    header = np.lib.format.header_data_from_array_1_0(np.zeros(3))
    header["shape"] = (250_000_000,)                       # 2 GB claimed by a pool file of a few hundred bytes
    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(member, header)
    member.write(np.zeros(3).tobytes())
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w") as z:
        z.writestr("token_of.npy", member.getvalue())
    (folder / "req-sa.p0.npz").write_bytes(raw.getvalue())
    _rewrite_manifest(folder / "req-sa.json", pool_crc32=zlib.crc32(raw.getvalue()))


def _path_out_of_the_folder(folder):
    _rewrite_manifest(folder / "req-sa.json", blocks_file="../outside.blocks")


def _peak_below(limit):
    """Damage-free context that fails the probe when recover allocates more than ``limit`` bytes."""
    @contextlib.contextmanager
    def cm(folder):
        tracemalloc.start()
        try:
            yield
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        check(peak < limit, f"recover allocated {peak / 1e6:.0f} MB for a claim")
    return cm


def _then(*cms):
    @contextlib.contextmanager
    def cm(folder):
        with contextlib.ExitStack() as stack:
            for c in cms:
                stack.enter_context(c(folder))
            yield
    return cm


@guard
def restore_a_bit_flipped_block(tmp):
    """restore of a request whose block 1 has a flipped bit: a CorruptBlockError naming the block file, nothing
    restored; verify names block 1."""
    _stored(tmp, a=1)
    _flip("req-sa.g0.blocks", TINY.n_layers * BT * W + 7)(tmp)
    a = new_archive(tmp, block_tokens=BT)

    def after():
        check(a.cache.requests() == [], "a damaged request was half restored")
        check(a.verify("a") == [1], f"verify: {a.verify('a')}")
        a.close()
    _refused_then(lambda: a.restore("a"), after)


@_sensible
def repair_a_bit_flipped_block(tmp):
    """A block flipped on disk while the request is in memory: repair rewrites it, and a new session gets the bytes
    back."""
    want = entries(10, 1)
    with new_archive(tmp, block_tokens=BT) as a:
        a.cache.add_request("a", want)
        a.checkpoint("a")
        _flip("req-sa.g0.blocks", 5)(tmp)
        check(a.repair("a") == [0], "repair did not name the damaged block")
        check(a.verify("a") == [], "the repaired request still fails its check")
    _kept(tmp, {"a": want})


# -- absurd sizes and wrong types ---------------------------------------------------------------------------------

def _archive_call(fn):
    """A probe that calls ``fn(archive)`` on an archive holding request "a" (checkpointed) and then checks the
    request is still whole on disk."""
    @guard
    def probe(tmp):
        a = new_archive(tmp, block_tokens=BT)
        a.cache.add_request("a", entries(10, 1))
        a.checkpoint("a")

        def after():
            if not a.closed:
                a.close()
            _kept(tmp, {"a": entries(10, 1)})
        _refused_then(lambda: fn(a), after)
    probe.__name__ = fn.__name__
    return probe


def absurd_block_tokens(tmp):
    new_archive(tmp, block_tokens=2 ** 62)


def bool_block_tokens(tmp):
    new_archive(tmp, block_tokens=True)


def float_block_tokens(tmp):
    new_archive(tmp, block_tokens=4.0)


def directory_is_a_file(tmp):
    (tmp / "arch").write_text("mine")
    try:
        new_archive(tmp / "arch")
    finally:
        check((tmp / "arch").read_text() == "mine", "a file given as the directory changed")


def cache_of_another_kind(tmp):
    Archive(ResidentCache(TINY, max_requests=1, max_tokens=8), tmp)


def second_archive_on_the_cache(tmp):
    c = TieredCache(TINY, capacity=4)
    with Archive(c, tmp / "one"):
        Archive(c, tmp / "two")


def second_archive_on_the_folder(tmp):
    with new_archive(tmp):
        new_archive(tmp)


@_archive_call
def overwrite_as_text(a):
    a.checkpoint("a", overwrite="no")


@_archive_call
def checkpoint_after_close(a):
    a.close()
    a.checkpoint("a")


# -- request ids ------------------------------------------------------------------------------------------------------

def _bad_id(rid):
    """An id that cannot name a file (or is of a wrong type): refused by add_request while an archive is open, and
    by checkpoint/spill of a request added before (nothing freed, no file written)."""
    @guard
    def probe(tmp):
        c = TieredCache(TINY, capacity=4)
        try:
            c.add_request(rid, entries(4, 1))                  # no archive open: an int of any length is fine
        except (TypeError, ValueError):
            pass
        before = c.requests()
        with Archive(c, tmp, block_tokens=BT) as a:
            try:
                a.cache.add_request(rid, entries(4, 2))
            except (TypeError, ValueError) as exc:
                check("request_id" in str(exc), f"add_request's refusal names no argument: {exc}")
            else:
                raise ProbeError(f"add_request took {repr(rid)[:40]} with an archive open")

            def after():
                check(c.requests() == before, "a refused spill changed the cache")
                check(sorted(p.name for p in tmp.iterdir() if not p.name.startswith(".ess-disk.")) == [],
                      f"files written: {sorted(p.name for p in tmp.iterdir())}")
            _refused_then(lambda: a.spill(rid), after)
    return probe


@_sensible
def colliding_ids_int_and_str(tmp):
    """1 and "1" are two requests: both spilled, both restored with their own bytes."""
    want = {1: entries(10, 1), "1": entries(10, 2)}
    with new_archive(tmp, block_tokens=BT) as a:
        for rid, e in want.items():
            a.cache.add_request(rid, e)
            a.spill(rid)
        check(sorted(a.requests(), key=repr) == sorted([1, "1"], key=repr), f"requests on disk: {a.requests()}")
        for rid, e in want.items():
            a.restore(rid)
            if not np.array_equal(a.cache.host.entries(rid), e):
                raise DataLoss(f"request {rid!r} came back with other bytes")
    _kept(tmp, want)


@_sensible
def numpy_int_id_and_its_int(tmp):
    """np.int64(5) names the request 5: spilled under one, restored under the other."""
    want = entries(10, 3)
    with new_archive(tmp, block_tokens=BT) as a:
        a.cache.add_request(np.int64(5), want)
        a.spill(5)
        a.restore(np.int64(5))
        if not np.array_equal(a.cache.host.entries(5), want):
            raise DataLoss("request 5 came back with other bytes")
        try:
            a.cache.add_request(5, entries(10, 4))
        except ValueError:
            pass
        else:
            raise ProbeError("a second request 5 was added beside np.int64(5)")
    _kept(tmp, {5: want})


# -- a full disk, kill -9, two threads ------------------------------------------------------------------------------

_DISK_SCRIPT = r"""
import json, resource, signal, sys
import numpy as np
from ess.archive import Archive
from ess.specs import model_spec
from ess.storage import TieredCache
folder, W = sys.argv[1], 164
T = model_spec("tiny")
E = np.random.default_rng(11).integers(0, 256, (T.n_layers, 3600, W), dtype=np.uint8)
out = {}
a = Archive(TieredCache(T, capacity=4), folder, block_tokens=4)
a.cache.add_request("a", E[:, :2000])
a.checkpoint("a")                                           # 1.3 MB: the last good checkpoint
for t in range(2000, 3600):
    a.cache.append_token("a", E[:, t])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)               # a write past the limit fails (EFBIG), not kills
resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, resource.RLIM_INFINITY))
try:
    a.checkpoint("a")                                       # the block file grows past 2 MB
    out["error"] = None
except Exception as exc:
    out["error"] = [type(exc).__name__, [c.__name__ for c in type(exc).__mro__], str(exc)]
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
a.close()
b = Archive(TieredCache(T, capacity=4), folder, block_tokens=4)
rec = b.recover()
out["kept"] = rec.recovered == ["a"] and np.array_equal(b.cache.host.entries("a"), E[:, :2000])
for t in range(2000, 3600):                                 # the disk has room again: the next checkpoint goes
    b.cache.append_token("a", E[:, t])
b.checkpoint("a")
b.close()
c = Archive(TieredCache(T, capacity=4), folder, block_tokens=4)
rec = c.recover()
out["after"] = rec.recovered == ["a"] and np.array_equal(c.cache.host.entries("a"), E) and rec.orphans == []
print(json.dumps(out))
"""


class DiskFullRefusal(OSError):
    """The refusal of the checkpoint the 2-MB disk could not hold, as the child process saw it."""


@guard
def full_disk_2mb_during_a_checkpoint(tmp):
    """A 2-MB disk (RLIMIT_FSIZE in a child process): a checkpoint growing a request's block file past it is
    refused naming the request or its file, the last good checkpoint is restorable byte for byte, and once there is
    room the next checkpoint goes through."""
    arch = tmp / "spill-folder"
    proc = subprocess.run([sys.executable, "-c", _DISK_SCRIPT, str(arch)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"the probe's process failed: {proc.stderr[-600:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if not got["kept"]:
        return "data loss"
    check(got["after"], "the checkpoint after the disk had room again did not read back")
    if got["error"] is None:
        raise ProbeError("a checkpoint that did not fit the disk succeeded")
    name, mro, msg = got["error"]
    if "OSError" in mro and name == "OSError" or name in ("PermissionError", "FileNotFoundError"):
        raise RuntimeError(f"{name}: {msg}")                   # a bare OSError: raw unless it names the file
    if "OSError" in mro:
        raise DiskFullRefusal(f"{name}: {msg}")
    raise (ValueError if "ValueError" in mro else RuntimeError)(f"{name}: {msg}")


@_sensible
def kill_during_checkpoints(tmp):
    """``kill -9`` of a child checkpointing request "a" token by token (a spill and restore every seventh token), in
    three trials, each child first recovering what the last one left: every checkpoint the child reported done is
    restorable byte for byte."""
    E = entries(4000, 21)
    committed = 8
    for trial in range(3):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read_end)
                a = new_archive(tmp, block_tokens=BT)
                rec = a.recover()
                if not rec.recovered:
                    a.cache.add_request("a", E[:, :8])
                    a.checkpoint("a")
                n = a.cache.n_tokens("a")
                os.write(write_end, f"{n}\n".encode())
                while n < E.shape[1]:
                    a.cache.append_token("a", E[:, n])
                    n += 1
                    if n % 7 == 0:
                        a.spill("a")
                        a.restore("a")
                    else:
                        a.checkpoint("a")
                    os.write(write_end, f"{n}\n".encode())   # committed: reported only once the call returned
            finally:
                os._exit(0)
        os.close(write_end)
        first = b""
        while not first.endswith(b"\n"):                      # the child is under way (opening may take a while)
            chunk = os.read(read_end, 1)
            if not chunk:
                break
            first += chunk
        time.sleep(0.1 + 0.07 * trial)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        with os.fdopen(read_end, "rb") as fh:
            reported = [int(x) for x in (first + fh.read()).split()]
        check(reported, f"trial {trial}: the child reported nothing")
        committed = reported[-1]
        with new_archive(tmp, block_tokens=BT) as b:
            rec = b.recover()
            if rec.recovered != ["a"]:
                raise DataLoss(f"trial {trial}: {rec}")
            n = b.cache.n_tokens("a")
            if not committed <= n <= committed + 1 or not np.array_equal(b.cache.host.entries("a"), E[:, :n]):
                raise DataLoss(f"trial {trial}: {n} tokens recovered after {committed} committed")
    check(committed > 8, "the children committed nothing")


@_sensible
def two_threads_checkpoint_two_requests(tmp):
    """Two threads, each appending to and checkpointing its own request of one archive: a new session gets both back
    byte for byte."""
    E = {"a": entries(60, 31), "b": entries(60, 32)}
    errors = []
    with new_archive(tmp, block_tokens=BT) as a:
        for rid in E:
            a.cache.add_request(rid, E[rid][:, :4])

        def run(rid):
            try:
                for t in range(4, 60):
                    a.cache.append_token(rid, E[rid][:, t])
                    a.checkpoint(rid)
            except Exception as exc:                            # noqa: BLE001 -- re-raised in the probe
                errors.append(exc)
        threads = [threading.Thread(target=run, args=(rid,)) for rid in E]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    _kept(tmp, E)


@_sensible
def two_threads_checkpoint_one_request(tmp):
    """Two threads checkpointing the same request at once (a careless caller): whatever they do, a new session gets
    the request back byte for byte, with its device-pool state."""
    want = entries(40, 41)
    errors = []
    with new_archive(tmp, block_tokens=BT) as a:
        a.cache.add_request("a", want)
        barrier = threading.Barrier(2)

        def run():
            try:
                barrier.wait()
                for _ in range(30):
                    a.checkpoint("a")
            except Exception as exc:                            # noqa: BLE001 -- re-raised in the probe
                errors.append(exc)
        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    with new_archive(tmp, block_tokens=BT) as b:
        rec = b.recover()
        if rec.recovered != ["a"] or not np.array_equal(b.cache.host.entries("a"), want) or rec.degraded:
            raise DataLoss(f"{rec}")
    if errors:
        raise errors[0]


# -- another layout or capacity --------------------------------------------------------------------------------------

@_sensible
def recover_with_another_capacity(tmp):
    """A new session with another capacity: the request is reported failed (naming the capacity), its files stay, and
    a session with the right capacity gets it back."""
    want = _stored(tmp, a=1)
    with new_archive(tmp, capacity=8, block_tokens=BT) as b:
        rec = b.recover()
        check(rec.recovered == [] and list(rec.failed) == ["a"] and "capacity" in rec.failed["a"], f"{rec}")
    _kept(tmp, want)


@_sensible
def discard_then_reuse_the_id(tmp):
    """discard frees the id: a new request of that id is added, spilled and restored with its own bytes, and the
    other request is untouched."""
    want = _stored(tmp, a=1, b=2)
    with new_archive(tmp, block_tokens=BT) as a:
        a.discard("a")
        a.cache.add_request("a", entries(10, 9))
        a.spill("a")
        a.restore("a")
        check(np.array_equal(a.cache.host.entries("a"), entries(10, 9)), "the new request came back with other bytes")
    _kept(tmp, {"a": entries(10, 9), "b": want["b"]})


PROBES = [
    *(Probe("archive", f"planted_{kind}_as_{name}", _planted_next_file(name, kind))
      for name, kind in (("req-sa.g0.blocks", "dangling_link"), ("req-sa.g0.blocks", "link_to_a_file"),
                         ("req-sa.p0.npz", "link_to_a_folder"))),
    Probe("archive", "planted_names_of_a_later_checkpoint", planted_names_of_a_later_checkpoint),
    *(Probe("archive", f"planted_{kind}_as_the_manifest", _planted_manifest(kind), ("req-sa.json",))
      for kind in ("dangling_link", "folder")),
    *(Probe("archive", f"planted_{kind}_as_{what}", _planted_lock(name, kind, what), (name,))
      for name, kind, what in ((".ess-disk.lock", "link_to_a_file", "the_lock"),
                               (".ess-disk.holder", "folder", "the_holder_record"))),
    Probe("archive", "block_file_replaced_by_a_link_to_another_request",
          block_file_replaced_by_a_link_to_another_request),
    Probe("archive", "forked_child_writes_through_its_parents_archive",
          forked_child_writes_through_its_parents_archive, ("a fork of",)),
    Probe("archive", "forked_child_closes_its_parents_archive", forked_child_closes_its_parents_archive),
    Probe("archive", "recover_an_unreadable_block_file",
          _recover_damaged(lambda f: _unreadable("req-sa.g0.blocks"), "failed", ("req-sa.g0.blocks",))),
    Probe("archive", "recover_a_truncated_block_file",
          _recover_damaged(_damage(_truncate), "failed", ("req-sa.g0.blocks",))),
    Probe("archive", "recover_a_bit_flipped_block",
          _recover_damaged(_damage(_flip("req-sa.g0.blocks", 3 * W + 1)), "failed", ("req-sa.g0.blocks",))),
    Probe("archive", "recover_a_bit_flipped_pool_file",
          _recover_damaged(_damage(_flip("req-sa.p0.npz", 60)), "degraded", ())),
    Probe("archive", "recover_a_bit_flipped_manifest",
          _recover_damaged(_damage(_flip("req-sa.json", 40)), "failed", ("req-sa.json",))),
    Probe("archive", "recover_a_manifest_naming_a_path_out_of_the_folder",
          _recover_damaged(_damage(_path_out_of_the_folder), "failed", ("../outside.blocks",))),
    Probe("archive", "recover_a_manifest_of_300_mb",
          _recover_damaged(_then(_damage(_oversized_manifest), _peak_below(100e6)), "failed", ("req-sa.json",))),
    Probe("archive", "recover_a_manifest_claiming_262_mb_of_blocks",
          _recover_damaged(_then(_damage(_huge_block_claim), _peak_below(100e6)), "failed", ("req-sa.g0.blocks",))),
    Probe("archive", "recover_a_pool_file_claiming_2_gb",
          _recover_damaged(_then(_damage(_huge_pool_claim), _peak_below(100e6)), "degraded", ())),
    Probe("archive", "restore_a_bit_flipped_block", restore_a_bit_flipped_block, ("req-sa.g0.blocks",),
          clear_types=(CorruptBlockError,)),
    Probe("archive", "repair_a_bit_flipped_block", repair_a_bit_flipped_block),
    Probe("archive", "absurd_block_size", absurd_block_tokens, ("block_tokens",)),
    Probe("archive", "block_size_as_bool", bool_block_tokens, ("block_tokens",)),
    Probe("archive", "block_size_as_float", float_block_tokens, ("block_tokens",)),
    Probe("archive", "folder_given_is_a_file", directory_is_a_file, ("not a folder",)),
    Probe("archive", "archive_over_a_resident_store", cache_of_another_kind, ("TieredCache",)),
    Probe("archive", "second_archive_on_one_store", second_archive_on_the_cache, ("already has an open archive",)),
    Probe("archive", "second_archive_on_the_folder", second_archive_on_the_folder, ("in use",)),
    Probe("archive", "checkpoint_flag_as_text", overwrite_as_text, ("overwrite",)),
    Probe("archive", "checkpoint_after_close", checkpoint_after_close, ("closed",)),
    *(Probe("archive", f"bad_id_{label}", _bad_id(rid), ("request_id",))
      for label, rid in (("int_of_120_digits", 10 ** 120), ("str_of_200_chars", "x" * 200),
                         ("with_a_slash", "../a"), ("float", 1.0), ("bool", True))),
    Probe("archive", "colliding_ids_int_and_str", colliding_ids_int_and_str),
    Probe("archive", "numpy_int_id_and_its_int", numpy_int_id_and_its_int),
    Probe("archive", "kill_during_checkpoints", kill_during_checkpoints),
    Probe("archive", "two_threads_checkpoint_two_requests", two_threads_checkpoint_two_requests),
    Probe("archive", "recover_with_another_capacity", recover_with_another_capacity),
    Probe("archive", "discard_then_reuse_the_id", discard_then_reuse_the_id),
]

# Probes that do not classify as clear error or sensible with today's code (each a real fault, described above it);
# kept out of PROBES so that the suite passes, and listed here so that they are run by hand and not forgotten.


# Found by these probes and fixed since: a checkpoint the disk cannot take is refused naming the request and the
# directory (ArchiveWriteError), and two threads on one archive take turns instead of deleting each other's files.
PROBES += [
    Probe("archive", "full_disk_2mb_during_a_checkpoint", full_disk_2mb_during_a_checkpoint,
          ("req-sa", "spill-folder"), clear_types=(DiskFullRefusal,)),
    Probe("archive", "two_threads_checkpoint_one_request", two_threads_checkpoint_one_request),
]

def test_archive_probes(tmp_path_factory):
    rows = run_probes(PROBES, tmp_path_factory.mktemp)
    assert bad_rows(rows) == []
