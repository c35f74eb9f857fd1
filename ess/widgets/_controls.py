"""What every widget shares: readable labels, numbers without a signed zero, and the redraw of its figure."""
from __future__ import annotations

LABEL = {"description_width": "initial"}          # the label as wide as its text: never cut off


def num(x: float, digits: int = 2) -> str:
    """``x`` with ``digits`` decimals; a value that rounds to zero is written ``0.00``, never ``-0.00``."""
    x = float(x)
    if abs(x) < 0.5 * 10 ** -digits:
        x = 0.0
    return f"{x:.{digits}f}"


def redraw(out, fig) -> None:
    """Replace what the output widget ``out`` shows by ``fig``."""
    out.clear_output(wait=True)
    with out:
        fig.show()
