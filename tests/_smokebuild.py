"""One smoke run of the whole pipeline (every notebook at CI sizes, figures, the book) per test session, shared by
the pipeline's test and the browser tests, which open the book it built.

Under pytest-xdist every worker is a process of its own: the first worker that asks builds, under a file lock in the
session's shared temporary folder, and leaves the build and its runs there; a worker that asks later (or waits on the
lock meanwhile) reads them. A failed build leaves its error, so that every later caller fails at once with it
instead of building again."""
from __future__ import annotations

import fcntl
import pickle

from ess.pipeline import run_all

_RUN: dict = {}


def _shared_root(tmp_path_factory):
    """The folder every worker of this session sees: the base temporary folder's parent under xdist (each worker's
    own base is a child of it), the base itself without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if base.name.startswith("popen-gw") else base


def smoke_build(tmp_path_factory):
    """``(build folder, runs)`` of the session's smoke run; the run happens on the first call (about 5 minutes)."""
    if not _RUN:
        root = _shared_root(tmp_path_factory) / "ess-smoke"
        root.mkdir(exist_ok=True)
        outcome = root / "outcome.pickle"
        with open(root / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)          # one builder; the others wait here, then read its outcome
            try:
                if not outcome.exists():
                    try:
                        # smoke cells take seconds; a cell stuck on a widget reply (jupyter/nbclient#312) fails after
                        # 300 s and is retried
                        got = {"value": (root / "build", run_all(smoke=True, build_dir=root / "build", progress=False,
                                                                 cell_timeout_s=300))}
                    except Exception as exc:          # remembered, so that every caller fails with the same error
                        got = {"error": RuntimeError(f"the session's smoke build failed: {type(exc).__name__}: "
                                                     f"{exc}")}
                    tmp = outcome.with_suffix(".tmp")
                    tmp.write_bytes(pickle.dumps(got))
                    tmp.replace(outcome)
                _RUN.update(pickle.loads(outcome.read_bytes()))
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    if "error" in _RUN:
        raise _RUN["error"]
    return _RUN["value"]
