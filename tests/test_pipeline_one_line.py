"""The ``ess`` command's promise: one line on stderr and a non-zero exit for every failure it can meet, no traceback,
nothing lost. Run in this process with the pipeline's notebook process replaced by a stand-in (``_pipeline_fakes``):
no notebook executes, no book is built, so that these run in seconds."""
import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from _pipeline_fakes import (fake_children, fake_jupyter_book, files, index_of, linked, one_line, reproduce,
                             tiny_notebooks)
from ess.pipeline import BuildDir, book


@pytest.fixture
def ran(tmp_path, monkeypatch):
    """A build folder after a complete run of two tiny notebooks (no book, no figures); jupyter-book faked."""
    fake_children(monkeypatch)
    fake_jupyter_book(monkeypatch)
    nbs = tmp_path / "nbs"
    tiny_notebooks(nbs, "01_a", "02_b")
    build = tmp_path / "b"
    rc, _, err = reproduce("reproduce", "--notebooks-dir", str(nbs), "--build-dir", str(build), "--no-book",
                           "--no-figures")
    assert rc == 0, err
    return build


def _refused(rc: int, err: str, *names: str) -> str:
    lines = one_line(err)
    assert rc != 0 and "Traceback" not in err, err
    assert len(lines) == 1, lines
    assert any(n in lines[0] for n in names), (names, lines[0])
    return lines[0]


_DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("content, names", [
    ("not json", ("index.json",)),
    ("[1, 2]", ("index.json",)),
    ('{"format": "ess-index/2", "run": {"id": 7}, "notebooks": {}}', ("index.json",)),
    ('{"format": "ess-index/2", "run": {}, "notebooks": {"01_a": {"status": "complete", "in_place": '
     '{"run_id": [1]}}}}', ("index.json",)),
    ('{"format": "ess-index/2", "run": {}, "notebooks": {"01_a": {"status": "complete", "peak_rss_bytes": '
     + "9" * 5000 + "}}}", ("index.json",)),
    (_DEEP, ("index.json",)),
])
def test_ess_book_refuses_a_pathological_index_in_one_line(ran, content, names):
    (ran / "results" / "index.json").write_text(content)
    rc, _, err = reproduce("book", "--build-dir", str(ran))
    _refused(rc, err, *names)
    assert not (ran / "book").exists()


def test_ess_book_refuses_an_index_that_is_a_link_or_a_folder(ran, tmp_path):
    index = ran / "results" / "index.json"
    mine = linked(index, tmp_path / "mine.json")
    rc, _, err = reproduce("book", "--build-dir", str(ran))
    assert "symbolic link" in _refused(rc, err, "index.json")
    index.unlink()
    index.mkdir()
    rc, _, err = reproduce("book", "--build-dir", str(ran))
    _refused(rc, err, "index.json")
    assert mine.read_bytes() and not (ran / "book").exists()


def test_a_read_only_results_folder_is_one_line_and_loses_nothing(ran, tmp_path, monkeypatch):
    """Root writes anywhere, so the kernel's refusal is emulated: creating or renaming a file in results/ raises
    ``PermissionError`` as it does for a user on a read-only folder."""
    results = ran / "results"
    before = files(ran)
    real_open, real_replace = os.open, os.replace

    def denied(path):
        return Path(os.fsdecode(path)).parent == results

    def open_(path, flags, *args, **kwargs):
        if flags & os.O_CREAT and denied(path):
            raise PermissionError(errno.EACCES, "Permission denied", os.fsdecode(path))
        return real_open(path, flags, *args, **kwargs)

    def replace(src, dst, *args, **kwargs):
        if denied(dst):
            raise PermissionError(errno.EACCES, "Permission denied", os.fsdecode(src), None, os.fsdecode(dst))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "replace", replace)
    rc, _, err = reproduce("reproduce", "--notebooks-dir", str(tmp_path / "nbs"), "--build-dir", str(ran),
                           "--no-book", "--no-figures")
    _refused(rc, err, str(results))
    monkeypatch.undo()
    after = files(ran)
    assert {k: v for k, v in after.items() if k in before} == before, "the earlier run's files changed"


def test_a_read_only_results_folder_for_a_user_who_cannot_write_it():
    """The same with the kernel's own refusal: as root, the command runs as an unprivileged user (setpriv) on a
    build folder that user owns, with its results folder read-only; the refusal comes before any notebook runs."""
    user = None
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv")
        user = 65534
    top = Path(tempfile.mkdtemp(prefix="ess-ro-"))            # pytest's tmp_path is private to root
    try:
        os.chmod(top, 0o755)
        build = BuildDir.claim(top / "b").path
        (build / "results").mkdir()
        (build / "results" / "01_memory_wall.json").write_text("{}")
        if user is not None:
            for p in [build, *build.rglob("*")]:
                os.chown(p, user, user)
        before = files(build)
        os.chmod(build / "results", 0o555)
        cmd = [sys.executable, "-m", "ess", "reproduce", "--only", "01", "--no-book", "--no-figures",
               "--build-dir", str(build)]
        if user is not None:
            cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=top, timeout=300)
        os.chmod(build / "results", 0o755)
        assert "is not writable" in _refused(proc.returncode, proc.stderr, str(build / "results"))
        assert files(build) == before
    finally:
        if (top / "b" / "results").exists():
            os.chmod(top / "b" / "results", 0o755)
        shutil.rmtree(top)


def test_a_file_name_too_long_for_the_file_system_is_one_line(tmp_path, monkeypatch):
    fake_children(monkeypatch)
    tiny_notebooks(tmp_path / "nbs", "01_a")
    for flag, value in (("--build-dir", tmp_path / ("x" * 300)), ("--notebooks-dir", tmp_path / ("y" * 300))):
        argv = {"--build-dir": str(tmp_path / "b"), "--notebooks-dir": str(tmp_path / "nbs"), flag: str(value)}
        rc, _, err = reproduce("reproduce", *[x for kv in argv.items() for x in kv], "--no-book")
        _refused(rc, err, "x" * 40 if flag == "--build-dir" else "y" * 40)


@pytest.mark.parametrize("argv", [["reproduce", "--cell-timeout", "0"], ["reproduce", "--no-such-flag"],
                                  ["plan", "--context", "soon"], ["nonsense"]])
def test_a_command_line_that_cannot_be_used_is_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        from ess.__main__ import main
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert len(err.strip().splitlines()) == 1, err


# -- the book from what ran ------------------------------------------------------------------------------------------

def _book_src(tmp_path: Path) -> Path:
    src = tmp_path / "booksrc"
    (src / "pages").mkdir(parents=True)
    (src / "_config.yml").write_text("title: t\n")
    (src / "intro.md").write_text("# Intro\n\nA is {glue:text}`/notebooks/01_a.ipynb::x:d`, "
                                  "B is {glue:text}`/notebooks/02_b.ipynb::x:d`.\n")
    (src / "pages" / "01_p.md").write_text("# P\n\nOnly B: {glue:text}`/notebooks/02_b.ipynb::x:.2f` and "
                                           "{glue:text}`/notebooks/01_a.ipynb::missing_key:d`. "
                                           "[Notebook 2](../notebooks/02_b.ipynb#part) shows it, "
                                           "{doc}`the second <../notebooks/02_b>` too; "
                                           "[Notebook 1](../notebooks/01_a.ipynb) ran.\n")
    return src


def test_only_some_notebooks_into_a_fresh_build_stages_a_book_from_what_ran(tmp_path, monkeypatch, capsys):
    """`ess reproduce --only 01` into a fresh build folder: the pages quote numbers of notebook 02, which did not
    run. The book is staged from what ran: each quote of a notebook not run (or of a number the notebook did not
    record) shows that in its place, the page says so at its top, and the command says so on stderr."""
    fake_children(monkeypatch)
    tiny_notebooks(tmp_path / "nbs", "01_a", "02_b")
    build = BuildDir.claim(tmp_path / "b")
    import ess.pipeline as P
    P.run_all(notebooks_dir=tmp_path / "nbs", build_dir=build, only=["01"], book=False, figures=False,
              progress=False)
    src = book.stage_book(build, _book_src(tmp_path))
    intro = (src / "intro.md").read_text()
    page = (src / "pages" / "01_p.md").read_text()
    assert "{glue:text}`/notebooks/01_a.ipynb::x:d`" in intro, "a number of a notebook that ran is quoted"
    assert "02_b.ipynb" not in intro and "02_b.ipynb" not in page
    assert "ipynb::missing_key" not in page and "not recorded: missing_key" in page
    assert "Notebook 2 *(not run: 02_b)*" in page and "the second *(not run: 02_b)*" in page
    assert "[Notebook 1](../notebooks/01_a.ipynb)" in page
    assert "02_b" in intro and "not run" in intro and "02_b" in page
    err = capsys.readouterr().err
    assert "02_b" in err and "intro.md" in err


def test_only_with_the_book_through_the_command(tmp_path, monkeypatch):
    fake_children(monkeypatch)
    built = fake_jupyter_book(monkeypatch)
    tiny_notebooks(tmp_path / "nbs", "01_a", "02_b")
    import ess.pipeline.book as B
    monkeypatch.setattr(B, "ROOT", tmp_path)         # the book's sources: a small book quoting both notebooks
    (tmp_path / "book").mkdir()
    for p in _book_src(tmp_path).iterdir():
        p.rename(tmp_path / "book" / p.name)
    rc, out, err = reproduce("reproduce", "--notebooks-dir", str(tmp_path / "nbs"), "--build-dir",
                             str(tmp_path / "b"), "--only", "01", "--no-figures")
    assert rc == 0, err
    assert built and "02_b.ipynb" not in (built[0] / "intro.md").read_text()
    assert index_of(tmp_path / "b")["book"]["status"] == "built"


# -- the book vouches for its notebooks ------------------------------------------------------------------------------

def test_ess_book_refuses_a_stray_executed_notebook(ran):
    stray = ran / "notebooks" / "07_stray.ipynb"
    stray.write_bytes((ran / "notebooks" / "01_a.ipynb").read_bytes())     # marked complete, of this very run
    rc, _, err = reproduce("book", "--build-dir", str(ran))
    line = _refused(rc, err, "07_stray.ipynb")
    assert "index" in line
    assert not (ran / "book").exists()
    stray.unlink()
    rc, _, err = reproduce("book", "--build-dir", str(ran))
    assert rc == 0, err


def test_ess_book_refuses_a_notebook_of_another_run_than_the_index_names(ran):
    nb = ran / "notebooks" / "02_b.ipynb"
    data = json.loads(nb.read_text())
    data["metadata"]["ess"]["run_id"] = "elsewhere1"
    nb.write_text(json.dumps(data))
    rc, _, err = reproduce("book", "--build-dir", str(ran))
    assert "elsewhere1" in _refused(rc, err, "02_b.ipynb")


def test_ess_book_refuses_executed_notebooks_without_an_index(ran):
    (ran / "results" / "index.json").unlink()
    rc, _, err = reproduce("book", "--build-dir", str(ran))
    assert "index.json" in _refused(rc, err, "01_a.ipynb", "index.json")


def test_ess_book_refuses_an_executed_notebook_that_is_a_link(ran, tmp_path):
    mine = linked(ran / "notebooks" / "01_a.ipynb", tmp_path / "mine.ipynb")
    rc, _, err = reproduce("book", "--build-dir", str(ran))
    assert "symbolic link" in _refused(rc, err, "01_a.ipynb")
    assert mine.exists() and not (ran / "book").exists()
