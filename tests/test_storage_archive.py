"""The disk tier owns its directory (ess.disk, ess.archive): one open tier per directory, across processes; no new
session replaces an archived request by accident; no path read from a manifest leaves the archive; no orphan
clean-up runs while another writer is between its block write and its manifest commit. Each of these lost data
before (two caches on one folder restored each other's requests; a new session's checkpoint overwrote an archived
request of the same id; a manifest with a matching CRC could point restore and the next checkpoint at ``../x``;
one cache's orphan clean-up deleted another's freshly written block file)."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import zlib

import numpy as np
import pytest

from ess.archive import Archive
from ess.disk import LOCK_FILE, ArchiveError, DirectoryInUseError, DiskTier
from ess.specs import model_spec
from ess.storage import TieredCache

TINY = model_spec("tiny")
W = 164
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def entries(n, seed):
    return np.random.default_rng(seed).integers(0, 256, (TINY.n_layers, n, W), dtype=np.uint8)


def new_archive(folder, **kw):
    return Archive(TieredCache(TINY, capacity=4), folder, **kw)


def _python(code: str, **kw):
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


# ------------------------------------------------------------------------------------------------------------------
# One open tier per directory
# ------------------------------------------------------------------------------------------------------------------

def test_a_second_archive_on_the_same_directory_is_refused_until_the_first_closes(tmp_path):
    first = new_archive(tmp_path)
    first.cache.add_request("a", entries(10, 1))
    first.checkpoint("a")
    with pytest.raises(DirectoryInUseError, match=rf"{tmp_path}.*in use.*this process pid {os.getpid()}"):
        new_archive(tmp_path)
    with pytest.raises(DirectoryInUseError):
        DiskTier(tmp_path, TINY.n_layers, W, 64)                     # a bare tier too
    second_cache = TieredCache(TINY, capacity=4)
    with pytest.raises(DirectoryInUseError):
        Archive(second_cache, tmp_path)
    assert second_cache.archive is None                            # the refused archive left nothing attached
    first.close()
    assert first.closed and first.cache.archive is None
    with pytest.raises(ValueError, match="closed"):
        first.checkpoint("a")
    with new_archive(tmp_path) as again:                           # released: the directory can be opened again
        assert again.requests() == ["a"]
    with new_archive(tmp_path):                                    # ... and by a with-block's end
        pass


def test_a_collected_archive_releases_its_directory(tmp_path):
    a = new_archive(tmp_path)
    del a                                                          # no reference cycle: collected at once
    new_archive(tmp_path).close()


@pytest.mark.slow
def test_the_lock_holds_across_processes_and_goes_with_a_killed_holder(tmp_path):
    """Mistake: an archive lock that holds only within one process, or outlives a holder killed with SIGKILL
    (two real processes)."""
    holder = _python(f"""
        import sys, time
        from ess.archive import Archive
        from ess.storage import TieredCache
        a = Archive(TieredCache("tiny", capacity=4), {str(tmp_path)!r})
        print("locked", flush=True)
        time.sleep(60)
    """)
    try:
        assert holder.stdout.readline().strip() == "locked", holder.stderr.read()
        with pytest.raises(DirectoryInUseError, match=rf"{tmp_path}.*process pid {holder.pid}"):
            new_archive(tmp_path)
        # and the other way round: while this process holds it, a child is refused with a clear error
        holder.send_signal(signal.SIGKILL)                         # kill -9: the kernel drops the lock
        holder.wait(timeout=30)
        mine = new_archive(tmp_path)
        child = _python(f"""
            from ess.archive import Archive
            from ess.storage import TieredCache
            Archive(TieredCache("tiny", capacity=4), {str(tmp_path)!r})
            print("opened")
        """)
        out, err = child.communicate(timeout=120)
        assert child.returncode != 0 and "opened" not in out
        assert "DirectoryInUseError" in err and f"pid {os.getpid()}" in err and str(tmp_path) in err
        mine.close()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_the_lock_file_is_no_archive_file(tmp_path):
    with new_archive(tmp_path) as a:
        scan = a.disk.scan()
        assert (tmp_path / LOCK_FILE).exists() and scan.orphans == [] and scan.failed == {}


# ------------------------------------------------------------------------------------------------------------------
# No new session replaces an archived request by accident
# ------------------------------------------------------------------------------------------------------------------

def test_a_new_session_does_not_replace_an_archived_request(tmp_path):
    with new_archive(tmp_path) as old:
        old.cache.add_request("a", entries(10, 1))
        old.checkpoint("a")
    new = new_archive(tmp_path)                                    # a new session that did not recover first
    with pytest.raises(ValueError, match=r"request_id 'a' is archived in .*restore it.*discard"):
        new.cache.add_request("a", entries(5, 2))
    assert new.cache.requests() == [] and new.cache.host.requests() == []     # nothing half-added
    assert new.restore("a")["tokens"] == 10                        # the archived request is intact
    np.testing.assert_array_equal(new.cache.host.entries("a"), entries(10, 1))
    new.close()


def test_checkpoint_refuses_to_overwrite_another_sessions_request_unless_told(tmp_path):
    with new_archive(tmp_path) as old:
        old.cache.add_request("a", entries(10, 1))
        old.checkpoint("a")
    cache = TieredCache(TINY, capacity=4)
    cache.add_request("a", entries(5, 2))                          # added before the archive was opened on it
    new = Archive(cache, tmp_path)
    for call in (lambda: new.checkpoint("a"), lambda: new.spill("a")):
        with pytest.raises(ValueError, match="already archived .* by another session.*overwrite=True"):
            call()
    with pytest.raises(ValueError, match="not written or restored by this archive"):
        new.repair("a")
    assert cache.requests() == ["a"]                               # the refused spill freed nothing
    assert new.disk.read("a")[0].shape[1] == 10                    # still the old request
    with pytest.raises(TypeError, match="overwrite must be True or False"):
        new.checkpoint("a", overwrite="yes")
    new.checkpoint("a", overwrite=True)                            # told to: replaced
    np.testing.assert_array_equal(new.disk.read("a")[0], entries(5, 2))
    new.checkpoint("a")                                            # now its own: no more questions
    new.close()


def test_discard_makes_an_id_free_again(tmp_path):
    with new_archive(tmp_path) as a:
        a.cache.add_request(3, entries(6, 1))
        a.spill(3)
        with pytest.raises(ValueError, match="spilled"):
            a.cache.add_request(3, entries(6, 2))
        a.discard(3)
        assert a.requests() == [] and a.spilled == [] and list(tmp_path.glob("req-*")) == []
        a.cache.add_request(3, entries(6, 2))
        with pytest.raises(ValueError, match="not archived"):
            a.discard(3)


# ------------------------------------------------------------------------------------------------------------------
# Paths read from a manifest stay in the archive
# ------------------------------------------------------------------------------------------------------------------

def _rewrite_manifest(path, **changes):
    """Change fields of a manifest body and give it a matching CRC (what a careless or hostile writer could do)."""
    doc = json.loads(path.read_text())
    doc["body"].update(changes)
    doc["crc32"] = zlib.crc32(json.dumps(doc["body"], sort_keys=True, separators=(",", ":")).encode())
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("field,bad", [
    ("blocks_file", "../outside.bin"), ("blocks_file", "ABSOLUTE"), ("pool_file", "../outside.bin"),
    ("blocks_file", "req-sb.g0.blocks"),                            # another request's file
    ("blocks_file", "req-sa.g0.npz"), ("pool_file", "sub/req-sa.p0.npz"), ("blocks_file", 7),
])
def test_a_manifest_naming_a_file_outside_the_archive_is_corrupt(tmp_path, field, bad):
    arch = tmp_path / "arch"
    with new_archive(arch, block_tokens=4) as a:
        a.cache.add_request("a", entries(8, 1))
        a.checkpoint("a")
        target = arch / a.disk.manifest("a")[field]
    outside = tmp_path / "outside.bin"
    outside.write_bytes(target.read_bytes())                       # a copy with the right bytes, out of the archive
    bad = str(outside) if bad == "ABSOLUTE" else bad
    _rewrite_manifest(arch / "req-sa.json", **{field: bad})
    before = outside.read_bytes()
    a = new_archive(arch, block_tokens=4)
    with pytest.raises(ArchiveError, match=rf"request_id 'a': manifest req-sa.json names {field} .*refused"):
        a.restore("a")
    rec = a.recover()
    assert rec.recovered == [] and f"names {field}" in rec.failed["a"] and repr(bad) in rec.failed["a"]
    with pytest.raises(ArchiveError, match="refused"):
        a.verify("a")
    a.discard("a")                                                 # only the archive's own files go
    assert outside.read_bytes() == before and sorted(p.name for p in arch.glob("req-*")) == []
    a.close()


def test_a_block_file_that_links_out_of_the_archive_is_corrupt(tmp_path):
    arch = tmp_path / "arch"
    with new_archive(arch, block_tokens=4) as a:
        a.cache.add_request("a", entries(8, 1))
        a.checkpoint("a")
        name = a.disk.manifest("a")["blocks_file"]
    outside = tmp_path / "outside.bin"
    (arch / name).rename(outside)
    (arch / name).symlink_to(outside)                              # the right name, pointing out of the folder
    with new_archive(arch, block_tokens=4) as a:
        assert "not a file of this archive" in a.recover().failed["a"]


def test_a_manifest_with_fields_of_the_wrong_type_is_corrupt_not_a_crash(tmp_path):
    with new_archive(tmp_path, block_tokens=4) as a:
        a.cache.add_request("a", entries(8, 1))
        a.checkpoint("a")
    for changes in ({"block_slots": ["0", "1"]}, {"n_tokens": 8.0}, {"next_slot": True}, {"block_crc32": [1, -2]},
                    {"request_id": ["a"]}, {"pool_crc32": None}):
        with new_archive(tmp_path, block_tokens=4) as a:
            m = json.loads((tmp_path / "req-sa.json").read_text())
            _rewrite_manifest(tmp_path / "req-sa.json", **changes)
            assert "inconsistent" in a.recover().failed["a"], changes
            (tmp_path / "req-sa.json").write_text(json.dumps(m))  # back to the good manifest


# ------------------------------------------------------------------------------------------------------------------
# Orphan clean-up only under the lock
# ------------------------------------------------------------------------------------------------------------------

def test_no_other_tier_can_clean_up_between_a_block_write_and_its_manifest_commit(tmp_path):
    a = new_archive(tmp_path, block_tokens=4)
    a.cache.add_request("x", entries(8, 1))
    real_commit = a.disk._commit
    seen = []

    def between_block_write_and_commit(rid, body):
        new_files = {body["blocks_file"], body["pool_file"]}
        assert new_files <= {p.name for p in tmp_path.iterdir()}   # written, not yet named by a manifest
        try:
            other = DiskTier(tmp_path, TINY.n_layers, W, 4)
        except DirectoryInUseError:
            seen.append("refused")
        else:
            seen.append(other.remove_orphans())                   # what a second tier would have done
        real_commit(rid, body)

    a.disk._commit = between_block_write_and_commit
    a.checkpoint("x")
    a.disk._commit = real_commit
    assert seen == ["refused"]
    assert a.verify("x") == []
    a.spill("x")
    np.testing.assert_array_equal(entries(8, 1), a.disk.read("x")[0])
    a.close()


def test_a_closed_tier_does_nothing(tmp_path):
    disk = DiskTier(tmp_path, TINY.n_layers, W, 4)
    disk.close()
    disk.close()                                                   # idempotent
    for call in (disk.scan, disk.remove_orphans, disk.list_requests, lambda: disk.has("a"),
                 lambda: disk.write("a", entries(4, 1), {})):
        with pytest.raises(ValueError, match="closed"):
            call()


def test_a_forked_child_does_not_release_its_parents_lock(tmp_path):
    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork")
    a = new_archive(tmp_path)
    pid = os.fork()
    if pid == 0:                                                   # the child closes its copy and exits
        try:
            a.close()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    time.sleep(0.05)
    with pytest.raises(DirectoryInUseError):                       # still the parent's
        new_archive(tmp_path)
    a.close()


def test_an_archive_of_another_capacity_or_policy_is_refused_whole(tmp_path):
    """A request archived by a cache of capacity 4 under FIFO comes back only into such a cache: another capacity or
    policy is reported (nothing half-restored), the entries stay on disk, and the right cache restores them."""
    with Archive(TieredCache(TINY, capacity=4, policy="fifo"), tmp_path) as a:
        a.cache.add_request("a", entries(10, 1))
        a.cache.step("a", 0, np.array([1, 2, 3]))
        a.checkpoint("a")
    for kw, why in (({"capacity": 5, "policy": "fifo"}, "another capacity"), ({"capacity": 4}, "another policy")):
        with Archive(TieredCache(TINY, **kw), tmp_path) as b:
            rec = b.recover()
            assert rec.recovered == [] and why in rec.failed["a"] and b.cache.requests() == []
    with Archive(TieredCache(TINY, capacity=4, policy="fifo"), tmp_path) as c:
        assert c.recover().recovered == ["a"] and set(c.cache.slot_map("a", 0)) == {1, 2, 3}
