"""The disk tier of the latent cache: a cold archive of requests, one memory-mapped block file per request.

Per request ``<stem>.blocks`` holds blocks of ``block_tokens`` tokens x all layers (zero-padded), each with a CRC-32
in the manifest ``<stem>.json``, which is written last (the commit point) together with the CRC of the device-pool
state ``<stem>.pool.npz``. :class:`ess.storage.TieredCache` spills requests here, restores them and recovers after
a crash; this module knows files, blocks and checksums, nothing about pools.
"""
from __future__ import annotations

import json
import os
import re
import zlib
from pathlib import Path

import numpy as np

from .validate import positive_int

__all__ = ["DiskTier", "CorruptBlockError", "request_stem"]


class CorruptBlockError(RuntimeError):
    """Disk blocks whose checksum does not match and that could not be restored from a host copy."""

    def __init__(self, request_id, blocks: list[int], path: str):
        self.request_id, self.blocks, self.path = request_id, list(blocks), path
        super().__init__(f"request {request_id!r}: disk block(s) {self.blocks} in {path} fail their CRC-32 check "
                         f"and no host copy is left to restore them from")


_SAFE = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")


def request_stem(request_id) -> str:
    """The file stem of a request's archive (``req-i<int>`` or ``req-s<str>``); a ``ValueError`` for an id that
    cannot name a file."""
    if isinstance(request_id, (int, np.integer)) and not isinstance(request_id, bool):
        return f"req-i{int(request_id)}"
    if isinstance(request_id, str) and _SAFE.match(request_id):
        return f"req-s{request_id}"
    raise ValueError(f"request_id {request_id!r} cannot name a disk file: use an int or a string of letters, "
                     f"digits, '_', '.', '-'")


class DiskTier:
    """A cold archive of requests in ``directory``: per request ``<stem>.blocks`` (memory-mapped blocks of
    ``block_tokens`` tokens x all layers, zero-padded), ``<stem>.pool.npz`` (device-pool state) and
    ``<stem>.json`` (manifest: sizes, one CRC-32 per block, CRC of the pool file), written last and atomically."""

    def __init__(self, directory, n_layers: int, entry_bytes: int, block_tokens: int = 64):
        block_tokens = positive_int("block_tokens", block_tokens)
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.n_layers, self.entry_bytes, self.block_tokens = int(n_layers), int(entry_bytes), block_tokens

    @property
    def block_bytes(self) -> int:
        return self.n_layers * self.block_tokens * self.entry_bytes

    def _paths(self, request_id):
        stem = request_stem(request_id)
        return self.dir / f"{stem}.blocks", self.dir / f"{stem}.pool.npz", self.dir / f"{stem}.json"

    def block_path(self, request_id) -> Path:
        """The file holding a request's memory-mapped blocks (block ``b`` at byte ``b * block_bytes``; each block
        is ``(n_layers, block_tokens, entry_bytes)`` uint8). Raises ``ValueError`` for an id that cannot name a
        file; the file exists once the request was written."""
        return self._paths(request_id)[0]

    def has(self, request_id) -> bool:
        return self._paths(request_id)[2].exists()

    def manifest(self, request_id) -> dict:
        return json.loads(self._paths(request_id)[2].read_text(encoding="utf-8"))

    def list_requests(self) -> list:
        out = []
        for p in sorted(self.dir.glob("req-*.json")):
            m = json.loads(p.read_text(encoding="utf-8"))
            out.append(m["request_id"])
        return out

    def _block_view(self, mm: np.memmap, b: int) -> np.ndarray:
        return mm[b * self.block_bytes:(b + 1) * self.block_bytes].reshape(
            self.n_layers, self.block_tokens, self.entry_bytes)

    def write(self, request_id, entries: np.ndarray, pool_state: dict, *, from_token: int = 0) -> int:
        """Write ``entries`` ``(n_layers, n_tokens, W)``: the blocks from the one holding ``from_token`` on
        (earlier blocks are unchanged on disk and keep their CRC), then the pool state, then the manifest.
        Returns the number of blocks written."""
        blocks_path, pool_path, man_path = self._paths(request_id)
        n_tokens = entries.shape[1]
        n_blocks = -(-n_tokens // self.block_tokens)
        old = self.manifest(request_id) if man_path.exists() else None
        crcs = list(old["block_crc32"]) if old and old["entry_bytes"] == self.entry_bytes else []
        first = min(from_token // self.block_tokens, len(crcs)) if old else 0
        crcs = crcs[:first]
        with open(blocks_path, "ab"):
            pass
        os.truncate(blocks_path, max(n_blocks, 1) * self.block_bytes)
        mm = np.memmap(blocks_path, dtype=np.uint8, mode="r+", shape=(max(n_blocks, 1) * self.block_bytes,))
        for b in range(first, n_blocks):
            view = self._block_view(mm, b)
            lo, hi = b * self.block_tokens, min((b + 1) * self.block_tokens, n_tokens)
            view[:, :hi - lo] = entries[:, lo:hi]
            view[:, hi - lo:] = 0
            crcs.append(zlib.crc32(view.tobytes()))
        mm.flush()
        del mm
        tmp = pool_path.with_suffix(".tmp.npz")
        np.savez(tmp, **pool_state)
        pool_crc = zlib.crc32(tmp.read_bytes())
        tmp.replace(pool_path)
        manifest = {"request_id": request_id, "n_layers": self.n_layers, "entry_bytes": self.entry_bytes,
                    "block_tokens": self.block_tokens, "n_tokens": int(n_tokens), "block_crc32": crcs,
                    "pool_crc32": pool_crc}
        tmp = man_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(manifest), encoding="utf-8")
        tmp.replace(man_path)
        return n_blocks - first

    def verify(self, request_id) -> list[int]:
        """Blocks whose CRC-32 does not match the manifest (the pool file counts as block ``-1``)."""
        blocks_path, pool_path, _ = self._paths(request_id)
        m = self.manifest(request_id)
        mm = np.memmap(blocks_path, dtype=np.uint8, mode="r")
        bad = []
        for b, crc in enumerate(m["block_crc32"]):
            lo, hi = b * self.block_bytes, (b + 1) * self.block_bytes
            if hi > mm.size or zlib.crc32(mm[lo:hi].tobytes()) != crc:
                bad.append(b)
        del mm
        if not pool_path.exists() or zlib.crc32(pool_path.read_bytes()) != m["pool_crc32"]:
            bad.append(-1)
        return bad

    def read(self, request_id) -> tuple[np.ndarray, dict, list[int]]:
        """``(entries (n_layers, n_tokens, W), pool_state, bad_blocks)``; the rows of bad blocks are as found."""
        blocks_path, pool_path, _ = self._paths(request_id)
        m = self.manifest(request_id)
        if (m["n_layers"], m["entry_bytes"], m["block_tokens"]) != (self.n_layers, self.entry_bytes,
                                                                    self.block_tokens):
            raise ValueError(f"request {request_id!r} on disk has layout {m['n_layers']} layers x "
                             f"{m['entry_bytes']} B x {m['block_tokens']}-token blocks; this tier expects "
                             f"{self.n_layers} x {self.entry_bytes} B x {self.block_tokens}")
        bad = self.verify(request_id)
        n = m["n_tokens"]
        out = np.zeros((self.n_layers, n, self.entry_bytes), np.uint8)
        mm = np.memmap(blocks_path, dtype=np.uint8, mode="r")
        for b in range(len(m["block_crc32"])):
            lo, hi = b * self.block_tokens, min((b + 1) * self.block_tokens, n)
            if (b + 1) * self.block_bytes <= mm.size:
                out[:, lo:hi] = self._block_view(mm, b)[:, :hi - lo]
        del mm
        pool = {}
        if -1 not in bad:
            with np.load(pool_path) as z:
                pool = {k: z[k] for k in z.files}
        return out, pool, bad

    def remove(self, request_id) -> None:
        for p in self._paths(request_id):
            p.unlink(missing_ok=True)
