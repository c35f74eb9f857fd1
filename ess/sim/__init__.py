"""The decode-throughput simulator of DeepSeek-V3.2-Exp: its typed configuration (``config``: :class:`Scenario`),
operation costs (``costs``), the per-layer step timeline with Two-Batch Overlap, MTP and the offload strategies
(``timeline``), calibration on the paper's calibration data (``calibrate``), grid sweeps (``sweep``), the cache
simulation's miss counts as a table (``misses``) and tables of configurations predicted with them
(``predictions``). The batch a GPU holds is :func:`ess.memory.batch_limits`."""
from .config import STRATEGIES, Scenario  # noqa: F401
from .costs import CostParams, layer_costs  # noqa: F401
from .timeline import SimResult, best_batch, simulate  # noqa: F401
