"""ess: latent-cache offload for sparse-attention LLM decoding (ESS for DeepSeek-V3.2-Exp).

Public namespace, re-exported from topic modules (layers from the ground up, see the README):

* facts: :mod:`ess.specs` (model, GPU, host, deployment presets from ``data/``), :mod:`ess.layout` (bytes per
  entry, token and request; the pool-size rule and the cache's capacity from a ratio or a byte budget),
  :mod:`ess.results` (the record format of the notebooks),
  :mod:`ess.published`;
* kernels: :mod:`ess.kernels` (``transfer``, ``attention``; NumPy reference, Numba, torch), :mod:`ess.quant`;
* mechanisms: :mod:`ess.memory` (weights, KV budget, largest batch, where a batch's bytes live),
  :mod:`ess.policies`, :mod:`ess.storage` (host pool, GPU pool, the tiered cache), :mod:`ess.disk` (the disk
  tier), :mod:`ess.archive` (a cache's requests on disk: checkpoint, spill, restore, recover), :mod:`ess.replay`
  (a trace through a cache), :mod:`ess.metrics`, :mod:`ess.link` (the host-device link a step's copies cross),
  :mod:`ess.traces` (format, I/O, overlap, recorder), :mod:`ess.tracegen` (synthetic generators),
  :mod:`ess.locality` (the locality models and their calibration), :mod:`ess.cachesim`;
* behaviour: :mod:`ess.attention` (indexer, top-k, sparse MLA, split/merge), :mod:`ess.heat_predictor`,
  :mod:`ess.prefetch`, :mod:`ess.sim` (the Scenario configuration, costs, timeline, calibration, sweeps, the miss
  table, banded predictions);
* wholes: :mod:`ess.decode` (one decode step through the tiered cache, stage by stage, under none / DA / DBA),
  :mod:`ess.llm` (a real pretrained model), :mod:`ess.engine` (that model decoding through the tiered cache),
  :mod:`ess.studies` (the notebooks' experiments), :mod:`ess.tables`, :mod:`ess.viz`, :mod:`ess.widgets`,
  :mod:`ess.bench`; faces: :func:`ess.plan` (does offload pay for a model on a GPU at a context: :mod:`ess.planning`),
  :mod:`ess.pipeline` (the reproduction pipeline), the ``ess`` command.
"""
from .attention import (indexer_scores, merge_attention, sparse_mla_decode, split_attention,  # noqa: F401
                        topk_indices)
from .cachesim import misses_per_layer, misses_per_step  # noqa: F401
from .layout import (capacity_from_budget, capacity_from_ratio, indexer_entry_bytes,  # noqa: F401
                     latent_entry_bytes, latent_layout, pool_slots, request_cache, token_bytes)
from .memory import (fit_mem_fraction_static, host_memory_needed_bytes, kv_budget_bytes,  # noqa: F401
                     largest_batch, tier_placement, weights_per_gpu_bytes)
from .results import Recorder, load_records  # noqa: F401
from .specs import (deployment_spec, gpu_spec, host_spec, list_deployments, list_gpus, list_hosts,  # noqa: F401
                    list_models, model_spec)
from .decode import decode_layer, write_back  # noqa: F401
from .disk import CorruptBlockError  # noqa: F401
from .storage import PoolStep, StepPlan, TieredCache  # noqa: F401
from .tracegen import Workload, synthetic_trace  # noqa: F401
from .traces import Trace, load_trace  # noqa: F401
from .planning import Plan, plan  # noqa: F401

__version__ = "0.1.0"
