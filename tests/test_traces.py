"""Trace format, file I/O, the overlap metric and the recorder (the generators: test_tracegen.py)."""
import numpy as np
import pytest

from ess import tracegen as G
from ess import traces as T
from ess.studies.locality import record_indexer_trace


def small(**kw):
    args = dict(context_len=512, n_layers=3, k=32, mtp=1, steps=12, batch=2, warmup_windows=4, seed=3,
                local_window=4)
    args.update(kw)
    return G.synthetic_trace(G.Workload(**args))


def test_save_load_roundtrip(tmp_path):
    tr = small()
    p = tr.save(tmp_path / "t.npz")
    back = T.load_trace(p)
    assert np.array_equal(back.indices, tr.indices) and np.array_equal(back.windows, tr.windows)
    assert (back.context_len, back.k, back.mtp, back.seed) == (tr.context_len, tr.k, tr.mtp, tr.seed)
    assert back.meta["profile"] == "paper"


def test_bad_traces_raise(tmp_path):
    ok = np.zeros((1, 1, 2, 4), np.int32) + np.arange(4)
    with pytest.raises(ValueError, match="empty"):
        T.Trace(np.zeros((1, 1, 0, 4), np.int32), 16, 4)
    with pytest.raises(ValueError, match="larger than the context"):
        T.Trace(ok, 3, 4)
    with pytest.raises(ValueError, match="4 dimensions"):
        T.Trace(ok[0], 16, 4)
    with pytest.raises(TypeError, match="integers"):
        T.Trace(ok.astype(float), 16, 4)
    dup = ok.copy()
    dup[0, 0, 1, 2] = 0
    with pytest.raises(ValueError, match="repeats"):
        T.Trace(dup, 16, 4)
    far = ok.copy()
    far[0, 0, 0, 0] = 16                     # step 0 reads only positions < 16
    with pytest.raises(ValueError, match="beyond the context"):
        T.Trace(far, 16, 4)
    with pytest.raises(ValueError, match=">= 0"):
        T.Trace(ok - 2, 16, 4)
    with pytest.raises(ValueError, match="larger than the context"):
        G.Workload(100, k=200, n_layers=1, steps=1, batch=1)
    bad = tmp_path / "bad.npz"
    np.savez_compressed(bad, x=np.zeros(3))
    with pytest.raises(ValueError, match="not an ess trace"):
        T.load_trace(bad)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="cannot read"):
        T.load_trace(junk)
    with pytest.raises(ValueError, match="profile"):
        G.locality_profile([0.5, 0.5], 3)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        G.locality_profile(1.5, 3)


class FakeAttention:
    """A stand-in for a sparse attention: each call returns (B, q, K) top-k indices, -1 padded."""

    def __init__(self, rng, B, q, k, L):
        self.rng, self.B, self.q, self.k, self.L = rng, B, q, k, L

    def topk(self):
        out = np.stack([np.stack([self.rng.choice(self.L, self.k, replace=False) for _ in range(self.q)])
                        for _ in range(self.B)])
        out[:, :, -1] = -1
        return out


def test_recorder_collects_union_per_step_and_refuses_partial_steps():
    rng = np.random.default_rng(0)
    fake = FakeAttention(rng, B=2, q=2, k=6, L=50)
    rec = T.TraceRecorder(context_len=50, k=6, n_layers=2, batch=2, mtp=2, meta={"source": "fake"})
    seen = []
    for _ in range(3):
        for layer in range(2):
            idx = fake.topk()
            seen.append(idx)
            rec.observe(layer, idx)
        rec.end_step()
    rec.observe(0, fake.topk())
    with pytest.raises(ValueError, match="not observed"):
        rec.end_step()
    assert rec.steps == 3
    tr = rec.to_trace()
    assert tr.indices.shape[:3] == (2, 2, 3) and tr.meta["source"] == "fake"
    for t in range(3):
        for layer in range(2):
            want = seen[2 * t + layer]
            for b in range(2):
                got = tr.indices[b, layer, t]
                assert set(got[got >= 0]) == set(want[b][want[b] >= 0].ravel())
    with pytest.raises(ValueError, match="shape"):
        rec.observe(0, np.zeros((3, 6), np.int64))
    with pytest.raises(ValueError, match="empty"):
        T.TraceRecorder(context_len=50, k=6, n_layers=1, batch=1).to_trace()


def test_recording_from_the_real_indexer_has_locality_when_queries_do():
    pytest.importorskip("ess.attention")
    hot = record_indexer_trace("tiny", context_len=512, steps=6, batch=1, mtp=1, warmup_windows=2,
                                 query_correlation=0.95, seed=1)
    cold = record_indexer_trace("tiny", context_len=512, steps=6, batch=1, mtp=1, warmup_windows=2,
                                  query_correlation=0.0, seed=1)
    assert hot.k == 64 and hot.windows.shape == (1, 4, 2, 64) and hot.meta["model"] == "tiny"
    assert (hot.set_sizes() == 64).all()
    assert T.adjacent_overlap(hot).mean() > T.adjacent_overlap(cold).mean() + 0.2
    again = record_indexer_trace("tiny", context_len=512, steps=6, batch=1, mtp=1, warmup_windows=2,
                                   query_correlation=0.95, seed=1)
    assert np.array_equal(hot.indices, again.indices)
