"""Greedy text generation with the dense model."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch

from .. import validate
from .inputs import as_token_batch
from .llama import LlamaModel
from .tokenizer import Tokenizer, check_text

__all__ = ["Generation", "prompt_ids", "generate"]


@dataclass(frozen=True)
class Generation:
    """The result of :func:`generate`.

    Attributes
    ----------
    text : str
        The new tokens decoded (control tokens such as the final ``<|im_end|>`` dropped).
    token_ids : list of int
        The new tokens, including the end-of-sequence token when one was produced.
    prompt_ids : list of int
    stopped_at_eos : bool
    """

    text: str
    token_ids: list
    prompt_ids: list
    stopped_at_eos: bool


def prompt_ids(tokenizer: Tokenizer, prompt, *, name: str = "prompt") -> list[int]:
    """Token ids of a prompt: text (encoded as is), chat messages (a list of ``{"role", "content"}`` dicts,
    rendered with the model's chat template and a generation prompt), or token ids (returned as a list). Errors
    name the prompt as ``name`` (e.g. ``"prompts[3]"``); text UTF-8 cannot encode (a lone surrogate) is a
    ``ValueError``."""
    if isinstance(prompt, str):
        return tokenizer.encode(check_text(name, prompt))
    if isinstance(prompt, Sequence) and prompt and all(isinstance(m, Mapping) for m in prompt):
        for i, m in enumerate(prompt):
            for key in ("role", "content"):
                if isinstance(m.get(key), str):
                    check_text(f"{name}[{i}][{key!r}]", m[key])
        return tokenizer.encode_chat(prompt, add_generation_prompt=True)
    ids, _ = as_token_batch(prompt, tokenizer.vocab_size, 1 << 62, name)
    if ids.shape[0] != 1:
        raise ValueError(f"{name} must be one sequence, got {ids.shape[0]}")
    return ids[0].tolist()


def generate(model: LlamaModel, tokenizer: Tokenizer, prompt, max_new_tokens: int = 32,
             stop_at_eos: bool = True) -> Generation:
    """Greedy decoding (the most likely token at each step) of one prompt.

    Parameters
    ----------
    model : LlamaModel
    tokenizer : Tokenizer
    prompt : str, list of chat messages, or token ids (see :func:`prompt_ids`)
    max_new_tokens : int
        At least 1; prompt plus new tokens must fit in the context.
    stop_at_eos : bool
        Stop after the tokenizer's end-of-sequence token (``<|im_end|>`` for SmolLM2).

    Raises
    ------
    TypeError, ValueError
        Bad prompt, ``max_new_tokens`` not a positive int, or prompt + ``max_new_tokens`` beyond the context;
        raised before any model work.
    """
    if not isinstance(model, LlamaModel):
        raise TypeError(f"model must be an ess.llm.LlamaModel, got {type(model).__name__}")
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"tokenizer must be an ess.llm Tokenizer, got {type(tokenizer).__name__}")
    if isinstance(max_new_tokens, (bool, np.bool_)) or not isinstance(max_new_tokens, (int, np.integer)):
        raise TypeError(f"max_new_tokens must be an int, got {type(max_new_tokens).__name__}")
    max_new_tokens = int(max_new_tokens)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    stop_at_eos = validate.boolean("stop_at_eos", stop_at_eos)        # 'no' would stop at the end-of-sequence
    ids = prompt_ids(tokenizer, prompt)
    if not ids:
        raise ValueError("the prompt encodes to no tokens")
    ctx = model.config.context_length
    if len(ids) + max_new_tokens > ctx:
        raise ValueError(f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) exceed the model's "
                         f"context of {ctx} tokens")
    logits, cache = model.prefill(ids, capacity=len(ids) + max_new_tokens)
    new, eos = [], False
    while True:
        token = int(torch.argmax(logits[0]))
        new.append(token)
        eos = token == tokenizer.eos_id
        if (eos and stop_at_eos) or len(new) == max_new_tokens:
            break
        logits = model.decode([token], cache)
    return Generation(text=tokenizer.decode(new), token_ids=new, prompt_ids=ids, stopped_at_eos=eos)
