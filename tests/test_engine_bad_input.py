"""Bad input to the engine gets a clear error naming the problem before any work starts: a prompt longer than the
context, an empty batch, a ratio whose pool cannot hold one step's K entries, a missing or corrupt model file, and
the arguments of a decode run."""
import numpy as np
import pytest

from engine_helpers import SMALL, prompts, small_engine
from ess.engine import DecodeEngine
from ess.llm import ModelFileError
from llm_helpers import write_tiny_gguf

ENGINE = small_engine()


@pytest.fixture(scope="module")
def pre():
    return ENGINE.prefill(prompts([60, 40], 1), max_new_tokens=8)


def _no_model_work(monkeypatch):
    calls = []
    monkeypatch.setattr(ENGINE.model, "prefill", lambda *a, **k: calls.append(1))
    return calls


def test_prompt_longer_than_the_context(monkeypatch):
    calls = _no_model_work(monkeypatch)
    with pytest.raises(ValueError, match=r"prompts\[1\] has 500 tokens; with max_new_tokens=20 that exceeds the "
                                         r"model's context of 512"):
        ENGINE.prefill(prompts([30, 500]), max_new_tokens=20)
    with pytest.raises(ValueError, match=r"prompts\[0\] has 600 tokens; with max_new_tokens=1 that exceeds"):
        ENGINE.prefill(prompts([600]), max_new_tokens=1)
    assert not calls


def test_empty_batch_and_empty_prompt(monkeypatch):
    calls = _no_model_work(monkeypatch)
    with pytest.raises(ValueError, match="empty batch"):
        ENGINE.prefill([], max_new_tokens=4)
    with pytest.raises(ValueError, match="empty"):
        ENGINE.prefill([[]], max_new_tokens=4)
    with pytest.raises(TypeError, match="engine has no tokenizer"):
        ENGINE.prefill(["some text"], max_new_tokens=4)
    with pytest.raises(TypeError, match="list of prompts"):
        ENGINE.prefill("some text", max_new_tokens=4)
    assert not calls


def test_a_ratio_whose_pool_cannot_hold_one_step(pre, monkeypatch):
    calls = []
    monkeypatch.setattr(ENGINE, "_step", lambda *a, **k: calls.append(1))
    # 60 tokens round up to one 64-token page: ratio 0.1 gives 6 slots, fewer than K = 16
    with pytest.raises(ValueError, match=r"gives 6 GPU slots .* fewer than the 16 entries one step selects"):
        ENGINE.decode(pre, 2, ratio=0.1, topk=16)
    with pytest.raises(ValueError, match="ratio"):
        ENGINE.decode(pre, 2, ratio=1.5)
    assert not calls


@pytest.mark.parametrize("kw, err, msg", [
    ({"schedule": "dba"}, ValueError, "at least 2 requests"),
    ({"schedule": "triple"}, ValueError, "schedule"),
    ({"policy": "belady"}, ValueError, "policy"),
    ({"link_GB_per_s": -1.0}, ValueError, "link_GB_per_s"),
    ({"topk": 0}, ValueError, "topk"),
    ({"feed": np.zeros((1, 3), np.int64)}, ValueError, r"feed must have shape \(B=1, steps \+ 1 = 4\)"),
    ({"feed": np.zeros((1, 4))}, TypeError, "integer token ids"),
    ({"offload": 1}, TypeError, "offload must be True or False"),
    ({"on_step": "print"}, TypeError, "on_step must be callable"),
])
def test_decode_arguments(pre, kw, err, msg, monkeypatch):
    calls = []
    monkeypatch.setattr(ENGINE, "_step", lambda *a, **k: calls.append(1))
    with pytest.raises(err, match=msg):
        ENGINE.decode(pre.select([0]), 3, **kw)
    assert not calls


def test_more_steps_than_the_context_holds(pre):
    with pytest.raises(ValueError, match=r"longest prompt \(60 tokens\) \+ steps \(460\) exceed the model's context"):
        ENGINE.decode(pre, 460)
    with pytest.raises(ValueError, match="keep_dense=True"):
        ENGINE.decode_dense(pre, 2)
    with pytest.raises(TypeError, match="Prefilled"):
        ENGINE.decode("not a prefill", 2)


def test_missing_and_corrupt_model_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model file"):
        DecodeEngine.load(tmp_path / "absent.gguf", cache_dir=None)
    good = tmp_path / "tiny.gguf"
    write_tiny_gguf(good)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[:2000])
    with pytest.raises(ModelFileError, match="truncated or corrupt"):
        DecodeEngine.load(cut, cache_dir=None)
    eng = DecodeEngine.load(good, cache_dir=None)                   # and a whole file loads
    assert eng.format.entry_bytes == 2 * eng.config.n_kv_heads * eng.config.head_dim * 4


def test_the_engine_needs_a_float32_llama_model():
    import torch
    from ess.llm import LlamaModel, LlamaWeights
    with pytest.raises(TypeError, match="LlamaModel"):
        DecodeEngine(object())
    m = LlamaModel(LlamaWeights.random(SMALL), SMALL, dtype=torch.float64)
    with pytest.raises(ValueError, match="float32"):
        DecodeEngine(m)
