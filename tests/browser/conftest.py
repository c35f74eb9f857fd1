"""The real-browser tests: JupyterLab on 127.0.0.1 (a token, a free port, its own PID, stopped by PID at the end)
and Debian's Chromium driven headless by the Python ``playwright`` package (never ``playwright install``).

Without Chromium the tests skip, unless ``ESS_REQUIRE_BROWSER=1`` (set by ``.ci/run``), when they fail."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"]


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.slow)


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = _chromium()
    if path is None:
        if os.environ.get("ESS_REQUIRE_BROWSER"):
            pytest.fail("Debian's chromium is not installed (bash scripts/ess.sh setup installs it as root)")
        pytest.skip("Debian's chromium is not installed")
    pytest.importorskip("playwright.sync_api")
    return path


@pytest.fixture(scope="session")
def browser(chromium_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path, headless=True, args=CHROMIUM_FLAGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    try:
        yield pg
    finally:
        context.close()


@pytest.fixture(scope="session")
def out_dir() -> Path:
    """``build/screenshots/``: screenshots and the measured redraw times (``timings.json``)."""
    from ess.pipeline import BuildDir

    return BuildDir.claim(None).sub("screenshots")


class Measurements:
    """Collects what the browser tests measure and writes it to ``build/screenshots/timings.json``."""

    def __init__(self, path: Path):
        self.path = path
        self.data: dict = {"redraw_ms": {}, "saved_notebook_bytes": {}, "machine": {"cpus": os.cpu_count()}}

    def add(self, section: str, key: str, value) -> None:
        self.data[section][key] = value
        self.path.write_text(json.dumps(self.data, indent=1), encoding="utf-8")


@pytest.fixture(scope="session")
def measurements(out_dir) -> Measurements:
    return Measurements(out_dir / "timings.json")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))   # PR_SET_PDEATHSIG


class Lab:
    """A running JupyterLab: ``url(path)`` opens a file of ``root`` with the token, in a fresh workspace of its own
    (two tabs on one workspace would hand the second a copy of the first's layout)."""

    def __init__(self, root: Path, port: int, token: str, proc: subprocess.Popen):
        self.root, self.port, self.token, self.proc = root, port, token, proc

    def url(self, path: str) -> str:
        workspace = Path(path).stem.replace("_", "-")
        return f"http://127.0.0.1:{self.port}/lab/workspaces/{workspace}/tree/{path}?reset&token={self.token}"


@pytest.fixture(scope="session")
def lab(tmp_path_factory, chromium_path):
    """JupyterLab serving a folder of smoke-sized copies of the notebooks, settings and runtime files kept in the
    test's own folders; started in the background and stopped by its PID (SIGTERM: it shuts its kernels down)."""
    from widget_notebooks import prepare

    base = tmp_path_factory.mktemp("lab")
    root = base / "root"
    prepare(root)
    settings = base / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(base / "runtime"), "JUPYTER_CONFIG_DIR": str(base / "config"),
           "JUPYTER_DATA_DIR": str(base / "data")}
    exe = Path(sys.executable).parent / "jupyter-lab"
    cmd = [str(exe), "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           f"--LabServerApp.user_settings_dir={base / 'settings'}", f"--LabServerApp.workspaces_dir={base / 'ws'}"]
    log = open(base / "jupyter-lab.log", "wb")
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=_die_with_parent)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("jupyter-lab did not start: "
                                       + (base / "jupyter-lab.log").read_text(errors="replace")[-2000:])
                time.sleep(0.3)
        yield Lab(root, port, token, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
