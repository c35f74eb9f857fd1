"""Does latent offload pay on my GPUs, for my model? A grid over model x GPU x host link x context of the best
offload configuration, its gain over no offload with its bands, the limit that binds, and two link speeds: the one
from which the serial copy is as good as DA / DBA (the overlap strategies stop mattering) and the one below which
offload stops paying (break-even).

Every cell is searched with the vectorised simulator (:func:`ess.sim.simulate` over arrays): each ratio of a
geometric grid from the smallest the pools allow (:func:`ess.memory.smallest_step_ratio`) up, at every batch up to
its memory limit (:func:`ess.memory.batch_limits`) and the deployment's ``max_batch_per_gpu``, with miss counts from
the cache simulation at the model's top-K, sparse-layer count and rows (:class:`ess.sim.misses.MissesTable`); the
best no-offload batch likewise. Throughput is compared per GPU (nodes differ in size between machines).

**Two bands** (:class:`GridInputs`). The *calibration band* spans what notebooks 04 and 05 leave open on the paper's
own model and machine: the equally good calibrations, the part-batch evidence's ends and the locality models. The
*extrapolation band* adds, where a cell leaves what ess was calibrated on (DeepSeek-V3.2-Exp's geometry on the
paper's H200 deployment), stated and sourced assumptions, one at a time: the kernel efficiencies at the slowest and
the fastest of the shapes measured at each point (recalibrated), Blackwell's sparse attention at FlashMLA's measured
B200 point instead of Hopper's fraction of peak, Fig. 2's profile flat at its mean instead of mapped by depth (another
model), the all-to-all over RDMA instead of NVLink (GB200 NVL72). The extrapolation band contains the calibration
band (its variants are among its own). Both are evaluated at the central configuration (batch and ratio) of each
cell; which parts of a cell are calibrated and which extrapolated is said in :func:`cell_provenance`.
"""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..memory import batch_limits, smallest_step_ratio
from ..specs import (DEFAULT_DEPLOYMENT, DEFAULT_MODEL, ModelSpec, deployment_spec, gpu_spec, host_link_spec,
                     list_host_links, model_spec)
from ..validate import boolean, frame, integer, one_of, positive_int, real, sequence, span as check_span
from .config import Scenario
from .calibrate import widen_band
from .costs import CostParams
from .misses import PLANNER_SIZES, BandSizes, MissesTable, _sizes
from .timeline import simulate

__all__ = ["grid_deployment", "serving_link", "grid_cells", "ratio_grid", "same_geometry", "GridInputs", "grid_inputs",
           "grid_search", "evaluate_configs", "break_even_link", "overlap_links", "grid_bands", "cell_provenance", "CellView",
           "cell_view", "LINK_RANGE_GB_PER_S", "TOLERANCE", "accept_ratio_for", "GRID_MODELS", "GRID_CONTEXTS",
           "GRID_LONG_CONTEXTS"]

#: the models, contexts (tokens) and long contexts of the grid (notebook 10's parameters; the miss tables of
#: ``data/generated`` are stored for them): DeepSeek-V3.2, GLM-5, DeepSeek-V4-Flash (``data/models/``)
GRID_MODELS = ("deepseek-v3.2", "glm-5", "deepseek-v4-flash")
GRID_CONTEXTS = (8192, 16384, 32768, 65536, 131072)
GRID_LONG_CONTEXTS = (1048576,)

#: the link speeds the searches span (GB/s, per direction): a link below the first pays or not as the first does;
#: one that needs more than the last is reported as never reached
LINK_RANGE_GB_PER_S = (0.5, 5000.0)

#: the most ratios a grid spaces (they are rounded to 3 decimals: no more than 1,000 differ) and the most bisection
#: steps of a link search (each halves a log-space interval; float64 tells no two speeds apart after ~60)
MAX_RATIOS = 1000
MAX_ITERATIONS = 100

#: the columns of grid_cells' frame, and those grid_search adds to every row (the link searches and bands read them)
CELL_COLUMNS = ("model", "gpu", "link", "h2d_GB_per_s", "d2h_GB_per_s", "context_len")
FOUND_COLUMNS = CELL_COLUMNS + ("mtp", "accept_ratio")


def grid_deployment(gpu: str) -> str:
    """The deployment preset of the grid on ``gpu``: the paper's own (``paper-table1``) on its GPU, the paper's
    shape on that GPU otherwise (``data/deployments/paper-shape-<gpu>.yaml``). A GPU preset without such a
    deployment (the A100, which has no FP8 tensor cores for the paper's shape) cannot be priced: a ``ValueError``
    naming it and the GPUs the grid prices."""
    from ..specs import list_deployments, list_gpus
    if not isinstance(gpu, str):
        raise TypeError(f"gpu must be a GPU preset name (one of {list_gpus()}), got {type(gpu).__name__}")
    one_of("gpu", gpu, list_gpus())
    paper = deployment_spec(DEFAULT_DEPLOYMENT)
    name = paper.name if gpu == paper.gpu else f"paper-shape-{gpu.lower()}"
    have = list_deployments()
    if name not in have:
        able = [g for g in list_gpus() if g == paper.gpu or f"paper-shape-{g.lower()}" in have]
        raise ValueError(f"gpu {gpu!r} has no deployment of the paper's shape in data/deployments/ ({name}.yaml): "
                         f"the grid prices {able}")
    return name


def serving_link(gpu: str, link) -> str:
    """``link`` when it is a host link preset that serves ``gpu`` (:meth:`ess.specs.HostLinkSpec.serves`: its
    interface); a ``ValueError`` naming both and the links that do serve it otherwise (a GPU is never priced on a
    link it cannot use)."""
    gs = gpu_spec(gpu)
    names = list_host_links()
    if not isinstance(link, str) or link not in names:
        raise ValueError(f"link must be a host link preset (one of {names}), got {link!r}")
    if not host_link_spec(link).serves(gs):
        serving = [n for n in names if host_link_spec(n).serves(gs)]
        raise ValueError(f"link {link!r} does not serve the {gpu} (its interface); links that do: {serving}")
    return link


def same_geometry(a: ModelSpec, b: ModelSpec) -> bool:
    """Whether two models have the same cache and selection geometry (the same misses): everything but the name
    and the sources equal (DeepSeek-V3.2 and V3.2-Exp)."""
    return dataclasses.replace(a, name="") == dataclasses.replace(b, name="")


def accept_ratio_for(mtp: int, deployment) -> float:
    """Accepted tokens per step at ``mtp`` query tokens: 1 for MTP 1 (one token verified), the deployment's for its
    own MTP (the paper's 1.7 at MTP 2), for MTP 4 the lower of the two accept ratios the paper's Table 2 lists among
    its MTP 4 settings (2.8; ``data/published/paper_table2.yaml``); other MTPs have no sourced accept ratio here
    (``ValueError``)."""
    from ..published import published
    mtp = positive_int("mtp", mtp)
    dep = deployment_spec(deployment) if isinstance(deployment, str) else deployment
    if mtp == 1:
        return 1.0
    if mtp == dep.mtp:
        return float(dep.mtp_accept_ratio)
    m4 = published("paper_table2")["t2_32k_mtp4"]
    if mtp == int(m4["mtp"]):
        return float(min(m4["accept_ratios"]))
    raise ValueError(f"mtp={mtp} has no sourced accept ratio (1, {dep.mtp} or {m4['mtp']})")


def grid_cells(models, gpus, contexts, *, links=None, long_contexts=()) -> pd.DataFrame:
    """The cells of a grid: every model x GPU x host link x context, one row each with the deployment, host and the
    link's speeds. ``links``: preset names of ``data/hardware/host_links.yaml`` (default every one), each cell
    taking those that serve its GPU (:meth:`ess.specs.HostLinkSpec.serves`). ``contexts`` apply to every model
    whose maximum context reaches them; ``long_contexts`` (e.g. 1M) only to such a model too.

    Every context is a positive integer; a GPU that no link of ``links`` serves, a GPU the grid cannot price
    (:func:`grid_deployment`) or a model that none of the contexts fits is a ``ValueError`` naming it (never a
    grid that silently leaves it out)."""
    models, gpus = sequence("models", models), sequence("gpus", gpus)
    contexts = [positive_int(f"contexts[{i}]", L) for i, L in enumerate(sequence("contexts", contexts))]
    long_contexts = [positive_int(f"long_contexts[{i}]", L)
                     for i, L in enumerate(sequence("long_contexts", long_contexts))]
    links = list_host_links() if links is None else sequence("links", links)
    for ln in links:
        host_link_spec(ln)                               # an unknown name: a ValueError naming it
    specs = {m: model_spec(m) for m in models}
    for g in gpus:
        grid_deployment(g)
        if not any(host_link_spec(ln).serves(gpu_spec(g)) for ln in links):
            raise ValueError(f"links {links} serve none of gpu {g!r} (its interface); links that do: "
                             f"{[n for n in list_host_links() if host_link_spec(n).serves(gpu_spec(g))]}")
    for m, spec in specs.items():
        if contexts or long_contexts:
            if min(contexts + long_contexts) > spec.max_position_embeddings:
                raise ValueError(f"contexts {contexts + long_contexts} all exceed model {m!r}'s "
                                 f"{spec.max_position_embeddings:,} positions")
    rows = []
    for m in models:
        spec = specs[m]
        for g in gpus:
            gs = gpu_spec(g)
            dep = deployment_spec(grid_deployment(g))
            for ln in links:
                link = host_link_spec(ln)
                if not link.serves(gs):
                    continue
                for L in (*contexts, *long_contexts):
                    if L > spec.max_position_embeddings:
                        continue
                    rows.append({"model": m, "gpu": g, "link": ln, "link_label": link.label,
                                 "h2d_GB_per_s": link.h2d_GB_per_s, "d2h_GB_per_s": link.d2h_GB_per_s,
                                 "link_measured": link.measured, "context_len": int(L), "deployment": dep.name,
                                 "host": dep.host})
    if not rows:
        raise ValueError("the grid has no cell: no link serves these GPUs, or no context fits these models")
    return pd.DataFrame(rows)


def ratio_grid(model, context_len: int, mtp: int, n: int = 8, top: float = 0.8) -> tuple:
    """``n`` sparse-memory ratios from the smallest whose pools hold one step's selection
    (:func:`ess.memory.smallest_step_ratio`, on a grid of 0.01) to ``top``, spaced geometrically (denser at the
    small ratios, where the batch grows fastest), rounded to 3 decimals; fewer where they coincide. ``top`` is a
    ratio in (0, 1]."""
    model = model_spec(model) if isinstance(model, str) else model
    context_len = integer("context_len", context_len, lo=1, below=model.max_position_embeddings + 1)
    mtp, n = positive_int("mtp", mtp), integer("n", n, lo=1, below=MAX_RATIOS + 1)
    top = real("top", top, lo=0.0, hi=1.0, lo_open=True)
    lo = smallest_step_ratio(context_len, mtp, model=model)
    if lo >= top:
        return (round(float(lo), 3),) if lo < 1 else ()
    r = np.geomspace(lo, top, n)
    return tuple(sorted({round(float(x), 3) for x in r}))


# ------------------------------------------------------------------------------------------------------ inputs
@dataclass
class GridInputs:
    """What the grid's predictions and bands start from: the central calibration ``params``; ``calibrations``
    (name -> CostParams) and ``localities`` (the locality models, central first) of the calibration band; the
    ``extrapolation`` variants (name -> CostParams: kernel efficiencies at the measured spread's ends, Blackwell
    attention at the measured B200 point); the miss tables by ``(model, locality name, profile)`` (models of one
    geometry share theirs); the cache simulation's sizes."""

    params: CostParams
    calibrations: dict
    extrapolation: dict
    localities: list
    sizes: BandSizes
    tables: dict = field(default_factory=dict)
    store: bool = False
    _stored_points: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self.sizes = _sizes("sizes", self.sizes, PLANNER_SIZES)
        self.store = boolean("store", self.store)

    def table(self, model, locality: str | None = None, profile: str = "paper") -> MissesTable:
        """The miss table of ``model`` for a locality model (default the central) and a Fig. 2 mapping, made on
        first use (the central one at the sizes' ``batch`` requests, the others at their ``band_batch``)."""
        spec = model_spec(model) if isinstance(model, str) else model
        loc = self.localities[0] if locality is None else next(m for m in self.localities if m.name == locality)
        for (name, ln, pr), t in self.tables.items():                   # one table per geometry
            if ln == loc.name and pr == profile and same_geometry(t.model, spec):
                return t
        central = loc is self.localities[0] and profile == "paper"
        t = MissesTable(steps=self.sizes.steps, batch=self.sizes.batch_of(central), locality=loc, model=spec,
                        profile=profile)
        if self.store:                                  # the rows kept in data/generated and the user cache
            from .store import seed_table
            seed_table(t)
            self._stored_points[id(t)] = t.n_points
        self.tables[(spec.name, loc.name, profile)] = t
        return t

    def save_tables(self) -> int:
        """Keep every table's rows computed since it was made in the user cache (:func:`ess.sim.store.save_table`),
        so that the next process reads them; returns how many tables were written. Nothing without ``store``."""
        from .store import save_table
        n = 0
        for t in self.tables.values():
            if self.store and t.n_points > self._stored_points.get(id(t), 0):
                if save_table(t) is not None:
                    n += 1
                self._stored_points[id(t)] = t.n_points
        return n

    def summary(self) -> dict:
        """What the bands span, in short (for every record of a cell; :meth:`describe` in full, recorded once)."""
        return {"calibration_band": f"{len(self.calibrations)} calibrations x {len(self.localities)} locality models",
                "extrapolation_band": list(self.extrapolation) + ["Fig. 2 flat at its mean (another model)",
                                                                  "all-to-all over RDMA (GB200 NVL72)"],
                "cachesim": f"{self.sizes.steps} steps x {self.sizes.batch} requests (band: "
                            f"{self.sizes.band_batch})"}

    def describe(self) -> dict:
        """What the bands span, for a record's configuration."""
        return {"calibration_band": {"calibrations": list(self.calibrations),
                                     "locality": [m.config() for m in self.localities]},
                "extrapolation_band": {"variants": list(self.extrapolation),
                                       "locality_profile": "Fig. 2 flat at its mean (models other than the paper's)",
                                       "all_to_all": "over RDMA instead of NVLink (GB200 NVL72)"},
                "cachesim": self.sizes.config()}


def grid_inputs(*, variant_fit: dict | None = None, sizes: BandSizes | None = None, extrapolate: bool = True,
                stored: bool = True) -> GridInputs:
    """The calibrations and locality models of the calibration band (:func:`ess.sim.predictions.band_inputs`:
    notebook 05's equally good calibrations and the part-batch evidence's ends, notebook 04's locality models) and,
    with ``extrapolate``, the extrapolation variants: the central calibration redone under the kernel efficiencies'
    ``"low"`` and ``"high"`` ends (:func:`ess.sim.costs.efficiencies`), and the central calibration with Blackwell's
    attention at FlashMLA's measured B200 point (``attention_transfer="b200-measured"``; the calibration, on Hopper,
    is unchanged by it). Miss tables are made on first use (:meth:`GridInputs.table`), at ``sizes``
    (:class:`ess.sim.misses.BandSizes`; default :data:`ess.sim.misses.PLANNER_SIZES`).

    ``stored`` (the default): the calibrations as :func:`ess.sim.store.stored_calibration` keeps them (the shipped
    ``data/generated/calibration.json`` while it matches today's inputs, else computed once and cached), and every
    miss table seeded with the rows kept for its settings (:func:`ess.sim.store.seed_table`); the values are the
    same as computed here (a test regenerates them), only faster. ``stored=False`` computes everything."""
    stored = boolean("stored", stored)
    extrapolate = boolean("extrapolate", extrapolate)
    sizes = _sizes("sizes", sizes, PLANNER_SIZES)
    if stored:
        from ..locality import locality_alternatives
        from .store import stored_calibration
        cal = stored_calibration(variant_fit)
        return GridInputs(cal["central"], cal["calibrations"], dict(cal["extrapolation"]) if extrapolate else {},
                          list(locality_alternatives()), sizes, store=True)
    from .calibrate import calibrate, compute_scale_from_cost, cost_growth_evidence
    from .predictions import band_inputs
    bi = band_inputs(variant_fit=variant_fit, sizes=sizes)
    extra = {}
    if extrapolate:
        for end in ("low", "high"):
            scen = Scenario(params=CostParams(efficiency=end))
            scale = compute_scale_from_cost(cost_growth_evidence()["central"], scenario=scen)
            q = calibrate(compute_scale=scale, scenario=scen, **(variant_fit or {})).params
            extra[f"kernel efficiencies {end} (recalibrated: compute {q.compute_scale:.3f})"] = q
        extra["Blackwell attention at the measured B200 point"] = dataclasses.replace(
            bi.params, attention_transfer="b200-measured")
    return GridInputs(bi.params, bi.calibrations, extra, list(bi.models), sizes, store=False)


# ------------------------------------------------------------------------------------------------------ search
def _scenario(model: str, gpu: str, params: CostParams, *, host_cap: bool = True, deployment=None,
              strategy: str = "best") -> Scenario:
    dep = deployment if deployment is not None else grid_deployment(gpu)
    return Scenario(model=model, deployment=dep, gpu=gpu, params=params, strategy=strategy, check_memory=True,
                    host_memory_cap=host_cap)


def _strategy(part: pd.DataFrame) -> str:
    """The overlap strategy a part of ``found`` was searched under (column ``strategy``; default the per-layer
    choice)."""
    return str(part.strategy.iloc[0]) if "strategy" in part else "best"


def _check_ratios(ratios):
    """``ratios`` (``None``: the grid's) as a tuple of sparse-memory ratios in (0, 1)."""
    if ratios is None:
        return None
    from ..validate import real
    if isinstance(ratios, (str, bytes)) or not hasattr(ratios, "__iter__"):
        raise TypeError(f"ratios must be a list of sparse-memory ratios in (0, 1), got {type(ratios).__name__}")
    out = tuple(sorted({real(f"ratios[{i}]", r, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
                        for i, r in enumerate(ratios)}))
    if not out:
        raise ValueError("ratios must hold at least one ratio")
    return out


def _misses(table: MissesTable, L: int, r: float, mtp: int):
    """The table's misses at one point, or ``None`` where the cache simulation cannot run its pool."""
    try:
        return np.asarray(table(int(L), float(r), int(mtp)), dtype=float)
    except ValueError:
        return None


def _candidates(model, deployment, gpu, L: int, mtp: int, table: MissesTable, ratios, *, every_batch=True):
    """Rows of one (model, GPU, context): ``(ratio, batch, misses row index)`` for every ratio with misses and a
    non-empty memory limit, every batch up to it (``every_batch``) or a geometric subset ending at it; plus the
    limits per ratio ``{ratio: (limit, limited_by)}`` (ratio 1 included: no offload)."""
    dep = deployment_spec(deployment) if isinstance(deployment, str) else deployment
    cap = dep.max_batch_per_gpu or 10 ** 9
    allr = (1.0,) + tuple(ratios)
    lim = batch_limits(np.full(len(allr), int(L)), np.array(allr), mtp=int(mtp), model=model, deployment=dep,
                       gpu=gpu)
    limits, rows, mrows = {}, [], []
    for i, r in enumerate(allr):
        b = int(lim.batch[i])
        why = str(lim.limited_by[i])
        if b <= 0:
            limits[r] = (0, why if why != "infeasible" else str(lim.reason[i]))
            continue
        if b > cap:
            b, why = cap, "batch cap"
        m = np.zeros(model_spec(model).n_sparse_layers if isinstance(model, str) else model.n_sparse_layers) \
            if r >= 1 else _misses(table, L, r, mtp)
        if m is None:
            limits[r] = (0, "the cache simulation cannot run this pool")
            continue
        limits[r] = (b, why)
        bs = np.arange(1, b + 1) if every_batch else np.unique(np.round(np.geomspace(1, b, min(b, 12)))).astype(int)
        rows.append(np.column_stack([np.full(len(bs), r), bs]))
        mrows.append(m)
    return limits, rows, mrows


def grid_search(cells: pd.DataFrame, inputs: GridInputs, *, mtp: int | None = None, n_ratios: int = 8,
                params: CostParams | None = None, locality: str | None = None, profile: str = "paper",
                tables: dict | None = None, check_memory: bool = True, accept_ratio: float | None = None,
                strategy: str = "best", ratios=None) -> pd.DataFrame:
    """The best offload configuration of every cell of ``cells`` (:func:`grid_cells`) against the best without
    offload, with the central calibration (or ``params``) and the central miss table (or another ``locality`` /
    ``profile``). One simulate call per (model, GPU) covers every link, context, ratio and batch of it.

    Columns added: ``mtp``, ``accept_ratio``; ``batch_no_offload``, ``throughput_no_offload`` (tokens/s per GPU)
    and ``limit_no_offload`` (what stops its batch: ``"gpu"`` memory, the deployment's ``"batch cap"``, or
    ``"throughput"`` when a smaller batch is faster); ``best_ratio``, ``best_batch``, ``throughput`` (per GPU),
    ``throughput_per_node``, ``step_ms``, ``stall_ms``, ``misses_per_layer`` (mean over the sparse layers),
    ``limit`` (what stops the best offload batch: ``"gpu"``, ``"host"`` memory, ``"batch cap"``, ``"throughput"``),
    ``ratio_floor`` (the best ratio is the smallest the pools allow), ``ratios_tried``; ``gain_pct`` (offload over
    no offload, %: negative where offload does not pay); ``reason`` where no configuration is feasible.
    ``tables`` maps a model's name to the miss table it reads instead (e.g. the paper's cell at notebook 07's
    cache-simulation sizes). ``accept_ratio`` (default :func:`accept_ratio_for` the MTP), ``strategy`` (default the
    per-layer choice; recorded in column ``strategy`` for the bands and link speeds) and ``ratios`` (default the
    grid of :func:`ratio_grid`) fix what a search would otherwise choose."""
    from .config import STRATEGIES
    params = inputs.params if params is None else params
    strategy = one_of("strategy", strategy, STRATEGIES + ("best",))
    fixed_ratios = _check_ratios(ratios)
    n_ratios = integer("n_ratios", n_ratios, lo=1, below=MAX_RATIOS + 1)
    check_memory = boolean("check_memory", check_memory)
    mtp = None if mtp is None else positive_int("mtp", mtp)
    frame("cells", cells, CELL_COLUMNS)
    out = []
    for (m, g), part in cells.groupby(["model", "gpu"], sort=False):
        spec = model_spec(m)
        dep = deployment_spec(grid_deployment(g))
        T = dep.mtp if mtp is None else positive_int("mtp", mtp)
        acc = accept_ratio_for(T, dep) if accept_ratio is None else real("accept_ratio", accept_ratio, lo=1.0, hi=T)
        table = (tables or {}).get(m) or inputs.table(spec, locality, profile)
        sc = _scenario(m, g, params, strategy=strategy).replace(check_memory=check_memory)
        blocks, per_ctx = [], {}
        for L in sorted(part.context_len.unique()):
            ratios = ratio_grid(spec, L, T, n_ratios) if fixed_ratios is None else fixed_ratios
            table.prefetch((L, r, T) for r in ratios)
            limits, rows, mrows = _candidates(spec, dep, g, L, T, table, ratios)
            per_ctx[L] = (limits, ratios)
            for rb, mr in zip(rows, mrows):
                blocks.append((L, rb, mr))
        if not blocks:                                           # not even one request fits anywhere
            for _, cell in part.iterrows():
                limits = per_ctx[int(cell.context_len)][0]
                out.append({**cell.to_dict(), "mtp": T, "accept_ratio": acc, "strategy": strategy,
                            "reason": limits.get(1.0, (0, "no batch fits"))[1]})
            continue
        links = part[["link", "h2d_GB_per_s", "d2h_GB_per_s"]].drop_duplicates("link")
        B, Lc, R, H, D, M, key = [], [], [], [], [], [], []
        for L, rb, mr in blocks:
            for _, ln in (links.iterrows() if rb[0, 0] < 1 else [(None, None)]):
                n = len(rb)
                B.append(rb[:, 1])
                Lc.append(np.full(n, L))
                R.append(rb[:, 0])
                H.append(np.full(n, ln.h2d_GB_per_s if ln is not None else np.inf))
                D.append(np.full(n, ln.d2h_GB_per_s if ln is not None else np.inf))
                M.append(np.broadcast_to(mr, (n, len(mr))))
                key.append(np.full(n, ln.link if ln is not None else "", dtype=object))
        B, Lc, R, H, D, key = (np.concatenate(x) for x in (B, Lc, R, H, D, key))
        M = np.ascontiguousarray(np.concatenate(M))
        res = simulate(B, Lc, R, misses=M, mtp=T, accept_ratio=acc, h2d_GB_per_s=H, d2h_GB_per_s=D, scenario=sc)
        tput = np.where(res.feasible, res.throughput_per_gpu, -np.inf)
        mean_m = M.mean(axis=1)
        for _, cell in part.iterrows():
            L = int(cell.context_len)
            limits, ratios = per_ctx[L]
            row = {**cell.to_dict(), "mtp": T, "accept_ratio": acc, "strategy": strategy,
                   "ratios_tried": list(ratios)}
            base = (Lc == L) & (R >= 1)
            off = (Lc == L) & (R < 1) & (key == cell.link)
            if not base.any():
                out.append({**row, "reason": limits.get(1.0, (0, "no batch fits"))[1]})
                continue
            i0 = np.flatnonzero(base)[np.argmax(tput[base])]
            b0 = int(B[i0])
            lim0 = limits[1.0]
            row.update(batch_no_offload=b0, throughput_no_offload=float(tput[i0]),
                       limit_no_offload=lim0[1] if b0 == lim0[0] else "throughput",
                       step_ms_no_offload=float(res.step_s[i0] * 1e3))
            if not off.any():
                out.append({**row, "reason": "no offload ratio fits (memory or the cache simulation)"})
                continue
            i = np.flatnonzero(off)[np.argmax(tput[off])]
            r, b = float(R[i]), int(B[i])
            lim = limits[r]
            row.update(best_ratio=r, best_batch=b, throughput=float(tput[i]),
                       throughput_per_node=float(res.throughput[i]), step_ms=float(res.step_s[i] * 1e3),
                       stall_ms=float(res.stall_s[i] * 1e3), misses_per_layer=float(mean_m[i]),
                       limit=lim[1] if b == lim[0] else "throughput", ratio_floor=bool(r == min(ratios)),
                       gain_pct=(float(tput[i]) / float(tput[i0]) - 1) * 100, reason="")
            out.append(row)
    return pd.DataFrame(out)


def evaluate_configs(inputs: GridInputs, model: str, gpu: str, link: str, context_len: int, batches, ratios, *,
                     mtp: int | None = None, table: MissesTable | None = None, check_memory: bool = True
                     ) -> pd.DataFrame:
    """Given configurations of one cell (``batches`` and ``ratios``, one each per row) in the grid's scenario and
    miss table (or ``table``), in one vectorised call: ``batch``, ``ratio``, ``throughput`` (per node),
    ``throughput_per_gpu``, ``feasible``, ``reason``. ``check_memory=False`` for a configuration sized by a rule of
    its own (the paper's Table 2 rows)."""
    from ..validate import number_array
    spec = model_spec(model)
    dep = deployment_spec(grid_deployment(gpu))
    lk = host_link_spec(serving_link(gpu, link))
    context_len = integer("context_len", context_len, lo=1, below=spec.max_position_embeddings + 1)
    T = dep.mtp if mtp is None else positive_int("mtp", mtp)
    check_memory = boolean("check_memory", check_memory)
    B = number_array("batches", batches, whole=True)
    R = number_array("ratios", ratios, at_most=1.0)
    if B.shape != R.shape:
        raise ValueError(f"batches and ratios must give one value per row each, got shapes {B.shape} and {R.shape}")
    table = inputs.table(spec) if table is None else table
    M = np.stack([table(context_len, float(r), T) if r < 1 else np.zeros(spec.n_sparse_layers)
                  for r in np.atleast_1d(R)])
    res = simulate(B, context_len, R, misses=np.ascontiguousarray(M), mtp=T, accept_ratio=accept_ratio_for(T, dep),
                   h2d_GB_per_s=lk.h2d_GB_per_s, d2h_GB_per_s=lk.d2h_GB_per_s,
                   scenario=_scenario(model, gpu, inputs.params).replace(check_memory=check_memory))
    return pd.DataFrame({"batch": B.astype(int), "ratio": R, "throughput": res.throughput,
                         "throughput_per_gpu": res.throughput_per_gpu, "feasible": res.feasible,
                         "reason": res.reason})


# ------------------------------------------------------------------------------------------------ link speeds
def _bisect_links(pays, n: int, lo: float, hi: float, iterations: int):
    """Per item, the smallest link speed in [lo, hi] at which ``pays(speeds) -> bool (n,)`` holds (monotone: once
    true, true at every faster link), by bisection in log space; ``lo`` where it holds at ``lo`` already, NaN where
    not even at ``hi``. Returns ``(speeds, below)`` with ``below`` True where it held at ``lo``."""
    a, b = np.full(n, float(lo)), np.full(n, float(hi))
    at_lo, at_hi = pays(a), pays(b)
    for _ in range(iterations):
        mid = np.sqrt(a * b)
        ok = pays(mid)
        b = np.where(ok, mid, b)
        a = np.where(ok, a, mid)
    return np.where(at_lo, lo, np.where(at_hi, b, np.nan)), at_lo


def break_even_link(found: pd.DataFrame, inputs: GridInputs, *, n_ratios: int = 8, iterations: int = 20,
                    span=LINK_RANGE_GB_PER_S, ratios=None) -> pd.Series:
    """Per cell of :func:`grid_search`'s ``found``, the host-to-device link speed (GB/s) below which offload stops
    paying: the smallest at which the best offload configuration (every ratio of the cell's grid, a geometric
    subset of batches up to each one's limit, re-chosen at each speed) is faster than the best without offload.
    The device-to-host speed scales with it (the link's ratio of the two); the host's DRAM share is not applied
    (what the link alone must do). ``span[0]`` where offload pays even there (flag ``break_even_below_span``),
    NaN where it does not pay at ``span[1]`` (e.g. the batch cap binds without offload already). ``ratios``: the
    ratios re-chosen among (default each cell's grid, :func:`ratio_grid`). ``span`` is ``(low, high)`` with
    ``0 < low < high``, ``iterations`` (bisection steps) at least 1."""
    fixed_ratios = _check_ratios(ratios)
    frame("found", found, FOUND_COLUMNS)
    n_ratios = integer("n_ratios", n_ratios, lo=1, below=MAX_RATIOS + 1)
    iterations = integer("iterations", iterations, lo=1, below=MAX_ITERATIONS + 1)
    span = check_span("span", span)
    out = pd.Series(np.nan, index=found.index)
    below = pd.Series(False, index=found.index)
    ok = found[found.get("throughput_no_offload", pd.Series(np.nan, index=found.index)).notna()]
    for (m, g), part in ok.groupby(["model", "gpu"], sort=False):
        spec = model_spec(m)
        dep = deployment_spec(grid_deployment(g))
        sc = _scenario(m, g, inputs.params, host_cap=False, strategy=_strategy(part))
        table = inputs.table(spec)
        idx, B, Lc, R, M, ratio_d2h = [], [], [], [], [], []
        for ci, cell in part.iterrows():
            T = int(cell.mtp)
            ratios = ratio_grid(spec, int(cell.context_len), T, n_ratios) if fixed_ratios is None else fixed_ratios
            _, rows, mrows = _candidates(spec, dep, g, int(cell.context_len), T, table, ratios, every_batch=False)
            for rb, mr in zip(rows, mrows):
                if rb[0, 0] >= 1:
                    continue
                n = len(rb)
                idx.append(np.full(n, ci))
                B.append(rb[:, 1])
                R.append(rb[:, 0])
                Lc.append(np.full(n, int(cell.context_len)))
                M.append(np.broadcast_to(mr, (n, len(mr))))
                ratio_d2h.append(np.full(n, cell.d2h_GB_per_s / cell.h2d_GB_per_s))
        if not idx:
            continue
        idx, B, Lc, R, ratio_d2h = (np.concatenate(x) for x in (idx, B, Lc, R, ratio_d2h))
        M = np.ascontiguousarray(np.concatenate(M))
        cells = np.array(sorted(set(idx)))
        pos = np.searchsorted(cells, idx)
        target = part.loc[cells, "throughput_no_offload"].to_numpy()
        T = int(part.mtp.iloc[0])
        acc = float(part.accept_ratio.iloc[0])

        def pays(speeds):
            s = speeds[pos]
            r = simulate(B, Lc, R, misses=M, mtp=T, accept_ratio=acc, h2d_GB_per_s=s, d2h_GB_per_s=s * ratio_d2h,
                         scenario=sc)
            t = np.where(r.feasible, r.throughput_per_gpu, -np.inf)
            best = np.full(len(cells), -np.inf)
            np.maximum.at(best, pos, t)
            return best > target * (1 + 1e-9)

        speeds, at_lo = _bisect_links(pays, len(cells), span[0], span[1], iterations)
        out.loc[cells] = speeds
        below.loc[cells] = at_lo
    return out.rename("break_even_GB_per_s"), below.rename("break_even_below_span")


#: how close to its floor a quantity must come for the link searches of :func:`overlap_links`: 1 % of the step
#: (a choice: below it, the simulator's own precision)
TOLERANCE = 0.01


def overlap_links(found: pd.DataFrame, inputs: GridInputs, *, tolerance: float = TOLERANCE, iterations: int = 20,
                  span=LINK_RANGE_GB_PER_S) -> pd.DataFrame:
    """Per cell of :func:`grid_search`'s ``found``, at its best offload configuration, two host-to-device link
    speeds (GB/s; the device-to-host speed scales with it, the host's DRAM share is not applied):

    * ``hidden_GB_per_s``: from which the copies are hidden -- the offload stall (with the per-layer choice) is at
      most ``tolerance`` of the no-offload step: a faster link buys less than that;
    * ``serial_GB_per_s``: from which DA and DBA stop mattering -- copying serially on every layer (strategy
      ``none``) adds at most ``tolerance`` of the no-offload step to what the per-layer choice among none, DA and
      DBA costs (what the overlap hides only shrinks as the link gets faster).

    ``span[0]`` where it holds there already, NaN where not even at ``span[1]`` (the layer without locality, which
    misses most of what it selects, can keep DBA worth more than 1 % to very fast links). ``tolerance`` is a share
    of the step in [0, 1], ``span`` ``(low, high)`` with ``0 < low < high``, ``iterations`` at least 1."""
    frame("found", found, FOUND_COLUMNS)
    tolerance = real("tolerance", tolerance, lo=0.0, hi=1.0)
    iterations = integer("iterations", iterations, lo=1, below=MAX_ITERATIONS + 1)
    span = check_span("span", span)
    out = pd.DataFrame({"hidden_GB_per_s": np.nan, "serial_GB_per_s": np.nan}, index=found.index)
    ok = found[found.get("best_batch", pd.Series(np.nan, index=found.index)).notna()]
    for (m, g), part in ok.groupby(["model", "gpu"], sort=False):
        table = inputs.table(m)
        sc = _scenario(m, g, inputs.params, host_cap=False)
        B = part.best_batch.to_numpy(dtype=float)
        L = part.context_len.to_numpy()
        R = part.best_ratio.to_numpy(dtype=float)
        T = int(part.mtp.iloc[0])
        acc = float(part.accept_ratio.iloc[0])
        M = np.ascontiguousarray(np.stack([table(int(l), float(r), T) for l, r in zip(L, R)]))
        k = (part.d2h_GB_per_s / part.h2d_GB_per_s).to_numpy()
        run = lambda speeds, strategy: simulate(B, L, R, misses=M, mtp=T, accept_ratio=acc,            # noqa: E731
                                                h2d_GB_per_s=speeds, d2h_GB_per_s=speeds * k,
                                                scenario=sc.replace(strategy=strategy))

        def hidden(speeds):
            r = run(speeds, _strategy(part))
            return r.stall_s <= tolerance * r.step_no_offload_s

        def serial(speeds):
            best = run(speeds, "best")
            return run(speeds, "none").step_s - best.step_s <= tolerance * best.step_no_offload_s

        out.loc[part.index, "hidden_GB_per_s"] = _bisect_links(hidden, len(part), span[0], span[1], iterations)[0]
        out.loc[part.index, "serial_GB_per_s"] = _bisect_links(serial, len(part), span[0], span[1], iterations)[0]
    return out


# ------------------------------------------------------------------------------------------------------ bands
def _paper_geometry(spec: ModelSpec) -> bool:
    return same_geometry(spec, model_spec(DEFAULT_MODEL))


def cell_provenance(model: str, gpu: str) -> dict:
    """Which parts of a cell's prediction are calibrated and which extrapolated, in words: ``calibrated`` (always:
    the compute scale on DeepSeek's decode cost, the communication scale and fixed time on the paper's Fig. 1 and
    Table 2 row 1, the locality models on Fig. 2 and vLLM's hit rate -- on DeepSeek-V3.2-Exp, H200, the paper's
    deployment) and ``extrapolated`` (the model's operations priced by its own geometry, Fig. 2 mapped onto its
    depth; another GPU priced by its peaks with Hopper's measured efficiencies, Blackwell's by transfer, the top-K's
    H200-measured row latency kept; the all-to-all over NVLink), and ``calibrated_cell`` (nothing extrapolated)."""
    spec, gs = model_spec(model), gpu_spec(gpu)
    dep = deployment_spec(grid_deployment(gpu))
    paper = deployment_spec(DEFAULT_DEPLOYMENT)
    extra = []
    if not _paper_geometry(spec):
        extra.append(f"model: {spec.name}'s operations priced by its own geometry ({spec.n_layers} layers, "
                     f"{spec.n_heads} heads, {spec.n_sparse_layers} sparse layers of top-{spec.index_topk}"
                     + (f" rows of {spec.sparse_compress_ratio} tokens" if spec.sparse_compress_ratio > 1 else "")
                     + "); paper Fig. 2's locality mapped onto its depth")
    if gs.name != paper.gpu:
        kind = {"hopper": "Hopper: the H800-measured kernel efficiencies applied to its peaks",
                "blackwell": "Blackwell: Hopper's measured efficiencies transferred to its peaks (FlashMLA's B200 "
                             "point as the band's low end)"}.get(gs.architecture, gs.architecture)
        extra.append(f"GPU: {gs.name} ({kind}); the top-K's row latency as measured on an H200")
    if dep.ep_transport == "nvlink":
        extra.append("all-to-all over NVLink (DeepEP's B200 NVLink figures scaled to a decode batch)")
    return {"calibrated": ["compute scale: DeepSeek's decode cost against position (H800)",
                           "communication scale and fixed time: paper Fig. 1 and Table 2 row 1 (H200, EP 32)",
                           "locality models: paper Fig. 2, vLLM's 2 x K hit rate (notebook 04)"],
            "extrapolated": extra, "calibrated_cell": not extra}


def _variants(inputs: GridInputs, model: str, gpu: str) -> list:
    """The band's combinations for one (model, GPU): ``(name, band, params, locality, profile, deployment)``, band
    ``"calibration"`` (every calibration x every locality model) or ``"extrapolation"`` (one assumption changed
    from the central, where it applies to the cell)."""
    spec, gs = model_spec(model), gpu_spec(gpu)
    dep = deployment_spec(grid_deployment(gpu))
    paper = deployment_spec(DEFAULT_DEPLOYMENT)
    out = [(f"{cn} | {loc.name}", "calibration", p, loc.name, "paper", None)
           for loc in inputs.localities for cn, p in inputs.calibrations.items()]
    off_paper = (not _paper_geometry(spec)) or gs.name != paper.gpu
    if off_paper:
        for name, p in inputs.extrapolation.items():
            if p.attention_transfer != "hopper" and gs.architecture != "blackwell":
                continue
            out.append((name, "extrapolation", p, None, "paper", None))
    if not _paper_geometry(spec):
        out.append(("Fig. 2 flat at its mean", "extrapolation", inputs.params, None, "flat", None))
    if dep.ep_transport == "nvlink":
        out.append(("all-to-all over RDMA", "extrapolation", inputs.params, None, "paper",
                    dep.replace(ep_transport="rdma")))
    return out


def grid_bands(found: pd.DataFrame, inputs: GridInputs) -> pd.DataFrame:
    """``found`` (:func:`grid_search`) with each cell's bands at its central configuration (its best batch and
    ratio against its best no-offload batch): ``gain_pct_cal_low`` / ``_high`` (the calibration band),
    ``gain_pct_low`` / ``_high`` (the extrapolation band, which contains it), the same for ``throughput``,
    ``band_size``, ``band_infeasible`` (combinations under which the central configuration does not fit or cannot
    be simulated), and ``calibrated_cell``."""
    df = frame("found", found, FOUND_COLUMNS).copy()
    for col in ("gain_pct", "throughput"):
        for s in ("cal_low", "cal_high", "low", "high"):
            df[f"{col}_{s}"] = np.nan
    df["band_size"] = 0
    df["band_infeasible"] = 0
    df["calibrated_cell"] = False
    ok = df[df.get("best_batch", pd.Series(np.nan, index=df.index)).notna()]
    for m, part in ok.groupby("model", sort=False):       # every table's rows in one sweep per context
        spec = model_spec(m)
        points = {(int(l), float(r), int(t)) for l, r, t in zip(part.context_len, part.best_ratio, part.mtp)}
        for loc, prof in {(v[3], v[4]) for g in part.gpu.unique() for v in _variants(inputs, m, g)}:
            inputs.table(spec, loc, prof).prefetch(points)
    for (m, g), part in ok.groupby(["model", "gpu"], sort=False):
        T = int(part.mtp.iloc[0])
        acc = float(part.accept_ratio.iloc[0])
        n = len(part)
        L = np.r_[part.context_len.to_numpy(), part.context_len.to_numpy()]
        B = np.r_[part.best_batch.to_numpy(float), part.batch_no_offload.to_numpy(float)]
        R = np.r_[part.best_ratio.to_numpy(float), np.ones(n)]
        H = np.r_[part.h2d_GB_per_s.to_numpy(float), part.h2d_GB_per_s.to_numpy(float)]
        D = np.r_[part.d2h_GB_per_s.to_numpy(float), part.d2h_GB_per_s.to_numpy(float)]
        gains = {"calibration": [], "extrapolation": []}
        tputs = {"calibration": [], "extrapolation": []}
        bad = np.zeros(n, dtype=int)
        spec = model_spec(m)
        for name, band, p, loc, prof, dep in _variants(inputs, m, g):
            table = inputs.table(spec, loc, prof)
            miss = []
            valid = np.ones(2 * n, dtype=bool)
            for j, (l, r) in enumerate(zip(L, R)):
                got = _misses(table, l, r, T) if r < 1 else np.zeros(spec.n_sparse_layers)
                valid[j] = got is not None
                miss.append(np.zeros(spec.n_sparse_layers) if got is None else got)
            sc = _scenario(m, g, p, deployment=dep, strategy=_strategy(part))
            r = simulate(B, L, R, misses=np.ascontiguousarray(np.stack(miss)), mtp=T, accept_ratio=acc,
                         h2d_GB_per_s=H, d2h_GB_per_s=D, scenario=sc)
            t = np.where(r.feasible & valid, r.throughput_per_gpu, np.nan)
            gain = (t[:n] / t[n:] - 1) * 100
            bad += np.isnan(gain)
            gains[band].append(gain)
            tputs[band].append(t[:n])
        cal_g, cal_t = np.array(gains["calibration"]), np.array(tputs["calibration"])
        all_g = np.concatenate([cal_g] + ([np.array(gains["extrapolation"])] if gains["extrapolation"] else []))
        all_t = np.concatenate([cal_t] + ([np.array(tputs["extrapolation"])] if tputs["extrapolation"] else []))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            df.loc[part.index, "gain_pct_cal_low"] = np.nanmin(cal_g, axis=0)
            df.loc[part.index, "gain_pct_cal_high"] = np.nanmax(cal_g, axis=0)
            df.loc[part.index, "gain_pct_low"] = np.nanmin(all_g, axis=0)
            df.loc[part.index, "gain_pct_high"] = np.nanmax(all_g, axis=0)
            # throughput's calibration band widened to its measured coverage (notebook 05); the extrapolation band
            # contains it
            cal_lo, cal_hi = widen_band(np.nanmin(cal_t, axis=0), np.nanmax(cal_t, axis=0))
            df.loc[part.index, "throughput_cal_low"] = cal_lo
            df.loc[part.index, "throughput_cal_high"] = cal_hi
            df.loc[part.index, "throughput_low"] = np.fmin(np.nanmin(all_t, axis=0), cal_lo)
            df.loc[part.index, "throughput_high"] = np.fmax(np.nanmax(all_t, axis=0), cal_hi)
        df.loc[part.index, "band_size"] = len(all_g)
        df.loc[part.index, "band_infeasible"] = bad
        df.loc[part.index, "calibrated_cell"] = cell_provenance(m, g)["calibrated_cell"]
    return df


# ------------------------------------------------------------------------------------------------------ widget
@dataclass(frozen=True)
class CellView:
    """One (model, GPU, link, context, MTP, ratio) as the grid's widget shows it: throughput per GPU against batch
    without offload (``batches_no_offload``, ``throughput_no_offload``) and with offload at ``ratio`` (or, for
    ``"best"``, the best ratio of the grid) up to its limit; the chosen point and what binds."""

    model: str
    gpu: str
    link: str
    context_len: int
    mtp: int
    accept_ratio: float
    ratio: float | None
    batches: np.ndarray
    throughput: np.ndarray
    batches_no_offload: np.ndarray
    throughput_no_offload: np.ndarray
    best_batch: int | None
    best_throughput: float | None
    batch_no_offload: int | None
    best_no_offload: float | None
    limit: str
    limit_no_offload: str
    misses_per_layer: float | None
    reason: str = ""

    @property
    def gain_pct(self) -> float | None:
        if self.best_throughput is None or not self.best_no_offload:
            return None
        return (self.best_throughput / self.best_no_offload - 1) * 100


def cell_view(inputs: GridInputs, model: str, gpu: str, link: str, context_len: int, mtp: int,
              ratio: float | str = "best", *, tables: dict | None = None, n_ratios: int = 8,
              accept_ratio: float | None = None, strategy: str = "best") -> CellView:
    """The widget's pure function: one cell at one MTP and ratio (a number in (0, 1), or ``"best"``: every ratio of
    :func:`ratio_grid`, the one with the highest throughput kept), simulated at every batch up to the memory limit
    and the deployment's batch cap, with and without offload, in one vectorised call. ``tables`` maps ``(model,
    mtp)`` to the miss table to read (default :meth:`GridInputs.table`, the central one); a ratio it cannot
    simulate gives a view with ``reason``. ``accept_ratio`` (default :func:`accept_ratio_for`) and ``strategy``
    (default the per-layer choice) as in :func:`grid_search`."""
    spec = model_spec(model)
    dep = deployment_spec(grid_deployment(gpu))
    lk = host_link_spec(serving_link(gpu, link))
    context_len = integer("context_len", context_len, lo=1, below=spec.max_position_embeddings + 1)
    n_ratios = integer("n_ratios", n_ratios, lo=1, below=MAX_RATIOS + 1)
    T = positive_int("mtp", mtp)
    acc = accept_ratio_for(T, dep) if accept_ratio is None else real("accept_ratio", accept_ratio, lo=1.0, hi=T)
    table = (tables or {}).get((model, T)) or inputs.table(spec)
    if isinstance(ratio, str):
        if ratio != "best":
            raise ValueError(f"ratio must be a number in (0, 1) or 'best', got {ratio!r}")
        ratios = ratio_grid(spec, context_len, T, n_ratios)
    else:
        ratios = (real("ratio", ratio, lo=0.0, hi=1.0, lo_open=True, hi_open=True),)
    limits, rows, mrows = _candidates(spec, dep, gpu, int(context_len), T, table, ratios)
    empty = np.zeros(0)
    if not rows:
        return CellView(model, gpu, link, int(context_len), T, acc, None, empty, empty, empty, empty, None, None,
                        None, None, "", "", None, reason=limits.get(1.0, (0, "no batch fits"))[1])
    B = np.concatenate([rb[:, 1] for rb in rows])
    R = np.concatenate([rb[:, 0] for rb in rows])
    M = np.concatenate([np.broadcast_to(mr, (len(rb), len(mr))) for rb, mr in zip(rows, mrows)])
    res = simulate(B, int(context_len), R, misses=np.ascontiguousarray(M), mtp=T, accept_ratio=acc,
                   h2d_GB_per_s=lk.h2d_GB_per_s, d2h_GB_per_s=lk.d2h_GB_per_s,
                   scenario=_scenario(model, gpu, inputs.params, strategy=strategy))
    t = np.where(res.feasible, res.throughput_per_gpu, np.nan)
    base, off = R >= 1, R < 1
    b0 = t0 = None
    if base.any():
        i0 = np.flatnonzero(base)[np.nanargmax(t[base])]
        b0, t0 = int(B[i0]), float(t[i0])
    if not off.any():
        why = "; ".join(v[1] for r, v in limits.items() if r < 1 and v[0] == 0)
        return CellView(model, gpu, link, int(context_len), T, acc, None, empty, empty, B[base], t[base], None, None,
                        b0, t0, "", limits[1.0][1] if b0 == limits[1.0][0] else "throughput", None,
                        reason=why or "no offload ratio fits")
    i = np.flatnonzero(off)[np.nanargmax(t[off])]
    r_best = float(R[i])
    pick = off & (R == r_best)
    lim = limits[r_best]
    return CellView(model, gpu, link, int(context_len), T, acc, r_best, B[pick], t[pick], B[base], t[base],
                    int(B[i]), float(t[i]), b0, t0, lim[1] if int(B[i]) == lim[0] else "throughput",
                    (limits[1.0][1] if b0 == limits[1.0][0] else "throughput") if b0 else "",
                    float(M[i].mean()))
