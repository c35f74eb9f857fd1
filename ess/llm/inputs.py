"""Token-id input checking: one place that turns what a caller passes into a padded batch, or says clearly why not.

Accepted: a sequence of ints, a 1-D or 2-D integer NumPy array or torch tensor, or a list of such sequences
(different lengths allowed: the batch is right-padded with token 0 and the true lengths returned).
"""
from __future__ import annotations

import numbers

import numpy as np
import torch

__all__ = ["as_token_batch"]


def _one(seq, name: str) -> np.ndarray:
    if isinstance(seq, torch.Tensor):
        if seq.dtype.is_floating_point or seq.dtype.is_complex or seq.dtype == torch.bool:
            raise TypeError(f"{name} must hold integer token ids, got a tensor of {seq.dtype}")
        arr = seq.detach().cpu().numpy()
    elif isinstance(seq, np.ndarray):
        if not np.issubdtype(seq.dtype, np.integer):
            raise TypeError(f"{name} must hold integer token ids, got an array of {seq.dtype}")
        arr = seq
    elif isinstance(seq, (str, bytes)):
        raise TypeError(f"{name} must be token ids, got {type(seq).__name__} (tokenize text first)")
    else:
        try:
            items = list(seq)
        except TypeError:
            raise TypeError(f"{name} must be a sequence of token ids, got {type(seq).__name__}") from None
        bad = next((x for x in items if isinstance(x, bool) or not isinstance(x, numbers.Integral)), None)
        if bad is not None:
            raise TypeError(f"{name} must hold integer token ids, got {type(bad).__name__} {bad!r}")
        arr = np.asarray(items, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one sequence of token ids, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty: at least one token is needed")
    return arr.astype(np.int64, copy=False)


def as_token_batch(token_ids, vocab_size: int, max_length: int, name: str = "token_ids"):
    """Check and pad token ids.

    Parameters
    ----------
    token_ids : sequence of int, (T,) or (B, T) integer array/tensor, or list of sequences
    vocab_size : int
        Ids must lie in ``[0, vocab_size)``.
    max_length : int
        Longest sequence allowed (what is left of the context).
    name : str
        The argument's name, for messages.

    Returns
    -------
    ids : (B, T) int64 tensor (CPU), right-padded with 0
    lengths : (B,) int64 tensor, the true length of each sequence

    Raises
    ------
    TypeError
        Not integers (floats, bools, text).
    ValueError
        Empty batch or sequence, an id outside the vocabulary, a sequence longer than ``max_length``.
    """
    from ..validate import positive_int
    vocab_size, max_length = positive_int("vocab_size", vocab_size), positive_int("max_length", max_length)
    if isinstance(token_ids, (torch.Tensor, np.ndarray)) and token_ids.ndim == 2:
        seqs = [_one(row, f"{name}[{i}]") for i, row in enumerate(token_ids)]
    elif isinstance(token_ids, (torch.Tensor, np.ndarray)):
        seqs = [_one(token_ids, name)]
    else:
        if isinstance(token_ids, (str, bytes)):
            raise TypeError(f"{name} must be token ids, got {type(token_ids).__name__} (tokenize text first)")
        try:
            items = list(token_ids)
        except TypeError:
            raise TypeError(f"{name} must be a sequence of token ids, got {type(token_ids).__name__}") from None
        if not items:
            raise ValueError(f"{name} is empty: at least one token is needed")
        nested = [not isinstance(x, numbers.Integral) and hasattr(x, "__len__") for x in items]
        if any(nested) and not all(nested):
            raise TypeError(f"{name} mixes token ids and sequences")
        seqs = ([_one(s, f"{name}[{i}]") for i, s in enumerate(items)] if all(nested)
                else [_one(items, name)])
    if not seqs:
        raise ValueError(f"{name} is an empty batch")
    lengths = [len(s) for s in seqs]
    for i, s in enumerate(seqs):
        if len(s) > max_length:
            raise ValueError(f"{name}[{i}] has {len(s)} tokens, more than the {max_length} the context allows")
        lo, hi = int(s.min()), int(s.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{name}[{i}] holds id {lo if lo < 0 else hi}, outside the vocabulary [0, {vocab_size})")
    ids = np.zeros((len(seqs), max(lengths)), dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
    return torch.from_numpy(ids), torch.tensor(lengths, dtype=torch.int64)
