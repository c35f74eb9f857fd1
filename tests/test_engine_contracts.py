"""The engine and the model loader against a careless caller (ess.engine, ess.llm). Each case was accepted or ended
in an error of the library underneath before:

* ``cache_dir=""`` wrote the decoded model (540 MB for SmolLM2) into the current folder;
* ``extrapolate_context_to`` below the trained context was silently ignored;
* a prompt holding a lone surrogate ended in the tokenizer's ``UnicodeEncodeError``;
* a recorder of the wrong type ended in an ``AttributeError`` after the caches were built;
* a step after ``close()`` reached the closed link (or decoded on, unrecorded, in a dense session).
"""
import numpy as np
import pytest

from ess.engine import DecodeEngine
from ess.llm import load_model
from ess.llm.generate import prompt_ids
from ess.llm.weight_cache import load_cached
from ess.traces import TraceRecorder

from engine_helpers import prompts, small_engine
from llm_helpers import TINY, write_tiny_gguf

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "tiny.gguf"
    write_tiny_gguf(path, template=TEMPLATE)
    return path


@pytest.fixture(scope="module")
def engine():
    return small_engine()


@pytest.fixture(scope="module")
def pre(engine):
    return engine.prefill(prompts([24, 30]), max_new_tokens=4, keep_dense=True)


# -- the loader -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("load", [lambda p, d: load_model(p, cache_dir=d), lambda p, d: load_cached(p, d),
                                  lambda p, d: DecodeEngine.load(p, cache_dir=d)], ids=["load_model", "load_cached",
                                                                                       "DecodeEngine.load"])
def test_an_empty_cache_folder_is_refused_and_nothing_is_written(gguf_path, tmp_path, monkeypatch, load):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="cache_dir"):
        load(gguf_path, "")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cache_dir", [b"bytes", 3, ["a"]])
def test_a_cache_folder_of_another_type_is_refused(gguf_path, cache_dir):
    with pytest.raises(TypeError, match="cache_dir"):
        load_model(gguf_path, cache_dir=cache_dir)


def test_a_cache_folder_that_is_a_file_is_refused(gguf_path, tmp_path):
    f = tmp_path / "a-file"
    f.write_text("not a folder")
    with pytest.raises(ValueError, match="cache_dir"):
        load_model(gguf_path, cache_dir=f)
    assert f.read_text() == "not a folder"


def test_extrapolation_below_the_trained_context_is_refused(gguf_path):
    with pytest.raises(ValueError, match="extrapolate_context_to"):
        load_model(gguf_path, cache_dir=None, extrapolate_context_to=TINY.context_length - 1)
    same = load_model(gguf_path, cache_dir=None, extrapolate_context_to=TINY.context_length)
    longer = load_model(gguf_path, cache_dir=None, extrapolate_context_to=2 * TINY.context_length)
    assert same.config.context_length == TINY.context_length
    assert longer.config.context_length == 2 * TINY.context_length
    assert longer.model.trained_context_length == TINY.context_length


# -- prompts ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("prompt, where", [("ab\ud800c", "prompts[1]"),
                                           ([{"role": "user", "content": "x\udfffy"}], "prompts[1]"),
                                           ([{"role": "us\ud800er", "content": "x"}], "prompts[1]")])
def test_a_lone_surrogate_in_a_prompt_is_named(gguf_path, prompt, where):
    lm = load_model(gguf_path, cache_dir=None)
    eng = DecodeEngine(lm.model, lm.tokenizer)
    with pytest.raises(ValueError, match=r"prompts\[1\].*surrogate"):
        eng.prefill(["fine", prompt], max_new_tokens=2)
    with pytest.raises(ValueError, match="surrogate"):
        prompt_ids(lm.tokenizer, prompt)


def test_the_tokenizer_names_a_lone_surrogate(gguf_path):
    tok = load_model(gguf_path, cache_dir=None).tokenizer
    with pytest.raises(ValueError, match=r"text .*surrogate.*index 2"):
        tok.encode("ab\ud800")
    with pytest.raises(ValueError, match=r"messages\[0\].*surrogate"):
        tok.encode_chat([{"role": "user", "content": "\ud800"}])
    assert tok.encode("ab") == tok.encode("a" + "b")


# -- the session ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("recorder", [object(), "trace", 3, TraceRecorder])
def test_a_recorder_of_the_wrong_type_is_named_before_anything_is_built(engine, pre, recorder):
    with pytest.raises(TypeError, match="recorder"):
        engine.start(pre, 2, recorder=recorder)
    with pytest.raises(TypeError, match="recorder"):
        engine.decode(pre, 2, recorder=recorder)


def test_a_real_recorder_still_records(engine, pre):
    K = max(1, max(pre.lengths) // 16)
    rec = TraceRecorder(context_len=max(pre.lengths), k=K, n_layers=engine.config.n_layers, batch=pre.batch)
    run = engine.decode(pre, 2, recorder=rec)
    assert run.trace is not None


@pytest.mark.parametrize("offload", [True, False])
def test_a_step_after_close_is_refused(engine, pre, offload):
    s = engine.start(pre, 3, offload=offload)
    s.step()
    run = s.close()
    with pytest.raises(RuntimeError, match="closed"):
        s.step()
    assert s.close() is run and run.tokens.shape[1] == 2


def test_a_dense_step_after_close_is_refused(engine, pre):
    s = engine.start_dense(pre, 3)
    s.step()
    run = s.close()
    with pytest.raises(RuntimeError, match="closed"):
        s.step()
    assert s.t == 1 and run.tokens.shape[1] == 2
    np.testing.assert_array_equal(s.close().tokens, run.tokens)


# -- sizes and a cache folder that cannot be written ------------------------------------------------------------

def test_an_absurd_extrapolation_is_refused_before_its_position_table(gguf_path):
    with pytest.raises(ValueError, match="extrapolate_context_to"):               # was a MemoryError (RoPE table)
        load_model(gguf_path, cache_dir=None, extrapolate_context_to=2 ** 40)


def test_a_model_config_with_an_absurd_context_is_refused():
    import dataclasses

    import torch

    from ess.llm import LlamaModel, LlamaWeights
    from engine_helpers import SMALL
    w = LlamaWeights.random(SMALL, seed=0, dtype=np.float32)
    with pytest.raises(ValueError, match="context_length"):
        LlamaModel(w, dataclasses.replace(SMALL, context_length=2 ** 40), dtype=torch.float32)


def test_a_cache_that_cannot_be_written_still_loads_the_model(gguf_path, tmp_path, monkeypatch):
    import ess.llm.weight_cache as wc

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(wc, "write_cache", full_disk)
    with pytest.warns(RuntimeWarning, match="could not be cached"):
        contents, status = wc.load_cached(gguf_path, tmp_path / "cache")
    assert "not cached" in status and contents.tensors


def test_a_topk_past_the_models_context_is_refused(engine, pre):
    with pytest.raises(ValueError, match="topk"):                               # was a MemoryError (576 TiB)
        engine.start(pre, 2, topk=2 ** 40)
    with pytest.raises(ValueError, match="topk"):
        engine.start(pre, 2, topk=engine.config.context_length + 1)
    assert engine.decode(pre, 2, topk=engine.config.context_length).tokens.shape == (2, 3)
