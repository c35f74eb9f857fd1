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
(paper's strategies, paper-facts.md "Overlap strategies" and "How the overlap strategies behave"):

* ``none`` (SGLang's serial order): ``h + d``
* ``da`` (dual attention: the H2D issued after the indexer overlaps PreAttn and the attention over the hits,
  ``Attn0``; the misses are attended by a second launch ``Attn1`` after they land and the two merged by their
  log-sum-exp; D2H overlaps O_proj):
  ``(Attn0 + Attn1 - Attn) + Merge + max(0, h - PreAttn - Attn0) + max(0, d - O_proj)``
  -- the first two terms are DA's cost of its own: a second launch (its fixed part, and FlashMLA's per-request
  overhead paid twice) and the merge, also where few entries miss;
* ``dba`` (dual-batch attention: the indexer's logits and top-K, and attention, run per half batch B0, B1; B0's
  copy overlaps B1's indexer, B1's copy overlaps PreAttn and B0's attention, the write-back B1's attention):
  ``(I0 + I1 - I) + (a0 + a1 - a) + max(0, h0 - I1) + max(0, h1 - PreAttn - a0) + max(0, d - a1)``
  with every half priced at half the batch (:mod:`ess.sim.costs`: a half keeps most of the indexer's cost, the
  top-K's row latency and each launch's fixed part do not halve) -- the first two terms are the split's own cost;
* ``best``: per layer, the cheapest of the three at that layer's miss count -- the paper's offline per-layer choice
  made on the profiled per-layer misses (here the cache simulation's for the configuration); or a sequence of
  names, one per layer.

Without offload (ratio 1) nothing is copied and no strategy splits anything: the overhead is 0.

The three formulas are written once, in :func:`overlap_overhead_s`, over a layer's operation times
(:class:`LayerOps`); :func:`offload_overhead_s` feeds it the cost model's times, and the check of the formulas
against a real decode engine (:mod:`ess.studies.real_model.check`) feeds it measured ones.

Everything is vectorised over configurations (arrays broadcast; misses have shape ``(n_layers,)`` or
``(N, n_layers)``): the cost model runs once per distinct (batch, context, MTP), and the per-layer part of
:func:`simulate` -- the three strategies' overheads, the per-layer choice, the two lanes -- is one loop over
configurations and layers (the kernel family :mod:`ess.kernels.timeline`: a NumPy reference and its Numba fast
path), tested against :func:`offload_overhead_s` and the lanes written with NumPy.

With MTP a step selects the union of its query tokens' sets: the misses count it once, and the memory check wants
the pools to hold it on average over the layers (:func:`ess.layout.step_entries` with the default locality model's
overlaps; the layers share the ratio's slots, :func:`ess.layout.layer_pool_slots`): the memory rule is
:func:`ess.memory.batch_limits`. What a simulated step is set in (model, deployment, GPU, host, MTP, links,
strategy, cost parameters, memory checks) is an :class:`ess.sim.Scenario`.
"""
from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ..kernels import resolve_backend
from ..kernels import timeline as _layer_kernels
from ..layout import latent_entry_bytes
from ..memory import _limits as limits_of_validated
from ..memory import batch_limits, group_rows
from ..validate import MAX_EXACT_COUNT, integer, number_array, real
from ..validate import ratio as ratio_check
from .config import STRATEGIES, Scenario, as_scenario, default_link_GB_per_s
from .costs import gemm_time_s, layer_costs, lm_head_time_s

__all__ = ["STRATEGIES", "LayerOps", "overlap_overhead_s", "SimResult", "simulate", "offload_overhead_s",
           "best_batch"]


@dataclass(frozen=True)
class LayerOps:
    """Seconds of the operations of one layer (one micro-batch) that the overlap strategies rearrange: numbers or
    arrays that broadcast together. The one input of :func:`overlap_overhead_s`, built from the cost model for
    DeepSeek (:func:`offload_overhead_s`) and from measured operation times for the real model
    (:mod:`ess.studies.real_model.check`).

    ``indexer`` (I) the selection work dual-batch attention splits, over the whole batch (DeepSeek: the logits and
    top-K of the indexer; the real model: its indexer and plan), ``indexer_b0`` / ``indexer_b1`` (I0, I1) the same
    over each half; ``pre_attn`` (p) work after the selection and before attention, which the copies can hide
    behind (DeepSeek's PreAttn; 0 for a model whose indexer needs the attention queries first); ``attn`` (a)
    attention over every selected entry in one launch, ``attn_b0`` / ``attn_b1`` (a0, a1) over each half's;
    ``attn_hit`` / ``attn_miss`` DA's two launches, over the hits (Attn0, while the misses are copied) and over the
    misses (Attn1); ``merge`` DA's merge of the two; ``o_proj`` (o) work after attention that the write-back can
    hide behind; ``h2d`` the host -> device copy of the misses (h), ``h2d_b0`` / ``h2d_b1`` (h0, h1) of each half's;
    ``d2h`` (d) the device -> host write-back. Every half is given, not derived: halving the batch does not halve a
    kernel's time."""

    indexer: np.ndarray
    indexer_b0: np.ndarray
    indexer_b1: np.ndarray
    pre_attn: np.ndarray
    attn: np.ndarray
    attn_b0: np.ndarray
    attn_b1: np.ndarray
    attn_hit: np.ndarray
    attn_miss: np.ndarray
    merge: np.ndarray
    o_proj: np.ndarray
    h2d: np.ndarray
    h2d_b0: np.ndarray
    h2d_b1: np.ndarray
    d2h: np.ndarray

    def __post_init__(self):
        """Every field a time: a finite number >= 0 or an array of them (any shape), all broadcasting together."""
        arrays = {}
        for f in dataclasses.fields(self):
            arrays[f.name] = number_array(f"LayerOps.{f.name}", getattr(self, f.name), positive=False, at_least=0.0,
                                          max_ndim=None)
        try:
            np.broadcast_shapes(*(a.shape for a in arrays.values()))
        except ValueError:
            raise ValueError("LayerOps fields must broadcast together, got shapes "
                             + ", ".join(f"{k} {a.shape}" for k, a in arrays.items())) from None
        for k, a in arrays.items():
            object.__setattr__(self, k, a)


def overlap_overhead_s(ops: LayerOps) -> dict:
    """Extra seconds each strategy adds to one layer's serial compute ``I + p + a + o``, from its operation times
    (paper's strategies, paper-facts.md "Overlap strategies"; see the module docstring):

    * ``none``  ``h + d`` (the copies run between the indexer and attention, fully serial);
    * ``da``    ``(a_hit + a_miss - a) + merge + max(0, h - p - a_hit) + max(0, d - o)`` (attention in two
      launches and their merge; the copy is issued after the selection and overlaps p and the attention over the
      hits; the write-back overlaps o);
    * ``dba``   ``(I0 + I1 - I) + (a0 + a1 - a) + max(0, h0 - I1) + max(0, h1 - p - a0) + max(0, d - a1)`` (the
      split's own cost; B0's copy overlaps B1's indexer, B1's copy overlaps p and B0's attention, the write-back
      overlaps B1's attention).

    Returns ``{"none", "da", "dba"}``, each the broadcast shape of the inputs."""
    if not isinstance(ops, LayerOps):
        raise TypeError(f"ops must be a LayerOps, got {type(ops).__name__}")
    f = lambda x: np.asarray(x, dtype=float)                                       # noqa: E731
    I, I0, I1 = f(ops.indexer), f(ops.indexer_b0), f(ops.indexer_b1)
    p, a, a0, a1 = f(ops.pre_attn), f(ops.attn), f(ops.attn_b0), f(ops.attn_b1)
    ah, am, o = f(ops.attn_hit), f(ops.attn_miss), f(ops.o_proj)
    h, h0, h1, d = f(ops.h2d), f(ops.h2d_b0), f(ops.h2d_b1), f(ops.d2h)
    none = h + d
    da = (ah + am - a) + f(ops.merge) + np.maximum(h - p - ah, 0.0) + np.maximum(d - o, 0.0)
    dba = ((I0 + I1 - I) + (a0 + a1 - a) + np.maximum(h0 - I1, 0.0) + np.maximum(h1 - p - a0, 0.0)
           + np.maximum(d - a1, 0.0))
    return {"none": none, "da": da, "dba": dba}


def offload_overhead_s(costs, micro_batch, misses, mtp, h2d_GB_per_s, d2h_GB_per_s, entry_bytes: int,
                       offload=True):
    """Extra compute-lane seconds of one micro-batch for each strategy: dict ``{name: array}`` shaped like
    ``misses`` (N, n_layers); per-configuration inputs have shape (N,) (``costs`` a :class:`~ess.sim.costs.
    LayerCosts` of those configurations). ``offload`` (bool or (N,)): rows without offload add nothing. The cost
    model's operations as a :class:`LayerOps` for :func:`overlap_overhead_s`: ``h = m x b x entry / link``,
    ``d = b x mtp x entry / d2h``; DA's launches over the hits and the misses, each query token missing
    ``entries x m / selected`` of its entries (:meth:`~ess.sim.costs.LayerCosts.attention`); DBA's halves at half
    the batch (``indexer_half``, ``attn_half``) with half the misses each. The readable reference of the Numba
    kernel of :func:`simulate`."""
    from ..validate import boolean_array, positive_int
    entry_bytes, offload = positive_int("entry_bytes", entry_bytes), boolean_array("offload", offload)
    b = np.asarray(micro_batch, dtype=float)
    mtp = np.asarray(mtp, dtype=float)
    m = np.asarray(misses, dtype=float)
    col = lambda x: np.broadcast_to(np.asarray(x, dtype=float), m.shape[:1])[:, None]   # noqa: E731
    k_h = b * entry_bytes / (np.asarray(h2d_GB_per_s, dtype=float) * 1e9)                # seconds per miss
    d = b * mtp * entry_bytes / (np.asarray(d2h_GB_per_s, dtype=float) * 1e9)
    e_miss = col(costs.sparse_entries) * m / col(costs.selected)          # misses only among the selected rows
    attention = lambda e: (col(costs.attn_fixed) + col(b) * col(costs.attn_block)                   # noqa: E731
                           * (e / costs.block_entries + costs.attn_overhead_blocks))
    h = m * col(k_h)
    ops = LayerOps(indexer=col(costs.indexer_split), indexer_b0=col(costs.indexer_half),
                   indexer_b1=col(costs.indexer_half), pre_attn=col(costs.pre_attn), attn=col(costs.attn),
                   attn_b0=col(costs.attn_half), attn_b1=col(costs.attn_half),
                   attn_hit=attention(col(costs.entries) - e_miss), attn_miss=attention(e_miss),
                   merge=col(costs.merge), o_proj=col(costs.o_proj), h2d=h, h2d_b0=h / 2, h2d_b1=h / 2,
                   d2h=col(d))
    on = col(np.asarray(offload, dtype=float)) > 0
    return {k: np.where(on, v, 0.0) for k, v in overlap_overhead_s(ops).items()}


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
    h2d_effective_GB_per_s: np.ndarray | None = None    # the link after the host's DRAM share capped it

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

    @property
    def throughput_per_gpu(self):
        """Output tokens per second per GPU: batch x OTPS (nodes of different sizes compare per GPU)."""
        return self.batch * self.otps

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame({"batch": self.batch, "context_len": self.context_len, "ratio": self.ratio,
                             "mtp": self.mtp, "accept_ratio": self.accept_ratio,
                             "h2d_GB_per_s": self.h2d_GB_per_s, "step_ms": self.step_s * 1e3,
                             "stall_ms": self.stall_s * 1e3, "otps": self.otps, "throughput": self.throughput,
                             "feasible": self.feasible, "reason": self.reason})


def simulate(batch, context_len, ratio=1.0, *, misses=None, scenario: Scenario | None = None, mtp=None,
             accept_ratio=None, h2d_GB_per_s=None, d2h_GB_per_s=None) -> SimResult:
    """Simulate one decode step for every configuration (arguments broadcast to shape (N,)) of ``scenario`` (an
    :class:`ess.sim.Scenario`; default: the project's, unfitted cost parameters).

    ``batch`` is requests per GPU, ``ratio`` the sparse-memory ratio (1 = no offload), ``misses`` the mean misses
    per request per decode step per layer, shape ``(n_layers,)`` or ``(N, n_layers)`` (required when any
    ratio < 1; pass zeros for a perfect cache), over the model's sparse layers (the ones offload moves: every layer
    of a DSA model; a compressed model's C4 layers, whose other layers add their time without offload). ``mtp``, ``accept_ratio``, ``h2d_GB_per_s`` and ``d2h_GB_per_s``
    vary the scenario's values per configuration (arrays broadcast with ``batch``; ``None``: the scenario's, which
    default to the deployment's and the FlashTrans link; ``np.inf`` = an infinitely fast link). The scenario's
    ``strategy`` is ``"none"``, ``"da"``, ``"dba"``, ``"best"`` (per-layer cheapest) or one name per layer. With
    ``check_memory`` a batch beyond the memory model's limit (:func:`ess.memory.batch_limits`) is infeasible (NaN,
    with the reason); without, memory is ignored (the paper's Fig. 1 "no memory limit" curve). With
    ``host_memory_cap`` each GPU's link is capped at its share of the host's DRAM bandwidth (sockets x per-socket
    bandwidth / GPUs).
    """
    sc = as_scenario(scenario)
    model, dep, gpu, host = sc.specs()
    params, strategy = sc.params, sc.strategy
    mtp = sc.mtp if mtp is None else mtp
    accept_ratio = sc.accept_ratio if accept_ratio is None else accept_ratio
    h2d_GB_per_s = sc.h2d_GB_per_s if h2d_GB_per_s is None else h2d_GB_per_s
    d2h_GB_per_s = sc.d2h_GB_per_s if d2h_GB_per_s is None else d2h_GB_per_s
    h2d_def, d2h_def = default_link_GB_per_s()
    nl = model.n_sparse_layers
    if misses is not None:
        misses = number_array("misses", misses, positive=False, at_least=0, max_ndim=2)
        if misses.ndim == 0 or misses.shape[-1] != nl:
            raise ValueError(f"misses must have shape ({nl},) or (N, {nl}) (one value per layer of {model.name}), "
                             f"got {misses.shape}")
    # batch x mtp tokens (mtp up to the model's context) stay a count that float64 holds exactly
    B = number_array("batch", batch, whole=True, at_most=MAX_EXACT_COUNT // model.max_position_embeddings)
    L = number_array("context_len", context_len, whole=True)
    r = number_array("ratio", ratio)
    if (r > 1).any():
        raise ValueError(f"ratio must be in (0, 1], got {ratio!r}")
    if (L > model.max_position_embeddings).any():
        raise ValueError(f"context_len must not exceed {model.max_position_embeddings} tokens, got {context_len!r}")
    mtp = number_array("mtp", dep.mtp if mtp is None else mtp, whole=True, at_most=model.max_position_embeddings)
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
    link_eff = np.minimum(link, host_cap) if sc.host_memory_cap else link
    d2h_eff = np.minimum(d2h, host_cap) if sc.host_memory_cap else d2h

    offload = r < 1.0
    if misses is None:
        if offload.any():
            raise ValueError("misses (mean misses per request per step per layer, shape (n_layers,) or "
                             "(N, n_layers)) are required when a ratio is < 1; pass zeros for a perfect cache")
        m = np.zeros((1, nl))
    else:
        m = np.asarray(misses, dtype=float)
        if m.ndim == 1:
            m = m[None, :]
        if m.shape not in ((1, nl), (N, nl)) or (np.ndim(misses) == 2 and m.shape[0] != N):
            raise ValueError(f"misses must have shape ({nl},) or ({N}, {nl}), got {np.shape(misses)}")
    m = np.ascontiguousarray(m)

    # The cost model runs once per distinct (batch, context, MTP): layer costs, MTP drafts and output heads.
    first, inv = group_rows(B, L, mtp)
    Bg, Lg, Tg = B[first], L[first], mtp[first]
    bg = Bg / 2.0                                                     # Two-Batch Overlap micro-batch
    kw = params.cost_kw()
    scale = lambda x: x.scaled(params.compute_scale, params.comm_scale)          # noqa: E731
    c = scale(layer_costs(model, gpu, dep, bg, Lg, Tg, **kw))
    # MTP: mtp-1 draft passes through the MTP module (one MoE block at one token per request, eh_proj 2h -> h, its
    # layer of the MTP block's kind: DSA for DeepSeek-V3.2, window-only for V4), plus the output head for the mtp
    # verified tokens and each draft ([DS]: one MTP module sharing the head).
    mtp_kind = model.mtp_kinds[0] if model.n_mtp_layers else "sparse"
    c1 = scale(layer_costs(model, gpu, dep, bg, Lg, np.ones_like(Tg), kind=mtp_kind, **kw))
    fp8 = "fp8" if model.weight_bytes_per_param == 1 else "bf16"
    draft = (np.maximum(2 * (c1.attention_block + c1.moe), 2 * (c1.dispatch + c1.combine))
             + params.compute_scale * (gemm_time_s(Bg, model.hidden_size, 2 * model.hidden_size, gpu, model=model,
                                                   dtype=fp8)
                                       + lm_head_time_s(Bg, model, gpu)))
    heads = (params.compute_scale * lm_head_time_s(Bg * Tg, model, gpu) + (Tg - 1) * draft)[inv]
    # a compressed model's layers outside offload (densely attended rows, window-only layers): their time on the two
    # lanes, the same with and without offload
    others = np.zeros_like(Bg)
    for (kind, ratio_l, dense_ffn), count in _other_layers(model).items():    # identical layers priced once
        co = scale(layer_costs(model, gpu, dep, bg, Lg, Tg, kind=kind, compress_ratio=ratio_l or None, **kw))
        if dense_ffn:
            others = others + count * 2 * (co.attention_block + co.ffn_dense)
        else:
            others = others + count * np.maximum(2 * (co.attention_block + co.moe), 2 * (co.dispatch + co.combine))
    others = others[inv]
    entry = latent_entry_bytes(model, dep.kv_dtype)
    g = lambda x: np.ascontiguousarray(np.broadcast_to(x, Bg.shape)[inv], dtype=float)       # noqa: E731
    k_h = B / 2.0 * entry / (link_eff * 1e9)                          # seconds per miss (one micro-batch)
    d = np.where(offload, B / 2.0 * mtp * entry / (d2h_eff * 1e9), 0.0)
    dense = sum(1 for l in model.sparse_layers if l < model.n_dense_layers)   # the first sparse layers: dense FFN
    if isinstance(strategy, str):
        per_layer = np.full(nl, -1 if strategy == "best" else STRATEGIES.index(strategy), dtype=np.int8)
    else:
        if len(strategy) != nl:
            raise ValueError(f"a per-layer strategy must list {nl} names from {STRATEGIES}, got {len(strategy)}")
        per_layer = np.array([STRATEGIES.index(s) for s in strategy], dtype=np.int8)
    layer_over = np.empty((N, nl))
    choice = np.empty((N, nl), dtype=np.int8)
    layers, layers0 = np.empty(N), np.empty(N)
    layer_sums = _layer_kernels.get(resolve_backend()).layer_sums        # ess.kernels.timeline
    bad = layer_sums(m, offload, k_h, d, g(bg), g(c.indexer_split), g(c.indexer_half), g(c.pre_attn),
                     g(c.attn), g(c.attn_half), g(c.o_proj), g(c.merge), g(c.attn_fixed), g(c.attn_block),
                     float(c.attn_overhead_blocks), float(c.block_entries), g(c.entries),
                     g(c.sparse_entries), g(c.selected),
                     g(2 * (c.attention_block + c.ffn_dense)), g(2 * (c.attention_block + c.moe)),
                     g(2 * (c.dispatch + c.combine)), dense, per_layer, layer_over, choice, layers, layers0)
    if bad == 1:
        raise ValueError("misses must be finite and >= 0")
    if bad == 2:
        raise ValueError("misses cannot exceed the entries selected per request and step (mtp x min(K, "
                         "context_len))")
    fixed = params.fixed_ms * 1e-3
    step = layers + others + heads + fixed
    step0 = layers0 + others + heads + fixed

    if sc.check_memory:
        # ess.memory's rule on the arrays validated above (batch_limits would check them again)
        limits = limits_of_validated(model, dep, gpu, host, L.astype(np.int64), r, mtp.astype(np.int64))
        lim, why = limits.batch, limits.reason
        feasible = B <= lim
        reason = np.full(N, "", dtype=object)
        over = ~feasible & (lim > 0)
        if over.any():                                                # one string per distinct limit
            vals, idx = np.unique(lim[over], return_inverse=True)
            reason[over] = np.array([f"batch exceeds the memory limit of {v}" for v in vals], dtype=object)[idx]
        none_fit = ~feasible & (lim == 0)
        reason[none_fit] = why[none_fit]
    else:
        feasible = np.ones(N, dtype=bool)
        reason = np.full(N, "", dtype=object)
    step = np.where(feasible, step, np.nan)
    step0 = np.where(feasible, step0, np.nan)
    return SimResult(B, L, r, mtp, acc, link, step, step0, feasible, reason.astype(object), layer_over, choice,
                     dep.gpus_per_node, link_eff)


def _other_layers(model) -> dict:
    """The layers outside offload (none for a DSA model), counted by ``(kind, compress ratio, dense FFN)``."""
    out: dict = {}
    ratios = model.layer_compress_ratios or (1,) * model.n_layers
    for l, (kind, ratio_l) in enumerate(zip(model.layer_kinds, ratios)):
        if kind != "sparse":
            key = (kind, int(ratio_l), l < model.n_dense_layers)
            out[key] = out.get(key, 0) + 1
    return out


def best_batch(context_len, ratios, *, misses_by_ratio=None, otps_floor: float | None = None,
               scenario: Scenario | None = None) -> dict:
    """Adaptive batch sizing: over the given ratios and every batch up to each ratio's memory limit
    (:func:`ess.memory.batch_limits` at the scenario's MTP), the configuration of ``scenario`` with the highest node
    throughput whose OTPS is at least ``otps_floor``.

    ``misses_by_ratio`` maps each ratio < 1 to its per-layer misses (shape (n_layers,)). Returns a dict with the
    chosen ``batch``, ``ratio``, ``throughput``, ``otps`` and ``step_ms`` (``None`` values and a ``reason`` when
    nothing qualifies)."""
    sc = as_scenario(scenario)
    context_len = integer("context_len", context_len, lo=1)
    if misses_by_ratio is not None and not isinstance(misses_by_ratio, Mapping):
        raise TypeError(f"misses_by_ratio must be None or a mapping {{ratio: per-layer misses}}, got "
                        f"{type(misses_by_ratio).__name__}")
    if otps_floor is not None:
        otps_floor = real("otps_floor", otps_floor, lo=0.0)
    if isinstance(ratios, (str, bytes)) or not isinstance(ratios, (Iterable, numbers.Real)):
        raise TypeError(f"ratios must be a ratio or a list of ratios, got {type(ratios).__name__}")
    ratios = list(np.ravel(ratios)) if isinstance(ratios, np.ndarray) else (
        list(ratios) if not isinstance(ratios, numbers.Real) else [ratios])
    if not ratios:
        raise ValueError("ratios must list at least one sparse-memory ratio (1.0 = no offload)")
    for i, ratio in enumerate(ratios):
        ratio_check(f"ratios[{i}]", ratio)
        if ratio < 1 and (misses_by_ratio is None or ratio not in misses_by_ratio):
            raise ValueError(f"misses_by_ratio must give the per-layer misses of every ratio < 1; {ratio} has none")
    rows_B, rows_r, rows_m = [], [], []
    model, dep, gpu, host = sc.specs()
    nl = model.n_layers
    mtp = dep.mtp if sc.mtp is None else sc.mtp
    for ratio in ratios:
        lim = int(batch_limits(int(context_len), float(ratio), mtp=mtp, model=model, deployment=dep, gpu=gpu,
                               host=host).batch)
        if lim == 0:
            continue
        mis = np.zeros(nl) if ratio >= 1 else np.asarray((misses_by_ratio or {})[ratio], dtype=float)
        rows_B.append(np.arange(1, lim + 1))
        rows_r.append(np.full(lim, float(ratio)))
        rows_m.append(np.broadcast_to(mis, (lim, nl)))
    if not rows_B:
        return {"batch": None, "ratio": None, "throughput": None, "otps": None, "step_ms": None,
                "reason": "no ratio admits a single request"}
    res = simulate(np.concatenate(rows_B), int(context_len), np.concatenate(rows_r), misses=np.concatenate(rows_m),
                   scenario=sc)
    tput = np.where(res.feasible, res.throughput, -np.inf)
    if otps_floor is not None:
        tput = np.where(res.otps >= otps_floor, tput, -np.inf)
    i = int(np.argmax(tput))
    if not np.isfinite(tput[i]):
        return {"batch": None, "ratio": None, "throughput": None, "otps": None, "step_ms": None,
                "reason": f"no configuration reaches OTPS {otps_floor}"}
    return {"batch": int(res.batch[i]), "ratio": float(res.ratio[i]), "throughput": float(res.throughput[i]),
            "otps": float(res.otps[i]), "step_ms": float(res.step_s[i] * 1e3), "reason": ""}
