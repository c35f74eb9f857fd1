"""Every value of every spec file has a source: models, GPUs, hosts, host links, link figures, deployments and the
extrapolation assumptions, read from the YAML files themselves (a value the loaders never read is checked too). A
value only a third-party transcription gives says so ("[secondary]"); a source that cites another project's issue or
pull request names that project, so that it reads as where a measurement was made, not as an issue of ess."""
import re
from pathlib import Path

import pytest
import yaml

from ess import specs

DATA = specs.DATA_DIR
# per-preset files: {field: {value, source}}; grouped files: {group: {field: {value, source}}}
FLAT = sorted((DATA / "models").glob("*.yaml")) + sorted((DATA / "deployments").glob("*.yaml"))
GROUPED = [DATA / "hardware" / f for f in ("gpus.yaml", "hosts.yaml", "links.yaml", "host_links.yaml")]
CALIBRATION = [DATA / "calibration" / "extrapolation.yaml", DATA / "calibration" / "kernel_points.yaml"]


def _entries(path: Path):
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    if path in GROUPED:
        for group, fields in raw.items():
            for key, entry in fields.items():
                yield f"{path.name}:{group}.{key}", entry
    else:
        for key, entry in raw.items():
            yield f"{path.relative_to(DATA)}:{key}", entry


ALL = [e for p in FLAT + GROUPED + CALIBRATION for e in _entries(p)]


def test_the_spec_files_are_all_there():
    names = {p.stem for p in FLAT}
    assert {"deepseek-v3.2", "glm-5", "deepseek-v4-flash", "paper-table1"} <= names
    assert {f"paper-shape-{g.lower()}" for g in ("H20", "H800", "H100", "GH200", "B200", "B300", "GB200")} <= names
    assert len(ALL) > 400


@pytest.mark.parametrize("where,entry", ALL, ids=[w for w, _ in ALL])
def test_every_value_has_a_non_empty_source(where, entry):
    assert isinstance(entry, dict) and "value" in entry, f"{where}: not {{value, source}}"
    assert isinstance(entry.get("source"), str) and entry["source"].strip(), f"{where}: no source"


# third-party transcriptions of vendor or model-card figures: a value resting on one of them must say so
_SECONDARY_SITES = ("glennklockwood", "verda.com", "willitrunai", "huggingface.co/hardware", "NeMo AutoModel",
                    "[NEMO-V32]", "[GLM-TR]", "[V4-CFG]", "GH200 material as transcribed")


@pytest.mark.parametrize("where,entry", ALL, ids=[w for w, _ in ALL])
def test_a_value_only_a_secondary_source_gives_is_marked(where, entry):
    src = entry["source"]
    if any(site in src for site in _SECONDARY_SITES):
        primary = ("datasheet" in src and "[secondary]" not in src) or "[TF-GLM]" in src or "[FMLA" in src \
                  or "MLPerf" in src or "[TF-V4]" in src or "[LMSYS-V4]" in src
        assert "[secondary]" in src or primary, f"{where}: a third-party figure not marked [secondary]: {src}"


_ISSUE = re.compile(r"\b(issue|issues|PR|pull|pull request)\s*#?\s*(\d+)", re.IGNORECASE)
_PROJECT = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+|\b(sglang|SGLang|vLLM|vllm|DeepEP|FlashMLA|DeepGEMM)\b")


@pytest.mark.parametrize("where,entry", ALL, ids=[w for w, _ in ALL])
def test_an_issue_number_locates_a_measurement_of_another_project(where, entry):
    src = entry["source"]
    for m in _ISSUE.finditer(src):
        before = src[max(0, m.start() - 60):m.start()]
        assert _PROJECT.search(before), f"{where}: '{m.group(0)}' does not name the project it belongs to: {src}"


def test_the_new_gpus_carry_power_and_sm_count():
    for g in ("H20", "H800", "H100", "H200", "GH200", "B200", "B300", "GB200"):
        spec = specs.gpu_spec(g)
        assert spec.tdp_W and spec.sm_count and spec.fp8_dense_TFLOPS and spec.bf16_dense_TFLOPS
        assert set(spec.sources) >= {"tdp_W", "sm_count", "host_interface", "architecture"}
    assert specs.gpu_spec("B300").pcie_gen == 6                  # PCIe gen 6 is allowed now
    assert specs.gpu_spec("GB200").host_interface == specs.gpu_spec("GH200").host_interface == "nvlink-c2c"


def test_host_links_serve_the_gpus_they_can_reach():
    c2c, gen6 = specs.host_link_spec("c2c-gh200"), specs.host_link_spec("pcie6")
    assert c2c.serves(specs.gpu_spec("GB200")) and not c2c.serves(specs.gpu_spec("H200"))
    assert gen6.serves(specs.gpu_spec("B300")) and not gen6.serves(specs.gpu_spec("B200"))
    assert specs.host_link_spec("pcie4").serves(specs.gpu_spec("H200"))         # a slower host is a what-if
    for g in ("H20", "H800", "H100", "H200", "GH200", "B200", "B300", "GB200"):
        assert specs.host_link_spec(specs.reference_link(g)).serves(specs.gpu_spec(g))
    with pytest.raises(ValueError, match="reference_for"):
        specs.reference_link("A100-80G")


def test_every_grid_deployment_is_the_papers_shape():
    paper = specs.deployment_spec("paper-table1")
    for g in ("H20", "H800", "H100", "GH200", "B200", "B300", "GB200"):
        d = specs.deployment_spec(f"paper-shape-{g.lower()}")
        assert (d.gpu, d.tp, d.ep, d.attention_dp, d.mtp, d.mtp_accept_ratio, d.kv_dtype) == \
            (g, paper.tp, paper.ep, paper.attention_dp, paper.mtp, paper.mtp_accept_ratio, paper.kv_dtype)
        assert d.n_gpus == paper.n_gpus and d.max_batch_per_gpu == paper.max_batch_per_gpu == 320
        # the paper's runtime reserve kept in GiB: 141 x (1 - 0.817) = 25.80 GiB on every GPU (3 decimals)
        hbm = specs.gpu_spec(g).hbm_capacity_GiB
        assert abs(hbm * (1 - d.mem_fraction_static) - 141 * (1 - 0.817)) < 0.5 * hbm * 1e-3 + 1e-9
        assert d.ep_transport == ("nvlink" if g == "GB200" else "rdma")
