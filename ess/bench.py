"""The measurement harness the benchmarks share: a timing distribution, the machine and library versions, and the
report file. Benchmarks report ratios against a baseline measured in the same run; nothing here asserts a time."""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable

__all__ = ["distribution", "machine_info", "write_report", "run_benchmark", "REPORT_DIR", "BENCHMARK_DIR"]

REPORT_DIR = Path(__file__).resolve().parent.parent / "build" / "benchmarks"
BENCHMARK_DIR = Path(__file__).resolve().parent.parent / "benchmarks"


def distribution(samples: Iterable[float]) -> dict[str, float]:
    """min, max, median, mean, population std and count of a list of measurements (any unit)."""
    xs = [float(x) for x in samples]
    if not xs:
        raise ValueError("samples must hold at least one measurement")
    return {"min": min(xs), "max": max(xs), "median": statistics.median(xs), "mean": statistics.mean(xs),
            "std": statistics.pstdev(xs), "n": len(xs)}


def machine_info() -> dict[str, Any]:
    """CPU model, core count, thread settings, load average and the versions of the libraries that are timed."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {"cpu": cpu, "logical_cpus": os.cpu_count(), "platform": platform.platform(),
                            "python": platform.python_version()}
    if hasattr(os, "getloadavg"):
        info["loadavg_1_5_15"] = list(os.getloadavg())
    import numpy
    info["numpy"] = numpy.__version__
    try:
        import numba
        info.update(numba=numba.__version__, numba_threads=numba.config.NUMBA_NUM_THREADS)
    except ImportError:  # pragma: no cover - numba is a dependency
        pass
    try:
        import torch
        info.update(torch=torch.__version__, torch_threads=torch.get_num_threads(),
                    cuda=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return info


def write_report(name: str, report: dict, out_dir: str | Path | None = None) -> Path:
    """Write ``report`` (with ``machine_info()`` added when absent) as ``<out_dir>/<name>.json``; ``out_dir``
    defaults to ``build/benchmarks/``."""
    if not name or "/" in name:
        raise ValueError(f"name must be a plain file stem, got {name!r}")
    out = Path(out_dir) if out_dir else REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    # written whole or not at all (a benchmark killed while writing leaves the previous report)
    from .atomic import write_json_atomic
    write_json_atomic(path, {"machine": machine_info(), **report}, indent=1, default=str, allow_nan=True)
    return path


def run_benchmark(name: str, *, timeout_s: float | None = None, **options: Any) -> dict:
    """Run ``benchmarks/<name>.py`` in its own Python process (so that what it sets, such as thread counts, stays
    there) and return the report it writes. Each option becomes a command-line flag (``context_lens=[1, 2]`` ->
    ``--context-lens 1 2``; ``None`` is left out); the report goes to a temporary folder, never over one in
    ``build/benchmarks``. Raises ``ValueError`` for an unknown benchmark and ``RuntimeError`` (with the end of its
    output) when the script fails."""
    script = BENCHMARK_DIR / f"{name}.py"
    if not name or "/" in name or not script.is_file():
        known = sorted(p.stem for p in BENCHMARK_DIR.glob("*.py"))
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(known)}")
    args = [sys.executable, str(script)]
    for key, value in options.items():
        if value is None:
            continue
        args.append("--" + key.replace("_", "-"))
        args += [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(args + ["--out-dir", tmp], capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
            raise RuntimeError(f"benchmark {name} failed (exit {proc.returncode}):\n{tail}")
        return json.loads((Path(tmp) / f"{name}.json").read_text(encoding="utf-8"))
