"""Real index sets as traces: the recorder sees every step's selection, the MTP-2 union is built as an MTP step would
read the cache, and the command writes its files whole."""
from types import SimpleNamespace

import numpy as np
import pytest

from engine_helpers import SMALL, small_engine
from ess.studies.real_model import record_traces as R
from ess.traces import Trace, load_trace


class _ByteTokenizer:
    """Text to ids: each byte modulo the small model's vocabulary (enough to feed it real text)."""

    vocab_size = SMALL.vocab_size

    def encode(self, text):
        return [b % SMALL.vocab_size for b in text.encode("utf-8")]


ENGINE = small_engine()
ENGINE.tokenizer = _ByteTokenizer()


def test_mtp_union_worked_example():
    # context 10, K = 2. Steps 0..3 read [3, 5], [10, 4], [5, 11], [12, 6]. MTP step 0 = steps 0 and 1: the cache
    # holds tokens < 10, so 10 (step 0's own token, computed by the MTP step itself) is dropped: [3, 5, 4].
    # MTP step 1 = steps 2 and 3: the cache holds tokens < 12: [5, 11] and [6] (12 dropped): [5, 11, 6].
    idx = np.array([[[[3, 5], [10, 4], [5, 11], [12, 6]]]], np.int32)
    tr = Trace(idx, 10, 2, 1)
    u = R.mtp_union(tr, 2)
    assert u.mtp == 2 and u.steps == 2
    assert [row[row >= 0].tolist() for row in u.indices[0, 0]] == [[3, 5, 4], [5, 11, 6]]


def test_mtp_union_needs_a_one_token_trace():
    tr = Trace(np.array([[[[1, 2]]]], np.int32), 5, 2, 1)
    with pytest.raises(ValueError, match="fewer than mtp"):
        R.mtp_union(tr, 2)
    with pytest.raises(ValueError, match="mtp = 1"):
        R.mtp_union(R.mtp_union(Trace(np.array([[[[1], [2]]]], np.int32), 5, 1, 1), 2), 2)


def test_record_follows_the_engine_step_by_step():
    tr = R.record(ENGINE, context=64, steps=5, batch=2, topk=6, stride=500, progress=False)
    assert (tr.batch, tr.n_layers, tr.steps, tr.k, tr.context_len) == (2, SMALL.n_layers, 5, 6, 64)
    assert (tr.set_sizes() == 6).all()                              # K entries every step and layer
    assert tr.windows is not None and tr.windows.shape[:3] == (2, SMALL.n_layers, 32)
    # the same selections as a decode run of the same text: teacher forcing makes them reproducible
    from ess.llm import reference_text_ids
    text = [reference_text_ids(ENGINE.tokenizer, 70, skip_tokens=s) for s in (0, 500)]
    pre = ENGINE.prefill([t[:64] for t in text], max_new_tokens=5)
    run = ENGINE.decode(pre, 5, offload=False, topk=6, feed=np.array([t[64:70] for t in text]))
    assert run.hits.sum(axis=2).tolist() == (tr.set_sizes().sum(axis=0).T).tolist()
    assert "teacher forced" in tr.meta["decode"] and tr.meta["text_tokens"] == [[0, 69], [500, 569]]


def test_the_command_writes_whole_files(tmp_path, monkeypatch):
    import ess.llm
    monkeypatch.setattr(ess.llm, "load_model", lambda: SimpleNamespace(model=ENGINE.model, tokenizer=ENGINE.tokenizer))
    out = tmp_path / "t.npz"
    written = R.main(["--context", "48", "--steps", "4", "--mtp", "2", "--out", str(out)])
    assert written == [out, tmp_path / "t_mtp2.npz"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.npz", "t_mtp2.npz"]   # no partial file left
    one, two = load_trace(out), load_trace(tmp_path / "t_mtp2.npz")
    assert (one.steps, two.steps, two.mtp) == (4, 2, 2)
    assert one.meta["command"].endswith("--out " + str(out))
    with pytest.raises(SystemExit):
        R.main(["--context", "48", "--steps", "4", "--out", str(tmp_path / "t.txt")])
