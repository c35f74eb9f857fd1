"""One function per article or paper table: each returns a DataFrame with the published value, ours, the error or
status, and the source. One submodule per topic; the common names are re-exported here."""
from .memory import batch_limits_by_gpu, kv_bytes_by_context, memory_wall_claims  # noqa: F401
