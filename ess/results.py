"""The record format that notebooks write and tests read.

A notebook records every number it produces through a :class:`Recorder`; the reproduction pipeline gives each
notebook a ``results_path`` and the recorder writes ``build/results/<notebook>.json``, a JSON object with a ``run``
header (which notebook, smoke or full, when; the pipeline completes it when the notebook finished), the list of
``records`` and the names of the ``figures`` saved next to it::

    {"format": "ess-results/2",
     "run": {"notebook": "01_memory_wall", "mode": "smoke", "smoke": true, "saved": "2026-...Z",
             "run_id": "...", "started": "...", "finished": "...", "status": "complete"},
     "records": [{"name": "batch_limit_32k", "value": 52, "unit": "requests/GPU",
                  "config": {"context_len": 32768, "ratio": 1.0, "deployment": "paper-table1"},
                  "published": 52, "source": "[ARX] memory limit, paper-facts.md", "note": "...",
                  "low": null, "high": null}],
     "figures": ["memory_wall"]}

Files of the first format (a bare JSON list of records, with no run header) are still read; their run is
``{"format": 1, "mode": "unknown"}``.

Inside a Jupyter kernel every record is also *glued* (``myst_nb.glue``, not displayed) under its name, so that the
book's pages quote it as ``{glue:text}`/notebooks/<notebook>.ipynb::<name>:<format>```.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import numbers
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .atomic import write_json_atomic, write_text_atomic

__all__ = ["Record", "Recorder", "Results", "load_records", "load_results", "relative_error", "record_status",
           "utc_now", "RESULTS_FORMAT", "STATUSES"]

RESULTS_FORMAT = "ess-results/2"
_FIGURE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def utc_now() -> str:
    """The current time, UTC, ISO 8601 to the second (``2026-01-31T12:00:00Z``)."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _plain(value: Any) -> Any:
    """numpy scalars and arrays, tuples and Paths to JSON-ready Python values."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


@dataclass(frozen=True)
class Record:
    """One recorded number: ``value`` in ``unit`` under ``config``; the ``published`` value with its ``source`` where
    one exists; an optional band ``[low, high]`` the value is expected in (either end may be absent)."""
    name: str
    value: Any
    unit: str
    config: dict = field(default_factory=dict)
    published: Any = None
    source: str | None = None
    note: str = ""
    low: float | None = None
    high: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Record.name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.unit, str):
            raise TypeError(f"Record.unit must be a string (use '' for a pure number), got {self.unit!r}")
        if self.published is not None and not self.source:
            raise ValueError(f"Record {self.name!r}: a published value needs its source")
        if _is_number(self.value) and not math.isfinite(self.value):
            raise ValueError(f"Record {self.name!r}: value must be finite, got {self.value!r}")
        for end in ("low", "high"):
            bound = getattr(self, end)
            if bound is None:
                continue
            if not _is_number(bound):
                raise TypeError(f"Record {self.name!r}: {end} must be a number or None, got {bound!r}")
            if not math.isfinite(bound):
                raise ValueError(f"Record {self.name!r}: {end} must be finite, got {bound!r}")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"Record {self.name!r}: the band is empty (low {self.low} > high {self.high})")

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
    if _is_number(value) and _is_number(published) and published != 0:
        return (value - published) / abs(published)
    return None


STATUSES = ("calibrated", "not reproduced", "reproduced", "held back (predicted)", "bound", "predicted",
            "compared", "computed")

# The notebooks state a record's standing in the first words of its note ("calibrated: ...", "held back:
# prediction", "not reproduced: ..."); read in this order, so that "not reproduced" wins over "reproduced".
_STATUS_WORDS = (("calibrat", "calibrated"), ("not reproduced", "not reproduced"), ("reproduced", "reproduced"),
                 ("held back", "held back (predicted)"), ("held-back", "held back (predicted)"),
                 ("bound:", "bound"), ("predict", "predicted"))


def record_status(record: Record) -> str:
    """The record's standing, one of :data:`STATUSES`, read from its note (the notebooks say *calibrated*,
    *reproduced*, *not reproduced*, *held back*, *bound:* or *prediction* there); without such a word,
    ``compared`` when a published value exists, else ``computed``."""
    note = (record.note or "").lower()
    for word, status in _STATUS_WORDS:
        if word in note:
            return status
    return "compared" if record.published is not None else "computed"


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

    ``smoke`` says whether the notebook runs at CI sizes (None: not said; the pipeline fills it in).

    >>> rec = Recorder("demo")
    >>> rec.record("x", 3, "B", config={"L": 1})
    3
    """

    def __init__(self, notebook: str, results_path: str | Path | None = None, *, smoke: bool | None = None):
        if not isinstance(notebook, str) or not notebook:
            raise ValueError("notebook must be a non-empty name")
        if smoke is not None and not isinstance(smoke, bool):
            raise TypeError(f"smoke must be True, False or None, got {smoke!r}")
        self.notebook = notebook
        self.results_path = Path(results_path) if results_path else None
        self.smoke = smoke
        self.records: list[Record] = []
        self.figures: list[str] = []

    def record(self, name: str, value: Any, unit: str, *, config: Mapping | None = None, published: Any = None,
               source: str | None = None, note: str = "", low: float | None = None,
               high: float | None = None) -> Any:
        """Add one record and return ``value`` unchanged (so it can be used inline). In a Jupyter kernel the value
        is also glued under ``name`` for the book."""
        if any(r.name == name for r in self.records):
            raise ValueError(f"{self.notebook}: record {name!r} already exists; names must be unique per notebook")
        rec = Record(name, _plain(value), unit, _plain(dict(config or {})), _plain(published), source, note,
                     _plain(low), _plain(high))
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
            write_json_atomic(self.figures_dir / f"{name}.json", json.loads(fig.to_json()))
        self.figures.append(name)
        return fig

    def to_frame(self):
        import pandas as pd
        rows = [{**asdict(r), "error": r.error} for r in self.records]
        return pd.DataFrame(rows, columns=["name", "value", "unit", "published", "error", "source", "config", "note"])

    def save(self) -> Path | None:
        """Write the records as JSON to ``results_path`` (nothing when no path was given), atomically."""
        if self.results_path is None:
            return None
        mode = {True: "smoke", False: "full", None: "unknown"}[self.smoke]
        data = {"format": RESULTS_FORMAT,
                "run": {"notebook": self.notebook, "mode": mode, "smoke": self.smoke, "saved": utc_now()},
                "records": [asdict(r) for r in self.records], "figures": list(self.figures)}
        return write_json_atomic(self.results_path, data)


@dataclass(frozen=True)
class Results:
    """A results file: its ``run`` header, its records and the names of its saved figures."""
    path: Path
    run: dict
    records: list[Record]
    figures: list[str]

    @property
    def mode(self) -> str:
        return self.run.get("mode", "unknown")


def load_results(path: str | Path) -> Results:
    """Read a results file written by :meth:`Recorder.save` (either format); a clear ``ValueError`` naming the file
    when it is not one."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a results file (invalid JSON: {exc})") from None
    if isinstance(data, list):                               # the first format: a bare list of records
        run, rows, figures = {"format": 1, "mode": "unknown", "smoke": None}, data, []
    elif isinstance(data, dict) and data.get("format") == RESULTS_FORMAT:
        run, rows, figures = data.get("run") or {}, data.get("records"), data.get("figures") or []
        if not isinstance(rows, list) or not isinstance(run, dict):
            raise ValueError(f"{path}: a {RESULTS_FORMAT} file needs a 'run' object and a 'records' list")
    else:
        raise ValueError(f"{path}: not a results file (expected a JSON object with format {RESULTS_FORMAT!r}, "
                         f"or a list of records)")
    try:
        records = [Record(**row) for row in rows]
    except TypeError as exc:
        raise ValueError(f"{path}: a record has unexpected fields ({exc})") from None
    return Results(path, run, records, list(figures))


def load_records(path: str | Path) -> list[Record]:
    """The records of a results file written by :meth:`Recorder.save` (either format)."""
    return load_results(path).records
