"""A disk cache of a decoded GGUF file (metadata + float32 tensors), so that later runs skip parsing and
dequantising (about 6 s on two cores for SmolLM2; reading the cache takes a fraction of that).

One file per model under the cache folder (by default ``build/cache/llm/`` in the repository), named after the
GGUF file and keyed by its size and modification time (nanoseconds) and this module's format version. Layout::

    b"ESSGGUFC" | u64 header length | header (UTF-8 JSON) | payload (tensors, 64-byte aligned) | SHA-256 (32 bytes)

The header holds the key, the metadata and each tensor's name, shape, GGML type, offset and size; the trailing
digest covers header and payload. It is written through :func:`ess.atomic.atomic_path` (a temporary file in the same
folder, swapped in by a rename), so a reader sees the old file, the new file, or none — never half of one. A file that fails any
check (magic, key, sizes, digest) is not trusted: it is rebuilt from the GGUF file.
"""
from __future__ import annotations

import hashlib
import json
import struct
import warnings
from pathlib import Path

import numpy as np

from .. import validate
from ..atomic import atomic_path
from .gguf_file import GGUFContents, read_gguf

__all__ = ["CACHE_DIR", "FORMAT_VERSION", "check_cache_dir", "cache_path", "load_cached", "write_cache",
           "read_cache", "CacheMiss"]

CACHE_DIR = Path(__file__).resolve().parents[2] / "build" / "cache" / "llm"
FORMAT_VERSION = 1
MAGIC = b"ESSGGUFC"
_ALIGN = 64
_DIGEST = 32


class CacheMiss(Exception):
    """The cache file is absent, stale (another source file or format) or fails a check; the reason is the
    message."""


def _key(source: Path) -> dict:
    st = source.stat()
    return {"format": FORMAT_VERSION, "source_name": source.name, "source_bytes": st.st_size,
            "source_mtime_ns": st.st_mtime_ns}


def check_cache_dir(cache_dir) -> Path | None:
    """``cache_dir`` as a :class:`~pathlib.Path` (``None`` stays ``None``: no cache): a ``str`` or ``os.PathLike``,
    not empty (``""`` would put the cache file, hundreds of MB, in the current folder), not an existing file."""
    if cache_dir is None:
        return None
    folder = validate.path("cache_dir", cache_dir)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"cache_dir must be a folder, got the file {folder}")
    return folder


def cache_path(source: str | Path, cache_dir: str | Path = CACHE_DIR) -> Path:
    """Where the cache of ``source`` lives: ``<cache_dir>/<source stem>.esscache``."""
    return Path(cache_dir) / f"{Path(source).stem}.esscache"


def write_cache(contents: GGUFContents, source: str | Path, path: str | Path) -> Path:
    """Write ``contents`` (decoded from ``source``) to ``path`` atomically (:func:`ess.atomic.atomic_path`)."""
    path = Path(path)
    entries, offset = [], 0
    for name, arr in contents.tensors.items():
        offset = -(-offset // _ALIGN) * _ALIGN
        entries.append({"name": name, "shape": list(arr.shape), "type": contents.tensor_types.get(name, "?"),
                        "offset": offset, "nbytes": int(arr.nbytes)})
        offset += arr.nbytes
    header = json.dumps({"key": _key(Path(source)), "metadata": dict(contents.metadata), "tensors": entries,
                         "payload_bytes": offset}).encode()
    header += b" " * (-(len(MAGIC) + 8 + len(header)) % _ALIGN)      # the payload starts 64-byte aligned
    digest = hashlib.sha256(header)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(MAGIC + struct.pack("<Q", len(header)) + header)
        written = 0
        for e in entries:                                       # stream the tensors: no second copy in memory
            chunks = (bytes(e["offset"] - written), memoryview(contents.tensors[e["name"]]).cast("B"))
            for chunk in chunks:
                digest.update(chunk)
                f.write(chunk)
            written = e["offset"] + e["nbytes"]
        f.write(digest.digest())
    return path


def read_cache(path: str | Path, source: str | Path) -> GGUFContents:
    """Read a cache file written by :func:`write_cache` for ``source``.

    Raises
    ------
    CacheMiss
        Absent, written for another source file or format, truncated, or its digest does not match.
    """
    path = Path(path)
    if not path.is_file():
        raise CacheMiss(f"no cache file at {path}")
    size = path.stat().st_size
    head = len(MAGIC) + 8
    if size < head + _DIGEST:
        raise CacheMiss(f"{path} is too short ({size} bytes)")
    buf = bytearray(size)
    with open(path, "rb") as f:
        if f.readinto(buf) != size:
            raise CacheMiss(f"{path} changed while being read")
    if bytes(buf[: len(MAGIC)]) != MAGIC:
        raise CacheMiss(f"{path} is not an ess model cache (bad magic)")
    (n_header,) = struct.unpack("<Q", buf[len(MAGIC): head])
    if head + n_header + _DIGEST > size:
        raise CacheMiss(f"{path} is truncated (header of {n_header} bytes)")
    body = memoryview(buf)[head: size - _DIGEST]
    if hashlib.sha256(body).digest() != bytes(buf[size - _DIGEST:]):
        raise CacheMiss(f"{path} is corrupt (SHA-256 mismatch)")
    try:
        header = json.loads(bytes(body[:n_header]).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:                  # pragma: no cover - digest guards it
        raise CacheMiss(f"{path} has an unreadable header: {e}") from e
    if header.get("key") != _key(Path(source)):
        raise CacheMiss(f"{path} was written for another file or format ({header.get('key')})")
    payload = np.frombuffer(buf, dtype=np.uint8, count=header["payload_bytes"], offset=head + n_header)
    tensors, types = {}, {}
    for e in header["tensors"]:
        raw = payload[e["offset"]: e["offset"] + e["nbytes"]]
        tensors[e["name"]] = raw.view(np.float32).reshape(e["shape"])
        types[e["name"]] = e["type"]
    return GGUFContents(metadata=header["metadata"], tensors=tensors, tensor_types=types)


def load_cached(source: str | Path, cache_dir: str | Path | None = CACHE_DIR, on_build=None):
    """The decoded contents of GGUF file ``source``, from the cache when it is valid, else read and cached.

    Parameters
    ----------
    source : path of the GGUF file
    cache_dir : folder of the cache, or None to read the GGUF file without caching (an empty string, another type
        or an existing file is refused: :func:`check_cache_dir`)
    on_build : callable, optional
        Called with ``source`` before the GGUF file is read (e.g. to verify it against its wheel's record).

    Returns
    -------
    contents : GGUFContents
    status : str
        ``"hit"``, ``"built (<why the cache was not used>)"`` or ``"disabled"``.
    """
    source = Path(source)
    cache_dir = check_cache_dir(cache_dir)
    if cache_dir is None:
        if on_build:
            on_build(source)
        return read_gguf(source), "disabled"
    path = cache_path(source, cache_dir)
    try:
        return read_cache(path, source), "hit"
    except CacheMiss as miss:
        reason = str(miss)
    if on_build:
        on_build(source)
    contents = read_gguf(source)
    try:
        write_cache(contents, source, path)
    except OSError as exc:                   # a read-only or full folder: the cache only saves time, the model is read
        warnings.warn(f"the decoded model could not be cached in {path.parent} ({type(exc).__name__}: {exc}); "
                      f"it is read from {source.name} again next time", RuntimeWarning, stacklevel=2)
        return contents, f"built ({reason}; not cached: {type(exc).__name__})"
    return contents, f"built ({reason})"
