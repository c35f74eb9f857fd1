"""Stored simulator inputs: the calibrations and the cache simulation's miss tables that :func:`ess.plan` reads, so
that an answer takes a second instead of a minute.

Two places hold them, each keyed by what produced it:

* ``data/generated/`` -- **generated artifacts shipped with the project**: ``calibration.json`` (the central
  calibration, the equally good ones and the part-batch ends of the calibration band, the extrapolation variants)
  and ``misses/*.json`` (one miss table per model geometry, locality model and Fig. 2 mapping, at the grid's
  cache-simulation sizes, for the shipped models and contexts at their deployment's MTP). Each file names its
  inputs (a SHA-256 digest of the ``data/`` files that feed it), the ess version and the command that regenerates
  it, ``ess calibrate``. A file whose inputs changed is not used (the value is computed again), and a test
  regenerates a sample and finds the stored values. What is shipped, and the command that makes it, is
  :func:`ess.planning.regenerate`.
* a **user cache folder** (``$ESS_CACHE_DIR``, else ``$XDG_CACHE_HOME/ess``, else ``~/.cache/ess``) for anything
  else computed on demand (another context, ratio or MTP; another calibration size): written atomically
  (:mod:`ess.atomic`: a reader sees a whole old file or a whole new one), each entry keyed by the digest of its
  inputs *and* of the code that computes it, so a changed input or a changed simulator is never trusted. Two
  processes may write the same entry: the last whole file wins, and a row either one misses is computed again.

Nothing here computes a prediction: :func:`calibration_payload` and :func:`table_rows` only carry what
:mod:`ess.sim.calibrate` and :class:`ess.sim.misses.MissesTable` produce.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import threading
import warnings
from pathlib import Path

import numpy as np

from ..specs import DATA_DIR
from .costs import CostParams

__all__ = ["GENERATED_DIR", "FORMAT", "REGENERATE", "cache_dir", "inputs_digest", "code_digest",
           "calibration_payload", "params_from_payload", "stored_calibration", "write_calibration",
           "table_identity", "table_rows", "load_rows", "stored_table_path", "seed_table", "save_table",
           "StaleStoreWarning"]

#: where the shipped generated artifacts live
GENERATED_DIR = DATA_DIR / "generated"
#: the layout of the stored files; a file of another format is not read
FORMAT = 1
#: the command that regenerates ``data/generated/``
REGENERATE = "ess calibrate"
#: the ``data/`` folders whose files feed the calibration and the miss tables (their digest keys every artifact)
_INPUT_FOLDERS = ("published", "calibration", "models", "hardware", "deployments", "locality")
#: the modules whose code computes what is cached on demand (their digest keys every user-cache entry)
_CODE = ("sim/costs.py", "sim/timeline.py", "sim/calibrate.py", "sim/config.py", "sim/misses.py", "sim/grid.py",
         "sim/predictions.py", "cachesim.py", "tracegen.py", "locality.py", "policies.py", "layout.py",
         "memory.py", "specs.py", "traces.py", "published.py",
         # the kernel families those modules run (a change to a kernel changes what is stored)
         "kernels/lru_list.py", "kernels/cachesim/numba_cpu.py", "kernels/cachesim/__init__.py",
         "kernels/tracegen/numba_cpu.py", "kernels/tracegen/__init__.py", "kernels/timeline/numba_cpu.py",
         "kernels/timeline/__init__.py", "kernels/trace_stats/numba_cpu.py", "kernels/trace_stats/__init__.py")
#: the kinds of file in the input folders that feed a value (an editor's swap file does not)
_INPUT_SUFFIXES = (".yaml", ".yml", ".json", ".csv", ".npz")
#: files of those folders that feed neither: the real-model check's design (notebook 09, ess.studies.real_model.check) and
#: the public MTP growth evidence (read by the extrapolation bands of notebooks 07-08, not by the calibration)
_NOT_INPUTS = ("calibration/engine_check.yaml", "calibration/mtp_growth.yaml")


class StaleStoreWarning(UserWarning):
    """A stored artifact was made from other inputs than today's: it is not used, and the value is computed."""


def cache_dir() -> Path:
    """The user cache folder: ``$ESS_CACHE_DIR``, else ``$XDG_CACHE_HOME/ess``, else ``~/.cache/ess``."""
    env = os.environ.get("ESS_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "ess"


def _digest_files(paths) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(str(p.relative_to(p.parents[1])).encode())
        h.update(b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def inputs_digest() -> str:
    """SHA-256 over the ``data/`` files that feed the calibration and the miss tables (their relative paths and
    bytes): a stored artifact is used only while it matches."""
    skip = {DATA_DIR / f for f in _NOT_INPUTS}
    files = [p for f in _INPUT_FOLDERS for p in (DATA_DIR / f).rglob("*")
             if p.is_file() and p.suffix in _INPUT_SUFFIXES and p not in skip]
    return _digest_files(files)


@functools.lru_cache(maxsize=None)
def code_digest() -> str:
    """SHA-256 over the modules that compute what the user cache holds."""
    pkg = Path(__file__).resolve().parents[1]
    return _digest_files([pkg / c for c in _CODE])


def _version() -> str:
    from .. import __version__
    return __version__


def _provenance(kind: str, config: dict) -> dict:
    return {"format": FORMAT, "kind": kind, "ess_version": _version(), "inputs_sha256": inputs_digest(),
            "inputs": [f"data/{f}/" for f in _INPUT_FOLDERS], "config": config, "regenerate": REGENERATE}


# ------------------------------------------------------------------------------------------------- calibration
def params_from_payload(d: dict) -> CostParams:
    """A :class:`CostParams` from its :meth:`~CostParams.to_dict` (a ``ValueError`` naming a missing field)."""
    fields = {f.name for f in dataclasses.fields(CostParams)}
    missing = fields - set(d)
    if missing:
        raise ValueError(f"a stored calibration lacks {sorted(missing)}")
    return CostParams(**{k: d[k] for k in fields})


def calibration_payload(variant_fit: dict | None = None) -> dict:
    """The calibrations :func:`ess.sim.grid.grid_inputs` computes (notebook 05's equally good calibrations and the
    part-batch ends, the extrapolation variants), as plain values with their provenance: what
    ``data/generated/calibration.json`` holds. About 15 s of fitting at the default sizes (``variant_fit`` goes to
    :func:`ess.sim.calibrate.calibrate`, e.g. a coarser grid)."""
    from .grid import grid_inputs
    inputs = grid_inputs(variant_fit=variant_fit, stored=False)
    return {**_provenance("calibration", _calibration_config(variant_fit)),
            "central": inputs.params.to_dict(),
            "calibrations": {k: v.to_dict() for k, v in inputs.calibrations.items()},
            "extrapolation": {k: v.to_dict() for k, v in inputs.extrapolation.items()}}


def _read_json(path: Path) -> dict | None:
    try:
        with open(path, encoding="utf-8") as fh:
            d = json.load(fh)
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def _usable(d: dict | None, kind: str, config: dict, *, code: bool = False) -> bool:
    return (d is not None and d.get("format") == FORMAT and d.get("kind") == kind and d.get("config") == config
            and d.get("inputs_sha256") == inputs_digest() and (not code or d.get("code_sha256") == code_digest()))


def _calibration_config(variant_fit: dict | None) -> dict:
    return {"variant_fit": dict(variant_fit or {})}


def write_calibration(payload: dict, folder: Path | None = None) -> Path:
    """Write a :func:`calibration_payload` to ``folder`` (default ``data/generated``) atomically."""
    from ..atomic import write_json_atomic
    return write_json_atomic(Path(folder or GENERATED_DIR) / "calibration.json", payload, indent=1)


_BUSY: set = set()
_LOCK = threading.RLock()         # one thread computes; another waits for its result


@functools.lru_cache(maxsize=8)
def _calibration(key: str) -> dict:
    with _LOCK:
        if key in _BUSY:              # a fit that asks for its own result (a default scenario inside calibrate)
            raise RuntimeError("the stored calibration was asked for while it is being computed: a fit must run in "
                               "a scenario with explicit cost parameters")
        _BUSY.add(key)
        try:
            return _calibration_uncached(key)
        finally:
            _BUSY.discard(key)


def _calibration_uncached(key: str) -> dict:
    variant_fit = json.loads(key)
    config = _calibration_config(variant_fit)
    shipped = _read_json(GENERATED_DIR / "calibration.json")
    if _usable(shipped, "calibration", config):
        return shipped
    if shipped is not None and shipped.get("config") == config:
        warnings.warn(f"data/generated/calibration.json was made from other inputs than today's data/ files: not "
                      f"used; computing the calibration (run `{REGENERATE}` to store it again)", StaleStoreWarning,
                      stacklevel=3)
    name = "calibration-" + hashlib.sha256(key.encode()).hexdigest()[:16] + ".json"
    cached_path = cache_dir() / name
    cached = _read_json(cached_path)
    if _usable(cached, "calibration", config, code=True):
        return cached
    payload = {**calibration_payload(variant_fit), "code_sha256": code_digest()}
    _write_cache(cached_path, payload)
    return payload


def _write_cache(path: Path, payload: dict) -> None:
    """Write a user-cache entry atomically; a cache folder that cannot be written is not an error (the value was
    computed, it is just not kept)."""
    from ..atomic import write_json_atomic
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_json_atomic(path, payload, indent=None)
    except (OSError, ValueError) as exc:          # ValueError: a value JSON cannot hold
        warnings.warn(f"the ess cache folder {path.parent} cannot be written ({exc.strerror or exc}): the value is "
                      f"not kept (set ESS_CACHE_DIR to a writable folder)", RuntimeWarning, stacklevel=3)


def stored_calibration(variant_fit: dict | None = None) -> dict:
    """``{"central": CostParams, "calibrations": {name: CostParams}, "extrapolation": {name: CostParams},
    "source": where it came from}``: the shipped ``data/generated/calibration.json`` when it matches today's inputs
    and ``variant_fit``, else the user cache, else computed (and cached). Once per process."""
    if variant_fit is not None and not isinstance(variant_fit, dict):
        raise TypeError(f"variant_fit must be a dict of calibrate() keywords, got {type(variant_fit).__name__}")
    key = json.dumps(dict(variant_fit or {}), sort_keys=True)
    d = _calibration(key)
    return {"central": params_from_payload(d["central"]),
            "calibrations": {k: params_from_payload(v) for k, v in d["calibrations"].items()},
            "extrapolation": {k: params_from_payload(v) for k, v in d["extrapolation"].items()},
            "source": "computed" if "code_sha256" in d else "data/generated/calibration.json"}


# --------------------------------------------------------------------------------------------------- coverage
def coverage_payload() -> dict:
    """The leave-one-out coverage of the calibration band (:func:`ess.sim.calibrate.leave_one_out` at the default
    sizes, :func:`ess.sim.calibrate.band_coverage` at :data:`ess.sim.calibrate.BAND_NOMINAL`), as plain values with
    their provenance: what ``data/generated/coverage.json`` holds. A minute or more of fitting."""
    from .calibrate import BAND_NOMINAL, band_coverage, leave_one_out
    loo = leave_one_out()
    return {**_provenance("coverage", {"nominal": BAND_NOMINAL}), **band_coverage(loo, BAND_NOMINAL),
            "rows": json.loads(loo.to_json(orient="records"))}


def write_coverage(payload: dict, folder: Path | None = None) -> Path:
    """Write a :func:`coverage_payload` to ``folder`` (default ``data/generated``) atomically."""
    from ..atomic import write_json_atomic
    return write_json_atomic(Path(folder or GENERATED_DIR) / "coverage.json", payload, indent=1)


@functools.lru_cache(maxsize=1)
def stored_coverage() -> dict:
    """The calibration band's leave-one-out coverage (:func:`coverage_payload`): the shipped
    ``data/generated/coverage.json`` while it matches today's inputs, else the user cache, else computed (and
    cached). Once per process."""
    from .calibrate import BAND_NOMINAL
    config = {"nominal": BAND_NOMINAL}
    shipped = _read_json(GENERATED_DIR / "coverage.json")
    if _usable(shipped, "coverage", config):
        return shipped
    if shipped is not None:
        warnings.warn(f"data/generated/coverage.json was made from other inputs than today's: not used; computing "
                      f"the coverage (run `{REGENERATE}` to store it again)", StaleStoreWarning, stacklevel=2)
    cached_path = cache_dir() / "coverage.json"
    cached = _read_json(cached_path)
    if _usable(cached, "coverage", config, code=True):
        return cached
    payload = {**coverage_payload(), "code_sha256": code_digest()}
    _write_cache(cached_path, payload)
    return payload


# ----------------------------------------------------------------------------------------------------- misses
def table_identity(table) -> dict:
    """What makes a :class:`~ess.sim.misses.MissesTable`'s counts what they are: its settings (``config``), the
    model's cache and selection geometry (the spec without its name and sources) and the simulated rows' cap."""
    from .misses import MAX_SIMULATED_ROWS
    geometry = {k: v for k, v in dataclasses.asdict(table.model).items() if k not in ("name", "sources")}
    cfg = {k: v for k, v in table.config.items() if k not in ("model", "layers", "k", "tokens_per_row")}
    return json.loads(json.dumps({"config": cfg, "geometry": geometry, "max_rows": MAX_SIMULATED_ROWS},
                                 sort_keys=True, default=list))


def _id_hash(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def table_rows(table) -> dict:
    """A table's computed rows as plain values: ``{"<context>,<mtp>": {repr(ratio): [misses...] or reason}}``."""
    out = {}
    for (L, T), row in table._rows.items():
        out[f"{L},{T}"] = {repr(float(r)): (v if isinstance(v, str) else [float(x) for x in np.asarray(v)])
                           for r, v in row.items()}
    return out


def _checked_rows(table, rows) -> dict:
    """``rows`` (:func:`table_rows`) as ``{(L, T): {ratio: array or reason}}``, every key and value checked
    against ``table``: a context and MTP >= 1, a ratio in (0, 1], a reason or ``n_sparse_layers`` finite counts
    >= 0. ``ValueError`` on the first that is not (the file is then not used at all)."""
    out = {}
    n_layers = table.model.n_sparse_layers
    if not isinstance(rows, dict):
        raise ValueError("rows must be a mapping")
    for key, row in rows.items():
        parts = key.split(",") if isinstance(key, str) else ()
        if len(parts) != 2 or not all(p.isdigit() and int(p) >= 1 for p in parts) or not isinstance(row, dict):
            raise ValueError(f"a row key {key!r} is not '<context>,<mtp>'")
        got = {}
        for r, v in row.items():
            r = float(r)
            if not 0 < r <= 1:
                raise ValueError(f"a ratio {r!r} outside (0, 1]")
            if isinstance(v, str):
                got[r] = v
                continue
            arr = np.asarray(v, dtype=float)
            if arr.shape != (n_layers,) or not np.isfinite(arr).all() or (arr < 0).any():
                raise ValueError(f"misses of ratio {r!r} are not {n_layers} finite counts >= 0")
            got[r] = arr
        out[(int(parts[0]), int(parts[1]))] = got
    return out


def load_rows(table, rows: dict) -> int:
    """Put stored ``rows`` (:func:`table_rows`) into ``table`` where it has none yet; returns how many points.
    Rows that do not fit the table (:func:`_checked_rows`) are a ``ValueError`` and nothing is loaded."""
    n = 0
    for key, row in _checked_rows(table, rows).items():
        have = table._rows.setdefault(key, {})
        for r, v in row.items():
            if r not in have:
                have[r] = v
                n += 1
    return n


def _load(table, d: dict, where: str) -> int:
    """:func:`load_rows` of a stored file ``d``; a file whose rows do not fit is not used, with a warning."""
    try:
        return load_rows(table, d["rows"])
    except (ValueError, TypeError, KeyError) as exc:
        warnings.warn(f"{where} holds miss rows that do not fit its table ({exc}): not used", StaleStoreWarning,
                      stacklevel=3)
        return 0


def stored_table_path(table, folder: Path | None = None) -> Path:
    """The shipped file of a table: ``data/generated/misses/<model>-<locality>-<profile>-s<steps>b<batch>.json``
    (``model`` the first shipped model of its geometry; the identity inside the file decides whether it is used)."""
    loc = "".join(c if c.isalnum() else "-" for c in table.locality.name).strip("-")
    name = f"{table.model.name}-{loc}-{table.profile}-s{table.steps}b{table.batch}.json"
    return Path(folder or GENERATED_DIR) / "misses" / name


@functools.lru_cache(maxsize=4)
def _shipped_index(folder: str) -> dict:
    """The shipped miss tables of ``folder``, read once per process: ``{identity hash: [file contents]}``."""
    out: dict = {}
    for p in sorted((Path(folder) / "misses").glob("*.json")):
        d = _read_json(p)
        if d is not None and isinstance(d.get("config"), dict):
            out.setdefault(_id_hash(d["config"]), []).append(d)
    return out


def _cache_path(identity: dict) -> Path:
    return cache_dir() / "misses" / f"{_id_hash(identity)}.json"


def seed_table(table, *, shipped: bool = True) -> int:
    """Fill ``table`` with every stored row of its identity: the shipped file (``shipped``; any file of
    ``data/generated/misses`` whose identity matches) and the user cache. Returns the points loaded."""
    from ..validate import boolean
    shipped = boolean("shipped", shipped)
    ident = table_identity(table)
    n = 0
    if shipped:
        for d in _shipped_index(str(GENERATED_DIR)).get(_id_hash(ident), ()):
            if _usable(d, "misses", ident):
                n += _load(table, d, "a file of data/generated/misses")
    d = _read_json(_cache_path(ident))
    if _usable(d, "misses", ident, code=True):
        n += _load(table, d, f"the cache entry {_cache_path(ident)}")
    return n


def save_table(table, folder: Path | None = None) -> Path | None:
    """Keep ``table``'s rows: in ``folder`` as a shipped artifact (``ess calibrate``), or, by default, in the user
    cache (merged with what the cache holds already; written atomically). Returns the path written (``None`` when
    the cache folder cannot be written)."""
    ident = table_identity(table)
    if folder is not None:
        from ..atomic import write_json_atomic
        path = stored_table_path(table, folder)
        payload = {**_provenance("misses", ident), "describe": table.describe(), "rows": table_rows(table)}
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_json_atomic(path, payload, indent=None)
    path = _cache_path(ident)
    seed_table(table, shipped=False)               # what another process kept meanwhile
    payload = {**_provenance("misses", ident), "code_sha256": code_digest(), "rows": table_rows(table)}
    _write_cache(path, payload)
    return path if path.exists() else None

