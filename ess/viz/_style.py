"""Shared look of every figure."""
TEMPLATE = "plotly_white"
LEGEND = {"orientation": "h", "y": -0.25}      # a horizontal legend under the plot
