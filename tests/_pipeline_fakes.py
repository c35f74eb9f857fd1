"""The pipeline without papermill, for quick tests and probes: the real ``run_all``, build folder, index, placement
and book staging, with each notebook's process replaced by a small script that copies the notebook and writes a
results file (no kernel starts, no notebook is executed).

* :func:`fake_children` -- make ``ess.pipeline.notebook`` start :data:`FAKE_CHILD` instead of papermill;
* :func:`fake_jupyter_book` -- ``jupyter-book build`` replaced by a stand-in that writes an ``index.html``;
* :func:`tiny_notebooks` -- ``NN_name.ipynb`` files with a title and a parameters cell;
* :func:`reproduce` -- the ``ess`` command in this process (its exit status, stdout and stderr);
  :func:`one_line` -- the lines of its stderr that are the failure's (not the progress bar's, not a warning's);
* :func:`files`, :func:`index_of`, :func:`linked` -- a folder's files, a build's index, a link planted in place
  of a file.
"""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import nbformat

# the notebook's process: the source notebook copied to the output with one cell gluing record ``x`` (as a notebook
# run by papermill glues every record), and a results file of that one record; the notebook's metadata ``fake`` sets
# its ``value``, pads its note to ``bytes``, makes it exit 1 with a cell error (``fail``), or wait for a file to exist
# first (``wait``)
FAKE_CHILD = r"""
import json, pathlib, sys, time
spec = json.loads(pathlib.Path(sys.argv[1]).read_text(encoding="utf-8"))
nb = json.loads(pathlib.Path(spec["input"]).read_text(encoding="utf-8"))
meta = nb.get("metadata", {}).get("fake", {})
wait = meta.get("wait")
if wait:
    deadline = time.monotonic() + 60
    while not pathlib.Path(wait).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
if meta.get("fail"):
    pathlib.Path(spec["error_path"]).write_text(json.dumps({"kind": "cell_error", "cell_index": 1,
        "exec_count": 1, "ename": "RuntimeError", "evalue": "boom"}), encoding="utf-8")
    sys.exit(1)
value = meta.get("value", 1)
nb["cells"].append({"cell_type": "code", "id": "fake-glue", "execution_count": 1, "metadata": {}, "source": "",
                    "outputs": [{"output_type": "display_data", "data": {"text/plain": repr(value)},
                                 "metadata": {"scrapbook": {"name": "x", "mime_prefix": ""}}}]})
pathlib.Path(spec["output"]).write_text(json.dumps(nb), encoding="utf-8")
name = pathlib.Path(spec["input"]).stem
res = pathlib.Path(spec["cwd"]) / spec["parameters"]["results_path"]
res.parent.mkdir(parents=True, exist_ok=True)
rec = {"name": "x", "value": value, "unit": "", "config": {}, "published": None, "source": None,
       "note": "n" * int(meta.get("bytes", 0)), "low": None, "high": None, "status": "computed"}
res.write_text(json.dumps({"format": "ess-results/3", "run": {"notebook": name, "smoke": spec["parameters"]["smoke"]},
                           "records": [rec], "figures": []}), encoding="utf-8")
"""


def fake_children(monkeypatch) -> None:
    """Every notebook the pipeline runs in this process is 'executed' by :data:`FAKE_CHILD`."""
    import ess.pipeline.notebook as N

    monkeypatch.setattr(N, "_CHILD", FAKE_CHILD)


def tiny_notebooks(folder: Path, *names: str, **fake) -> list[Path]:
    """Notebooks ``names`` (``NN_name``) in ``folder``: a title cell and a parameters cell; ``fake`` goes to their
    metadata for :data:`FAKE_CHILD` (``value``, ``bytes``, ``fail``, ``wait``)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name in names:
        nb = nbformat.v4.new_notebook()
        params = nbformat.v4.new_code_cell("smoke = False\nresults_path = ''")
        params.metadata["tags"] = ["parameters"]
        nb.cells = [nbformat.v4.new_markdown_cell(f"# {name}"), params]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.metadata["fake"] = dict(fake)
        path = folder / f"{name}.ipynb"
        nbformat.write(nb, path)
        out.append(path)
    return out


def reproduce(*argv: str) -> tuple[int, str, str]:
    """``ess`` with ``argv`` in this process: ``(exit status, stdout, stderr)``; a ``SystemExit`` (argparse) is
    returned as its status."""
    from ess.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
    return rc, out.getvalue(), err.getvalue()


def files(folder: Path) -> dict:
    """``{relative path: bytes}`` of every file under ``folder`` (links not followed)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def index_of(build: Path) -> dict:
    return json.loads((build / "results" / "index.json").read_text(encoding="utf-8"))


def fake_jupyter_book(monkeypatch) -> list:
    """``jupyter-book build`` replaced by a stand-in that writes ``_build/html/index.html`` into its output folder
    (what ``ess book`` checks for) and builds nothing; every other command runs as it would. Returns the list the
    staged source folders are appended to."""
    import subprocess

    import ess.pipeline.book as B

    real, built = subprocess.run, []

    def run(cmd, *args, **kwargs):
        if isinstance(cmd, list) and Path(str(cmd[0])).name == "jupyter-book":
            src, out = Path(cmd[2]), Path(cmd[cmd.index("--path-output") + 1])
            (out / "_build" / "html").mkdir(parents=True, exist_ok=True)
            (out / "_build" / "html" / "index.html").write_text("<html></html>", encoding="utf-8")
            built.append(src)
            return subprocess.CompletedProcess(cmd, 0, "", "")
        return real(cmd, *args, **kwargs)

    monkeypatch.setattr(B.subprocess, "run", run)
    return built


def one_line(err: str) -> list[str]:
    """The lines of ``err`` that are neither the progress bar's (tqdm redraws its bar with carriage returns) nor a
    warning the command printed on its way (``warning: ...``): the failure's own lines."""
    return [line for line in err.replace("\r", "\n").splitlines()
            if line.strip() and "nb/s" not in line and not line.startswith("warning: ")]


def linked(path: Path, elsewhere: Path) -> Path:
    """Move file ``path`` to ``elsewhere`` and leave a symbolic link to it in its place (a link planted in the build
    folder); returns ``elsewhere``."""
    elsewhere.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(elsewhere)
    return elsewhere
