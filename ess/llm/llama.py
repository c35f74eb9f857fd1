"""The Llama forward pass in torch (CPU float32 by default), in pieces a decode engine can drive layer by layer.

The maths is that of :mod:`ess.llm.reference` (and of ``transformers``' ``LlamaForCausalLM``). Shapes: ``B``
sequences, ``T`` new tokens each, ``D`` = d_model, ``H`` query heads, ``Hkv`` KV heads, ``hd`` head_dim, ``V``
vocabulary. One decode step driven by an engine with its own K/V storage and attention::

    h = model.embed(tokens)                                     # (B, 1, D)
    for layer in range(config.n_layers):
        q, k, v = model.attention_inputs(layer, h, positions)   # (B, H, 1, hd), (B, Hkv, 1, hd) x 2
        ...store k, v; gather what to attend over; attend...    # -> attn (B, H, 1, hd)
        h = model.attention_output(layer, h, attn)              # (B, 1, D)
    logits = model.logits(h)                                    # (B, 1, V)

:meth:`LlamaModel.extend` does exactly this with :func:`ess.llm.attention.dense_attention` over a
:class:`ess.llm.kv_cache.KVCache`; :meth:`prefill`, :meth:`decode` and :meth:`forward` are built on it.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..validate import fits_in_memory
from .attention import dense_attention
from .config import LlamaConfig
from .inputs import as_token_batch
from .kv_cache import KVCache
from .weights import LlamaWeights


def rope_table_bytes(config: LlamaConfig, name: str) -> int:
    """Bytes the RoPE position tables of ``config`` take while they are built (float64 angles, cosines and sines of
    ``context_length x head_dim / 2``); a ``ValueError`` naming ``name`` (the argument that set the context) when
    that is past a quarter of this machine's memory, before anything is allocated."""
    n = config.context_length * (config.head_dim // 2) * 8 * 3
    return fits_in_memory(name, n, f"the RoPE position table of {config.context_length:,} positions")

__all__ = ["LlamaModel", "DTYPES", "check_device"]

#: The compute dtypes the model runs in (float16 overflows: see :class:`LlamaModel`).
DTYPES = (torch.float32, torch.float64, torch.bfloat16)


def check_device(device) -> torch.device:
    """``device`` as a ``torch.device``: ``"cpu"``, or a CUDA device that is present; a ``ValueError`` naming
    ``device`` otherwise."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'cpu' or 'cuda[:n]', got {device!r}") from None
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0 or (dev.index or 0) >= n:
            raise ValueError(f"device={device!r} was asked for but this machine has {n} CUDA device(s)")
    elif dev.type != "cpu":
        raise ValueError(f"device must be 'cpu' or 'cuda[:n]', got {device!r}")
    return dev


class LlamaModel:
    """A Llama-architecture decoder on torch tensors.

    Parameters
    ----------
    weights : LlamaWeights
        NumPy arrays (any float dtype); float32 arrays on the CPU are shared, not copied, where possible.
    config : LlamaConfig
    dtype : torch.dtype
        Compute dtype: float32 (the default), float64 (checks against the reference) or bfloat16. float16 is
        refused: the residual stream of SmolLM2-135M-Instruct reaches 652 (measured on a five-token prompt), whose
        square in RMSNorm exceeds float16's largest value, 65,504, and every logit becomes NaN.
    device : str or torch.device
        ``"cpu"`` or a CUDA device that is present.
    attention_impl : {"matmul", "sdpa"}
        Dense attention used by :meth:`extend` (see :func:`dense_attention`).
    trained_context_length : int, optional
        The context the weights were trained for, when ``config.context_length`` was raised past it to extrapolate
        (benchmarks only; :func:`ess.llm.load_model`); default ``config.context_length``.
    """

    def __init__(self, weights: LlamaWeights, config: LlamaConfig, dtype=torch.float32, device="cpu",
                 attention_impl: str = "matmul", trained_context_length: int | None = None):
        weights.check(config)
        device = check_device(device)
        rope_table_bytes(config, "config.context_length")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {[str(d) for d in DTYPES]}, got {dtype}" +
                             (": float16 overflows in this model's RMSNorm (its residual stream reaches 652, whose "
                              "square exceeds float16's 65,504), and every logit is NaN" if dtype == torch.float16
                              else ""))
        self.config, self.dtype, self.device = config, dtype, device
        self.trained_context_length = (config.context_length if trained_context_length is None
                                       else int(trained_context_length))
        self.attention_impl = attention_impl
        # every tensor its own copy: one sharing the caller's array would keep that array's whole buffer alive (the
        # weight cache reads the file into one buffer, of which the model keeps only some tensors as they are)
        t = lambda a: torch.tensor(np.asarray(a), device=self.device).to(dtype)  # noqa: E731
        self.embedding = t(weights.embedding)                                       # (V, D)
        self.output = self.embedding if weights.output is weights.embedding else t(weights.output)
        self.final_norm = t(weights.final_norm)
        self.layers = []
        for lw in weights.layers:
            self.layers.append({
                "attn_norm": t(lw.attn_norm),
                "w_qkv": t(np.concatenate([lw.wq, lw.wk, lw.wv])),                  # (H*hd + 2*Hkv*hd, D)
                "wo": t(lw.wo), "ffn_norm": t(lw.ffn_norm),
                "w_gate_up": t(np.concatenate([lw.w_gate, lw.w_up])),               # (2F, D)
                "w_down": t(lw.w_down)})
        hd = config.head_dim
        inv_freq = config.rope_base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)   # (hd/2,)
        angles = np.arange(config.context_length, dtype=np.float64)[:, None] * inv_freq[None]
        self._cos = torch.as_tensor(np.cos(angles), device=self.device).to(dtype)  # (context, hd/2)
        self._sin = torch.as_tensor(np.sin(angles), device=self.device).to(dtype)

    # ---- the pieces a decode engine drives --------------------------------------------------------------------
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings: ``token_ids`` (B, T) int64 -> hidden (B, T, D)."""
        return self.embedding[token_ids.to(self.device)]

    def _rms_norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.config.rms_eps) * w

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def attention_inputs(self, layer: int, hidden: torch.Tensor, positions: torch.Tensor):
        """Queries, keys and values of new tokens, RoPE applied.

        Parameters
        ----------
        layer : int
        hidden : (B, T, D)
            The residual stream entering the layer.
        positions : (B, T) int64
            Each token's position in its sequence (< context_length).

        Returns
        -------
        q : (B, H, T, hd)
        k : (B, Hkv, T, hd)
            After RoPE: what a cache stores (an entry does not change once written).
        v : (B, Hkv, T, hd)
        """
        c, p = self.config, self.layers[layer]
        B, T, _ = hidden.shape
        qkv = F.linear(self._rms_norm(hidden, p["attn_norm"]), p["w_qkv"])         # (B, T, (H + 2 Hkv) hd)
        q, k, v = qkv.split([c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.n_kv_heads * c.head_dim], -1)
        q = q.view(B, T, c.n_heads, c.head_dim).transpose(1, 2)
        k = k.view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = v.view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = self._cos[positions][:, None], self._sin[positions][:, None]    # (B, 1, T, hd/2)
        return self._rope(q, cos, sin), self._rope(k, cos, sin), v.contiguous()

    def attention_output(self, layer: int, hidden: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The rest of the layer: output projection, residual, then the SwiGLU MLP with its residual.

        Parameters
        ----------
        layer : int
        hidden : (B, T, D)
            The residual stream that entered the layer (the same tensor given to :meth:`attention_inputs`).
        attn : (B, H, T, hd)
            Attention output per query head.

        Returns
        -------
        (B, T, D), the residual stream leaving the layer
        """
        p = self.layers[layer]
        B, H, T, hd = attn.shape
        h = hidden + F.linear(attn.transpose(1, 2).reshape(B, T, H * hd), p["wo"])
        gate, up = F.linear(self._rms_norm(h, p["ffn_norm"]), p["w_gate_up"]).chunk(2, dim=-1)
        return h + F.linear(F.silu(gate) * up, p["w_down"])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final RMSNorm and output head: (..., D) -> (..., V)."""
        return F.linear(self._rms_norm(hidden, self.final_norm), self.output)

    # ---- the dense model ----------------------------------------------------------------------------------------
    def new_cache(self, batch: int, capacity: int = 256) -> KVCache:
        """An empty :class:`KVCache` in this model's dtype and device."""
        return KVCache(self.config, batch, min(capacity, self.config.context_length), self.dtype, self.device)

    def _hidden(self, token_ids, cache: KVCache, name: str = "token_ids", observe=None):
        """Run new tokens through every layer with dense attention, appending them to ``cache``; ``observe(layer,
        q, k, v)``, when given, sees each layer's queries, keys and values of the new tokens (shapes as returned by
        :meth:`attention_inputs`; padding of a ragged batch included).

        Returns the final hidden states (B, T, D) and the true number of new tokens per sequence (B,).
        """
        ctx = self.config.context_length
        ids, n_new = as_token_batch(token_ids, self.config.vocab_size, ctx, name)
        if ids.shape[0] != cache.batch:
            raise ValueError(f"{name} has {ids.shape[0]} sequences, the cache holds {cache.batch}")
        ids, n_new = ids.to(self.device), n_new.to(self.device)
        start = cache.lengths.clone()
        lengths = start + n_new
        if int(lengths.max()) > ctx:
            b = int(torch.argmax(lengths))
            raise ValueError(f"{name}[{b}]: {int(start[b])} cached + {int(n_new[b])} new tokens exceed the "
                             f"model's context of {ctx}")
        T = ids.shape[1]
        steps = torch.arange(T, device=self.device)[None]                                    # (1, T)
        valid = steps < n_new[:, None]                                                       # (B, T)
        # padding tokens of a ragged batch get in-range positions; they are neither stored nor attended to
        positions = torch.minimum(start[:, None] + steps, (lengths - 1)[:, None])            # (B, T)
        cache.reserve(int(lengths.max()))
        h = self.embed(ids)
        with torch.no_grad():
            for layer in range(self.config.n_layers):
                q, k, v = self.attention_inputs(layer, h, positions)
                if observe is not None:
                    observe(layer, q, k, v)
                cache.write(layer, k, v, positions, None if bool(valid.all()) else valid)
                S = int(lengths.max())
                attn = dense_attention(q, cache.k[layer][:, :, :S], cache.v[layer][:, :, :S], positions,
                                       lengths, self.attention_impl)
                h = self.attention_output(layer, h, attn)
        cache.lengths = lengths
        return h, n_new

    def extend(self, token_ids, cache: KVCache, observe=None) -> torch.Tensor:
        """Append new tokens to each sequence in ``cache`` and return the logits after each sequence's last one.

        Parameters
        ----------
        token_ids : (B, T) ints, or a list of B sequences of different lengths (at least one token each)
        cache : KVCache
            Updated in place (K/V written, ``lengths`` advanced); left unchanged when the input is rejected.
        observe : callable, optional
            ``observe(layer, q, k, v)`` for every layer (see :meth:`_hidden`).

        Returns
        -------
        (B, V) logits
        """
        with torch.no_grad():
            h, n_new = self._hidden(token_ids, cache, observe=observe)
            last = h[torch.arange(h.shape[0], device=self.device), n_new - 1]              # (B, D)
            return self.logits(last)

    def prefill(self, token_ids, capacity: int | None = None, observe=None):
        """Process prompts from scratch.

        Parameters
        ----------
        token_ids : one sequence, a (B, T) batch, or a list of sequences of different lengths
        capacity : int, optional
            Tokens per sequence to reserve in the cache (default: the longest prompt; it grows on demand).
        observe : callable, optional
            ``observe(layer, q, k, v)`` for every layer (see :meth:`_hidden`).

        Returns
        -------
        logits : (B, V), after each prompt's last token
        cache : KVCache holding the prompts
        """
        ids, n = as_token_batch(token_ids, self.config.vocab_size, self.config.context_length)
        cache = self.new_cache(ids.shape[0], capacity or ids.shape[1])
        return self.extend([ids[b, : n[b]] for b in range(ids.shape[0])], cache, observe=observe), cache

    def decode(self, tokens, cache: KVCache) -> torch.Tensor:
        """One decode step: one new token per sequence, ``tokens`` (B,) ints -> logits (B, V)."""
        ids, _ = as_token_batch(tokens, self.config.vocab_size, self.config.context_length, "tokens")  # (1, B)
        if ids.shape != (1, cache.batch):
            raise ValueError(f"tokens must hold one id per sequence ({cache.batch}), got shape {tuple(ids.shape)}")
        return self.extend(ids.T, cache)

    def next_token_logprobs(self, token_ids, chunk: int = 512) -> torch.Tensor:
        """Log-probability the model gives each next token of one sequence (for perplexity on held text).

        Parameters
        ----------
        token_ids : (T,) ints, T >= 2
        chunk : int
            Positions whose logits are formed at once (memory ``chunk * V`` floats, not ``T * V``).

        Returns
        -------
        (T - 1,) tensor: entry ``t`` is ``log p(token_ids[t + 1] | token_ids[: t + 1])``; perplexity is
        ``exp(-mean)``.
        """
        ids, n = as_token_batch(token_ids, self.config.vocab_size, self.config.context_length)
        if ids.shape[0] != 1 or int(n[0]) < 2:
            raise ValueError(f"token_ids must be one sequence of at least 2 tokens, got shape {tuple(ids.shape)}")
        with torch.no_grad():
            h, _ = self._hidden(ids, self.new_cache(1, ids.shape[1]))
            target = ids[0, 1:].to(self.device)
            out = []
            for t0 in range(0, target.shape[0], chunk):
                logp = torch.log_softmax(self.logits(h[0, t0: t0 + chunk][: target.shape[0] - t0]), dim=-1)
                out.append(logp.gather(-1, target[t0: t0 + chunk, None])[:, 0])
            return torch.cat(out)

    def forward(self, token_ids) -> torch.Tensor:
        """Logits at every position (no cache kept): (T,) or (B, T) ints -> (B, T, V). Meant for short inputs:
        the result holds ``B * T * V`` values."""
        ids, n = as_token_batch(token_ids, self.config.vocab_size, self.config.context_length)
        cache = self.new_cache(ids.shape[0], ids.shape[1])
        with torch.no_grad():
            h, _ = self._hidden([ids[b, : n[b]] for b in range(ids.shape[0])], cache)
            return self.logits(h)
