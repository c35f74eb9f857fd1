"""Widgets: each wraps a pure ``(parameters) -> (figure, summary)`` function, so the logic is testable without a
browser and the book can show the default output without a kernel. One submodule per topic."""
from .grid import grid_view, grid_widget  # noqa: F401
from .memory import memory_budget_view, memory_budget_widget  # noqa: F401
from .monitor import LiveMonitor  # noqa: F401
from .prefetch import prefetch_view, prefetch_widget  # noqa: F401
from .sim import sim_budget_view, sim_budget_widget  # noqa: F401
from .storage import storage_budget_view, storage_budget_widget  # noqa: F401
