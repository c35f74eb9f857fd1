"""Bring your own model: a transformers decoder decoding sparsely through ess's tiered cache.

>>> import torch, ess.hf
>>> model = ess.hf.tiny_dsa_model("deepseek_v32", index_topk=8)   # or any Llama/Qwen/Mistral; load_smollm2()
>>> ids = torch.randint(0, 97, (1, 24), generator=torch.Generator().manual_seed(0))
>>> cache = ess.hf.SparseCache(model, max_new_tokens=4, ratio=0.5, schedule="da")
>>> out = model.generate(ids, attention_mask=torch.ones_like(ids), cache=cache, max_new_tokens=4,
...                      min_new_tokens=4, do_sample=False)
>>> cache.close()
>>> cache.counters()["cache_misses"].shape       # (decode steps, layers, requests); also cache_hits, bytes
(3, 3, 1)

Modules, one concern each:

* :mod:`~ess.hf._compat` the one place transformers' API is touched (cache base classes, the attention and mask
  registries, the tested version range);
* :mod:`~ess.hf.models` which architectures are decoded (:func:`model_info`), tiny DSA models, SmolLM2 through
  transformers;
* :mod:`~ess.hf.latent` a DSA model's latent entry in ess's byte layout and sparse MLA over it;
* :mod:`~ess.hf.cache` :class:`SparseCache`, the cache on transformers' API whose entries live in the tiered cache;
* :mod:`~ess.hf.attention` the registered attention function and :func:`enable`;
* :mod:`~ess.hf.run` decoding runs (greedy, teacher-forced) with their logits and counters, the chunked prefill,
  the trace recorder and the ``ess record-trace`` command;
* :mod:`~ess.hf.figures` the rows a run read against the context.
"""
from .attention import ATTENTION_NAME, enable, sparse_attention  # noqa: F401
from .cache import SparseCache  # noqa: F401
from .latent import LATENT_DTYPES, LatentFormat  # noqa: F401
from .models import (DSA_TYPES, GQA_TYPES, UNSUPPORTED, ModelInfo, load_smollm2, model_info,  # noqa: F401
                     tiny_dsa_config, tiny_dsa_model, transformers_llama)
from .run import HFRun, decode, dense_decode, prefill, record_trace  # noqa: F401
