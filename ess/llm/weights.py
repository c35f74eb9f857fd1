"""The model's weights as named arrays in Hugging Face's layout, from a GGUF file or random (for tests).

GGUF stores the query and key projections with their output rows permuted: llama.cpp's converter
(``convert_hf_to_gguf.py``, ``LlamaModel.permute``) reorders each head's rows from Hugging Face's "rotate half"
RoPE layout (dimension ``i`` paired with ``i + head_dim/2``) to the interleaved layout (``2i`` paired with
``2i + 1``) that llama.cpp's RoPE uses. :func:`unpermute_rope_rows` undoes it, so the forward pass here uses
rotate-half RoPE exactly as ``transformers``' ``LlamaForCausalLM`` does (the parity test checks both the weights
and the logits against ``transformers``).

GGUF tensor names (llama.cpp, ``gguf.constants.MODEL_TENSOR``): ``token_embd``, ``output_norm``, ``output``
(absent when tied), and per block ``blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate,
ffn_up, ffn_down}.weight``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from .config import LlamaConfig

__all__ = ["LayerWeights", "LlamaWeights", "permute_rope_rows", "unpermute_rope_rows"]


@dataclass(frozen=True)
class LayerWeights:
    """One transformer block (``D`` = d_model, ``H`` heads, ``Hkv`` KV heads, ``hd`` head_dim, ``F`` = d_ffn).

    Linear weights are ``(out_features, in_features)``: ``y = x @ w.T``.

    Attributes
    ----------
    attn_norm : (D,)
    wq : (H * hd, D)        rows in rotate-half RoPE order per head
    wk : (Hkv * hd, D)      likewise
    wv : (Hkv * hd, D)
    wo : (D, H * hd)
    ffn_norm : (D,)
    w_gate, w_up : (F, D)
    w_down : (D, F)
    """

    attn_norm: np.ndarray
    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    ffn_norm: np.ndarray
    w_gate: np.ndarray
    w_up: np.ndarray
    w_down: np.ndarray


@dataclass(frozen=True)
class LlamaWeights:
    """All weights of a Llama-architecture model.

    Attributes
    ----------
    embedding : (V, D)
    output : (V, D)
        The output head; the same array as ``embedding`` when the model ties them.
    final_norm : (D,)
    layers : tuple of LayerWeights
    """

    embedding: np.ndarray
    output: np.ndarray
    final_norm: np.ndarray
    layers: tuple

    def check(self, config: LlamaConfig) -> None:
        """Raise ``ValueError`` naming the first array whose shape does not fit ``config``."""
        D, F, V = config.d_model, config.d_ffn, config.vocab_size
        q, kv = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
        want = {"embedding": (V, D), "output": (V, D), "final_norm": (D,)}
        for name, shape in want.items():
            if getattr(self, name).shape != shape:
                raise ValueError(f"weights.{name} has shape {getattr(self, name).shape}, config needs {shape}")
        if len(self.layers) != config.n_layers:
            raise ValueError(f"weights have {len(self.layers)} layers, config needs {config.n_layers}")
        layer_want = {"attn_norm": (D,), "wq": (q, D), "wk": (kv, D), "wv": (kv, D), "wo": (D, q),
                      "ffn_norm": (D,), "w_gate": (F, D), "w_up": (F, D), "w_down": (D, F)}
        for i, layer in enumerate(self.layers):
            for name, shape in layer_want.items():
                if getattr(layer, name).shape != shape:
                    raise ValueError(f"weights.layers[{i}].{name} has shape {getattr(layer, name).shape}, "
                                     f"config needs {shape}")

    @classmethod
    def from_gguf(cls, tensors: Mapping[str, np.ndarray], config: LlamaConfig) -> "LlamaWeights":
        """Map a GGUF file's dequantised tensors (:attr:`GGUFContents.tensors`) to Hugging Face's layout.

        Raises
        ------
        ValueError
            A tensor is missing or has the wrong shape.
        """
        def t(name):
            if name not in tensors:
                raise ValueError(f"the model file lacks tensor {name!r}")
            return tensors[name]

        layers = []
        for i in range(config.n_layers):
            p = f"blk.{i}."
            layers.append(LayerWeights(
                attn_norm=t(p + "attn_norm.weight"),
                wq=unpermute_rope_rows(t(p + "attn_q.weight"), config.n_heads),
                wk=unpermute_rope_rows(t(p + "attn_k.weight"), config.n_kv_heads),
                wv=t(p + "attn_v.weight"), wo=t(p + "attn_output.weight"), ffn_norm=t(p + "ffn_norm.weight"),
                w_gate=t(p + "ffn_gate.weight"), w_up=t(p + "ffn_up.weight"), w_down=t(p + "ffn_down.weight")))
        embedding = t("token_embd.weight")
        output = embedding if config.tied_output else t("output.weight")
        weights = cls(embedding=embedding, output=output, final_norm=t("output_norm.weight"), layers=tuple(layers))
        weights.check(config)
        return weights

    @classmethod
    def random(cls, config: LlamaConfig, seed: int = 0, dtype=np.float64) -> "LlamaWeights":
        """Random weights of the right shapes (scaled like a trained model's, about unit activations), for tests."""
        rng = np.random.default_rng(seed)
        D, F, V = config.d_model, config.d_ffn, config.vocab_size
        q, kv = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim

        def lin(out, inp):
            return (rng.standard_normal((out, inp)) / np.sqrt(inp)).astype(dtype)

        def norm():
            return (1.0 + 0.1 * rng.standard_normal(D)).astype(dtype)

        layers = tuple(LayerWeights(attn_norm=norm(), wq=lin(q, D), wk=lin(kv, D), wv=lin(kv, D), wo=lin(D, q),
                                    ffn_norm=norm(), w_gate=lin(F, D), w_up=lin(F, D), w_down=lin(D, F))
                       for _ in range(config.n_layers))
        embedding = rng.standard_normal((V, D)).astype(dtype)
        output = embedding if config.tied_output else lin(V, D)
        return cls(embedding=embedding, output=output, final_norm=norm(), layers=layers)


def permute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Hugging Face's rotate-half row order to llama.cpp's interleaved order, per head (what the GGUF converter
    does): within each head of ``hd`` rows, row ``j * hd/2 + i`` (half ``j``, pair ``i``) moves to ``2 i + j``.

    Parameters
    ----------
    w : (n_heads * hd, ...) array
    n_heads : int
    """
    from ..validate import positive_int
    n_heads = positive_int("n_heads", n_heads)
    hd = w.shape[0] // n_heads
    return w.reshape(n_heads, 2, hd // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """The inverse of :func:`permute_rope_rows`: llama.cpp's interleaved rows back to rotate-half order.

    Parameters
    ----------
    w : (n_heads * hd, ...) array
    n_heads : int

    Returns
    -------
    (n_heads * hd, ...) array, C-contiguous (a copy)
    """
    from ..validate import positive_int
    n_heads = positive_int("n_heads", n_heads)
    if w.shape[0] % n_heads or (w.shape[0] // n_heads) % 2:
        raise ValueError(f"rows ({w.shape[0]}) must split into {n_heads} heads of an even size")
    hd = w.shape[0] // n_heads
    return np.ascontiguousarray(w.reshape(n_heads, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))
