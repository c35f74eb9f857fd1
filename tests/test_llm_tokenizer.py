"""The tokenizer and chat template built from the GGUF metadata: against transformers' tokenizer for the same file,
hand-worked cases, and bad input."""
import os

import pytest

from ess.llm import Tokenizer, model_path, read_gguf
from llm_helpers import tiny_vocab

os.environ["HF_HUB_OFFLINE"] = "1"          # transformers reads the local GGUF file only; never the hub

TEXTS = [
    "Hello, world!",
    "The capital of France is Paris.",
    "naïve café — 東京 🙂 Ünïcödé, Ελληνικά, русский",
    "def f(x):\n    return x**2  # square\n\n\tdone",
    "a   b\t\t c\n\n\n d    ",
    "it's we're they'll I'd",
    "<|im_start|>user\nHi<|im_end|>\n",
    "1234567 + 3.14159 = 2024-11-30",
    "",
]
# whitespace runs before a digit: the one place where the file's pre-tokenizer ("smollm": digits split off first,
# llama.cpp llama-vocab.cpp) and transformers' GGUF conversion (GPT-2 regex only) disagree
DIGIT_AFTER_SPACES = ["x  1", "  12345"]


@pytest.fixture(scope="module")
def meta():
    return read_gguf(model_path()).metadata


@pytest.fixture(scope="module")
def tok(meta):
    return Tokenizer.from_gguf_metadata(meta)


@pytest.fixture(scope="module")
def hf_tok():
    from transformers import AutoTokenizer
    path = model_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def test_special_ids_and_template_come_from_the_file(tok, meta):
    assert (tok.bos_id, tok.eos_id) == (1, 2)          # tokenizer.ggml.bos_token_id / eos_token_id
    assert tok.tokens[1] == "<|im_start|>" and tok.tokens[2] == "<|im_end|>"
    assert tok.vocab_size == 49152 and not tok.add_bos
    assert tok.chat_template == meta["tokenizer.chat_template"] and "<|im_start|>" in tok.chat_template


def test_worked_examples(tok):
    """"Hello, world!" is 4 tokens: "Hello" ",", "Ġworld", "!"; a control token written in the text is one id;
    a digit run is split digit by digit (the vocabulary has no multi-digit tokens)."""
    assert [tok.tokens[i] for i in tok.encode("Hello, world!")] == ["Hello", ",", "Ġworld", "!"]
    assert tok.encode("<|im_end|>") == [2]
    assert [tok.tokens[i] for i in tok.encode("2024")] == ["2", "0", "2", "4"]
    # "smollm" pre-tokenizer: digits split off first, so "x  1" -> "x", "  " (one token "ĠĠ"), "1"
    assert [tok.tokens[i] for i in tok.encode("x  1")] == ["x", "ĠĠ", "1"]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids, skip_special=False) == text


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_same_ids_as_transformers(tok, hf_tok, text):
    assert tok.encode(text) == hf_tok.encode(text, add_special_tokens=True)


@pytest.mark.slow
@pytest.mark.parametrize("text", DIGIT_AFTER_SPACES)
def test_known_difference_from_transformers(tok, hf_tok, text):
    """transformers (5.x) ignores tokenizer.ggml.pre = "smollm" and keeps the spaces before a digit apart; we
    follow llama.cpp's definition. Same text back either way, one token fewer here. If this starts failing,
    transformers has learned the "smollm" pre-tokenizer: then the two must agree on these too."""
    ours, theirs = tok.encode(text), hf_tok.encode(text, add_special_tokens=True)
    assert ours != theirs and len(ours) == len(theirs) - 1
    assert hf_tok.decode(theirs) == tok.decode(ours) == text


@pytest.mark.slow
def test_chat_template_same_as_transformers(tok, hf_tok):
    for messages in ([{"role": "user", "content": "What is the capital of France?"}],
                     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                      {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]):
        for gen in (True, False):
            text = tok.apply_chat_template(messages, add_generation_prompt=gen)
            assert text == hf_tok.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)
            want = hf_tok.apply_chat_template(messages, add_generation_prompt=gen, tokenize=True,
                                              return_dict=True)["input_ids"]
            assert tok.encode_chat(messages, add_generation_prompt=gen) == list(want)


def test_chat_template_text(tok):
    """The template adds the default system prompt when none is given, and ends with the assistant's header."""
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_bad_input(tok):
    with pytest.raises(TypeError, match="text must be str"):
        tok.encode(b"bytes")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([49152])
    with pytest.raises(ValueError, match="non-empty list"):
        tok.apply_chat_template([])
    with pytest.raises(ValueError, match=r"messages\[0\] must be a dict"):
        tok.apply_chat_template([{"role": "user"}])


def test_tokenizer_from_tiny_metadata_and_unsupported_kinds():
    tokens, merges, types = tiny_vocab()
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 1,
            "tokenizer.ggml.add_bos_token": True}
    t = Tokenizer.from_gguf_metadata(meta)
    assert t.encode("abab") == [0, 258, 258]                 # BOS prepended, then the merged "ab" twice
    with pytest.raises(ValueError, match="no chat template"):
        t.apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="only byte-level BPE"):
        Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.model": "llama"})
    with pytest.raises(ValueError, match="pre-tokenizer 'qwen2' is not implemented"):
        Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.pre": "qwen2"})
