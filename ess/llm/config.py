"""The architecture of a Llama-family model, read from a GGUF file's metadata.

Keys follow llama.cpp's GGUF naming (``<arch>.block_count``, ``<arch>.attention.head_count`` ...; the ``gguf``
package's ``gguf.constants.Keys``). For SmolLM2-135M-Instruct the file states (and the model card
``HuggingFaceTB/SmolLM2-135M-Instruct`` / its ``config.json`` publishes): 30 layers, hidden 576, FFN 1,536,
9 query heads, 3 KV heads, head dim 64, RoPE base 100,000, RMS eps 1e-5, context 8,192, vocab 49,152.
None of these numbers is typed here: they are read.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["LlamaConfig"]

_INT_FIELDS = ("n_layers", "d_model", "d_ffn", "n_heads", "n_kv_heads", "head_dim", "context_length", "vocab_size")


@dataclass(frozen=True)
class LlamaConfig:
    """Geometry of a Llama-architecture decoder (GQA attention, RoPE, RMSNorm, SwiGLU MLP).

    Attributes
    ----------
    n_layers : int
        Transformer blocks (``<arch>.block_count``).
    d_model : int
        Hidden size (``<arch>.embedding_length``).
    d_ffn : int
        SwiGLU inner size (``<arch>.feed_forward_length``).
    n_heads, n_kv_heads : int
        Query heads and key/value heads (``<arch>.attention.head_count``, ``.head_count_kv``); each KV head is
        shared by ``n_heads // n_kv_heads`` query heads (grouped-query attention).
    head_dim : int
        Dimensions per head (``<arch>.attention.key_length`` when present, else ``d_model // n_heads``).
    rope_base : float
        RoPE frequency base theta (``<arch>.rope.freq_base``); the whole head is rotated.
    rms_eps : float
        RMSNorm epsilon (``<arch>.attention.layer_norm_rms_epsilon``, stored as float32).
    context_length : int
        Longest sequence the model was trained for (``<arch>.context_length``).
    vocab_size : int
        Token vocabulary (``<arch>.vocab_size``, else the tokenizer's token count).
    tied_output : bool
        Whether the output head reuses the token embedding (no ``output.weight`` tensor in the file).
    """

    n_layers: int
    d_model: int
    d_ffn: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope_base: float
    rms_eps: float
    context_length: int
    vocab_size: int
    tied_output: bool = True

    def __post_init__(self):
        from ..validate import boolean
        boolean("LlamaConfig.tied_output", self.tied_output)
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"LlamaConfig.{name} must be a positive int, got {value!r}")
        for name in ("rope_base", "rms_eps"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"LlamaConfig.{name} must be > 0, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def group_size(self) -> int:
        """Query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    def kv_bytes_per_token(self, bytes_per_value: int = 4) -> int:
        """Bytes of one token's K and V in one layer: ``2 * n_kv_heads * head_dim * bytes_per_value``
        (SmolLM2 at float32: 2 * 3 * 64 * 4 = 1,536 B)."""
        from ..validate import positive_int
        return 2 * self.n_kv_heads * self.head_dim * positive_int("bytes_per_value", bytes_per_value)

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any], tensor_names=()) -> "LlamaConfig":
        """Read the configuration from GGUF metadata.

        Parameters
        ----------
        metadata : mapping
            :attr:`ess.llm.gguf_file.GGUFContents.metadata`.
        tensor_names : iterable of str
            The file's tensor names; ``output.weight`` among them means an untied output head.

        Raises
        ------
        ValueError
            A required key is missing, or the file asks for something this forward pass does not implement
            (an architecture other than ``llama``, RoPE scaling, partial rotary dimensions).
        """
        arch = metadata.get("general.architecture")
        if arch != "llama":
            raise ValueError(f"general.architecture must be 'llama', the file says {arch!r}")

        def get(key, default=None, required=True):
            full = f"{arch}.{key}"
            if full in metadata:
                return metadata[full]
            if required and default is None:
                raise ValueError(f"GGUF metadata lacks {full!r}")
            return default

        scaling = get("rope.scaling.type", required=False)
        if scaling not in (None, "none"):
            raise ValueError(f"{arch}.rope.scaling.type = {scaling!r}: RoPE scaling is not implemented")
        n_heads = int(get("attention.head_count"))
        d_model = int(get("embedding_length"))
        # llama.cpp's rule: head size = key_length, else embedding_length / head_count; rotary dims default to it
        head_dim = int(get("attention.key_length", required=False) or d_model // n_heads)
        v_dim = int(get("attention.value_length", required=False) or head_dim)
        if v_dim != head_dim:
            raise ValueError(f"{arch}.attention.value_length = {v_dim} differs from the key length {head_dim}: "
                             f"not implemented")
        rope_dims = int(get("rope.dimension_count", required=False) or head_dim)
        if rope_dims != head_dim:
            raise ValueError(f"{arch}.rope.dimension_count = {rope_dims} but head_dim = {head_dim}: partial "
                             f"rotary embeddings are not implemented")
        tokens = metadata.get("tokenizer.ggml.tokens")
        vocab = get("vocab_size", required=tokens is None) or len(tokens)
        return cls(n_layers=int(get("block_count")), d_model=d_model, d_ffn=int(get("feed_forward_length")),
                   n_heads=n_heads, n_kv_heads=int(get("attention.head_count_kv", n_heads)), head_dim=head_dim,
                   rope_base=float(get("rope.freq_base", 10000.0)),  # llama.cpp's default when absent
                   rms_eps=float(get("attention.layer_norm_rms_epsilon")),
                   context_length=int(get("context_length")), vocab_size=int(vocab),
                   tied_output="output.weight" not in set(tensor_names))
