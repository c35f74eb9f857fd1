"""The cache simulation's miss counts as the simulator reads them: :class:`MissesTable`, mean misses per request,
decode step and layer for (context, ratio, MTP), from synthetic traces of a locality model
(:func:`ess.cachesim.sweep_synthetic`).

The time goes into generating the traces: one set of streams per (context, MTP) serves every ratio, so the table
computes a (context, MTP) **row** of ratios at once and keeps it -- the ratios asked for, and the table's own grid
``ratios`` (e.g. a widget's slider stops) the first time the row is met. :meth:`MissesTable.prefetch` fills many
points in one go (the points sharing a context and an MTP in one sweep). A ratio of 1 is no offload: no misses. A
ratio whose pools cannot hold one step's entries is kept with the reason, and asking for it raises that reason as a
``ValueError``. ``config`` says what produced the counts.

A point that needs no trace (a simulated one first compiles the cache simulation, seconds):

>>> table = MissesTable(steps=8, batch=1)
>>> m = table(32768, 1.0, 2)                      # no offload: one count per sparse layer, all zero
>>> m.shape, float(m.sum())
((61,), 0.0)
>>> table(32768, 0.01, 2)                         # 327 slots cannot hold the K = 2,048 entries of one step
Traceback (most recent call last):
...
ValueError: ratio 0.01 of context_len=32768 (32768 allocated tokens) gives 327 GPU slots per request and layer, ...
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from ..layout import pool_slots
from ..options import option
from ..specs import DEFAULT_MODEL, ModelSpec, model_spec
from ..validate import integer, positive_int, ratio as check_ratio

__all__ = ["MissesTable", "BandSizes", "NOTEBOOK_SIZES", "PLANNER_SIZES", "PROFILES", "MAX_SIMULATED_ROWS"]

#: how paper Fig. 2's per-layer overlap is carried to a model: ``"paper"`` the layer at the same relative depth
#: (:func:`ess.tracegen.locality_profile`, then the model's sparse layers), ``"flat"`` every sparse layer at Fig. 2's
#: mean (its level carried over, not its per-layer shape: the extrapolation band's other end,
#: ``data/calibration/extrapolation.yaml``)
PROFILES = ("paper", "flat")
#: the longest context, in rows, the cache simulation runs here: it sizes its pools with DeepSeek-V3.2-Exp's cache
#: pages and context limit (163,840 positions). A longer one (DeepSeek-V4-Flash's 1M tokens: 262,144 C4 rows) is
#: simulated at this many rows; at a fixed ratio misses fall as the context grows (notebook 04), so its counts
#: overstate the longer context's
MAX_SIMULATED_ROWS = 131072


@dataclass(frozen=True)
class BandSizes:
    """The sizes of the cache simulations behind a banded prediction: each locality model's miss table runs
    ``steps`` decode steps of ``batch`` requests (the central model) or ``band_batch`` requests (the band's other
    models, which only bound the band: their spread, not their noise, is the band). Checked when made."""

    steps: int = field(default=64, metadata=option("decode steps of each miss table's traces", "steps"))
    batch: int = field(default=4, metadata=option("requests of the central locality model's traces", "requests"))
    band_batch: int = field(default=2, metadata=option(
        "requests of the band's other locality models' traces", "requests"))

    def __post_init__(self) -> None:
        for name in ("steps", "batch", "band_batch"):
            object.__setattr__(self, name, positive_int(name, getattr(self, name)))

    def replace(self, **changes) -> "BandSizes":
        """A copy with ``changes`` (checked as when made): a notebook's ``band_sizes`` parameter applied to its
        default, e.g. ``NOTEBOOK_SIZES.replace(**band_sizes)``."""
        import dataclasses
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(f"band sizes have steps, batch and band_batch, got {', '.join(map(repr, unknown))}")
        return dataclasses.replace(self, **changes)

    def batch_of(self, central: bool) -> int:
        """The requests a locality model's table simulates: ``batch`` for the central model, else ``band_batch``."""
        from ..validate import boolean
        return self.batch if boolean("central", central) else self.band_batch

    def config(self) -> dict:
        """The sizes in a recorded configuration."""
        return {"steps": self.steps, "batch": self.batch, "band_batch": self.band_batch}


def _sizes(name: str, sizes, default: "BandSizes") -> "BandSizes":
    """``sizes`` (a :class:`BandSizes`; ``None`` gives ``default``)."""
    if sizes is None:
        return default
    if not isinstance(sizes, BandSizes):
        raise TypeError(f"{name} must be an ess.sim.misses.BandSizes (e.g. BandSizes(steps=16, batch=2, "
                        f"band_batch=1)), got {type(sizes).__name__}")
    return sizes


#: the notebooks' banded predictions (06-08): 64 steps, 4 requests, 2 for the band's other models
NOTEBOOK_SIZES = BandSizes()
#: the planner's and the grid's (``ess plan``, notebook 10, the widgets): half the steps and requests, so that a
#: plan computes its missing rows in seconds; ``data/generated``'s shipped tables are at these sizes
PLANNER_SIZES = BandSizes(steps=32, batch=2, band_batch=1)


def _ratios(name: str, ratios) -> tuple[float, ...]:
    """``ratios`` (an iterable of sparse-memory ratios in (0, 1]) as a sorted tuple without repeats."""
    if isinstance(ratios, (str, bytes)) or not isinstance(ratios, Iterable) or (isinstance(ratios, np.ndarray)
                                                                               and ratios.ndim == 0):
        raise TypeError(f"{name} must be a list of sparse-memory ratios in (0, 1], got {type(ratios).__name__}")
    return tuple(sorted({check_ratio(f"{name}[{i}]", r) for i, r in enumerate(ratios)}))


def _key(model: ModelSpec, context_len, mtp) -> tuple[int, int]:
    """A row's ``(context_len, mtp)``, each a whole number >= 1, the context at most the model's."""
    return (integer("context_len", context_len, lo=1, below=model.max_position_embeddings + 1),
            positive_int("mtp", mtp))


class MissesTable:
    """Mean misses per request, decode step and sparse layer, shape ``(n_sparse_layers,)``, from the cache
    simulation (:func:`ess.cachesim.sweep_synthetic`) of ``model``'s pools (default DeepSeek-V3.2-Exp; another
    model at its own top-K, sparse-layer count and rows: GLM-5's 78 layers, DeepSeek-V4-Flash's 21 C4 layers of
    top-512 rows over ``L / 4`` rows): synthetic traces of ``locality`` (an :class:`ess.locality.LocalityModel`;
    default :func:`ess.locality.default_locality`, the central model; or ``trace_model`` alone, that model with its
    defaults) with paper Fig. 2's profile carried to the model by ``profile`` (:data:`PROFILES`; for another model
    than the paper's an extrapolation), ``steps`` decode steps of ``batch`` requests from ``seed``, ``policy`` (one
    of :data:`ess.policies.POLICIES`: ``"clock"`` or HiSparse's ``"sampled_clock"`` price a CLOCK cache) with or
    without LRU-Warmup (``warmup``).

    ``table(context_len, ratio, mtp)`` is one point; :meth:`row` a (context, MTP) row; :meth:`prefetch` many
    points. ``ratios``: the grid a row is computed for when first met (default none: only the ratios asked for).
    Contexts are in tokens; a compressed model's pools hold rows (:meth:`ess.specs.ModelSpec.sparse_rows`)."""

    def __init__(self, ratios: Iterable[float] = (), *, steps: int = 64, batch: int = 4, seed: int = 0,
                 warmup: bool = True, policy: str = "lru", locality=None, trace_model: str | None = None,
                 model: ModelSpec | str = DEFAULT_MODEL, profile: str = "paper"):
        from ..policies import POLICIES
        from ..locality import LocalityModel, check_trace_model, default_locality
        from ..validate import non_negative_int, one_of

        if isinstance(model, str):
            model = model_spec(model)
        if not isinstance(model, ModelSpec):
            raise TypeError(f"model must be a preset name or a ModelSpec, got {type(model).__name__}")
        self.model = model
        self.profile = one_of("profile", profile, PROFILES)
        if trace_model is not None:
            check_trace_model(trace_model)
        if locality is None:
            locality = default_locality()
            if trace_model is not None and trace_model != locality.trace_model:
                locality = LocalityModel.of(trace_model)
        elif trace_model is not None:
            raise ValueError("give locality or trace_model, not both")
        if not isinstance(locality, LocalityModel):
            raise TypeError(f"locality must be an ess.locality.LocalityModel, got {type(locality).__name__}")
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
        out = {"steps": self.steps, "batch": self.batch, "seed": self.seed, "warmup": self.warmup,
               "policy": self.policy, "profile": self.profile, **self.locality.config()}
        if self.model.name != DEFAULT_MODEL:
            out.update(model=self.model.name, layers=self.model.n_sparse_layers, k=self.model.index_topk,
                       tokens_per_row=self.model.sparse_compress_ratio)
        return out

    def describe(self) -> str:
        """``config`` in words."""
        other = "" if self.model.name == DEFAULT_MODEL else (
            f", {self.model.name}: {self.model.n_sparse_layers} sparse layers, top-{self.model.index_topk}"
            + (f" of rows of {self.model.sparse_compress_ratio} tokens" if self.model.sparse_compress_ratio > 1
               else "") + f", Fig. 2 {'mapped by depth' if self.profile == 'paper' else 'flat at its mean'}")
        return (f"cache simulation ({self.policy.upper()}{' + warmup' if self.warmup else ''}, "
                f"{self.locality.name} locality model {self.locality.label}, {self.steps} steps x "
                f"{self.batch} requests, seed {self.seed}{other})")

    def simulated_rows(self, context_len: int) -> int:
        """The rows the cache simulation runs for ``context_len`` tokens: the model's rows, at most
        :data:`MAX_SIMULATED_ROWS`."""
        return int(min(self.model.sparse_rows(positive_int("context_len", context_len)), MAX_SIMULATED_ROWS))

    def _profile(self):
        """The per-layer overlaps the traces reproduce, over the model's sparse layers: ``"paper"`` for the default
        geometry (the cache simulation maps Fig. 2 itself), else an array (the reading applied here)."""
        from ..tracegen import locality_profile
        reading = self.locality.reading
        full = locality_profile("paper", None, reading)                       # Fig. 2 as read, 61 layers
        if self.profile == "flat":
            return float(np.mean(full))
        if self.model.layer_compress_ratios is None:
            return "paper"
        return locality_profile("paper", self.model.n_layers, reading)[list(self.model.sparse_layers)]

    def with_ratios(self, ratios: Iterable[float]) -> "MissesTable":
        """The same table (same settings, the counts computed so far shared) with another grid of ratios."""
        ratios = _ratios("ratios", ratios)
        other = MissesTable.__new__(MissesTable)
        other.__dict__.update(self.__dict__)
        other.ratios = ratios
        return other

    @property
    def n_points(self) -> int:
        """How many (context, ratio, MTP) points the table holds (computed or loaded)."""
        return sum(len(row) for row in self._rows.values())

    def has_row(self, context_len: int, mtp: int) -> bool:
        """Whether the (context, MTP) row holds every ratio of the grid."""
        row = self._rows.get(_key(self.model, context_len, mtp))
        return row is not None and all(r in row for r in self.ratios)

    def row(self, context_len: int, mtp: int, ratios: Iterable[float] = ()) -> dict:
        """``{ratio: misses (n_layers,) or the reason it cannot be simulated}`` for every ratio of the grid and of
        ``ratios`` at this context and MTP, each computed once (one sweep for those not met yet) and kept."""
        from ..cachesim import sweep_synthetic
        from ..tracegen import Workload

        key = _key(self.model, context_len, mtp)
        todo = set(self.ratios) | set(_ratios("ratios", ratios))
        row = self._rows.setdefault(key, {})
        todo = sorted(todo - set(row))
        model = self.model
        for r in [r for r in todo if r >= 1.0]:
            row[r] = np.zeros(model.n_sparse_layers)              # no offload: nothing misses
        todo = [r for r in todo if r < 1.0]
        for r in list(todo):                                      # pools that cannot hold K entries (no trace needed)
            try:
                pool_slots(model, r, key[0], need=model.index_topk)
            except ValueError as exc:
                row[r] = str(exc)
                todo.remove(r)
        if not todo:
            return row
        try:
            workload = Workload(self.simulated_rows(key[0]), mtp=key[1], steps=self.steps, batch=self.batch,
                                seed=self.seed, locality=self.locality, n_layers=model.n_sparse_layers,
                                k=model.index_topk, profile=self._profile())
        except ValueError as exc:                                 # no trace at this context: every ratio says why
            row.update({r: str(exc) for r in todo})
            return row
        while todo:
            # a pool too small for what the layers' steps select together fails the sweep: the smallest ratio is set
            # apart with the reason (a smaller pool cannot hold what a larger one cannot) and the rest run again
            try:
                res = sweep_synthetic(workload, todo, policies=(self.policy,), warmups=(self.warmup,))
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
            groups.setdefault(_key(self.model, L, t), set()).add(check_ratio("points: ratio", r))
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
