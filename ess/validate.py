"""Argument checks, one contract for the whole library: a ``TypeError`` when an argument has the wrong type, a
``ValueError`` when it has the wrong value, and the message names the argument and says what was expected. Each
check returns the value in its normal form (a Python ``int`` or ``float``, a contiguous array), so that callers use
what was checked.

* :func:`integer` (and :func:`positive_int`, :func:`non_negative_int`): ``int`` and NumPy integers; ``bool`` and
  floats are refused, even when whole;
* :func:`real` (and :func:`ratio`, :func:`fraction`): finite ``int``/``float``/NumPy numbers in a range;
* :func:`span`: a range ``(low, high)`` of finite numbers, increasing, above a floor (e.g. link speeds to search);
* :func:`sequence`: a list of items (a tuple, list or other iterable; not a bare ``str``, which iterates letters);
* :func:`one_of`: a value from a fixed set;
* :func:`int_array`: a NumPy integer array of a given rank with values in a range;
* :func:`number_array`: numbers or arrays of numbers (vectorised arguments), finite, optionally > 0 and whole;
* :func:`float_array`: a finite float array of a given rank (NumPy, or a torch tensor), as contiguous float32;
* :func:`entries`: raw cache entries, ``uint8`` arrays of a given trailing shape;
* :func:`boolean`: ``True`` or ``False`` (not ``0``/``1``, not a string);
* :func:`boolean_array`: ``True``, ``False`` or a NumPy ``bool`` array (a vectorised option, one per configuration);
* :func:`request_id`: a request's id, an ``int`` or a ``str`` (ids that compare equal across types, such as ``1``,
  ``1.0`` and ``True``, would name one request);
* :func:`frame`: a pandas DataFrame with the columns a figure or table reads;
* :func:`path`: a file or folder path (``str`` or ``os.PathLike``, not bytes, not empty, no NUL byte);
* :func:`fits_in_memory`: an array that an argument sizes, at most a quarter of this machine's memory.

This module imports nothing from ``ess``: every layer may use it.
"""
from __future__ import annotations

import math
import numbers
import operator
import os
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterable

import numpy as np

__all__ = ["integer", "positive_int", "non_negative_int", "real", "ratio", "fraction", "span", "sequence", "boolean",
           "boolean_array", "one_of",
           "int_array", "number_array", "float_array", "entries", "request_id", "frame", "path", "fits_in_memory"]


def _what(value: Any) -> str:
    return f"{type(value).__name__} {value!r}" if not isinstance(value, np.ndarray) else f"array {value.shape}"


def integer(name: str, value: Any, *, lo: int | None = None, below: int | None = None) -> int:
    """``value`` as an ``int``: an ``int`` or NumPy integer (not ``bool``, not a float), ``>= lo`` and ``< below``
    when given."""
    try:
        if isinstance(value, (bool, np.bool_)):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {_what(value)}") from None
    if below is not None and not (lo if lo is not None else value) <= value < below:
        raise ValueError(f"{name} must be in [{lo}, {below}), got {value}" if lo is not None else
                         f"{name} must be < {below}, got {value}")
    if lo is not None and value < lo:
        what = {0: "a non-negative integer", 1: "a positive integer"}.get(lo, f">= {lo}")
        raise ValueError(f"{name} must be {what}, got {value}")
    return value


def positive_int(name: str, value: Any) -> int:
    """An integer > 0 (see :func:`integer`)."""
    return integer(name, value, lo=1)


def non_negative_int(name: str, value: Any) -> int:
    """An integer >= 0 (see :func:`integer`)."""
    return integer(name, value, lo=0)


def real(name: str, value: Any, *, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
         hi_open: bool = False) -> float:
    """``value`` as a finite ``float`` in the interval from ``lo`` to ``hi`` (closed unless ``lo_open`` /
    ``hi_open``; ``None``: unbounded on that side). ``bool`` and strings are refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise TypeError(f"{name} must be a number, got {_what(value)}")
    try:
        value = float(value)
    except OverflowError:                                # an int beyond the float range
        raise ValueError(f"{name} must be finite, got an integer of {len(str(abs(value)))} digits") from None
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    low_ok = lo is None or (value > lo if lo_open else value >= lo)
    high_ok = hi is None or (value < hi if hi_open else value <= hi)
    if not (low_ok and high_ok):
        if lo is not None and hi is not None:
            want = f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        elif lo is not None:
            want = f"{'>' if lo_open else '>='} {lo:g}"
        else:
            want = f"{'<' if hi_open else '<='} {hi:g}"
        raise ValueError(f"{name} must be {want}, got {value:g}")
    return value


def ratio(name: str, value: Any) -> float:
    """A sparse-memory ratio (GPU-resident share of the latent cache): a number in (0, 1]."""
    return real(name, value, lo=0.0, hi=1.0, lo_open=True)


def fraction(name: str, value: Any) -> float:
    """A share or probability: a number in [0, 1]."""
    return real(name, value, lo=0.0, hi=1.0)


def span(name: str, value: Any, *, lo: float = 0.0) -> tuple[float, float]:
    """A range ``(low, high)``: a pair of finite numbers with ``lo < low < high`` (a reversed, empty or open-ended
    range is a ``ValueError``, anything but a pair of numbers a ``TypeError``), returned as two floats."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2:
        raise TypeError(f"{name} must be a pair (low, high) of numbers, got {_what(value)}")
    low = real(f"{name}[0]", value[0], lo=lo, lo_open=True)
    high = real(f"{name}[1]", value[1], lo=lo, lo_open=True)
    if not low < high:
        raise ValueError(f"{name} must be a range (low, high) with low < high, got ({low:g}, {high:g})")
    return low, high


def sequence(name: str, value: Any) -> list:
    """``value``'s items as a list: a list, tuple, array or other finite iterable; a bare ``str`` or ``bytes`` (which
    would iterate its letters), a mapping or a number is a ``TypeError``."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{name} must be a list, got {_what(value)}")
    return list(value)


def boolean(name: str, value: Any) -> bool:
    """``value`` when it is ``True`` or ``False`` (a Python or NumPy bool); a string such as ``"no"``, a number or
    ``None`` is a ``TypeError`` (``bool("no")`` is ``True``)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {_what(value)}")
    return bool(value)


def boolean_array(name: str, value: Any) -> bool | np.ndarray:
    """``value`` when it is ``True``, ``False`` (returned as a Python ``bool``) or a NumPy ``bool`` array (a
    vectorised option, e.g. one per configuration); a string, a number or an array of numbers is a ``TypeError``
    (``np.asarray("no", dtype=float)`` fails without naming the argument, ``1`` would read as True)."""
    if isinstance(value, np.ndarray):
        if value.dtype != np.bool_:
            raise TypeError(f"{name} must be True, False or a bool array, got an array of dtype {value.dtype}")
        return value
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True, False or a bool array, got {_what(value)}")
    return bool(value)


def one_of(name: str, value: Any, choices: Iterable) -> Any:
    """``value`` when it is one of ``choices`` (compared with ``==``); a ``ValueError`` listing them otherwise."""
    choices = tuple(choices)
    try:
        ok = not isinstance(value, np.ndarray) and value in choices     # an array compares element by element
    except (TypeError, ValueError):                      # unhashable or uncomparable
        ok = False
    if not ok:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def int_array(name: str, value: Any, *, ndim: int | None = None, lo: int | None = None,
              below: int | None = None, shape_doc: str = "") -> np.ndarray:
    """A NumPy integer array (not ``bool``) of rank ``ndim`` whose values lie in ``[lo, below)``, returned as a
    contiguous ``int64`` copy or view. ``shape_doc`` (e.g. ``"(K,)"``) is quoted in the messages."""
    doc = f" {shape_doc}" if shape_doc else ""
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{name} must be a NumPy integer array{doc}, got {type(value).__name__}")
    if value.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers (int64){doc}, got dtype {value.dtype}")
    if ndim is not None and value.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D{doc}, got shape {value.shape}")
    if value.dtype.kind == "u" and value.size and int(value.max()) >= 2 ** 63:    # would wrap to a negative int64
        raise ValueError(f"{name} holds {int(value.max())}, beyond the int64 range")
    arr = np.ascontiguousarray(value, dtype=np.int64)
    if arr.size:
        low, high = int(arr.min()), int(arr.max())
        if (lo is not None and low < lo) or (below is not None and high >= below):
            bad = low if lo is not None and low < lo else high
            raise ValueError(f"{name} holds {bad}, outside [{'-inf' if lo is None else lo}, "
                             f"{'inf' if below is None else below})")
    return arr


def number_array(name: str, value: Any, *, positive: bool = True, whole: bool = False,
                 allow_inf: bool = False, at_least: float | None = None, at_most: float | None = None,
                 max_ndim: int | None = 1) -> np.ndarray:
    """A number or an array of numbers (a vectorised argument; at most ``max_ndim`` dimensions, ``None``: any) as a
    float64 array: not NaN, finite unless ``allow_inf`` (e.g. an infinitely fast link), ``> 0`` when ``positive``,
    ``>= at_least`` and ``<= at_most`` when given, whole numbers when ``whole``. Booleans and strings (or arrays of them) are a
    ``TypeError``."""
    try:
        if isinstance(value, (str, bytes, bool, np.bool_)):
            raise TypeError
        raw = np.asarray(value)
        if raw.dtype.kind == "O":                        # Python ints beyond int64, or ragged / other objects
            if not (raw.size and all(isinstance(x, int) and not isinstance(x, bool) for x in raw.ravel())):
                raise TypeError
        elif raw.dtype.kind not in "iuf":                # bool, str arrays
            raise TypeError
        arr = raw.astype(float)                          # OverflowError for an int past the float range
    except OverflowError:
        raise ValueError(f"{name} must be finite, got an integer beyond the float range") from None
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number or an array of numbers, got {_what(value)}") from None
    if max_ndim is not None and arr.ndim > max_ndim:
        raise ValueError(f"{name} must be a scalar or a {max_ndim}-D array, got shape {arr.shape}")
    bad = np.isnan(arr) | (False if allow_inf else np.isinf(arr)) | ((arr <= 0) if positive else False)
    if bad.any():
        raise ValueError(f"{name} must be {'a number' if allow_inf else 'finite'}{' and > 0' if positive else ''}, "
                         f"got {_first(value, arr, bad)}")
    if at_least is not None and (arr < at_least).any():
        raise ValueError(f"{name} must be >= {at_least:g}, got {_first(value, arr, arr < at_least)}")
    if at_most is not None and (arr > at_most).any():
        raise ValueError(f"{name} must be <= {at_most:,.16g}, got {_first(value, arr, arr > at_most)}")
    if whole and (arr != np.round(arr)).any():
        raise ValueError(f"{name} must hold whole numbers, got {_first(value, arr, arr != np.round(arr))}")
    return arr


def _first(value: Any, arr: np.ndarray, bad: np.ndarray) -> str:
    """The offending value: the argument itself when it is small, else the first bad element and where it is."""
    if arr.size <= 8:
        return repr(value)
    where = tuple(int(i[0]) for i in np.nonzero(bad))
    return f"{arr[where]:g} at index {where if len(where) > 1 else where[0]} of an array of shape {arr.shape}"


_F32_MAX = float(np.finfo(np.float32).max)
#: the largest count a float64 holds exactly (2**53): a bound for counts (requests, tokens) computed in float64
MAX_EXACT_COUNT = 2 ** 53


def float_array(name: str, value: Any, ndim: int, shape_doc: str) -> np.ndarray:
    """A finite array of numbers (float or integer dtype, not bool; a torch tensor is brought to the host) of rank
    ``ndim`` within the float32 range, returned as contiguous float32. ``shape_doc`` (e.g. ``"(B, H, D)"``) is quoted in the messages."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    arr = np.asarray(value)
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(f"{name} must be a float array {shape_doc}, got dtype {arr.dtype}")
    if arr.ndim != ndim:
        raise ValueError(f"{name} must have shape {shape_doc}, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must hold finite values only (found NaN or inf)")
    if arr.size and arr.dtype.itemsize > 4 and np.abs(arr).max() > _F32_MAX:   # would become inf in float32
        raise ValueError(f"{name} holds {float(np.abs(arr).max()):g}, beyond the float32 range (+-{_F32_MAX:.4g})")
    return np.ascontiguousarray(arr, dtype=np.float32)


def entries(name: str, value: Any, tail: tuple[int, ...], *, ndim: int | tuple[int, ...] | None = None,
            shape_doc: str = "") -> np.ndarray:
    """Raw cache entries: a ``uint8`` array (NumPy, or anything ``np.asarray`` turns into one) whose trailing
    dimensions are ``tail`` (e.g. ``(entry_bytes,)``; ``None`` in it matches any size, e.g. ``(n_layers, None,
    entry_bytes)``) and whose rank is ``ndim`` (an int or allowed ints; default: any rank >= ``len(tail)``).
    Returned C-contiguous. ``shape_doc`` (e.g. ``"(n_layers, L, 656)"``) is quoted in the messages."""
    doc = shape_doc or "(..., " + ", ".join("n" if t is None else str(t) for t in tail) + ")"
    try:
        arr = value if isinstance(value, np.ndarray) else np.asarray(value)
    except (TypeError, ValueError):                      # ragged nesting, objects NumPy cannot hold
        raise TypeError(f"{name} must be uint8 cache entries {doc}, got {type(value).__name__}") from None
    if arr.dtype != np.uint8:
        raise TypeError(f"{name} must be uint8 cache entries {doc}, got dtype {arr.dtype}")
    ranks = (ndim,) if isinstance(ndim, int) else ndim
    rank_ok = arr.ndim >= len(tail) if ranks is None else arr.ndim in ranks
    got = tuple(arr.shape[arr.ndim - len(tail):]) if rank_ok else ()
    if not rank_ok or any(want is not None and have != want for have, want in zip(got, tail)):
        raise ValueError(f"{name} must have shape {doc}, got {arr.shape}")
    return np.ascontiguousarray(arr)


def request_id(name: str, value: Any) -> int | str:
    """A request's id: an ``int`` (or NumPy integer, returned as ``int``; not ``bool``) or a ``str``. Other types are a
    ``TypeError``: a float or a bool would silently name the request of the int it equals (``1.0 == True == 1``), and
    a tuple or ``None`` names no file of the disk tier."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    raise TypeError(f"{name} must be an int or a str, got {_what(value)}")


def frame(name: str, value: Any, columns: Iterable[str]) -> Any:
    """``value`` when it is a pandas DataFrame holding ``columns`` (a ``TypeError`` for another type, a
    ``ValueError`` naming the missing columns)."""
    import pandas as pd
    if not isinstance(value, pd.DataFrame):
        raise TypeError(f"{name} must be a pandas DataFrame, got {type(value).__name__}")
    missing = [c for c in columns if c not in value.columns]
    if missing:
        raise ValueError(f"{name} lacks the columns {missing} (it has {list(value.columns)})")
    return value


def path(name: str, value: Any) -> Path:
    """``value`` as a :class:`~pathlib.Path`: a ``str`` or ``os.PathLike`` (not ``bytes``), not empty, without a
    NUL byte (which no file system accepts)."""
    if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or os.PathLike), got {_what(value)}")
    text = os.fspath(value)
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a path (str or os.PathLike), got {_what(value)}")
    if not text:
        raise ValueError(f"{name} must not be empty")
    if "\0" in text:
        raise ValueError(f"{name} must not hold a NUL byte, got {text!r}")
    return Path(text)


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):        # not a POSIX system: no check
        return None


def fits_in_memory(name: str, nbytes: int | float, what: str = "") -> int:
    """``nbytes`` (an array's size that the argument ``name`` sets) as an ``int`` when it takes at most a quarter of
    this machine's physical memory (the computation around one such array needs the rest); a ``ValueError`` naming
    ``name`` otherwise, before anything is allocated (an allocation past the memory is a ``MemoryError`` at best,
    the process killed by the system at worst). ``what`` says what the array is. ``nbytes`` may pass the float
    range (a product of large arguments): the message is written in exact arithmetic."""
    total = _physical_memory()
    if total is not None and nbytes > total / 4:
        raise ValueError(f"{name} is too large: {what or 'an array'} would take {Decimal(nbytes) / 10 ** 9:,.3g} GB, more than a "
                         f"quarter of this machine's {total / 1e9:,.0f} GB of memory")
    return int(nbytes)
