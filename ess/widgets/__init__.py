"""Widgets: each wraps a pure ``(parameters) -> (figure, summary)`` function, so the logic is testable without a
browser and the book can show the default output without a kernel. One submodule per topic."""
from .memory import memory_budget_view, memory_budget_widget  # noqa: F401
