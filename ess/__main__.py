"""The ``ess`` command: ``ess reproduce [--smoke] [--only NAME ...] [--no-book]``, ``ess book``, ``ess list``."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ess", description="Latent-cache offload for sparse-attention decoding (ESS).")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("reproduce", help="execute every notebook, record its numbers, build the book")
    r.add_argument("--smoke", action="store_true", help="small parameters (CI sizes): minutes instead of the full run")
    r.add_argument("--only", action="append", metavar="NAME",
                   help="run only this notebook (e.g. 01 or 01_memory_wall); repeatable")
    r.add_argument("--no-book", action="store_true", help="skip the book build")
    r.add_argument("--build-dir", default=None, help="output folder (default: build/ at the repository root)")
    r.add_argument("--cell-timeout", type=int, default=None, metavar="SECONDS",
                   help="fail a notebook whose cell runs longer than this (default 1800)")
    b = sub.add_parser("book", help="build the book from the notebooks already executed in build/notebooks")
    b.add_argument("--build-dir", default=None)
    sub.add_parser("list", help="list the notebooks the pipeline runs")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from . import reproduce as rp

    if args.command == "list":
        for nb in rp.list_notebooks():
            print(nb.stem)
        return 0
    start = time.perf_counter()
    try:
        if args.command == "book":
            html = rp.build_book(build_dir=Path(args.build_dir) if args.build_dir else None)
            print(f"book: {html}")
            return 0
        build_dir = Path(args.build_dir) if args.build_dir else None
        runs = rp.run_all(smoke=args.smoke, only=args.only, book=not args.no_book, build_dir=build_dir,
                          cell_timeout_s=args.cell_timeout or rp.CELL_TIMEOUT_S)
    except (rp.ReproduceError, ValueError) as exc:
        print(f"ess reproduce: {exc}", file=sys.stderr)
        return 1
    for r in runs:
        print(f"{r.name:32s} {r.n_records:4d} records {r.seconds:7.1f} s  -> {r.results}")
    out = Path(build_dir or rp.ROOT / "build")
    if not args.no_book:
        print(f"book: {out / 'book' / '_build' / 'html' / 'index.html'}")
    print(f"done in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
