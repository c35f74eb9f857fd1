"""The tokenizer and chat template, built from a GGUF file's metadata alone.

The file holds a byte-level BPE (``tokenizer.ggml.model`` = ``"gpt2"``): the vocabulary (``tokenizer.ggml.tokens``,
spelled in GPT-2's byte-to-unicode alphabet), the merges in rank order (``tokenizer.ggml.merges``), each token's
type (``tokenizer.ggml.token_type``, 3 = control, e.g. ``<|im_start|>``), the special ids (``bos_token_id`` 1,
``eos_token_id`` 2 for SmolLM2), whether to prepend BOS (``add_bos_token``), the pre-tokenizer's name
(``tokenizer.ggml.pre``) and the chat template (``tokenizer.chat_template``, Jinja).

The BPE runs in the ``tokenizers`` package (Hugging Face's Rust tokenizer; built from vocabulary and merges in
about 0.1 s). The pre-tokenizer follows llama.cpp's definition of the name the file gives: for ``"smollm"``
(``llama-vocab.cpp``, ``LLAMA_VOCAB_PRE_TYPE_SMOLLM``) first every digit is split off on its own (``\\p{N}``), then
GPT-2's regex applies. ``transformers``' GGUF tokenizer conversion (5.x) does not know ``"smollm"`` and applies
GPT-2's regex only; the two differ on whitespace runs before digits (``"x  1"``: ``x|ĠĠ|1`` here, ``x|Ġ|Ġ|1``
there), and agree elsewhere (tested). We follow llama.cpp, whose pre-tokenizer names exist to reproduce the original
tokenizer of each model.

The chat template is rendered with Jinja2 in a sandbox, with the settings ``transformers`` uses
(``trim_blocks``, ``lstrip_blocks``, the ``loopcontrols`` extension, ``raise_exception``), so the prompt text is the
one the model was fine-tuned on.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

__all__ = ["Tokenizer", "PRE_TOKENIZERS"]

PRE_TOKENIZERS = ("gpt2", "smollm", "default")   # tokenizer.ggml.pre values implemented here
CONTROL = 3                                      # llama.cpp token type of a control token (gguf.TokenType.CONTROL)


class Tokenizer:
    """Byte-level BPE tokenizer and chat template of a GGUF model.

    Attributes
    ----------
    tokens : list of str
        The vocabulary, id -> token (in GPT-2's byte alphabet).
    bos_id, eos_id : int
    add_bos : bool
        Whether :meth:`encode` prepends BOS (``tokenizer.ggml.add_bos_token``; False for SmolLM2).
    chat_template : str or None
    """

    def __init__(self, tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int], *, bos_id: int,
                 eos_id: int, add_bos: bool = False, pre: str = "gpt2", chat_template: str | None = None):
        from tokenizers import AddedToken, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as _HFTokenizer

        if pre not in PRE_TOKENIZERS:
            raise ValueError(f"pre-tokenizer {pre!r} is not implemented (known: {PRE_TOKENIZERS})")
        if not 0 <= bos_id < len(tokens) or not 0 <= eos_id < len(tokens):
            raise ValueError(f"bos_id {bos_id} / eos_id {eos_id} outside the vocabulary of {len(tokens)}")
        self.tokens = list(tokens)
        self.bos_id, self.eos_id, self.add_bos = int(bos_id), int(eos_id), bool(add_bos)
        self.chat_template = chat_template
        vocab = {tok: i for i, tok in enumerate(self.tokens)}
        pairs = [tuple(m.split(" ")) for m in merges]
        bpe = _HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        bpe.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                             if pre == "smollm" else byte_level)
        bpe.decoder = decoders.ByteLevel()
        self.special_ids = frozenset(i for i, t in enumerate(token_types) if t == CONTROL)
        bpe.add_special_tokens([AddedToken(self.tokens[i], special=True, normalized=False)
                                for i in sorted(self.special_ids)])
        self._bpe = bpe
        self._template = None

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any]) -> "Tokenizer":
        """Build from :attr:`GGUFContents.metadata`; ``ValueError`` if the file's tokenizer is not byte-level BPE."""
        kind = metadata.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"tokenizer.ggml.model is {kind!r}; only byte-level BPE ('gpt2') is implemented")
        for key in ("tokens", "merges", "token_type", "bos_token_id", "eos_token_id"):
            if f"tokenizer.ggml.{key}" not in metadata:
                raise ValueError(f"GGUF metadata lacks 'tokenizer.ggml.{key}'")
        g = lambda key, default=None: metadata.get(f"tokenizer.ggml.{key}", default)  # noqa: E731
        return cls(g("tokens"), g("merges"), g("token_type"), bos_id=g("bos_token_id"), eos_id=g("eos_token_id"),
                   add_bos=g("add_bos_token", False), pre=g("pre", "gpt2"),
                   chat_template=metadata.get("tokenizer.chat_template"))

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; control tokens written in the text (``<|im_start|>``) become their ids; BOS is
        prepended only when the file says so (:attr:`add_bos`)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        check_text("text", text)
        ids = self._bpe.encode(text, add_special_tokens=False).ids
        return [self.bos_id] + ids if self.add_bos else ids

    def decode(self, ids, skip_special: bool = True) -> str:
        """Text of token ids (control tokens dropped when ``skip_special``)."""
        ids = [int(i) for i in ids]
        bad = next((i for i in ids if not 0 <= i < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"token id {bad} outside the vocabulary [0, {self.vocab_size})")
        return self._bpe.decode(ids, skip_special_tokens=skip_special)

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
        """The chat prompt text: ``messages`` is a list of ``{"role": ..., "content": ...}``."""
        if self.chat_template is None:
            raise ValueError("the model file has no chat template (tokenizer.chat_template)")
        if isinstance(messages, (str, bytes)) or not messages:
            raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(
                    m.get("content"), str):
                raise ValueError(f"messages[{i}] must be a dict with str 'role' and 'content', got {m!r}")
            for key in ("role", "content"):
                check_text(f"messages[{i}][{key!r}]", m[key])
        if self._template is None:
            self._template = _compile(self.chat_template)
        return self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                     bos_token=self.tokens[self.bos_id], eos_token=self.tokens[self.eos_id])

    def encode_chat(self, messages, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the chat prompt (the rendered text encoded without adding BOS, as ``transformers`` does)."""
        return self._bpe.encode(self.apply_chat_template(messages, add_generation_prompt),
                                add_special_tokens=False).ids


def check_text(name: str, text: str) -> str:
    """``text`` when UTF-8 can encode it; a ``ValueError`` naming ``name`` and where its first lone surrogate (half
    of a UTF-16 pair, e.g. ``"\\ud800"``: no character) is, which the tokenizer could not encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} holds a lone surrogate {text[exc.start]!r} at index {exc.start}, which is no "
                         f"character (UTF-8 cannot encode it)") from None
    return text


def _compile(source: str):
    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)
