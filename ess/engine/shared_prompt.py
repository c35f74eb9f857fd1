"""The tiered cache with its prompt rows shared: many decode runs of one prefill keep one copy of the prompt's K/V
entries in host memory, not one each (prefix sharing, as a serving system shares a common prompt's pages).

A :class:`ess.storage.TieredCache` copies each request's prefill entries into its host pool, so every decode run of
one prefill holds its own copy of the same bytes: notebook 09's overlap check decodes 61 configurations of four
prefills at once (interleaved step by step), and those copies were 7.3 GB of the 13.5 GB the check held once
its runs had started (full size, measured with ``psutil`` between its stages). Here the host pool keeps a reference
to the prefill's entries (:attr:`ess.engine.Prefilled.entries`, which the engine never writes) and only the decoded
tokens' entries in an array of its own:

* :class:`PromptSharingHostPool` -- per request the prompt rows ``(n_layers, L, entry_bytes)`` (shared, never
  written) and a tail ``(n_layers, room, entry_bytes)`` for the tokens appended after them (doubled when full, as
  :class:`ess.storage.HostPool` does); token ``t`` is prompt row ``t`` below ``L``, tail row ``t - L`` from there;
* :class:`PromptSharingCache` -- a :class:`~ess.storage.TieredCache` on that host pool whose host-to-device copy
  reads each token from where it lies (one row copy per part, :meth:`~ess.storage.TieredCache._copy_rows`, the
  storage's one place where bytes move), and whose device pool is memory that becomes resident only where a slot
  is written (:meth:`PromptSharingCache._alloc_device`). Plans, policies, the pool's layout, metrics: the tiered
  cache's own.

The bytes each step moves and where they land are the same as with a private copy (the lossless tests compare the
engine's logits bit for bit with all-resident decoding). CPU only: on CUDA the host pool must be pinned memory for
the copy stream, so the engine keeps the plain tiered cache there. The cache overrides two of the tiered cache's
private methods (``_h2d``, ``_alloc_device``): ``tests/test_engine_shared_prompt.py`` fails if either is no longer
called (a copy would reach :meth:`PromptSharingHostPool.layer_rows`, which raises; the pool would be resident).
"""
from __future__ import annotations

import mmap

import numpy as np
import torch

from .. import validate
from ..storage import HostPool, TieredCache

__all__ = ["PromptSharingHostPool", "PromptSharingCache"]


class PromptSharingHostPool(HostPool):
    """A host pool whose requests' prompt entries are shared with their owner, not copied (module docstring).

    :meth:`add` keeps a reference to ``entries`` -- the caller promises not to change them while the request is held
    -- with room for ``capacity - L`` more tokens; :meth:`append`, :meth:`n_tokens`, :meth:`remove`,
    :meth:`requests` as in :class:`~ess.storage.HostPool`. :meth:`entries` returns a copy (the rows lie in two
    arrays); :meth:`layer_segments` gives a layer's two parts for a copy. There is no single contiguous array per
    layer: :meth:`layer_rows` raises ``TypeError``. ``allocated_bytes`` counts only what the pool allocated (the
    tails), ``nbytes`` every valid entry."""

    def __init__(self, n_layers: int, entry_bytes: int):
        super().__init__(n_layers, entry_bytes, pinned=False)
        self._prompt: dict = {}       # request_id -> the shared prompt rows (n_layers, L, W), never written here

    def add(self, request_id, entries: np.ndarray, capacity: int | None = None) -> None:
        request_id, entries, n = self._check_new(request_id, entries, capacity)
        tail, t = self._alloc_checked(max((capacity or n) - n, 1), "capacity")
        self._prompt[request_id] = entries
        self._arrays[request_id], self._tensors[request_id], self._n_tokens[request_id] = tail, t, n

    def append(self, request_id, entries: np.ndarray) -> int:
        request_id = self._key(request_id)
        entries = validate.entries("entries", entries, (self.n_layers, self.entry_bytes), ndim=2)
        n = self._n_tokens[request_id]
        i = n - self._prompt[request_id].shape[1]          # the tail's row of this token
        self._room(request_id, i)[:, i] = entries
        self._n_tokens[request_id] = n + 1
        return n

    def remove(self, request_id) -> None:
        request_id = self._key(request_id)
        super().remove(request_id)
        self._prompt.pop(request_id, None)

    def entries(self, request_id) -> np.ndarray:
        """The valid entries ``(n_layers, n_tokens, entry_bytes)``, a copy (prompt rows, then the tail's)."""
        request_id = self._key(request_id)
        prompt = self._prompt[request_id]
        return np.concatenate([prompt, self._arrays[request_id][:, :self._n_tokens[request_id] - prompt.shape[1]]],
                              axis=1)

    def layer_segments(self, request_id, layer: int) -> tuple[np.ndarray, np.ndarray, int]:
        """``(prompt, tail, L)`` of one layer: the prompt rows ``(L, entry_bytes)`` (tokens ``0 .. L-1``) and the
        tail's rows (token ``L + i`` is row ``i``), both contiguous: the sources of a copy."""
        request_id = self._key(request_id)
        layer = validate.integer("layer", layer, lo=0, below=self.n_layers)
        prompt = self._prompt[request_id]
        return prompt[layer], self._arrays[request_id][layer], prompt.shape[1]

    def layer_rows(self, request_id, layer: int, *, as_torch: bool = False):
        raise TypeError("a PromptSharingHostPool keeps a layer's rows in two arrays: use layer_segments")


class PromptSharingCache(TieredCache):
    """A :class:`~ess.storage.TieredCache` whose host pool shares the requests' prompt entries
    (:class:`PromptSharingHostPool`): ``add_request``'s ``latent_entries`` must stay unchanged while the request is
    held. The same arguments as the tiered cache; the device must be the CPU (see the module docstring)."""

    def __init__(self, model, *, capacity: int, **kwargs):
        super().__init__(model, capacity=capacity, **kwargs)
        if self.on_cuda:
            raise ValueError(f"PromptSharingCache keeps the prompt entries where their owner has them, not in pinned "
                             f"memory: use a TieredCache on {self.device}")
        self.host = PromptSharingHostPool(self.n_layers, self.entry_bytes)

    def _alloc_device(self, n_blocks: int):
        """The device pool (on the CPU) in anonymous memory mapped from the operating system, zero until written: a
        page is resident once a slot on it is first written, not before. A pool fills its free slots lowest first
        (:class:`ess.policies.SlotPool`), so the slots a run never uses cost no memory (``torch.zeros`` writes every
        page): in notebook 09's check 2.0 GB of its 61 pools' 2.9 GB were resident after the last step (full size,
        measured in ``/proc/self/smaps``; a held-out pool at L 896, B 3 had a third of its slots never used)."""
        if self.device != "cpu":
            return super()._alloc_device(n_blocks)
        nbytes = n_blocks * self._block_slots * self.entry_bytes
        try:
            buf = mmap.mmap(-1, nbytes)
        except (OSError, OverflowError, ValueError) as exc:           # too large to map
            raise ValueError(f"a device pool of {n_blocks} request(s) x {self.n_layers} layers x capacity="
                             f"{self.capacity} slots x {self.entry_bytes} B = {nbytes:,} B cannot be allocated "
                             f"({type(exc).__name__}); use a smaller capacity or budget") from None
        # the tensor keeps the array alive, the array the mapping: unmapped when the pool is dropped
        return torch.from_numpy(np.frombuffer(buf, np.uint8).reshape(-1, self.entry_bytes))

    def _h2d(self, request_id, layer: int, tokens: np.ndarray, slots: np.ndarray) -> None:
        prompt, tail, L = self.host.layer_segments(request_id, layer)
        old = tokens < L
        if old.all():
            self._copy_rows(prompt, tokens, self._device, slots)
        elif not old.any():
            self._copy_rows(tail, tokens - L, self._device, slots)
        else:
            self._copy_rows(prompt, tokens[old], self._device, slots[old])
            self._copy_rows(tail, tokens[~old] - L, self._device, slots[~old])
