"""A real pretrained model decoding through the tiered cache: SmolLM2-135M-Instruct (:mod:`ess.llm`) with DSA-style
sparse attention, its K/V entries in the host pool and a share of them in the device pool.

* :mod:`~ess.engine.config` :class:`DecodeConfig`, what a sparse decode run is set to;
* :mod:`~ess.engine.kv` the K/V entry (1,536 B per token and layer) and its format for the storage;
* :mod:`~ess.engine.indexer` the FP8 indexer keys (204 B) and their device-resident cache (the scores: the kernel
  family :mod:`ess.kernels.gqa_indexer`; top-K: :func:`ess.attention.topk_indices`);
* :mod:`~ess.engine.attention` sparse attention whose result does not depend on which entries were resident;
* :mod:`~ess.engine.wiring` the model's part of a decode step (:func:`ess.decode.run_layer` runs it);
* :mod:`~ess.engine.engine` :class:`DecodeEngine`: prefill, sparse decoding (offload on or off; a
  :class:`DecodeSession` steps one run at a time), dense baseline.

The studies run on it (the check of the simulator's overlap formulas, the quality comparisons, trace
recording) are :mod:`ess.studies.real_model`'s.
"""
from .config import TOPK_DIVISOR, WARMUP_WINDOWS, DecodeConfig, default_topk  # noqa: F401
from .engine import DecodeEngine, DecodeRun, DecodeSession, DenseSession, Prefilled  # noqa: F401
from .indexer import IndexerCache, indexer_key_bytes  # noqa: F401
from .kv import kv_entry_format  # noqa: F401
