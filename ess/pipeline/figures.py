"""Static figures: the figures notebooks keep with :meth:`ess.results.Recorder.figure`, rendered to PNG and SVG.

After the notebooks ran, the pipeline reads ``<figures folder>/<name>.json`` (plotly's JSON; the folder is the one
the results file names, ``build/results/<notebook>.figures-<run id>/``) for each figure a results file lists, and writes ``build/figures/<notebook>-<name>.png`` and ``.svg`` with kaleido 1.x,
which drives a Chromium installed on the system (Debian's ``chromium``; the set-up installs it). Without a Chromium
the figures are skipped with the reason, and the rest of the run goes on.
"""
from __future__ import annotations

import re
import shutil

from ..results import load_results
from .build_folder import BuildDir

__all__ = ["render_figures", "FORMATS", "WIDTH_PX", "SCALE"]

FORMATS = ("png", "svg")
WIDTH_PX = 900          # design choice: the README's column; heights come from each figure's layout
HEIGHT_PX = 450         # for a figure whose layout sets none
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
SCALE = 2               # PNG pixels per CSS pixel (sharp on high-density screens)


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def render_figures(build: BuildDir, notebooks: list[str]) -> dict:
    """Render the kept figures of ``notebooks`` (their results files name them); return the index entry:
    ``{"status": "rendered" | "none kept" | "skipped: ...", "files": [...]}`` with paths relative to the build."""
    import plotly.io as pio

    if not isinstance(build, BuildDir):
        raise TypeError(f"build must be a claimed BuildDir, got {type(build).__name__}")
    if isinstance(notebooks, (str, bytes)) or not isinstance(notebooks, (list, tuple)) or not all(
            isinstance(n, str) and _NAME.match(n) for n in notebooks):
        raise TypeError(f"notebooks must be a list of notebook names, got {notebooks!r}")
    jobs = []
    for name in notebooks:
        for old in (build.path / "figures").glob(f"{name}-*"):
            build.remove(f"figures/{old.name}")
        results = build.path / "results" / f"{name}.json"
        if not results.exists():
            continue
        kept = load_results(results)
        for fig_name in kept.figures:
            source = kept.figures_dir / f"{fig_name}.json"
            if source.exists():
                jobs.append((f"{name}-{fig_name}", source))
    if not jobs:
        return {"status": "none kept", "files": []}
    if _chromium() is None:
        return {"status": "skipped: no Chromium found for kaleido (Debian: apt-get install chromium)", "files": []}
    out = build.sub("figures")
    figs, files, formats, heights = [], [], [], []
    for stem, source in jobs:
        fig = pio.read_json(str(source))
        for fmt in FORMATS:
            figs.append(fig)
            files.append(out / f"{stem}.{fmt}")
            formats.append(fmt)
            heights.append(fig.layout.height or HEIGHT_PX)
    try:                                            # one browser session for all of them
        pio.write_images(figs, [str(f) for f in files], format=formats, width=WIDTH_PX, height=heights,
                         scale=[SCALE if fmt == "png" else 1 for fmt in formats])
    except Exception as exc:  # noqa: BLE001 - a broken browser must not cost the notebooks' results
        return {"status": f"skipped: kaleido could not render ({type(exc).__name__}: {exc})"[:300], "files": []}
    return {"status": "rendered", "files": [str(f.relative_to(build.path)) for f in files]}
