"""Published numbers (article and paper) from ``data/published/``, each with its source and role.

A value's *role* says what it is to the project: ``calibration`` (given, and fitted on: agreement there is not
evidence), ``target`` (a claim to check, never fitted) or ``held_back`` (a result of the paper not given to the
project, predicted). :meth:`ess.results.Recorder.record` takes the role of the published value a record compares
with and sets the record's status from it.
"""
from __future__ import annotations

import functools

import yaml

from .specs import DATA_DIR

__all__ = ["published", "ROLES"]

ROLES = ("calibration", "target", "held_back")


def published(document: str) -> dict[str, dict]:
    """All entries of ``data/published/<document>.yaml`` (``"article"``, ``"paper"``, ...), each a dict with at
    least ``source`` and ``role``. A ``TypeError`` / ``ValueError`` naming ``document`` for anything else."""
    if not isinstance(document, str):
        raise TypeError(f"document must be the name of a file in data/published/ (a string), got "
                        f"{type(document).__name__}")
    return _load(document)


@functools.lru_cache(maxsize=None)
def _load(document: str) -> dict[str, dict]:
    allowed = sorted(p.stem for p in (DATA_DIR / "published").glob("*.yaml"))
    if document not in allowed:
        raise ValueError(f"unknown published document {document!r}; allowed: {', '.join(allowed)}")
    entries = yaml.safe_load((DATA_DIR / "published" / f"{document}.yaml").read_text(encoding="utf-8"))
    if not isinstance(entries, dict):
        raise ValueError(f"data/published/{document}.yaml must map names to entries")
    for key, entry in entries.items():
        if not isinstance(entry, dict) or not entry.get("source") or entry.get("role") not in ROLES:
            raise ValueError(f"data/published/{document}.yaml:{key} needs a source and a role in {ROLES}")
    return entries
