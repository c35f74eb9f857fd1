import json
import math

import numpy as np
import pytest

from ess.results import Record, Recorder, load_records


def test_roundtrip(tmp_path):
    path = tmp_path / "r" / "nb.json"
    rec = Recorder("nb", path)
    assert rec.record("a", np.int64(3), "B", config={"L": np.int32(7)}, published=4, source="x") == 3
    rec.record("b", np.float32(0.5), "", config={"arr": np.arange(2)})
    assert rec.save() == path
    rows = load_records(path)
    assert [r.name for r in rows] == ["a", "b"] and rows[0].config == {"L": 7} and rows[1].config["arr"] == [0, 1]
    assert rows[0].error == pytest.approx(-0.25)
    assert json.loads(path.read_text())[0]["published"] == 4


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
    assert [r.name for r in rec.records] == ["a"]


def test_frame():
    rec = Recorder("nb")
    rec.record("a", 2.0, "s", published=1.0, source="x")
    assert rec.to_frame().loc[0, "error"] == pytest.approx(1.0)


def test_record_requires_a_name():
    with pytest.raises(ValueError, match="name"):
        Record("", 1, "B")
