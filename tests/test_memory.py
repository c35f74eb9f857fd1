import pytest

from ess import memory
from ess.specs import deployment_spec, model_spec

DS = model_spec("deepseek-v3.2-exp")
DEP = deployment_spec("paper-table1")


def test_parameter_count_matches_the_published_total():
    # DeepSeek-V3 model card: 685B parameters in total (671B main model + 14B MTP module).
    total = sum(memory.param_counts(DS).values())
    assert total == pytest.approx(685e9, rel=0.01)


def test_weights_per_gpu_split_by_expert_parallelism():
    w32 = memory.weights_per_gpu_bytes(DS, DEP)
    w8 = memory.weights_per_gpu_bytes(DS, DEP.replace(ep=8))
    routed = memory.param_counts(DS)["routed_experts"]
    assert w8 - w32 == pytest.approx(routed * (1 / 8 - 1 / 32), rel=0.001)
    assert 30e9 < w32 < 50e9


def test_paper_limits_within_two():
    # Calibration data (paper-facts.md): batch 52 at 32K and 13 at 128K without offload.
    assert abs(memory.largest_batch(32768, 1.0).batch - 52) <= 2
    assert abs(memory.largest_batch(131072, 1.0).batch - 13) <= 2


def test_data_file_holds_the_fitted_fraction():
    assert memory.fit_mem_fraction_static(52, 32768) == DEP.mem_fraction_static


def test_offload_grows_the_batch_and_smaller_ratio_never_shrinks_it():
    batches = [memory.largest_batch(65536, r).batch for r in (1.0, 0.5, 0.3, 0.2)]
    assert batches == sorted(batches) and batches[-1] > 2 * batches[0]


def test_gpu_budget_arithmetic():
    lim = memory.largest_batch(32768, 0.2)
    assert lim.limited_by == "gpu"
    assert lim.batch * lim.gpu_bytes_per_request <= lim.kv_budget_bytes < (lim.batch + 1) * lim.gpu_bytes_per_request


def test_host_memory_can_bind():
    lim = memory.largest_batch(32768, 0.1)
    assert lim.limited_by == "host" and lim.batch == lim.batch_host < lim.batch_gpu
    assert lim.batch * lim.host_bytes_per_request <= lim.host_budget_bytes


def test_ratio_too_small_for_one_step_is_infeasible():
    lim = memory.largest_batch(8192, 0.1)        # 819 slots < K = 2048
    assert lim.batch == 0 and lim.limited_by == "infeasible" and "fewer than the 2048" in lim.reason


def test_weights_that_do_not_fit_raise():
    tiny_ep = DEP.replace(ep=1, nodes=1)
    with pytest.raises(ValueError, match="weights per GPU .* do not fit"):
        memory.largest_batch(4096, 1.0, deployment=tiny_ep)


def test_host_memory_needed():
    assert memory.host_memory_needed_bytes(32, 32768) == 32 * 32768 * 656 * 61
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        memory.host_memory_needed_bytes(0, 32768)


def test_fit_rejects_bad_limits():
    for bad in (-5, 0):
        with pytest.raises(ValueError, match="batch_limit must be a positive integer, got"):
            memory.fit_mem_fraction_static(bad, 32768)
    for bad in (52.7, True, "52"):                   # a wrong type is a TypeError, even a whole float or a bool
        with pytest.raises(TypeError, match="batch_limit must be an integer, got"):
            memory.fit_mem_fraction_static(bad, 32768)


def test_host_memory_accepts_numpy_integers():
    import numpy as np
    assert memory.host_memory_needed_bytes(np.int64(2), 4096) == memory.host_memory_needed_bytes(2, 4096)


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="ratio"):
        memory.largest_batch(32768, 0.0)
    with pytest.raises(TypeError, match="ratio must be a number"):
        memory.largest_batch(32768, True)
    with pytest.raises(ValueError, match="context_len"):
        memory.largest_batch(10 ** 6, 1.0)
    with pytest.raises(ValueError, match="unknown gpu"):
        memory.largest_batch(4096, 1.0, gpu="B300")
    with pytest.raises(TypeError, match="deployment must be"):
        memory.largest_batch(4096, 1.0, deployment=3)
