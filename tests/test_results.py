import json
import math

import numpy as np
import pytest

from ess import results as R
from ess.results import Record, Recorder, load_records, load_results, record_status


def test_roundtrip(tmp_path):
    path = tmp_path / "r" / "nb.json"
    rec = Recorder("nb", path)
    assert rec.record("a", np.int64(3), "B", config={"L": np.int32(7)}, published=4, source="x") == 3
    rec.record("b", np.float32(0.5), "", config={"arr": np.arange(2)}, low=0.25, high=np.float64(0.75))
    assert rec.save() == path
    rows = load_records(path)
    assert [r.name for r in rows] == ["a", "b"] and rows[0].config == {"L": 7} and rows[1].config["arr"] == [0, 1]
    assert rows[0].error == pytest.approx(-0.25)
    assert (rows[1].low, rows[1].high) == (0.25, 0.75) and rows[1].in_band is True
    data = json.loads(path.read_text())
    assert data["format"] == R.RESULTS_FORMAT and data["records"][0]["published"] == 4


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
                                 "source": None, "note": ""}]))
    res = load_results(path)
    assert [r.value for r in res.records] == [2] and res.mode == "unknown" and res.run["format"] == 1


@pytest.mark.parametrize("text, match", [("{not json", "invalid JSON"), ('{"records": []}', "format"),
                                         ('{"format": "ess-results/2", "run": {}, "records": {}}', "records"),
                                         ('[{"name": "x", "value": 1, "unit": "", "colour": 3}]', "unexpected")])
def test_a_file_that_is_not_a_results_file_gets_a_clear_error(tmp_path, text, match):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=match) as info:
        load_records(path)
    assert str(path) in str(info.value)


def test_no_path_writes_nothing():
    assert Recorder("nb").save() is None


def test_rejects_bad_records():
    rec = Recorder("nb")
    rec.record("a", 1, "B")
    with pytest.raises(ValueError, match="already exists"):
        rec.record("a", 2, "B")
    with pytest.raises(ValueError, match="needs its source"):
        rec.record("c", 1, "B", published=2)
    with pytest.raises(ValueError, match="finite"):
        rec.record("d", math.inf, "B")
    with pytest.raises(ValueError, match="band is empty"):
        rec.record("e", 1, "B", low=2, high=1)
    with pytest.raises(TypeError, match="low"):
        rec.record("f", 1, "B", low="2")
    with pytest.raises(ValueError, match="high must be finite"):
        rec.record("g", 1, "B", high=math.nan)
    assert [r.name for r in rec.records] == ["a"]


def test_band_membership():
    assert Record("x", 5, "", low=1).in_band is True
    assert Record("x", 5, "", high=4).in_band is False
    assert Record("x", 5, "").in_band is None
    assert Record("x", "infeasible", "", low=1, high=2).in_band is None


def test_frame():
    rec = Recorder("nb")
    rec.record("a", 2.0, "s", published=1.0, source="x")
    assert rec.to_frame().loc[0, "error"] == pytest.approx(1.0)


def test_record_requires_a_name():
    with pytest.raises(ValueError, match="name"):
        Record("", 1, "B")


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
def test_record_status_reads_the_notes_standing(note, published, status):
    rec = Record("x", 1.0, "", published=published, source="s" if published is not None else None, note=note)
    assert record_status(rec) == status


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
    (data, metadata), = shown
    assert metadata["scrapbook"] == {"name": "batch", "mime_prefix": glue.GLUE_PREFIX}
    assert data == {glue.GLUE_PREFIX + "text/plain": "52"}   # hidden in the notebook, {glue:text} in the book
