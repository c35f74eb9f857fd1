"""The book: ``book/`` plus the executed notebooks, staged into ``build/book_src`` and built with Jupyter Book 1.x
(warnings are errors) into ``build/book`` (open ``build/book/_build/html/index.html``).

Staging

* refuses executed notebooks that did not finish, naming them (the pipeline marks the complete ones in their
  metadata, ``ess.status``; one that failed or was interrupted sits in ``build/notebooks/failed/``, and is refused
  unless the complete copy of an earlier run is in place, which the book then shows and says so);
* refuses an executed notebook the build's run index does not vouch for (``results/index.json`` must name it, as
  completed by the run its metadata names or left in place from an earlier run), and one that is a symbolic link:
  a notebook copied into ``build/notebooks/`` by hand is no run's;
* quotes numbers only of notebooks that ran: a page quoting a notebook this build did not run (``ess reproduce
  --only``), or a number it did not record, shows *not run* / *not recorded* in its place and a note at its top;
* copies ``book/`` and every executed notebook, hiding the parameters cells — the notebook's own and papermill's
  injected one (tag ``remove-cell``);
* writes ``results.md``, every recorded number beside the published one with its status (the record's field;
  *inferred* from its note for a results file of an older format) and band;
* says at the top of the introduction when the notebooks ran at smoke sizes, or came from several runs;
* serves MathJax from the book itself (Debian's ``libjs-mathjax``, MathJax 2.7 with SVG output), so that no page
  loads a script from a CDN;
* writes ``_toc.yml``: the introduction, the background pages (``book/pages/*.md``), the notebooks, the results.

The pages quote the notebooks' numbers with ``{glue:text}`` (every record is glued under its name when it is
recorded), so they show the numbers of the run the book was built from.
"""
from __future__ import annotations

import json
import numbers
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from .. import validate
from ..results import Record, load_results
from .build_folder import ROOT, BuildDir
from .errors import ReproduceError
from .index import load_index, regular_file_problem

__all__ = ["stage_book", "build_book", "check_executed", "results_page", "MATHJAX_DIR"]

MATHJAX_DIR = Path("/usr/share/javascript/mathjax")       # Debian's libjs-mathjax (MathJax 2.7)
# the parts of MathJax 2.7 that TeX input with SVG output loads (about 5 MB of the package's 54)
# (STIX-Web too: plotly's notebook output switches MathJax 2's SVG font to it)
_MATHJAX_PARTS = ("MathJax.js", "extensions", "jax/input/TeX", "jax/element", "jax/output/SVG/config.js",
                  "jax/output/SVG/jax.js", "jax/output/SVG/autoload", "jax/output/SVG/fonts/TeX",
                  "jax/output/SVG/fonts/STIX-Web", "localization/en")
_HIDDEN_TAGS = ("parameters", "injected-parameters")
_WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
_WIDGET_NOTE = ("*Interactive controls appear here when the notebook runs with a kernel (open it in JupyterLab); "
                "the book shows the default view.*")
_CDN_MATHJAX = re.compile(r'<script[^>]*\bsrc="https://cdnjs\.cloudflare\.com/ajax/libs/mathjax/[^"]*"[^>]*>\s*'
                          r'</script>')


def _claimed(build_dir, book_dir: Path | None = None) -> BuildDir:
    if isinstance(build_dir, BuildDir):
        return build_dir
    return BuildDir.claim(build_dir, create=False, inputs=[book_dir] if book_dir is not None else [])


def _book_dir(book_dir) -> Path:
    """The book's sources: ``book/`` of the repository, or a folder with ``_config.yml`` and ``intro.md``."""
    if book_dir is None:
        return ROOT / "book"
    book_dir = validate.path("book_dir", book_dir)
    if not (book_dir / "_config.yml").is_file() or not (book_dir / "intro.md").is_file():
        raise ValueError(f"book_dir {book_dir} must be a folder holding _config.yml and intro.md")
    return book_dir


def _one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _index(build: BuildDir) -> dict:
    """The build's run index (empty when there is none); a :class:`ReproduceError` when it is not one (a link, a
    folder, not an index)."""
    path = build.path / "results" / "index.json"
    if not path.exists() and not path.is_symlink():
        return {}
    why = regular_file_problem(path)
    if why:
        raise ReproduceError(f"{path}: {why}")
    try:
        return load_index(path)
    except ValueError as exc:
        raise ReproduceError(_one_line(str(exc))) from None


def _read_nb(path: Path) -> dict:
    """An executed notebook's JSON; a :class:`ReproduceError` naming it when it is not a notebook (or not a plain
    file: a symbolic link, a folder, a pipe)."""
    why = regular_file_problem(path)
    if why:
        raise ReproduceError(f"{path}: {why}")
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:
        raise ReproduceError(_one_line(f"{path} is not a readable notebook ({str(exc)[:200]})")) from None
    except RecursionError:
        raise ReproduceError(f"{path} is not a readable notebook (JSON nested too deeply)") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("metadata", {}), dict) or not isinstance(
            nb.get("cells", []), list):
        raise ReproduceError(f"{path} is not a notebook (a JSON object with 'metadata' and 'cells')")
    if not isinstance(nb.get("metadata", {}).get("ess", {}), dict):
        raise ReproduceError(f"{path}: its metadata.ess must be an object")
    return nb


def _unvouched(index: dict, name: str, meta: dict) -> str | None:
    """Why the build's run index does not vouch for the executed notebook ``name`` whose run record is ``meta``
    (None when it does): the index must name the notebook, as one this run completed or one whose earlier
    complete results it left in place, with the run id the notebook carries."""
    if not index:
        return "no run index (results/index.json) vouches for it; run `ess reproduce` to make one"
    entry, earlier = index["notebooks"].get(name), index.get("earlier_results", {}).get(name)
    if entry is None and earlier is None:
        return ("results/index.json names no notebook of that name: no run of this build made it; move it out of "
                "the notebooks folder")
    runs = []
    if entry is not None:
        if entry.get("status") == "complete":
            runs.append(index["run"].get("id"))
        runs.append((entry.get("in_place") or {}).get("run_id"))
    if earlier is not None:
        runs.append(earlier.get("run_id"))
    runs = [r for r in runs if isinstance(r, str)]
    if meta.get("run_id") not in runs:
        said = " or ".join(dict.fromkeys(runs)) or "no complete run of it"
        return (f"it says run {meta.get('run_id')!r}, results/index.json {said}; run it again with "
                f"`ess reproduce --only {name[:2]}`")
    return None


def check_executed(build: BuildDir) -> list[Path]:
    """The executed notebooks of ``build``, all of them complete and vouched for by the build's run index; a
    :class:`ReproduceError` naming every one that did not finish: one whose copy is not marked complete (or
    carries no run record, as one executed by hand or by an older ``ess`` would), one set aside as failed or
    interrupted, one the last run left running (it was killed); and naming the first the index does not vouch for
    (one no run of this build made: a notebook copied in, or a run's copy the index does not name) or that is not a
    plain file (a symbolic link)."""
    if not isinstance(build, BuildDir):
        raise TypeError(f"build must be a claimed BuildDir, got {type(build).__name__}")
    folder = build.path / "notebooks"
    if folder.is_symlink():
        raise ReproduceError(f"{folder}: a symbolic link where ess keeps the executed notebooks (ess reads nothing "
                             f"through it); remove the link")
    executed = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    index = _index(build)
    bad = {}
    for nb in executed:
        meta = _read_nb(nb).get("metadata", {}).get("ess", {})
        if meta.get("status") != "complete":
            bad[nb.stem] = meta.get("status") or "no run record"
            continue
        why = _unvouched(index, nb.stem, meta)
        if why:
            raise ReproduceError(f"{nb}: not vouched for by the build's run index: {why}")
    done = {nb.stem for nb in executed} - set(bad)
    for nb in sorted((folder / "failed").glob("[0-9][0-9]_*.ipynb")):
        if nb.stem not in done:
            meta = _read_nb(nb).get("metadata", {}).get("ess", {})
            bad[nb.stem] = f"{meta.get('status', 'failed')}: {meta.get('message', '')}".rstrip(": ")
    if index:
        for name, entry in index["notebooks"].items():
            if entry.get("status") in ("running", "interrupted", "failed") and name not in done:
                bad.setdefault(name, f"{entry['status']} in the last run" if entry["status"] != "running"
                               else "the last run stopped while it ran (killed)")
    if bad:
        raise ReproduceError("these notebooks did not finish: " + "; ".join(f"{k} ({v})" for k, v in sorted(
            bad.items())) + "; run them again with `ess reproduce --only NN` before building the book")
    if not executed:
        raise ReproduceError(f"no executed notebooks in {folder}: run the notebooks first")
    return executed


def _title(nb: dict, fallback: str) -> str:
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            for line in "".join(cell.get("source", "")).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return fallback


def _for_the_book(nb: dict) -> dict:
    """An executed notebook as the book shows it:

    * the parameters cells (the notebook's own and papermill's injected one) tagged ``remove-cell``: the book
      shows what a notebook computes, not its knobs;
    * a widget's output (it needs a kernel; the book has none) replaced by a line saying so, and the saved widget
      state dropped (rendering it statically would load scripts from a CDN);
    * the MathJax script plotly writes into every figure's HTML removed: it comes from a CDN, and the page
      already loads the book's own MathJax, which plotly uses."""
    for cell in nb.get("cells", []):
        tags = cell.get("metadata", {}).get("tags", [])
        if any(t in tags for t in _HIDDEN_TAGS) and "remove-cell" not in tags:
            cell.setdefault("metadata", {})["tags"] = [*tags, "remove-cell"]
        outputs = []
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if _WIDGET_MIME in data:
                out = {"output_type": "display_data", "metadata": {}, "data": {"text/markdown": _WIDGET_NOTE}}
            elif "text/html" in data:
                html = data["text/html"]
                data["text/html"] = _CDN_MATHJAX.sub("", html if isinstance(html, str) else "".join(html))
            outputs.append(out)
        if "outputs" in cell:
            cell["outputs"] = outputs
    nb.get("metadata", {}).pop("widgets", None)
    return nb


# -- the results page -----------------------------------------------------------------------------------------

def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("[", "\\[").replace("]", "\\]").replace("\n", " ")


def _number(v) -> str:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.4g}"


def _value(v) -> str:
    if isinstance(v, list):
        nums = [x for x in v if isinstance(x, numbers.Real) and not isinstance(x, bool)]
        if nums and len(nums) == len(v):
            return f"{len(v)} values, mean {_number(sum(nums) / len(nums))}"
        return f"{len(v)} values"
    if isinstance(v, dict):
        return f"{len(v)} fields"
    return _number(v)


def _band(rec: Record) -> str:
    if rec.low is None and rec.high is None:
        return ""
    lo = "" if rec.low is None else _number(rec.low)
    hi = "" if rec.high is None else _number(rec.high)
    where = {True: "in", False: "**outside**", None: ""}[rec.in_band]
    return f"[{lo}, {hi}] {where}".strip()


def results_page(build: BuildDir, executed: list[Path]) -> str:
    """The generated page: per notebook, every record beside the published value with error, status and band."""
    if not isinstance(build, BuildDir):
        raise TypeError(f"build must be a claimed BuildDir, got {type(build).__name__}")
    if isinstance(executed, (str, bytes)) or not isinstance(executed, (list, tuple)):
        raise TypeError(f"executed must be a list of executed notebooks' paths, got {type(executed).__name__}")
    index = _index(build)
    last = index.get("run", {})
    entries = index.get("notebooks", {})
    lines = ["# Every reproduced number", "",
             "Every number the notebooks recorded, generated from `build/results/` when the book was built. "
             "*Status* is the record's own standing: **calibrated** (the value was fitted there, so agreement is "
             "not evidence), **reproduced** / **not reproduced** (a claim checked), **held back (predicted)** (a "
             "result of the paper not given to the project, predicted and never fitted), **bound**, "
             "**predicted**, **compared** (a published value stands beside it) or **computed**. *Error* is "
             "relative to the published value; *band* is the range a value is expected in, where one is given. "
             "A status marked *(inferred)* was read from the record's note (a results file written before the "
             "status was a field of the record).",
             ""]
    if last:
        status = "" if last.get("status") == "running" else f", status **{last.get('status')}**"
        lines += [f"The last run recorded in `results/index.json`: `{last.get('id')}`, a **{last.get('mode')}** "
                  f"run started {last.get('started')}{status}.", ""]
    for nb_path in executed:
        nb = _read_nb(nb_path)
        meta = nb.get("metadata", {}).get("ess", {})
        results_file = build.path / "results" / f"{nb_path.stem}.json"
        lines += [f"## {_title(nb, nb_path.stem)}", ""]
        where = f"[the notebook](notebooks/{nb_path.stem}.ipynb)"
        run = (f"{where}: a **{meta.get('mode')}** run, finished {meta.get('finished')} (run `{meta.get('run_id')}`"
               + ("" if not last or meta.get("run_id") == last.get("id") else ", **an earlier run than the last**")
               + ").")
        lines += [run, ""]
        entry = entries.get(nb_path.stem, {})
        if entry.get("status") in ("failed", "interrupted", "running") and meta.get("run_id") != last.get("id"):
            what = {"running": "stopped while it ran (killed)"}.get(entry["status"], entry["status"])
            lines += [f"**The last run of this notebook (run `{last.get('id')}`) did not finish: {what}.** What "
                      f"follows are the complete results of run `{meta.get('run_id')}`, left in place.", ""]
        if not results_file.exists() and not results_file.is_symlink():
            lines += ["No results file.", ""]
            continue
        why = regular_file_problem(results_file)
        if why:
            raise ReproduceError(f"{results_file}: {why}")
        try:
            results = load_results(results_file)
        except ValueError as exc:
            raise ReproduceError(_one_line(str(exc))) from None
        except RecursionError:
            raise ReproduceError(f"{results_file}: not a results file (nested too deeply)") from None
        if results.run.get("run_id") != meta.get("run_id"):
            lines += [f"**The results file comes from another run** (`{results.run.get('run_id')}`).", ""]
        lines += [":::{container} ess-results", "",
                  "| record | status | ours | published | error | unit | band | source |",
                  "|---|---|---|---|---|---|---|---|"]
        inferred = " (inferred)" if results.status_inferred else ""
        for rec in results.records:
            err = "" if rec.error is None else f"{rec.error * 100:+.1f} %"
            pub = "" if rec.published is None else _value(rec.published)
            lines.append("| " + " | ".join(_cell(x) for x in (
                f"`{rec.name}`", rec.status + inferred, _value(rec.value), pub, err, rec.unit, _band(rec),
                rec.source or "")) + " |")
        lines += ["", ":::", ""]
    return "\n".join(lines)


def _banner(executed: list[Path]) -> str:
    metas = [_read_nb(p).get("metadata", {}).get("ess", {}) for p in executed]
    modes = {m.get("mode") for m in metas}
    runs = {m.get("run_id") for m in metas}
    notes = []
    if "smoke" in modes:
        which = "all notebooks" if modes == {"smoke"} else "some notebooks"
        notes.append(f"**Smoke sizes.** {which.capitalize()} ran with `ess reproduce --smoke` (the CI sizes): "
                     f"their numbers come from small configurations and differ from a full run's.")
    if len(runs) > 1:
        notes.append(f"The notebooks come from {len(runs)} different runs; the [results page](results.md) says "
                     f"which.")
    if not notes:
        return ""
    return ":::{warning}\n" + "\n\n".join(notes) + "\n:::\n"


def _stage_mathjax(src: Path) -> bool:
    """Copy the MathJax parts the book loads into ``_mathjax/mathjax`` (served at ``<site>/mathjax/``)."""
    dest = src / "_mathjax" / "mathjax"
    dest.mkdir(parents=True, exist_ok=True)
    if not (MATHJAX_DIR / "MathJax.js").exists():
        return False
    for part in _MATHJAX_PARTS:
        source, target = MATHJAX_DIR / part, dest / part
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy2(source, target)
    return True


def _use_cdn_mathjax(config_path: Path) -> None:
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    sphinx_config = config.get("sphinx", {}).get("config", {})
    for key in ("mathjax_path", "mathjax2_config", "myst_update_mathjax"):
        sphinx_config.pop(key, None)
    config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")


# a page quoting a notebook's number: {glue}`/notebooks/NN_name.ipynb::key` or {glue:text}`...::key:format`
_GLUE_ROLE = re.compile(r"\{glue(?::[a-z]+)?\}`/?notebooks/(?P<nb>[^`/]+?)\.ipynb::(?P<key>[^`:]+)(?::[^`]*)?`")
# a link to a notebook's page: [text](../notebooks/NN_name.ipynb#anchor) or {doc}`text <../notebooks/NN_name>`
_NOTEBOOK_LINK = re.compile(r"\[(?P<text>[^\]]*)\]\((?:\.\./|\./|/)*notebooks/(?P<nb>[^)/#\s]+?)(?:\.ipynb)?(?:#[^)]*)?\)"
                            r"|\{doc\}`(?:(?P<dtext>[^`<]*?)\s*<)?(?:\.\./|\./|/)*notebooks/(?P<dnb>[^`>/]+?)>?`")


def _glued(nb: dict) -> set[str]:
    """The names a notebook glued (myst-nb's ``scrapbook`` output metadata)."""
    return {out["metadata"]["scrapbook"].get("name") for cell in nb.get("cells", []) if isinstance(cell, dict)
            for out in cell.get("outputs", []) or [] if isinstance(out, dict)
            and isinstance(out.get("metadata"), dict) and isinstance(out["metadata"].get("scrapbook"), dict)}


def _after_title(text: str, block: str) -> str:
    """``text`` with ``block`` inserted after its first ``# `` title line (at the top when it has none)."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("# "):
            return "".join(lines[:i + 1]) + "\n" + block + "".join(lines[i + 1:])
    return block + "\n" + text


def _quote_what_ran(src: Path, glued: dict[str, set]) -> dict[str, list[str]]:
    """Every page of the staged book that quotes a number of a notebook this build did not run (``glued`` maps the
    notebooks that ran to the names they glued), or one the notebook did not record, shows *not run* / *not
    recorded* in its place, and a link to a notebook not run is its text marked *not run*, with a note at the top
    of the page: a book built from what ran (``ess reproduce --only``) instead of a build that fails on the missing
    numbers and pages. Returns ``{page: [what is missing]}``."""
    changed = {}
    for page in sorted(p for p in src.rglob("*.md") if "notebooks" not in p.relative_to(src).parts[:1]):
        text = page.read_text(encoding="utf-8")
        missing: dict[str, None] = {}

        def replace(m: re.Match) -> str:
            nb, key = m.group("nb"), m.group("key")
            if nb not in glued:
                missing[f"{nb} (not run)"] = None
                return f"*(not run: {nb})*"
            if key not in glued[nb]:
                missing[f"{nb}::{key} (not recorded)"] = None
                return f"*(not recorded: {key})*"
            return m.group(0)

        def unlink(m: re.Match) -> str:
            nb = m.group("nb") or m.group("dnb")
            if nb in glued:
                return m.group(0)
            missing[f"{nb} (not run)"] = None
            return f"{m.group('text') or m.group('dtext') or nb} *(not run: {nb})*"

        new = _NOTEBOOK_LINK.sub(unlink, _GLUE_ROLE.sub(replace, text))
        if missing:
            rel = str(page.relative_to(src))
            note = (":::{note}\nThis build did not run or record everything this page quotes: "
                    + ", ".join(_cell(m) for m in missing) + ". Those numbers read *not run* or *not recorded*; "
                    "`ess reproduce` without `--only` runs every notebook.\n:::\n")
            page.write_text(_after_title(new, note), encoding="utf-8")
            changed[rel] = list(missing)
    return changed


def stage_book(build_dir=None, book_dir: Path | None = None) -> Path:
    """Stage ``book/`` and the executed notebooks into ``<build>/book_src`` (see the module docstring). A page
    that quotes numbers of notebooks the build did not run (``ess reproduce --only``) is staged with those numbers
    marked *not run* and a note saying so, and a warning on stderr names the pages."""
    book_dir = _book_dir(book_dir)
    build = _claimed(build_dir, book_dir)
    executed = check_executed(build)
    build.remove("book_src")
    src = build.path / "book_src"
    shutil.copytree(book_dir, src)
    (src / "notebooks").mkdir(exist_ok=True)
    glued = {}
    for nb in executed:
        staged = _for_the_book(_read_nb(nb))
        glued[nb.stem] = _glued(staged)
        (src / "notebooks" / nb.name).write_text(json.dumps(staged, indent=1), encoding="utf-8")
    left_out = _quote_what_ran(src, glued)
    if left_out:
        not_run = sorted({m.split(" ")[0] for ms in left_out.values() for m in ms if m.endswith("(not run)")})
        print(f"warning: {len(left_out)} pages quote numbers this build did not record"
              + (f" (notebooks not run: {', '.join(not_run)})" if not_run else "") + f": {', '.join(left_out)}; "
              f"they show 'not run' or 'not recorded' in their place", file=sys.stderr)
    (src / "results.md").write_text(results_page(build, executed), encoding="utf-8")
    banner = _banner(executed)
    if banner:
        intro = src / "intro.md"
        title, _, rest = intro.read_text(encoding="utf-8").partition("\n")
        intro.write_text(f"{title}\n\n{banner}{rest}", encoding="utf-8")
    if not _stage_mathjax(src):
        print(f"warning: {MATHJAX_DIR} is missing (Debian: apt-get install libjs-mathjax); the book's math will "
              f"load MathJax from a CDN", file=sys.stderr)
        _use_cdn_mathjax(src / "_config.yml")
    pages = sorted((src / "pages").glob("*.md")) if (src / "pages").exists() else []
    parts = []
    if pages:
        parts.append({"caption": "Background", "chapters": [{"file": f"pages/{p.stem}"} for p in pages]})
    parts.append({"caption": "Notebooks", "chapters": [{"file": f"notebooks/{nb.stem}"} for nb in executed]})
    parts.append({"caption": "Results", "chapters": [{"file": "results"}]})
    toc = {"format": "jb-book", "root": "intro", "parts": parts}
    (src / "_toc.yml").write_text(yaml.safe_dump(toc, sort_keys=False), encoding="utf-8")
    return src


def build_book(*, build_dir=None, book_dir: Path | None = None) -> Path:
    """Build the Jupyter Book (1.x) from ``book/`` plus the executed notebooks; warnings are errors. Returns the
    path of ``index.html``."""
    book_dir = _book_dir(book_dir)
    if isinstance(build_dir, BuildDir):                  # inside a run, which holds the folder already
        return _build(build_dir, book_dir)
    build = _claimed(build_dir, book_dir)
    with build.lock():
        return _build(build, book_dir)


def _build(build: BuildDir, book_dir: Path | None) -> Path:
    src = stage_book(build, book_dir)
    build.remove("book")
    out = build.path / "book"
    exe = Path(sys.executable).parent / "jupyter-book"
    cmd = [str(exe) if exe.exists() else "jupyter-book", "build", str(src), "--path-output", str(out),
           "-W", "-n", "--keep-going"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stdout + proc.stderr).splitlines()
        lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln) for ln in lines]          # the terminal's colours
        first = next((ln for ln in lines if "WARNING" in ln or "ERROR" in ln), lines[-1] if lines else "")
        out.mkdir(exist_ok=True)
        log = out / "jupyter-book.log"
        log.write_text(proc.stdout + proc.stderr, encoding="utf-8")
        raise ReproduceError(f"the book did not build (jupyter-book exit {proc.returncode}): {first.strip()[:300]} "
                             f"(the whole output: {log})")
    html = out / "_build" / "html" / "index.html"
    if not html.exists():
        raise ReproduceError(f"jupyter-book succeeded but {html} is missing")
    return html
