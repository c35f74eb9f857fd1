"""The hostile-user probe harness: each probe does what a careless or hostile user would (a planted link, a forked
child, a read-only folder, a 2-MB full disk, an absurd size, two threads, a wrong type) and is put in one class:

* ``clear error``: a ``TypeError`` / ``ValueError`` (or one of ess's own errors) whose message names the argument,
  file or option the user gave (the probe says which words count);
* ``sensible``: the call went through and the probe checked that what it did is right;
* ``silent``: the call went through with a wrong or unchecked answer (the probe says so by returning ``"silent"``);
* ``raw``: an error of the library underneath (``IndexError``, ``KeyError``, ``AttributeError``, a bare ``OSError``,
  ``MemoryError`` ...), or a clear-looking error that names nothing the user gave;
* ``data loss``: bytes the user stored are gone or changed (the probe returns ``"data loss"``).

A probe file (``tests/test_probe_<area>.py``) lists ``Probe`` objects in ``PROBES`` and runs them with
:func:`run_probes`; the suite asserts every probe is ``clear error`` or ``sensible``. ``tools/probes.py`` counts the
classes per area (for the README's reliability section). Probes use a fixed seed and ``tmp_path``-style folders.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

CLASSES = ("clear error", "sensible", "silent", "raw", "data loss")
GOOD = ("clear error", "sensible")


class ProbeError(Exception):
    """Raised inside a probe when the answer it checks is wrong (classified ``silent``)."""


class DataLoss(Exception):
    """Raised inside a probe when bytes the user stored are gone or changed (see :func:`guard`)."""


def guard(fn: Callable) -> Callable:
    """A probe body whose data-loss finding (:class:`DataLoss`) is returned as ``"data loss"``, whether the call it
    made went through or was refused."""
    def probe(tmp):
        try:
            return fn(tmp)
        except DataLoss:
            return "data loss"
    probe.__name__ = fn.__name__
    return probe


@dataclasses.dataclass(frozen=True)
class Probe:
    """One probe: ``fn(tmp)`` gets a fresh folder; it returns ``None`` / ``"sensible"`` after checking the result,
    ``"silent"`` or ``"data loss"`` when it found one, or raises. ``names``: words one of which a clear error's message
    must contain (the argument, flag or file the user gave); empty: any ``TypeError``/``ValueError`` counts."""
    area: str
    name: str
    fn: Callable
    names: tuple[str, ...] = ()
    # exception types (besides TypeError / ValueError) that count as clear when their message names the argument
    clear_types: tuple[type, ...] = ()


def classify(probe: Probe, tmp) -> tuple[str, str]:
    """(class, detail) of one probe run in folder ``tmp``."""
    try:
        out = probe.fn(tmp)
    except ProbeError as e:
        return "silent", str(e)
    except (TypeError, ValueError, *probe.clear_types) as e:
        msg = str(e)
        if probe.names and not any(n.lower() in msg.lower() for n in probe.names):
            return "raw", f"{type(e).__name__}: {msg} (names none of {probe.names})"
        if type(e).__module__.startswith(("numpy", "torch", "pandas", "json", "yaml")):
            return "raw", f"{type(e).__module__}.{type(e).__name__}: {msg}"
        return "clear error", f"{type(e).__name__}: {msg}"
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 -- a probe classifies whatever escapes (SystemExit included)
        return "raw", f"{type(e).__name__}: {e}"
    if out in (None, "sensible"):
        return "sensible", ""
    if out in CLASSES:
        return out, ""
    raise AssertionError(f"probe {probe.name} returned {out!r}, not one of {CLASSES}")


def run_probes(probes: Iterable[Probe], tmp_factory) -> list[dict]:
    """Run each probe in its own folder from ``tmp_factory(name)``; one row per probe."""
    rows = []
    for p in probes:
        cls, detail = classify(p, tmp_factory(p.name))
        rows.append({"area": p.area, "probe": p.name, "class": cls, "detail": detail})
    return rows


def bad_rows(rows: list[dict]) -> list[str]:
    """The rows whose class is not clear error or sensible, one line each (for an assertion message)."""
    return [f"{r['area']}/{r['probe']}: {r['class']} -- {r['detail']}" for r in rows if r["class"] not in GOOD]
