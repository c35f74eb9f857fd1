"""The studies the notebooks run: the rule that chose the default trace model, and its hit rate."""
import pytest

from ess.studies.locality import VLLM_BUFFER_2K_HIT_RATE, buffer_hit_rate, choose_trace_model


def test_choose_trace_model_worked_examples():
    # the recorded result of data/locality/README.md: uniform 0.634 is 0.166 below 0.80, drift 0.769 is 0.031 below
    chosen, dist = choose_trace_model({"uniform": 0.634, "drift": 0.769})
    assert chosen == "drift" and dist["uniform"] == pytest.approx(0.166) and dist["drift"] == pytest.approx(0.031)
    assert choose_trace_model({"uniform": 0.85, "drift": 0.95})[0] == "uniform"       # inside the band: distance 0
    # a tie keeps uniform (band and rates exact in binary: 0.25 below and 0.25 above)
    assert choose_trace_model({"uniform": 0.25, "drift": 1.0}, band=(0.5, 0.75))[0] == "uniform"
    assert VLLM_BUFFER_2K_HIT_RATE == (0.80, 0.90)


def test_buffer_hit_rate_follows_the_locality():
    # every layer at overlap 1 keeps its set (a step only adds the new window tokens); at overlap 0 nearly every free
    # entry is new each step, so a 2 x K pool hits little beyond the sinks and the window
    kw = dict(steps=6, batch=1, trace_model="uniform", n_layers=2)
    high = buffer_hit_rate(16384, profile=1.0, **kw)
    low = buffer_hit_rate(16384, profile=0.0, **kw)
    assert high > 0.95 and low < 0.2, (high, low)
