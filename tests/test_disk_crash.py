"""The disk tier survives ``kill -9`` at any instant: a writer process appends tokens, moves device pools and
checkpoints three requests in a loop; the test kills it with SIGKILL after a random delay, recovers, and checks that
every request comes back byte for byte as of its last completed checkpoint (or the one being written when the kill
landed, if that one completed on disk first). Also: a missing or garbage manifest is reported request by request,
and orphan files are reported, not deleted."""
import hashlib
import json
import os
import random
import signal
import time

import numpy as np
import pytest

from ess.archive import Archive
from ess.disk import ArchiveError, request_stem
from ess.specs import model_spec
from ess.storage import TieredCache

TINY = model_spec("tiny")
CAP, BLOCK = 6, 4
REQUESTS = ("a", 7, "b.2")
RUNS = 60

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)")


def digest(cache, rid) -> str:
    """Every byte a checkpoint must bring back: the host entries, and per layer the resident tokens in eviction
    order and their slots within the pool (global slot numbers also depend on the order requests were added).
    Checks on the way that the device rows hold the resident tokens' entries."""
    entries = cache.host.entries(rid)
    h = hashlib.sha256(np.ascontiguousarray(entries).tobytes())
    for layer in range(TINY.n_layers):
        slots = cache.slot_map(rid, layer)
        rows = cache.device_rows(np.array(list(slots.values()), np.int64))
        assert np.array_equal(rows, entries[layer][list(slots)]), (rid, layer)
        h.update(json.dumps([cache.resident(rid, layer).tolist(),
                             sorted((t, s % CAP) for t, s in slots.items())]).encode())
    return h.hexdigest()


def new_archive(folder):
    """A cache of the writer's settings with its archive in ``folder``."""
    return Archive(TieredCache(TINY, capacity=CAP, backend="reference"), folder, block_tokens=BLOCK)


def recover(folder):
    archive = new_archive(folder)
    return archive, archive.recover()


def writer(folder, fd, seed):
    """The child: checkpoint loop, reporting 'begin <request> <digest>' before and 'done ...' after each one."""
    rng = np.random.default_rng(seed)
    archive = new_archive(folder)
    cache = archive.cache

    def say(what, rid):
        os.write(fd, f"{what} {rid!r} {digest(cache, rid)}\n".encode())

    for rid in REQUESTS:
        cache.add_request(rid, rng.integers(0, 256, (TINY.n_layers, int(rng.integers(1, 9)), cache.entry_bytes),
                                            dtype=np.uint8))
        say("begin", rid)
        archive.checkpoint(rid)
        say("done", rid)
    os.write(fd, b"ready\n")
    while True:
        rid = REQUESTS[int(rng.integers(len(REQUESTS)))]
        for _ in range(int(rng.integers(0, 3))):
            cache.append_token(rid, rng.integers(0, 256, (TINY.n_layers, cache.entry_bytes), dtype=np.uint8))
        n = cache.n_tokens(rid)
        layer = int(rng.integers(TINY.n_layers))
        cache.step(rid, layer, rng.choice(n, size=min(n, int(rng.integers(1, CAP + 1))), replace=False))
        say("begin", rid)
        archive.checkpoint(rid)
        say("done", rid)


def run_once(folder, seed, delay_s, after_ready):
    """Fork a writer, kill it with SIGKILL ``delay_s`` after it started (or, with ``after_ready``, after its first
    checkpoint of every request); returns what it reported per request: ``{rid: (last done digest or None, digest
    being written or None)}``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                         # the child never returns into pytest
        code = 0
        try:
            os.close(r)
            writer(folder, w, seed)
        except BaseException:                            # noqa: BLE001 -- report through the exit code
            code = 3
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    while after_ready and b"ready\n" not in b"".join(chunks):
        b = os.read(r, 1 << 16)
        assert b, "the writer died before its first checkpoints"
        chunks.append(b)
    time.sleep(delay_s)
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"the writer ended by itself: {status}"
    while True:
        b = os.read(r, 1 << 16)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    state = {}
    for line in b"".join(chunks).decode().splitlines():
        if line.count(" ") != 2:                         # "ready", or a line cut by the kill
            continue
        what, rid, dig = line.split(" ")
        rid = eval(rid)                                  # noqa: S307 -- our own repr of a str or int id
        done, _ = state.get(rid, (None, None))
        state[rid] = (dig, None) if what == "done" else (done, dig)
    return state


@pytest.mark.slow
def test_every_request_recovers_to_its_last_checkpoint_after_kill_9(tmp_path):
    rnd = random.Random(20251210)
    tally = {"recovered": 0, "at_last_done": 0, "at_in_flight": 0, "never_checkpointed": 0, "runs_with_orphans": 0}
    for i in range(RUNS):
        folder = tmp_path / f"run{i}"
        # one run in five is killed from the start (first checkpoints included), the others after them
        early = i % 5 == 0
        state = run_once(folder, seed=i, delay_s=rnd.uniform(0.0, 0.12 if early else 0.2), after_ready=not early)
        archive, rec = recover(folder)                   # the killed writer's lock went with it
        assert rec.degraded == {}, (i, str(rec))
        tally["runs_with_orphans"] += bool(rec.orphans)
        for rid in REQUESTS:
            done, in_flight = state.get(rid, (None, None))
            if rid not in rec.recovered:
                # only a request whose first checkpoint never completed may be missing: its files (if the kill
                # came after some were written) have no manifest, and it is reported so, with them as orphans
                assert done is None, (i, rid, str(rec))
                assert rid not in rec.failed or "no manifest" in rec.failed[rid], (i, rid, str(rec))
                tally["never_checkpointed"] += 1
                continue
            assert rid not in rec.failed
            got = digest(archive.cache, rid)
            assert got in (done, in_flight), f"run {i}: request {rid!r} recovered to a state it never had"
            tally["recovered"] += 1
            tally["at_last_done" if got == done else "at_in_flight"] += 1
        if i % 3:
            archive.close()
            continue
        # the recovered cache writes on: a new checkpoint of a request leaves no orphan of it behind
        for rid in rec.recovered:
            archive.checkpoint(rid)
        left = archive.disk.scan().orphans
        assert not [p for p in left if p.name.startswith(tuple(request_stem(r) + "." for r in rec.recovered))]
        archive.close()
    print(f"kill -9 at random points, {RUNS} runs: {tally}")
    assert tally["recovered"] >= RUNS                    # most runs get past the first checkpoints
    assert tally["at_in_flight"] > 0 and tally["at_last_done"] > 0   # kills landed before and after commit points


def _archive(folder):
    """Three requests checkpointed in ``folder`` by an archive that is then closed; returns its cache and digests."""
    a = new_archive(folder)
    c = a.cache
    rng = np.random.default_rng(1)
    for rid in REQUESTS:
        c.add_request(rid, rng.integers(0, 256, (TINY.n_layers, 10, c.entry_bytes), dtype=np.uint8))
        c.step(rid, 1, np.array([2, 5, 9]))
        a.checkpoint(rid)
    a.close()
    return c, {rid: digest(c, rid) for rid in REQUESTS}


def test_a_bad_request_does_not_stop_the_others_and_each_failure_is_named(tmp_path):
    c, want = _archive(tmp_path)
    (tmp_path / "req-sa.json").write_text("{garbage", encoding="utf-8")          # request "a": garbage manifest
    (tmp_path / "req-i7.json").unlink()                                          # request 7: manifest deleted
    archive, rec = recover(tmp_path)
    assert rec.recovered == ["b.2"] and digest(archive.cache, "b.2") == want["b.2"]
    assert set(rec.failed) == {"a", 7}
    assert "manifest req-sa.json is not valid JSON" in rec.failed["a"]
    assert "no manifest req-i7.json" in rec.failed[7]
    assert sorted(p.name for p in rec.orphans) == sorted(
        p.name for p in tmp_path.iterdir() if p.name.startswith(("req-sa.", "req-i7.")))
    assert all(p.exists() for p in rec.orphans)                                  # reported, not deleted
    with pytest.raises(ArchiveError, match="request_id 'a': manifest req-sa.json is not valid JSON"):
        archive.disk.manifest("a")


def test_damaged_blocks_fail_one_request_with_the_blocks_named(tmp_path):
    c, want = _archive(tmp_path)
    with new_archive(tmp_path) as a:
        path, offset = a.disk.block_location(7, 1)
    with open(path, "r+b") as fh:
        fh.seek(offset + 5)
        byte = fh.read(1)
        fh.seek(offset + 5)
        fh.write(bytes([byte[0] ^ 0x01]))
    archive, rec = recover(tmp_path)
    assert sorted(map(str, rec.recovered)) == ["a", "b.2"] and list(rec.failed) == [7]
    assert "block(s) [1]" in rec.failed[7]
    assert all(digest(archive.cache, r) == want[r] for r in ("a", "b.2"))


def test_a_manifest_that_fails_its_own_checksum_is_refused(tmp_path):
    c, _ = _archive(tmp_path)
    doc = json.loads((tmp_path / "req-sa.json").read_text())
    doc["body"]["n_tokens"] = 9                                  # valid JSON, wrong content
    (tmp_path / "req-sa.json").write_text(json.dumps(doc))
    with pytest.raises(ArchiveError, match="fails its CRC-32 check"), new_archive(tmp_path) as a:
        a.disk.manifest("a")


def test_a_checkpoint_writes_no_byte_the_previous_one_points_to(tmp_path):
    """The invariant behind crash consistency, checked directly: every (file, slot) the old manifest names holds
    the same bytes after the next checkpoint, and the old pool file is another file."""
    a = new_archive(tmp_path)
    c, disk = a.cache, a.disk
    rng = np.random.default_rng(2)
    c.add_request("a", rng.integers(0, 256, (TINY.n_layers, 6, c.entry_bytes), dtype=np.uint8))
    a.checkpoint("a")
    for _ in range(12):
        old = disk.manifest("a")
        before = {(old["blocks_file"], s): disk._view(np.fromfile(tmp_path / old["blocks_file"], np.uint8), s).copy()
                  for s in old["block_slots"]}
        held = {name: (tmp_path / name).read_bytes() for name in (old["blocks_file"], old["pool_file"])}
        c.append_token("a", rng.integers(0, 256, (TINY.n_layers, c.entry_bytes), dtype=np.uint8))
        # at the moment the new manifest is committed, every byte the old one names is still as it was
        real_commit = disk._commit

        def check_then_commit(rid, body, old=old, before=before):
            for (name, s), data in before.items():
                now = np.fromfile(tmp_path / name, np.uint8)
                assert np.array_equal(disk._view(now, s), data), (name, s)
            assert (tmp_path / old["pool_file"]).read_bytes() == held[old["pool_file"]]
            real_commit(rid, body)

        disk._commit = check_then_commit
        a.checkpoint("a")
        disk._commit = real_commit
        assert disk.manifest("a")["pool_file"] != old["pool_file"]
    files = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".ess-disk."))
    assert len(files) == 3, files                          # manifest, one block file, one pool file: old ones gone
