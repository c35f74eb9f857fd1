"""The one place ``ess.hf`` touches transformers' API: the cache base classes, the attention and mask registries, the
SDPA attention and mask functions, and the version range this package is tested against.

Public API used here (transformers 5.x): ``transformers.cache_utils.Cache`` and ``CacheLayerMixin`` (the cache
protocol a model's attention calls: ``update``, ``update_indexer``, ``get_seq_length``, ``get_mask_sizes``),
``transformers.AttentionInterface`` and ``transformers.masking_utils.AttentionMaskInterface`` (``register``), and the
SDPA functions the registries hold. One private detail is relied on and wrapped here: how the DSA architectures
hand the indexer's top-K to a registered attention function (the ``indices`` keyword, passed for every
implementation but ``"eager"`` and ``"sdpa"``; ``modeling_deepseek_v32.DeepseekV32Attention.forward``), and that
their attention calls ``cache.update(k_pass, k_rot, layer)`` with the compressed latents before expanding them.
"""
from __future__ import annotations

__all__ = ["TESTED_RANGE", "check_version", "Cache", "CacheLayerMixin", "register_attention", "sdpa_attention",
           "ATTENTION_NAME"]

# the transformers versions ess.hf is tested against (pyproject.toml pins the same range)
TESTED_RANGE = ("5.24", "6.0")
# the name the attention function and its mask function are registered under
ATTENTION_NAME = "ess_sparse"


def _version_tuple(text: str) -> tuple:
    out = []
    for part in text.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def check_version() -> str:
    """The installed transformers version; an ``ImportError`` when it is missing or outside :data:`TESTED_RANGE`."""
    try:
        import transformers
    except ImportError:                                   # pragma: no cover - a dependency of the package
        raise ImportError("ess.hf needs transformers (pip install 'transformers>=5.24,<6')") from None
    v = transformers.__version__
    lo, hi = (_version_tuple(x) for x in TESTED_RANGE)
    if not lo <= _version_tuple(v) < hi:
        raise ImportError(f"ess.hf is tested with transformers >= {TESTED_RANGE[0]}, < {TESTED_RANGE[1]}; "
                          f"{v} is installed")
    return v


check_version()

from transformers.cache_utils import Cache, CacheLayerMixin  # noqa: E402


def sdpa_attention(*args, **kwargs):
    """transformers' own SDPA attention (the dense prefill runs through it)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward(*args, **kwargs)


_REGISTERED = [False]


def register_attention(fn) -> str:
    """Register ``fn`` as the attention function :data:`ATTENTION_NAME`, with SDPA's boolean mask function (a
    registered attention without a mask function gets no mask at all). Idempotent; returns the name."""
    if not _REGISTERED[0]:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
        AttentionInterface.register(ATTENTION_NAME, fn)
        AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
        _REGISTERED[0] = True
    return ATTENTION_NAME
