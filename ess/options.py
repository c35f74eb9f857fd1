"""A dataclass field's metadata for the command line: its help, unit, flag and parser.

The requests of ``ess plan`` and ``ess simulate`` (:mod:`ess.planning`) and a synthetic trace's workload
(:class:`ess.tracegen.Workload`) describe each field with :func:`option`; ``ess``'s command line makes one flag per
field that names one (a field without a flag is set from Python only).
"""
from __future__ import annotations

from typing import Any, Callable

from .validate import positive_int

__all__ = ["option", "parse_tokens"]


def option(help: str, unit: str = "", flag: str | None = None, parse: Callable[[str], Any] | None = None,
           choices: Callable[[], list] | None = None) -> dict:
    """The metadata of one field: ``help`` (what it is), ``unit`` (its unit, or what it names), ``flag`` (its
    command-line flag, or ``None``), ``parse`` (text to value) and ``choices`` (a function listing the allowed
    texts)."""
    return {"help": help, "unit": unit, "flag": flag, "parse": parse, "choices": choices}


def parse_tokens(text: Any) -> int:
    """A token count from ``32768``, ``"32768"``, ``"32k"`` (x 1024) or ``"1M"`` (x 1024**2): a whole number
    >= 1 (a ``ValueError`` otherwise)."""
    if isinstance(text, str):
        t = text.strip().lower().replace("_", "")
        mult = {"k": 1024, "m": 1024 ** 2}.get(t[-1:], 1)
        num = t[:-1] if mult > 1 else t
        try:
            value = float(num) * mult if "." in num else int(num) * mult
        except ValueError:
            raise ValueError(f"expected a token count such as 32768, 32k or 1M, got {text!r}") from None
        if value != int(value):
            raise ValueError(f"expected a whole number of tokens, got {text!r}")
        return positive_int("context_len", int(value))
    return positive_int("context_len", text)
