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
        memory.largest_batch(4096, 1.0, gpu="MI300X")
    with pytest.raises(TypeError, match="deployment must be"):
        memory.largest_batch(4096, 1.0, deployment=3)


# ---------------------------------------------------------------------------------------------- the batch-limit rule
def _plain_limit(L, r, mtp, dep=DEP):
    """The batch-limit rule written plainly for one configuration (the reference of batch_limits): the KV budget
    over the GPU bytes of a request, the host memory over its latent bytes (offload only), and no request when the
    pool cannot hold what one step selects on average over the layers."""
    import math

    import numpy as np

    from ess.layout import pool_slots, request_cache, step_entries
    from ess.specs import host_spec
    from ess.tracegen import locality_profile
    rc = request_cache(DS, L, r, dep.kv_dtype)
    b_gpu = int(memory.kv_budget_bytes(DS, dep) // rc.gpu_bytes)
    b_host = int(host_spec(dep.host).memory_capacity_GB_per_gpu * 1e9 // rc.latent_host_bytes) if r < 1 else None
    if mtp == 1:
        need = min(DS.index_topk, L)
    else:
        per_layer = step_entries(DS, L, mtp, overlap=locality_profile("paper", DS.n_layers))
        need = math.ceil(float(np.mean(per_layer)))
    if pool_slots(DS, r, L) < need:
        return 0, "infeasible"
    if b_host is not None and b_host < b_gpu:
        return b_host, "host" if b_host else "infeasible"
    return b_gpu, "gpu" if b_gpu else "infeasible"


def test_batch_limits_match_the_plain_rule_and_largest_batch_on_a_grid():
    """Vectorised against the plain rule and the scalar view, over contexts that are and are not whole pages, ratios
    at the pool rule's edge (one step's K entries) and 1-4 query tokens; the pairs unordered and repeated, so that
    each maps back to its own configuration."""
    import numpy as np
    Ls = [1000, 4096, 32768, 32769, 65536, 131072]
    rs = [1.0, 0.5, 0.3, 0.2, 0.1, 0.0625, 0.0625 - 1e-7, 0.05, 0.01]
    L, r, t = (x.ravel() for x in np.meshgrid(Ls, rs, [1, 2, 4], indexing="ij"))
    order = np.random.default_rng(0).permutation(L.size)
    Lf, rf, tf = np.r_[L[order], L], np.r_[r[order], r], np.r_[t[order], t]
    lim = memory.batch_limits(Lf, rf, mtp=tf)
    assert lim.batch.shape == Lf.shape and lim.batch.dtype == np.int64
    for i, (Li, ri, ti) in enumerate(zip(Lf, rf, tf)):
        ref, bound = _plain_limit(int(Li), float(ri), int(ti))
        one = memory.largest_batch(int(Li), float(ri), mtp=int(ti))
        assert (lim.batch[i], lim.limited_by[i]) == (ref, bound) == (one.batch, one.limited_by), (Li, ri, ti)
        assert one == lim.at(i) and (lim.reason[i] == "") == (ref > 0)


def test_batch_limits_broadcast_and_keep_the_shape():
    lim = memory.batch_limits([32768, 131072], [[1.0], [0.2], [0.1]], mtp=2)
    assert lim.batch.tolist() == [[52, 13], [157, 39], [195, 48]]        # notebook 01's H200 limits
    assert lim.limited_by.tolist() == [["gpu", "gpu"], ["gpu", "gpu"], ["host", "host"]]
    assert lim.batch_host.tolist()[0] == [-1, -1]                           # ratio 1: nothing in host memory


def test_the_mtp_union_by_hand():
    """Ratio 0.0625 of 32K is floor(0.0625 x 32,768) = 2,048 slots per request and layer: K for one query token.
    Two tokens select K + ceil((1 - r_l) K) entries on layer l (r_l the layer's overlap, paper Fig. 2 profile);
    the pools hold that on average over the 61 layers, 2,048 + mean ceil((1 - r_l) 2,048) rounded up."""
    import math

    import numpy as np

    from ess.tracegen import locality_profile
    r_l = locality_profile("paper", 61)
    need2 = math.ceil(float(np.mean([2048 + math.ceil((1 - x) * 2048 - 1e-9) for x in r_l])))
    assert memory.step_slots_needed(DS, 32768, 2) == need2
    assert memory.step_slots_needed(DS, 32768, 1) == 2048 and memory.step_slots_needed(DS, 1000, 1) == 1000
    lim = memory.batch_limits(32768, 0.0625, mtp=[1, 2])
    assert lim.batch[0] == memory.largest_batch(32768, 0.0625).batch > 0
    assert lim.batch[1] == 0 and lim.limited_by[1] == "infeasible"
    assert lim.reason[1] == (f"ratio 0.0625 leaves 2048 GPU slots per request and layer, fewer than the {need2} "
                             "entries one step selects on average over the layers (the union of 2 top-K sets)")
    exact = need2 / 32768                                   # floor(need2 / 32768 x 32768) = need2 slots: just enough
    assert memory.largest_batch(32768, exact, mtp=2).batch > 0
    assert memory.largest_batch(32768, (need2 - 1) / 32768, mtp=2).batch == 0


def test_the_reasons_say_what_binds():
    assert memory.largest_batch(8192, 0.1).reason == ("ratio 0.1 leaves 819 GPU slots per request and layer, fewer "
                                                     "than the 2048 entries one step selects (K)")
    import dataclasses

    from ess.specs import host_spec
    small = dataclasses.replace(host_spec("dgx-h200"), memory_capacity_GB=8.0)     # 1 GB per GPU
    lim = memory.largest_batch(131072, 0.5, host=small)      # 131,072 x 656 B x 61 layers = 5.24 GB of latent cache
    assert (lim.batch, lim.limited_by, lim.batch_host) == (0, "infeasible", 0)
    assert lim.reason == "one request needs 5.24 GB of host memory, the host holds 1 GB per GPU"


def test_weights_that_do_not_fit_are_infeasible_everywhere():
    lim = memory.batch_limits([4096, 32768], 1.0, deployment=DEP.replace(ep=1, nodes=1))
    assert not lim.weights_fit and (lim.batch == 0).all() and "do not fit" in lim.reason[0]


def test_ratio_for_batch_is_the_largest_that_fits():
    import numpy as np
    B = np.array([52, 64, 96, 128, 160])
    r = memory.ratio_for_batch(B, 32768)
    assert r[0] == 1.0
    for b, ri in zip(B[1:], r[1:]):
        assert memory.largest_batch(32768, float(ri)).batch >= b
        assert memory.largest_batch(32768, float(ri) + 2e-4).batch < b
    assert np.isnan(memory.ratio_for_batch(100000, 32768))


def test_smallest_step_ratio_holds_one_step():
    r1 = memory.smallest_step_ratio(32768, 1)
    assert r1 == 0.07                                        # 0.06 x 32,768 = 1,966 < 2,048 <= 0.07 x 32,768 = 2,293
    r2 = memory.smallest_step_ratio(32768, 2)
    need2 = memory.step_slots_needed(DS, 32768, 2)
    assert int(r2 * 32768 + 1e-9) >= need2 > int(round(r2 - 0.01, 6) * 32768 + 1e-9)


def test_batch_limits_refuse_bad_input():
    with pytest.raises(ValueError, match="ratio must be in"):
        memory.batch_limits(32768, [0.5, 1.5])
    with pytest.raises(TypeError, match="context_len must be a number"):
        memory.batch_limits("32768", 0.5)
    with pytest.raises(ValueError, match="mtp must hold whole numbers"):
        memory.batch_limits(32768, 0.5, mtp=1.5)
    with pytest.raises(ValueError, match="broadcast"):
        memory.batch_limits([32768, 65536], [0.5, 0.2, 0.1])
    with pytest.raises(ValueError, match="maximum context"):
        memory.batch_limits([32768, 10 ** 6], 0.5)
