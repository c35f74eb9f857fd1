"""The decode-step timeline of one GPU: Two-Batch Overlap, MTP, and the offload overhead of each overlap strategy.

One decode step on one GPU (batch ``B`` split into two micro-batches of ``b = B/2`` for Two-Batch Overlap)::

    step = sum over layers of  max(compute lane, communication lane)   + MTP draft passes + output heads + fixed
    compute lane (layer l)  = 2 x [Indexer + PreAttn + Attn + O_proj + FFN]  + 2 x offload overhead_l(b)
    communication lane      = 2 x [dispatch + combine]          (MoE layers; dense layers have none)

so a stall on the compute lane is hidden while the all-to-all of the other micro-batch is longer. With ``mtp`` tokens
per request per step (MTP) and ``a`` accepted on average, ``OTPS = a / step`` and the node throughput is
``B x gpus_per_node x a / step`` (paper-facts.md: throughput = batch x 8 x OTPS).

The offload overhead of one micro-batch and layer, for ``m`` misses per request (H2D ``h = b m 656 B / link``,
D2H ``d = b mtp 656 B / d2h``), relative to the no-offload sequence ``Indexer -> PreAttn -> Attn -> O_proj``
(paper's strategies, paper-facts.md "Overlap strategies"):

* ``none`` (fully serial): ``h + d``
* ``da`` (dual attention: H2D issued after the indexer, overlapping PreAttn and the attention over hits; the misses
  are attended after they land and merged by log-sum-exp; D2H overlaps O_proj):
  ``max(0, h - PreAttn - Attn_hit) + merge [m > 0] + max(0, d - O_proj)``
* ``dba`` (dual-batch attention: indexer split in two halves, each half's H2D overlaps the next compute):
  ``max(0, h/2 - Indexer/2) + max(0, h/2 - PreAttn - Attn/2) + max(0, d - Attn/2)``
* ``best``: per layer, the cheapest of the three (the offline per-layer choice); or a sequence of names, one per
  layer.

The three formulas are written once, in :func:`overlap_overhead_s`, over a layer's operation times
(:class:`LayerOps`); :func:`offload_overhead_s` feeds it the cost model's times, and the check of the formulas
against a real decode engine (:mod:`ess.engine.timing`) feeds it measured ones.

Everything is vectorised over configurations with numpy (arrays broadcast; misses have shape ``(n_layers,)`` or
``(N, n_layers)``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..layout import latent_entry_bytes, pool_slots, request_cache, step_entries
from ..memory import kv_budget_bytes
from ..specs import link_figures, resolve
from ..validate import non_negative_int, number_array
from ..validate import ratio as ratio_check
from .costs import CostParams, gemm_time_s, layer_costs, lm_head_time_s

__all__ = ["STRATEGIES", "LayerOps", "overlap_overhead_s", "SimResult", "simulate", "offload_overhead_s",
           "batch_limits", "ratio_for_batch", "best_batch"]

STRATEGIES = ("none", "da", "dba")


def _default_link() -> tuple[float, float]:
    ft = link_figures()["flashtrans"]
    return ft["h2d_GB_per_s"], ft["d2h_GB_per_s"]


@dataclass(frozen=True)
class LayerOps:
    """Seconds of the operations of one layer (one micro-batch) that the overlap strategies rearrange: numbers or
    arrays that broadcast together. The one input of :func:`overlap_overhead_s`, built from the cost model for
    DeepSeek (:func:`offload_overhead_s`) and from measured operation times for the real model
    (:mod:`ess.engine.timing`).

    ``indexer`` (I) selection over the batch (indexer scan and top-K, with the plan where a caller counts it);
    ``pre_attn`` (p) work after the selection and before attention, which the copies can hide behind (DeepSeek's
    PreAttn; 0 for a model whose indexer needs the attention queries first); ``attn`` (a) attention over every
    selected entry in one pass; ``attn_hit`` the part of attention over the hits that can run while the misses are
    copied (DA's Attn0); ``o_proj`` (o) work after attention that the write-back can hide behind; ``merge`` DA's
    extra cost over ``attn`` for attending in two parts (0 without misses); ``h2d`` and ``d2h`` the host -> device
    copy of the misses and the device -> host write-back. DBA splits the batch into halves B0 and B1:
    ``indexer_b1`` (I1), ``attn_b0`` (a0), ``attn_b1`` (a1), ``h2d_b0`` (h0), ``h2d_b1`` (h1), by default half of
    ``indexer``, ``attn`` and ``h2d`` each."""

    indexer: np.ndarray
    pre_attn: np.ndarray
    attn: np.ndarray
    attn_hit: np.ndarray
    o_proj: np.ndarray
    merge: np.ndarray
    h2d: np.ndarray
    d2h: np.ndarray
    indexer_b1: np.ndarray | None = None
    attn_b0: np.ndarray | None = None
    attn_b1: np.ndarray | None = None
    h2d_b0: np.ndarray | None = None
    h2d_b1: np.ndarray | None = None


def overlap_overhead_s(ops: LayerOps) -> dict:
    """Extra seconds each strategy adds to one layer's serial compute ``I + p + a + o``, from its operation times
    (paper's strategies, paper-facts.md "Overlap strategies"; see the module docstring):

    * ``none``  ``h + d`` (the copies run between the indexer and attention, fully serial);
    * ``da``    ``max(0, h - p - a_hit) + merge + max(0, d - o)`` (the copy is issued after the selection and
      overlaps p and the attention over the hits; the write-back overlaps o);
    * ``dba``   ``max(0, h0 - I1) + max(0, h1 - p - a0) + max(0, d - a1)`` (B0's copy overlaps B1's indexer,
      B1's copy overlaps p and B0's attention, the write-back overlaps B1's attention).

    Returns ``{"none", "da", "dba"}``, each the broadcast shape of the inputs."""
    if not isinstance(ops, LayerOps):
        raise TypeError(f"ops must be a LayerOps, got {type(ops).__name__}")
    f = lambda x: np.asarray(x, dtype=float)                                       # noqa: E731
    I, p, a, o, h, d = f(ops.indexer), f(ops.pre_attn), f(ops.attn), f(ops.o_proj), f(ops.h2d), f(ops.d2h)
    half = lambda x, default: default / 2 if x is None else f(x)                   # noqa: E731
    I1, h0, h1 = half(ops.indexer_b1, I), half(ops.h2d_b0, h), half(ops.h2d_b1, h)
    a0, a1 = half(ops.attn_b0, a), half(ops.attn_b1, a)
    none = h + d
    da = np.maximum(h - p - f(ops.attn_hit), 0.0) + f(ops.merge) + np.maximum(d - o, 0.0)
    dba = np.maximum(h0 - I1, 0.0) + np.maximum(h1 - p - a0, 0.0) + np.maximum(d - a1, 0.0)
    return {"none": none, "da": da, "dba": dba}


def offload_overhead_s(costs, micro_batch, misses, mtp, h2d_GB_per_s, d2h_GB_per_s, entry_bytes: int,
                       offload=True):
    """Extra compute-lane seconds of one micro-batch for each strategy: dict ``{name: array}`` shaped like
    ``misses`` (N, n_layers); per-configuration inputs have shape (N,). ``offload`` (bool or (N,)) switches the
    write-back off for rows without offload. The cost model's operations as a :class:`LayerOps` for
    :func:`overlap_overhead_s`: ``h = m x b x entry / link``, ``d = b x mtp x entry / d2h``, ``Attn_hit = Attn (1 -
    m / selected)`` (FlashMLA attends over the hits in full, then the merge), the merge only where ``m > 0``, the
    DBA halves half of each."""
    b = np.asarray(micro_batch, dtype=float)
    mtp = np.asarray(mtp, dtype=float)
    m = np.asarray(misses, dtype=float)
    col = lambda x: np.broadcast_to(np.asarray(x, dtype=float), m.shape[:1])[:, None]   # noqa: E731
    k_h = b * entry_bytes / (np.asarray(h2d_GB_per_s, dtype=float) * 1e9)                # seconds per miss
    d = np.where(offload, b * mtp * entry_bytes / (np.asarray(d2h_GB_per_s, dtype=float) * 1e9), 0.0)
    a = col(costs.attn)
    ops = LayerOps(indexer=col(costs.indexer), pre_attn=col(costs.pre_attn), attn=a,
                   attn_hit=a * (1.0 - m / col(costs.selected)), o_proj=col(costs.o_proj),
                   merge=(m > 0) * col(costs.merge), h2d=m * col(k_h), d2h=col(d))
    return overlap_overhead_s(ops)


def _request_rules(model, dep, L, r):
    """The layout rules for each distinct (context, ratio) pair, evaluated once per pair with the scalar helpers of
    :mod:`ess.layout` (page padding, per-request cache bytes, pool slots) so that the rule lives in one place.
    Returns per-pair arrays and the inverse index that maps them back to the flattened inputs."""
    uL, iL = np.unique(L.ravel(), return_inverse=True)            # 1-D uniques: much faster than unique(axis=0)
    ur, ir = np.unique(r.ravel(), return_inverse=True)
    codes, inv = np.unique(np.ravel(iL) * len(ur) + np.ravel(ir), return_inverse=True)
    pairs = np.stack([uL[codes // len(ur)].astype(float), ur[codes % len(ur)]], axis=1)
    n = len(pairs)
    gpu_b, host_b, slots, need = np.empty(n), np.empty(n), np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    for i, (Li, ri) in enumerate(pairs):
        rc = request_cache(model, int(Li), float(ri), dep.kv_dtype)
        gpu_b[i], host_b[i] = rc.gpu_bytes, rc.latent_host_bytes
        slots[i], need[i] = pool_slots(model, float(ri), int(Li)), step_entries(model, int(Li))
    return pairs, np.ravel(inv), gpu_b, host_b, slots, need


def batch_limits(context_len, ratio, *, model="deepseek-v3.2-exp", deployment="paper-table1", gpu=None, host=None):
    """Vectorised :func:`ess.memory.largest_batch`: ``(batch, reason)`` arrays (batch 0 with a reason when no
    request fits). The per-request bytes and the pool rule come from :mod:`ess.layout` (``request_cache``,
    ``pool_slots``), once per distinct (context, ratio); only the division by the budgets is vectorised (tests
    compare with ``largest_batch``)."""
    model, dep, gpu, host = resolve(model, deployment, gpu, host)
    L = np.asarray(context_len, dtype=np.int64)
    r = np.asarray(ratio, dtype=float)
    L, r = np.broadcast_arrays(L, r)
    try:
        budget = kv_budget_bytes(model, dep, gpu)
    except ValueError as exc:
        return np.zeros(L.shape, dtype=np.int64), np.full(L.shape, str(exc), dtype=object)
    pairs, inv, gpu_b, host_b, slots, need = _request_rules(model, dep, L, r)
    host_budget = host.memory_capacity_GB_per_gpu * 1e9
    batch_gpu = np.floor_divide(budget, gpu_b)
    batch_host = np.where(host_b > 0, np.floor_divide(host_budget, np.where(host_b > 0, host_b, 1.0)), np.inf)
    batch = np.minimum(batch_gpu, batch_host).astype(np.int64)
    few = slots < need
    batch = np.where(few, 0, batch)
    reason = np.full(len(pairs), "", dtype=object)
    for i in np.flatnonzero(few):
        reason[i] = (f"ratio {pairs[i, 1]:g} leaves {slots[i]} GPU slots per request and layer, fewer than the "
                     f"{need[i]} entries one step selects (K)")
    for i in np.flatnonzero((batch == 0) & ~few):
        reason[i] = (f"one request needs {gpu_b[i] / 1e9:.2f} GB of GPU memory (KV budget {budget / 1e9:.2f} GB) "
                     f"and {host_b[i] / 1e9:.2f} GB of host memory ({host_budget / 1e9:.0f} GB per GPU)")
    return batch[inv].reshape(L.shape), reason[inv].reshape(L.shape)


def ratio_for_batch(batch, context_len, *, model="deepseek-v3.2-exp", deployment="paper-table1", gpu=None,
                    host=None, decimals: int = 4):
    """The largest sparse-memory ratio (rounded down to ``decimals``) at which ``batch`` requests of
    ``context_len`` tokens fit in the KV budget: ``batch x (indexer + ratio x latent) <= budget`` (the rule the
    paper's configurations follow, paper-facts.md), with the per-request bytes of :func:`ess.layout.request_cache`;
    the result is then checked against :func:`batch_limits` (host memory, pool slots). 1.0 when no offload is
    needed; NaN when no ratio fits."""
    model, dep, gpu, host = resolve(model, deployment, gpu, host)
    B = number_array("batch", batch, whole=True, max_ndim=None)
    L = number_array("context_len", context_len, whole=True, max_ndim=None).astype(np.int64)
    decimals = non_negative_int("decimals", decimals)
    B, L = np.broadcast_arrays(B, L)
    budget = kv_budget_bytes(model, dep, gpu)
    Lu, inv = np.unique(L.ravel(), return_inverse=True)
    caches = [request_cache(model, int(x), 1.0, dep.kv_dtype) for x in Lu]
    idx = np.array([c.indexer_bytes for c in caches], dtype=float)[np.ravel(inv)].reshape(L.shape)
    lat = np.array([c.latent_bytes for c in caches], dtype=float)[np.ravel(inv)].reshape(L.shape)
    with np.errstate(divide="ignore"):
        r = (budget / B - idx) / lat
    r = np.floor(r * 10 ** decimals) / 10 ** decimals
    r = np.where(r >= 1.0, 1.0, r)
    ok = r > 0
    r = np.where(ok, r, np.nan)
    lim, _ = batch_limits(L, np.where(ok, r, 1.0), model=model, deployment=dep, gpu=gpu, host=host)
    return np.where(ok & (lim >= B), r, np.nan)


@dataclass(frozen=True)
class SimResult:
    """Simulated decode step per configuration (arrays of shape (N,); NaN where infeasible)."""

    batch: np.ndarray
    context_len: np.ndarray
    ratio: np.ndarray
    mtp: np.ndarray
    accept_ratio: np.ndarray
    h2d_GB_per_s: np.ndarray
    step_s: np.ndarray
    step_no_offload_s: np.ndarray
    feasible: np.ndarray
    reason: np.ndarray
    layer_overhead_s: np.ndarray           # (N, n_layers): offload overhead per layer (both micro-batches)
    layer_strategy: np.ndarray             # (N, n_layers): index into STRATEGIES used per layer
    gpus_per_node: int

    @property
    def stall_s(self):
        """Step time added by offload (transfers not hidden)."""
        return self.step_s - self.step_no_offload_s

    @property
    def otps(self):
        """Output tokens per second per request: accepted tokens per step / step time."""
        return self.accept_ratio / self.step_s

    @property
    def throughput(self):
        """Output tokens per second per node: batch x GPUs per node x OTPS."""
        return self.batch * self.gpus_per_node * self.otps

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame({"batch": self.batch, "context_len": self.context_len, "ratio": self.ratio,
                             "mtp": self.mtp, "accept_ratio": self.accept_ratio,
                             "h2d_GB_per_s": self.h2d_GB_per_s, "step_ms": self.step_s * 1e3,
                             "stall_ms": self.stall_s * 1e3, "otps": self.otps, "throughput": self.throughput,
                             "feasible": self.feasible, "reason": self.reason})


def simulate(batch, context_len, ratio=1.0, *, misses=None, mtp=None, accept_ratio=None,
             h2d_GB_per_s=None, d2h_GB_per_s=None, strategy="best", params: CostParams | None = None,
             model="deepseek-v3.2-exp", deployment="paper-table1", gpu=None, host=None,
             check_memory: bool = True, host_memory_cap: bool = True) -> SimResult:
    """Simulate one decode step for every configuration (arguments broadcast to shape (N,)).

    ``batch`` is requests per GPU, ``ratio`` the sparse-memory ratio (1 = no offload), ``misses`` the mean misses
    per request per decode step per layer, shape ``(n_layers,)`` or ``(N, n_layers)`` (required when any
    ratio < 1; pass zeros for a perfect cache). ``mtp`` (query tokens per request and step) and ``accept_ratio`` default to the deployment's;
    ``h2d_GB_per_s`` and ``d2h_GB_per_s`` to the FlashTrans figures (``np.inf`` = an infinitely fast link).
    ``strategy``: ``"none"``, ``"da"``, ``"dba"``, ``"best"`` (per-layer cheapest) or a sequence of those names,
    one per layer. With ``check_memory`` a batch beyond the memory model's limit is infeasible (NaN, with the
    reason); without, memory is ignored (the paper's Fig. 1 "no memory limit" curve). With ``host_memory_cap``
    each GPU's link is capped at its share of the host's DRAM bandwidth (sockets x per-socket bandwidth / GPUs).
    """
    model, dep, gpu, host = resolve(model, deployment, gpu, host)
    params = params or CostParams()
    if not isinstance(params, CostParams):
        raise TypeError(f"params must be a CostParams, got {type(params).__name__}")
    h2d_def, d2h_def = _default_link()
    nl = model.n_layers
    if misses is not None:
        misses = number_array("misses", misses, positive=False, at_least=0, max_ndim=2)
        if misses.ndim == 0 or misses.shape[-1] != nl:
            raise ValueError(f"misses must have shape ({nl},) or (N, {nl}) (one value per layer of {model.name}), "
                             f"got {misses.shape}")
    B = number_array("batch", batch, whole=True)
    L = number_array("context_len", context_len, whole=True)
    r = number_array("ratio", ratio)
    if (r > 1).any():
        raise ValueError(f"ratio must be in (0, 1], got {ratio!r}")
    if (L > model.max_position_embeddings).any():
        raise ValueError(f"context_len must not exceed {model.max_position_embeddings} tokens, got {context_len!r}")
    mtp = number_array("mtp", dep.mtp if mtp is None else mtp, whole=True)
    acc = number_array("accept_ratio", dep.mtp_accept_ratio if accept_ratio is None else accept_ratio)
    link = number_array("h2d_GB_per_s", h2d_def if h2d_GB_per_s is None else h2d_GB_per_s, allow_inf=True)
    d2h = number_array("d2h_GB_per_s", d2h_def if d2h_GB_per_s is None else d2h_GB_per_s, allow_inf=True)
    try:
        if misses is not None and np.ndim(misses) == 2:     # configurations may also be counted by misses' rows
            B = np.broadcast_to(B, np.broadcast_shapes(B.shape, (np.shape(misses)[0],)))
        B, L, r, mtp, acc, link, d2h = np.broadcast_arrays(B, L, r, mtp, acc, link, d2h)
    except ValueError:
        shapes = {"batch": np.shape(batch), "context_len": np.shape(context_len), "ratio": np.shape(ratio),
                  "misses (rows)": np.shape(misses)[:1] if misses is not None and np.ndim(misses) == 2 else ()}
        raise ValueError(f"the per-configuration arguments must have one length N (or be scalars), got "
                         f"{ {k: v for k, v in shapes.items() if v} }") from None
    B, L, r, mtp, acc, link, d2h = (np.atleast_1d(x).astype(float) for x in (B, L, r, mtp, acc, link, d2h))
    N = B.shape[0]
    if (acc > mtp).any() or (acc < 1).any():
        raise ValueError("accept_ratio must lie in [1, mtp] (accepted tokens per step)")
    # host DRAM shared by the node's GPUs caps each GPU's link (hosts.yaml, theoretical bandwidth)
    host_cap = host.sockets * host.memory_bandwidth_GB_per_s_per_socket / host.gpus
    link_eff = np.minimum(link, host_cap) if host_memory_cap else link
    d2h_eff = np.minimum(d2h, host_cap) if host_memory_cap else d2h

    offload = r < 1.0
    if misses is None:
        if offload.any():
            raise ValueError("misses (mean misses per request per step per layer, shape (n_layers,) or "
                             "(N, n_layers)) are required when a ratio is < 1; pass zeros for a perfect cache")
        m = np.zeros((N, nl))
    else:
        m = np.asarray(misses, dtype=float)
        if m.ndim == 1:
            m = np.broadcast_to(m, (N, nl))
        if m.shape != (N, nl):
            raise ValueError(f"misses must have shape ({nl},) or ({N}, {nl}), got {np.shape(misses)}")
        if not np.isfinite(m).all() or (m < 0).any():
            raise ValueError("misses must be finite and >= 0")
    if not offload.all():
        m = np.where(offload[:, None], m, 0.0)

    b = B / 2.0                                                       # Two-Batch Overlap micro-batch
    c = layer_costs(model, gpu, dep, b, L, mtp).scaled(params.compute_scale, params.comm_scale)
    if (m > c.selected[:, None] + 1e-9).any():
        raise ValueError("misses cannot exceed the entries selected per request and step (mtp x min(K, L))")

    entry = latent_entry_bytes(model, dep.kv_dtype)
    over = offload_overhead_s(c, b, m, mtp, link_eff, d2h_eff, entry, offload)
    if isinstance(strategy, str):
        if strategy == "best":                      # per layer, the cheapest (ties: none, then da, then dba)
            pick_da = over["da"] < over["none"]
            cur = np.where(pick_da, over["da"], over["none"])
            pick_dba = over["dba"] < cur
            chosen = np.where(pick_dba, over["dba"], cur)
            choice = pick_da.astype(np.int8)
            choice[pick_dba] = 2
        elif strategy in STRATEGIES:
            chosen = over[strategy]
            choice = np.full((N, nl), STRATEGIES.index(strategy), dtype=np.int8)
        else:
            raise ValueError(f"strategy must be one of {STRATEGIES + ('best',)} or one name per layer, "
                             f"got {strategy!r}")
    else:
        names = list(strategy)
        if len(names) != nl or any(s not in STRATEGIES for s in names):
            raise ValueError(f"a per-layer strategy must list {nl} names from {STRATEGIES}")
        idx = np.array([STRATEGIES.index(s) for s in names])
        chosen = np.stack([over[s] for s in STRATEGIES])[idx, :, np.arange(nl)].T
        choice = np.broadcast_to(idx.astype(np.int8), (N, nl))
    layer_over = 2.0 * chosen                                         # both micro-batches

    attn_block = c.attention_block
    dense = model.n_dense_layers
    comp_d = 2 * (attn_block + c.ffn_dense)
    comp_m = 2 * (attn_block + c.moe)
    comm_m = 2 * (c.dispatch + c.combine)
    moe_part = layer_over[:, dense:] + comp_m[:, None]
    np.maximum(moe_part, comm_m[:, None], out=moe_part)
    layers = dense * comp_d + layer_over[:, :dense].sum(axis=1) + moe_part.sum(axis=1)
    layers0 = dense * comp_d + (nl - dense) * np.maximum(comp_m, comm_m)

    # MTP: mtp-1 draft passes through the MTP module (one MoE block at one token per request, eh_proj 2h -> h), plus
    # the output head for the mtp verified tokens and each draft ([DS]: one MTP module sharing the head).
    c1 = layer_costs(model, gpu, dep, b, L, np.ones_like(mtp)).scaled(params.compute_scale, params.comm_scale)
    fp8 = "fp8" if model.weight_bytes_per_param == 1 else "bf16"
    draft = (np.maximum(2 * (c1.attention_block + c1.moe), 2 * (c1.dispatch + c1.combine))
             + params.compute_scale * (gemm_time_s(B, model.hidden_size, 2 * model.hidden_size, gpu, model=model,
                                                   dtype=fp8)
                                       + lm_head_time_s(B, model, gpu)))
    heads = params.compute_scale * lm_head_time_s(B * mtp, model, gpu) + (mtp - 1) * draft
    fixed = params.fixed_ms * 1e-3
    step = layers + heads + fixed
    step0 = layers0 + heads + fixed

    if check_memory:
        lim, why = batch_limits(L.astype(np.int64), r, model=model, deployment=dep, gpu=gpu, host=host)
        feasible = B <= lim
        reason = np.where(lim == 0, why, np.where(feasible, "", np.char.add(
            "batch exceeds the memory limit of ", lim.astype(str).astype(object))))
    else:
        feasible = np.ones(N, dtype=bool)
        reason = np.full(N, "", dtype=object)
    step = np.where(feasible, step, np.nan)
    step0 = np.where(feasible, step0, np.nan)
    return SimResult(B, L, r, mtp, acc, link, step, step0, feasible, reason.astype(object), layer_over,
                      np.asarray(choice), dep.gpus_per_node)


def best_batch(context_len, ratios, *, misses_by_ratio=None, otps_floor: float | None = None, **kwargs):
    """Adaptive batch sizing: over the given ratios and every batch up to each ratio's memory limit, the
    configuration with the highest node throughput whose OTPS is at least ``otps_floor``.

    ``misses_by_ratio`` maps each ratio < 1 to its per-layer misses (shape (n_layers,)). Returns a dict with the
    chosen ``batch``, ``ratio``, ``throughput``, ``otps`` and ``step_ms`` (``None`` values and a ``reason`` when
    nothing qualifies)."""
    ratios = list(ratios) if not isinstance(ratios, (int, float, np.number)) else [ratios]
    if not ratios:
        raise ValueError("ratios must list at least one sparse-memory ratio (1.0 = no offload)")
    for i, ratio in enumerate(ratios):
        ratio_check(f"ratios[{i}]", ratio)
        if ratio < 1 and (misses_by_ratio is None or ratio not in misses_by_ratio):
            raise ValueError(f"misses_by_ratio must give the per-layer misses of every ratio < 1; {ratio} has none")
    rows_B, rows_r, rows_m = [], [], []
    model, dep, gpu, host = resolve(kwargs.get("model", "deepseek-v3.2-exp"), kwargs.get("deployment", "paper-table1"),
                                    kwargs.get("gpu"), kwargs.get("host"))
    nl = model.n_layers
    for ratio in ratios:
        lim, why = batch_limits(int(context_len), float(ratio), model=model, deployment=dep, gpu=gpu, host=host)
        lim = int(lim)
        if lim == 0:
            continue
        mis = np.zeros(nl) if ratio >= 1 else np.asarray((misses_by_ratio or {})[ratio], dtype=float)
        rows_B.append(np.arange(1, lim + 1))
        rows_r.append(np.full(lim, float(ratio)))
        rows_m.append(np.broadcast_to(mis, (lim, nl)))
    if not rows_B:
        return {"batch": None, "ratio": None, "throughput": None, "otps": None, "step_ms": None,
                "reason": "no ratio admits a single request"}
    kw = {k: v for k, v in kwargs.items() if k not in ("model", "deployment", "gpu", "host")}
    res = simulate(np.concatenate(rows_B), int(context_len), np.concatenate(rows_r), misses=np.concatenate(rows_m),
                   model=model, deployment=dep, gpu=gpu, host=host, **kw)
    tput = np.where(res.feasible, res.throughput, -np.inf)
    if otps_floor is not None:
        tput = np.where(res.otps >= otps_floor, tput, -np.inf)
    i = int(np.argmax(tput))
    if not np.isfinite(tput[i]):
        return {"batch": None, "ratio": None, "throughput": None, "otps": None, "step_ms": None,
                "reason": f"no configuration reaches OTPS {otps_floor}"}
    return {"batch": int(res.batch[i]), "ratio": float(res.ratio[i]), "throughput": float(res.throughput[i]),
            "otps": float(res.otps[i]), "step_ms": float(res.step_s[i] * 1e3), "reason": ""}
