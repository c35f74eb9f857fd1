"""The pipeline's errors: what the ``ess`` command prints as one line (no traceback)."""
from __future__ import annotations

__all__ = ["ReproduceError", "RunInterrupted"]


class ReproduceError(RuntimeError):
    """The ``ess`` command cannot finish: a notebook failed, the book did not build, or the build folder cannot be
    used. Its message is meant for the terminal as it is (no traceback)."""


class RunInterrupted(KeyboardInterrupt):
    """The run was stopped by a signal (SIGTERM, SIGHUP); Ctrl-C raises a plain ``KeyboardInterrupt``."""

    def __init__(self, signame: str):
        super().__init__(signame)
        self.signame = signame
