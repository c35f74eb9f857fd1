"""What a notebook cost, in build/results/index.json: its wall time (``seconds``) and the peak resident memory of the
kernel that executed it (``peak_rss_bytes``, ess.pipeline.notebook): the operating system's high-water mark of the
kernel, read by the notebook's process once papermill has waited for it."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from ess import pipeline

MB = 1 << 20
# what the test notebooks and processes allocate (and touch): well above a bare Python process (~10 MB) or an idle
# kernel that imported ess.results (~100-200 MB), so that a peak read from the wrong process, or in the wrong unit
# (kibibytes as bytes: 1024 times too small), cannot pass
BIG = 300 * MB


def _in_fresh_python(code: str) -> dict:
    """Run ``code`` in a new interpreter (whose waited-for children are only the ones ``code`` starts) and return
    the JSON it prints last."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_peak_is_the_waited_for_childs_high_water_mark_in_bytes():
    got = _in_fresh_python(f"""
        import json, subprocess, sys
        from ess.pipeline.notebook import kernel_peak_rss_bytes
        before = kernel_peak_rss_bytes()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        small = kernel_peak_rss_bytes()
        # allocated, written (every page resident), freed: the peak stays
        subprocess.run([sys.executable, "-c", "b = b'x' * {BIG}; del b; import time; time.sleep(0.2)"], check=True)
        big = kernel_peak_rss_bytes()
        print(json.dumps({{"before": before, "small": small, "big": big}}))
    """)
    assert got["before"] is None, "no child waited for yet: no peak"
    assert 1 * MB < got["small"] < 100 * MB, got
    assert BIG < got["big"] < BIG + 100 * MB, got


def test_the_notebooks_process_writes_the_kernels_peak_beside_the_spec_also_on_failure(tmp_path):
    """_child_main (the notebook's process): notebook_process.main, here replaced by one that starts and waits for
    a 300 MB child and fails, then the peak written to the spec's usage_path and the exit status passed on."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"usage_path": str(tmp_path / "usage.json")}))
    got = _in_fresh_python(f"""
        import json, subprocess, sys
        from ess.pipeline import notebook, notebook_process
        def fake_main(argv):
            subprocess.run([sys.executable, "-c", "b = b'x' * {BIG}"], check=True)
            return 1
        notebook_process.main = fake_main
        print(json.dumps({{"rc": notebook._child_main([{str(spec)!r}])}}))
    """)
    assert got["rc"] == 1
    peak = json.loads((tmp_path / "usage.json").read_text())["peak_rss_bytes"]
    assert BIG < peak < BIG + 100 * MB
    assert pipeline.notebook._read_peak(tmp_path / "usage.json") == peak
    assert pipeline.notebook._read_peak(tmp_path / "missing.json") is None
    (tmp_path / "usage.json").write_text('{"peak_rss_bytes": -5}')
    assert pipeline.notebook._read_peak(tmp_path / "usage.json") is None


def _index(tmp_path: Path, peak) -> Path:
    path = tmp_path / "index.json"
    path.write_text(json.dumps({"format": "ess-index/2", "run": {"id": "r1", "mode": "full", "status": "complete"},
                                "notebooks": {"01_a": {"status": "complete", "seconds": 1.5,
                                                       "peak_rss_bytes": peak}}}))
    return path


@pytest.mark.parametrize("peak", [-1, 0, 1.5e9, "1 GB", True, [1]])
def test_an_index_with_a_wrong_peak_is_refused(tmp_path, peak):
    with pytest.raises(ValueError, match=r"notebooks\.01_a\.peak_rss_bytes must be a positive number of bytes"):
        pipeline.load_index(_index(tmp_path, peak))


@pytest.mark.parametrize("peak", [None, 123_456_789])
def test_an_index_with_a_peak_or_none_is_read(tmp_path, peak):
    assert pipeline.load_index(_index(tmp_path, peak))["notebooks"]["01_a"]["peak_rss_bytes"] == peak


def _notebook(folder: Path, name: str, *cells: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("smoke = False\nresults_path = ''")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(f"from ess.results import Recorder\nrec = Recorder({name!r}, "
                                                  f"results_path)"),
                *map(nbformat.v4.new_code_cell, cells), nbformat.v4.new_code_cell("rec.save()")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / f"{name}.ipynb")


@pytest.mark.slow
def test_the_index_records_each_notebooks_wall_time_and_its_kernels_peak_memory(tmp_path):
    nbdir, build = tmp_path / "nbs", tmp_path / "build"
    _notebook(nbdir, "01_small", "rec.record('x', 1, '')")
    _notebook(nbdir, "02_big", f"import time\nb = b'x' * {BIG}\ndel b\ntime.sleep(2)\nrec.record('y', 2, '')")
    _notebook(nbdir, "03_fails", f"b = b'x' * {BIG}", "raise ValueError('boom')")
    with pytest.raises(pipeline.ReproduceError, match="03_fails"):
        pipeline.run_all(notebooks_dir=nbdir, build_dir=build, book=False, figures=False, progress=False)
    nbs = pipeline.load_index(build / "results" / "index.json")["notebooks"]
    small, big, failed = nbs["01_small"], nbs["02_big"], nbs["03_fails"]
    for entry in (small, big):
        assert entry["status"] == "complete" and entry["records"] == 1 and entry["attempts"] == 1
        assert {"started", "finished", "seconds", "peak_rss_bytes", "results", "executed", "in_place"} <= set(entry)
        assert isinstance(entry["peak_rss_bytes"], int)
    # the kernel's peak, not papermill's or the pipeline's (the pytest process holds far more than 01's kernel
    # would), nor the memory left at the end (02 freed its bytes before it ended)
    assert 10 * MB < small["peak_rss_bytes"] < BIG, small
    assert big["peak_rss_bytes"] > BIG and big["peak_rss_bytes"] - small["peak_rss_bytes"] > BIG - 50 * MB, big
    assert big["seconds"] >= 2 and small["seconds"] > 0, "the wall time includes the notebook's own cells"
    assert failed["status"] == "failed" and failed["peak_rss_bytes"] > BIG, failed
