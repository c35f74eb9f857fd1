"""The linked-list (LRU order) helpers of the Numba kernels now live in :mod:`ess.kernels.lru_list`, with the
kernels that inline them; this name re-exports them for code that imports ``ess.lru_list``."""
from .kernels.lru_list import empty, link_between, push_newest, push_oldest, touch, unlink, unlink_if_linked  # noqa: F401

__all__ = ["empty", "unlink", "unlink_if_linked", "link_between", "push_newest", "push_oldest", "touch"]
