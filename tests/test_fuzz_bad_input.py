"""Property-based fuzzing of the public functions of ess.results, ess.atomic, ess.published and ess.pipeline.

Random values of the wrong type, sign, size and finiteness go into every argument; each call must either return a
valid result or raise a ``TypeError`` / ``ValueError`` whose message names the argument, never another exception,
never a NaN out of finite inputs, and nothing half-written after an error.

Cases per test (``max_examples``; hypothesis stops earlier when it has tried everything its strategies can make):
``Recorder`` 150, ``Recorder.record`` 300, ``Record`` 200, ``decide_status`` 200, ``infer_status`` 100,
``relative_error`` 300, ``load_results`` 200 (random JSON written to a file) + 50 (path types),
``write_bytes_atomic`` 150, ``write_text_atomic`` 100, ``write_json_atomic`` 150, ``atomic_path`` 100,
``fsync_file`` / ``fsync_dir`` 100, ``published`` 100, ``check_cell_timeout`` 200, ``select_notebooks`` 200,
``list_notebooks`` 100, ``BuildDir.claim`` 150, ``run_all`` 150 (always on an empty notebooks folder, so that no
notebook ever runs), ``run_notebook`` 100 (never with a claimed folder and a real notebook together),
``load_index`` 200, ``render_figures`` / ``check_executed`` / ``results_page`` 100 each. About 3,600 calls in all,
a few seconds per module on an idle machine. ``ESS_FUZZ_SCALE=20`` multiplies every count (a longer search).
"""
from __future__ import annotations

import json
import math
import os
import string
import uuid
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ess import atomic
from ess import pipeline
from ess.pipeline import BuildDir
from ess.pipeline.figures import render_figures
from ess.published import published
from ess.results import (STATUSES, Record, Recorder, decide_status, infer_status, load_results,
                         relative_error)

def fast(max_examples: int) -> settings:
    """``max_examples`` cases (times ``ESS_FUZZ_SCALE``, 1 unless set, for a longer search by hand), 5 s each at
    most (a loaded machine), fixtures shared across the cases."""
    return settings(max_examples=max_examples * int(os.environ.get("ESS_FUZZ_SCALE", "1")), deadline=5000,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# -- what goes in ---------------------------------------------------------------------------------------------------
numbers = st.one_of(st.integers(min_value=-10**30, max_value=10**30), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([np.float64("nan"), np.float32(1.5), np.int64(-3), np.inf, -0.0, 10**400]))
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=12), st.binary(max_size=6))
oddities = st.sampled_from([object(), {1, 2}, Path("x"), np.arange(3), np.array([np.nan]), np.array(2.5),
                            b"bytes", bytearray(b"ab"), (1, 2), len, type, Ellipsis, 1j])
anything = st.one_of(scalars, oddities, st.lists(scalars, max_size=4),
                     st.dictionaries(st.one_of(st.text(max_size=5), st.integers(), st.booleans()), scalars,
                                     max_size=3))
json_data = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
                         lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                 st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                         max_leaves=12)


def _names(exc: BaseException, *args: str) -> None:
    """The error is a TypeError / ValueError and its message names one of ``args``."""
    assert isinstance(exc, (TypeError, ValueError)), f"{type(exc).__name__}: {exc}"
    msg = str(exc)
    assert any(a in msg for a in args), f"message names none of {args}: {msg!r}"


def _no_nan(value) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True


# -- ess.results ----------------------------------------------------------------------------------------------------

@fast(150)
@given(notebook=st.one_of(anything, st.text(alphabet=string.ascii_letters + "_/.-", max_size=10)),
       results_path=anything, smoke=anything)
def test_recorder(notebook, results_path, smoke):
    try:
        rec = Recorder(notebook, results_path if not isinstance(results_path, str) else "", smoke=smoke)
    except Exception as exc:  # noqa: BLE001 - the contract is what is checked
        _names(exc, "notebook", "results_path", "smoke")
        return
    assert rec.notebook == notebook and "/" not in notebook and rec.records == []


ARGS = ("name", "value", "unit", "config", "published", "source", "role", "status", "note", "low", "high")


@fast(300)
@given(name=st.one_of(st.text(max_size=8), anything), value=anything,
       unit=st.one_of(st.just(""), st.text(max_size=4), anything),
       config=st.one_of(st.none(), st.dictionaries(st.text(max_size=4), anything, max_size=3), anything),
       published=st.one_of(st.none(), anything), source=st.one_of(st.none(), st.just("s"), anything),
       role=st.one_of(st.none(), st.sampled_from(["calibration", "target", "held_back", "calibrated"]), anything),
       status=st.one_of(st.none(), st.sampled_from(STATUSES), anything),
       note=st.one_of(st.just(""), st.text(max_size=8), anything),
       low=st.one_of(st.none(), numbers, anything), high=st.one_of(st.none(), numbers, anything))
def test_recorder_record(name, value, unit, config, published, source, role, status, note, low, high):
    rec = Recorder("nb")
    rec.record("first", 1, "")
    kwargs = dict(config=config, published=published, source=source, role=role, status=status, note=note, low=low,
                  high=high)
    try:
        out = rec.record(name, value, unit, **kwargs)
    except Exception as exc:  # noqa: BLE001
        _names(exc, *ARGS, "band", "record")
        assert [r.name for r in rec.records] == ["first"], "nothing is recorded after an error"
        return
    assert out is value
    r = rec.records[-1]
    assert r.status in STATUSES and r.name == name
    if published is not None:
        assert r.status != "computed"
    assert _no_nan([r.value, r.published, r.low, r.high]), "no NaN or inf where a number is required"
    json.dumps(asdict(r))                                   # JSON data, all of it
    assert r.error is None or math.isfinite(r.error)


@fast(200)
@given(name=anything, value=anything, unit=anything, status=anything, low=anything, high=anything)
def test_record(name, value, unit, status, low, high):
    try:
        r = Record(name, value, unit, low=low, high=high, status=status)
    except Exception as exc:  # noqa: BLE001
        _names(exc, "name", "value", "unit", "low", "high", "status", "band")
        return
    assert r.status in STATUSES and isinstance(r.name, str) and _no_nan([r.value, r.low, r.high])


@fast(200)
@given(published=st.one_of(st.none(), anything), role=st.one_of(st.none(), st.sampled_from(
    ["calibration", "target", "held_back"]), anything), status=st.one_of(st.none(), st.sampled_from(STATUSES),
                                                                           anything))
def test_decide_status(published, role, status):
    try:
        out = decide_status("x", published, role, status)
    except Exception as exc:  # noqa: BLE001
        _names(exc, "role", "status", "published")
        return
    assert out in STATUSES
    if status is not None:
        assert out == status
    if role is None and published is not None:
        assert status is not None, "a published value without role or status is never accepted silently"


@fast(100)
@given(note=st.one_of(st.text(max_size=30), anything), published=anything)
def test_infer_status(note, published):
    try:
        out = infer_status(note, published)
    except Exception as exc:  # noqa: BLE001
        _names(exc, "note")
        return
    assert out in STATUSES


@fast(300)
@given(value=st.one_of(numbers, anything), pub=st.one_of(numbers, anything))
def test_relative_error(value, pub):
    out = relative_error(value, pub)                        # never raises
    assert out is None or (isinstance(out, float) and math.isfinite(out))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(autouse=True)
def _in_scratch(scratch, monkeypatch):
    """A relative path a case makes up lands in the scratch folder, never in the checkout."""
    monkeypatch.chdir(scratch)


not_a_path = anything.filter(lambda v: not isinstance(v, (str, os.PathLike)))


def _fresh(scratch: Path) -> Path:
    folder = scratch / uuid.uuid4().hex[:10]
    folder.mkdir()
    return folder


def _json_file(scratch: Path, name: str, content) -> Path:
    path = _fresh(scratch) / name
    path.write_text(json.dumps(content))
    return path


results_like = st.one_of(
    json_data,
    st.fixed_dictionaries({"format": st.sampled_from(["ess-results/3", "ess-results/2", "x"]),
                           "run": st.one_of(json_data, st.fixed_dictionaries({}, optional={
                               "notebook": json_data, "smoke": json_data, "figures_dir": json_data,
                               "mode": json_data})),
                           "records": st.lists(st.one_of(json_data, st.fixed_dictionaries(
                               {"name": json_data, "value": json_data, "unit": json_data},
                               optional={"status": st.one_of(st.sampled_from(STATUSES), json_data),
                                         "published": json_data, "source": json_data, "note": json_data,
                                         "low": json_data, "high": json_data, "config": json_data,
                                         "extra": json_data})), max_size=3)},
                          optional={"figures": json_data}))


@fast(200)
@given(content=results_like)
def test_load_results_of_any_json(scratch, content):
    path = _json_file(scratch, "r.json", content)
    try:
        res = load_results(path)
    except Exception as exc:  # noqa: BLE001
        _names(exc, str(path))
        return
    for r in res.records:
        assert r.status in STATUSES and _no_nan([r.value, r.published, r.low, r.high])
    assert res.figures_dir.parent == path.parent, "the figures folder stays inside the results folder"
    assert all("/" not in f and f not in (".", "..") for f in res.figures)


@fast(50)
@given(path=st.one_of(anything, st.text(max_size=10)))
def test_load_results_of_any_path(scratch, path):
    where = path if not isinstance(path, str) else str(_fresh(scratch) / (path or "x"))
    try:
        load_results(where)
    except Exception as exc:  # noqa: BLE001
        _names(exc, "path", str(where))


# -- ess.atomic -----------------------------------------------------------------------------------------------------
names = st.one_of(st.text(alphabet=string.ascii_letters + string.digits + "._-", min_size=1, max_size=20),
                  st.sampled_from(["", ".", "..", "a\0b", "x" * 250, "y" * 256, "z" * 300]))


def _leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


@fast(150)
@given(name=names, data=st.one_of(st.binary(max_size=64), anything), wrong_path=st.one_of(st.none(), not_a_path))
def test_write_bytes_atomic(scratch, name, data, wrong_path):
    folder = _fresh(scratch)
    path = folder / name if wrong_path is None else wrong_path
    try:
        out = atomic.write_bytes_atomic(path, data)
    except Exception as exc:  # noqa: BLE001
        _names(exc, "path", "data")
        assert _leftovers(folder) == []
        return
    assert Path(out).read_bytes() == bytes(data) and _leftovers(folder) == []


@fast(100)
@given(name=names, text=st.one_of(st.text(max_size=40), st.just("\udcff"), anything))
def test_write_text_atomic(scratch, name, text):
    folder = _fresh(scratch)
    (folder / "keep").write_text("old")
    try:
        out = atomic.write_text_atomic(folder / name, text)
    except Exception as exc:  # noqa: BLE001
        _names(exc, "path", "text")
        assert sorted(p.name for p in folder.iterdir()) == ["keep"], "nothing half-written"
        return
    assert Path(out).read_bytes().decode("utf-8") == text


@fast(150)
@given(data=st.one_of(json_data, anything), indent=st.one_of(st.none(), st.integers(0, 3)))
def test_write_json_atomic(scratch, data, indent):
    folder = _fresh(scratch)
    path = folder / "f.json"
    path.write_text('"old"')
    try:
        atomic.write_json_atomic(path, data, indent=indent)
    except Exception as exc:  # noqa: BLE001
        _names(exc, "data")
        assert path.read_text() == '"old"' and _leftovers(folder) == []
        return
    back = json.loads(path.read_text())
    assert _no_nan(back), "no NaN or inf is written as JSON"


@fast(100)
@given(suffix=st.one_of(st.text(max_size=20), anything))
def test_atomic_path_suffix(scratch, suffix):
    folder = _fresh(scratch)
    try:
        with atomic.atomic_path(folder / "f.bin", suffix=suffix) as tmp:
            tmp.write_bytes(b"x")
    except Exception as exc:  # noqa: BLE001
        _names(exc, "suffix")
        assert list(folder.iterdir()) == []
        return
    assert (folder / "f.bin").read_bytes() == b"x" and _leftovers(folder) == []


@fast(100)
@given(path=anything)
def test_fsync_functions_name_a_wrong_path(scratch, path):
    for fn in (atomic.fsync_dir, atomic.fsync_file):
        if isinstance(path, (str, os.PathLike)) and not isinstance(path, bytes):
            continue                                   # a real path: fsync_file's OSError for a missing file
        try:
            fn(path)
        except Exception as exc:  # noqa: BLE001
            _names(exc, "path")


# -- ess.published --------------------------------------------------------------------------------------------------

@fast(100)
@given(document=st.one_of(anything, st.sampled_from(["paper", "article", "paper_table2", "../paper", ""])))
def test_published(document):
    try:
        out = published(document)
    except Exception as exc:  # noqa: BLE001
        _names(exc, "document")
        return
    assert out and all(e["source"] and e["role"] in ("calibration", "target", "held_back") for e in out.values())


# -- ess.pipeline ---------------------------------------------------------------------------------------------------

@fast(200)
@given(seconds=st.one_of(numbers, anything))
def test_check_cell_timeout(seconds):
    try:
        out = pipeline.check_cell_timeout(seconds)
    except Exception as exc:  # noqa: BLE001
        _names(exc, "cell_timeout_s")
        return
    assert isinstance(out, int) and 1 <= out <= 7 * 24 * 3600


NOTEBOOKS = [Path(f"{n}.ipynb") for n in ("01_memory_wall", "02_tiered_storage", "10_other")]


@fast(200)
@given(only=st.one_of(st.none(), st.lists(st.one_of(st.text(max_size=6), st.sampled_from(["01", "02", "10",
                                                                                         "memory_wall"]),
                                                    anything), max_size=3), anything))
def test_select_notebooks(only):
    try:
        out = pipeline.select_notebooks(NOTEBOOKS, only)
    except Exception as exc:  # noqa: BLE001
        _names(exc, "only", "--only")
        return
    assert set(out) <= set(NOTEBOOKS) and len(set(out)) == len(out)


@fast(100)
@given(folder=st.one_of(anything, st.text(alphabet=string.ascii_letters, max_size=8)))
def test_list_notebooks(scratch, folder):
    where = folder if not isinstance(folder, str) else (_fresh(scratch) / folder if folder else "")
    try:
        out = pipeline.list_notebooks(where)
    except Exception as exc:  # noqa: BLE001
        _names(exc, "notebooks_dir")
        return
    assert out == ([] if folder is not None else pipeline.list_notebooks())


@fast(150)
@given(name=st.one_of(st.text(alphabet=string.ascii_letters + "._-", max_size=10), not_a_path),
       create=st.one_of(st.booleans(), anything))
def test_build_dir_claim(scratch, name, create):
    home = _fresh(scratch)
    if name is None:
        return                                        # the repository's own build/: not a fuzz target
    path = home / name if isinstance(name, str) and name not in ("", ".", "..") else name
    try:
        build = BuildDir.claim(path, create=create)
    except Exception as exc:  # noqa: BLE001
        _names(exc, "build_dir", "build folder", "create")
        if isinstance(name, str) and name:
            assert not (home / name / ".ess-build").exists() or (home / name).is_dir()
        return
    assert (build.path / ".ess-build").exists() and home in build.path.parents


@fast(150)
@given(smoke=st.one_of(st.booleans(), anything), book=st.one_of(st.booleans(), anything),
       figures=st.one_of(st.booleans(), anything), progress=st.one_of(st.booleans(), anything),
       cell_timeout_s=st.one_of(st.integers(1, 100), numbers, anything),
       retries=st.one_of(st.integers(0, 3), numbers, anything),
       only=st.one_of(st.none(), st.lists(st.text(max_size=4), max_size=2), anything),
       build_name=st.one_of(st.just("b"), anything))
def test_run_all_checks_everything_before_it_touches_the_build_folder(scratch, smoke, book, figures, progress,
                                                                      cell_timeout_s, retries, only, build_name):
    home = _fresh(scratch)
    empty = home / "no-notebooks"
    empty.mkdir()
    build_dir = home / build_name if isinstance(build_name, str) else build_name
    with pytest.raises(Exception) as info:        # an empty notebooks folder: a run never starts
        pipeline.run_all(smoke=smoke, book=book, figures=figures, progress=progress, cell_timeout_s=cell_timeout_s,
                         retries=retries, only=only, build_dir=build_dir, notebooks_dir=empty)
    _names(info.value, "smoke", "book", "figures", "progress", "cell_timeout_s", "retries", "only", "build_dir",
           "notebooks_dir")
    assert sorted(p.name for p in home.iterdir()) == ["no-notebooks"], "nothing was created"


@fast(100)
@given(path=anything, build=anything, smoke=anything, run_id=anything)
def test_run_notebook_checks_its_arguments(scratch, path, build, smoke, run_id):
    with pytest.raises(Exception) as info:        # build is never a claimed folder: nothing can run
        pipeline.run_notebook(path, build, smoke=smoke, run_id=run_id)
    _names(info.value, "build", "path", "smoke", "run_id")


index_like = st.one_of(json_data, st.fixed_dictionaries(
    {"format": st.sampled_from(["ess-index/2", "ess-index/1", "other"]), "run": json_data,
     "notebooks": st.one_of(json_data, st.dictionaries(st.text(max_size=5), st.one_of(json_data, st.fixed_dictionaries(
         {"status": st.one_of(st.sampled_from(["complete", "failed", "running"]), json_data)},
         optional={"results": st.one_of(st.sampled_from(["results/a.json", "../../etc/passwd", "/abs", "a\\b"]),
                                        json_data),
                   "in_place": json_data})), max_size=3))},
    optional={"earlier_results": json_data, "figures": json_data, "book": json_data}))


@fast(200)
@given(content=index_like)
def test_load_index_of_any_json(scratch, content):
    path = _json_file(scratch, "index.json", content)
    try:
        out = pipeline.load_index(path)
    except Exception as exc:  # noqa: BLE001
        _names(exc, str(path))
        return
    for entry in out["notebooks"].values():
        for key in ("results", "executed"):
            if key in entry:
                assert not entry[key].startswith("/") and ".." not in Path(entry[key]).parts


@fast(100)
@given(build=anything, notebooks=st.one_of(st.lists(st.text(max_size=6), max_size=3), anything))
def test_figures_and_book_functions_check_their_arguments(scratch, build, notebooks):
    claimed = BuildDir.claim(_fresh(scratch) / "b")
    for call, names_ in ((lambda: render_figures(build, []), ("build",)),
                         (lambda: pipeline.check_executed(build), ("build",)),
                         (lambda: pipeline.results_page(build, []), ("build",))):
        with pytest.raises(Exception) as info:
            call()
        _names(info.value, *names_)
    try:
        out = render_figures(claimed, notebooks)
    except Exception as exc:  # noqa: BLE001
        _names(exc, "notebooks")
        return
    assert out == {"status": "none kept", "files": []}
