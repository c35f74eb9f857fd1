import dataclasses

import pytest

from ess import specs


@pytest.mark.parametrize("name", specs.list_models())
def test_every_model_field_has_a_source(name):
    """Every field the file gives has a source; a field it leaves out is one with a default (a DSA model leaves the
    compressed-model fields at theirs), and is at that default."""
    m = specs.model_spec(name)
    fields = [f for f in dataclasses.fields(m) if f.name != "sources"]
    required = {f.name for f in fields if f.default is dataclasses.MISSING}
    assert required <= set(m.sources) <= {f.name for f in fields}
    for f in fields:
        if f.name not in m.sources:
            assert getattr(m, f.name) == f.default, f.name
    assert all(isinstance(s, str) and s.strip() for s in m.sources.values())


def test_deepseek_geometry():
    m = specs.model_spec("deepseek-v3.2-exp")
    assert (m.n_layers, m.hidden_size, m.n_heads, m.kv_lora_rank, m.qk_rope_head_dim) == (61, 7168, 128, 512, 64)
    assert (m.index_n_heads, m.index_head_dim, m.index_topk) == (64, 128, 2048)
    assert m.latent_dim == 576


@pytest.mark.parametrize("name", specs.list_gpus())
def test_gpus_load_with_sources(name):
    g = specs.gpu_spec(name)
    assert g.hbm_capacity_GiB > 0 and g.pcie_GB_per_s_per_direction in (31.5, 63.0, 118.0)
    assert set(g.sources) >= {"hbm_capacity_GiB", "hbm_bandwidth_GB_per_s", "pcie_gen"}


def test_expected_gpu_presets():
    assert set(specs.list_gpus()) == {"H800", "H100", "H200", "H20", "A100-80G", "B200", "B300", "GH200", "GB200"}
    assert specs.gpu_spec("A100-80G").fp8_dense_TFLOPS is None
    assert specs.gpu_spec("H200").hbm_capacity_GiB == 141


@pytest.mark.parametrize("name", specs.list_hosts())
def test_hosts(name):
    h = specs.host_spec(name)
    assert h.memory_capacity_GB_per_gpu > 0


@pytest.mark.parametrize("name", specs.list_deployments())
def test_deployments(name):
    d = specs.deployment_spec(name)
    assert d.ep <= d.n_gpus                       # the experts are spread over the deployment's own GPUs
    assert d.sources["mem_fraction_static"]


def test_paper_deployment_is_table_1():
    """[ARX] Table 1: 4 nodes of 8 GPUs, EP 32, TP 1, MTP 2 at accept ratio 1.7: the 32 GPUs are the EP group."""
    d = specs.deployment_spec("paper-table1")
    assert (d.nodes, d.gpus_per_node, d.n_gpus, d.ep, d.tp, d.mtp, d.mtp_accept_ratio) == (4, 8, 32, 32, 1, 2, 1.7)
    assert d.replace(nodes=8).n_gpus == 64 and d.replace(gpus_per_node=4, ep=16).n_gpus == 16


@pytest.mark.parametrize("loader,kind", [(specs.model_spec, "model"), (specs.gpu_spec, "gpu"),
                                         (specs.host_spec, "host"), (specs.deployment_spec, "deployment")])
def test_unknown_preset_names_the_argument_and_the_choices(loader, kind):
    with pytest.raises(ValueError, match=f"unknown {kind} 'nope'; allowed: "):
        loader("nope")


def test_specs_are_frozen():
    m = specs.model_spec("tiny")
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.n_layers = 3


def test_deployment_validation():
    d = specs.deployment_spec("paper-table1")
    with pytest.raises(ValueError, match="mem_fraction_static"):
        d.replace(mem_fraction_static=1.5)
    with pytest.raises(ValueError, match="ep=64 exceeds"):
        d.replace(ep=64)
    with pytest.raises(ValueError, match="mtp_accept_ratio"):
        d.replace(mtp_accept_ratio=2.5)
    with pytest.raises(ValueError, match="nodes must be > 0"):
        d.replace(nodes=0)
    with pytest.raises(ValueError, match="kv_dtype"):
        d.replace(kv_dtype="int4")


def test_model_validation():
    m = specs.model_spec("tiny")
    with pytest.raises(ValueError, match="kv_lora_rank"):
        dataclasses.replace(m, kv_lora_rank=100)
    with pytest.raises(ValueError, match="hidden_size must be > 0"):
        dataclasses.replace(m, hidden_size=0)


def test_sourced_yaml_rejects_a_value_without_source():
    with pytest.raises(ValueError, match="non-empty source"):
        specs._split_sourced({"x": {"value": 1, "source": ""}}, "test.yaml")


def test_link_figures():
    links = specs.link_figures()
    assert links["flashtrans"]["h2d_GB_per_s"] == 37.0
    assert links["pcie"]["gen5_x16_GB_per_s_per_direction"] == 63.0
