import os
import tempfile

import pytest
from hypothesis import settings

# Every property and fuzz test draws the same cases on every run, so that the suite and CI give one verdict per
# commit; ESS_FUZZ_RANDOM=1 draws fresh cases (a search by hand; ESS_FUZZ_SCALE multiplies the fuzz tests' cases).
settings.register_profile("ess-fixed", derandomize=True, database=None)
settings.register_profile("ess-explore")
settings.load_profile("ess-explore" if os.environ.get("ESS_FUZZ_RANDOM", "") not in ("", "0") else "ess-fixed")

# What ess computes on demand and keeps (ess.sim.store's user cache) goes to a folder of this test session, never
# to the user's own cache (and notebooks the tests run inherit it)
os.environ["ESS_CACHE_DIR"] = tempfile.mkdtemp(prefix="ess-test-cache-")

# A pipeline run a test starts in this process waits at most 300 s for a cell (every smoke cell takes seconds), not
# the command's 1,800 s: a kernel whose reply is lost (jupyter/nbclient#312, seen on widget cells) is then retried
# from a fresh kernel within minutes instead of stalling the suite for half an hour. Runs given --cell-timeout keep it.
import ess.pipeline as _pipeline  # noqa: E402

_pipeline.CELL_TIMEOUT_S = 300


def pytest_collection_modifyitems(config, items):
    """CUDA tests run only where a GPU is present."""
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch is a hard dependency
        has_cuda = False
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords and not has_cuda:
            item.add_marker(skip)
