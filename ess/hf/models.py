"""Which transformers models ``ess.hf`` decodes, what it reads of them, and the models its tests and notebook use.

* :func:`model_info` -- a model's architecture as the cache needs it (:class:`ModelInfo`), or a ``ValueError``
  that names the architecture and says why it is not supported;
* :func:`tiny_dsa_config` / :func:`tiny_dsa_model` -- DeepSeek-V3.2 (``deepseek_v32``) and GLM-5
  (``glm_moe_dsa``) with a few layers and small dims, built from transformers' own config classes (random weights,
  nothing downloaded);
* :func:`load_smollm2` -- SmolLM2-135M-Instruct loaded *through transformers* from the GGUF file ess already uses
  (:func:`ess.llm.model_path`).

**DeepSeek-V4** (``deepseek_v4``) is not supported: its attention layers are of three kinds (a sliding window of
uncompressed K=V rows, and two compressed kinds whose rows a learned compressor emits, one per 4 or 128 tokens),
and the compressed rows are produced inside transformers' V4 cache layer classes through methods of their own
(``store_compression_weights``, ``update_compressor_states``) rather than the public ``update``. Offloading those
rows means reimplementing that private protocol over the tiered cache; until transformers makes it public, a V4
model is refused with this reason (:data:`UNSUPPORTED`). ess's simulator models V4's rows (``deepseek-v4-flash``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .. import validate

__all__ = ["GQA_TYPES", "DSA_TYPES", "UNSUPPORTED", "ModelInfo", "model_info", "tiny_dsa_config", "tiny_dsa_model",
           "load_smollm2", "transformers_llama"]

# decoders whose attention is plain MHA/GQA with RoPE over a K/V cache, one head dim (the tests decode a tiny model
# of each: tests/test_hf_gqa.py)
GQA_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# DeepSeek Sparse Attention: MLA latents in the cache, a lightning indexer choosing the top-K
DSA_TYPES = ("deepseek_v32", "glm_moe_dsa")
UNSUPPORTED = {
    "deepseek_v4": "DeepSeek-V4's compressed rows are made inside transformers' V4 cache layers by methods of their "
                   "own (store_compression_weights, update_compressor_states), not the public cache API; see "
                   "ess.hf.models",
}


@dataclass(frozen=True)
class ModelInfo:
    """What the cache reads of a model: ``kind`` (``"gqa"`` or ``"dsa"``), ``model_type``, layers, heads and head
    dims; for DSA the latent dims and ``index_topk``; the model's ``device`` and ``max_positions``."""

    kind: str
    model_type: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    device: torch.device
    max_positions: int
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    index_topk: int = 0


def model_info(model) -> ModelInfo:
    """:class:`ModelInfo` of a transformers causal LM; a ``TypeError`` for anything else, a ``ValueError`` naming
    the architecture when it is not one ``ess.hf`` decodes (:data:`GQA_TYPES`, :data:`DSA_TYPES`) or not float32."""
    config = getattr(model, "config", None)
    if not isinstance(model, torch.nn.Module) or config is None or not hasattr(config, "model_type"):
        raise TypeError(f"model must be a transformers model (a torch module with a config), got "
                        f"{type(model).__name__}")
    mt = config.model_type
    if mt in UNSUPPORTED:
        raise ValueError(f"model: architecture {mt!r} is not supported: {UNSUPPORTED[mt]}")
    if mt not in GQA_TYPES + DSA_TYPES:
        raise ValueError(f"model: architecture {mt!r} is not supported; ess.hf decodes {', '.join(GQA_TYPES)} "
                         f"(MHA/GQA) and {', '.join(DSA_TYPES)} (DeepSeek Sparse Attention)")
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        raise ValueError(f"model: ess.hf decodes float32 models (its K/V entries are float32), this one is {dtype}; "
                         f"load it with dtype=torch.float32")
    device = next(model.parameters()).device
    # a config without max_position_embeddings: no limit of the model's own; 2**20 tokens bounds the host pool's format
    max_pos = int(getattr(config, "max_position_embeddings", 0) or 1 << 20)
    nl = int(config.num_hidden_layers)
    if mt in DSA_TYPES:
        return ModelInfo("dsa", mt, nl, int(config.num_attention_heads), 1, int(config.qk_rope_head_dim), device,
                         max_pos, int(config.kv_lora_rank), int(config.qk_rope_head_dim),
                         int(config.qk_nope_head_dim), int(config.v_head_dim), int(config.index_topk))
    if getattr(config, "sliding_window", None) and any(t == "sliding_attention"
                                                       for t in (getattr(config, "layer_types", None) or [])):
        raise ValueError(f"model: {mt!r} with sliding-window layers is not supported (every layer must attend "
                         f"to the whole context)")
    H = int(config.num_attention_heads)
    hd = int(getattr(config, "head_dim", None) or config.hidden_size // H)
    return ModelInfo("gqa", mt, nl, H, int(getattr(config, "num_key_value_heads", None) or H), hd, device, max_pos)


def tiny_dsa_config(model_type: str = "deepseek_v32", *, n_layers: int = 3, index_topk: int = 16, vocab_size: int = 97,
                    seed_layers: dict | None = None):
    """A tiny configuration of a DSA architecture (``"deepseek_v32"`` or ``"glm_moe_dsa"``) from transformers' config
    class: ``n_layers`` layers (the first dense, the rest MoE with 4 experts), hidden 64, 4 heads, latent rank 128
    (one FP8 scale tile: ess's FP8 layout applies, 164 B per entry) with a 16-dim RoPE part, an indexer of 2 heads
    of 32 dims choosing ``index_topk``. GLM-5's alternates full and shared indexer layers."""
    validate.one_of("model_type", model_type, DSA_TYPES)
    n_layers = validate.positive_int("n_layers", n_layers)
    index_topk = validate.positive_int("index_topk", index_topk)
    # design choice: every size small enough that a decode step takes milliseconds on a CPU; kv_lora_rank 128 and
    # qk_rope_head_dim 16 are ess's "tiny" model's (data/models/tiny.yaml), so its FP8 latent layout applies
    kw = dict(vocab_size=validate.positive_int("vocab_size", vocab_size), hidden_size=64, intermediate_size=96,
              moe_intermediate_size=32, num_hidden_layers=n_layers, num_attention_heads=4, num_key_value_heads=4,
              n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
              kv_lora_rank=128, q_lora_rank=48, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16,
              index_topk=index_topk, index_head_dim=32, index_n_heads=2, first_k_dense_replace=1,
              max_position_embeddings=4096, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if model_type == "deepseek_v32":
        from transformers import DeepseekV32Config
        return DeepseekV32Config(**kw)
    from transformers import GlmMoeDsaConfig
    kw["indexer_types"] = ["full" if i % 2 == 0 else "shared" for i in range(n_layers)]
    return GlmMoeDsaConfig(**kw)


def tiny_dsa_model(model_type: str = "deepseek_v32", *, seed: int = 0, attn_implementation: str = "sdpa", **config):
    """A float32 causal LM of :func:`tiny_dsa_config` with random weights (``seed``), in eval mode."""
    from transformers import AutoModelForCausalLM
    cfg = tiny_dsa_config(model_type, **config)
    torch.manual_seed(validate.non_negative_int("seed", seed))
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn_implementation, dtype=torch.float32)
    # design choice: transformers initialises norm scales to one and gate biases to zero; a 0.1 random perturbation
    # of every vector makes each of those paths carry signal (a test of them can fail)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def load_smollm2(*, source: str = "gguf", attn_implementation: str = "sdpa"):
    """``(model, tokenizer)``: SmolLM2-135M-Instruct as transformers' ``LlamaForCausalLM`` (float32, eval mode,
    offline) with transformers' tokenizer, both from the GGUF file ess installs (:func:`ess.llm.model_path`).

    ``source="gguf"``: transformers reads and dequantises the file itself (about 15 s); ``"ess"``: the weights come
    from ess's decoded copy of the same file (:func:`ess.llm.load_model`, cached between runs: about 7 s), put into
    transformers' model by :func:`transformers_llama` -- the same tensors (``tests/test_llm_parity.py`` checks
    transformers' own reading against ess's)."""
    import os
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from ..llm import load_model, model_path
    validate.one_of("source", source, ("gguf", "ess"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")     # the local GGUF file only; never the hub
    path = model_path()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if source == "ess":
        lm = load_model()
        model = transformers_llama(lm.weights, lm.config)
        model.set_attn_implementation(attn_implementation)
        return model, tok
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                 attn_implementation=attn_implementation)
    return model.eval(), tok


def transformers_llama(weights, config):
    """transformers' ``LlamaForCausalLM`` (float32, eval mode) holding the same weights as an ess Llama model
    (:class:`ess.llm.LlamaWeights` of :class:`ess.llm.LlamaConfig`; both in Hugging Face's layout), so that ess's
    own engine and the transformers path decode the same model."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from ..llm import LlamaConfig as EssConfig, LlamaWeights
    if not isinstance(config, EssConfig):
        raise TypeError(f"config must be an ess.llm.LlamaConfig, got {type(config).__name__}")
    if not isinstance(weights, LlamaWeights):
        raise TypeError(f"weights must be an ess.llm.LlamaWeights, got {type(weights).__name__}")
    c = config
    hf = LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ffn,
                     num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads,
                     head_dim=c.head_dim, rms_norm_eps=c.rms_eps, max_position_embeddings=c.context_length,
                     rope_parameters={"rope_type": "default", "rope_theta": c.rope_base},
                     tie_word_embeddings=c.tied_output, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(hf).to(torch.float32)
    t = lambda a: torch.as_tensor(np.asarray(a, np.float32))                          # noqa: E731
    sd = {"model.embed_tokens.weight": t(weights.embedding), "model.norm.weight": t(weights.final_norm),
          "lm_head.weight": t(weights.output)}
    for i, lw in enumerate(weights.layers):
        p = f"model.layers.{i}."
        for name, w in (("self_attn.q_proj", lw.wq), ("self_attn.k_proj", lw.wk), ("self_attn.v_proj", lw.wv),
                        ("self_attn.o_proj", lw.wo), ("mlp.gate_proj", lw.w_gate), ("mlp.up_proj", lw.w_up),
                        ("mlp.down_proj", lw.w_down), ("input_layernorm", lw.attn_norm),
                        ("post_attention_layernorm", lw.ffn_norm)):
            sd[p + name + ".weight"] = t(w)
    model.load_state_dict(sd, strict=True)
    return model.eval()
