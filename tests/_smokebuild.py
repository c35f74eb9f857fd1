"""One smoke run of the whole pipeline (every notebook at CI sizes, figures, the book) per test session, shared by
the pipeline's test and the browser tests, which open the book it built."""
from __future__ import annotations

from ess.pipeline import run_all

_RUN: dict = {}


def smoke_build(tmp_path_factory):
    """``(build folder, runs)`` of the session's smoke run; the run happens on the first call (about 3 minutes)."""
    if not _RUN:
        build = tmp_path_factory.mktemp("smoke") / "build"
        try:
            # smoke cells take seconds; a cell stuck on a widget reply (jupyter/nbclient#312) fails after 300 s and
            # is retried
            _RUN["value"] = (build, run_all(smoke=True, build_dir=build, progress=False,
                                                      cell_timeout_s=300))
        except BaseException as exc:       # remembered, so that a second caller fails at once with the same error
            _RUN["error"] = exc
    if "error" in _RUN:
        raise _RUN["error"]
    return _RUN["value"]
