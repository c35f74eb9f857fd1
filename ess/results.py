"""The record format that notebooks write and tests read.

A notebook records every number it produces through a :class:`Recorder`; the reproduction pipeline gives each
notebook a ``results_path`` and the recorder writes ``build/results/<notebook>.json``, a JSON list of records::

    {"name": "batch_limit_32k", "value": 52, "unit": "requests/GPU",
     "config": {"context_len": 32768, "ratio": 1.0, "deployment": "paper-table1"},
     "published": 52, "source": "[ARX] memory limit, paper-facts.md", "note": "..."}
"""
from __future__ import annotations

import json
import math
import numbers
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

__all__ = ["Record", "Recorder", "load_records", "relative_error"]


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


@dataclass(frozen=True)
class Record:
    name: str
    value: Any
    unit: str
    config: dict = field(default_factory=dict)
    published: Any = None
    source: str | None = None
    note: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Record.name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.unit, str):
            raise TypeError(f"Record.unit must be a string (use '' for a pure number), got {self.unit!r}")
        if self.published is not None and not self.source:
            raise ValueError(f"Record {self.name!r}: a published value needs its source")
        if isinstance(self.value, numbers.Real) and not isinstance(self.value, bool) and not math.isfinite(self.value):
            raise ValueError(f"Record {self.name!r}: value must be finite, got {self.value!r}")

    @property
    def error(self) -> float | None:
        """Relative error against the published value, where both are numbers."""
        return relative_error(self.value, self.published)


def relative_error(value: Any, published: Any) -> float | None:
    if isinstance(value, numbers.Real) and isinstance(published, numbers.Real) and published != 0:
        return (value - published) / abs(published)
    return None


class Recorder:
    """Collects the numbers a notebook produces; ``save()`` writes them when a path was given.

    >>> rec = Recorder("demo")
    >>> rec.record("x", 3, "B", config={"L": 1})
    3
    """

    def __init__(self, notebook: str, results_path: str | Path | None = None):
        if not notebook:
            raise ValueError("notebook must be a non-empty name")
        self.notebook = notebook
        self.results_path = Path(results_path) if results_path else None
        self.records: list[Record] = []

    def record(self, name: str, value: Any, unit: str, *, config: Mapping | None = None, published: Any = None,
               source: str | None = None, note: str = "") -> Any:
        """Add one record and return ``value`` unchanged (so it can be used inline)."""
        if any(r.name == name for r in self.records):
            raise ValueError(f"{self.notebook}: record {name!r} already exists; names must be unique per notebook")
        self.records.append(Record(name, _plain(value), unit, _plain(dict(config or {})), _plain(published),
                                   source, note))
        return value

    def to_frame(self):
        import pandas as pd
        rows = [{**asdict(r), "error": r.error} for r in self.records]
        return pd.DataFrame(rows, columns=["name", "value", "unit", "published", "error", "source", "config", "note"])

    def save(self) -> Path | None:
        """Write the records as JSON to ``results_path`` (nothing when no path was given)."""
        if self.results_path is None:
            return None
        self.results_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.results_path.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(r) for r in self.records], indent=1), encoding="utf-8")
        tmp.replace(self.results_path)
        return self.results_path


def load_records(path: str | Path) -> list[Record]:
    """Read a results file written by :meth:`Recorder.save`."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of records")
    return [Record(**row) for row in data]
