"""The live monitoring view: a progress bar, a summary line and :func:`ess.viz.monitor.fig_monitor`, redrawn as a
decode's per-step rows arrive (the rows of :mod:`ess.monitor`'s protocol, from any source: the decode engine's
``on_step``, or a trace replay, :func:`ess.replay.replay_steps`)."""
from __future__ import annotations

import time

from ..monitor import StepSeries
from ..validate import positive_int, real
from ..viz.monitor import fig_monitor
from ._controls import LABEL, num, redraw

__all__ = ["LiveMonitor"]


class LiveMonitor:
    """Follow a decode of ``total_steps`` steps: :meth:`update` is the callback for one row (hand it to a producer),
    :meth:`follow` pulls the rows of an iterable; ``widget`` is what a notebook displays, :meth:`figure` the whole
    run so far as a plain figure (for the book, which has no kernel).

    ``pace_s``: :meth:`follow` makes each step last at least this long (a trace replays in milliseconds per step;
    spacing the steps lets a reader follow the view; a real decode needs none). ``min_redraw_s``: the figure is
    redrawn at most this often (always after the last step); the progress bar and the summary follow every row."""

    def __init__(self, total_steps: int, *, title: str = "", layer_labels=None, pace_s: float = 0.0,
                 min_redraw_s: float = 0.0):
        import ipywidgets as W

        self.total_steps = positive_int("total_steps", total_steps)
        self.pace_s = real("pace_s", pace_s, lo=0.0)
        self.min_redraw_s = real("min_redraw_s", min_redraw_s, lo=0.0)
        self.title = title
        self.layer_labels = layer_labels
        self.series = StepSeries(self.total_steps)
        self.progress = W.IntProgress(value=0, min=0, max=self.total_steps, description="decode steps", style=LABEL)
        self.label = W.HTML(f"step 0 of {self.total_steps}")
        self.out = W.Output()
        self.widget = W.VBox([W.HBox([self.progress, self.label]), self.out])
        self.widget.add_class("ess-monitor")
        self.redraws = 0
        self._drawn_at = None

    def figure(self):
        """The monitor figure of the rows so far."""
        return fig_monitor(self.series.frame(), self.series.misses_by_layer(), total_steps=self.total_steps,
                           layer_labels=self.layer_labels, title=self.title)

    def update(self, row) -> None:
        """Take one row (checked, :func:`ess.monitor.check_row`): progress, summary, and the figure when due."""
        if len(self.series) >= self.total_steps:
            raise ValueError(f"the monitor expects {self.total_steps} steps and has them all")
        r = self.series.add(row)
        n = len(self.series)
        t = self.series.totals()
        self.progress.value = n
        self.label.value = (f"step {n} of {self.total_steps}: hit rate {r.hit_rate:.3f} (so far {t['hit_rate']:.3f}), "
                            f"link utilisation {r.link_utilisation:.3f}, stall {num(r.stall_s * 1e3, 3)} ms, "
                            f"{sum(r.misses):,} misses")
        now = time.monotonic()
        if n == self.total_steps or self._drawn_at is None or now - self._drawn_at >= self.min_redraw_s:
            redraw(self.out, self.figure())
            self.redraws += 1
            self._drawn_at = now

    def follow(self, rows) -> dict:
        """Take every row of ``rows`` as it comes (each step lasting at least ``pace_s``); returns the run's
        :meth:`ess.monitor.StepSeries.totals`."""
        started = time.monotonic()
        for row in rows:
            self.update(row)
            wait = started + len(self.series) * self.pace_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        return self.series.totals()
