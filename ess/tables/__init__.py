"""One function per article or paper table, and the notebooks' results as frames and records: each returns a
DataFrame with the published value, ours, the error or status, and the source, or records ready for
:meth:`ess.results.Recorder.record`. One submodule per topic (``memory``: notebook 01; ``sim``: notebooks
05-08; ``grid``: notebook 10; notebook 04's studies return their own, :mod:`ess.studies.prefetching`)."""
from . import grid, memory, sim  # noqa: F401
from .memory import batch_limits_by_gpu, kv_bytes_by_context, memory_wall_claims  # noqa: F401
from .sim import article_table_32k, claim_128k, deployment_benefits, section12_claims, table2_predictions  # noqa: F401
