"""Shared look of every figure."""
TEMPLATE = "plotly_white"
