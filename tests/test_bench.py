import json

import pytest

from ess.bench import distribution, machine_info, run_benchmark, write_report


def test_distribution():
    d = distribution([3, 1, 2, 10])
    assert (d["min"], d["max"], d["median"], d["mean"], d["n"]) == (1, 10, 2.5, 4, 4)
    assert d["std"] == pytest.approx(3.5355, rel=1e-4)
    with pytest.raises(ValueError, match="at least one"):
        distribution([])


def test_report_carries_the_machine(tmp_path):
    path = write_report("demo", {"ratio": 0.5}, tmp_path)
    data = json.loads(path.read_text())
    assert data["ratio"] == 0.5 and data["machine"]["logical_cpus"] >= 1 and "numpy" in data["machine"]
    assert machine_info()["python"]
    with pytest.raises(ValueError, match="plain file stem"):
        write_report("../x", {}, tmp_path)


def test_run_benchmark_runs_the_script_in_its_own_process_and_returns_its_report():
    import numba
    threads = numba.get_num_threads()
    rep = run_benchmark("attention_cost", model="tiny", context_lens=[128, 256], heads=4, repeats=1, threads=1)
    assert [r["context_len"] for r in rep["rows"]] == [128, 256]
    assert rep["config"]["threads"] == 1 and rep["config"]["K"] == 64 and rep["config"]["H"] == 4
    # cumulative dense time: trapezoid 0 -> 128 -> 256 of the per-step times, as the module docstring says
    d = [r["dense_s"] for r in rep["rows"]]
    assert rep["rows"][1]["cumulative_dense_s"] == pytest.approx(128 * d[0] / 2 + 128 * (d[0] + d[1]) / 2)
    assert numba.get_num_threads() == threads                    # the thread setting stayed in the benchmark
    with pytest.raises(ValueError, match="unknown benchmark 'nope'"):
        run_benchmark("nope")
    with pytest.raises(RuntimeError, match="benchmark attention_cost failed"):
        run_benchmark("attention_cost", model="no-such-model")
