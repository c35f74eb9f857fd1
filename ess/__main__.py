"""The ``ess`` command.

* ``ess plan --model glm-5 --gpu H100 --context 64k [--link L] [--mtp 2] [--ratio best] [--json]``: does latent
  offload pay, at which batch and ratio, how sure (:func:`ess.plan`); ``--serving`` prints the settings to
  deploy as JSON;
* ``ess simulate --batch 160 --context 32k --ratio 0.21 [--strategy dba] [--json]``: one configuration;
* ``ess misses --context 32k --ratio 0.2 [--mtp 2] [--steps 64] [--batch 4] [--locality central] [--json]``: the
  cache misses of a synthetic workload (:func:`ess.cachesim.misses_per_layer`);
* ``ess models`` / ``ess gpus`` / ``ess links``: the presets of ``data/`` with the source of each value;
* ``ess calibrate``: regenerate the stored calibration and miss tables (``data/generated``);
* ``ess reproduce [--smoke] [--only NAME ...] [--no-book] [--no-figures] [--build-dir DIR] [--notebooks-dir DIR]
  [--cell-timeout SECONDS]``, ``ess book [--build-dir DIR]``, ``ess list``: the reproduction pipeline.

The flags of ``plan``, ``simulate`` and ``misses`` are made from the fields of :class:`ess.planning.PlanRequest`,
:class:`ess.planning.SimulateRequest` and :class:`ess.tracegen.Workload` (help and unit in each field's metadata,
:func:`ess.options.option`). Errors are one line on stderr (no
traceback, whatever fails): exit 2 when the command line cannot be used (a flag or its value, an ``--only`` name
that matches no notebook or one named twice, a build folder that is refused, a notebooks folder that does not
exist), exit 1 when the run itself fails (a notebook, the book, the file system: its error names the file); an
interrupted run exits 130 (Ctrl-C) or 143 (SIGTERM).
"""
from __future__ import annotations

import argparse
import os
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


class _Parser(argparse.ArgumentParser):
    """argparse, with a command line that cannot be used said in one line (no usage block), exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {' '.join(message.split())} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ess", description="Latent-cache offload for sparse-attention decoding (ESS).")
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
    from .planning import PlanRequest, SimulateRequest
    pl = sub.add_parser("plan", help="does latent offload pay for a model on a GPU at a context? (ess.plan)")
    _request_flags(pl, PlanRequest)
    pl.add_argument("--json", action="store_true", help="print the whole plan as JSON")
    pl.add_argument("--serving", action="store_true", help="print the settings to deploy as JSON")
    pl.add_argument("--explain", action="store_true", help="also say what the plan needs and rests on")
    sm = sub.add_parser("simulate", help="simulate one configuration (batch, context, ratio)")
    _request_flags(sm, SimulateRequest)
    sm.add_argument("--json", action="store_true", help="print the result as JSON")
    for kind in ("models", "gpus", "links"):
        k = sub.add_parser(kind, help=f"list the {kind} of data/ with the source of each value")
        k.add_argument("--json", action="store_true", help="print as JSON")
    c = sub.add_parser("calibrate", help="regenerate data/generated (the stored calibration and miss tables)")
    c.add_argument("--out", default=None, type=_folder, help="write here instead of data/generated")
    ms = sub.add_parser("misses", help="cache misses of a synthetic workload at a sparse-memory ratio "
                                       "(ess.cachesim.misses_per_layer)")
    from .tracegen import Workload
    _request_flags(ms, Workload)
    ms.add_argument("--ratio", type=float, required=True, metavar="FRACTION",
                    help="sparse-memory ratio: share of each request's latent entries the GPU pool holds")
    ms.add_argument("--policy", default="lru", help="cache policy (ess.policies.POLICIES; default lru)")
    ms.add_argument("--no-warmup", action="store_true", help="start from an empty pool (no LRU-Warmup)")
    ms.add_argument("--json", action="store_true", help="print the result as JSON")
    rt = sub.add_parser("record-trace", help="record a transformers model's top-K sets as an ess trace (ess.hf)")
    rt.add_argument("--model", required=True, help="a transformers model folder, a .gguf file, or 'smollm2' (the "
                                                   "GGUF file ess installs)")
    rt.add_argument("--context", type=int, required=True, help="prompt tokens (the context at the first step)")
    rt.add_argument("--steps", type=int, required=True, help="decode steps to record")
    rt.add_argument("--batch", type=int, default=1, help="requests (text slices --stride tokens apart)")
    rt.add_argument("--topk", type=int, default=None, help="K of an MHA/GQA model (default context / 16; a DSA "
                                                           "model uses its own index_topk)")
    rt.add_argument("--skip", type=int, default=0, help="text tokens skipped before the first request's prompt")
    rt.add_argument("--stride", type=int, default=20000, help="text tokens between requests' prompts")
    rt.add_argument("--out", type=Path, required=True, help="the .npz trace to write")
    return p


def _request_flags(parser: argparse.ArgumentParser, request) -> None:
    """One flag per field of a request dataclass, from its metadata (help, unit, flag, parse, choices)."""
    import dataclasses

    for f in dataclasses.fields(request):
        meta = f.metadata
        parse = meta.get("parse")
        choices = meta.get("choices")

        def typed(text, parse=parse, choices=choices, name=meta["flag"]):
            if choices is not None and text not in choices():
                raise argparse.ArgumentTypeError(f"expected one of {', '.join(choices())}, got {text!r}")
            if parse is None:
                return text
            try:
                return parse(text)
            except (ValueError, TypeError) as exc:
                raise argparse.ArgumentTypeError(str(exc).splitlines()[0]) from None

        if meta["flag"] is None:                  # set from Python only
            continue
        required = f.default is dataclasses.MISSING
        default = "" if f.default is None or required else f" (default {f.default})"
        parser.add_argument(meta["flag"], dest=f.name, default=None if required else f.default, type=typed,
                            required=required, metavar=meta["unit"].split()[0].upper() if meta["unit"] else None,
                            help=f"{meta['help']}; {meta['unit']}{default}" if meta["unit"] else meta["help"])


def _flags_named(message: str) -> str:
    """An error of the library with each argument named as its flag (``context_len`` -> ``--context``)."""
    import dataclasses
    import re

    from .planning import PlanRequest, SimulateRequest
    from .tracegen import Workload
    flags = {f.name: f.metadata["flag"] for r in (PlanRequest, SimulateRequest, Workload)
             for f in dataclasses.fields(r) if f.metadata["flag"]}
    names = "|".join(sorted(flags, key=len, reverse=True))
    # a name as an argument: with an underscore anywhere, or a plain word followed by "must", "=", a quote, a number
    return re.sub(r"(?<![\w-])(" + names + r")(?![\w])(?=(?:\s+must|=|\s+'|\s+\d|[,;)]))|"
                  r"(?<![\w-])(\w+_\w+)(?![\w])",
                  lambda m: flags.get(m.group(1) or m.group(2), m.group(0)), message)


def _listing(kind: str, as_json: bool) -> int:
    import dataclasses
    import json

    from . import specs
    load, names = {"models": (specs.model_spec, specs.list_models), "gpus": (specs.gpu_spec, specs.list_gpus),
                   "links": (specs.host_link_spec, specs.list_host_links)}[kind]
    out = {}
    for n in names():
        spec = load(n)
        values = {k: v for k, v in dataclasses.asdict(spec).items() if k != "sources"}
        sources = getattr(spec, "sources", {}) or {}
        out[n] = {k: {"value": v, "source": sources.get(k, "")} for k, v in values.items()}
    if as_json:
        print(json.dumps(out, indent=1, default=list))
        return 0
    for n, fields in out.items():
        print(n)
        for k, e in fields.items():
            if k == "name":
                continue
            src = f"  [{e['source']}]" if e["source"] else ""
            print(f"  {k}: {e['value']}{src}")
    return 0


def _misses(args) -> int:
    """``ess misses``: the cache simulation of one synthetic workload at one ratio."""
    import dataclasses
    import json

    import numpy as np

    from .cachesim import sweep_synthetic
    from .tracegen import Workload
    w = Workload(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Workload) if f.metadata["flag"]})
    warmup = not args.no_warmup
    selected = np.zeros((w.n_layers, w.steps))
    per_step = sweep_synthetic(w, [args.ratio], policies=[args.policy], warmups=[warmup],
                               selected=selected)[(args.ratio, args.policy, warmup)]
    per_layer = per_step.mean(axis=1)
    out = {"workload": w.config(), "ratio": args.ratio, "policy": args.policy, "warmup": warmup,
           "misses_per_layer_mean": float(per_layer.mean()), "misses_per_layer_max": float(per_layer.max()),
           "worst_layer": int(per_layer.argmax()), "selected_per_layer_mean": float(selected.mean()),
           "hit_rate": float(1 - per_step.sum() / selected.sum()), "misses_per_layer": per_layer.tolist()}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{w.locality.label}: {w.batch} requests x {w.n_layers} layers x {w.steps} steps at {w.context_len:,} "
          f"tokens, MTP {w.mtp}, ratio {args.ratio:g}, {args.policy}{' with LRU-Warmup' if warmup else ''}")
    print(f"  {out['misses_per_layer_mean']:,.1f} misses per request, layer and step (of "
          f"{out['selected_per_layer_mean']:,.0f} entries selected: hit rate {out['hit_rate']:.1%}); most in layer "
          f"{out['worst_layer']} ({out['misses_per_layer_max']:,.1f})")
    return 0


def _face(args) -> int:
    """``plan``, ``simulate``, the listings and ``calibrate``."""
    import dataclasses
    import json

    if args.command in ("models", "gpus", "links"):
        return _listing(args.command, args.json)
    if args.command == "misses":
        return _misses(args)
    if args.command == "calibrate":
        from .planning import regenerate
        try:
            written = regenerate(args.out)
        except (OSError, RuntimeError) as exc:        # the run itself failed, not the command line
            print(f"ess calibrate: {exc}", file=sys.stderr)
            return 1
        for path in written:
            print(path)
        return 0
    from . import planning as pl
    if args.command == "plan":
        kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(pl.PlanRequest)}
        p = pl.plan(**kw)
        if args.json:
            print(json.dumps(p.to_dict(), indent=1))
        elif args.serving:
            print(json.dumps(p.serving(), indent=1))
        else:
            print(p.explain() if args.explain else p)
        return 0
    kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(pl.SimulateRequest)}
    r = pl.simulate_config(**kw)
    if args.json:
        print(json.dumps(r, indent=1))
    elif r["feasible"]:
        print(f"{r['model']} on {r['gpu']}, batch {r['batch']} per GPU at {r['context_len']:,} tokens, ratio "
              f"{r['ratio']:g}, MTP {r['mtp']}, {r['strategy']}: {r['throughput_per_gpu']:,.0f} tok/s per GPU "
              f"({r['throughput_per_node']:,.0f} per node); step {r['step_ms']:.1f} ms, of which "
              f"{r['stall_ms']:.1f} ms copies not hidden; {r['misses_per_layer']:,.0f} misses per request, step "
              f"and layer")
    else:
        print(f"infeasible: {r['reason']}")
    return 0


def _os_error(exc: OSError, args) -> str:
    """An error of the file system in one line, naming the file (for a temporary file ess was writing, its folder;
    for an error that names no file, such as a full disk, the folder the command writes to)."""
    from .pipeline.build_folder import ROOT, shorten

    what = exc.strerror or str(exc) or type(exc).__name__
    names = []
    for name in (exc.filename, exc.filename2):
        if name is None:
            continue
        path = Path(os.fsdecode(name))
        if path.name.startswith(".") and path.suffix == ".tmp":      # ess.atomic's file beside the one it writes
            path = path.parent
        names.append(shorten(path))
    if names:
        return f"{what}: {' -> '.join(dict.fromkeys(names))}"
    if args.command in ("reproduce", "book"):
        return f"{what} (writing to the build folder {shorten(args.build_dir or ROOT / 'build')})"
    return what


def main(argv: list[str] | None = None) -> int:
    """The ``ess`` command; every failure is one line on stderr and a non-zero exit (see the module docstring)."""
    args = _parser().parse_args(argv)
    try:
        return _command(args)
    except OSError as exc:                    # the file system refused (a full disk, no permission, a long name)
        print(f"ess {args.command}: {_os_error(exc, args)}", file=sys.stderr)
        return 1
    except RecursionError:
        print(f"ess {args.command}: an input is nested too deeply to be read", file=sys.stderr)
        return 1
    except MemoryError:
        print(f"ess {args.command}: out of memory", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 -- the promise: one line, never a traceback
        first = (str(exc).splitlines() or [""])[0][:300]
        print(f"ess {args.command}: unexpected {type(exc).__name__}: {first} (a bug of ess; please report it with "
              f"the command line)", file=sys.stderr)
        return 1


def _command(args) -> int:
    if args.command == "record-trace":
        from .hf.run import run_command
        try:
            run_command(args)
            return 0
        except (ValueError, TypeError) as exc:         # the command line cannot be used
            print(f"ess record-trace: {str(exc).splitlines()[0]}", file=sys.stderr)
            return 2
    if args.command in ("plan", "simulate", "misses", "models", "gpus", "links", "calibrate"):
        try:
            return _face(args)
        except (ValueError, TypeError) as exc:         # the question cannot be answered as asked
            print(f"ess {args.command}: {_flags_named(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)}",
                  file=sys.stderr)
            return 2
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
        print(f"ess {args.command}: {' | '.join(ln for ln in str(exc).splitlines() if ln.strip())}", file=sys.stderr)
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
