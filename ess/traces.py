"""Access traces: which latent-cache entries each decode step selects, per request and layer.

A :class:`Trace` holds, for every request ``b``, layer ``l`` and decode step ``t``, the set of cache positions the
sparse attention reads (the top-K of the lightning indexer; with MTP the union over the step's query tokens), plus
the top-K sets of the last prefill positions that LRU-Warmup inserts before decoding.

Layout (glossary: B batch, K top-k, L context length)::

    indices  (B, n_layers, steps, width)  int32, width <= mtp * K, -1 = padding (ignored wherever it stands)
    windows  (B, n_layers, W, K)          int32 or None, the top-K of prefill positions L-W ... L-1, in order
                                          (the LRU-Warmup windows)

Context grows by ``mtp`` tokens per step: step ``t`` may read positions ``0 .. context_len + t * mtp - 1``.

Here: the format and its validation, file I/O (:meth:`Trace.save`, :func:`load_trace`), the overlap metric of paper
Fig. 2 (:func:`adjacent_overlap`), two statistics of a trace's time structure (:func:`union_share`, how the union of
consecutive sets grows; :func:`return_share`, how soon an entry that left the set comes back) and
:class:`TraceRecorder`, which collects real index sets from a sparse-attention
implementation step by step. The synthetic generators are in :mod:`ess.tracegen`, their locality models and
calibration in :mod:`ess.locality`.
"""
from __future__ import annotations

import json
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .atomic import atomic_path
from .kernels import resolve_backend
from .kernels import trace_stats as _trace_stats
from .validate import integer, path as check_path

__all__ = ["Trace", "TraceRecorder", "load_trace", "adjacent_overlap", "union_share", "return_share",
           "validate_trace_arrays", "index_rows", "check_trace", "MAX_POSITIONS"]

_FORMAT = "ess-trace-v2"   # v2: the warmup windows are stored as "windows"


# ---------------------------------------------------------------------------------------------------------- checks
# the kernels index int32 positions: every position, and a count of positions, must stay below 2**31
MAX_POSITIONS = 2**31 - 1


def index_rows(name: str, rows: Any, n_positions: int | None = None, *,
               shape_doc: str = "(T, width)") -> tuple[np.ndarray, int]:
    """``rows`` (R, W), one index set per row as the cache kernels read them, checked and copied: a NumPy integer
    array (not bool, not float), -1 = padding, every valid entry in ``[0, n_positions)`` and distinct within its
    row. ``n_positions=None`` means "one more than the largest entry". Returns ``(rows, n_positions)``: a new
    C-contiguous int32 array (never the caller's memory, so a kernel that runs without the GIL cannot see it change)
    and the position count as an ``int``. A ``TypeError``/``ValueError`` naming ``name`` otherwise."""
    if not isinstance(rows, np.ndarray):
        raise TypeError(f"{name} must be a NumPy integer array {shape_doc}, got {type(rows).__name__}")
    if rows.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers {shape_doc}, got dtype {rows.dtype}")
    if rows.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array {shape_doc}, got shape {rows.shape}")
    hi = int(rows.max()) if rows.size else -1
    lo = int(rows.min()) if rows.size else -1
    if lo < -1:
        raise ValueError(f"{name} holds {lo}: entries must be >= 0, or -1 for padding")
    if n_positions is None:
        n_positions = max(hi + 1, 1)
        if n_positions > MAX_POSITIONS:
            raise ValueError(f"{name} holds {hi}: positions must be < 2**31 - 1")
    else:
        n_positions = integer("n_positions", n_positions, lo=1, below=MAX_POSITIONS + 1)
        if hi >= n_positions:
            raise ValueError(f"{name} holds {hi} but n_positions = {n_positions}: every entry must be < n_positions")
    out = np.array(rows, dtype=np.int32, order="C", copy=True)
    r = _stats().first_duplicate_row(out, n_positions)
    if r >= 0:
        raise ValueError(f"{name}[{r}] repeats a position; each row must hold distinct entries (-1 padding aside)")
    return out, n_positions


def validate_trace_arrays(indices: Any, windows: Any, *, context_len: int, k: int, mtp: int) -> None:
    """Raise a clear ValueError/TypeError when ``indices``/``windows`` are not a valid trace (see module docstring)."""
    context_len = integer("context_len", context_len, lo=1)
    k = integer("k", k, lo=1)
    mtp = integer("mtp", mtp, lo=1)
    if k > context_len:
        raise ValueError(f"k (top-K) = {k} is larger than the context ({context_len} tokens); expected k <= context_len")
    if not isinstance(indices, np.ndarray):
        raise TypeError(f"indices must be a numpy array of shape (B, n_layers, steps, width), got {type(indices).__name__}")
    if indices.ndim != 4:
        raise ValueError(f"indices must have 4 dimensions (B, n_layers, steps, width), got shape {indices.shape}")
    if not np.issubdtype(indices.dtype, np.integer):
        raise TypeError(f"indices must hold integers, got dtype {indices.dtype}")
    if 0 in indices.shape:
        raise ValueError(f"the trace is empty: indices has shape {indices.shape} (B, n_layers, steps, width all >= 1)")
    B, n_layers, steps, width = indices.shape
    if width > mtp * k:
        raise ValueError(f"indices width {width} exceeds mtp * k = {mtp * k} (the union of {mtp} top-{k} sets)")
    n_pos = context_len + steps * mtp
    if n_pos > MAX_POSITIONS:
        raise ValueError(f"context_len + steps * mtp = {n_pos} positions; the kernels index int32 positions "
                         f"(at most 2**31 - 1)")
    lo, hi = int(indices.min()), int(indices.max())
    if lo < -1:
        raise ValueError(f"indices must be >= 0 (or -1 for padding), found {lo}")
    if hi >= n_pos:
        raise ValueError(f"indices must be < context_len + steps * mtp = {n_pos}, found {hi}")
    # the context grows by mtp tokens per step: step t may only read positions < context_len + t * mtp
    limit = context_len + np.arange(steps) * mtp                                # (steps,)
    bad = indices >= limit[None, None, :, None]
    if bad.any():
        b, l, t, j = (int(v[0]) for v in np.nonzero(bad))
        raise ValueError(f"indices[{b}, {l}, {t}] reads position {int(indices[b, l, t, j])}, beyond the context of "
                         f"step {t} ({int(limit[t])} tokens = context_len + t * mtp)")
    rows = np.ascontiguousarray(indices.reshape(-1, width), dtype=np.int32)
    r = _stats().first_duplicate_row(rows, n_pos)
    if r >= 0:
        b, l, t = np.unravel_index(r, (B, n_layers, steps))
        raise ValueError(f"indices[{b}, {l}, {t}] repeats a position; each step's set must hold distinct entries")
    if windows is None:
        return
    if not isinstance(windows, np.ndarray) or windows.ndim != 4 or not np.issubdtype(windows.dtype, np.integer):
        raise TypeError("windows must be None or an integer array of shape (B, n_layers, W, k)")
    if windows.shape[:2] != (B, n_layers) or windows.shape[3] > k or windows.shape[2] < 1 or windows.shape[3] < 1:
        raise ValueError(f"windows must have shape (B={B}, n_layers={n_layers}, W>=1, <=k={k}), got {windows.shape}")
    if int(windows.min()) < -1 or int(windows.max()) >= context_len:
        raise ValueError(f"warmup windows must read prefill positions 0 .. {context_len - 1} (or -1 for padding)")
    r = _stats().first_duplicate_row(np.ascontiguousarray(windows.reshape(-1, windows.shape[3]), dtype=np.int32),
                                     context_len)
    if r >= 0:
        raise ValueError(f"warmup window row {r} repeats a position; each window must hold distinct entries")


# ----------------------------------------------------------------------------------------------------------- Trace
class _Owned:
    """An array handed to :class:`Trace` by the library's own constructors (generator, loader), which keep no other
    reference to it: the trace takes it without a copy."""

    def __init__(self, array: np.ndarray):
        self.array = array


def _private_copy(value: Any) -> Any:
    """The trace's own copy of an array argument (an :class:`_Owned` array as is); anything else is returned for
    the validation to refuse."""
    if isinstance(value, _Owned):
        return value.array
    return np.array(value, copy=True) if isinstance(value, np.ndarray) else value


def _read_only(a: np.ndarray) -> np.ndarray:
    """A C-contiguous int32 array that cannot be written to: the returned view of a read-only base refuses
    ``setflags(write=True)``."""
    a = np.ascontiguousarray(a, dtype=np.int32)
    a.setflags(write=False)
    return a.view()


@dataclass(frozen=True, eq=False)
class Trace:
    """Top-K index sets per (request, layer, step) with their metadata; validated on construction.

    The trace validates **its own copy** of ``indices`` and ``windows`` and keeps them read-only (``setflags(write=
    False)``; the arrays a trace exposes refuse ``setflags(write=True)``): the caller's arrays stay writeable and
    can change without touching the trace, and nothing can change the trace's indices after they were checked --
    the cache kernels index memory with them. (The library's generator and loader hand over arrays they keep no
    reference to, without a copy.)
    """

    indices: np.ndarray                  # (B, n_layers, steps, width) int32, -1 padded
    context_len: int                     # tokens in the context at the first decode step
    k: int                               # top-K per query token
    mtp: int = 1                         # query tokens per decode step (their sets are united)
    seed: int | None = None              # generator seed, None for recorded traces
    windows: np.ndarray | None = None    # (B, n_layers, W, k) int32, top-K of the last W prefill positions
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.seed is not None:
            integer("seed", self.seed, lo=0)
        if not isinstance(self.meta, Mapping):
            raise TypeError(f"meta must be a mapping, got {type(self.meta).__name__}")
        indices, windows = _private_copy(self.indices), _private_copy(self.windows)
        validate_trace_arrays(indices, windows, context_len=self.context_len, k=self.k, mtp=self.mtp)
        object.__setattr__(self, "indices", _read_only(indices))
        object.__setattr__(self, "windows", None if windows is None else _read_only(windows))

    batch = property(lambda self: self.indices.shape[0])
    n_layers = property(lambda self: self.indices.shape[1])
    steps = property(lambda self: self.indices.shape[2])
    width = property(lambda self: self.indices.shape[3])
    n_windows = property(lambda self: 0 if self.windows is None else self.windows.shape[2])

    @property
    def n_positions(self) -> int:
        """Positions any step may read: ``context_len + steps * mtp``."""
        return self.context_len + self.steps * self.mtp

    def set_sizes(self) -> np.ndarray:
        """Valid entries per (request, layer, step): (B, n_layers, steps)."""
        return (self.indices >= 0).sum(axis=-1)

    def metadata(self) -> dict:
        return {"format": _FORMAT, "context_len": self.context_len, "k": self.k, "mtp": self.mtp, "seed": self.seed,
                "batch": self.batch, "n_layers": self.n_layers, "steps": self.steps, "n_windows": self.n_windows,
                "meta": dict(self.meta)}

    def save(self, path: str | Path) -> Path:
        """Write a compressed ``.npz`` (indices, windows, JSON metadata), atomically (:func:`ess.atomic.atomic_path`:
        an interrupted save leaves the file as it was). ``meta`` must be JSON data."""
        path = check_path("path", path)
        if path.suffix != ".npz":
            raise ValueError(f"path must end in .npz, got {path.name!r}")
        try:
            metadata = json.dumps(self.metadata(), allow_nan=False)   # NaN is not JSON
        except (TypeError, ValueError) as exc:
            raise ValueError(f"meta must hold JSON data (str, finite numbers, lists, dicts) to be saved: {exc}") from None
        windows = self.windows if self.windows is not None else np.zeros((0, 0, 0, 0), np.int32)
        with atomic_path(path, suffix=".npz") as tmp:
            np.savez_compressed(tmp, indices=self.indices, windows=windows, metadata=np.array(metadata))
        return path


def load_trace(path: str | Path) -> Trace:
    """Read a trace written by :meth:`Trace.save`; a malformed file raises ValueError naming what is wrong."""
    path = check_path("path", path)
    if not path.exists():
        raise ValueError(f"trace file {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as z:
            if not hasattr(z, "files"):
                raise ValueError("not an .npz archive")
            arrays = {name: z[name] for name in z.files}
    except (OSError, EOFError, ValueError, KeyError, MemoryError, zipfile.BadZipFile, zlib.error) as exc:
        # a truncated or damaged file: the zip reader, the decompressor and the .npy parser each fail their own way
        raise ValueError(f"{path.name}: cannot read the trace, the file is damaged or not a trace "
                         f"({type(exc).__name__}: {exc})") from None
    missing = {"indices", "windows", "metadata"} - set(arrays)
    if missing:
        raise ValueError(f"{path.name}: not an ess trace, missing arrays {sorted(missing)}")
    indices, windows = arrays["indices"], arrays["windows"]
    try:
        meta = json.loads(str(arrays["metadata"]))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path.name}: metadata is not valid JSON ({exc})") from exc
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        raise ValueError(f"{path.name}: metadata format must be {_FORMAT!r}")
    for key in ("context_len", "k", "mtp"):
        if key not in meta:
            raise ValueError(f"{path.name}: metadata lacks {key!r}")
    try:
        return Trace(_Owned(indices), meta["context_len"], meta["k"], meta["mtp"], meta.get("seed"),
                     _Owned(windows) if windows.size else None, meta.get("meta", {}))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path.name}: not a valid trace ({exc})") from None


def check_trace(trace: Any, name: str = "trace") -> Trace:
    """``trace`` when it is a :class:`Trace`; a ``TypeError`` naming ``name`` otherwise."""
    if not isinstance(trace, Trace):
        raise TypeError(f"{name} must be an ess.traces.Trace, got {type(trace).__name__}")
    return trace


def adjacent_overlap(trace: Trace) -> np.ndarray:
    """Mean overlap |S(t-1) & S(t)| / |S(t)| between adjacent steps, per layer: (n_layers,), over the steps and
    requests (a step that selects nothing is left out). The per-step overlaps are
    :mod:`ess.kernels.trace_stats`'s ``adjacent_overlaps``, the one definition the trace generator's calibration
    uses too.

    With ``mtp = 1`` this is the metric of paper Fig. 2 and reproduces the generator's profile.
    """
    if check_trace(trace).steps < 2:
        raise ValueError("adjacent_overlap needs a trace with at least 2 steps")
    kern = _stats()
    out = np.zeros(trace.n_layers)
    terms = np.empty(trace.steps - 1)
    for layer in range(trace.n_layers):
        vals = []
        for b in range(trace.batch):
            kern.adjacent_overlaps(np.ascontiguousarray(trace.indices[b, layer]), trace.n_positions, terms)
            vals.append(terms[~np.isnan(terms)])
        out[layer] = np.mean(np.concatenate(vals))
    return out


def _stats():
    """The trace-statistics kernels (:mod:`ess.kernels.trace_stats`) of the backend
    :func:`ess.kernels.resolve_backend` picks."""
    return _trace_stats.get(resolve_backend())


def _per_layer(trace: Trace, stat) -> np.ndarray:
    out = np.zeros(trace.n_layers)
    for layer in range(trace.n_layers):
        out[layer] = np.mean([stat(np.ascontiguousarray(trace.indices[b, layer])) for b in range(trace.batch)])
    return out


def union_share(trace: Trace, window: int = 4) -> np.ndarray:
    """How the union over consecutive steps grows, per layer: (n_layers,). For each ``t``, the distinct entries of
    steps ``t .. t + window - 1`` divided by ``window x K`` (1 = the sets share nothing), the mean over ``t`` and the
    requests. On a trace with one query token per step (``mtp = 1``) and ``window = 4`` it is the size of an MTP-4
    step's union relative to four separate sets."""
    window = integer("window", window, lo=1)
    if check_trace(trace).steps < window:
        raise ValueError(f"union_share needs at least window = {window} steps, the trace has {trace.steps}")
    kern = _stats().union_sizes

    def mean_union(rows):
        sizes = np.empty(rows.shape[0] - window + 1, np.int64)
        kern(rows, trace.n_positions, window, sizes)
        return sizes.mean()

    return _per_layer(trace, lambda rows: mean_union(rows) / (window * trace.k))


def return_share(trace: Trace, within: int = 8) -> np.ndarray:
    """How soon an entry that leaves the set comes back, per layer: (n_layers,). Of the entries that leave at a step
    (selected at ``t - 1``, not at ``t``), the share selected again at one of the next ``within`` steps ``t + 1 ..
    t + within``; pooled over the steps whose window lies inside the trace and over the requests (NaN where no entry
    leaves)."""
    within = integer("within", within, lo=1)
    if check_trace(trace).steps < within + 2:
        raise ValueError(f"return_share needs at least within + 2 = {within + 2} steps, the trace has {trace.steps}")
    kern = _stats().leave_return
    out = np.zeros(trace.n_layers)
    for layer in range(trace.n_layers):
        left = back = 0
        for b in range(trace.batch):
            lb = kern(np.ascontiguousarray(trace.indices[b, layer]), trace.n_positions, within)
            left, back = left + lb[0], back + lb[1]
        out[layer] = back / left if left else np.nan
    return out


# ------------------------------------------------------------------------------------------------------ recorder
class TraceRecorder:
    """Collect real index sets, step by step, into a :class:`Trace`.

    A sparse-attention implementation (or a hook around it) calls, for every layer of every decode step,
    ``observe(layer, indices)`` with ``indices`` of shape ``(B, K)`` or ``(B, q, K)`` (``q`` query tokens of the
    step, -1 padded as the indexer's top-k returns them), then ``end_step()`` once the step's layers are done.
    ``observe_windows(layer, indices)`` with ``(B, W, K)`` stores the top-K of the last W prefill positions.
    Nothing is half-recorded: a step with a layer missing raises in ``end_step`` and is dropped.

    >>> rec = TraceRecorder(context_len=8, k=2, n_layers=1, batch=1)
    >>> rec.observe(0, np.array([[3, 7]])); rec.end_step()
    >>> rec.to_trace().indices.tolist()
    [[[[3, 7]]]]
    """

    def __init__(self, *, context_len: int, k: int, n_layers: int, batch: int, mtp: int = 1,
                 meta: Mapping | None = None):
        self.context_len = integer("context_len", context_len, lo=1)
        self.k = integer("k", k, lo=1)
        if self.k > self.context_len:
            raise ValueError(f"k (top-K) = {k} is larger than the context ({context_len} tokens)")
        self.n_layers = integer("n_layers", n_layers, lo=1)
        self.batch = integer("batch", batch, lo=1)
        self.mtp = integer("mtp", mtp, lo=1)
        if meta is not None and not isinstance(meta, Mapping):
            raise TypeError(f"meta must be a mapping, got {type(meta).__name__}")
        if self.context_len + self.mtp > MAX_POSITIONS:
            raise ValueError(f"context_len + mtp = {self.context_len + self.mtp} positions; traces index int32 positions "
                             f"(at most 2**31 - 1)")
        self.meta = dict(meta or {})
        self._steps: list[np.ndarray] = []                        # each (B, n_layers, mtp*k)
        self._pending: dict[int, np.ndarray] = {}
        self._windows: dict[int, np.ndarray] = {}

    def _as_sets(self, name: str, layer: int, indices: Any, n_positions: int) -> np.ndarray:
        """``indices`` as (B, q, K) integers in ``[-1, n_positions)`` (``n_positions``: the positions the step or
        the prefill can read), checked before anything is recorded."""
        layer = integer("layer", layer, lo=0)
        if layer >= self.n_layers:
            raise ValueError(f"layer must be < n_layers = {self.n_layers}, got {layer}")
        if hasattr(indices, "detach"):                            # a torch tensor
            indices = indices.detach().cpu().numpy()
        a = np.asarray(indices)
        if not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"{name}: indices must be integers, got dtype {a.dtype}")
        if a.size and int(a.min()) < -1:
            raise ValueError(f"{name}: indices must be >= 0, or -1 for padding; found {int(a.min())}")
        if a.size and int(a.max()) >= n_positions:
            raise ValueError(f"{name}: indices must be < {n_positions} (the positions this step can read), found "
                             f"{int(a.max())}")
        if a.ndim == 2:
            a = a[:, None, :]
        if a.ndim != 3 or a.shape[0] != self.batch or a.shape[2] > self.k:
            raise ValueError(f"{name}: indices must have shape (B={self.batch}, K<={self.k}) or (B, q, K), "
                             f"got {np.asarray(indices).shape}")
        return a

    def observe(self, layer: int, indices: Any) -> None:
        """The top-K of this step's query tokens in ``layer``: (B, K) or (B, q, K), q <= mtp."""
        layer = integer("layer", layer, lo=0)
        a = self._as_sets("observe", layer, indices, self.context_len + self.steps * self.mtp)
        if a.shape[1] > self.mtp:
            raise ValueError(f"observe: {a.shape[1]} query tokens in one step, but mtp = {self.mtp}")
        if layer in self._pending:
            raise ValueError(f"observe: layer {layer} was already observed in this step; call end_step() first")
        out = np.full((self.batch, self.mtp * self.k), -1, np.int32)
        for b in range(self.batch):
            flat = a[b].reshape(-1)
            flat = flat[flat >= 0]
            _, first = np.unique(flat, return_index=True)       # union, keeping first-occurrence order
            u = flat[np.sort(first)]
            out[b, :u.size] = u
        self._pending[int(layer)] = out

    def observe_windows(self, layer: int, indices: Any) -> None:
        """The top-K of the last W prefill positions of ``layer``: (B, W, K), in position order."""
        layer = integer("layer", layer, lo=0)
        a = self._as_sets("observe_windows", layer, indices, self.context_len)
        if a.shape[1] < 1 or a.shape[2] < 1:
            raise ValueError(f"observe_windows: indices must hold at least one window of entries, got shape {a.shape}")
        rows = a.reshape(-1, a.shape[2])
        if any(np.unique(r[r >= 0]).size != int((r >= 0).sum()) for r in rows):
            raise ValueError("observe_windows: indices repeat a position within a window; each window's entries "
                             "must be distinct")
        w = np.full((self.batch, a.shape[1], self.k), -1, np.int32)
        w[:, :, :a.shape[2]] = a
        self._windows[int(layer)] = w

    def end_step(self) -> None:
        missing = sorted(set(range(self.n_layers)) - set(self._pending))
        if missing:
            self._pending.clear()
            raise ValueError(f"end_step: layers {missing} were not observed in this step; the step is dropped")
        self._steps.append(np.stack([self._pending[l] for l in range(self.n_layers)], axis=1))
        self._pending.clear()

    @property
    def steps(self) -> int:
        return len(self._steps)

    def to_trace(self) -> Trace:
        if not self._steps:
            raise ValueError("the recorder holds no complete step; the trace would be empty")
        idx = np.stack(self._steps, axis=2)                       # (B, n_layers, steps, mtp*k)
        width = max(int((idx >= 0).sum(axis=-1).max()), 1)
        windows = None
        if self._windows:
            if set(self._windows) != set(range(self.n_layers)):
                raise ValueError("observe_windows must be called for every layer or for none")
            windows = np.stack([self._windows[l] for l in range(self.n_layers)], axis=1)
        return Trace(idx[..., :width], self.context_len, self.k, self.mtp, None, windows,
                     {"recorded": True, **self.meta})
