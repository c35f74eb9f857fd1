"""Published numbers (article and paper) from ``data/published/``, each with its source and role."""
from __future__ import annotations

import functools

import yaml

from .specs import DATA_DIR

__all__ = ["published", "ROLES"]

ROLES = ("calibration", "target", "held_back")


@functools.lru_cache(maxsize=None)
def published(document: str) -> dict[str, dict]:
    """All entries of ``data/published/<document>.yaml`` (``"article"`` or ``"paper"``)."""
    allowed = sorted(p.stem for p in (DATA_DIR / "published").glob("*.yaml"))
    if document not in allowed:
        raise ValueError(f"unknown published document {document!r}; allowed: {', '.join(allowed)}")
    entries = yaml.safe_load((DATA_DIR / "published" / f"{document}.yaml").read_text(encoding="utf-8"))
    for key, entry in entries.items():
        if not entry.get("source") or entry.get("role") not in ROLES:
            raise ValueError(f"data/published/{document}.yaml:{key} needs a source and a role in {ROLES}")
    return entries
