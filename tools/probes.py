"""Count the hostile-user probes by area and class (the numbers in the README's reliability section).

    .venv/bin/python tools/probes.py [--json build/probes.json]

Imports every ``tests/test_probe_*.py``, runs its ``PROBES`` (each in a fresh temporary folder) and prints one line per
area: how many probes ended in each class of ``tests/hostile.py``; then every probe that is not ``clear error`` or
``sensible``. Exit 1 when there is one.
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from hostile import CLASSES, bad_rows, run_probes  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the rows here as JSON")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as top:
        counter = collections.Counter()

        def tmp(name):
            counter[name] += 1
            d = Path(top) / f"{name}-{counter[name]}"
            d.mkdir(parents=True)
            return d

        for f in sorted((ROOT / "tests").glob("test_probe_*.py")):
            spec = importlib.util.spec_from_file_location(f.stem, f)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            rows += run_probes(mod.PROBES, tmp)
    by_area = collections.defaultdict(collections.Counter)
    for r in rows:
        by_area[r["area"]][r["class"]] += 1
    print(f"{'area':<10}" + "".join(f"{c:>13}" for c in CLASSES) + f"{'total':>8}")
    for area in sorted(by_area):
        c = by_area[area]
        print(f"{area:<10}" + "".join(f"{c[k]:>13}" for k in CLASSES) + f"{sum(c.values()):>8}")
    tot = collections.Counter(r["class"] for r in rows)
    print(f"{'all':<10}" + "".join(f"{tot[k]:>13}" for k in CLASSES) + f"{len(rows):>8}")
    bad = bad_rows(rows)
    for line in bad:
        print(line)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
