import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ess import atomic
from ess.atomic import atomic_path, write_bytes_atomic, write_json_atomic


def test_an_interrupted_write_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "f.json"
    write_json_atomic(path, {"v": 1})

    def boom(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic.os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        write_json_atomic(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"], "the temporary file is removed"


def test_an_exception_inside_the_block_leaves_the_destination_and_no_temporary(tmp_path):
    path = tmp_path / "a.npz"
    with atomic_path(path, suffix=".npz") as tmp:
        np.savez(tmp, x=np.arange(3))
    with pytest.raises(RuntimeError):
        with atomic_path(path, suffix=".npz") as tmp:
            np.savez(tmp, x=np.arange(5))
            raise RuntimeError("writer failed")
    assert np.load(path)["x"].tolist() == [0, 1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npz"]


def test_written_files_get_ordinary_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        path = write_json_atomic(tmp_path / "f.json", [])
    finally:
        os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o644


def test_two_writers_of_one_path_never_share_a_temporary_file(tmp_path):
    """Two processes writing the same file many times: every read sees one writer's whole file, never a mix."""
    path = tmp_path / "shared.bin"
    code = textwrap.dedent(f"""
        import sys
        from ess.atomic import write_bytes_atomic
        tag = sys.argv[1].encode()
        for _ in range(200):
            write_bytes_atomic({str(path)!r}, tag * 50_000)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, t]) for t in ("a", "b")]
    seen = set()
    while any(p.poll() is None for p in procs):
        if path.exists():
            data = path.read_bytes()
            assert len(data) == 50_000 and len(set(data)) == 1, "a torn or mixed file was visible"
            seen.add(data[:1])
    assert all(p.wait() == 0 for p in procs)
    assert path.read_bytes() in (b"a" * 50_000, b"b" * 50_000)
    assert [p.name for p in tmp_path.iterdir()] == ["shared.bin"]


def test_write_bytes_creates_the_folder(tmp_path):
    path = write_bytes_atomic(tmp_path / "x" / "y" / "z.bin", b"abc")
    assert path.read_bytes() == b"abc"
