"""The cache simulation's miss counts as the simulator reads them: :class:`MissesTable`, mean misses per request,
decode step and layer for (context, ratio, MTP), from synthetic traces of a locality model
(:func:`ess.cachesim.sweep_synthetic`).

The time goes into generating the traces: one set of streams per (context, MTP) serves every ratio, so the table
computes a (context, MTP) **row** of ratios at once and keeps it -- the ratios asked for, and the table's own grid
``ratios`` (e.g. a widget's slider stops) the first time the row is met. :meth:`MissesTable.prefetch` fills many
points in one go (the points sharing a context and an MTP in one sweep). A ratio of 1 is no offload: no misses. A
ratio whose pools cannot hold one step's entries is kept with the reason, and asking for it raises that reason as a
``ValueError``. ``config`` says what produced the counts.

>>> table = MissesTable(steps=8, batch=1)                                     # doctest: +SKIP
>>> table(32768, 0.2, 2).shape                                                # doctest: +SKIP
(61,)
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from ..layout import pool_slots
from ..specs import DEFAULT_MODEL, model_spec
from ..validate import integer, positive_int, ratio as check_ratio

__all__ = ["MissesTable"]


def _ratios(name: str, ratios) -> tuple[float, ...]:
    """``ratios`` (an iterable of sparse-memory ratios in (0, 1]) as a sorted tuple without repeats."""
    if isinstance(ratios, (str, bytes)) or not isinstance(ratios, Iterable) or (isinstance(ratios, np.ndarray)
                                                                               and ratios.ndim == 0):
        raise TypeError(f"{name} must be a list of sparse-memory ratios in (0, 1], got {type(ratios).__name__}")
    return tuple(sorted({check_ratio(f"{name}[{i}]", r) for i, r in enumerate(ratios)}))


def _key(context_len, mtp) -> tuple[int, int]:
    """A row's ``(context_len, mtp)``, each a whole number >= 1, the context at most the model's."""
    return (integer("context_len", context_len, lo=1, below=model_spec(DEFAULT_MODEL).max_position_embeddings + 1),
            positive_int("mtp", mtp))


class MissesTable:
    """Mean misses per request, decode step and layer, shape ``(n_layers,)``, from the cache simulation
    (:func:`ess.cachesim.sweep_synthetic`) of DeepSeek-V3.2-Exp's pools: synthetic traces of ``locality`` (an
    :class:`ess.tracegen.LocalityModel`; default :func:`ess.tracegen.default_locality`, the central model; or
    ``trace_model`` alone, that model with its defaults) with the paper's Fig. 2 profile, ``steps`` decode steps of
    ``batch`` requests from ``seed``, ``policy`` (one of :data:`ess.policies.POLICIES`: ``"clock"`` or HiSparse's
    ``"sampled_clock"`` price a CLOCK cache) with or without LRU-Warmup (``warmup``).

    ``table(context_len, ratio, mtp)`` is one point; :meth:`row` a (context, MTP) row; :meth:`prefetch` many
    points. ``ratios``: the grid a row is computed for when first met (default none: only the ratios asked for)."""

    def __init__(self, ratios: Iterable[float] = (), *, steps: int = 64, batch: int = 4, seed: int = 0,
                 warmup: bool = True, policy: str = "lru", locality=None, trace_model: str | None = None):
        from ..policies import POLICIES
        from ..tracegen import LocalityModel, check_trace_model, default_locality, fitted_drift_rho
        from ..validate import non_negative_int, one_of

        if trace_model is not None:
            check_trace_model(trace_model)
        if locality is None:
            locality = default_locality()
            if trace_model is not None and trace_model != locality.trace_model:
                locality = LocalityModel(trace_model, trace_model, locality.reading,
                                         fitted_drift_rho(locality.reading) if trace_model == "drift" else None)
        elif trace_model is not None:
            raise ValueError("give locality or trace_model, not both")
        if not isinstance(locality, LocalityModel):
            raise TypeError(f"locality must be an ess.tracegen.LocalityModel, got {type(locality).__name__}")
        if not isinstance(warmup, bool):
            raise TypeError(f"warmup must be True or False, got {warmup!r}")
        self.locality = locality
        self.ratios = _ratios("ratios", ratios)
        self.steps, self.batch = positive_int("steps", steps), positive_int("batch", batch)
        self.seed, self.warmup = non_negative_int("seed", seed), warmup
        self.policy = one_of("policy", policy, POLICIES)
        self._rows: dict[tuple[int, int], dict[float, object]] = {}

    @property
    def config(self) -> dict:
        """What produced the counts (for a record's configuration)."""
        return {"steps": self.steps, "batch": self.batch, "seed": self.seed, "warmup": self.warmup,
                "policy": self.policy, "profile": "paper", **self.locality.config()}

    def describe(self) -> str:
        """``config`` in words."""
        return (f"cache simulation ({self.policy.upper()}{' + warmup' if self.warmup else ''}, "
                f"{self.locality.name} locality model {self.locality.label}, {self.steps} steps x "
                f"{self.batch} requests, seed {self.seed})")

    def with_ratios(self, ratios: Iterable[float]) -> "MissesTable":
        """The same table (same settings, the counts computed so far shared) with another grid of ratios."""
        ratios = _ratios("ratios", ratios)
        other = MissesTable.__new__(MissesTable)
        other.__dict__.update(self.__dict__)
        other.ratios = ratios
        return other

    def has_row(self, context_len: int, mtp: int) -> bool:
        """Whether the (context, MTP) row holds every ratio of the grid."""
        row = self._rows.get(_key(context_len, mtp))
        return row is not None and all(r in row for r in self.ratios)

    def row(self, context_len: int, mtp: int, ratios: Iterable[float] = ()) -> dict:
        """``{ratio: misses (n_layers,) or the reason it cannot be simulated}`` for every ratio of the grid and of
        ``ratios`` at this context and MTP, each computed once (one sweep for those not met yet) and kept."""
        from ..cachesim import sweep_synthetic

        key = _key(context_len, mtp)
        todo = set(self.ratios) | set(_ratios("ratios", ratios))
        row = self._rows.setdefault(key, {})
        todo = sorted(todo - set(row))
        model = model_spec(DEFAULT_MODEL)
        for r in [r for r in todo if r >= 1.0]:
            row[r] = np.zeros(model.n_layers)                     # no offload: nothing misses
        todo = [r for r in todo if r < 1.0]
        for r in list(todo):                                      # pools that cannot hold K entries (no trace needed)
            try:
                pool_slots(model, r, key[0], need=model.index_topk)
            except ValueError as exc:
                row[r] = str(exc)
                todo.remove(r)
        kw = dict(policies=(self.policy,), warmups=(self.warmup,), mtp=key[1], steps=self.steps, batch=self.batch,
                  seed=self.seed, **self.locality.kwargs())
        while todo:
            # a pool too small for what the layers' steps select together fails the sweep: the smallest ratio is set
            # apart with the reason (a smaller pool cannot hold what a larger one cannot) and the rest run again
            try:
                res = sweep_synthetic(key[0], todo, **kw)
            except ValueError as exc:
                row[todo.pop(0)] = str(exc)
                continue
            for r in todo:
                row[r] = res[(r, self.policy, self.warmup)].mean(axis=1)
            todo = []
        return row

    def prefetch(self, points: Iterable) -> None:
        """Compute every ``(context_len, ratio, mtp)`` of ``points`` not known yet: one sweep per (context, MTP)."""
        groups: dict[tuple[int, int], set] = {}
        for L, r, t in points:
            groups.setdefault(_key(L, t), set()).add(check_ratio("points: ratio", r))
        for (L, t), ratios in groups.items():
            self.row(L, t, ratios)

    def __call__(self, context_len: int, ratio: float, mtp: int) -> np.ndarray:
        """Misses per layer (n_layers,) at this setting; ``ValueError`` with the reason when the cache simulation
        cannot run it (the pool cannot hold one step's entries)."""
        r = check_ratio("ratio", ratio)
        got = self.row(context_len, mtp, (r,))[r]
        if isinstance(got, str):
            raise ValueError(got)
        return got
