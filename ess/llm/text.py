"""Real English text that ships with every Python, for long prompts and held-out text.

``pydoc_data.topics.topics``: the language reference's topics as plain text (79 topics, about 0.46 MB), part of the
standard library since Python 3.2. The order of the topics is fixed (sorted by name) so the same text comes back
on every machine with the same Python version.
"""
from __future__ import annotations

import weakref

__all__ = ["reference_text", "reference_text_ids"]

_ENCODED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # tokenizer -> the whole text's ids


def reference_text() -> str:
    """All topics of ``pydoc_data.topics``, sorted by name, separated by blank lines."""
    from pydoc_data.topics import topics
    return "\n\n".join(topics[key] for key in sorted(topics))


def reference_text_ids(tokenizer, n_tokens: int, skip_tokens: int = 0) -> list[int]:
    """Tokens ``skip_tokens .. skip_tokens + n_tokens`` of :func:`reference_text` (e.g. one slice as a prompt,
    a later slice as held-out text).

    Raises
    ------
    ValueError
        The text holds fewer tokens than asked for (about 100K with SmolLM2's tokenizer).
    """
    if n_tokens < 1 or skip_tokens < 0:
        raise ValueError(f"n_tokens must be >= 1 and skip_tokens >= 0, got {n_tokens}, {skip_tokens}")
    try:
        ids = _ENCODED[tokenizer]                       # the text is encoded once per tokenizer (about a second)
    except (KeyError, TypeError):
        ids = tokenizer.encode(reference_text())
        try:
            _ENCODED[tokenizer] = ids
        except TypeError:                               # a tokenizer that cannot be weakly referenced: not cached
            pass
    if len(ids) < skip_tokens + n_tokens:
        raise ValueError(f"the text holds {len(ids)} tokens, fewer than {skip_tokens} + {n_tokens}")
    return ids[skip_tokens: skip_tokens + n_tokens]
