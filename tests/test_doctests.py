"""Every ``>>>`` example in the ``ess`` package runs as a doctest, and passes.

The modules are found by walking ``ess/`` for source files with a ``>>>`` line, so a new module's examples are
covered without editing this file. Each module must run every one of its examples: as many examples as ``>>>``
lines, none skipped (an example too slow to run belongs rewritten to a small case, not marked ``+SKIP``)."""
from __future__ import annotations

import doctest
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ess"
PROMPT = re.compile(r"^\s*>>>", re.MULTILINE)
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules_with_examples() -> list[str]:
    """The dotted names of every module of ``ess`` whose source holds a ``>>>`` line."""
    return sorted(_module_name(p) for p in PACKAGE.rglob("*.py")
                  if "__pycache__" not in p.parts and PROMPT.search(p.read_text(encoding="utf-8")))


MODULES = modules_with_examples()


def test_the_walk_finds_the_examples():
    assert "ess.storage" in MODULES and "ess.layout" in MODULES, MODULES
    assert all(m == "ess" or m.startswith("ess.") for m in MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_examples(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                      # an example that writes a file writes it here
    module = importlib.import_module(name)
    source = Path(module.__file__).read_text(encoding="utf-8")
    tests = [t for t in doctest.DocTestFinder(exclude_empty=True).find(module, name)
             if Path(t.filename or "").resolve() == Path(module.__file__).resolve()]
    examples = [ex for t in tests for ex in t.examples]
    assert len(examples) == len(PROMPT.findall(source)), (
        f"{name}: {len(PROMPT.findall(source))} '>>>' lines, but doctest finds {len(examples)} examples (an "
        f"example outside a docstring doctest reaches: a nested function, or an object imported from elsewhere)")
    skipped = [ex.source.strip() for ex in examples if ex.options.get(doctest.SKIP)]
    assert not skipped, f"{name}: examples marked +SKIP do not run: {skipped}"
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for t in tests:
        runner.run(t, out=report.append)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed:\n" + "".join(report)
    assert result.attempted == len(examples)
