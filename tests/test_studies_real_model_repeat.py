"""The check repeated (ess.studies.real_model.repeat_check) and the check's summary (OverlapCheck.summary): the design read from
a notebook's parameters cell, the report kept whole after every run, bad input refused before anything runs; the
summary's numbers worked out by hand on a small table."""
import json
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pandas as pd
import pytest

from ess.studies.real_model import repeat_check as rc
from ess.studies.real_model.check import GOAL, CheckDesign, OverlapCheck

ROOT = Path(__file__).resolve().parent.parent


def _notebook(path, source):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# x"), nbformat.v4.new_code_cell(source, metadata={
        "tags": ["parameters"]}), nbformat.v4.new_code_cell("calibration_batches = [9]")]
    nbformat.write(nb, path)
    return path


_PARAMS = """calibration_contexts = [40, 60]
calibration_batches = [1, 2]
calibration_ratio = [0.5, 0.25]
calibration_links_GB_per_s = [0.05, 0.5]
held_out_contexts = [50]
held_out_batches = [3]
held_out_ratio = 0.75
held_out_links_GB_per_s = [0.1]
check_steps = 4
check_clock = "wall"
threads = 2
smoke = False
"""


def test_the_design_comes_from_the_parameters_cell_only(tmp_path):
    path = _notebook(tmp_path / "nb.ipynb", _PARAMS)
    design, threads = rc.notebook_design(path)
    # the later cell's calibration_batches = [9] is not a parameter
    assert design.calibration_batches == (1, 2) and design.calibration_ratios == (0.5, 0.25)
    assert design.held_out_batches == (3,) and design.steps == 4 and design.clock == "wall" and threads == 2
    assert rc.notebook_design(path, steps=6)[0].steps == 6
    with pytest.raises(ValueError, match="steps must be"):
        rc.notebook_design(path, steps=0)


def test_a_notebook_without_the_design_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"lack \['held_out_ratio'\]"):
        rc.notebook_design(_notebook(tmp_path / "a.ipynb", _PARAMS.replace("held_out_ratio = 0.75\n", "")))
    with pytest.raises(ValueError, match="threads is not a literal"):
        rc.notebook_parameters(_notebook(tmp_path / "b.ipynb", _PARAMS + "threads = os.cpu_count()\n"))
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1")]
    nbformat.write(nb, tmp_path / "c.ipynb")
    with pytest.raises(ValueError, match="no cell tagged 'parameters'"):
        rc.notebook_parameters(tmp_path / "c.ipynb")
    with pytest.raises(FileNotFoundError, match="no notebook at .*missing.ipynb"):
        rc.notebook_parameters(tmp_path / "missing.ipynb")


def test_notebook_09_holds_the_check_design():
    design, threads = rc.notebook_design(ROOT / rc.NOTEBOOK)
    assert isinstance(design, CheckDesign) and threads >= 1
    # held out means unseen: no held-out batch, context or link is a calibration one
    assert not set(design.held_out_batches) & set(design.calibration_batches)
    assert not set(design.held_out_contexts) & set(design.calibration_contexts)
    assert not set(design.held_out_links_GB_per_s) & set(design.calibration_links_GB_per_s)
    assert design.held_out_ratio not in design.calibration_ratios


def _fake_check(medians):
    """run_check's stand-in: the i-th call's summary has median medians[i]; a medians[i] of None raises."""
    calls = iter(medians)

    def run(engine, design, prefills, progress):
        m = next(calls)
        if m is None:
            raise KeyboardInterrupt
        return SimpleNamespace(summary=lambda: {"median": m, "worst": 3 * m, "goal_met": m <= 0.03})
    return run


def test_every_finished_run_is_on_disk_when_a_later_one_is_interrupted(tmp_path, monkeypatch):
    design = rc.notebook_design(_notebook(tmp_path / "nb.ipynb", _PARAMS))[0]
    out = tmp_path / "report.json"
    monkeypatch.setattr(rc, "run_check", _fake_check([0.02, 0.04]))
    table = rc.repeat_check(None, design, 2, out=out, prefills={}, progress=False)
    assert list(table.run) == [1, 2] and list(table.goal_met) == [True, False]
    report = json.loads(out.read_text())
    assert [r["median"] for r in report["runs"]] == [0.02, 0.04] and report["goal"] == GOAL
    assert report["design"]["held_out"] == design.describe()["held_out"]
    monkeypatch.setattr(rc, "run_check", _fake_check([0.01, None]))
    with pytest.raises(KeyboardInterrupt):
        rc.repeat_check(None, design, 3, out=out, prefills={}, progress=False)
    assert [r["median"] for r in json.loads(out.read_text())["runs"]] == [0.01]


def test_bad_arguments_are_refused_before_any_run(tmp_path, monkeypatch, capsys):
    design = rc.notebook_design(_notebook(tmp_path / "nb.ipynb", _PARAMS))[0]
    monkeypatch.setattr(rc, "run_check", _fake_check([]))          # a run would raise StopIteration
    with pytest.raises(ValueError, match="runs must be"):
        rc.repeat_check(None, design, 0, prefills={})
    with pytest.raises(TypeError, match="design must be a CheckDesign"):
        rc.repeat_check(None, {"steps": 3}, 1, prefills={})
    assert rc.main(["--runs", "0", "--out-dir", str(tmp_path / "o")]) == 2
    assert "runs must be" in capsys.readouterr().err and not (tmp_path / "o").exists()


def _table(held_errors, cal_errors, shares):
    rows = [{"role": "held out", "batch": 3 + i, "context_len": 384, "schedule": "da", "link_GB_per_s": 0.02,
             "error": e, "products_share": s} for i, (e, s) in enumerate(zip(held_errors, shares))]
    rows += [{"role": "calibration", "batch": 1, "context_len": 256, "schedule": "none", "link_GB_per_s": 0.005,
              "error": e, "products_share": 0.9} for e in cal_errors]
    return pd.DataFrame(rows)


def test_the_summary_by_hand():
    """Held out errors +0.02, -0.05, +0.15, -0.01: |.| 0.01, 0.02, 0.05, 0.15, median (0.02 + 0.05) / 2 = 0.035,
    worst 0.15 at batch 5, which meets the goal (both bounds inclusive). Calibration errors 0.01, -0.3, 0.04:
    median 0.04, worst 0.3 (never counted as held out). Products' shares 0.2, 0.4, 0.5, 0.3: median 0.35."""
    check = OverlapCheck(None, None, _table([0.02, -0.05, 0.15, -0.01], [0.01, -0.3, 0.04], [0.2, 0.4, 0.5, 0.3]),
                         [], [])
    check.serial_pricing_gap = lambda: (0.12, 0.03)
    s = check.summary()
    assert s["median"] == pytest.approx(0.035) and s["worst"] == pytest.approx(0.15) and s["goal_met"]
    assert s["worst_config"] == "B=5 L=384 da link=0.02 (+15.0%)"
    assert s["calibration_median"] == pytest.approx(0.04) and s["calibration_worst"] == pytest.approx(0.3)
    assert (s["serial_gap"], s["own"]) == (0.12, 0.03)
    assert s["products_share_median"] == pytest.approx(0.35) and s["products_share_max"] == 0.5
    missed = OverlapCheck(None, None, _table([0.02, -0.05, 0.151], [0.0], [0.1] * 3), [], [])
    missed.serial_pricing_gap = lambda: (0.1, 0.02)
    assert not missed.summary()["goal_met"]                            # worst 15.1 %
    wide = OverlapCheck(None, None, _table([0.051, -0.06, 0.01], [0.0], [0.1] * 3), [], [])
    wide.serial_pricing_gap = lambda: (0.1, 0.02)
    assert not wide.summary()["goal_met"]                              # median 5.1 %, worst 6 %
