"""environment.yml (conda) must list the same dependencies as pyproject.toml (pip)."""
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONDA_NAMES = {"pytorch": "torch", "python-kaleido": "kaleido"}          # conda-forge name -> PyPI name


def _name(req: str) -> str:
    return re.split(r"[<>=!\[ ;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pip_deps() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra, items in project["optional-dependencies"].items():
        reqs += [r for r in items if not r.startswith("ess[")]
    out = {}
    for r in reqs:
        name = _name(r)
        if name == "dask" and "[distributed]" in r:
            out["distributed"] = r.replace("dask[distributed]", "distributed")
        out[name] = r.replace("[distributed]", "")
    return out


def _conda_deps() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    out = {}
    for dep in env["dependencies"]:
        if isinstance(dep, str) and _name(dep) not in ("python", "pip"):
            name = CONDA_NAMES.get(_name(dep), _name(dep))
            out[name] = dep
    return out


def _spec(req: str) -> str:
    return re.sub(r"\s+", "", re.sub(r"^[A-Za-z0-9_.\-\[\]]+", "", req.split("#")[0]))


def test_same_packages():
    pip, conda = _pip_deps(), _conda_deps()
    assert set(pip) == set(conda), f"only pip: {set(pip) - set(conda)}; only conda: {set(conda) - set(pip)}"


def test_same_version_bounds():
    pip, conda = _pip_deps(), _conda_deps()
    diff = {n: (pip[n], conda[n]) for n in pip if _spec(pip[n]) != _spec(conda[n])}
    assert not diff, diff
