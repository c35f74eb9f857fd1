"""The decoded-weights cache: a hit returns exactly what the GGUF file holds; a stale, truncated or corrupt cache
is detected and rebuilt, never trusted; writing is atomic (nothing half-written is ever read)."""
import os

import numpy as np
import pytest

from ess.llm import read_gguf
from ess.llm.weight_cache import CacheMiss, cache_path, load_cached, read_cache, write_cache
from llm_helpers import write_tiny_gguf


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    return path


def _same(a, b):
    assert a.metadata == b.metadata and a.tensor_types == b.tensor_types
    assert a.tensors.keys() == b.tensors.keys()
    for name in a.tensors:
        assert a.tensors[name].shape == b.tensors[name].shape
        np.testing.assert_array_equal(a.tensors[name], b.tensors[name])


def test_build_then_hit_returns_the_file_contents(source, tmp_path):
    cache = tmp_path / "cache"
    first, status = load_cached(source, cache)
    assert status.startswith("built (no cache file")
    second, status = load_cached(source, cache)
    assert status == "hit"
    _same(second, read_gguf(source))
    assert all(t.flags.writeable and t.flags.c_contiguous for t in second.tensors.values())
    assert [p.name for p in cache.iterdir()] == [cache_path(source).name]          # no temporary file left


def test_disabled_cache_reads_the_file(source):
    contents, status = load_cached(source, None)
    assert status == "disabled" and "blk.0.attn_q.weight" in contents.tensors


@pytest.mark.parametrize("where", ["header", "payload", "digest"])
def test_flipped_byte_is_detected_and_rebuilt(source, tmp_path, where):
    cache = tmp_path / "cache"
    load_cached(source, cache)
    path = cache_path(source, cache)
    data = bytearray(path.read_bytes())
    at = {"header": 40, "payload": len(data) - 100, "digest": len(data) - 1}[where]
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CacheMiss, match="corrupt"):
        read_cache(path, source)
    contents, status = load_cached(source, cache)
    assert status.startswith("built (") and "corrupt" in status
    _same(contents, read_gguf(source))
    assert load_cached(source, cache)[1] == "hit"                 # the rebuilt file is good


@pytest.mark.parametrize("keep", [0, 5, 20, 0.5])
def test_truncated_cache_is_rebuilt(source, tmp_path, keep):
    cache = tmp_path / "cache"
    load_cached(source, cache)
    path = cache_path(source, cache)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep) if isinstance(keep, float) else keep])
    with pytest.raises(CacheMiss):
        read_cache(path, source)
    assert load_cached(source, cache)[1].startswith("built (")


def test_not_a_cache_file(source, tmp_path):
    path = tmp_path / "x.esscache"
    path.write_bytes(b"\0" * 4096)
    with pytest.raises(CacheMiss, match="bad magic"):
        read_cache(path, source)


def test_changed_source_makes_the_cache_stale(source, tmp_path):
    """The key is the source's size and mtime: a rewritten model file (other weights) is decoded anew."""
    cache = tmp_path / "cache"
    load_cached(source, cache)
    write_tiny_gguf(source, seed=1)                          # same size, other weights, newer mtime
    st = os.stat(source)
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    with pytest.raises(CacheMiss, match="another file"):
        read_cache(cache_path(source, cache), source)
    contents, status = load_cached(source, cache)
    assert status.startswith("built (")
    _same(contents, read_gguf(source))


def test_interrupted_write_leaves_the_old_cache(source, tmp_path, monkeypatch):
    """A write that fails midway (here: the disk fills up while the tensors are written) leaves the previous
    complete cache in place and no temporary file."""
    cache = tmp_path / "cache"
    good, _ = load_cached(source, cache)
    before = cache_path(source, cache).read_bytes()
    import ess.atomic

    real_fsync = ess.atomic.os.fsync

    def fail(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(ess.atomic.os, "fsync", fail)            # the flush before the rename fails
    with pytest.raises(OSError, match="No space"):
        write_cache(good, source, cache_path(source, cache))
    monkeypatch.setattr(ess.atomic.os, "fsync", real_fsync)
    assert cache_path(source, cache).read_bytes() == before
    assert [p.name for p in cache.iterdir()] == [cache_path(source).name]
