"""The record format that notebooks write and tests read.

A notebook records every number it produces through a :class:`Recorder`; the reproduction pipeline gives each
notebook a ``results_path`` and the recorder writes ``build/results/<notebook>.json``, a JSON object with a ``run``
header (which notebook, smoke or full, when; the pipeline completes it when the notebook finished), the list of
``records`` and the names of the ``figures`` saved next to it::

    {"format": "ess-results/3",
     "run": {"notebook": "01_memory_wall", "mode": "smoke", "smoke": true, "saved": "2026-...Z",
             "run_id": "...", "started": "...", "finished": "...", "status": "complete",
             "figures_dir": "01_memory_wall.figures-<run id>"},
     "records": [{"name": "batch_limit_32k", "value": 52, "unit": "requests/GPU",
                  "config": {"context_len": 32768, "ratio": 1.0, "deployment": "paper-table1"},
                  "published": 52, "source": "[ARX] memory limit, paper-facts.md", "note": "...",
                  "low": null, "high": null, "status": "calibrated"}],
     "figures": ["memory_wall"]}

**A record's status is a field** (one of :data:`STATUSES`), set when the notebook records it
(:meth:`Recorder.record`): from the *role* of the published value it compares with (``data/published/``:
``calibration`` -> *calibrated*, ``held_back`` -> *held back (predicted)*; a ``target`` needs the notebook to say
*reproduced* or *not reproduced*), or given by the notebook (``status=``). A record with a published value must
say one or the other (a clear error otherwise); a record without one is *computed* unless the notebook says
otherwise (*predicted*, *bound*, ...).

Files of the older formats are still read: ``ess-results/2`` (the same object without ``status``) and the first
format (a bare JSON list of records, with no run header; its run is ``{"format": 1, "mode": "unknown"}``). Their
records' status is inferred from the words of the note (:func:`infer_status`, the rule used before the field
existed), and :attr:`Results.status_inferred` says so.

Inside a Jupyter kernel every record is also *glued* (``myst_nb.glue``, not displayed) under its name, so that the
book's pages quote it as ``{glue:text}`/notebooks/<notebook>.ipynb::<name>:<format>```.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import numbers
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from . import validate
from .atomic import write_json_atomic
from .published import ROLES

__all__ = ["Record", "Recorder", "Results", "load_records", "load_results", "relative_error", "decide_status",
           "infer_status", "utc_now", "RESULTS_FORMAT", "STATUSES", "ROLE_STATUSES"]

RESULTS_FORMAT = "ess-results/3"
_OLDER_FORMATS = ("ess-results/2",)          # and format 1, a bare list of records
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")   # a notebook's or figure's name: one path component
_FIGURE_NAME = _NAME
_MAX_DEPTH = 64                              # nesting of a recorded value (a deeper one is a mistake, or a cycle)

STATUSES = ("calibrated", "not reproduced", "reproduced", "held back (predicted)", "bound", "predicted",
            "compared", "computed")
#: the statuses a record may have when it compares with a published value of each role (``data/published/``);
#: the first is the one given when the notebook says nothing (a target has none: the notebook must say)
ROLE_STATUSES = {"calibration": ("calibrated",), "held_back": ("held back (predicted)",),
                 "target": ("reproduced", "not reproduced")}
_RUN_MODES = ("smoke", "full", "unknown")


def utc_now() -> str:
    """The current time, UTC, ISO 8601 to the second (``2026-01-31T12:00:00Z``)."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _plain(value: Any, what: str, depth: int = 0, *, finite: bool = True) -> Any:
    """``value`` as JSON data: NumPy scalars and arrays, tuples and Paths to plain Python values; numbers finite
    (unless ``finite=False``: a configuration may say NaN for "not applicable", as pandas does); dict keys strings
    (numbers are written as strings, as JSON does; two keys that become one string, ``1`` and ``"1"``, are a
    ``ValueError``). A ``TypeError`` / ``ValueError`` naming ``what`` (and where
    inside it) for anything else."""
    if depth > _MAX_DEPTH:
        raise ValueError(f"{what} is nested deeper than {_MAX_DEPTH} levels (or holds itself)")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):                 # NumPy's float64 is a float: made a plain one too
        value = float(value) if isinstance(value, float) else int(value)
        if finite and isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{what} must be finite, got {value!r}")
        return value
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:         # NumPy (and torch) scalars
        return _plain(value.item(), what, depth + 1, finite=finite)
    if hasattr(value, "tolist") and not isinstance(value, Mapping):          # arrays, Series
        return _plain(value.tolist(), what, depth + 1, finite=finite)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        out, given = {}, {}
        for k, v in value.items():
            if isinstance(k, (bool,)) or not isinstance(k, (str, numbers.Real)):
                raise TypeError(f"{what} must have string keys, got key {k!r}")
            key = k if isinstance(k, str) else str(_plain(k, f"a key of {what}", depth + 1))
            if key in given:                            # 1 and "1": one JSON key, one value would be lost
                raise ValueError(f"{what} has keys {given[key]!r} and {k!r} that collide: both are written as the "
                                 f"JSON key {key!r}")
            given[key] = k
            out[key] = _plain(v, f"{what}[{key!r}]", depth + 1, finite=finite)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{what}[{i}]", depth + 1, finite=finite) for i, v in enumerate(value)]
    raise TypeError(f"{what} must be JSON data (numbers, strings, booleans, None, lists, dicts), got "
                    f"{type(value).__name__}")


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


@dataclass(frozen=True)
class Record:
    """One recorded number: ``value`` in ``unit`` under ``config``; the ``published`` value with its ``source`` where
    one exists; an optional band ``[low, high]`` the value is expected in (either end may be absent); its
    ``status``, one of :data:`STATUSES` (keyword only, required: :meth:`Recorder.record` decides it).

    Values are kept as JSON data: NumPy scalars and arrays become Python numbers and lists; an object JSON cannot
    hold is refused, and so is a number that is not finite in ``value``, ``published``, ``low`` or ``high`` (a
    configuration may hold NaN for "not applicable")."""
    name: str
    value: Any
    unit: str
    config: dict = field(default_factory=dict)
    published: Any = None
    source: str | None = None
    note: str = ""
    low: float | None = None
    high: float | None = None
    status: str = field(kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"Record.name must be a string, got {type(self.name).__name__} {self.name!r}")
        if not self.name:
            raise ValueError("Record.name must be a non-empty string")
        who = f"Record {self.name!r}"
        if not isinstance(self.unit, str):
            raise TypeError(f"{who}: unit must be a string (use '' for a pure number), got {self.unit!r}")
        if not isinstance(self.config, Mapping):
            raise TypeError(f"{who}: config must be a dict, got {type(self.config).__name__}")
        if self.source is not None and not isinstance(self.source, str):
            raise TypeError(f"{who}: source must be a string or None, got {self.source!r}")
        if not isinstance(self.note, str):
            raise TypeError(f"{who}: note must be a string, got {type(self.note).__name__}")
        set_ = object.__setattr__
        set_(self, "value", _plain(self.value, f"{who}: value"))
        set_(self, "config", _plain(dict(self.config), f"{who}: config", finite=False))
        set_(self, "published", _plain(self.published, f"{who}: published"))
        if self.published is not None and not self.source:
            raise ValueError(f"{who}: a published value needs its source")
        for end in ("low", "high"):
            bound = getattr(self, end)
            if bound is None:
                continue
            if hasattr(bound, "item") and getattr(bound, "ndim", None) == 0:
                bound = bound.item()
            if not _is_number(bound):
                raise TypeError(f"{who}: {end} must be a number or None, got {bound!r}")
            if isinstance(bound, float) and not math.isfinite(bound):
                raise ValueError(f"{who}: {end} must be finite, got {bound!r}")
            set_(self, end, bound)
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"{who}: the band is empty (low {self.low} > high {self.high})")
        if not isinstance(self.status, str):
            raise TypeError(f"{who}: status must be one of {STATUSES}, got {self.status!r}")
        if self.status not in STATUSES:
            raise ValueError(f"{who}: status must be one of {STATUSES}, got {self.status!r}")
        if self.status == "compared" and self.published is None:
            raise ValueError(f"{who}: status 'compared' needs a published value to compare with")

    @property
    def error(self) -> float | None:
        """Relative error against the published value, where both are numbers."""
        return relative_error(self.value, self.published)

    @property
    def in_band(self) -> bool | None:
        """Whether a numeric value lies in ``[low, high]``; None without a band or a numeric value."""
        if (self.low is None and self.high is None) or not _is_number(self.value):
            return None
        return (self.low is None or self.value >= self.low) and (self.high is None or self.value <= self.high)


def relative_error(value: Any, published: Any) -> float | None:
    """``(value - published) / |published|`` where both are finite numbers and ``published`` is not 0; else None."""
    if not (_is_number(value) and _is_number(published)) or published == 0:
        return None
    value, published = ((x if isinstance(x, int) else float(x)) for x in (value, published))   # NumPy: Python
    try:
        err = (value - published) / abs(published)
    except (OverflowError, ZeroDivisionError):              # integers beyond a float's range
        return None
    return float(err) if math.isfinite(err) else None


def decide_status(name: str, published: Any, role: str | None, status: str | None) -> str:
    """The status of a record named ``name`` (see the module docstring): from the ``role`` of its published value,
    or the ``status`` the notebook gives; ``computed`` for a record with neither a published value nor a status.
    A ``ValueError`` when they do not fit together (a published value with neither; a role without a published
    value; a status the role does not allow)."""
    who = f"record {name!r}"
    if status is not None:
        if not isinstance(status, str):
            raise TypeError(f"{who}: status must be one of {STATUSES}, got {status!r}")
        if status not in STATUSES:
            raise ValueError(f"{who}: status must be one of {STATUSES}, got {status!r}")
    if role is not None:
        if not isinstance(role, str) or role not in ROLES:
            raise (ValueError if isinstance(role, str) else TypeError)(
                f"{who}: role must be one of {ROLES} (the published value's role in data/published/), got {role!r}")
        if published is None:
            raise ValueError(f"{who}: role={role!r} describes a published value, but none was given (published=)")
        allowed = ROLE_STATUSES[role]
        if status is None:
            if role == "target":
                raise ValueError(f"{who} compares with a target: say whether it is reproduced "
                                 f"(status='reproduced' or status='not reproduced')")
            return allowed[0]
        if status not in allowed:
            raise ValueError(f"{who}: a published value of role {role!r} allows status "
                             f"{' or '.join(map(repr, allowed))}, got {status!r}")
        return status
    if published is not None and status is None:
        raise ValueError(f"{who} has a published value: give its role (role= one of {ROLES}, from "
                         f"data/published/) or its status (status= one of {STATUSES})")
    return status if status is not None else "computed"


# The notebooks stated a record's standing in the first words of its note before the status was a field
# ("calibrated: ...", "held back: prediction", "not reproduced: ..."); read in this order, so that "not reproduced"
# wins over "reproduced".
_STATUS_WORDS = (("calibrat", "calibrated"), ("not reproduced", "not reproduced"), ("reproduced", "reproduced"),
                 ("held back", "held back (predicted)"), ("held-back", "held back (predicted)"),
                 ("bound:", "bound"), ("predict", "predicted"))


def infer_status(note: str, published: Any) -> str:
    """The status a record of an older results file (before the field) is given, inferred from the words of its
    note (*calibrated*, *reproduced*, *not reproduced*, *held back*, *bound:*, *prediction*); without such a word,
    ``compared`` when a published value exists, else ``computed``."""
    if not isinstance(note, str):
        raise TypeError(f"note must be a string, got {type(note).__name__}")
    low = note.lower()
    for word, status in _STATUS_WORDS:
        if word in low:
            return status
    return "compared" if published is not None else "computed"


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:                     # pragma: no cover - IPython comes with the notebook extra
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def _glue(key: str, value: Any) -> None:
    """Glue ``value`` under ``key`` (not displayed) when running in a Jupyter kernel with myst-nb installed."""
    if not _in_kernel():
        return
    try:
        from myst_nb import glue
    except ImportError:                     # pragma: no cover - myst-nb comes with jupyter-book
        return
    glue(key, value, display=False)


class Recorder:
    """Collects the numbers a notebook produces; ``save()`` writes them when a path was given.

    ``notebook`` is the notebook's name (one path component, e.g. ``"01_memory_wall"``); ``results_path`` where
    :meth:`save` writes (``None`` or ``""``, the parameters cell's default: nothing is written); ``smoke`` whether
    the notebook runs at CI sizes (None: not said; the pipeline fills it in).

    >>> rec = Recorder("demo")
    >>> rec.record("x", 3, "B", config={"L": 1})
    3
    """

    def __init__(self, notebook: str, results_path: str | os.PathLike | None = None, *, smoke: bool | None = None):
        if not isinstance(notebook, str):
            raise TypeError(f"notebook must be a name (a string), got {type(notebook).__name__} {notebook!r}")
        if not _NAME.match(notebook):
            raise ValueError(f"notebook must be a non-empty name of letters, digits, '_', '-' or '.', got "
                             f"{notebook!r}")
        if results_path is not None and not isinstance(results_path, (str, os.PathLike)):
            raise TypeError(f"results_path must be a path, '' or None, got {type(results_path).__name__}")
        if smoke is not None and not isinstance(smoke, bool):
            raise TypeError(f"smoke must be True, False or None, got {smoke!r}")
        self.notebook = notebook
        self.results_path = Path(results_path) if results_path not in (None, "") else None
        self.smoke = smoke
        self.records: list[Record] = []
        self.figures: list[str] = []

    def record(self, name: str, value: Any, unit: str, *, config: Mapping | None = None, published: Any = None,
               source: str | None = None, role: str | None = None, status: str | None = None, note: str = "",
               low: float | None = None, high: float | None = None) -> Any:
        """Add one record and return ``value`` unchanged (so it can be used inline). In a Jupyter kernel the value
        is also glued under ``name`` for the book.

        ``published`` and ``source``: the published value the record compares with, and where it comes from;
        ``role``: that value's role in ``data/published/`` (``"calibration"``, ``"target"``, ``"held_back"``),
        which sets the status; ``status``: one of :data:`STATUSES`, said by the notebook (required for a target:
        ``"reproduced"`` or ``"not reproduced"``; for a published value from elsewhere when no role is given).
        Without a published value the status is ``"computed"`` unless given. Bad input raises a ``TypeError`` /
        ``ValueError`` naming the argument, and nothing is recorded."""
        if not isinstance(name, str):
            raise TypeError(f"{self.notebook}: record name must be a string, got {type(name).__name__} {name!r}")
        if any(r.name == name for r in self.records):
            raise ValueError(f"{self.notebook}: record {name!r} already exists; names must be unique per notebook")
        if config is not None and not isinstance(config, Mapping):
            raise TypeError(f"{self.notebook}: record {name!r}: config must be a dict or None, got "
                            f"{type(config).__name__}")
        plain_published = _plain(published, f"record {name!r}: published")
        decided = decide_status(name, plain_published, role, status)
        rec = Record(name, value, unit, dict(config or {}), plain_published, source, note, low, high,
                     status=decided)
        self.records.append(rec)
        _glue(name, rec.value)
        return value

    @property
    def figures_dir(self) -> Path | None:
        """Where :meth:`figure` writes (``<results folder>/<notebook>.figures/``); None without a results path."""
        if self.results_path is None:
            return None
        return self.results_path.parent / f"{self.notebook}.figures"

    def figure(self, name: str, fig: Any) -> Any:
        """Keep a plotly figure for the static exports (the pipeline renders it to PNG and SVG under
        ``build/figures/``): writes its JSON next to the results when a path was given. Returns ``fig``."""
        if not isinstance(name, str) or not _FIGURE_NAME.match(name):
            raise ValueError(f"figure name must be letters, digits, '_', '-' or '.', got {name!r}")
        if not hasattr(fig, "to_json"):
            raise TypeError(f"fig must be a plotly figure, got {type(fig).__name__}")
        if name in self.figures:
            raise ValueError(f"{self.notebook}: figure {name!r} already exists; names must be unique per notebook")
        if self.figures_dir is not None:
            self.figures_dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.figures_dir / f"{name}.json", json.loads(fig.to_json()), allow_nan=True)
        self.figures.append(name)
        return fig

    def to_frame(self):
        import pandas as pd
        rows = [{**asdict(r), "error": r.error} for r in self.records]
        return pd.DataFrame(rows, columns=["name", "value", "unit", "status", "published", "error", "source",
                                           "config", "note"])

    def save(self) -> Path | None:
        """Write the records as JSON to ``results_path`` (nothing when no path was given), atomically."""
        if self.results_path is None:
            return None
        mode = {True: "smoke", False: "full", None: "unknown"}[self.smoke]
        data = {"format": RESULTS_FORMAT,
                "run": {"notebook": self.notebook, "mode": mode, "smoke": self.smoke, "saved": utc_now()},
                "records": [asdict(r) for r in self.records], "figures": list(self.figures)}
        return write_json_atomic(self.results_path, data, allow_nan=True)     # NaN only in a configuration


@dataclass(frozen=True)
class Results:
    """A results file: its ``run`` header, its records, the names of its saved figures, and whether the records'
    status was inferred from their notes (a file of an older format) instead of read."""
    path: Path
    run: dict
    records: list[Record]
    figures: list[str]
    status_inferred: bool = False

    @property
    def mode(self) -> str:
        return self.run.get("mode", "unknown")

    @property
    def figures_dir(self) -> Path:
        """The folder of the saved figures' JSON: the run header's ``figures_dir`` (the pipeline names it by run),
        else ``<notebook>.figures`` next to the file; always inside the file's folder."""
        name = self.run.get("figures_dir") or f"{self.run.get('notebook') or self.path.stem}.figures"
        return self.path.parent / name


_RECORD_FIELDS = tuple(f.name for f in fields(Record))
# the run header's fields and the types each must have (others are kept as they are)
_RUN_TYPES = {"notebook": (str,), "mode": (str,), "smoke": (bool, type(None)), "saved": (str, type(None)),
              "run_id": (str, type(None)), "started": (str, type(None)), "finished": (str, type(None)),
              "status": (str,), "figures_dir": (str,)}


def _check_run(path: Path, run: Any) -> dict:
    if not isinstance(run, dict):
        raise ValueError(f"{path}: the 'run' header must be an object, got {type(run).__name__}")
    for key, types in _RUN_TYPES.items():
        if key in run and not isinstance(run[key], types):
            raise ValueError(f"{path}: run.{key} must be {' or '.join(t.__name__ for t in types)}, got "
                             f"{run[key]!r}")
    if "mode" in run and run["mode"] not in _RUN_MODES:
        raise ValueError(f"{path}: run.mode must be one of {_RUN_MODES}, got {run['mode']!r}")
    for key in ("notebook", "figures_dir"):
        if key in run and not _NAME.match(run[key]):
            raise ValueError(f"{path}: run.{key} must be one name inside the results folder, got {run[key]!r}")
    return run


def load_results(path: str | os.PathLike) -> Results:
    """Read a results file written by :meth:`Recorder.save` (this format or an older one); a ``ValueError`` naming
    the file and what is wrong when it is not one (invalid JSON, a missing or mistyped part, a record that is not
    an object or not a valid record, a figure name or folder that would lead outside the results folder)."""
    path = validate.path("path", path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a results file (invalid JSON: {exc})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a results file (not UTF-8 text)") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the results file ({exc.strerror or exc})") from None
    if isinstance(data, list):                               # the first format: a bare list of records
        run, rows, figures, fmt = {"format": 1, "mode": "unknown", "smoke": None}, data, [], 1
    elif isinstance(data, dict) and data.get("format") in (RESULTS_FORMAT, *_OLDER_FORMATS):
        fmt = data["format"]
        run, rows, figures = _check_run(path, data.get("run", {})), data.get("records"), data.get("figures", [])
        if not isinstance(rows, list):
            raise ValueError(f"{path}: a {fmt} file needs a 'records' list, got {type(rows).__name__}")
        if not isinstance(figures, list) or not all(isinstance(f, str) and _FIGURE_NAME.match(f) for f in figures):
            raise ValueError(f"{path}: 'figures' must be a list of figure names (one path component each), got "
                             f"{figures!r}"[:300])
    else:
        raise ValueError(f"{path}: not a results file (expected a JSON object with format {RESULTS_FORMAT!r} or "
                         f"{' / '.join(_OLDER_FORMATS)}, or a list of records)")
    inferred = fmt != RESULTS_FORMAT
    records, seen = [], set()
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{path}: records[{i}] must be an object, got {type(row).__name__}")
        unknown = set(row) - set(_RECORD_FIELDS) | ({"status"} & set(row) if inferred else set())
        if unknown:
            raise ValueError(f"{path}: records[{i}] has unexpected fields {sorted(unknown)}")
        missing = {"name", "value", "unit"} - set(row) | ({"status"} - set(row) if not inferred else set())
        if missing:
            raise ValueError(f"{path}: records[{i}] lacks the fields {sorted(missing)}")
        try:
            if inferred:
                note = row.get("note", "")
                status = infer_status(note if isinstance(note, str) else "", row.get("published"))
                records.append(Record(**row, status=status))
            else:
                records.append(Record(**row))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: records[{i}] is not a valid record ({exc})") from None
        if records[-1].name in seen:
            raise ValueError(f"{path}: record {records[-1].name!r} appears twice")
        seen.add(records[-1].name)
    return Results(path, run, records, list(figures), status_inferred=inferred)


def load_records(path: str | os.PathLike) -> list[Record]:
    """The records of a results file written by :meth:`Recorder.save` (either format)."""
    return load_results(path).records
