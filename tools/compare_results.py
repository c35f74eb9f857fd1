"""Compare two ``build/results/`` trees record by record.

    python tools/compare_results.py BEFORE AFTER [--key OLD=NEW ...] [--name REGEX=>REPL ...] [--wall NB:REGEX ...]

For every notebook file (``NN_name.json``) in either tree, records are matched by name and compared field by field:
``value``, ``unit`` and ``published`` must be equal (exactly: floats bit for bit, NaN equal to NaN), ``source``,
``note`` and ``config`` are compared too and their differences listed. Two kinds of record are kept apart:

* **wall-clock** records: times measured on this machine (and ratios of them), non-deterministic by nature; they
  are matched by name only and listed, never compared by value. The built-in rules (``WALL_CLOCK``) name them by
  notebook and name, each with the unit it must carry (so that a rule cannot swallow a computed time, such as a
  transfer time derived from bytes and a link rate); ``--wall NB:REGEX`` adds one.
* **deterministic** records: everything else; any difference in value, unit or published value is a failure.

Renames: ``--key OLD=NEW`` renames a configuration key of BEFORE (at any depth, in dicts) before comparing; the
rule may be scoped to a parent key (``--key PARENT.OLD=NEW``: only inside the dict under ``PARENT``) and to records
(``--key 'NAME_REGEX:OLD=NEW'``: only in records whose AFTER name matches). ``--name REGEX=>REPL`` rewrites BEFORE's
record names (``re.sub``), so that a deliberate rename does not read as a missing record. Every rename that applied
is counted in the report.

Exit status: 0 when every deterministic value, unit and published value is identical and no record is missing on
either side; 1 otherwise. ``index.json`` is compared for its notebooks and record counts only (its seconds are
wall-clock).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

#: (notebook stem, record-name regex, unit): records whose values are wall-clock measurements
WALL_CLOCK = [
    ("03_sparse_attention", r"cost_(dense|sparse|indexer)_L\d+", "ms/step"),   # the measured dense/sparse scan
    ("03_sparse_attention", r"dense_over_sparse_at_max_L", "x"),              # a ratio of two of those times
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


def parse_key_rule(text: str) -> tuple[str | None, str | None, str, str]:
    """``[NAME_REGEX:][PARENT.]OLD=NEW`` -> ``(name_regex, parent, old, new)``."""
    scope, _, rule = text.rpartition(":") if ":" in text.split("=", 1)[0] else ("", "", text)
    old, sep, new = rule.partition("=")
    if not sep or not old or not new:
        raise argparse.ArgumentTypeError(f"expected [NAME_REGEX:][PARENT.]OLD=NEW, got {text!r}")
    parent, _, old = old.rpartition(".")
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


def load(tree: Path) -> dict[str, dict[str, dict]]:
    """``{notebook: {record name: record}}`` of every ``NN_name.json`` in ``tree`` (a results file of the current
    format, ``{"format": "ess-results/2", "run": ..., "records": [...]}``, or of the first, a bare list of records)."""
    out = {}
    for path in sorted(tree.glob("[0-9][0-9]_*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        records = data["records"] if isinstance(data, dict) else data
        names = [r["name"] for r in records]
        dup = [n for n, c in Counter(names).items() if c > 1]
        if dup:
            raise ValueError(f"{path}: repeated record names {dup}")
        out[path.stem] = {r["name"]: r for r in records}
    return out


def _short(v: Any, width: int = 100) -> str:
    s = json.dumps(v, sort_keys=True)
    return s if len(s) <= width else s[:width - 3] + "..."


def compare(before: Path, after: Path, *, keys: list[str] | None = None,
            names: list[tuple[str, str]] | None = None, wall: list[tuple[str, str, str | None]] | None = None) -> dict:
    """The comparison as a dict of lists (see the module docstring); ``report()`` prints it. ``keys`` are rename
    rules as ``--key`` takes them."""
    key_rules, names = [parse_key_rule(k) for k in (keys or [])], list(names or [])
    wall = list(WALL_CLOCK) + list(wall or [])
    b_all, a_all = load(before), load(after)
    used_keys: Counter = Counter()
    used_names: Counter = Counter()
    res: dict[str, list] = {k: [] for k in ("identical", "differ", "text", "wall_clock", "wall_unit", "missing",
                                            "added")}
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
                continue
            bad = [f for f in ("value", "unit", "published") if not same(b.get(f), a.get(f))]
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
    if bi.exists() and ai.exists():
        # the index lists the notebooks under "notebooks" (format ess-index/1) or at its top level (before it)
        b_idx, a_idx = (_index_notebooks(json.loads(p.read_text())) for p in (bi, ai))
        for nb in sorted(set(b_idx) | set(a_idx)):
            rb, ra = b_idx.get(nb, {}).get("records"), a_idx.get(nb, {}).get("records")
            if rb != ra:
                res["differ"].append(("index.json", nb, f"records {rb} -> {ra}"))
    res["renamed_keys"] = sorted(used_keys.items())
    res["renamed_names"] = sorted(used_names.items())
    return res


def _index_notebooks(index: dict) -> dict:
    """``{notebook: entry}`` of an ``index.json``, whichever format."""
    if index.get("format") == "ess-index/1":
        return index.get("notebooks", {})
    return {k: v for k, v in index.items() if isinstance(v, dict)}


def report(res: dict, out=sys.stdout, verbose: bool = False) -> bool:
    """Print the comparison; returns True when it passes."""
    p = lambda *a: print(*a, file=out)  # noqa: E731
    n_det = len(res["identical"]) + len(res["differ"])
    p(f"deterministic records: {n_det}, identical {len(res['identical'])}, different {len(res['differ'])}")
    p(f"wall-clock records (matched by name, values not compared): {len(res['wall_clock'])}")
    p(f"missing in AFTER: {len(res['missing'])}; added in AFTER: {len(res['added'])}")
    p(f"records with a different source, note or configuration: {len(res['text'])}")
    for title, key in (("configuration keys renamed (BEFORE -> AFTER, times applied)", "renamed_keys"),
                       ("record names renamed (rule, times applied)", "renamed_names")):
        if res[key]:
            p(f"\n{title}:")
            for what, n in res[key]:
                p(f"  {what}  x{n}")
    sections = [("DIFFERENT (deterministic)", "differ"), ("MISSING in AFTER", "missing"), ("ADDED in AFTER", "added"),
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
    ok = not (res["differ"] or res["missing"] or res["added"] or res["wall_unit"])
    p("\nPASS: every deterministic value, unit and published value is identical" if ok else "\nFAIL")
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
    for k in args.key:
        parse_key_rule(k)
    res = compare(args.before, args.after, keys=args.key, names=args.name, wall=args.wall)
    return 0 if report(res, verbose=args.verbose) else 1


if __name__ == "__main__":
    sys.exit(main())
