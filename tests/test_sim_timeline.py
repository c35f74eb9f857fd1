"""The step timeline: limits and monotonicity of the offload overhead, memory feasibility, bad input."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ess.sim import Scenario
from ess.sim.costs import CostParams
from ess.sim.timeline import STRATEGIES, best_batch, simulate
from ess.specs import deployment_spec

NL = 61
RNG = np.random.default_rng(0)
MISSES = RNG.uniform(0, 1500, NL)


@pytest.mark.parametrize("strategy", ["none", "dba", "best"])
def test_infinite_link_has_no_offload_overhead(strategy):
    """On an infinitely fast link the copies cost nothing: none adds nothing, and DA and DBA only their own split
    (a second attention launch and the merge; the halves of the indexer and attention) -- which the per-layer choice
    never takes when nothing has to be hidden."""
    r = simulate([64, 160], 32768, [0.2, 0.1], misses=MISSES,
                 scenario=Scenario(h2d_GB_per_s=np.inf, d2h_GB_per_s=np.inf, strategy=strategy, host_memory_cap=False))
    assert r.feasible.all()
    if strategy in ("none", "best"):
        assert np.allclose(r.step_s, r.step_no_offload_s, rtol=0, atol=1e-12)
        assert (r.layer_strategy == 0).all()
    else:
        assert (r.step_s > r.step_no_offload_s).all()


def test_host_memory_caps_an_infinite_link():
    capped = simulate(64, 32768, 0.2, misses=MISSES, scenario=Scenario(h2d_GB_per_s=np.inf, strategy="none"))
    at_cap = simulate(64, 32768, 0.2, misses=MISSES, scenario=Scenario(h2d_GB_per_s=2 * 307 / 8, strategy="none"))
    assert capped.step_s[0] == pytest.approx(at_cap.step_s[0])


def test_dual_attention_on_an_infinite_link_costs_its_split_whatever_the_misses():
    """DA's own cost (the second attention launch and the merge) does not depend on the misses: on an infinite link
    the stall is the same with misses as without, and positive."""
    sc = Scenario(h2d_GB_per_s=np.inf, d2h_GB_per_s=np.inf, strategy="da", host_memory_cap=False)
    r = simulate(64, 32768, 0.2, misses=MISSES, scenario=sc)
    r0 = simulate(64, 32768, 0.2, misses=np.zeros(NL), scenario=sc)
    assert r.stall_s[0] > 0
    assert r0.stall_s[0] == pytest.approx(r.stall_s[0], rel=1e-9)


@pytest.mark.parametrize("strategy", ["none", "da", "dba", "best"])
def test_throughput_never_rises_when_the_link_slows(strategy):
    links = np.array([np.inf, 256, 64, 37, 16, 4, 1, 0.25])
    r = simulate(128, 131072 // 4, 0.2, misses=MISSES, h2d_GB_per_s=links, scenario=Scenario(strategy=strategy))
    assert np.all(np.diff(r.throughput) <= 1e-9)
    assert r.throughput[-1] < r.throughput[0]


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 160), st.sampled_from([4096, 32768, 131072]), st.floats(1, 3000),
       st.sampled_from(["none", "da", "dba", "best"]), st.floats(1, 80))
def test_more_misses_never_make_a_step_shorter(batch, L, scale, strategy, link):
    rng = np.random.default_rng(batch)
    ksel = 2 * min(2048, L)
    base = rng.uniform(0, 1, NL) * min(scale, ksel)
    more = np.minimum(base + rng.uniform(0, 1, NL) * min(scale, ksel), ksel)
    r = simulate([batch, batch], L, 0.2, misses=np.stack([base, more]),
                 scenario=Scenario(h2d_GB_per_s=link, strategy=strategy, check_memory=False))
    assert r.step_s[1] >= r.step_s[0] - 1e-15


def test_a_per_layer_list_of_one_strategy_is_that_strategy():
    # (which strategy "best" picks on each layer is worked by hand in test_sim_step_by_hand.py)
    dba = simulate(96, 131072, 0.1, misses=MISSES, scenario=Scenario(strategy="dba", check_memory=False))
    per_layer = simulate(96, 131072, 0.1, misses=MISSES, scenario=Scenario(strategy=["dba"] * NL, check_memory=False))
    assert per_layer.step_s[0] == pytest.approx(dba.step_s[0])
    assert (per_layer.layer_strategy == STRATEGIES.index("dba")).all()


def test_no_offload_ignores_link_and_misses():
    a = simulate(52, 32768, 1.0, misses=MISSES, h2d_GB_per_s=0.1)
    b = simulate(52, 32768, 1.0)
    assert a.step_s[0] == b.step_s[0] and a.stall_s[0] == 0


def test_step_grows_with_context_batch_and_mtp():
    r = simulate([52, 52, 52, 64], [8192, 32768, 32768, 32768], 1.0, mtp=[2, 2, 4, 2], accept_ratio=1.7,
                 scenario=Scenario(check_memory=False))
    s = r.step_s
    assert s[1] > s[0] and s[2] > s[1] and s[3] > s[1]


def test_beyond_memory_is_infeasible_with_a_reason():
    r = simulate([52, 53], 32768, 1.0)
    assert r.feasible.tolist() == [True, False]
    assert np.isnan(r.throughput[1]) and "memory limit of 52" in r.reason[1]


def test_weights_that_do_not_fit_are_infeasible_with_a_reason():
    dep = deployment_spec("paper-table1").replace(ep=1, nodes=1)
    r = simulate(1, 4096, 1.0, scenario=Scenario(deployment=dep))
    assert not r.feasible[0] and "do not fit" in r.reason[0]


def test_too_small_ratio_is_infeasible():
    r = simulate(10, 32768, 0.01, misses=np.zeros(NL))
    assert not r.feasible[0] and "slots" in r.reason[0]


def test_best_batch_respects_the_otps_floor():
    free = best_batch(32768, [1.0])
    assert free["batch"] == 52
    slow = best_batch(32768, [1.0], otps_floor=free["otps"] + 1, scenario=Scenario(params=CostParams(fixed_ms=1.0)))
    assert slow["batch"] is None or slow["otps"] >= free["otps"] + 1
    nothing = best_batch(32768, [1.0], otps_floor=1e6)
    assert nothing["batch"] is None and "OTPS" in nothing["reason"]


@pytest.mark.parametrize("kw,err", [
    ({"ratio": 0.2}, "misses"),
    ({"ratio": 0.2, "misses": np.zeros(5)}, "shape"),
    ({"ratio": 0.2, "misses": -np.ones(NL)}, ">= 0"),
    ({"ratio": 0.2, "misses": np.full(NL, 5000.0)}, "exceed"),
    ({"scenario": Scenario(strategy=["da"] * 3)}, "per-layer"),
    ({"accept_ratio": 2.5}, "accept_ratio"),
    ({"ratio": 1.5}, "ratio"),
    ({"batch": 0}, "batch"),
    ({"batch": 2.5}, "whole"),
    ({"h2d_GB_per_s": 0}, "h2d"),
])
def test_bad_input_is_rejected(kw, err):
    args = {"batch": 8, "context_len": 32768, **kw}
    with pytest.raises(ValueError, match=err):
        simulate(args.pop("batch"), args.pop("context_len"), **args)


def test_bad_scenario_type():
    with pytest.raises(TypeError, match="scenario must be an ess.sim.Scenario"):
        simulate(8, 32768, scenario={"params": CostParams()})
    with pytest.raises(TypeError, match="unexpected keyword"):
        simulate(8, 32768, params=CostParams())             # the scenario is passed whole, not as loose keywords


def test_rows_of_misses_count_configurations():
    m = np.stack([np.zeros(NL), np.full(NL, 300.0)])
    r = simulate(96, 32768, 0.4559, misses=m)
    assert r.step_s.shape == (2,) and r.step_s[1] > r.step_s[0]


def _reference_step_layers(B, L, r, misses, mtp, link, d2h, strategy, params):
    """The per-layer part of a step written plainly with offload_overhead_s, the readable reference of the overlap
    formulas: per layer the chosen strategy's overhead (both micro-batches), then the sum over the layers of
    compute + overhead, against the all-to-all lane on the MoE layers."""
    from ess.layout import latent_entry_bytes
    from ess.sim.costs import layer_costs
    from ess.sim.timeline import offload_overhead_s
    from ess.specs import resolve
    model, dep, gpu, host = resolve("deepseek-v3.2-exp", "paper-table1", None, None)
    cap = host.sockets * host.memory_bandwidth_GB_per_s_per_socket / host.gpus
    b = B / 2.0
    c = layer_costs(model, gpu, dep, b, L, mtp).scaled(params.compute_scale, params.comm_scale)
    off = r < 1
    m = np.where(off[:, None], misses, 0.0)
    over = offload_overhead_s(c, b, m, mtp, np.minimum(link, cap), np.minimum(d2h, cap),
                              latent_entry_bytes(model, dep.kv_dtype), off)
    stack = np.stack([over[s] for s in STRATEGIES])
    if strategy == "best":
        chosen, choice = stack.min(axis=0), stack.argmin(axis=0)      # argmin: ties to the first (none, DA, DBA)
    else:
        chosen, choice = over[strategy], np.full(m.shape, STRATEGIES.index(strategy))
    layer_over = 2 * chosen
    dense = model.n_dense_layers
    comp_d = 2 * (c.attention_block + c.ffn_dense)
    comp_m = 2 * (c.attention_block + c.moe)
    comm_m = 2 * (c.dispatch + c.combine)
    layers = (dense * comp_d + layer_over[:, :dense].sum(axis=1)
              + np.maximum(layer_over[:, dense:] + comp_m[:, None], comm_m[:, None]).sum(axis=1))
    layers0 = dense * comp_d + (NL - dense) * np.maximum(comp_m, comm_m)
    return layers - layers0, layer_over, choice, stack


@pytest.mark.parametrize("strategy", ["best", "none", "da", "dba"])
@pytest.mark.parametrize("shared", [True, False])
def test_fused_timeline_matches_the_readable_reference(strategy, shared):
    """The Numba kernel of simulate against offload_overhead_s and the lanes written with numpy, on random
    configurations (some without offload, some links infinitely fast, some misses zero)."""
    rng = np.random.default_rng(7)
    n = 257
    B = rng.integers(1, 200, n).astype(float)
    L = rng.choice([1000, 4096, 32768, 131072], n).astype(float)
    r = rng.choice([1.0, 0.5, 0.2, 0.1], n)
    mtp = rng.choice([1, 2, 3, 4], n).astype(float)
    link = rng.choice([4.0, 37.0, 300.0, np.inf], n)
    d2h = rng.choice([0.05, 8.0, 43.0, np.inf], n)       # 0.05: a write-back longer than what hides it
    sel = mtp * np.minimum(2048, L)
    misses = (rng.uniform(0, 1, (1 if shared else n, NL)) * (sel.min() if shared else sel[:, None]))
    misses[:, ::7] = 0.0
    params = CostParams(0.8, 1.3, 30.0)
    res = simulate(B, L, r, misses=misses[0] if shared else misses, mtp=mtp, accept_ratio=1.0, h2d_GB_per_s=link,
                   d2h_GB_per_s=d2h, scenario=Scenario(strategy=strategy, params=params, check_memory=False))
    stall, layer_over, choice, stack = _reference_step_layers(B, L, r, np.broadcast_to(misses, (n, NL)), mtp, link,
                                                              d2h, strategy, params)
    np.testing.assert_allclose(res.layer_overhead_s, layer_over, rtol=1e-12, atol=1e-15)
    picked = np.take_along_axis(stack, res.layer_strategy[None].astype(np.int64), 0)[0]
    ref = np.take_along_axis(stack, choice[None].astype(np.int64), 0)[0]
    assert np.array_equal(picked, ref)                      # the same strategy, or one with exactly the same cost
    np.testing.assert_allclose(res.stall_s, stall, rtol=1e-9, atol=1e-12)
    assert (res.stall_s[r == 1] == 0).all() and (res.layer_overhead_s[r == 1] == 0).all()


def test_best_batch_uses_the_misses_of_each_offload_ratio():
    """With zero misses at ratio 0.5, offload admits more than the no-offload 52 requests at 32K and wins."""
    got = best_batch(32768, [1.0, 0.5], misses_by_ratio={0.5: np.zeros(NL)})
    assert got["ratio"] == 0.5 and got["batch"] > 52
    again = simulate(got["batch"], 32768, 0.5, misses=np.zeros(NL))
    assert got["step_ms"] == pytest.approx(again.step_s[0] * 1e3) and got["otps"] == pytest.approx(again.otps[0])
    with pytest.raises(ValueError, match="misses_by_ratio must give"):
        best_batch(32768, [1.0, 0.5], misses_by_ratio={0.4: np.zeros(NL)})


def test_an_otps_floor_between_the_batches_picks_the_largest_batch_above_it():
    """OTPS falls as the batch grows: a floor between batch 20's and batch 30's OTPS keeps batches up to about 20-30
    and refuses the larger ones (a configuration below the floor must never win)."""
    r = simulate([20, 30], 32768, 1.0)
    floor = float(r.otps.mean())
    got = best_batch(32768, [1.0], otps_floor=floor)
    assert got["otps"] >= floor and 20 <= got["batch"] < 30


def test_one_row_of_misses_for_several_configurations_is_refused():
    """Misses of shape (1, n_layers) are one configuration's: given with two configurations they are refused (a
    1-D array of n_layers is what every configuration shares), and the message names the per-configuration
    arguments, the misses' rows among them."""
    with pytest.raises(ValueError, match=r"misses must have shape"):
        simulate([32, 64], 32768, 0.5, misses=np.zeros((1, NL)))
    with pytest.raises(ValueError, match=r"misses \(rows\)"):
        simulate([32, 64, 96], 32768, 0.5, misses=np.zeros((2, NL)))
