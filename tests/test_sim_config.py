"""The simulator's typed configuration: a frozen Scenario, validated without reading data/, resolved on use."""
import dataclasses
import math

import pytest

from ess.sim import CostParams, Scenario
from ess.sim.config import STRATEGIES, as_scenario, default_link_GB_per_s
from ess.specs import DEFAULT_DEPLOYMENT, DEFAULT_MODEL, deployment_spec, gpu_spec


def test_the_defaults_are_the_projects_and_are_resolved_on_use():
    sc = Scenario()
    assert (sc.model, sc.deployment, sc.gpu, sc.mtp, sc.strategy) == (DEFAULT_MODEL, DEFAULT_DEPLOYMENT, None, None,
                                                                     "best")
    r = sc.resolved()
    dep = deployment_spec(DEFAULT_DEPLOYMENT)
    assert (r.mtp, r.accept_ratio, r.gpu.name, r.host.name) == (dep.mtp, dep.mtp_accept_ratio, dep.gpu, dep.host)
    assert (r.h2d_GB_per_s, r.d2h_GB_per_s) == default_link_GB_per_s() == (37.0, 43.0)   # FlashTrans, links.yaml
    assert r.resolved() == r and sc.resolved() == r


def test_construction_never_reads_the_disk(monkeypatch):
    import ess.specs as specs

    def no_disk(*a, **k):
        raise AssertionError("Scenario read data/ while being constructed")
    monkeypatch.setattr(specs, "_read_yaml", no_disk)
    sc = Scenario(gpu="H100", mtp=4, accept_ratio=2.8, h2d_GB_per_s=math.inf, strategy=["da"] * 61)
    sc.replace(strategy="none", params=CostParams(0.5, 1.0, 3.0))


def test_to_dict_is_what_a_record_stores():
    params = CostParams(0.789, 1.2, 43.6, fitted_on="a worked example")
    d = Scenario(mtp=4, accept_ratio=2.8, params=params, check_memory=False).to_dict()
    assert d == {"model": "deepseek-v3.2-exp", "deployment": "paper-table1", "gpu": "H200", "host": "dgx-h200",
                 "mtp": 4, "accept_ratio": 2.8, "h2d_GB_per_s": 37.0, "d2h_GB_per_s": 43.0, "strategy": "best",
                 "params": {"compute_scale": 0.789, "comm_scale": 1.2, "fixed_ms": 43.6,
                            "fitted_on": "a worked example", "part_batch": "central", "efficiency": "central",
                            "attention_transfer": "hopper"},
                 "check_memory": False, "host_memory_cap": True}
    small = dataclasses.replace(gpu_spec("H200"), hbm_capacity_GiB=120.0)     # not a preset any more: in full
    g = Scenario(gpu=small).to_dict()["gpu"]
    assert g["hbm_capacity_GiB"] == 120.0 and g["name"] == "H200" and "sources" not in g
    assert Scenario(gpu=gpu_spec("H100")).to_dict()["gpu"] == "H100"          # a preset spec: by name
    assert Scenario(strategy=("da",) * 61).to_dict()["strategy"] == ["da"] * 61


def test_replace_validates_like_construction():
    sc = Scenario(mtp=2)
    assert sc.replace(strategy="dba").strategy == "dba" and sc.strategy == "best"
    with pytest.raises(ValueError, match="accept_ratio must lie in"):
        sc.replace(accept_ratio=2.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sc.mtp = 3


@pytest.mark.parametrize("kw,exc,msg", [
    ({"model": 3}, TypeError, "Scenario.model must be a preset name or a ModelSpec"),
    ({"gpu": 1.0}, TypeError, "Scenario.gpu must be"),
    ({"mtp": 0}, ValueError, "Scenario.mtp must be a positive integer"),
    ({"mtp": 2.0}, TypeError, "Scenario.mtp must be an integer"),
    ({"accept_ratio": 0.5}, ValueError, "Scenario.accept_ratio must be >= 1"),
    ({"mtp": 2, "accept_ratio": 3.0}, ValueError, "accept_ratio must lie in"),
    ({"h2d_GB_per_s": 0}, ValueError, "Scenario.h2d_GB_per_s must be > 0"),
    ({"d2h_GB_per_s": -math.inf}, ValueError, "Scenario.d2h_GB_per_s must be finite"),
    ({"h2d_GB_per_s": "37"}, TypeError, "Scenario.h2d_GB_per_s must be a number"),
    ({"strategy": "fast"}, ValueError, "Scenario.strategy must be one of"),
    ({"strategy": ["da", "slow"]}, ValueError, "per-layer Scenario.strategy"),
    ({"strategy": 3}, TypeError, "Scenario.strategy must be a name or a sequence"),
    ({"params": {"fixed_ms": 1.0}}, TypeError, "Scenario.params must be a CostParams"),
    ({"check_memory": 1}, TypeError, "Scenario.check_memory must be True or False"),
])
def test_bad_fields_are_named(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        Scenario(**kw)


def test_a_per_layer_strategy_is_kept_as_a_tuple_of_names():
    sc = Scenario(strategy=["none", "da"] * 30 + ["dba"])
    assert isinstance(sc.strategy, tuple) and set(sc.strategy) == set(STRATEGIES)
    hash(sc)                                              # frozen and hashable: usable as a cache key


def test_as_scenario():
    assert as_scenario(None) == Scenario()
    sc = Scenario(mtp=1, accept_ratio=1.0)
    assert as_scenario(sc) is sc
    with pytest.raises(TypeError, match="scenario must be an ess.sim.Scenario"):
        as_scenario({"mtp": 1})
