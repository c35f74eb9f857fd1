"""Append one run of notebook 09's real-model check to ``data/history/engine_check_runs.yaml`` (every run of the
held-out set is kept, as it came):

    .venv/bin/python tools/record_check_run.py BUILD_DIR [--note TEXT]

Reads ``BUILD_DIR/results/09_real_model.json`` (a full run), checks that its held-out set is the registered one
(``data/calibration/engine_check.yaml``, by hash), and appends the prediction's and the measured-input variant's
median and worst errors, the calibration runs' own, the worst configuration, when and at which commit it ran. A run
already in the file (same start time) is not added twice. Writes the file anew and swaps it in.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ess.atomic import write_text_atomic  # noqa: E402

HISTORY = ROOT / "data" / "history" / "engine_check_runs.yaml"
FIELDS = {"prediction_median": "step_time_err_median_held_out", "prediction_worst": "step_time_err_worst_held_out",
          "measured_inputs_median": "step_time_err_median_held_out_measured_inputs",
          "measured_inputs_worst": "step_time_err_worst_held_out_measured_inputs",
          "calibration_median": "step_time_err_median_calibration",
          "calibration_worst": "step_time_err_worst_calibration"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build", type=Path)
    ap.add_argument("--note", default="", help="what else to say of this run (the machine, its load)")
    ap.add_argument("--history", type=Path, default=HISTORY, help=argparse.SUPPRESS)       # tests
    args = ap.parse_args(argv)
    path = args.build / "results" / "09_real_model.json"
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"record_check_run: cannot read {path}: {exc}", file=sys.stderr)
        return 2
    recs = {r["name"]: r for r in d.get("records", [])}
    reg = yaml.safe_load((ROOT / "data" / "calibration" / "engine_check.yaml").read_text())["held_out"]
    head = recs.get(FIELDS["prediction_median"])
    run = d.get("run", {})
    if head is None or run.get("mode") != "full" or head["config"].get("held_out_sha256") != reg["sha256"]:
        print(f"record_check_run: {path} is not a full run of the registered held-out set", file=sys.stderr)
        return 2
    started = run.get("started")
    history = yaml.safe_load(args.history.read_text(encoding="utf-8"))
    if any(r.get("started") == started for r in history["runs"]):
        print(f"record_check_run: the run started {started} is already recorded")
        return 0
    # the commit the run executed, as its run index recorded it (not this checkout's HEAD, which may be later)
    index = args.build / "results" / "index.json"
    try:
        commit = (json.loads(index.read_text(encoding="utf-8"))["run"].get("versions") or {}).get("git_commit") or ""
    except (OSError, ValueError, KeyError, AttributeError):
        commit = ""
    if not commit:
        print(f"record_check_run: {index} does not say which commit the run executed (run.versions.git_commit)",
              file=sys.stderr)
        return 2
    commit = commit[:7]
    entry = {"value": {k: round(float(recs[n]["value"]), 4) for k, n in FIELDS.items()},
             "worst_config": recs[FIELDS["prediction_worst"]]["config"].get("worst_config"),
             "started": started,
             "source": f"build/results/09_real_model.json of a full run at ess commit {commit}"
                       + (f"; {args.note}" if args.note else "")}
    history["runs"].append(entry)
    header = "".join(line + "\n" for line in args.history.read_text(encoding="utf-8").splitlines()
                     if line.startswith("#"))
    write_text_atomic(args.history, header + yaml.safe_dump(history, sort_keys=False, width=120))
    print(f"recorded run {len(history['runs'])}: prediction {entry['value']['prediction_median']:.1%} / "
          f"{entry['value']['prediction_worst']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
