"""Bad input to the engine gets a clear error naming the problem before any work starts: a prompt longer than the
context, an empty batch, a ratio whose pool cannot hold one step's K entries, a missing or corrupt model file, the
fields of a DecodeConfig (strings where booleans are meant, floats where counts are meant, a link speed that is not
a positive finite number), a dtype the model cannot run in and a device that is not there."""
import numpy as np
import pytest

from engine_helpers import SMALL, prompts, small_engine
from ess.engine import DecodeConfig, DecodeEngine, DecodeSession
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


def _no_decoding(monkeypatch) -> list:
    calls = []
    monkeypatch.setattr(DecodeSession, "_decode_step", lambda *a, **k: calls.append(1))
    return calls


def test_a_ratio_whose_pool_cannot_hold_one_step(pre, monkeypatch):
    calls = _no_decoding(monkeypatch)
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
    ({"warmup": "no"}, TypeError, "warmup must be True or False"),
    ({"keep_logits": 1}, TypeError, "keep_logits must be True or False"),
    ({"topk": 8.0}, TypeError, "topk must be an integer"),
    ({"ratio": "0.5"}, TypeError, "ratio must be a number"),
    ({"link_GB_per_s": float("nan")}, ValueError, "link_GB_per_s must be finite"),
    ({"link_GB_per_s": float("inf")}, ValueError, "link_GB_per_s must be finite"),
    ({"link_GB_per_s": 0}, ValueError, "link_GB_per_s must be > 0"),
    ({"link_GB_per_s": "fast"}, TypeError, "link_GB_per_s must be a number"),
    ({"clock": "gpu"}, ValueError, "clock must be one of"),
    ({"backend": "cupy"}, ValueError, "backend must be one of"),
    ({"policy_options": {"decay": 2.0}, "policy": "heat"}, ValueError, "decay"),
    ({"policy_options": {"speed": 1}, "policy": "lru"}, TypeError, "policy_options"),
    ({"ratios": 0.5}, TypeError, "ratios"),
])
def test_decode_arguments(pre, kw, err, msg, monkeypatch):
    calls = _no_decoding(monkeypatch)
    with pytest.raises(err, match=msg):
        ENGINE.decode(pre.select([0]), 3, **kw)
    assert not calls


def test_a_config_is_checked_when_made_and_passed_whole(pre, monkeypatch):
    with pytest.raises(TypeError, match="warmup must be True or False, got str 'no'"):
        DecodeConfig(warmup="no")
    cfg = DecodeConfig(ratio=0.25, schedule="da", topk=np.int64(8), link_GB_per_s=1)
    assert cfg.topk == 8 and type(cfg.topk) is int and cfg.link_GB_per_s == 1.0
    assert cfg.to_dict()["schedule"] == "da" and cfg.replace(ratio=0.5).ratio == 0.5
    with pytest.raises(ValueError, match="ratio"):
        cfg.replace(ratio=0.0)
    calls = _no_decoding(monkeypatch)
    with pytest.raises(TypeError, match="not both"):
        ENGINE.start(pre, 2, cfg, ratio=0.5)
    with pytest.raises(TypeError, match="config must be an ess.engine.DecodeConfig"):
        ENGINE.start(pre, 2, {"ratio": 0.5})
    assert not calls
    monkeypatch.undo()
    run = ENGINE.decode(pre, 2, cfg)                             # the config as given, and the run's own facts
    assert run.config["schedule"] == "da" and run.config["topk"] == 8 and run.config["ratio"] == 0.25
    assert run.config["output_meaningful"] and run.config["mode"] == "offload" and run.tokens.shape == (2, 3)
    same = ENGINE.decode(pre, 2, ratio=0.25, schedule="da", topk=8, link_GB_per_s=1)   # keywords build the same
    np.testing.assert_array_equal(same.tokens, run.tokens)


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


def test_a_dtype_the_model_cannot_run_in_and_a_device_that_is_not_there():
    import torch
    from ess.llm import LlamaModel, LlamaWeights, load_model
    w = LlamaWeights.random(SMALL)
    with pytest.raises(ValueError, match="float16 overflows"):
        LlamaModel(w, SMALL, dtype=torch.float16)
    with pytest.raises(ValueError, match="dtype must be one of"):
        LlamaModel(w, SMALL, dtype=torch.int32)
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda"):
        LlamaModel(w, SMALL, device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"device='cuda:0' was asked for but this machine has 0 CUDA"):
            LlamaModel(w, SMALL, device="cuda:0")
        with pytest.raises(ValueError, match="CUDA device"):           # before the file is read
            load_model("/nonexistent.gguf", device="cuda")


def test_the_engine_needs_a_float32_llama_model():
    import torch
    from ess.llm import LlamaModel, LlamaWeights
    with pytest.raises(TypeError, match="LlamaModel"):
        DecodeEngine(object())
    m = LlamaModel(LlamaWeights.random(SMALL), SMALL, dtype=torch.float64)
    with pytest.raises(ValueError, match="float32"):
        DecodeEngine(m)


def test_past_the_trained_context_is_explicit_and_recorded(tmp_path):
    import torch
    from ess.llm import LlamaModel, LlamaWeights, load_model
    good = tmp_path / "tiny.gguf"
    write_tiny_gguf(good)
    plain = load_model(good, cache_dir=None)
    longer = load_model(good, cache_dir=None, extrapolate_context_to=4 * plain.config.context_length)
    assert longer.config.context_length == 4 * plain.config.context_length
    assert longer.model.trained_context_length == plain.config.context_length == plain.model.trained_context_length
    with pytest.raises(ValueError, match="extrapolate_context_to must be a positive integer"):
        load_model(good, cache_dir=None, extrapolate_context_to=0)
    # an engine whose model was trained on 100 tokens, run to 130: the run says its output is not meaningful
    eng = DecodeEngine(LlamaModel(LlamaWeights.random(SMALL), SMALL, dtype=torch.float32,
                                  trained_context_length=100))
    pre = eng.prefill(prompts([120]), max_new_tokens=10)
    run = eng.decode(pre, 2, offload=False)
    assert run.config["trained_context"] == 100 and run.config["output_meaningful"] is False
    pre = eng.prefill(prompts([90]), max_new_tokens=10)
    assert eng.decode(pre, 2, offload=False).config["output_meaningful"] is True
