"""Grid sweeps of the simulator: the cartesian product of parameter lists, cut into chunks, each chunk simulated
vectorised; chunks run in local processes by default (with a tqdm progress bar) or on a Dask cluster when a
scheduler address is given (``dask.distributed``), so outgrowing one machine changes one argument.

>>> df = sweep({"batch": [52, 64], "context_len": [32768]}, workers=0)
>>> list(df.columns[:3])
['batch', 'context_len', 'ratio']
"""
from __future__ import annotations

import itertools
import math
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Mapping

import numpy as np
import pandas as pd

from ..validate import boolean, fits_in_memory, integer, number_array, positive_int
from .config import Scenario, as_scenario
from .timeline import simulate

__all__ = ["GRID_KEYS", "grid", "run_chunk", "sweep"]

# Arguments of ess.sim.simulate that may vary over the grid (the rest is the scenario, fixed).
GRID_KEYS = ("batch", "context_len", "ratio", "mtp", "accept_ratio", "h2d_GB_per_s", "d2h_GB_per_s")


def grid(axes: Mapping[str, Any]) -> pd.DataFrame:
    """The cartesian product of ``axes`` (``{name: list of values}``, names from :data:`GRID_KEYS`), the last axis
    varying fastest; built column by column in about the memory of the frame it returns (a grid past a quarter of
    this machine's memory is a ``ValueError`` naming ``axes``)."""
    if not isinstance(axes, Mapping) or not axes:
        raise ValueError("axes must be a non-empty mapping {name: values}")
    bad = [k for k in axes if k not in GRID_KEYS]
    if bad:
        raise ValueError(f"unknown grid axes {bad}; allowed: {GRID_KEYS}")
    for k, v in axes.items():
        if np.ndim(v) != 1 or len(v) == 0:
            raise ValueError(f"axis {k!r} must be a non-empty list of values")
    if "batch" not in axes or "context_len" not in axes:
        raise ValueError("axes must include 'batch' and 'context_len'")
    # one column at a time, each written in place by broadcasting (row-major order: the last axis varies fastest,
    # as itertools.product): no Python object per configuration (a list of tuples peaked at ~6x the frame)
    names = list(axes)
    values = [pd.Series(list(axes[k])).to_numpy() for k in names]          # each axis's dtype, as pandas infers it
    n = math.prod(v.size for v in values)
    fits_in_memory("axes", n * sum(v.dtype.itemsize for v in values), f"a grid of {n:,} configurations")
    cols, inner = {}, n
    for name, v in zip(names, values):
        inner //= v.size
        col = np.empty(n, v.dtype)
        col.reshape(-1, v.size, inner)[...] = v[None, :, None]
        cols[name] = col
    return pd.DataFrame(cols, copy=False)


def run_chunk(chunk: pd.DataFrame, scenario: Scenario, misses=None) -> pd.DataFrame:
    """Simulate one chunk of grid rows in ``scenario`` (a pure function: picklable, used by every executor)."""
    args = {k: chunk[k].to_numpy() for k in GRID_KEYS if k in chunk}
    res = simulate(args.pop("batch"), args.pop("context_len"), args.pop("ratio", 1.0), misses=misses,
                   scenario=scenario, **args)
    out = res.to_frame()
    out.index = chunk.index
    return out


def sweep(axes: Mapping[str, Any], *, scenario: Scenario | None = None, misses=None, chunk_size: int = 20000,
          workers: int | None = None, scheduler: str | None = None, progress: bool = True) -> pd.DataFrame:
    """Simulate every configuration of the grid ``axes`` in ``scenario`` (its values are the defaults of the axes it
    shares with them: MTP, accept ratio, link speeds); returns one row per configuration.

    ``workers``: local processes (default: the CPU count; 0 runs in this process). ``scheduler``: a Dask
    scheduler address (``"tcp://host:8786"``) or a ``dask.distributed.Client``; then chunks run on that cluster.
    ``misses`` (shape ``(n_layers,)``) apply to every configuration with a ratio < 1."""
    chunk_size = positive_int("chunk_size", chunk_size)
    g = grid(axes)
    scenario = as_scenario(scenario)
    if misses is not None and number_array("misses", misses, positive=False, max_ndim=None).ndim != 1:
        raise ValueError("sweep takes misses of shape (n_layers,) shared by every configuration")
    if workers is not None:
        workers = integer("workers", workers, lo=0)
    progress = boolean("progress", progress)
    if scheduler is not None and not (isinstance(scheduler, str) and scheduler) and \
            type(scheduler).__name__ != "Client":
        raise TypeError(f"scheduler must be None, a Dask scheduler address ('tcp://host:8786') or a "
                        f"dask.distributed.Client, got {scheduler!r}")
    chunks = [g.iloc[i:i + chunk_size] for i in range(0, len(g), chunk_size)]
    from tqdm.auto import tqdm
    bar = tqdm(total=len(g), disable=not progress, desc="configurations", unit="cfg")
    parts = []
    if scheduler is not None:
        from dask.distributed import Client, as_completed
        client = scheduler if isinstance(scheduler, Client) else Client(scheduler)
        try:
            futs = [client.submit(run_chunk, c, scenario, misses, pure=False) for c in chunks]
            for fut in as_completed(futs):
                part = fut.result()
                parts.append(part)
                bar.update(len(part))
        finally:
            if not isinstance(scheduler, Client):
                client.close()
    elif workers == 0 or len(chunks) == 1:
        for c in chunks:
            parts.append(run_chunk(c, scenario, misses))
            bar.update(len(c))
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for part in pool.map(run_chunk, chunks, itertools.repeat(scenario), itertools.repeat(misses)):
                parts.append(part)
                bar.update(len(part))
    bar.close()
    out = pd.concat(parts).sort_index()
    extra = [k for k in g.columns if k not in ("batch", "context_len", "ratio", "mtp", "accept_ratio",
                                              "h2d_GB_per_s")]
    for k in extra:
        out[k] = g[k]
    return out
