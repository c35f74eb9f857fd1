"""Mutation check: would the test suite notice a plausible mistake in the simulator or the cache simulation?

Run by hand (not in CI; minutes per module)::

    .venv/bin/python tools/mutation.py                       # every module below, every mutant
    .venv/bin/python tools/mutation.py --module costs --sample 40 --seed 1
    .venv/bin/python tools/mutation.py --module grid --sample 20 --quick      # the quick tier only

For each module it enumerates small mistakes in the source (AST mutations): an arithmetic operator flipped (+ -,
* /, // /, ** *), a comparison flipped or made strict/loose (< <=, > >=, == !=), a constant off by one (integers +1,
floats x 2), ``max``/``min`` (and ``np.maximum``/``np.minimum``) swapped, a term of a sum or difference dropped,
``and``/``or`` swapped, a ``not`` or unary minus removed, an augmented assignment flipped (+= -=, *= /=). Error
messages, docstrings and ``__all__`` are never mutated. Each mutant is written into a copy of the repository and
the module's own test files run against it (``pytest -x``, a timeout per mutant); the mutant is *killed* when they
fail (or time out), *survives* when they pass. The report gives the share killed per module and lists every
survivor with its line, to be read: some survivors are equivalent (the mutant computes the same thing, e.g. a
comparison flipped on a value that is never equal), the others name a missing test.

Writes ``build/mutation/report.json`` and prints a summary. Numba kernels are recompiled for every mutant of
``cachesim`` (its file changed), which is most of that module's time.
"""
from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# module -> the test files that exercise it (run with -x against each mutant)
MODULES = {
    "timeline": ("ess/sim/timeline.py", ["tests/test_sim_step_by_hand.py", "tests/test_sim_timeline.py",
                                         "tests/test_sim_overlap.py", "tests/test_sim_costs_models.py"]),
    "costs": ("ess/sim/costs.py", ["tests/test_sim_costs_by_hand.py", "tests/test_sim_costs.py",
                                     "tests/test_sim_costs_models.py"]),
    "cachesim": ("ess/cachesim.py", ["tests/test_cachesim.py", "tests/test_memory_safety.py::test_index_rows_copies_and_checks",
                                     "tests/test_memory_safety.py::test_the_caller_keeps_its_array_and_the_trace_keeps_its_copy"]),
    "overlap_measure": ("ess/studies/real_model/measure.py", ["tests/test_studies_real_model_check.py"]),
    "overlap_fit": ("ess/studies/real_model/fit.py", ["tests/test_studies_real_model_check.py"]),
    "overlap_check": ("ess/studies/real_model/check.py", ["tests/test_studies_real_model_check.py"]),
    "calibrate": ("ess/sim/calibrate.py", ["tests/test_sim_calibrate.py", "tests/test_band_coverage.py",
                                           "tests/test_calibrate_reference.py"]),
    "grid": ("ess/sim/grid.py", ["tests/test_sim_grid.py", "tests/test_tables_grid.py", "tests/test_grid_entries.py",
                                 "tests/test_grid_mutants.py"]),
}
# tests too slow to run for every mutant (seconds each on two cores), deselected; what they check is covered by the
# faster ones in the same files
DESELECT = {"cachesim": ["test_misses_per_layer_drift_runs_at_the_full_geometry"]}

_FLIP_BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
             ast.Pow: ast.Mult, ast.Mod: ast.FloorDiv}
_FLIP_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
             ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
_SWAP_NAMES = {"max": "min", "min": "max", "maximum": "minimum", "minimum": "maximum"}


def _protected(tree: ast.AST) -> set[int]:
    """ids of nodes never mutated: raise statements (messages), docstrings, f-strings, __all__, annotations."""
    out: set[int] = set()

    def mark(node):
        for n in ast.walk(node):
            out.add(id(n))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Raise, ast.JoinedStr)):
            mark(node)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Module, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                mark(body[0])
            if not isinstance(node, ast.Module):
                for a in ast.walk(node.args) if hasattr(node, "args") else ():
                    if isinstance(a, ast.arg) and a.annotation is not None:
                        mark(a.annotation)
                if getattr(node, "returns", None) is not None:
                    mark(node.returns)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            mark(node)
        elif isinstance(node, ast.AnnAssign):
            mark(node.annotation)
    return out


def mutation_points(tree: ast.AST) -> list[tuple[int, str, int]]:
    """Every (node id, kind, line) a mutant can change, in source order."""
    protected = _protected(tree)
    points = []
    for node in ast.walk(tree):
        if id(node) in protected:
            continue
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.BinOp) and type(node.op) in _FLIP_BIN:
            points.append((id(node), "flip", line))
            if isinstance(node.op, (ast.Add, ast.Sub)):
                points.append((id(node), "drop", line))
        elif isinstance(node, ast.AugAssign) and type(node.op) in _FLIP_BIN:
            points.append((id(node), "flip", line))
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _FLIP_CMP:
            points.append((id(node), "flip", line))
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float) and not isinstance(node.value, bool):
            if node.value != 0 or isinstance(node.value, int):
                points.append((id(node), "const", line))
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in _SWAP_NAMES:
                points.append((id(node), "swap", line))
        elif isinstance(node, ast.BoolOp):
            points.append((id(node), "flip", line))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            points.append((id(node), "drop", line))
    return sorted(points, key=lambda p: p[2])


class _Apply(ast.NodeTransformer):
    def __init__(self, target: int, kind: str):
        self.target, self.kind, self.done = target, kind, ""

    def generic_visit(self, node):
        node = super().generic_visit(node)
        if getattr(node, "_orig_id", None) != self.target:
            return node
        k = self.kind
        if isinstance(node, ast.BinOp) and k == "flip":
            self.done = f"{type(node.op).__name__} -> {_FLIP_BIN[type(node.op)].__name__}"
            node.op = _FLIP_BIN[type(node.op)]()
        elif isinstance(node, ast.BinOp) and k == "drop":
            self.done = f"drop the right operand of {type(node.op).__name__}"
            return node.left
        elif isinstance(node, ast.AugAssign):
            self.done = f"{type(node.op).__name__}= -> {_FLIP_BIN[type(node.op)].__name__}="
            node.op = _FLIP_BIN[type(node.op)]()
        elif isinstance(node, ast.Compare):
            self.done = f"{type(node.ops[0]).__name__} -> {_FLIP_CMP[type(node.ops[0])].__name__}"
            node.ops = [_FLIP_CMP[type(node.ops[0])]()]
        elif isinstance(node, ast.Constant):
            new = node.value + 1 if isinstance(node.value, int) else node.value * 2
            self.done = f"{node.value!r} -> {new!r}"
            node.value = new
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name):
                self.done = f"{f.id} -> {_SWAP_NAMES[f.id]}"
                f.id = _SWAP_NAMES[f.id]
            else:
                self.done = f"{f.attr} -> {_SWAP_NAMES[f.attr]}"
                f.attr = _SWAP_NAMES[f.attr]
        elif isinstance(node, ast.BoolOp):
            self.done = "and -> or" if isinstance(node.op, ast.And) else "or -> and"
            node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        elif isinstance(node, ast.UnaryOp):
            self.done = f"drop {type(node.op).__name__}"
            return node.operand
        return node


def mutants(source: str) -> list[dict]:
    """All mutants of ``source``: ``{"line", "what", "source"}``."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        node._orig_id = id(node)
    out = []
    for target, kind, line in mutation_points(tree):
        t = copy.deepcopy(tree)
        for a, b in zip(ast.walk(tree), ast.walk(t)):     # deepcopy keeps the attribute; ids differ: map them
            b._orig_id = a._orig_id
        ap = _Apply(target, kind)
        t = ap.visit(t)
        ast.fix_missing_locations(t)
        try:
            out.append({"line": line, "what": ap.done, "source": ast.unparse(t)})
        except Exception:                                  # noqa: BLE001 -- an unparsable mutant is skipped
            continue
    return out


def _copy_repo(dst: Path) -> None:
    for name in ("ess", "tests", "data", "notebooks", "docs", "book", "README.md", "pyproject.toml"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
        else:
            shutil.copy2(src, dst / name)


def run_tests(work: Path, tests: list[str], deselect: list[str], timeout: float,
              quick: bool = False) -> tuple[str, float]:
    """'passed', 'failed' or 'timeout', and the seconds taken (``quick``: the quick tier's tests only)."""
    existing = [t for t in tests if (work / t.split("::")[0]).exists()]
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", "-W", "ignore",
           *(["-m", "not slow and not browser"] if quick else []), *existing]
    for d in deselect:
        cmd += ["--deselect", d] if "::" in d else ["-k", f"not {d}"]
    env = {**os.environ, "PYTHONPATH": str(work), "PYTHONDONTWRITEBYTECODE": "1"}
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - t0
    return ("passed" if p.returncode == 0 else "failed"), time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--module", action="append", choices=sorted(MODULES), help="module(s) to mutate (default all)")
    ap.add_argument("--sample", type=int, default=0, help="at most this many mutants per module (0 = all)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the sample")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per mutant before it counts as killed")
    ap.add_argument("--quick", action="store_true", help="run only the quick tier of each module's tests (not slow, "
                                                         "not browser): does the quick tier alone catch the mistake?")
    ap.add_argument("--out", default=str(ROOT / "build" / "mutation" / "report.json"))
    args = ap.parse_args(argv)
    report = {"modules": {}, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    with tempfile.TemporaryDirectory(prefix="ess-mutation-") as tmp:
        work = Path(tmp)
        _copy_repo(work)
        for name in args.module or list(MODULES):
            rel, tests = MODULES[name]
            path = work / rel
            original = path.read_text(encoding="utf-8")
            stat = path.stat()
            status, base_s = run_tests(work, tests, DESELECT.get(name, []), args.timeout * 4, args.quick)
            if status != "passed":
                print(f"{name}: the tests fail on the unmutated code ({status}); skipped")
                continue
            ms = mutants(original)
            total = len(ms)
            if args.sample and len(ms) > args.sample:
                ms = sorted(random.Random(args.seed).sample(ms, args.sample), key=lambda m: m["line"])
            print(f"{name}: {total} mutants, running {len(ms)} (unmutated tests {base_s:.0f} s)", flush=True)
            killed, survivors, times = 0, [], []
            try:
                for i, m in enumerate(ms):
                    path.write_text(m["source"], encoding="utf-8")
                    status, dt = run_tests(work, tests, DESELECT.get(name, []), args.timeout, args.quick)
                    times.append(dt)
                    if status == "passed":
                        survivors.append({"line": m["line"], "what": m["what"],
                                          "code": original.splitlines()[m["line"] - 1].strip()})
                    else:
                        killed += 1
                    print(f"  [{i + 1}/{len(ms)}] line {m['line']:4d} {m['what']:<40s} {status:8s} {dt:5.1f} s",
                          flush=True)
            finally:
                path.write_text(original, encoding="utf-8")
                os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))    # the numba cache of the original stays valid
            score = killed / len(ms) if ms else float("nan")
            report["modules"][name] = {"file": rel, "tests": tests, "mutants_total": total, "mutants_run": len(ms),
                                       "sample_seed": args.seed if args.sample else None, "killed": killed,
                                       "score": score, "seconds": sum(times), "survivors": survivors}
            print(f"{name}: killed {killed} of {len(ms)} ({100 * score:.1f} %)", flush=True)
    runs = sum(m["mutants_run"] for m in report["modules"].values())
    kills = sum(m["killed"] for m in report["modules"].values())
    report["score"] = kills / runs if runs else float("nan")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(f"all: killed {kills} of {runs} ({100 * report['score']:.1f} %); report {out}")
    for name, m in report["modules"].items():
        for s in m["survivors"]:
            print(f"  survivor {name}:{s['line']}: {s['what']}  |  {s['code']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
