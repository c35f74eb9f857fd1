import json

import pytest

from ess.bench import distribution, machine_info, write_report


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
