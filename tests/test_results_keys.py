"""Configuration keys that collide once written as JSON (ess.results): ``1`` and ``"1"`` are both the JSON key
"1"; one value was silently kept. The record is now refused, naming both keys."""
import numpy as np
import pytest

from ess.results import Record, Recorder


@pytest.mark.parametrize("config", [{1: "a", "1": "b"}, {"1": "a", 1: "b"}, {np.int64(2): 1, "2": 2},
                                    {"outer": {0.5: 1, "0.5": 2}}])
def test_keys_that_collide_in_json_are_refused(config):
    with pytest.raises(ValueError, match="collide") as info:
        Record("x", 1.0, "B", config, status="computed")
    msg = str(info.value)
    key = next(k for k in (config.get("outer") or config) if not isinstance(k, str))
    assert repr(key) in msg or str(key) in msg


def test_a_recorder_refuses_colliding_keys_without_recording(tmp_path):
    rec = Recorder("nb", tmp_path / "nb.json")
    with pytest.raises(ValueError, match="collide"):
        rec.record("x", 1.0, "B", config={1: "a", "1": "b"})
    assert rec.records == []


def test_distinct_keys_are_kept():
    rec = Record("x", 1.0, "B", {1: "a", "2": "b", 1.5: "c"}, status="computed")
    assert rec.config == {"1": "a", "2": "b", "1.5": "c"}
