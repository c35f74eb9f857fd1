"""How ess.sim.timeline.simulate composes one decode step, checked on worked examples computed by hand.

The operation costs are replaced by round numbers (microseconds per token of the micro-batch), so that every step
time below is a sum a reader can redo: Two-Batch Overlap runs each layer for two micro-batches of B/2 requests,
a MoE layer takes the longer of its compute lane and its all-to-all lane, a dense layer has no all-to-all to hide
behind, MTP adds (mtp - 1) draft passes and the output heads, and the fixed time is added once per step. The
overlap formulas themselves (none / DA / DBA) have their own worked examples; here each strategy's overhead is a
round number too."""
import numpy as np
import pytest

import ess.sim.timeline as TL
from ess.sim.costs import CostParams, LayerCosts
from ess.specs import model_spec

US = 1e-6
MODEL = model_spec("deepseek-v3.2-exp")          # 61 layers, the first 3 dense, 58 MoE
B, MTP, ACCEPT = 4, 2, 1.7                       # micro-batch b = 2 requests, n = b x mtp = 4 tokens


def fake_costs(dispatch_us, combine_us):
    """Per token of the micro-batch: indexer 1 us, PreAttn 2, Attn 3, O_proj 4, dense FFN 10, MoE 20, merge 0.5,
    dispatch and combine as given."""
    def layer_costs(model, gpu, dep, micro_batch, context_len, mtp):
        n = np.asarray(micro_batch, float) * np.asarray(mtp, float)
        one = np.ones(np.broadcast(micro_batch, context_len, mtp).shape)
        return LayerCosts(1 * US * n, 2 * US * n, 3 * US * n, 4 * US * n, 10 * US * n, 20 * US * n,
                          dispatch_us * US * n, combine_us * US * n, 0.5 * US * n, np.asarray(mtp) * 2048.0 * one)
    return layer_costs


def install(monkeypatch, dispatch_us, combine_us, overhead_us=None):
    """Round-number costs; the output head costs 0.5 us per row, the MTP module's 2h -> h GEMM 0.25 us per row;
    each strategy's offload overhead per micro-batch and layer is ``overhead_us`` (and the micro-batch it is asked
    for is recorded)."""
    seen = {}
    monkeypatch.setattr(TL, "layer_costs", fake_costs(dispatch_us, combine_us))
    monkeypatch.setattr(TL, "lm_head_time_s", lambda tokens, model, gpu: 0.5 * US * np.asarray(tokens, float))
    monkeypatch.setattr(TL, "gemm_time_s", lambda m, n, k, gpu, **kw: 0.25 * US * np.asarray(m, float))
    if overhead_us is not None:
        def overhead(costs, micro_batch, misses, mtp, *args, **kwargs):
            seen["micro_batch"] = np.asarray(micro_batch).tolist()
            return {s: np.full(np.shape(misses), v * US) for s, v in overhead_us.items()}
        monkeypatch.setattr(TL, "offload_overhead_s", overhead)
    return seen


def step_us(**kw):
    args = dict(misses=np.zeros(MODEL.n_layers), mtp=MTP, accept_ratio=ACCEPT, check_memory=False,
                params=CostParams(fixed_ms=0.5))
    args.update(kw)
    r = TL.simulate(B, 32768, args.pop("ratio", 0.5), **args)
    return r, r.step_s[0] / US


def test_compute_bound_step_without_offload_by_hand(monkeypatch):
    install(monkeypatch, dispatch_us=7, combine_us=8)
    r, step = step_us(ratio=1.0)
    # n = 4 tokens: Indexer 4 + PreAttn 8 + Attn 12 + O_proj 16 = attention block 40 us
    # dense layer: 2 micro-batches x (40 + FFN 40) = 160;  MoE layer: max(2 x (40 + MoE 80), 2 x (28 + 32)) = 240
    # layers: 3 x 160 + 58 x 240 = 14,400
    # heads: output head for B x mtp = 8 rows = 4; one draft pass at mtp 1 (n = 2): max(2 x (20 + 40), 2 x 30) = 120
    #        plus the MTP GEMM for B = 4 rows (1) and the head for 4 rows (2) = 123  ->  4 + 123 = 127
    # fixed 500;  step = 14,400 + 127 + 500 = 15,027 us
    assert step == pytest.approx(15_027)
    assert r.stall_s[0] == pytest.approx(0, abs=1e-15)
    # 4 requests x 8 GPUs x 1.7 accepted tokens / 15.027 ms
    assert r.throughput[0] == pytest.approx(4 * 8 * 1.7 / 15_027e-6)
    assert r.otps[0] == pytest.approx(1.7 / 15_027e-6)


def test_communication_bound_moe_layers_take_the_all_to_all(monkeypatch):
    install(monkeypatch, dispatch_us=50, combine_us=60)
    _, step = step_us(ratio=1.0)
    # MoE layer: max(compute 240, all-to-all 2 x (200 + 240) = 880) = 880; dense layers still 3 x 160 = 480
    # draft pass (n = 2): max(2 x 60 = 120, 2 x (100 + 120) = 440) + 1 + 2 = 443;  heads 4 + 443 = 447
    # step = 480 + 58 x 880 + 447 + 500 = 52,467 us
    assert step == pytest.approx(52_467)


def test_offload_overhead_counts_twice_and_hides_behind_the_all_to_all(monkeypatch):
    seen = install(monkeypatch, dispatch_us=7, combine_us=8, overhead_us={"none": 10, "da": 6, "dba": 8})
    r, step = step_us(strategy="best")
    assert seen["micro_batch"] == [2.0]                  # the overhead is asked for a micro-batch of B/2
    # best = DA, 6 us per micro-batch, two micro-batches: 12 us on every layer's compute lane (compute-bound here)
    # layers: 3 x (160 + 12) + 58 x max(240 + 12, 120) = 516 + 14,616 = 15,132;  step = 15,132 + 127 + 500
    assert step == pytest.approx(15_759)
    assert r.stall_s[0] / US == pytest.approx(61 * 12)
    assert (r.layer_strategy == TL.STRATEGIES.index("da")).all()
    assert r.layer_overhead_s[0] / US == pytest.approx(np.full(61, 12.0))
    _, none = step_us(strategy="none")                  # 2 x 10 = 20 us per layer, 61 layers
    assert none - 15_027 == pytest.approx(61 * 20)
    per_layer = ["none"] * 3 + ["dba"] * 58              # 3 x 20 + 58 x 16
    _, mixed = step_us(strategy=per_layer)
    assert mixed - 15_027 == pytest.approx(3 * 20 + 58 * 16)


def test_an_overhead_shorter_than_the_all_to_all_costs_only_the_dense_layers(monkeypatch):
    install(monkeypatch, dispatch_us=50, combine_us=60, overhead_us={"none": 10, "da": 6, "dba": 8})
    _, step = step_us(strategy="none")
    # MoE layers: max(240 + 20, 880) = 880, unchanged; only the 3 dense layers pay 2 x 10: 52,467 + 60
    assert step == pytest.approx(52_467 + 60)
    install(monkeypatch, dispatch_us=50, combine_us=60, overhead_us={"none": 400, "da": 400, "dba": 400})
    _, step = step_us(strategy="none")
    # now 240 + 800 = 1,040 > 880 on every MoE layer: 3 x 960 + 58 x 1,040 + 447 + 500
    assert step == pytest.approx(3 * 960 + 58 * 1_040 + 447 + 500)


@pytest.mark.parametrize("mtp,expected", [
    # mtp 1: no draft pass; n = 2 tokens: dense 2 x (20 + 20) = 80, MoE max(2 x (20 + 40), 2 x 30) = 120
    #        3 x 80 + 58 x 120 = 7,200; head for 4 rows = 2; fixed 500 -> 7,702
    (1, 7_702),
    # mtp 3: n = 6: dense 2 x (60 + 60) = 240, MoE max(2 x (60 + 120), 2 x 90) = 360 -> 3 x 240 + 58 x 360 = 21,600;
    #        head for 12 rows = 6; two draft passes of 123 each = 246; fixed 500 -> 22,352
    (3, 22_352),
])
def test_mtp_draft_passes_by_hand(monkeypatch, mtp, expected):
    install(monkeypatch, dispatch_us=7, combine_us=8)
    _, step = step_us(ratio=1.0, mtp=mtp, accept_ratio=1.0)
    assert step == pytest.approx(expected)


def test_the_cost_parameters_scale_their_own_lanes(monkeypatch):
    install(monkeypatch, dispatch_us=50, combine_us=60)
    _, step = step_us(ratio=1.0, params=CostParams(compute_scale=2.0, comm_scale=0.5, fixed_ms=0.0))
    # compute x 2, all-to-all x 0.5: dense 2 x 160 = 320; MoE max(480, 440) = 480 -> 3 x 320 + 58 x 480 = 28,800
    # heads: head 2 x 4 = 8; draft max(2 x 120 = 240, 0.5 x 440 = 220) + 2 x (1 + 2) = 246;  no fixed time
    assert step == pytest.approx(28_800 + 8 + 246)


def test_best_takes_the_cheapest_strategy_of_each_layer(monkeypatch):
    """none 10 us everywhere, DA 6 us on even layers and 14 on odd ones, DBA 8: the per-layer choice is DA on the
    31 even layers and DBA on the 30 odd ones, 2 x (31 x 6 + 30 x 8) = 852 us over both micro-batches; a fixed
    strategy pays 2 x 61 x 10 = 1,220 (none), 2 x (31 x 6 + 30 x 14) = 1,212 (DA), 2 x 61 x 8 = 976 (DBA)."""
    install(monkeypatch, dispatch_us=7, combine_us=8)
    odd = np.arange(61) % 2 == 1

    def overhead(costs, micro_batch, misses, mtp, *args, **kwargs):
        shape = np.shape(misses)
        return {"none": np.full(shape, 10 * US), "da": np.where(odd, 14 * US, 6 * US) * np.ones(shape),
                "dba": np.full(shape, 8 * US)}
    monkeypatch.setattr(TL, "offload_overhead_s", overhead)
    r, best = step_us(strategy="best")
    assert best - 15_027 == pytest.approx(852)
    assert r.layer_strategy[0].tolist() == [2 if o else 1 for o in odd]
    for strategy, extra in (("none", 1_220), ("da", 1_212), ("dba", 976)):
        assert step_us(strategy=strategy)[1] - 15_027 == pytest.approx(extra), strategy


def test_best_breaks_ties_towards_the_simpler_strategy(monkeypatch):
    """Equal overheads: 'best' keeps none (no merge, no split batch), and between DA and DBA keeps DA."""
    install(monkeypatch, dispatch_us=7, combine_us=8, overhead_us={"none": 5, "da": 5, "dba": 5})
    r, _ = step_us(strategy="best")
    assert (r.layer_strategy == 0).all()
    install(monkeypatch, dispatch_us=7, combine_us=8, overhead_us={"none": 9, "da": 5, "dba": 5})
    assert (step_us(strategy="best")[0].layer_strategy == 1).all()
