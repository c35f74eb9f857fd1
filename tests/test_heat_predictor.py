"""The heat history and the LSTM heat predictor."""
import numpy as np
import pytest

from ess import heat_predictor as P
from ess import tracegen as G


@pytest.fixture(scope="module")
def local_trace():
    return G.synthetic_trace(G.Workload(1024, n_layers=2, k=64, mtp=1, steps=40, batch=2, warmup_windows=0, seed=4,
                                        local_window=4, profile=[0.6, 0.85]))


def train(trace, seed=0):
    seqs = [trace.indices[0, l, :30] for l in range(trace.n_layers)]
    return P.LSTMHeatPredictor(history=4, hidden=8, seed=seed).fit(seqs, epochs=3, max_samples=6000)


def test_history_features():
    h = P.History(10, history=3, decay=0.5)
    h.observe(np.array([1, 2, -1]))
    h.observe(np.array([2, 3, -1]))
    f = h.features(np.array([1, 2, 3, 9]))
    assert f.shape == (4, 3, 2)
    assert f[:, 0].tolist() == [[0, 0]] * 4                     # no third step back yet
    assert f[:, 1, 0].tolist() == [1, 1, 0, 0] and f[:, 2, 0].tolist() == [0, 1, 1, 0]
    np.testing.assert_allclose(f[:, 2, 1], [0.5, 1.5, 1.0, 0.0])
    assert sorted(h.recent()) == [1, 2, 3]
    with pytest.raises(ValueError, match="n_positions"):
        h.observe(np.array([10]))


def test_lstm_beats_random_on_a_trace_with_locality(local_trace):
    pred = train(local_trace)
    assert pred.losses[-1] < pred.losses[0]
    for layer in range(local_trace.n_layers):
        rep = P.evaluate_predictor(pred, local_trace.indices[1, layer], start=4)   # another request: held out
        assert rep.precision > 3 * rep.random_precision, rep
        assert rep.precision > 0.5, rep


def test_lstm_is_seeded_and_reproducible(local_trace):
    a, b, c = train(local_trace, 1), train(local_trace, 1), train(local_trace, 2)
    for k, v in a.state_dict().items():
        assert np.array_equal(v.numpy(), b.state_dict()[k].numpy()), k
    assert a.losses == b.losses
    assert any(not np.array_equal(v.numpy(), c.state_dict()[k].numpy()) for k, v in a.state_dict().items())


def test_bad_input():
    p = P.LSTMHeatPredictor(history=2, hidden=4)
    with pytest.raises(ValueError, match="not trained"):
        p.score(P.History(5, 2), np.array([1]))
    with pytest.raises(ValueError, match="non-empty list"):
        p.fit([])
    with pytest.raises(TypeError, match="seq must hold integers"):
        p.fit([np.zeros((3, 2))])
    with pytest.raises(ValueError, match="at least 2 steps"):
        p.fit([np.full((5, 2), -1, np.int32)])
    with pytest.raises(ValueError, match="history"):
        P.LSTMHeatPredictor(history=0)
