"""The decode-throughput simulator of DeepSeek-V3.2-Exp: operation costs (``costs``), the per-layer step timeline
with Two-Batch Overlap, MTP and the offload strategies (``timeline``), calibration on the paper's calibration data
(``calibrate``), grid sweeps (``sweep``) and tables of configurations predicted with cache-simulated misses
(``scenarios``)."""
from .costs import CostParams, layer_costs  # noqa: F401
from .timeline import STRATEGIES, SimResult, batch_limits, best_batch, ratio_for_batch, simulate  # noqa: F401
