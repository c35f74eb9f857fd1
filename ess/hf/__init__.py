"""Bring your own model: a transformers decoder decoding sparsely through ess's tiered cache.

>>> import ess.hf  # doctest: +SKIP
>>> model = ess.hf.tiny_dsa_model("deepseek_v32")              # or any Llama/Qwen/Mistral, or load_smollm2()
>>> cache = ess.hf.SparseCache(model, max_new_tokens=8, ratio=0.5, schedule="da")
>>> out = model.generate(ids, cache=cache, max_new_tokens=8, do_sample=False)
>>> cache.frame()                                              # cache_hits, cache_misses, host_to_device_bytes

Modules, one concern each:

* :mod:`~ess.hf._compat` the one place transformers' API is touched (cache base classes, the attention and mask
  registries, the tested version range);
* :mod:`~ess.hf.models` which architectures are decoded (:func:`model_info`), tiny DSA models, SmolLM2 through
  transformers;
* :mod:`~ess.hf.latent` a DSA model's latent entry in ess's byte layout and sparse MLA over it;
* :mod:`~ess.hf.cache` :class:`SparseCache`, the cache on transformers' API whose entries live in the tiered cache;
* :mod:`~ess.hf.attention` the registered attention function and :func:`enable`;
* :mod:`~ess.hf.run` decoding runs (greedy, teacher-forced) with their logits and counters, the trace recorder and
  the ``ess record-trace`` command.
"""
from .attention import ATTENTION_NAME, enable, sparse_attention  # noqa: F401
from .cache import SparseCache  # noqa: F401
from .latent import LATENT_DTYPES, LatentFormat  # noqa: F401
from .models import (DSA_TYPES, GQA_TYPES, UNSUPPORTED, ModelInfo, load_smollm2, model_info,  # noqa: F401
                     tiny_dsa_config, tiny_dsa_model, transformers_llama)
from .run import HFRun, decode, dense_decode, prefill, record_trace  # noqa: F401
