"""Shared pieces of the property-based fuzz tests (test_*_fuzz.py): a strategy of meaningless values, and the
contract every public call is held to -- it returns, or it raises a ``TypeError``/``ValueError`` whose message
names the argument; any other exception (a raw ``IndexError``, ``KeyError``, NumPy or JSON error) fails the test."""
import math

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

_DTYPES = [np.int64, np.int32, np.int8, np.uint8, np.uint64, np.float64, np.float32, np.bool_, np.complex64]


def _array_elements(dtype):
    d = np.dtype(dtype)
    if d.kind == "f":
        return st.floats(allow_nan=True, allow_infinity=True, width=32)
    if d.kind == "i":
        return st.integers(-3, 100)                       # fits every integer dtype above
    return None                                           # hypothesis' default elements for the dtype


# Values of the wrong type, sign, size and finiteness (small where sizes are meant, so that nothing allocates a lot).
BAD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 400),
    st.sampled_from([-(2 ** 63), 2 ** 63, 2 ** 80, -1, 0]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([np.int64(3), np.float64(np.nan), np.bool_(True), np.float32(0.5), np.uint8(7)]),
    st.text(max_size=5),
    st.sampled_from(["lru", "fifo", "heat", "True", "0", "r", "../x", "a/b", "\x00"]),
    st.binary(max_size=3),
    st.lists(st.integers(-3, 40), max_size=4),
    st.lists(st.floats(allow_nan=True), max_size=3),
    st.tuples(st.integers(-2, 5), st.text(max_size=2)),
    st.dictionaries(st.text(max_size=3), st.integers(-2, 5), max_size=2),
    st.sampled_from(_DTYPES).flatmap(
        lambda dt: arrays(dt, array_shapes(min_dims=0, max_dims=3, max_side=5), elements=_array_elements(dt))),
)


def mutate(data, good: dict, bad=BAD) -> tuple[str, dict]:
    """One argument of ``good`` (drawn) replaced by a drawn meaningless value: ``(its name, the arguments)``.
    ``bad`` is the strategy, or a function of the argument's name giving one."""
    name = data.draw(st.sampled_from(sorted(good)), label="argument")
    strategy = bad(name) if callable(bad) else bad
    return name, {**good, name: data.draw(strategy, label=name)}


def outcome(call, *names):
    """``(True, result)`` when ``call()`` returns, ``(False, exc)`` when it raises a ``TypeError`` or ``ValueError``
    naming one of ``names``; any other exception, or a message naming none of them, fails the test."""
    try:
        return True, call()
    except (TypeError, ValueError) as exc:
        msg = str(exc)
        assert any(n in msg for n in names), f"{type(exc).__name__} names none of {names}: {msg}"
        return False, exc


def finite(x) -> bool:
    """Every number in ``x`` (a number, an array, a dict or a DataFrame of them) is finite."""
    if isinstance(x, dict):
        return all(finite(v) for v in x.values())
    if hasattr(x, "select_dtypes"):
        return bool(np.isfinite(x.select_dtypes("number").to_numpy(dtype=float)).all())
    if isinstance(x, (int, float, np.number)):
        return math.isfinite(float(x))
    return bool(np.isfinite(np.asarray(x, dtype=float)).all())


def same(a, b) -> bool:
    """Deep equality of snapshots (dicts, lists, sets, arrays)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.shape == b.shape and np.array_equal(a, b)
    return a == b


def fuzz_settings(max_examples: int, **kw):
    """Hypothesis settings of a fuzz test: ``max_examples`` cases (times ``ESS_FUZZ_SCALE``, 1 unless set, for a
    longer search by hand), no deadline (a loaded machine), fixtures shared across the cases. Whether the cases are
    fixed or fresh is the loaded profile's (``tests/conftest.py``: fixed unless ``ESS_FUZZ_RANDOM=1``)."""
    import os
    from hypothesis import HealthCheck, settings
    return settings(max_examples=max_examples * int(os.environ.get("ESS_FUZZ_SCALE", "1")), deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large], **kw)


def call_one(data, calls: dict, bad=BAD, aliases: dict | None = None):
    """Draw a function of ``calls`` (``{name: (call, valid keyword arguments)}``, ``call(**args)``), replace one of its
    arguments by a meaningless value (:func:`mutate`) and call it: ``(function name, argument name, arguments, ok,
    result or exception)`` under the contract of :func:`outcome`. ``aliases`` maps an argument to the other names
    a message may call it by."""
    fn = data.draw(st.sampled_from(sorted(calls)), label="function")
    call, good = calls[fn]
    if not good:
        return fn, None, {}, *outcome(lambda: call())
    name, args = mutate(data, good, bad)
    ok, out = outcome(lambda: call(**args), name, *(aliases or {}).get(name, ()))
    return fn, name, args, ok, out
