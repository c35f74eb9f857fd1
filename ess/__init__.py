"""ess: latent-cache offload for sparse-attention LLM decoding (ESS for DeepSeek-V3.2-Exp).

Public namespace, re-exported from topic modules:

* facts: :mod:`ess.specs` (model, GPU, host, deployment presets from ``data/``), :mod:`ess.layout` (bytes per
  entry, token and request), :mod:`ess.results` (the record format of the notebooks);
* mechanisms: :mod:`ess.memory` (weights per GPU, KV budget, largest batch);
* wholes: :mod:`ess.tables`, :mod:`ess.viz`, :mod:`ess.widgets`; faces: :mod:`ess.reproduce`, ``ess`` command.
"""
from .layout import (indexer_entry_bytes, latent_entry_bytes, latent_layout, request_cache,  # noqa: F401
                     token_bytes)
from .memory import (fit_mem_fraction_static, host_memory_needed_bytes, kv_budget_bytes,  # noqa: F401
                     largest_batch, weights_per_gpu_bytes)
from .results import Recorder, load_records  # noqa: F401
from .specs import (deployment_spec, gpu_spec, host_spec, list_deployments, list_gpus, list_hosts,  # noqa: F401
                    list_models, model_spec)

__version__ = "0.1.0"
