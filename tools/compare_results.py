"""Compare two ``build/results/`` trees record by record.

    python tools/compare_results.py BEFORE AFTER [--key OLD=NEW ...] [--name REGEX=>REPL ...] [--wall NB:REGEX ...]

For every notebook file (``NN_name.json``) in either tree, records are matched by name and compared field by field:
``value``, ``unit``, ``published`` and ``status`` must be equal (exactly: floats bit for bit, NaN equal to NaN),
``source``, ``note`` and ``config`` are compared too and their differences listed. The files are read with
:func:`ess.results.load_results` (every format it reads; a file of an older format has its records' status
inferred from their notes, and the report says which trees those are); a file that is not a results file is an
error naming it. Two kinds of record are kept apart:

* **wall-clock** records: times measured on this machine (and ratios of them), non-deterministic by nature; they
  are matched by name only and listed, never compared by value (their status is compared). The built-in rules (``WALL_CLOCK``) name them by
  notebook and name, each with the unit it must carry (so that a rule cannot swallow a computed time, such as a
  transfer time derived from bytes and a link rate); ``--wall NB:REGEX`` adds one.
* **deterministic** records: everything else; any difference in value, unit or published value is a failure.

Renames: ``--key OLD=NEW`` renames a configuration key of BEFORE (at any depth, in dicts) before comparing; the
rule may be scoped to a parent key (``--key PARENT.OLD=NEW``: only inside the dict under ``PARENT``) and to records
(``--key 'NAME_REGEX:OLD=NEW'``: only in records whose AFTER name matches). ``--name REGEX=>REPL`` rewrites BEFORE's
record names (``re.sub``), so that a deliberate rename does not read as a missing record. Every rename that applied
is counted in the report.

Exit status: 0 when every deterministic value, unit, published value and status is identical and no record is
missing on either side; 1 otherwise, and when there is nothing to compare (no record in either tree: two empty
folders are no evidence of anything); 2 for arguments that cannot be used (a tree that is not a folder, a rule or
regular expression that does not parse, a file in a tree that is not a results file or run index).
``index.json`` is compared for its notebooks and record counts only (its seconds are wall-clock).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from ess.pipeline.index import load_index  # noqa: E402
from ess.results import load_results  # noqa: E402

#: (notebook stem, record-name regex, unit): records whose values are wall-clock measurements
WALL_CLOCK = [
    ("03_sparse_attention", r"cost_(dense|sparse|indexer)_L\d+", "ms/step"),   # the measured dense/sparse scan
    ("03_sparse_attention", r"dense_over_sparse_at_max_L", "x"),              # a ratio of two of those times
    ("03_sparse_attention", r"dense_growth_over_context_growth|sparse_over_dense_at_max_L", "ratio"),  # the same
    # the real model's step times against the overlap formulas: errors of measured times (the compute thread's CPU
    # clock; notebook 09 says they move with the machine's load)
    ("09_real_model", r"step_time_err_.*|overlap_runs_priced_serial_median_gap", "fraction"),
    # what those errors rest on: the matrix products timed at each row count, the half-batch ratios measured and
    # priced from the fitted (measured) costs, the products' share of a predicted step, and the goal's verdict
    ("09_real_model", r"product_ms_.*", "ms"),
    ("09_real_model", r"half_batch_ratio_(measured|rule)_.*", "half / whole"),
    ("09_real_model", r"products_share_held_out_.*", "fraction"),
    ("09_real_model", r"step_time_goal_met", "bool"),
]


def same(a: Any, b: Any) -> bool:
    """Exact equality of JSON values; floats compared bit for bit (NaN equals NaN), int 1 differs from float 1.0
    only in type, which counts as a difference."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def _regex(what: str, text: Any) -> str:
    """A regular expression argument, checked: a ``ValueError`` naming it when it does not parse."""
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a regular expression (a string), got {text!r}")
    try:
        re.compile(text)
    except re.error as exc:
        raise ValueError(f"{what} {text!r} is not a regular expression ({exc})") from None
    return text


def parse_key_rule(text: str) -> tuple[str | None, str | None, str, str]:
    """``[NAME_REGEX:][PARENT.]OLD=NEW`` -> ``(name_regex, parent, old, new)``."""
    if not isinstance(text, str):
        raise TypeError(f"a key rule must be a string [NAME_REGEX:][PARENT.]OLD=NEW, got {text!r}")
    scope, _, rule = text.rpartition(":") if ":" in text.split("=", 1)[0] else ("", "", text)
    old, sep, new = rule.partition("=")
    if not sep or not old or not new:
        raise argparse.ArgumentTypeError(f"expected [NAME_REGEX:][PARENT.]OLD=NEW, got {text!r}")
    parent, _, old = old.rpartition(".")
    if scope:
        _regex("the key rule's NAME_REGEX", scope)
    return scope or None, parent or None, old, new


def rename_keys(obj: Any, rules: list, used: Counter, parent: str | None = None) -> Any:
    """``obj`` with dict keys renamed by ``rules`` (``(parent, old, new)``, parent ``None`` = any) at every depth;
    counts each rename in ``used``."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            key = k
            for p, old, new in rules:
                if key == old and (p is None or p == parent):
                    used[f"{(p + '.') if p else ''}{old} -> {new}"] += 1
                    key = new
                    break
            out[key] = rename_keys(v, rules, used, k)
        return out
    if isinstance(obj, list):
        return [rename_keys(v, rules, used, parent) for v in obj]
    return obj


def load(tree: Path, inferred: set | None = None) -> dict[str, dict[str, dict]]:
    """``{notebook: {record name: record}}`` of every ``NN_name.json`` in ``tree`` (read by
    :func:`ess.results.load_results`: any format it reads, a ``ValueError`` naming a file that is not one). The
    notebooks whose status was inferred (an older format) are added to ``inferred``."""
    out = {}
    for path in sorted(tree.glob("[0-9][0-9]_*.json")):
        if not path.is_file():                   # a folder, a pipe (reading it would wait forever), a device
            raise ValueError(f"{path}: not a results file (a folder, pipe or device)")
        try:
            results = load_results(path)
        except RecursionError:
            raise ValueError(f"{path}: not a results file (nested too deeply)") from None
        except ValueError as exc:
            if str(path) in str(exc):
                raise
            raise ValueError(f"{path}: not a results file ({str(exc)[:200]})") from None
        if results.status_inferred and inferred is not None:
            inferred.add(path.stem)
        out[path.stem] = {r.name: asdict(r) for r in results.records}
    return out


def _tree(what: str, value: Any) -> Path:
    if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{what} must be a folder (str or os.PathLike), got {type(value).__name__}")
    if not os.fspath(value) or not Path(value).is_dir():
        raise ValueError(f"{what} {value!r} is not a folder")
    return Path(value)


def _short(v: Any, width: int = 100) -> str:
    s = json.dumps(v, sort_keys=True)
    return s if len(s) <= width else s[:width - 3] + "..."


def compare(before: Path, after: Path, *, keys: list[str] | None = None,
            names: list[tuple[str, str]] | None = None, wall: list[tuple[str, str, str | None]] | None = None) -> dict:
    """The comparison as a dict of lists (see the module docstring); ``report()`` prints it. ``keys`` are rename
    rules as ``--key`` takes them; ``names`` ``(regex, replacement)`` pairs; ``wall`` ``(notebook, regex, unit or
    None)`` rules. Arguments that cannot be used are a ``TypeError`` / ``ValueError`` naming them."""
    before, after = _tree("before", before), _tree("after", after)
    for what, value in (("keys", keys), ("names", names), ("wall", wall)):
        if value is not None and (isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple))):
            raise TypeError(f"{what} must be a list, got {type(value).__name__}")
    key_rules, names = [parse_key_rule(k) for k in (keys or [])], list(names or [])
    for rule in names:
        if not isinstance(rule, (list, tuple)) or len(rule) != 2 or not isinstance(rule[1], str):
            raise TypeError(f"names must hold (regex, replacement) pairs, got {rule!r}")
        _regex("a --name rule's REGEX", rule[0])
    for rule in wall or []:
        if (not isinstance(rule, (list, tuple)) or len(rule) != 3 or not isinstance(rule[0], str)
                or not (rule[2] is None or isinstance(rule[2], str))):
            raise TypeError(f"wall must hold (notebook, regex, unit or None) rules, got {rule!r}")
        _regex("a --wall rule's REGEX", rule[1])
    wall = list(WALL_CLOCK) + list(wall or [])
    inferred_b, inferred_a = set(), set()
    b_all, a_all = load(before, inferred_b), load(after, inferred_a)
    used_keys: Counter = Counter()
    used_names: Counter = Counter()
    res: dict[str, list] = {k: [] for k in ("identical", "differ", "text", "wall_clock", "wall_unit", "wall_status",
                                            "missing", "added")}
    for nb in sorted(set(b_all) | set(a_all)):
        if nb not in a_all or nb not in b_all:
            side = "missing" if nb not in a_all else "added"
            res[side].append((nb, "*", "the whole notebook file"))
            continue
        b_recs = {}
        for name, r in b_all[nb].items():
            new = name
            for pat, repl in names:
                new2 = re.sub(pat, repl, new)
                if new2 != new:
                    used_names[f"{pat} => {repl}"] += 1
                new = new2
            rules = [(p, o, n) for scope, p, o, n in key_rules if scope is None or re.fullmatch(scope, new)]
            b_recs[new] = {**r, "name": new, "config": rename_keys(r.get("config", {}), rules, used_keys),
                           "old_name": name}
        a_recs = a_all[nb]
        for name in sorted(set(b_recs) - set(a_recs)):
            res["missing"].append((nb, b_recs[name]["old_name"], "not in AFTER"))
        for name in sorted(set(a_recs) - set(b_recs)):
            res["added"].append((nb, name, "not in BEFORE"))
        for name in sorted(set(b_recs) & set(a_recs)):
            b, a = b_recs[name], a_recs[name]
            rule = next((w for w in wall if w[0] == nb and re.fullmatch(w[1], name)), None)
            if rule is not None:
                if rule[2] is not None and (a["unit"] != rule[2] or b["unit"] != rule[2]):
                    res["wall_unit"].append((nb, name, f"unit {b['unit']!r} / {a['unit']!r}, rule says {rule[2]!r}"))
                res["wall_clock"].append((nb, name, f"{_short(b['value'], 40)} -> {_short(a['value'], 40)} "
                                                    f"{a['unit']}"))
                if not same(b.get("status"), a.get("status")):          # a status never depends on the clock
                    res["wall_status"].append((nb, name, f"status: {_short(b.get('status'))} -> "
                                                         f"{_short(a.get('status'))}"))
                continue
            bad = [f for f in ("value", "unit", "published", "status") if not same(b.get(f), a.get(f))]
            if bad:
                res["differ"].append((nb, name, "; ".join(f"{f}: {_short(b.get(f))} -> {_short(a.get(f))}"
                                                          for f in bad)))
            else:
                res["identical"].append((nb, name, ""))
            txt = [f for f in ("source", "note", "config") if not same(b.get(f), a.get(f))]
            if txt:
                res["text"].append((nb, name, "; ".join(f"{f}: {_short(b.get(f), 160)} -> {_short(a.get(f), 160)}"
                                                        for f in txt)))
    bi, ai = before / "index.json", after / "index.json"
    if (bi.exists() or bi.is_symlink()) and (ai.exists() or ai.is_symlink()):
        # the index lists the notebooks under "notebooks" (format ess-index/1) or at its top level (before it)
        b_idx, a_idx = (_index_notebooks(_read_index(p)) for p in (bi, ai))
        for nb in sorted(set(b_idx) | set(a_idx)):
            rb, ra = b_idx.get(nb, {}).get("records"), a_idx.get(nb, {}).get("records")
            if rb != ra:
                res["differ"].append(("index.json", nb, f"records {rb} -> {ra}"))
    res["renamed_keys"] = sorted(used_keys.items())
    res["renamed_names"] = sorted(used_names.items())
    res["status_inferred"] = [("BEFORE", nb) for nb in sorted(inferred_b)] + [("AFTER", nb) for nb in
                                                                              sorted(inferred_a)]
    return res


def _read_index(path: Path) -> dict:
    """An ``index.json``: one with a format through :func:`ess.pipeline.index.load_index` (checked), one of before
    the format as it is (a JSON object of notebooks)."""
    if not path.is_file():
        raise ValueError(f"{path}: not a run index (a folder, pipe or device)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{path}: not a run index ({str(exc)[:200]})") from None
    except RecursionError:
        raise ValueError(f"{path}: not a run index (nested too deeply)") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a run index (a JSON object)")
    return load_index(path) if "format" in data else data


def _index_notebooks(index: dict) -> dict:
    """``{notebook: entry}`` of an ``index.json``, whichever format."""
    if index.get("format") in ("ess-index/1", "ess-index/2"):
        return index.get("notebooks", {})
    return {k: v for k, v in index.items() if isinstance(v, dict)}


def report(res: dict, out=None, verbose: bool = False) -> bool:
    """Print the comparison (to ``out``, default stdout); returns True when it passes."""
    out = sys.stdout if out is None else out
    p = lambda *a: print(*a, file=out)  # noqa: E731
    n_det = len(res["identical"]) + len(res["differ"])
    p(f"deterministic records: {n_det}, identical {len(res['identical'])}, different {len(res['differ'])}")
    p(f"wall-clock records (matched by name, values not compared): {len(res['wall_clock'])}")
    p(f"missing in AFTER: {len(res['missing'])}; added in AFTER: {len(res['added'])}")
    p(f"records with a different source, note or configuration: {len(res['text'])}")
    if res.get("status_inferred"):
        p("status inferred from the notes (results files of an older format): "
          + ", ".join(f"{side} {nb}" for side, nb in res["status_inferred"]))
    for title, key in (("configuration keys renamed (BEFORE -> AFTER, times applied)", "renamed_keys"),
                       ("record names renamed (rule, times applied)", "renamed_names")):
        if res[key]:
            p(f"\n{title}:")
            for what, n in res[key]:
                p(f"  {what}  x{n}")
    sections = [("DIFFERENT (deterministic)", "differ"), ("DIFFERENT status of a wall-clock record", "wall_status"),
                ("MISSING in AFTER", "missing"), ("ADDED in AFTER", "added"),
                ("wall-clock rule with an unexpected unit", "wall_unit"), ("wall-clock records", "wall_clock"),
                ("source / note / configuration differences", "text")]
    for title, key in sections:
        rows = res[key]
        if not rows:
            continue
        if key == "text" and not verbose and len(rows) > 60:
            p(f"\n{title}: {len(rows)} (use --verbose to list them)")
            continue
        p(f"\n{title}:")
        for nb, name, what in rows:
            p(f"  {nb} {name}: {what}" if what else f"  {nb} {name}")
    if not (n_det or res["wall_clock"] or res["missing"] or res["added"]):
        p("\nNOTHING TO COMPARE: neither tree holds a record (NN_name.json results files with records); check the "
          "two folders")
        return False
    ok = not (res["differ"] or res["missing"] or res["added"] or res["wall_unit"] or res.get("wall_status"))
    p("\nPASS: every deterministic value, unit, published value and status is identical" if ok else "\nFAIL")
    return ok


def _pair(text: str, sep: str) -> tuple[str, str]:
    if sep not in text:
        raise argparse.ArgumentTypeError(f"expected OLD{sep}NEW, got {text!r}")
    a, b = text.split(sep, 1)
    return a, b


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--key", action="append", default=[],
                    help="rename a configuration key of BEFORE: [NAME_REGEX:][PARENT.]OLD=NEW (repeatable)")
    ap.add_argument("--name", action="append", default=[], type=lambda s: _pair(s, "=>"),
                    help="rewrite BEFORE's record names: REGEX=>REPL (re.sub, repeatable)")
    ap.add_argument("--wall", action="append", default=[], type=lambda s: (*_pair(s, ":"), None),
                    help="one more wall-clock rule: NOTEBOOK:REGEX (repeatable)")
    ap.add_argument("--verbose", action="store_true", help="list every source/note/configuration difference")
    args = ap.parse_args(argv)
    for d in (args.before, args.after):
        if not d.is_dir():
            ap.error(f"{d} is not a folder")
    try:
        for k in args.key:
            parse_key_rule(k)
        res = compare(args.before, args.after, keys=args.key, names=args.name, wall=args.wall)
    except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
        ap.error(str(exc))
    return 0 if report(res, verbose=args.verbose) else 1


if __name__ == "__main__":
    sys.exit(main())
