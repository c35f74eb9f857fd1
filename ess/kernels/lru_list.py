"""A recency order (LRU) kept as a doubly linked list over integer ids, for Numba kernels: the list helpers of the
cache simulation (:mod:`ess.kernels.cachesim`: positions) and of the prefetch pool (:mod:`ess.kernels.prefetch`:
slots), written once and inlined into their kernels (``njit(inline="always")``, the way minitorch writes its index
helpers once).

The list lives in two integer arrays ``prv`` and ``nxt`` of ``n + 1`` entries over the ids ``0 .. n - 1`` and a
sentinel ``H = n``: ``nxt[H]`` is the least recent id, ``prv[H]`` the most recent, an empty list has
``prv[H] = nxt[H] = H`` (:func:`empty`). Moving an id costs O(1). Where a kernel needs to know whether an id is in
the list it marks the ids outside with ``prv[x] = -1`` and uses :func:`unlink_if_linked`.

Numba's cache (``cache=True``) keys a compiled kernel on its own file only: after a change here, clear the
``__pycache__`` entries of ``ess/kernels/cachesim`` and ``ess/kernels/prefetch`` (``*.nbi``, ``*.nbc``) so that
their kernels are rebuilt.
"""
from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["empty", "unlink", "unlink_if_linked", "link_between", "push_newest", "push_oldest", "touch"]


@njit(cache=True, inline="always")
def empty(n, dtype):
    """``(prv, nxt)`` of an empty list over ``n`` ids (the sentinel is ``n``); ids outside it marked -1."""
    prv = np.full(n + 1, -1, dtype)
    nxt = np.full(n + 1, -1, dtype)
    prv[n] = n
    nxt[n] = n
    return prv, nxt


@njit(cache=True, inline="always")
def unlink(prv, nxt, x):
    """Take id ``x`` (in the list) out of it."""
    a = prv[x]
    b = nxt[x]
    nxt[a] = b
    prv[b] = a


@njit(cache=True, inline="always")
def unlink_if_linked(prv, nxt, x):
    """Take id ``x`` out of the list if it is in it, and mark it outside (``prv[x] = -1``)."""
    if prv[x] >= 0:
        unlink(prv, nxt, x)
        prv[x] = -1


@njit(cache=True, inline="always")
def link_between(prv, nxt, a, x, b):
    """Put id ``x`` (not in the list) between the neighbours ``a`` and ``b`` (``nxt[a] == b``)."""
    nxt[a] = x
    prv[x] = a
    nxt[x] = b
    prv[b] = x


@njit(cache=True, inline="always")
def push_newest(prv, nxt, H, x):
    """Put id ``x`` (not in the list) after the most recent: it becomes the most recent."""
    link_between(prv, nxt, prv[H], x, H)


@njit(cache=True, inline="always")
def push_oldest(prv, nxt, H, x):
    """Put id ``x`` (not in the list) before the least recent: it becomes the least recent."""
    link_between(prv, nxt, H, x, nxt[H])


@njit(cache=True, inline="always")
def touch(prv, nxt, ids, n, newest):
    """The first ``n`` of ``ids`` move (from wherever they are, or from outside the list) to the recent end, in
    order, so that the last becomes the most recent (``newest``); or to the old end, the first of them the warmest
    (each put before the least recent, so that the last becomes the least recent)."""
    H = prv.size - 1
    for i in range(n):
        x = ids[i]
        unlink_if_linked(prv, nxt, x)
        if newest:
            push_newest(prv, nxt, H, x)
        else:
            push_oldest(prv, nxt, H, x)
