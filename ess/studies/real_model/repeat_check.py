"""Run notebook 09's overlap check several times in a row and say how often it meets its goal.

One run of the check (:func:`ess.studies.real_model.check.run_check`) times real decode steps on a shared machine, so
its errors move from run to run. This runs the same design again and again (the notebook's own parameters, read
from its parameters cell, or the ones given), one prefill for all, and reports each run's held-out median and worst
error, its worst configuration, the fitted rule's error on its own calibration runs, whether the goal
(:data:`~ess.studies.real_model.check.GOAL`) was met, and the machine's load average::

    python -m ess.studies.real_model.repeat_check --runs 5                 # notebook 09's design
    python -m ess.studies.real_model.repeat_check --runs 3 --steps 9       # the same with more timed steps

Writes ``build/engine_check/repeat-<UTC time>-<pid>.json`` (a new file per invocation, never one it did not
create), rewritten atomically after every run, so that an interrupt keeps every run that finished; shows a progress
bar and prints one line per run and how many met the goal.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from ... import validate
from .check import GOAL, CheckDesign, check_prefills, run_check

__all__ = ["DESIGN_PARAMETERS", "NOTEBOOK", "notebook_parameters", "notebook_design", "repeat_check", "main"]

#: notebook 09's parameters that make its check's design (:class:`CheckDesign`'s arguments, in order), and the
#: clock and timed steps
DESIGN_PARAMETERS = ("calibration_contexts", "calibration_batches", "calibration_ratio", "calibration_links_GB_per_s",
                     "held_out_contexts", "held_out_batches", "held_out_ratio", "held_out_links_GB_per_s")
#: the notebook whose parameters give the design by default (from the repository root)
NOTEBOOK = Path("notebooks") / "09_real_model.ipynb"


def notebook_parameters(path=None) -> dict:
    """The values of a notebook's parameters cell (:func:`ess.parameters.notebook_parameters`; default:
    :data:`NOTEBOOK`)."""
    from ...parameters import notebook_parameters as read
    path = NOTEBOOK if path is None else validate.path("path", path)
    if not path.is_file():
        raise FileNotFoundError(f"no notebook at {path} (run from the repository root, or give --notebook)")
    return read(path)


def notebook_design(path=None, *, steps: int | None = None) -> tuple[CheckDesign, int]:
    """``(design, threads)``: the check's design as the notebook's parameters give it (``check_steps``,
    ``check_clock``; ``steps`` in place of ``check_steps`` when given), and its torch thread count."""
    params = notebook_parameters(path)
    missing = [p for p in DESIGN_PARAMETERS + ("check_steps", "check_clock", "threads") if p not in params]
    if missing:
        raise ValueError(f"the notebook's parameters lack {missing}")
    steps = params["check_steps"] if steps is None else validate.positive_int("steps", steps)
    design = CheckDesign(*(params[p] for p in DESIGN_PARAMETERS), steps=steps, clock=params["check_clock"])
    return design, validate.positive_int("threads", params["threads"])


def repeat_check(engine, design: CheckDesign, runs: int, *, out=None, prefills: dict | None = None,
                 progress: bool = True):
    """Run the check of ``design`` ``runs`` times on ``engine`` (one prefill for all, :func:`check_prefills`, unless
    ``prefills`` are given). Returns one row per run: ``run``, ``started`` (UTC), ``seconds``, the check's
    :meth:`~ess.studies.real_model.check.OverlapCheck.summary`, and ``loadavg_1`` (at the end of the run). With ``out``
    (a path), the rows so far and the design are written there after every run (atomically)."""
    import pandas as pd
    from tqdm.auto import tqdm

    from ...atomic import write_json_atomic
    if not isinstance(design, CheckDesign):
        raise TypeError(f"design must be a CheckDesign, got {type(design).__name__}")
    runs = validate.positive_int("runs", runs)
    out = None if out is None else validate.path("out", out)
    prefills = check_prefills(engine, design) if prefills is None else prefills
    rows = []
    for i in tqdm(range(runs), desc="checks", unit="check", disable=not progress):
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        t0 = time.perf_counter()
        check = run_check(engine, design, prefills, progress=False)
        rows.append({"run": i + 1, "started": started, "seconds": time.perf_counter() - t0, **check.summary(),
                     "loadavg_1": os.getloadavg()[0] if hasattr(os, "getloadavg") else None})
        if out is not None:
            write_json_atomic(out, {"format": "ess-repeat-check/1", "design": design.describe(), "goal": GOAL,
                                    "runs": rows})
    return pd.DataFrame(rows)


def _line(r) -> str:
    return (f"run {r['run']}: median {r['median']:.1%}, worst {r['worst']:.1%} ({r['worst_config']}), calibration "
            f"{r['calibration_median']:.1%} / {r['calibration_worst']:.1%}, own {r['own']:.1%} vs serial "
            f"{r['serial_gap']:.1%}, goal {'met' if r['goal_met'] else 'MISSED'}, load {r['loadavg_1']:.2f}, "
            f"{r['seconds']:.0f} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ess.studies.real_model.repeat_check", description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="how many times to run the check (default 5)")
    p.add_argument("--steps", type=int, default=None, help="timed decode steps per configuration (default: the "
                                                           "notebook's check_steps)")
    p.add_argument("--notebook", default=str(NOTEBOOK), help="the notebook whose parameters give the design "
                                                             f"(default: {NOTEBOOK})")
    p.add_argument("--out-dir", default="build/engine_check", help="folder of the report (default build/engine_check)")
    args = p.parse_args(argv)
    try:
        design, threads = notebook_design(args.notebook, steps=args.steps)
        validate.positive_int("runs", args.runs)
    except (TypeError, ValueError, OSError) as exc:
        print(f"repeat_check: {exc}", file=sys.stderr)
        return 2
    import torch

    from ...engine import DecodeEngine
    torch.set_num_threads(threads)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"repeat-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}.json"
    table = repeat_check(DecodeEngine.load(), design, args.runs, out=out)
    for _, r in table.iterrows():
        print(_line(r))
    print(f"goal (median <= {GOAL['median']:.0%}, worst <= {GOAL['worst']:.0%}) met in {int(table.goal_met.sum())} "
          f"of {len(table)} runs; {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
