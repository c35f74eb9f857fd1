"""tools/compare_results.py: deterministic records must match exactly, wall-clock ones are only listed, renames map."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import compare_results as C  # noqa: E402


def _tree(folder: Path, records: dict) -> Path:
    folder.mkdir()
    for nb, recs in records.items():
        (folder / f"{nb}.json").write_text(json.dumps(recs))
    return folder


def _rec(name, value, unit="", config=None, source=None):
    return {"name": name, "value": value, "unit": unit, "config": config or {}, "published": None,
            "source": source, "note": ""}


def test_identical_trees_pass_and_a_changed_value_fails(tmp_path):
    recs = {"01_x": [_rec("a", 1.5), _rec("b", [1, 2], "B")],
            "03_sparse_attention": [_rec("cost_dense_L2048", 9.0, "ms/step")]}
    before = _tree(tmp_path / "before", recs)
    same = _tree(tmp_path / "same", {**recs, "03_sparse_attention": [_rec("cost_dense_L2048", 7.0, "ms/step")]})
    res = C.compare(before, same)
    assert not res["differ"] and [r[1] for r in res["wall_clock"]] == ["cost_dense_L2048"]
    assert C.report(res, out=open("/dev/null", "w"))
    changed = _tree(tmp_path / "changed", {**recs, "01_x": [_rec("a", 1.5000000000000002), _rec("b", [1, 2], "B")]})
    res = C.compare(before, changed)
    assert [r[1] for r in res["differ"]] == ["a"]                  # one ulp is a difference
    assert not C.report(res, out=open("/dev/null", "w"))
    int_vs_float = _tree(tmp_path / "types", {**recs, "01_x": [_rec("a", 1.5), _rec("b", [1.0, 2], "B")]})
    assert [r[1] for r in C.compare(before, int_vs_float)["differ"]] == ["b"]


def test_renames_map_names_and_scoped_config_keys(tmp_path):
    before = _tree(tmp_path / "before", {"04_p": [
        _rec("tiers_x", 1, config={"warmup": "before", "trace": {"model": "drift"}, "model": "tiny"}),
        _rec("policy_importance", 2, config={"warmup": True})]})
    after = _tree(tmp_path / "after", {"04_p": [
        _rec("classes_x", 1, config={"warmup_mode": "before", "trace": {"trace_model": "drift"}, "model": "tiny"}),
        _rec("policy_heat", 2, config={"warmup": True})]})
    res = C.compare(before, after, keys=["classes_.*:warmup=warmup_mode", "trace.model=trace_model"],
                    names=[("^tiers_", "classes_"), ("importance", "heat")])
    assert not res["differ"] and not res["missing"] and not res["added"] and not res["text"]
    assert dict(res["renamed_keys"]) == {"warmup -> warmup_mode": 1, "trace.model -> trace_model": 1}
    unscoped = C.compare(before, after, names=[("^tiers_", "classes_"), ("importance", "heat")])
    assert [r[1] for r in unscoped["text"]] == ["classes_x"]        # configs differ without the key rules


def test_results_files_of_the_current_format_compare_with_the_first(tmp_path):
    """A tree written by today's Recorder ({"format", "run", "records", "figures"}) against one of bare lists."""
    recs = {"01_x": [_rec("a", 1.5), _rec("b", 2.0)]}
    old = _tree(tmp_path / "old", recs)
    new = tmp_path / "new"
    new.mkdir()
    (new / "01_x.json").write_text(json.dumps({"format": "ess-results/2", "run": {"smoke": False},
                                               "records": [_rec("a", 1.5), _rec("b", 2.5)], "figures": []}))
    assert [r[1] for r in C.compare(old, new)["differ"]] == ["b"]
    for tree, n in ((old, 2), (new, 3)):                 # the indexes disagree on 01_x's record count
        index = {"format": "ess-index/1", "run": {}, "notebooks": {"01_x": {"status": "complete", "records": n}}}
        (tree / "index.json").write_text(json.dumps(index))
    assert ("index.json", "01_x", "records 2 -> 3") in C.compare(old, new)["differ"]


def test_a_changed_status_is_a_difference_and_an_inferred_one_is_named(tmp_path):
    def tree(folder, status):
        folder.mkdir()
        rec = {**_rec("a", 52), "published": 52, "source": "s", "status": status}
        (folder / "01_x.json").write_text(json.dumps({"format": "ess-results/3", "run": {}, "records": [rec]}))
        return folder
    calibrated, reproduced = tree(tmp_path / "c", "calibrated"), tree(tmp_path / "r", "reproduced")
    res = C.compare(calibrated, reproduced)
    assert res["differ"] == [("01_x", "a", "status: \"calibrated\" -> \"reproduced\"")]
    old = _tree(tmp_path / "old", {"01_x": [{**_rec("a", 52), "published": 52, "source": "s",
                                             "note": "calibrated: fitted on this limit"}]})
    res = C.compare(old, calibrated)                      # the old note's standing is the new field's
    assert not res["differ"] and res["status_inferred"] == [("BEFORE", "01_x")]


@pytest.mark.parametrize("kwargs, error, match", [
    ({"names": [("(", "x")]}, ValueError, "--name rule's REGEX"),
    ({"wall": [("01_x", "[", None)]}, ValueError, "--wall rule's REGEX"),
    ({"keys": ["(:a=b"]}, ValueError, "NAME_REGEX"),
    ({"names": "a=>b"}, TypeError, "names must be a list"),
    ({"wall": [("01_x", "a")]}, TypeError, "wall must hold"),
    ({"keys": [3]}, TypeError, "key rule must be a string"),
])
def test_rules_that_cannot_be_used_are_named(tmp_path, kwargs, error, match):
    t = _tree(tmp_path / "t", {"01_x": [_rec("a", 1)]})
    with pytest.raises(error, match=match):
        C.compare(t, t, **kwargs)


@pytest.mark.parametrize("content, match", [("[3]", r"records\[0\] must be an object"),
                                            ('{"format": "x"}', "not a results file"),
                                            ('[{"name": "a", "value": 1}]', "lacks")])
def test_a_file_that_is_not_a_results_file_is_named(tmp_path, content, match):
    good = _tree(tmp_path / "good", {"01_x": [_rec("a", 1)]})
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "01_x.json").write_text(content)
    with pytest.raises(ValueError, match=match) as info:
        C.compare(good, bad)
    assert "01_x.json" in str(info.value)


def test_the_command_says_what_it_cannot_use_with_exit_2(tmp_path, capsys):
    t = _tree(tmp_path / "t", {"01_x": [_rec("a", 1)]})
    for argv in ([str(t), str(tmp_path / "missing")], [str(t), str(t), "--name", "(=>x"]):
        with pytest.raises(SystemExit) as exit_:
            C.main(argv)
        assert exit_.value.code == 2
    assert "not a folder" in capsys.readouterr().err
    with pytest.raises(TypeError, match="before must be a folder"):
        C.compare(3, t)


def test_a_wall_clock_records_status_is_still_compared(tmp_path):
    def tree(folder, status):
        folder.mkdir()
        rec = {**_rec("cost_dense_L2048", 9.0, "ms/step"), "status": status}
        (folder / "03_sparse_attention.json").write_text(json.dumps({"format": "ess-results/3", "records": [rec]}))
        return folder
    res = C.compare(tree(tmp_path / "a", "computed"), tree(tmp_path / "b", "predicted"))
    assert res["wall_status"] == [("03_sparse_attention", "cost_dense_L2048", 'status: "computed" -> "predicted"')]
    assert not C.report(res, out=open("/dev/null", "w"))


def test_two_trees_with_nothing_to_compare_do_not_pass(tmp_path, capsys):
    """Two empty folders (or trees whose files hold no records) compare nothing: not a PASS, exit non-zero."""
    empty_a, empty_b = tmp_path / "a", tmp_path / "b"
    empty_a.mkdir()
    empty_b.mkdir()
    assert C.main([str(empty_a), str(empty_b)]) != 0
    out = capsys.readouterr().out
    assert "nothing to compare" in out.lower() and "PASS" not in out
    no_records = _tree(tmp_path / "n", {"01_x": []})
    assert C.main([str(no_records), str(no_records)]) != 0
    out = capsys.readouterr().out
    assert "nothing to compare" in out.lower() and "PASS" not in out
    assert not C.report(C.compare(empty_a, empty_b), out=open("/dev/null", "w"))
