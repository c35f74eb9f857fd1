"""The build folder cannot destroy sources: what `ess` accepts as a build folder, what it refuses (one line, exit 2,
nothing touched), and what it deletes."""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ess.__main__ import main
from ess.pipeline import CREATED, MARKER, ROOT, BuildDir, BuildDirError


def _snapshot(folder: Path) -> dict:
    return {p.relative_to(folder): (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*")}


def test_a_new_folder_is_created_and_marked(tmp_path):
    build = BuildDir.claim(tmp_path / "b")
    assert build.path == tmp_path / "b" and (build.path / MARKER).exists()
    assert BuildDir.claim(tmp_path / "b").path == build.path          # its own folder: accepted again


def test_an_empty_folder_is_accepted_and_marked(tmp_path):
    (tmp_path / "empty").mkdir()
    assert (BuildDir.claim(tmp_path / "empty").path / MARKER).exists()


def test_a_folder_with_foreign_files_is_refused_and_left_alone(tmp_path):
    home = tmp_path / "home"                                  # `--build-dir ~`: a home with a book of its own
    (home / "book").mkdir(parents=True)
    (home / "book" / "mine.md").write_text("mine")
    (home / "notes.txt").write_text("notes")
    before = _snapshot(home)
    with pytest.raises(BuildDirError, match="holds files ess did not create .*book, notes.txt"):
        BuildDir.claim(home)
    assert _snapshot(home) == before and not (home / MARKER).exists()


@pytest.mark.parametrize("where", [ROOT, ROOT.parent])
def test_the_repository_and_its_parents_are_refused(where):
    with pytest.raises(BuildDirError, match="is the repository or holds it"):
        BuildDir.claim(where)


def test_a_folder_with_tracked_files_is_refused_even_with_a_marker(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    (repo / "out").mkdir(parents=True)
    (repo / "out" / "kept.txt").write_text("tracked")
    (repo / "out" / MARKER).write_text("{}")                 # a marker does not make tracked files ours
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["init", "-q"], ["add", "out/kept.txt"], ["commit", "-qm", "x"]):
        subprocess.run(["git", "-C", str(repo), *cmd], check=True, env=env, capture_output=True)
    with pytest.raises(BuildDirError, match="tracked by git .*kept.txt"):
        BuildDir.claim(repo / "out")


def test_a_file_in_the_way(tmp_path):
    (tmp_path / "build").write_text("a file named build")
    with pytest.raises(BuildDirError, match="is a file, not a folder"):
        BuildDir.claim(tmp_path / "build")
    (tmp_path / "b").mkdir()
    BuildDir.claim(tmp_path / "b")
    (tmp_path / "b" / "results").write_text("not a folder")
    with pytest.raises(BuildDirError, match="results is a file in the way"):
        BuildDir.claim(tmp_path / "b")


def test_a_missing_parent_is_not_created(tmp_path):
    with pytest.raises(BuildDirError, match="parent folder .*missing.* does not exist"):
        BuildDir.claim(tmp_path / "missing" / "build")
    assert not (tmp_path / "missing").exists()


def test_ess_book_needs_an_existing_build(tmp_path):
    with pytest.raises(BuildDirError, match="does not exist; run `ess reproduce` first"):
        BuildDir.claim(tmp_path / "nothing", create=False)


def test_only_what_ess_creates_is_removed_and_links_are_not_followed(tmp_path):
    build = BuildDir.claim(tmp_path / "b")
    (build.path / "results").mkdir()
    (build.path / "results" / "x.json").write_text("{}")
    users = tmp_path / "users"
    users.mkdir()
    (users / "precious.md").write_text("keep")
    (build.path / "book").symlink_to(users, target_is_directory=True)
    build.remove("book")                                      # the link goes, not what it points at
    assert (users / "precious.md").read_text() == "keep" and not (build.path / "book").exists()
    build.remove("results/x.json")
    assert not (build.path / "results" / "x.json").exists()
    for bad in ("mine", "../users", "/etc", "results/../../users"):
        with pytest.raises(ValueError, match="not something ess creates"):
            build.remove(bad)
    (build.path / "figures").symlink_to(users, target_is_directory=True)
    with pytest.raises(BuildDirError, match="symbolic link"):
        build.remove("figures/precious.md")
    assert (users / "precious.md").exists()
    (build.path / MARKER).unlink()
    with pytest.raises(BuildDirError, match="lost its .ess-build marker"):
        build.remove("results")
    assert (build.path / "results").exists()
    assert set(CREATED) >= {"notebooks", "results", "book", "book_src", "figures"}


def test_one_run_at_a_time(tmp_path):
    build = BuildDir.claim(tmp_path / "b")
    with build.lock():
        with pytest.raises(BuildDirError, match="in use by another ess command"):
            with BuildDir.claim(tmp_path / "b").lock():
                pass
    with build.lock():                                        # released
        pass


def _ess(*args, cwd=None, user=None):
    cmd = [sys.executable, "-m", "ess", *args]
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300)


def _one_line_error(proc, match):
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and match in lines[0], proc.stderr


@pytest.mark.parametrize("command", ["reproduce", "book"])
def test_the_command_refuses_the_repository_and_changes_nothing(command, tmp_path):
    tracked = [ROOT / "notebooks" / "01_memory_wall.ipynb", ROOT / "book" / "_config.yml", ROOT / "book" / "intro.md"]
    before = {p: p.read_bytes() for p in tracked}
    args = [command, "--build-dir", str(ROOT)] + (["--only", "01", "--no-book"] if command == "reproduce" else [])
    _one_line_error(_ess(*args, cwd=tmp_path), "is the repository or holds it")
    assert {p: p.read_bytes() for p in tracked} == before
    assert not (ROOT / MARKER).exists()


def test_the_command_refuses_a_file_in_the_way_and_a_missing_parent(tmp_path):
    (tmp_path / "build").write_text("x")
    _one_line_error(_ess("reproduce", "--only", "01", "--build-dir", str(tmp_path / "build"), cwd=tmp_path),
                    "is a file, not a folder")
    _one_line_error(_ess("book", "--build-dir", str(tmp_path / "no" / "such"), cwd=tmp_path), "does not exist")
    _one_line_error(_ess("reproduce", "--only", "01", "--build-dir", str(tmp_path / "no" / "such"), cwd=tmp_path),
                    "does not exist")


def test_the_command_refuses_a_read_only_build_folder():
    user = None
    if os.geteuid() == 0:                                     # root writes anywhere: run as an unprivileged user
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv")
        user = 65534
    top = Path(tempfile.mkdtemp(prefix="ess-ro-"))            # pytest's tmp_path is private to root
    ro = top / "ro"
    ro.mkdir()
    os.chmod(top, 0o755)
    os.chmod(ro, 0o555)
    try:
        _one_line_error(_ess("reproduce", "--only", "01", "--no-book", "--build-dir", str(ro), cwd=top, user=user),
                        "is not writable")
        assert list(ro.iterdir()) == []
    finally:
        os.chmod(ro, 0o755)
        shutil.rmtree(top)


@pytest.mark.parametrize("value", ["0", "-1", "-30", "1.5", "soon"])
def test_cell_timeout_takes_positive_seconds_only(value, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["reproduce", "--only", "01", "--cell-timeout", value, "--build-dir", str(tmp_path / "b")])
    assert exit_.value.code == 2
    assert "--cell-timeout" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_the_repositorys_own_build_folder_from_before_the_marker_is_adopted(tmp_path, monkeypatch):
    import ess.pipeline.build_folder as B

    repo = tmp_path / "repo"
    (repo / "build" / "results").mkdir(parents=True)
    (repo / "build" / "notebooks").mkdir()
    monkeypatch.setattr(B, "ROOT", repo)
    assert (B.BuildDir.claim(None).path / MARKER).exists()
    other = tmp_path / "other"
    (other / "results").mkdir(parents=True)                   # the same shape elsewhere is not ess's
    with pytest.raises(BuildDirError, match="did not create"):
        B.BuildDir.claim(other)
    (repo / "build" / MARKER).unlink()
    (repo / "build" / "thesis.tex").write_text("mine")
    with pytest.raises(BuildDirError, match="did not create .*thesis.tex"):
        B.BuildDir.claim(repo / "build")


@pytest.mark.parametrize("where", ["notebooks", "book", "data"])
def test_a_folder_holding_an_input_or_inside_one_is_refused_before_anything_is_written(where, tmp_path):
    """The repository's inputs: a build folder inside one (the book would copy itself into itself) is refused,
    and nothing is created there."""
    inside = ROOT / where / "ess-build-probe"
    with pytest.raises(BuildDirError, match=f"lies inside {ROOT / where}, an input"):
        BuildDir.claim(inside)
    assert not inside.exists()


def test_given_inputs_inside_the_build_folder_are_refused_even_with_a_marker(tmp_path):
    build = tmp_path / "out"
    BuildDir.claim(build)                                     # marked: ess's own
    (build / "notebooks").mkdir()
    mine = build / "notebooks" / "01_mine.ipynb"
    mine.write_text("{}")
    for inputs in ([build / "notebooks"], [mine], [build]):
        with pytest.raises(BuildDirError, match="holds .*an input of this command"):
            BuildDir.claim(build, inputs=inputs)
    with pytest.raises(BuildDirError, match="lies inside .*an input"):
        BuildDir.claim(build / "notebooks" / "deeper", inputs=[build / "notebooks"])
    assert mine.read_text() == "{}" and not (build / "notebooks" / "deeper").exists()


def test_a_symbolic_link_in_the_way_is_refused_before_the_marker_is_written(tmp_path):
    users = tmp_path / "users"
    users.mkdir()
    (users / "01_mine.ipynb").write_text("mine")
    build = tmp_path / "b"
    build.mkdir()
    (build / "notebooks").symlink_to(users, target_is_directory=True)
    (build / MARKER).write_text("{}")
    with pytest.raises(BuildDirError, match="notebooks is a symbolic link"):
        BuildDir.claim(build)
    assert (users / "01_mine.ipynb").read_text() == "mine"


def test_a_file_in_the_way_leaves_no_marker_behind(tmp_path, monkeypatch):
    import ess.pipeline.build_folder as B

    repo = tmp_path / "repo"
    (repo / "build").mkdir(parents=True)
    (repo / "build" / "results").write_text("a file where ess writes a folder")   # legacy shape, file in the way
    monkeypatch.setattr(B, "ROOT", repo)
    with pytest.raises(BuildDirError, match="file in the way"):
        B.BuildDir.claim(None)
    assert not (repo / "build" / MARKER).exists()


@pytest.mark.parametrize("value, error", [(3, TypeError), (b"/tmp/x", TypeError), ("", ValueError),
                                          ("a\0b", ValueError), ([1], TypeError)])
def test_a_build_folder_argument_that_is_not_a_path(value, error):
    with pytest.raises(error, match="build_dir"):
        BuildDir.claim(value)


@pytest.mark.parametrize("value", ["", "   "])
def test_the_command_refuses_an_empty_build_dir(value, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["reproduce", "--only", "01", "--build-dir", value])
    assert exit_.value.code == 2 and "--build-dir" in capsys.readouterr().err


def test_the_repositorys_build_folder_holding_only_the_weight_cache_is_adopted(tmp_path, monkeypatch):
    """Catches a refusal of the repository's build/ after ess.llm cached its decoded weights there (a model loaded
    before the first ``ess reproduce``, or a test that loads one before the browser tests claim the folder); the
    same folder name elsewhere is not ess's."""
    import ess.pipeline.build_folder as B
    from ess.llm.weight_cache import CACHE_DIR

    assert CACHE_DIR.parent.name in B.REPO_BUILD_ALSO and CACHE_DIR.parent.parent == B.ROOT / "build"
    repo = tmp_path / "repo"
    (repo / "build" / "cache" / "llm").mkdir(parents=True)
    monkeypatch.setattr(B, "ROOT", repo)
    assert (B.BuildDir.claim(None).path / MARKER).exists()
    (repo / "build" / "cache" / "llm" / "w.bin").write_bytes(b"x")
    assert (repo / "build" / "cache" / "llm" / "w.bin").exists()             # never removed by a claim
    other = tmp_path / "other"
    (other / "cache").mkdir(parents=True)
    with pytest.raises(BuildDirError, match="did not create"):
        B.BuildDir.claim(other)
