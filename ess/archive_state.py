"""What the archive (:mod:`ess.archive`) saves of a cached request beside its entries, and how a saved request comes
back into a cache: the request's device-pool state (:func:`pool_state`: which token each slot holds, the decode
steps, the eviction policy's state, per layer), and the request registered again with its entries and that state
(:func:`load_request`: the state checked against the cache before anything changes, then the device pool refilled).
The pools, the step and the guard an open archive sets on the cache (:attr:`ess.storage.TieredCache.archive`) are
:mod:`ess.storage`'s; the files are :mod:`ess.disk`'s.

>>> import numpy as np
>>> from ess.storage import TieredCache
>>> a, b = TieredCache("tiny", capacity=4), TieredCache("tiny", capacity=4)
>>> a.add_request("r", np.ones((4, 10, a.entry_bytes), np.uint8))
>>> _ = a.step("r", 0, np.array([3, 7], np.int64))
>>> load_request(b, "r", np.ones((4, 10, b.entry_bytes), np.uint8), pool_state(a, "r"))
{'tokens': 10, 'resident': 2, 'bytes_h2d': 328}
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .kernels.transfer import TransferError
from .metrics import StepMetrics
from .storage import TieredCache

__all__ = ["pool_state", "load_request"]


def _checked(cache) -> TieredCache:
    if not isinstance(cache, TieredCache):
        raise TypeError(f"cache must be an ess.storage.TieredCache, got {type(cache).__name__}")
    return cache


def pool_state(cache, request_id) -> dict:
    """A copy of the device-pool state of a request, arrays by name: ``token_of`` ``(n_layers, capacity)`` the
    token in each slot (-1 free), ``steps`` ``(n_layers,)`` the decode steps, and the eviction policy's state
    per layer as ``policy_<name>``. :func:`load_request` takes it back."""
    return _pools_state(_checked(cache)._check_active(request_id).pools)


def _pools_state(pools: list) -> dict:
    states = [p.slots.policy.state() for p in pools]
    out = {"token_of": np.stack([p.slots.token_of for p in pools]),
           "steps": np.array([p.steps for p in pools], np.int64)}
    for key in states[0]:
        out[f"policy_{key}"] = np.stack([np.asarray(s[key]) for s in states])
    return out


def _check_pool_state(cache, pool_state, n_tokens: int) -> dict:
    """``pool_state`` checked against ``cache`` (capacity, layers, policy) and the request's ``n_tokens``."""
    if not isinstance(pool_state, Mapping):
        raise TypeError(f"pool_state must be a dict of arrays (ess.archive_state.pool_state), got "
                        f"{type(pool_state).__name__}")
    want = _pools_state(cache._new_pools(0, 1))          # the arrays of an empty pool of this cache
    if set(pool_state) != set(want):
        raise ValueError(f"pool_state must hold {sorted(want)} (a {cache.policy_name} pool), got "
                         f"{sorted(map(str, pool_state))}: saved under another policy?")
    out = {}
    for key, ref in want.items():
        try:
            arr = np.asarray(pool_state[key])
        except (TypeError, ValueError):             # ragged nesting
            raise TypeError(f"pool_state[{key!r}] must be an array of {ref.dtype} values") from None
        if arr.shape != ref.shape:
            raise ValueError(f"pool_state[{key!r}] must have shape {ref.shape} ({cache.n_layers} layers x capacity="
                             f"{cache.capacity}), got {arr.shape}: saved by a cache of another capacity?")
        if arr.dtype.kind not in ("iu" if ref.dtype.kind in "iu" else "iuf"):
            raise TypeError(f"pool_state[{key!r}] must hold {ref.dtype} values, got {arr.dtype}")
        if not np.isfinite(arr).all():
            raise ValueError(f"pool_state[{key!r}] must be finite")
        out[key] = arr.astype(ref.dtype)
    tok = out["token_of"]
    for l in range(cache.n_layers):
        held = tok[l][tok[l] >= 0]
        if tok[l].min(initial=-1) < -1 or held.max(initial=-1) >= n_tokens or np.unique(held).size != held.size:
            raise ValueError(f"pool_state['token_of'][{l}] must hold distinct tokens in [0, {n_tokens}) or -1")
    if (out["steps"] < 0).any():
        raise ValueError("pool_state['steps'] must be >= 0")
    return out


def load_request(cache, request_id, latent_entries: np.ndarray, pool_state: dict | None = None) -> dict:
    """Register in ``cache`` (a :class:`~ess.storage.TieredCache`) a request saved before (:mod:`ess.archive`
    restores through it): its entries ``(n_layers, L, entry_bytes)`` and its device-pool state as :func:`pool_state`
    gave it (``None``: the pools start empty). The entries resident in that state are copied host -> device (logged
    as ``"restore"``). Everything is checked before anything changes; a copy that fails leaves the entries in and
    that layer's pool empty, and raises :class:`~ess.kernels.transfer.TransferError`. Unlike
    :meth:`~ess.storage.TieredCache.add_request` it does not consult the archive. Returns ``{"tokens", "resident",
    "bytes_h2d"}``."""
    request_id, latent_entries = _checked(cache)._check_new(request_id, latent_entries, None)
    n = latent_entries.shape[1]
    state = None if pool_state is None else _check_pool_state(cache, pool_state, n)
    req = cache._admit(request_id, latent_entries, None)
    moved = 0
    for l, p in enumerate(req.pools):
        if state is None:
            continue
        p.slots.set_token_map(state["token_of"][l])
        p.steps = int(state["steps"][l])
        p.slots.policy.set_state({k[len("policy_"):]: v[l] for k, v in state.items() if k.startswith("policy_")})
        slots = np.flatnonzero(p.slots.token_of >= 0)
        if slots.size:
            try:
                cache._h2d(request_id, l, p.slots.token_of[slots], p.base + slots)
            except Exception as exc:        # this layer's slots may be half written: empty its pool
                p.slots.drop(np.arange(cache.capacity))
                raise TransferError(f"request {request_id!r}: refilling layer {l}'s device pool failed ({exc}); "
                                    f"the host entries are restored, that layer's pool is empty") from exc
            moved += slots.size
            cache.metrics.add(StepMetrics("restore", request_id, l, p.steps, 0, int(slots.size),
                                          int(slots.size) * cache.entry_bytes, 0))
    return {"tokens": int(n), "resident": moved, "bytes_h2d": moved * cache.entry_bytes}
