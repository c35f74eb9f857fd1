"""The ``ess`` command: ``ess reproduce [--smoke] [--only NAME ...] [--no-book] [--no-figures] [--build-dir DIR]
[--notebooks-dir DIR] [--cell-timeout SECONDS]``, ``ess book [--build-dir DIR]``, ``ess list``.

Errors are one line on stderr (no traceback): exit 2 when the command line cannot be used (a flag or its value,
an ``--only`` name that matches no notebook or one named twice, a build folder that is refused, a notebooks folder
that does not exist), exit 1 when the run itself fails (a notebook, the book); an interrupted run exits 130
(Ctrl-C) or 143 (SIGTERM).
"""
from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path


def _positive_seconds(text: str) -> int:
    from .pipeline import check_cell_timeout

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of seconds, got {text!r}") from None
    try:
        return check_cell_timeout(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("cell_timeout_s must be", "expected")) from None


def _folder(text: str) -> Path:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder, got an empty path")
    if "\0" in text:
        raise argparse.ArgumentTypeError(f"expected a folder, got {text!r}")
    return Path(text)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ess", description="Latent-cache offload for sparse-attention decoding (ESS).")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("reproduce", help="execute every notebook, record its numbers, build the book")
    r.add_argument("--smoke", action="store_true", help="small parameters (CI sizes): minutes instead of the full run")
    r.add_argument("--only", action="append", metavar="NAME",
                   help="run only this notebook (e.g. 01 or 01_memory_wall); repeatable")
    r.add_argument("--no-book", action="store_true", help="skip the book build")
    r.add_argument("--no-figures", action="store_true", help="skip the static figure export (build/figures)")
    r.add_argument("--build-dir", default=None, type=_folder,
                   help="output folder: one ess created, or an empty or new one, holding none of the inputs "
                        "(default: build/ at the repository root)")
    r.add_argument("--notebooks-dir", default=None, metavar="DIR", type=_folder,
                   help="run the NN_name.ipynb notebooks of this folder instead of the repository's notebooks/")
    r.add_argument("--cell-timeout", type=_positive_seconds, default=None, metavar="SECONDS",
                   help="fail a notebook whose cell runs longer than this many seconds (default 1800)")
    b = sub.add_parser("book", help="build the book from the notebooks already executed in build/notebooks")
    b.add_argument("--build-dir", default=None, type=_folder, help="the build folder of an earlier `ess reproduce`")
    sub.add_parser("list", help="list the notebooks the pipeline runs")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from . import pipeline as rp

    if args.command == "list":
        for nb in rp.list_notebooks():
            print(nb.stem)
        return 0
    start = time.perf_counter()
    try:
        if args.command == "book":
            html = rp.build_book(build_dir=args.build_dir)
            print(f"book: {html}")
            return 0
        runs = rp.run_all(smoke=args.smoke, only=args.only, book=not args.no_book, build_dir=args.build_dir,
                          notebooks_dir=args.notebooks_dir, figures=not args.no_figures,
                          cell_timeout_s=args.cell_timeout or rp.CELL_TIMEOUT_S)
    except (rp.BuildDirError, ValueError, TypeError) as exc:        # the command line cannot be used
        print(f"ess {args.command}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
              file=sys.stderr)
        return 2
    except rp.ReproduceError as exc:
        print(f"ess {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:                 # Ctrl-C, or SIGTERM / SIGHUP (RunInterrupted)
        signame = getattr(exc, "signame", "SIGINT")
        print(f"ess {args.command}: interrupted ({signame}); results/index.json in the build folder says what "
              f"ran", file=sys.stderr)
        return 128 + signal.Signals[signame].value
    for r in runs:
        print(f"{r.name:32s} {r.n_records:4d} records {r.seconds:7.1f} s  -> {r.results}")
    out = runs[0].results.parent.parent if runs else Path(args.build_dir or rp.ROOT / "build")
    if not args.no_book:
        print(f"book: {out / 'book' / '_build' / 'html' / 'index.html'}")
    print(f"done in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
