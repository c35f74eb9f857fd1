"""The attention function ess registers in transformers (``AttentionInterface``, with SDPA's mask function), and
:func:`enable`, which switches a model to it.

Per call (one layer of one forward):

* a :class:`~ess.hf.cache.SparseCache` decoding (one new token per request): the sparse step
  (:meth:`SparseCache.decode_gqa` / :meth:`SparseCache.decode_dsa`) -- top-K, plan / copy / commit through the
  tiered cache, attention over the selected rows of the device pool;
* otherwise (the prefill, or a forward without a SparseCache): what transformers' SDPA attention computes -- for a
  DSA model with the indexer's top-K folded into the mask, as transformers' own ``"sdpa"`` path does -- so that a
  model switched to ess's attention gives transformers' own results wherever it does not decode sparsely.
"""
from __future__ import annotations

import torch

from ._compat import ATTENTION_NAME, register_attention, sdpa_attention

__all__ = ["sparse_attention", "enable", "ATTENTION_NAME"]


def _masked(attention_mask, indices: torch.Tensor, kv_len: int, dtype):
    """The attention mask with every key outside the indexer's top-K masked (transformers' DSA ``"sdpa"`` path)."""
    B, S = indices.shape[:2]
    index_mask = (indices.new_ones((B, S, kv_len), dtype=torch.bool).scatter(-1, indices.long(), False)
                  .unsqueeze(1))                                                      # (B, 1, S, T); True = masked
    if attention_mask is None:
        return ~index_mask
    if attention_mask.dtype == torch.bool:
        return attention_mask & ~index_mask
    return attention_mask.masked_fill(index_mask, torch.finfo(dtype).min)


def _check_unpadded(attention_mask) -> None:
    """A ``ValueError`` when the last query of the batch may not see every earlier token (a padded batch)."""
    if attention_mask is None:
        return
    last = attention_mask[:, :, -1, :]
    ok = last.all() if last.dtype == torch.bool else bool((last == 0).all())
    if not ok:
        raise ValueError("attention_mask: a SparseCache decodes batches of prompts of one length, without padding; "
                         "pass prompts of equal length (or one at a time) and an all-ones attention mask")


def sparse_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, indices=None, **kwargs):
    """transformers' attention-function signature: ``query`` (B, H, S, d), ``key``/``value`` what the cache's
    ``update`` returned, ``indices`` (B, S, K) a DSA model's top-K. Returns ``(output (B, S, H, dv), None)``."""
    from .cache import ACTIVE
    active = ACTIVE.get()
    layer = getattr(module, "layer_idx", None)
    cache = None
    if active is not None and active[1] == layer:
        cache = active[0]
        ACTIVE.set(None)
    if cache is not None and layer == 0:
        _check_unpadded(attention_mask)
    if cache is not None and cache.started:
        if indices is None:
            if cache.info.kind == "dsa":
                raise RuntimeError("a DSA model's attention passed no top-K indices to ess's attention")
            return cache.decode_gqa(layer, query), None
        return cache.decode_dsa(module, layer, query, indices, scaling), None
    if cache is not None:
        cache.note_prefill(layer, query, indices)
    if indices is not None:
        attention_mask = _masked(attention_mask, indices, key.shape[2], query.dtype)
    return sdpa_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def enable(model):
    """Switch ``model`` (a transformers model :func:`ess.hf.models.model_info` accepts) to ess's attention,
    registered as ``"ess_sparse"``; returns the model. Without a :class:`~ess.hf.cache.SparseCache` the model
    computes what SDPA computes."""
    from .models import model_info
    model_info(model)
    register_attention(sparse_attention)
    model.set_attn_implementation(ATTENTION_NAME)
    return model
