"""The archive against a hostile user of its folder (ess.archive over ess.disk). Each case lost data or ended in a raw
error before:

* a link planted under the name of the next block or pool file was followed on write (the request's bytes landed
  outside the folder, restore then refused the archive, the request was gone); a planted folder under such a name
  ended the checkpoint in ``IsADirectoryError``; names ess did not create were deleted or replaced;
* a child forked from the archive's owner inherited the folder's lock and checkpointed through the parent's
  archive (two writers, one manifest);
* one unreadable file aborted the whole ``recover()`` instead of failing its own request;
* sizes claimed by a manifest, a pool file or a block size were allocated before being checked (``MemoryError``,
  or gigabytes for a file of kilobytes);
* an int request id too long for a file name ended in ``OSError`` at the first write.
"""
import builtins
import io
import json
import os
import pickle
import tracemalloc
import zipfile
import zlib

import numpy as np
import pytest

from ess.archive import Archive
from ess.disk import ArchiveError, DirectoryInUseError, DiskTier
from ess.specs import model_spec
from ess.storage import TieredCache

TINY = model_spec("tiny")
W = 164


def entries(n, seed):
    return np.random.default_rng(seed).integers(0, 256, (TINY.n_layers, n, W), dtype=np.uint8)


def new_archive(folder, **kw):
    return Archive(TieredCache(TINY, capacity=4), folder, **kw)


def _rewrite_manifest(path, **changes):
    """Change fields of a manifest body and give it a matching CRC (what a careless or hostile writer could do)."""
    doc = json.loads(path.read_text())
    doc["body"].update(changes)
    doc["crc32"] = zlib.crc32(json.dumps(doc["body"], sort_keys=True, separators=(",", ":")).encode())
    path.write_text(json.dumps(doc))


def _plant(path, kind, outside):
    """Put something ess did not create at ``path``: a dangling link out of the folder, a link to an existing file
    out of the folder, a folder, or a link to a folder."""
    if kind == "dangling link":
        path.symlink_to(outside / "not-yet")
    elif kind == "link to a file":
        path.symlink_to(outside / "precious")
    elif kind == "folder":
        path.mkdir()
        (path / "inside").write_bytes(b"keep")
    elif kind == "link to a folder":
        path.symlink_to(outside)


def _outside(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"precious bytes")
    return outside


def _outside_untouched(outside):
    assert sorted(p.name for p in outside.iterdir()) == ["precious"]
    assert (outside / "precious").read_bytes() == b"precious bytes"


def _planted_still_there(path, kind):
    if kind == "folder":
        assert path.is_dir() and not path.is_symlink() and (path / "inside").read_bytes() == b"keep"
    else:
        assert path.is_symlink()


# ------------------------------------------------------------------------------------------------------------------
# 1. Planted links and folders are never followed, chosen, replaced or deleted
# ------------------------------------------------------------------------------------------------------------------

KINDS = ["dangling link", "link to a file", "folder", "link to a folder"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["req-sa.g0.blocks", "req-sa.p0.npz"])
def test_a_planted_name_of_the_first_checkpoint_is_skipped_not_followed(tmp_path, kind, name):
    arch, outside = tmp_path / "arch", _outside(tmp_path)
    arch.mkdir()
    _plant(arch / name, kind, outside)
    with new_archive(arch, block_tokens=4) as a:
        a.cache.add_request("a", entries(10, 1))
        a.spill("a")
        m = a.disk.manifest("a")
        assert name not in (m["blocks_file"], m["pool_file"])      # the planted name was not chosen
        assert a.verify("a") == []
    _outside_untouched(outside)
    _planted_still_there(arch / name, kind)
    with new_archive(arch, block_tokens=4) as b:                    # a new session gets the request back
        rec = b.recover()
        assert rec.recovered == ["a"] and rec.failed == {} and rec.degraded == {}
        np.testing.assert_array_equal(b.cache.host.entries("a"), entries(10, 1))
        b.discard("a")                                             # only ess's own files go
    _planted_still_there(arch / name, kind)
    _outside_untouched(outside)


@pytest.mark.parametrize("kind", KINDS)
def test_planted_names_of_a_later_checkpoint_are_skipped_not_followed(tmp_path, kind):
    """A request rewritten from its first block goes to a new block file G + 1 and a new pool file S + 1: both
    names planted after the first checkpoint."""
    arch, outside = tmp_path / "arch", _outside(tmp_path)
    with DiskTier(arch, TINY.n_layers, W, 4) as d:
        d.write("a", entries(10, 1), {"x": np.arange(3)})
        assert (d.manifest("a")["blocks_file"], d.manifest("a")["pool_file"]) == ("req-sa.g0.blocks", "req-sa.p0.npz")
        _plant(arch / "req-sa.g1.blocks", kind, outside)
        (arch / "req-sa.p1.npz").symlink_to(outside / "pool-not-yet")
        d.write("a", entries(12, 2), {"x": np.arange(4)}, from_token=0)
        m = d.manifest("a")
        assert m["blocks_file"] not in ("req-sa.g0.blocks", "req-sa.g1.blocks") and m["pool_file"] != "req-sa.p1.npz"
        got, pool, bad = d.read("a")
        assert bad == [] and np.array_equal(got, entries(12, 2)) and np.array_equal(pool["x"], np.arange(4))
        d.remove("a")
    _outside_untouched(outside)
    _planted_still_there(arch / "req-sa.g1.blocks", kind)
    assert (arch / "req-sa.p1.npz").is_symlink()


@pytest.mark.parametrize("kind", KINDS)
def test_a_planted_manifest_name_is_refused_before_any_file_is_written(tmp_path, kind):
    arch, outside = tmp_path / "arch", _outside(tmp_path)
    arch.mkdir()
    _plant(arch / "req-sa.json", kind, outside)
    with DiskTier(arch, TINY.n_layers, W, 4) as d:
        with pytest.raises(ValueError, match=r"req-sa\.json.*not a manifest"):
            d.write("a", entries(10, 1), {})
        assert sorted(p.name for p in arch.iterdir() if not p.name.startswith(".ess-disk.")) == ["req-sa.json"]
        assert d.has("a")                                          # something is there: the id is not free
        with pytest.raises(ValueError, match=r"req-sa\.json.*not a manifest"):
            d.remove("a")                                          # and it is not ess's to delete
    _planted_still_there(arch / "req-sa.json", kind)
    _outside_untouched(outside)


def test_a_block_file_replaced_by_a_link_is_not_written_through(tmp_path):
    """The block file a manifest names, replaced by a link (to another request's block file, inside the folder):
    the next checkpoint neither appends through the link nor deletes it."""
    arch = tmp_path / "arch"
    with DiskTier(arch, TINY.n_layers, W, 4) as d:
        d.write("a", entries(8, 1), {})
        d.write("b", entries(8, 2), {})
        b_bytes = (arch / "req-sb.g0.blocks").read_bytes()
        (arch / "req-sa.g0.blocks").unlink()
        (arch / "req-sa.g0.blocks").symlink_to("req-sb.g0.blocks")
        d.write("a", entries(12, 3), {}, from_token=8)              # an incremental checkpoint
        assert (arch / "req-sb.g0.blocks").read_bytes() == b_bytes
        assert (arch / "req-sa.g0.blocks").is_symlink()
        got, _, bad = d.read("a")
        assert bad == [] and np.array_equal(got, entries(12, 3))
        assert d.read("b")[2] == []


def test_a_planted_lock_link_is_refused_and_not_followed(tmp_path):
    arch, outside = tmp_path / "arch", _outside(tmp_path)
    arch.mkdir()
    (arch / ".ess-disk.lock").symlink_to(outside / "lock-not-yet")
    with pytest.raises(ValueError, match=r"\.ess-disk\.lock.*not a regular file"):
        new_archive(arch)
    _outside_untouched(outside)


def test_a_refused_holder_record_does_not_keep_the_lock(tmp_path):
    (tmp_path / ".ess-disk.holder").mkdir()                        # the holder record cannot be written
    with pytest.raises(ValueError, match="ess-disk.holder"):
        new_archive(tmp_path)
    (tmp_path / ".ess-disk.holder").rmdir()
    new_archive(tmp_path).close()                                  # the refused open released the lock


# ------------------------------------------------------------------------------------------------------------------
# 2. A forked child does not write through its parent's archive
# ------------------------------------------------------------------------------------------------------------------

def test_a_forked_child_cannot_checkpoint_through_its_parents_archive(tmp_path):
    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork")
    a = new_archive(tmp_path, block_tokens=4)
    a.cache.add_request("a", entries(10, 1))
    a.checkpoint("a")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:                                                   # the child: try to write, report what happened
        try:
            os.close(read_end)
            results = []
            for call in (lambda: a.checkpoint("a"),
                         lambda: (a.cache.append_token("a", entries(1, 9)[:, 0]), a.checkpoint("a")),
                         lambda: a.disk.write("a", entries(3, 7), {}),
                         lambda: a.discard("a"), lambda: a.disk.remove_orphans(), lambda: a.recover()):
                try:
                    call()
                    results.append("done")
                except Exception as exc:                           # noqa: BLE001 -- reported to the parent
                    results.append(f"{type(exc).__name__}: {exc}")
            os.write(write_end, pickle.dumps(results))
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        results = pickle.loads(fh.read())
    os.waitpid(pid, 0)
    for r in results:
        assert r.startswith("DirectoryInUseError") and f"pid {os.getpid()}" in r and f"pid {pid}" in r \
            and str(tmp_path) in r and "fork" in r, r
    a.cache.append_token("a", entries(1, 5)[:, 0])                 # the parent goes on writing
    a.checkpoint("a")
    want = np.concatenate([entries(10, 1), entries(1, 5)], axis=1)
    assert a.verify("a") == []
    a.close()
    with new_archive(tmp_path, block_tokens=4) as b:
        rec = b.recover()
        assert rec.recovered == ["a"] and rec.failed == {} and rec.orphans == []
        np.testing.assert_array_equal(b.cache.host.entries("a"), want)


# ------------------------------------------------------------------------------------------------------------------
# 3. One unreadable file fails its own request, not the recovery
# ------------------------------------------------------------------------------------------------------------------

def _two_requests(folder):
    with new_archive(folder, block_tokens=4) as a:
        for rid, seed in (("a", 1), ("b", 2)):
            a.cache.add_request(rid, entries(10, seed))
            a.checkpoint(rid)


def _unreadable(monkeypatch, name):
    """Opening a file called ``name`` raises PermissionError (as chmod 000 would for a user other than root)."""
    def guard(real):
        def opener(file, *args, **kwargs):
            if isinstance(file, (str, os.PathLike)) and os.path.basename(os.fspath(file)) == name:
                raise PermissionError(13, "Permission denied", os.fspath(file))
            return real(file, *args, **kwargs)
        return opener
    monkeypatch.setattr(builtins, "open", guard(builtins.open))
    monkeypatch.setattr(io, "open", guard(io.open))
    monkeypatch.setattr(os, "open", guard(os.open))


@pytest.mark.parametrize("name,outcome", [("req-sa.g0.blocks", "failed"), ("req-sa.json", "failed"),
                                          ("req-sa.p0.npz", "degraded")])
def test_an_unreadable_file_fails_its_request_and_recovery_goes_on(tmp_path, monkeypatch, name, outcome):
    _two_requests(tmp_path)
    a = new_archive(tmp_path, block_tokens=4)
    _unreadable(monkeypatch, name)
    rec = a.recover()
    monkeypatch.undo()
    if outcome == "failed":
        assert rec.recovered == ["b"] and list(rec.failed) == ["a"]
        assert name in rec.failed["a"] and "Permission denied" in rec.failed["a"], rec.failed
    else:                                                          # the entries are whole, the device pool empty
        assert rec.recovered == ["a", "b"] and rec.failed == {} and list(rec.degraded) == ["a"]
    np.testing.assert_array_equal(a.cache.host.entries("b"), entries(10, 2))
    a.close()


@pytest.mark.parametrize("what", ["a link to itself", "a folder", "a link to a folder"])
def test_a_block_file_replaced_by_something_else_fails_its_request_only(tmp_path, what):
    _two_requests(tmp_path)
    block = tmp_path / "req-sa.g0.blocks"
    block.unlink()
    if what == "a link to itself":
        block.symlink_to(block.name)
    elif what == "a folder":
        block.mkdir()
    else:
        block.symlink_to(tmp_path)
    with new_archive(tmp_path, block_tokens=4) as a:
        rec = a.recover()
        assert rec.recovered == ["b"] and list(rec.failed) == ["a"] and "req-sa.g0.blocks" in rec.failed["a"]
        np.testing.assert_array_equal(a.cache.host.entries("b"), entries(10, 2))
        with pytest.raises(ArchiveError, match="req-sa.g0.blocks"):
            a.restore("a")
    assert block.is_symlink() or block.is_dir()                   # left as found


# ------------------------------------------------------------------------------------------------------------------
# 4. Absurd sizes are checked before anything is allocated
# ------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("block_tokens", [10 ** 13, 2 ** 62])
def test_an_absurd_block_size_is_refused_up_front(tmp_path, block_tokens):
    with pytest.raises(ValueError, match="block_tokens"):
        a = new_archive(tmp_path, block_tokens=block_tokens)
        a.cache.add_request("a", entries(4, 1))
        a.checkpoint("a")                                         # a MemoryError here before
    with pytest.raises(ValueError, match="block_tokens"):
        DiskTier(tmp_path / "d", TINY.n_layers, W, block_tokens)
    new_archive(tmp_path).close()                                  # the refused archive holds no lock


def _peak_during(fn):
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_a_manifest_claiming_more_blocks_than_its_file_holds_allocates_nothing_for_them(tmp_path):
    """Mistake: a restore or recovery that trusts a manifest's block count and allocates what it claims.
    200,000 blocks of 2.6 kB claimed (525 MB) for a block file of 3 blocks: restore and recover report the
    request corrupt, naming the file, without allocating what the manifest claims."""
    _two_requests(tmp_path)
    n = 200_000
    _rewrite_manifest(tmp_path / "req-sa.json", n_tokens=4 * n, next_slot=n, block_slots=list(range(n)),
                      block_crc32=[0] * n)
    with new_archive(tmp_path, block_tokens=4) as a:
        rec, peak = _peak_during(a.recover)
        assert rec.recovered == ["b"] and list(rec.failed) == ["a"] and "req-sa.g0.blocks" in rec.failed["a"]
        assert peak < 100e6, peak
        _, peak = _peak_during(lambda: pytest.raises(ValueError, a.disk.read, "a"))
        assert peak < 100e6, peak


def test_an_oversized_manifest_is_not_read_into_memory(tmp_path):
    _two_requests(tmp_path)
    with open(tmp_path / "req-sa.json", "r+b") as fh:               # 300 MB (sparse): no manifest is that large
        fh.truncate(300 * 2 ** 20)
    with new_archive(tmp_path, block_tokens=4) as a:
        rec, peak = _peak_during(a.recover)
        assert rec.recovered == ["b"] and "req-sa.json" in rec.failed["a"] and "bytes" in rec.failed["a"]
        assert peak < 100e6, peak


def test_a_pool_file_claiming_a_huge_array_allocates_nothing_for_it(tmp_path):
    """A pool file (its CRC-32 in a rewritten manifest) whose array header claims 2 GB: the pool is reported
    damaged (the request degraded, its entries whole) without allocating the claim."""
    _two_requests(tmp_path)
    pool = tmp_path / "req-sa.p0.npz"
    header = np.lib.format.header_data_from_array_1_0(np.zeros(3))
    header["shape"] = (250_000_000,)
    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(member, header)
    member.write(np.zeros(3).tobytes())
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w") as z:
        z.writestr("token_of.npy", member.getvalue())
    pool.write_bytes(raw.getvalue())
    _rewrite_manifest(tmp_path / "req-sa.json", pool_crc32=zlib.crc32(raw.getvalue()))
    with new_archive(tmp_path, block_tokens=4) as a:
        rec, peak = _peak_during(a.recover)
        assert rec.recovered == ["a", "b"] and list(rec.degraded) == ["a"]
        np.testing.assert_array_equal(a.cache.host.entries("a"), entries(10, 1))
        assert peak < 100e6, peak


# ------------------------------------------------------------------------------------------------------------------
# 5. Request ids that cannot name a file are refused up front
# ------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rid", [10 ** 120, -(10 ** 240), 10 ** 5000], ids=["120 digits", "-240 digits", "5000 digits"])
def test_an_int_id_too_long_for_a_file_name_is_refused_with_a_value_error(tmp_path, rid):
    with new_archive(tmp_path) as a:
        with pytest.raises(ValueError, match=r"request_id .*cannot name a disk file"):
            a.cache.add_request(rid, entries(4, 1))                # while an archive is open
        assert a.cache.requests() == []
        for call in (lambda: a.disk.write(rid, entries(4, 1), {}), lambda: a.disk.has(rid),
                     lambda: a.restore(rid), lambda: a.discard(rid)):
            with pytest.raises(ValueError, match=r"request_id .*cannot name a disk file"):
                call()
    c = TieredCache(TINY, capacity=4)
    c.add_request(rid, entries(4, 1))                              # added with no archive open
    with Archive(c, tmp_path) as a:
        with pytest.raises(ValueError, match=r"request_id .*cannot name a disk file"):
            a.spill(rid)
        assert c.requests() == [rid]                               # the refused spill freed nothing
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".ess-disk.")) == []
    new_archive(tmp_path).close()
    with DiskTier(tmp_path, TINY.n_layers, W, 64) as d:            # the longest allowed id round-trips
        d.write(10 ** 99, entries(4, 1), {})
        d.write(-(10 ** 99), entries(4, 2), {})
        assert np.array_equal(d.read(-(10 ** 99))[0], entries(4, 2)) and sorted(d.list_requests()) == [-(10 ** 99),
                                                                                                     10 ** 99]
