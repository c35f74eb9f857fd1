"""The linked-list helpers the cache-simulation and prefetch kernels share, each checked against a Python list of
the same order (least recent first) through a small compiled driver."""
import numpy as np
import pytest
from numba import njit

from ess import lru_list as LL


@njit
def _run(n, ops, dtype_probe):
    """Apply ``ops`` (rows of (code, id)) to an empty list over n ids; return the order, least recent first.
    codes: 0 push_newest, 1 push_oldest, 2 unlink, 3 unlink_if_linked, 4 touch newest, 5 touch oldest."""
    prv, nxt = LL.empty(n, dtype_probe)
    H = n
    for i in range(ops.shape[0]):
        code, x = ops[i, 0], ops[i, 1]
        if code == 0:
            LL.push_newest(prv, nxt, H, x)
        elif code == 1:
            LL.push_oldest(prv, nxt, H, x)
        elif code == 2:
            LL.unlink(prv, nxt, x)
            prv[x] = -1
        elif code == 3:
            LL.unlink_if_linked(prv, nxt, x)
        else:
            ids = np.array([x])
            LL.touch(prv, nxt, ids, 1, code == 4)
    out = np.empty(n, np.int64)
    k = 0
    x = nxt[H]
    while x != H:
        out[k] = x
        k += 1
        x = nxt[x]
    back = 0                                             # the same order read backwards
    x = prv[H]
    while x != H:
        if out[k - 1 - back] != x:
            return out[:0]                               # prv and nxt disagree: an empty answer fails the test
        back += 1
        x = prv[x]
    return out[:k]


def _reference(n, ops):
    order = []
    for code, x in ops:
        if code == 0:
            order.append(x)
        elif code == 1:
            order.insert(0, x)
        elif code in (2, 3):
            if x in order:
                order.remove(x)
        else:
            if x in order:
                order.remove(x)
            order.append(x) if code == 4 else order.insert(0, x)
    return order


def test_a_worked_example():
    # push 0, 1, 2 as the newest; 3 as the oldest: 3 0 1 2; touch 0 (newest): 3 1 2 0; touch 2 (oldest): 2 3 1 0;
    # unlink 3: 2 1 0; unlink_if_linked 3 again does nothing
    ops = np.array([[0, 0], [0, 1], [0, 2], [1, 3], [4, 0], [5, 2], [2, 3], [3, 3]])
    assert _run(5, ops, np.int64).tolist() == [2, 1, 0]


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_random_moves_match_a_python_list(dtype):
    rng = np.random.default_rng(3)
    n = 23
    for _ in range(20):
        inside, ops = set(), []
        for _ in range(200):
            x = int(rng.integers(n))
            code = int(rng.integers(6))
            if code in (0, 1) and x in inside:           # push needs an id outside the list
                code = 4
            if code == 2 and x not in inside:            # unlink needs an id inside it
                code = 3
            ops.append((code, x))
            (inside.discard if code in (2, 3) else inside.add)(x)
        got = _run(n, np.array(ops), dtype)
        assert got.tolist() == _reference(n, ops)


def test_an_empty_list():
    prv, nxt = LL.empty(4, np.int32)
    assert prv.dtype == np.int32 and prv[4] == nxt[4] == 4 and (prv[:4] == -1).all()
