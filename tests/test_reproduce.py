"""The pipeline in smoke mode: notebooks executed, records written, the book built; failures named."""
import json
import shutil
from pathlib import Path

import nbformat
import pytest

from ess import reproduce
from ess.__main__ import main
from ess.results import load_records

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_every_notebook_runs_in_smoke_mode_and_the_book_builds(tmp_path):
    """The main job at CI sizes: every notebook executes (its own checks pass), records results, and the book
    builds with warnings as errors, with every notebook's figures in its page."""
    # smoke cells take seconds; a cell stuck on a widget reply (jupyter/nbclient#312) fails after 300 s and is retried
    runs = reproduce.run_all(smoke=True, build_dir=tmp_path, progress=False, cell_timeout_s=300)
    names = [p.stem for p in reproduce.list_notebooks()]
    assert [r.name for r in runs] == names and len(names) >= 8
    for r in runs:
        records = load_records(r.results)
        assert records, r.name
        for rec in records:
            assert isinstance(rec.config, dict) and rec.unit is not None
            if rec.published is not None:
                assert rec.source, (r.name, rec.name)
    first = {r.name: r for r in load_records(tmp_path / "results" / "01_memory_wall.json")}
    assert first["latent_entry_bytes_fp8"].value == 656
    assert first["token_bytes_all_layers"].value == 48068
    index = json.loads((tmp_path / "results" / "index.json").read_text())
    assert set(index) == set(names) and all(v["smoke"] for v in index.values())
    html = tmp_path / "book" / "_build" / "html"
    for name in names:
        page = (html / "notebooks" / f"{name}.html").read_text()
        assert "plotly-graph-div" in page, f"{name}: figures dropped from the book"
    assert (html / "intro.html").exists() and "Glossary" in (html / "intro.html").read_text()


def _broken_notebook(folder: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("smoke = False\nresults_path = ''")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# broken"), params, nbformat.v4.new_code_cell("x = 1"),
                nbformat.v4.new_code_cell("raise ValueError('boom')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = folder / "99_broken.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.mark.slow
def test_failure_names_the_notebook_and_the_cell(tmp_path):
    nbdir = tmp_path / "nbs"
    nbdir.mkdir()
    _broken_notebook(nbdir)
    with pytest.raises(reproduce.ReproduceError, match=r"99_broken.ipynb failed in cell 4 .*ValueError: boom"):
        reproduce.run_all(notebooks_dir=nbdir, build_dir=tmp_path / "build", book=False, progress=False)


def test_only_rejects_unknown_names(tmp_path, capsys):
    assert main(["reproduce", "--only", "no-such-notebook", "--build-dir", str(tmp_path)]) == 1
    assert "matches 0 notebooks" in capsys.readouterr().err


def test_list(capsys):
    assert main(["list"]) == 0
    assert "01_memory_wall" in capsys.readouterr().out


def test_stage_book_needs_executed_notebooks(tmp_path):
    with pytest.raises(reproduce.ReproduceError, match="no executed notebooks"):
        reproduce.stage_book(tmp_path)


@pytest.mark.slow
def test_relative_build_dir_is_resolved_from_the_caller(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = reproduce.run_all(smoke=True, only=["01"], build_dir=Path("rel"), book=False, progress=False)
    assert runs[0].results == tmp_path / "rel" / "results" / "01_memory_wall.json"
    assert runs[0].results.exists()


@pytest.mark.slow
def test_a_hanging_cell_fails_instead_of_waiting(tmp_path, capsys):
    nbdir = tmp_path / "nbs"
    nbdir.mkdir()
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("smoke = False\nresults_path = ''")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell("import time\ntime.sleep(60)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, nbdir / "98_hang.ipynb")
    with pytest.raises(reproduce.ReproduceError, match="98_hang.ipynb: a cell ran longer than 3 s"):
        reproduce.run_all(notebooks_dir=nbdir, build_dir=tmp_path / "b", book=False, progress=False,
                          cell_timeout_s=3, retries=1)
    assert "retrying 98_hang.ipynb (1/1)" in capsys.readouterr().err
