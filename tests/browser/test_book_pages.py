"""Every page of the book built by the session's smoke run, opened in a real browser from a local web server: each
plotly figure draws, math renders (with the book's own MathJax), nothing is loaded from another host, no page prints
a path of this machine, and wide tables and code scroll inside their box."""
from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path

import pytest

from _smokebuild import smoke_build

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ("intro.html", "results.html", "pages/03_attention.html", "pages/06_how_ess_is_built.html",
         "notebooks/07_table_32k.html")

_CHECK = """() => {
    const figures = [...document.querySelectorAll('.plotly-graph-div')];
    const undrawn = figures.filter(gd => !(gd._fullLayout && gd.querySelector('.main-svg'))).map(gd => gd.id);
    const math = document.querySelectorAll('.math').length;
    const rendered = document.querySelectorAll('.MathJax_SVG, .MathJax_SVG_Display').length;
    // a box wider than its room must scroll (overflow-x auto or scroll on it or on a box around it in the article)
    const article = document.querySelector('article') || document.body;
    const cut = [...article.querySelectorAll('pre, table, .cell_output .output')].filter(e => {
        if (e.scrollWidth <= e.clientWidth + 1) return false;
        for (let n = e; n && n !== article.parentElement; n = n.parentElement) {
            const o = getComputedStyle(n).overflowX;
            if (o === 'auto' || o === 'scroll') return false;
        }
        return true;
    }).map(e => e.tagName + ': ' + e.textContent.slice(0, 60));
    return {figures: figures.length, undrawn, math, rendered, cut, html: document.documentElement.outerHTML};
}"""


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The smoke build's book, served on 127.0.0.1 (a free port) for the length of the module."""
    build, _ = smoke_build(tmp_path_factory)
    html = build / "book" / "_build" / "html"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(html)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield build, html, f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_every_page_of_the_book(site, page, out_dir):
    build, html, base = site
    pages = sorted(p.relative_to(html).as_posix() for p in html.rglob("*.html")
                   if p.name not in ("genindex.html", "search.html") and "_static" not in p.parts)
    assert {"intro.html", "results.html", "notebooks/01_memory_wall.html"} <= set(pages)
    machine = {str(ROOT), str(build), str(Path.home()) + "/", "/root/", "/tmp/"}
    elsewhere, failed = [], []
    page.on("request", lambda r: elsewhere.append(r.url) if not r.url.startswith((base, "data:", "blob:")) else None)
    page.on("requestfailed", lambda r: failed.append(f"{r.failure} {r.url}"))
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}")
            if r.status >= 400 and not r.url.endswith("/favicon.ico") else None)
    drawn = 0
    for rel in pages:
        source = (html / rel).read_text(encoding="utf-8")
        if 'http-equiv="Refresh"' in source:                   # index.html: a redirect to the introduction
            assert not [p for p in machine if p in source], rel
            continue
        page.goto(base + rel, wait_until="load")
        page.wait_for_function("() => [...document.querySelectorAll('.plotly-graph-div')].every("
                               "gd => gd._fullLayout && gd.querySelector('.main-svg'))", timeout=60_000)
        page.wait_for_function("() => !document.querySelector('script[src*=\"mathjax/MathJax.js\"]') || "
                               "(window.MathJax && MathJax.isReady && MathJax.Hub.queue.pending === 0 && "
                               "!MathJax.Hub.queue.running)", timeout=60_000)      # MathJax done with the page
        seen = page.evaluate(_CHECK)
        assert seen["undrawn"] == [], f"{rel}: figures not drawn: {seen['undrawn']}"
        assert seen["rendered"] >= 1 or seen["math"] == 0, f"{rel}: math not rendered"
        assert seen["cut"] == [], f"{rel}: cut off at the page edge: {seen['cut']}"
        for path in machine:
            assert path not in seen["html"], f"{rel} prints the machine path {path}"
        drawn += seen["figures"]
        if rel in SHOTS:
            page.screenshot(path=str(out_dir / f"book-{rel.replace('/', '-').replace('.html', '')}.png"),
                            full_page=rel != "results.html")
    assert elsewhere == [], f"pages load from other hosts: {sorted(set(elsewhere))[:5]}"
    assert failed == [], f"requests failed: {sorted(set(failed))[:5]}"
    assert drawn >= 8, "every notebook page has figures"
