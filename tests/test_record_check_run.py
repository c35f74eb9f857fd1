"""tools/record_check_run.py: a full run of the registered held-out set is appended to the history once, as it came;
a smoke run or another set is refused."""
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "record_check_run.py"
SHA = yaml.safe_load((ROOT / "data" / "calibration" / "engine_check.yaml").read_text())["held_out"]["sha256"]


def _build(tmp, mode="full", sha=SHA, commit="0123456789abcdef"):
    names = ["step_time_err_median_held_out", "step_time_err_worst_held_out",
             "step_time_err_median_held_out_measured_inputs", "step_time_err_worst_held_out_measured_inputs",
             "step_time_err_median_calibration", "step_time_err_worst_calibration"]
    recs = [{"name": n, "value": 0.01 * (i + 1), "config": {"held_out_sha256": sha, "worst_config": "B=6"}}
            for i, n in enumerate(names)]
    (tmp / "results").mkdir(parents=True)
    (tmp / "results" / "09_real_model.json").write_text(json.dumps(
        {"run": {"mode": mode, "started": "2026-01-01T00:00:00Z"}, "records": recs}))
    (tmp / "results" / "index.json").write_text(json.dumps(
        {"run": {"mode": mode, **({"versions": {"git_commit": commit}} if commit else {})}}))
    return tmp


def _run(build, history):
    return subprocess.run([sys.executable, str(TOOL), str(build), "--history", str(history)], capture_output=True,
                          text=True)


def test_a_full_run_is_appended_once(tmp_path):
    history = tmp_path / "h.yaml"
    history.write_text("# runs\nruns: []\n")
    b = _build(tmp_path / "b")
    assert _run(b, history).returncode == 0
    got = yaml.safe_load(history.read_text())["runs"]
    assert len(got) == 1 and got[0]["value"]["prediction_median"] == 0.01 and got[0]["value"][
        "calibration_worst"] == 0.06
    assert history.read_text().startswith("# runs\n")
    assert "at ess commit 0123456 " in got[0]["source"] + " "          # the commit the run executed, not HEAD
    assert _run(b, history).returncode == 0 and len(yaml.safe_load(history.read_text())["runs"]) == 1


def test_a_smoke_run_or_another_set_is_refused(tmp_path):
    history = tmp_path / "h.yaml"
    history.write_text("runs: []\n")
    for b in (_build(tmp_path / "s", mode="smoke"), _build(tmp_path / "o", sha="0" * 64)):
        p = _run(b, history)
        assert p.returncode == 2 and "not a full run of the registered held-out set" in p.stderr
    assert yaml.safe_load(history.read_text())["runs"] == []


def test_a_run_that_does_not_say_its_commit_is_refused(tmp_path):
    history = tmp_path / "h.yaml"
    history.write_text("runs: []\n")
    p = _run(_build(tmp_path / "b", commit=""), history)
    assert p.returncode == 2 and "git_commit" in p.stderr
    assert yaml.safe_load(history.read_text())["runs"] == []
