"""How ess.sim.timeline.simulate composes one decode step, checked on worked examples computed by hand.

The operation costs are replaced by round numbers (microseconds per token of the micro-batch), so that every step
time below is a sum a reader can redo: Two-Batch Overlap runs each layer for two micro-batches of B/2 requests,
a MoE layer takes the longer of its compute lane and its all-to-all lane, a dense layer has no all-to-all to hide
behind, MTP adds (mtp - 1) draft passes and the output heads, and the fixed time is added once per step. The
overlap formulas themselves (none / DA / DBA) have their own worked examples; here they run on the round-number
costs, with a link speed that makes one miss cost one microsecond."""
import numpy as np
import pytest

import ess.sim.timeline as TL
from ess.sim import Scenario
from ess.sim.costs import CostParams, LayerCosts
from ess.specs import model_spec

US = 1e-6
MODEL = model_spec("deepseek-v3.2-exp")          # 61 layers, the first 3 dense, 58 MoE
B, MTP, ACCEPT = 4, 2, 1.7                       # micro-batch b = 2 requests, n = b x mtp = 4 tokens


def fake_costs(dispatch_us, combine_us, own=True):
    """Per token of the micro-batch (n = b x mtp): indexer 1 us (its split part, logits + top-K, 0.75; on half the
    micro-batch 0.5 + 0.5 flat), PreAttn 2, Attn 3, O_proj 4, dense FFN 10, MoE 20, merge 0.5, dispatch and combine
    as given. Sparse MLA over ``e`` entries per query token of ``r`` requests: 2 + r x 0.125 x (e / 64 + 8) us, which
    at b = 2 requests and K = 2,048 entries is the 12 us of Attn (and 7 us on one request, a DBA half). With
    ``own=False`` no strategy has a cost of its own: no fixed parts, no merge, halves that halve."""
    def layer_costs(model, gpu, dep, micro_batch, context_len, mtp, **kw):
        b = np.asarray(micro_batch, float)
        n = b * np.asarray(mtp, float)
        one = np.ones(np.broadcast(micro_batch, context_len, mtp).shape)
        if not own:
            return LayerCosts(indexer=1 * US * n, indexer_split=0.75 * US * n, indexer_half=0.375 * US * n,
                              pre_attn=2 * US * n, attn=3 * US * n, attn_half=1.5 * US * n, o_proj=4 * US * n,
                              ffn_dense=10 * US * n, moe=20 * US * n, dispatch=dispatch_us * US * n,
                              combine=combine_us * US * n, merge=0 * one, attn_fixed=0 * one,
                              attn_block=3 * US * n / b / 32 * one, attn_overhead_blocks=0.0, block_entries=64,
                              entries=2048.0 * one, selected=np.asarray(mtp) * 2048.0 * one)
        return LayerCosts(indexer=1 * US * n, indexer_split=0.75 * US * n, indexer_half=(0.5 * n + 0.5) * US,
                          pre_attn=2 * US * n, attn=3 * US * n, attn_half=(2 + b / 2 * 0.125 * 40) * US * one,
                          o_proj=4 * US * n, ffn_dense=10 * US * n, moe=20 * US * n, dispatch=dispatch_us * US * n,
                          combine=combine_us * US * n, merge=0.5 * US * n, attn_fixed=2 * US * one,
                          attn_block=0.125 * US * one, attn_overhead_blocks=8.0, block_entries=64,
                          entries=2048.0 * one, selected=np.asarray(mtp) * 2048.0 * one)
    return layer_costs


def install(monkeypatch, dispatch_us, combine_us, own=True):
    """Round-number costs; the output head costs 0.5 us per row, the MTP module's 2h -> h GEMM 0.25 us per row."""
    monkeypatch.setattr(TL, "layer_costs", fake_costs(dispatch_us, combine_us, own))
    monkeypatch.setattr(TL, "lm_head_time_s", lambda tokens, model, gpu: 0.5 * US * np.asarray(tokens, float))
    monkeypatch.setattr(TL, "gemm_time_s", lambda m, n, k, gpu, **kw: 0.25 * US * np.asarray(m, float))


# The overlap formulas on these costs (one micro-batch of b = 2 requests, n = 4 tokens): Indexer split part I = 3
# us and 2.5 on each half, PreAttn p = 8, Attn a = 12 (7 on each half), O_proj 16, merge 2, selected entries
# mtp x K = 4,096 per request. A latent entry is 656 B; at LINK = 1.312 GB/s a miss of each of the micro-batch's 2
# requests takes 2 x 656 / 1.312e9 = 1 us, and the write-back link is infinitely fast and uncapped by host memory
# (no D2H term). With x misses per request and layer, per micro-batch:
#   none = x us
#   DA   = (a_hit + a_miss - a) + merge + max(x - p - a_hit, 0), each query token missing x/2 of its 2,048 entries:
#          a_hit = 2 + 2 x 0.125 x ((2048 - x/2)/64 + 8) = 12 - x/512, a_miss = 4 + x/512, so
#          DA = 4 + 2 + max(x (1 + 1/512) - 20, 0)                          -> 6 us for x <= 19
#   DBA  = (2 x 2.5 - 3) + (2 x 7 - 12) + max(x/2 - 2.5, 0) + max(x/2 - (8 + 7), 0)
#          = 4 + max(x/2 - 2.5, 0) + max(x/2 - 15, 0)                       -> 4 for x <= 5, 6.5 at x = 10
LINK = 1.312


SCENARIO = Scenario(mtp=MTP, accept_ratio=ACCEPT, check_memory=False, params=CostParams(fixed_ms=0.5),
                    h2d_GB_per_s=LINK, d2h_GB_per_s=np.inf, host_memory_cap=False)


def step_us(ratio=0.5, misses=np.zeros(MODEL.n_layers), **changes):
    r = TL.simulate(B, 32768, ratio, misses=misses, scenario=SCENARIO.replace(**changes))
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
    row = r.to_frame().iloc[0]                           # the frame speaks milliseconds
    assert (row.step_ms, row.stall_ms) == (pytest.approx(15.027), pytest.approx(0.0, abs=1e-12))


def test_communication_bound_moe_layers_take_the_all_to_all(monkeypatch):
    install(monkeypatch, dispatch_us=50, combine_us=60)
    _, step = step_us(ratio=1.0)
    # MoE layer: max(compute 240, all-to-all 2 x (200 + 240) = 880) = 880; dense layers still 3 x 160 = 480
    # draft pass (n = 2): max(2 x 60 = 120, 2 x (100 + 120) = 440) + 1 + 2 = 443;  heads 4 + 443 = 447
    # step = 480 + 58 x 880 + 447 + 500 = 52,467 us
    assert step == pytest.approx(52_467)


def test_the_worked_example_uses_the_deepseek_entry():
    from ess.layout import latent_entry_bytes
    from ess.specs import deployment_spec
    assert latent_entry_bytes(MODEL, deployment_spec("paper-table1").kv_dtype) == 656


def test_offload_overhead_counts_twice_and_hides_behind_the_all_to_all(monkeypatch):
    install(monkeypatch, dispatch_us=7, combine_us=8)
    ten = np.full(MODEL.n_layers, 10.0)
    r, step = step_us(strategy="best", misses=ten)
    # x = 10: none 10, DA 6, DBA 6.5 us per micro-batch -> DA, two micro-batches: 12 us on every layer's compute lane
    # layers: 3 x (160 + 12) + 58 x max(240 + 12, 120) = 516 + 14,616 = 15,132;  step = 15,132 + 127 + 500
    assert step == pytest.approx(15_759)
    assert r.stall_s[0] / US == pytest.approx(61 * 12)
    assert r.to_frame().stall_ms[0] == pytest.approx(0.732)
    assert (r.layer_strategy == TL.STRATEGIES.index("da")).all()
    assert r.layer_overhead_s[0] / US == pytest.approx(np.full(61, 12.0))
    _, none = step_us(strategy="none", misses=ten)      # 2 x 10 = 20 us per layer, 61 layers
    assert none - 15_027 == pytest.approx(61 * 20)
    per_layer = ["none"] * 3 + ["dba"] * 58              # 3 x 20 + 58 x 2 x 6.5
    _, mixed = step_us(strategy=per_layer, misses=ten)
    assert mixed - 15_027 == pytest.approx(3 * 20 + 58 * 13)
    _, no_offload = step_us(ratio=1.0, strategy="dba", misses=np.zeros(61))   # nothing copied: no split either
    assert no_offload == pytest.approx(15_027)


def test_an_overhead_shorter_than_the_all_to_all_costs_only_the_dense_layers(monkeypatch):
    install(monkeypatch, dispatch_us=50, combine_us=60)
    _, step = step_us(strategy="none", misses=np.full(MODEL.n_layers, 10.0))
    # MoE layers: max(240 + 20, 880) = 880, unchanged; only the 3 dense layers pay 2 x 10: 52,467 + 60
    assert step == pytest.approx(52_467 + 60)
    _, step = step_us(strategy="none", misses=np.full(MODEL.n_layers, 400.0))
    # 400 misses: 2 x 400 = 800 us, and 240 + 800 = 1,040 > 880 on every MoE layer: 3 x 960 + 58 x 1,040 + 447 + 500
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
    """10 misses on even layers (none 10, DA 6, DBA 6.5 us per micro-batch), 3 on odd ones (none 3, DA 6, DBA 4):
    the per-layer choice is DA on the 31 even layers and none on the 30 odd ones, 2 x (31 x 6 + 30 x 3) = 552 us
    over both micro-batches; a fixed strategy pays 2 x (31 x 10 + 30 x 3) = 800 (none), 2 x 61 x 6 = 732 (DA),
    2 x (31 x 6.5 + 30 x 4) = 643 (DBA)."""
    install(monkeypatch, dispatch_us=7, combine_us=8)
    odd = np.arange(61) % 2 == 1
    misses = np.where(odd, 3.0, 10.0)
    r, best = step_us(strategy="best", misses=misses)
    assert best - 15_027 == pytest.approx(552)
    assert r.layer_strategy[0].tolist() == [0 if o else 1 for o in odd]
    for strategy, extra in (("none", 800), ("da", 732), ("dba", 643)):
        assert step_us(strategy=strategy, misses=misses)[1] - 15_027 == pytest.approx(extra), strategy


def test_few_misses_do_not_pay_a_split(monkeypatch):
    """At 4 misses DBA's split costs as much as the copy it hides (4 us); at 0 misses (the write-back alone, here
    free) every split only costs: the per-layer choice is none."""
    install(monkeypatch, dispatch_us=7, combine_us=8)
    r, step = step_us(strategy="best", misses=np.zeros(MODEL.n_layers))
    assert (r.layer_strategy == 0).all() and step == pytest.approx(15_027)
    r, _ = step_us(strategy="best", misses=np.full(MODEL.n_layers, 2.0))      # none 2, DA 6, DBA 4
    assert (r.layer_strategy == 0).all()
    assert r.layer_overhead_s[0] / US == pytest.approx(np.full(61, 4.0))


def test_best_breaks_ties_towards_the_simpler_strategy(monkeypatch):
    """Equal overheads: 'best' keeps none (no merge, no split batch), and between DA and DBA keeps DA. Here no
    strategy has a cost of its own (no fixed parts, halves that halve), so the ties are exact zeros."""
    install(monkeypatch, dispatch_us=7, combine_us=8, own=False)
    r, _ = step_us(strategy="best", misses=np.zeros(MODEL.n_layers))        # none = DA = DBA = 0
    assert (r.layer_strategy == 0).all()
    # 2 misses: none 2; DA max(2 - 8 - a_hit, 0) = 0; DBA max(1 - 3, 0) + max(1 - 8 - 6, 0) = 0: DA
    r, _ = step_us(strategy="best", misses=np.full(MODEL.n_layers, 2.0))
    assert r.layer_overhead_s[0] / US == pytest.approx(np.zeros(61), abs=1e-12)
    assert (r.layer_strategy == 1).all()
