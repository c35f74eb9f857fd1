import json
import math

import numpy as np
import pytest

from ess import results as R
from ess.results import STATUSES, Record, Recorder, infer_status, load_records, load_results


def test_roundtrip(tmp_path):
    path = tmp_path / "r" / "nb.json"
    rec = Recorder("nb", path)
    assert rec.record("a", np.int64(3), "B", config={"L": np.int32(7)}, published=4, source="x",
                      role="calibration") == 3
    rec.record("b", np.float32(0.5), "", config={"arr": np.arange(2)}, low=0.25, high=np.float64(0.75),
               status="predicted")
    assert rec.save() == path
    res = load_results(path)
    rows = res.records
    assert [r.name for r in rows] == ["a", "b"] and rows[0].config == {"L": 7} and rows[1].config["arr"] == [0, 1]
    assert rows[0].error == pytest.approx(-0.25)
    kept = rec.records[1]
    assert type(kept.value) is float and type(kept.high) is float, "NumPy scalars become plain Python numbers"
    assert type(rec.records[0].value) is int and type(rec.records[0].config["L"]) is int
    assert (rows[1].low, rows[1].high) == (0.25, 0.75) and rows[1].in_band is True
    assert [r.status for r in rows] == ["calibrated", "predicted"] and res.status_inferred is False
    data = json.loads(path.read_text())
    assert data["format"] == R.RESULTS_FORMAT == "ess-results/3" and data["records"][0]["published"] == 4
    assert [r["status"] for r in data["records"]] == ["calibrated", "predicted"]


def test_every_results_file_says_which_notebook_smoke_or_full_and_when(tmp_path):
    for smoke, mode in ((True, "smoke"), (False, "full"), (None, "unknown")):
        path = tmp_path / f"{mode}.json"
        rec = Recorder("nb", path, smoke=smoke)
        rec.record("a", 1, "")
        rec.save()
        run = load_results(path).run
        assert (run["notebook"], run["mode"], run["smoke"]) == ("nb", mode, smoke)
        assert run["saved"].endswith("Z") and run["saved"][:4].isdigit()
    with pytest.raises(TypeError, match="smoke"):
        Recorder("nb", smoke="yes")


def test_files_of_the_first_format_still_read(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps([{"name": "x", "value": 2, "unit": "B", "config": {}, "published": None,
                                 "source": None, "note": ""},
                                {"name": "y", "value": 52, "unit": "", "published": 52, "source": "s",
                                 "note": "calibrated: fitted here"}]))
    res = load_results(path)
    assert [r.value for r in res.records] == [2, 52] and res.mode == "unknown" and res.run["format"] == 1
    assert [r.status for r in res.records] == ["computed", "calibrated"] and res.status_inferred is True


def test_files_of_the_second_format_still_read_with_the_status_inferred(tmp_path):
    path = tmp_path / "v2.json"
    rows = [{"name": "a", "value": 1, "unit": "", "config": {}, "published": 2, "source": "s",
             "note": "656 B FP8 entry", "low": None, "high": None},
            {"name": "b", "value": 3, "unit": "", "config": {}, "published": None, "source": None,
             "note": "held back: prediction", "low": 1, "high": 4}]
    path.write_text(json.dumps({"format": "ess-results/2", "run": {"notebook": "nb", "mode": "full"},
                                "records": rows, "figures": []}))
    res = load_results(path)
    assert [r.status for r in res.records] == ["compared", "held back (predicted)"] and res.status_inferred
    rows[0]["status"] = "reproduced"                          # the older format has no status field
    path.write_text(json.dumps({"format": "ess-results/2", "run": {}, "records": rows}))
    with pytest.raises(ValueError, match="unexpected fields .*status"):
        load_results(path)


_OK = '{"name": "x", "value": 1, "unit": "", "status": "computed"}'


@pytest.mark.parametrize("text, match", [
    ("{not json", "invalid JSON"), ('{"records": []}', "format"),
    ('{"format": "ess-results/3", "run": {}, "records": {}}', "records' list"),
    ('[{"name": "x", "value": 1, "unit": "", "colour": 3}]', "unexpected"),
    ('{"format": "ess-results/3", "records": [3]}', r"records\[0\] must be an object"),
    ('{"format": "ess-results/3", "records": [{"name": "x", "value": 1, "unit": ""}]}', "lacks .*status"),
    ('{"format": "ess-results/3", "records": [{"name": "x", "value": 1, "unit": "", "status": "great"}]}',
     "status must be one of"),
    ('{"format": "ess-results/3", "records": [{"name": 7, "value": 1, "unit": "", "status": "computed"}]}',
     "name must be a string"),
    ('{"format": "ess-results/3", "records": [{"name": "x", "value": [1, {"a": "b"}], "unit": 2, '
     '"status": "computed"}]}', "unit must be a string"),
    ('{"format": "ess-results/3", "records": [%s, %s]}' % (_OK, _OK), "appears twice"),
    ('{"format": "ess-results/3", "run": [], "records": []}', "'run' header must be an object"),
    ('{"format": "ess-results/3", "run": {"smoke": "yes"}, "records": []}', "run.smoke"),
    ('{"format": "ess-results/3", "run": {"mode": "fast"}, "records": []}', "run.mode"),
    ('{"format": "ess-results/3", "run": {"figures_dir": "../../etc"}, "records": []}', "inside the results"),
    ('{"format": "ess-results/3", "run": {"notebook": "a/b"}, "records": []}', "inside the results"),
    ('{"format": "ess-results/3", "records": [], "figures": ["../x"]}', "figure names"),
    ('{"format": "ess-results/3", "records": [], "figures": "fig"}', "figure names"),
    ('{"format": "ess-results/3", "records": [{"name": "x", "value": 1, "unit": "", "status": "computed", '
     '"low": 3, "high": 1}]}', "band is empty"),
    ('{"format": "ess-results/3", "records": [{"name": "x", "value": NaN, "unit": "", "status": "computed"}]}',
     "finite"),
])
def test_a_file_that_is_not_a_results_file_gets_a_clear_error(tmp_path, text, match):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=match) as info:
        load_records(path)
    assert str(path) in str(info.value)


def test_a_file_that_cannot_be_read_gets_a_clear_error(tmp_path):
    (tmp_path / "latin1.json").write_bytes(b'["\xff"]')
    with pytest.raises(ValueError, match="not UTF-8"):
        load_results(tmp_path / "latin1.json")
    with pytest.raises(ValueError, match="cannot read"):
        load_results(tmp_path / "missing.json")
    with pytest.raises(TypeError, match="path"):
        load_results(3)


def test_no_path_writes_nothing():
    assert Recorder("nb").save() is None


def test_rejects_bad_records():
    rec = Recorder("nb")
    rec.record("a", 1, "B")
    with pytest.raises(ValueError, match="already exists"):
        rec.record("a", 2, "B")
    with pytest.raises(ValueError, match="needs its source"):
        rec.record("c", 1, "B", published=2, status="compared")
    with pytest.raises(ValueError, match="finite"):
        rec.record("d", math.inf, "B")
    with pytest.raises(ValueError, match=r"value\[1\]\['x'\] must be finite"):
        rec.record("d2", [1, {"x": np.float64("nan")}], "B")
    rec.record("d3", 1, "B", config={"drift_rho": float("nan")})   # "not applicable" in a configuration
    assert math.isnan(rec.records[-1].config["drift_rho"])
    with pytest.raises(TypeError, match="value must be JSON data"):
        rec.record("d4", object(), "B")
    with pytest.raises(TypeError, match="config must have string keys"):
        rec.record("d5", 1, "B", config={(1, 2): 3})
    with pytest.raises(TypeError, match="record name must be a string"):
        rec.record(7, 1, "B")
    with pytest.raises(TypeError, match="config must be a dict"):
        rec.record("d6", 1, "B", config=[("L", 1)])
    with pytest.raises(TypeError, match="note must be a string"):
        rec.record("d7", 1, "B", note=None)
    with pytest.raises(ValueError, match="band is empty"):
        rec.record("e", 1, "B", low=2, high=1)
    with pytest.raises(TypeError, match="low"):
        rec.record("f", 1, "B", low="2")
    with pytest.raises(ValueError, match="high must be finite"):
        rec.record("g", 1, "B", high=math.nan)
    assert [r.name for r in rec.records] == ["a", "d3"]


@pytest.mark.parametrize("kwargs, status", [
    ({}, "computed"),
    ({"status": "predicted"}, "predicted"),
    ({"status": "bound"}, "bound"),
    ({"published": 52, "source": "s", "role": "calibration"}, "calibrated"),
    ({"published": 52, "source": "s", "role": "held_back"}, "held back (predicted)"),
    ({"published": 52, "source": "s", "role": "target", "status": "reproduced"}, "reproduced"),
    ({"published": 52, "source": "s", "role": "target", "status": "not reproduced"}, "not reproduced"),
    ({"published": 0.5, "source": "s", "status": "compared"}, "compared"),
    ({"published": 0.5, "source": "s", "status": "not reproduced"}, "not reproduced"),
])
def test_the_status_is_set_from_the_published_values_role_or_said(kwargs, status):
    rec = Recorder("nb")
    rec.record("x", 1, "", **kwargs)
    assert rec.records[0].status == status


@pytest.mark.parametrize("kwargs, error, match", [
    ({"published": 52, "source": "s"}, ValueError, "give its role .* or its status"),   # forgetting is an error
    ({"published": 52, "source": "s", "role": "target"}, ValueError, "say whether it is reproduced"),
    ({"published": 52, "source": "s", "role": "calibration", "status": "reproduced"}, ValueError,
     "allows status 'calibrated'"),
    ({"published": 52, "source": "s", "role": "target", "status": "predicted"}, ValueError,
     "'reproduced' or 'not reproduced'"),
    ({"role": "calibration"}, ValueError, "none was given"),
    ({"published": 52, "source": "s", "role": "calibrated"}, ValueError, "role must be one of"),
    ({"published": 52, "source": "s", "role": 1}, TypeError, "role must be one of"),
    ({"status": "great"}, ValueError, "status must be one of"),
    ({"status": "Computed"}, ValueError, "status must be one of"),
    ({"status": 3}, TypeError, "status must be one of"),
    ({"status": "compared"}, ValueError, "needs a published value"),
])
def test_a_status_that_does_not_fit_is_refused_and_nothing_is_recorded(kwargs, error, match):
    rec = Recorder("nb")
    with pytest.raises(error, match=match):
        rec.record("x", 1, "", **kwargs)
    assert rec.records == []


def test_a_record_cannot_be_made_without_a_status():
    with pytest.raises(TypeError, match="status"):
        Record("x", 1, "")
    assert Record("x", 1, "", status="computed").status == "computed"


def test_band_membership():
    assert Record("x", 5, "", low=1, status="predicted").in_band is True
    assert Record("x", 5, "", high=4, status="predicted").in_band is False
    assert Record("x", 5, "", status="computed").in_band is None
    assert Record("x", "infeasible", "", low=1, high=2, status="predicted").in_band is None


def test_frame():
    rec = Recorder("nb")
    rec.record("a", 2.0, "s", published=1.0, source="x", status="compared")
    frame = rec.to_frame()
    assert frame.loc[0, "error"] == pytest.approx(1.0) and frame.loc[0, "status"] == "compared"


def test_record_requires_a_name():
    with pytest.raises(ValueError, match="name"):
        Record("", 1, "B", status="computed")
    with pytest.raises(TypeError, match="name must be a string"):
        Record(None, 1, "B", status="computed")


@pytest.mark.parametrize("note, published, status", [
    # notes as the notebooks write them
    ("calibrated: mem_fraction_static was fitted on this limit", 52, "calibrated"),
    ("calibration residual +8.01%; read_from_chart=True", 400, "calibrated"),
    ("not reproduced: 1.58 GB over 61 layers", None, "not reproduced"),          # not "reproduced"
    ("8-bit quantisation halves the cache (article: 50 %): not reproduced; l", None, "not reproduced"),
    ("reproduced: predicted with the fraction fitted at 32K", 13, "reproduced"),  # not "predicted"
    ("held back: prediction; stall 1.6 ms", None, "held back (predicted)"),
    ("held-back result of the paper (warmup curves): prediction", None, "held back (predicted)"),
    ("bound: zero misses (only the D2H write-back of new tokens)", None, "bound"),
    ("bounded by gpu", None, "computed"),                                        # "bounded" is not "bound:"
    ("prediction", None, "predicted"),
    ("656 B FP8 entry vs 1,152 B BF16 entry", 0.5, "compared"),
    ("", None, "computed"),
])
def test_the_status_of_an_older_file_is_inferred_from_the_notes_standing(note, published, status):
    assert infer_status(note, published) == status
    assert status in STATUSES


def test_figures_are_kept_next_to_the_results(tmp_path):
    go = pytest.importorskip("plotly.graph_objects")
    fig = go.Figure(go.Bar(x=[1, 2], y=[3, 4]))
    rec = Recorder("07_demo", tmp_path / "results" / "07_demo.json")
    assert rec.figure("table", fig) is fig
    rec.save()
    saved = tmp_path / "results" / "07_demo.figures" / "table.json"
    assert json.loads(saved.read_text())["data"][0]["y"] == [3, 4]
    assert load_results(tmp_path / "results" / "07_demo.json").figures == ["table"]
    with pytest.raises(ValueError, match="already exists"):
        rec.figure("table", fig)
    with pytest.raises(ValueError, match="figure name"):
        rec.figure("../escape", fig)
    with pytest.raises(TypeError, match="plotly figure"):
        rec.figure("x", {"data": []})
    no_path = Recorder("nb")
    no_path.figure("f", fig)
    assert no_path.figures == ["f"] and no_path.figures_dir is None


def test_records_are_glued_for_the_book_only_inside_a_kernel(monkeypatch):
    glue = pytest.importorskip("myst_nb.ext.glue")
    shown = []
    monkeypatch.setattr(glue, "ipy_display", lambda data, raw, metadata: shown.append((data, metadata)))
    Recorder("nb").record("outside", 1, "")
    assert shown == []                                      # plain Python: nothing displayed
    monkeypatch.setattr(R, "_in_kernel", lambda: True)
    Recorder("nb").record("batch", np.int64(52), "requests/GPU")
    Recorder("nb").record("rate", np.float64(0.5), "")          # NumPy's float64 is glued as a plain float
    (data, metadata), (rate, _) = shown
    assert metadata["scrapbook"] == {"name": "batch", "mime_prefix": glue.GLUE_PREFIX}
    assert data == {glue.GLUE_PREFIX + "text/plain": "52"}   # hidden in the notebook, {glue:text} in the book
    assert rate == {glue.GLUE_PREFIX + "text/plain": "0.5"}
