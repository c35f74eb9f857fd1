""":class:`SparseCache`: a cache on transformers' cache API whose entries live in ess's tiered cache, and the decode
step the registered attention function (:mod:`ess.hf.attention`) runs through it.

How a ``model.generate(ids, cache=SparseCache(model, ...))`` runs:

* **prefill** (every forward before the first one-token step; a long prompt may come in chunks): dense,
  transformers' own SDPA attention; ``update`` keeps each layer's new
  entries (and, for DSA, ``update_indexer`` the indexer keys; the attention the last prompt positions' top-K, the
  LRU-Warmup windows);
* **first decode step** (layer 0's ``update``): the prompt's entries go to the host pool of a
  :class:`ess.storage.TieredCache` (``offload=True``; a device pool of ``ratio`` of them under ``policy``, seeded by
  LRU-Warmup) or of a :class:`ess.storage.ResidentCache` (every entry on the device);
* **every decode step, every layer**: ``update`` returns only the new token's entry (nothing of the context is
  materialised); the attention function selects the top-K (a GQA model: ess's FP8 indexer,
  :class:`ess.engine.indexer.IndexerCache`; a DSA model: the model's own lightning indexer, whose keys stay resident
  here), and :func:`ess.decode.run_layer` plans, copies and commits through the cache under the ``schedule`` while
  attention reads the selected rows where they lie in the device pool; after the last layer the new token's
  entries are written back to the host pool (only that token's bytes move device -> host).

Entries: a GQA model's K/V entry (:mod:`ess.engine.kv`, float32); a DSA model's latent entry
(:class:`ess.hf.latent.LatentFormat`, FP8 in ess's layout by default). Counters per step, layer and request:
``cache_hits``, ``cache_misses``, ``host_to_device_bytes`` (:meth:`SparseCache.counters`), a per-step row for the
live monitor (:mod:`ess.monitor`, ``on_step``; its ``step_s`` runs from layer 0's ``update`` to the end of the last
layer's attention, so the final norm, the logits and sampling are outside it), and optionally the top-K sets as an
:mod:`ess.traces` trace.

Limits: a batch of prompts of one length (no padding), one token per decode step after the prefill, greedy or
sampled decoding (no beam search), a float32 model.
"""
from __future__ import annotations

import weakref
from contextvars import ContextVar
from typing import Callable

import numpy as np
import torch

from .. import validate
from ..decode import run_layer, write_back
from ..engine.attention import StepAttention
from ..engine.config import WARMUP_WINDOWS, DecodeConfig, default_topk
from ..engine.indexer import IndexerCache, quantize_keys
from ..engine.kv import KV_PAGE_TOKENS, kv_entries, kv_view
from ..engine.wiring import KVWiring
from ..kernels.gqa_indexer import gqa_indexer_scores
from ..attention import topk_indices
from ..layout import EntryFormat, pool_slots
from ..link import CLOCKS, SyncLink, make_link
from ..metrics import DecodeMetricsLog, DecodeStepMetrics, OpTimer
from ..storage import ResidentCache, TieredCache
from ._compat import Cache, CacheLayerMixin
from .latent import LATENT_DTYPES, LatentFormat, LatentStepAttention
from .models import ModelInfo, model_info

__all__ = ["SparseCache", "ACTIVE"]

# the cache whose layer last called ``update`` (the attention function of that layer runs next, in the same
# thread); transformers hands the attention function the module, not the cache
ACTIVE: ContextVar = ContextVar("ess_hf_active", default=None)


class _Layer(CacheLayerMixin):
    """One layer of a :class:`SparseCache` (the cache holds the state; the layer answers transformers' questions)."""

    is_sliding = False
    is_croppable = False
    supports_early_init = False

    def __init__(self, owner: "SparseCache", idx: int):
        super().__init__()
        self.owner, self.idx = owner, idx
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        return self.owner._update(self.idx, key_states, value_states)

    def update_indexer(self, indexer_key_states):
        return self.owner._update_indexer(self.idx, indexer_key_states)

    def get_seq_length(self) -> int:
        return self.owner._seen[self.idx]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        raise NotImplementedError("a SparseCache serves one generation: make a new one")

    def reorder_cache(self, beam_idx) -> None:
        raise NotImplementedError("a SparseCache does not support beam search (num_beams=1)")


class _LatentWiring(KVWiring):
    """A DSA model's part of one layer of a decode step (:func:`ess.decode.run_layer`): the model's indexer has
    selected (``cached``: (B, K) positions in the cache, -1 padded); attention scores the selected latent rows where
    they lie in the device pool (:class:`LatentStepAttention`, whose columns :class:`KVWiring`'s ``attend`` and
    ``merge`` fill and combine as for K/V entries)."""

    def __init__(self, cached: np.ndarray, att: LatentStepAttention, new: torch.Tensor):
        self.cached, self.att, self._new = cached, att, new

    def select(self, rows):
        idx = self.cached[rows]
        return idx, np.where(idx >= 0, 1.0, 0.0)

    def finish(self):
        pass

    def new_entries(self):
        return self._new


class _KVWiring(KVWiring):
    """ess's K/V wiring (:class:`ess.engine.wiring.KVWiring`) with the rest of the layer left to transformers."""

    def __init__(self, layer, q, k, v, indexer, topk, pool, att):
        super().__init__(None, layer, None, q, k, v, indexer, topk, pool, att)

    def finish(self):
        pass


class SparseCache(Cache):
    """A transformers cache whose entries live in ess's tiered cache (module docstring); pass it to
    ``model.generate(..., cache=cache)`` or to the model's forward.

    Parameters
    ----------
    model : a transformers causal LM
        A GQA/MHA decoder (:data:`ess.hf.models.GQA_TYPES`) or a DSA model (:data:`ess.hf.models.DSA_TYPES`),
        float32; anything else is a ``ValueError`` naming its architecture. Its attention is switched to ess's
        (:func:`ess.hf.enable`): without an active ``SparseCache`` it computes what SDPA computes.
    config : :class:`ess.engine.DecodeConfig`, optional
        Offload on/off, ratio, policy, schedule, link, K, warmup, timing, clock, backend; or its fields as keywords
        (``settings``). For a DSA model K is the model's ``index_topk`` (``topk`` must be left unset). The device
        pool holds ``ratio`` of the longest context a step reads (prompt + ``max_new_tokens`` - 1, in 64-token
        pages: :func:`ess.layout.pool_slots`).
    max_new_tokens : int
        Room reserved per request (the indexer keys are preallocated for prompt + this many tokens).
    entry_dtype : ``"fp8"``, ``"bf16"`` or ``"float32"``
        A DSA model's latent entry (:class:`ess.hf.latent.LatentFormat`); a GQA model's entries are float32 K/V.
    on_step : callable, optional
        Called with each decode step's :class:`ess.metrics.DecodeStepMetrics` (a live monitor's ``update``).
    record_trace : bool
        Keep every step's top-K sets (:meth:`trace`).
    """

    def __init__(self, model, config: DecodeConfig | None = None, *, max_new_tokens: int, entry_dtype: str = "fp8",
                 on_step: Callable | None = None, record_trace: bool = False, **settings):
        from .attention import enable
        self.info: ModelInfo = model_info(model)
        if config is None:
            config = DecodeConfig(**settings)
        elif settings:
            raise TypeError(f"pass either config or its fields as keywords, not both (got {sorted(settings)})")
        if not isinstance(config, DecodeConfig):
            raise TypeError(f"config must be an ess.engine.DecodeConfig, got {type(config).__name__}")
        if self.info.kind == "dsa" and config.topk is not None and config.topk != self.info.index_topk:
            raise ValueError(f"topk={config.topk}: a DSA model selects with its own indexer, K = its config's "
                             f"index_topk ({self.info.index_topk}); leave topk unset or change the model's config")
        self.cfg = config
        self.max_new_tokens = validate.positive_int("max_new_tokens", max_new_tokens)
        validate.one_of("entry_dtype", entry_dtype, LATENT_DTYPES)
        if on_step is not None and not callable(on_step):
            raise TypeError(f"on_step must be callable, got {type(on_step).__name__}")
        self.record = validate.boolean("record_trace", record_trace)
        info = self.info
        self.n_layers = info.n_layers
        self.latent = (LatentFormat(info.kv_lora_rank, info.qk_rope_head_dim, entry_dtype) if info.kind == "dsa"
                       else None)
        super().__init__(layers=[_Layer(self, i) for i in range(info.n_layers)])
        enable(model)
        self.device = str(info.device)
        self._seen = [0] * info.n_layers                     # tokens each layer holds (transformers' view)
        self._prefill: list = [None] * info.n_layers           # per layer the prompt's entries until decoding starts
        self._index_keys: list = [None] * info.n_layers        # DSA: the indexer keys (resident), preallocated
        self._tails: list = [None] * info.n_layers             # GQA: the last W prompt positions' queries
        self._windows: list = [None] * info.n_layers           # DSA: the last W prompt positions' top-K
        self._new: list = [None] * info.n_layers               # this step's new entry per layer
        self.started = False
        self.step_index = 0
        self.log = DecodeMetricsLog()
        if on_step is not None:
            self.log.subscribe(on_step)
        self.clock = CLOCKS[config.clock]
        self.timer = OpTimer(config.timing, clock=self.clock)
        self._hits: list = []
        self._misses: list = []
        self._bytes: list = []
        self._recorder = None
        self.link = None

    @classmethod
    def from_cache(cls, model, cache, config: DecodeConfig | None = None, *, max_new_tokens: int, **kwargs):
        """A SparseCache that continues from a prompt already prefilled into transformers' own ``cache`` (a
        ``DynamicCache`` of ``model``, every layer holding the prompt): its entries (and a DSA model's indexer keys)
        are taken over, so that one prefill serves a dense and a sparse run. LRU-Warmup needs the prefill's queries
        or top-K sets, which a transformers cache does not keep: the device pool starts cold. Other arguments as
        for the constructor."""
        new = cls(model, config, max_new_tokens=max_new_tokens, **kwargs)
        layers = getattr(cache, "layers", None)
        if not isinstance(layers, list) or len(layers) != new.n_layers:
            raise TypeError(f"cache must be a transformers cache of the model's {new.n_layers} layers, got "
                            f"{type(cache).__name__}")
        for i, layer in enumerate(layers):
            a, b = getattr(layer, "keys", None), getattr(layer, "values", None)
            if not isinstance(a, torch.Tensor) or a.ndim != 4 or a.shape[2] == 0:
                raise ValueError(f"cache: layer {i} holds no prefilled entries")
            new._prefill[i], new._seen[i] = (a, b), a.shape[2]
            ik = getattr(layer, "indexer_keys", None)
            if new.info.kind == "dsa" and ik is not None and ik.numel():
                buf = torch.zeros((ik.shape[0], ik.shape[1] + new.max_new_tokens, ik.shape[2]), dtype=ik.dtype,
                                  device=ik.device)
                buf[:, :ik.shape[1]] = ik
                new._index_keys[i] = (buf, ik.shape[1])
        if len({p[0].shape[2] for p in new._prefill}) != 1:
            raise ValueError("cache: its layers hold prompts of different lengths")
        return new

    # -- transformers' cache protocol -------------------------------------------------------------------------
    def _update(self, layer: int, a: torch.Tensor, b: torch.Tensor):
        """``cache.update``: GQA (keys, values) (B, Hkv, S, hd); DSA (k_pass, k_rot) (B, 1, S, kv / rope)."""
        S = a.shape[2]
        if not self.started:
            if layer == 0 and self._prefill[0] is not None and S == 1:     # the first decode step
                self._start()
            else:
                if self._prefill[layer] is not None:
                    a = torch.cat([self._prefill[layer][0], a], 2)
                    b = torch.cat([self._prefill[layer][1], b], 2)
                self._prefill[layer] = (a, b)
                self._seen[layer] = a.shape[2]
                ACTIVE.set((self, layer))
                return a, b
        if S != 1:
            raise ValueError(f"a SparseCache decodes one token per step after the prefill; this forward passes {S}")
        if a.shape[0] != self.batch:
            raise ValueError(f"the batch changed from {self.batch} to {a.shape[0]} requests")
        if layer == 0:
            self._begin_step()
        self._new[layer] = (a, b)
        self._seen[layer] += 1
        ACTIVE.set((self, layer))
        return a, b

    def _update_indexer(self, layer: int, k: torch.Tensor) -> torch.Tensor:
        """``cache.update_indexer`` (DSA): the indexer keys (B, S, D), kept resident; returns every key so far."""
        buf = self._index_keys[layer]
        B, S, D = k.shape
        if buf is None:
            buf = torch.zeros((B, S + self.max_new_tokens, D), dtype=k.dtype, device=k.device)
            buf_n = 0
        else:
            buf, buf_n = buf
        if buf_n + S > buf.shape[1]:                     # a further prefill chunk: room for it and the decoding
            grown = torch.zeros((B, buf_n + S + self.max_new_tokens, D), dtype=k.dtype, device=k.device)
            grown[:, :buf_n] = buf[:, :buf_n]
            buf = grown
        buf[:, buf_n:buf_n + S] = k
        self._index_keys[layer] = (buf, buf_n + S)
        return buf[:, :buf_n + S]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._seen[layer_idx] if layer_idx < len(self._seen) else 0

    # -- the first decode step: the prompt into the tiered cache --------------------------------------------
    def _start(self) -> None:
        info, cfg = self.info, self.cfg
        if any(p is None for p in self._prefill):
            raise RuntimeError("the prefill did not reach every layer")
        B, L = self._prefill[0][0].shape[0], self._prefill[0][0].shape[2]
        self.batch, self.context_len = B, L
        K = info.index_topk if info.kind == "dsa" else (default_topk(L) if cfg.topk is None else cfg.topk)
        self.topk = K
        cap_tokens = L + self.max_new_tokens
        if info.kind == "dsa":
            fmt = self.latent
            per_layer = [fmt.encode(k[:, 0], r[:, 0]) for k, r in self._prefill]          # (B, L, E) each
            E = fmt.entry_bytes
            name = f"{info.model_type} {fmt.dtype} latent"
        else:
            per_layer = [kv_entries(k, v) for k, v in self._prefill]                       # (B, L, E) each
            E = per_layer[0].shape[-1]
            name = f"{info.model_type} K/V float32"
        self.format = EntryFormat(name, info.n_layers, E, KV_PAGE_TOKENS, max(info.max_positions, cap_tokens),
                                  self.latent.dtype if self.latent else "float32")
        entries = [torch.stack([pl[b] for pl in per_layer]).cpu() for b in range(B)]       # (n_layers, L, E)
        self.rids = list(range(B))
        dev = self.device
        if cfg.offload:
            longest = L + self.max_new_tokens - 1                # the longest context a step reads
            self.capacity = pool_slots(self.format, cfg.ratio, longest, need=min(K, longest))
            store = TieredCache(self.format, capacity=self.capacity, policy=cfg.policy, device=dev, max_requests=B,
                                policy_options=cfg.policy_options)
            for b in self.rids:
                store.add_request(b, entries[b].numpy(), reserve_tokens=cap_tokens)
        else:
            self.capacity = None
            store = ResidentCache(self.format, max_requests=B, max_tokens=cap_tokens, device=dev)
            for b in self.rids:
                store.add_request(b, entries[b])
        self.store = store
        if cfg.offload and cfg.schedule == "dba" and B < 2:
            raise ValueError("schedule 'dba' splits the batch in two halves and needs at least 2 requests")
        self.schedule = cfg.schedule if cfg.offload else "none"
        if info.kind == "gqa":
            self.indexer = IndexerCache(info.n_layers, info.n_kv_heads, info.head_dim, max_requests=B,
                                        capacity=cap_tokens, device=dev, backend=cfg.backend)
            for b in self.rids:
                codes, scales = zip(*[quantize_keys(k[b].transpose(0, 1)) for k, _ in self._prefill])
                self.indexer.add_request(b, torch.stack(codes), torch.stack(scales))
            self.att = StepAttention(B, K, info.n_heads, info.n_kv_heads, info.head_dim, device=dev,
                                     backend=cfg.backend)
            self.pool = kv_view(store.device_pool, info.n_kv_heads, info.head_dim)
            windows = self._gqa_windows(K) if (cfg.warmup and cfg.offload) or self.record else None
        else:
            self.indexer = None
            self.att = LatentStepAttention(B, K, info.n_heads, self.latent, device=dev)
            self.pool = store.device_pool
            windows = self._windows if all(w is not None for w in self._windows) else None
        if cfg.offload and cfg.warmup and windows is not None:
            for layer in range(info.n_layers):
                for b in self.rids:
                    store.warmup(b, layer, list(windows[layer][b]))
        if self.record:
            from ..traces import TraceRecorder
            self._recorder = TraceRecorder(context_len=L, k=min(K, L), n_layers=info.n_layers, batch=B,
                                           meta={"model": info.model_type, "kind": info.kind, "topk": K,
                                                 "source": "ess.hf.SparseCache"})
            if windows is not None:
                for layer in range(info.n_layers):
                    self._recorder.observe_windows(layer, windows[layer][..., :min(K, L)])
        self.link = (make_link(cfg.link_GB_per_s, device=dev, emulate=cfg.emulate_link, clock=cfg.clock)
                     if cfg.offload else SyncLink())
        weakref.finalize(self, self.link.close)          # a cache dropped without close() stops its copy worker
        self.staging = torch.zeros((info.n_layers, B, E), dtype=torch.uint8,
                                   pin_memory=dev.startswith("cuda"))
        self._prefill = [None] * info.n_layers
        self._tails = [None] * info.n_layers
        self.started = True

    def _gqa_windows(self, K: int) -> list:
        """Per layer (B, W, K): the indexer's top-K at each of the last W prompt positions (over the tokens before
        it), -1 padded -- LRU-Warmup's windows, as :meth:`ess.engine.DecodeEngine.windows` computes them."""
        out = []
        L = self.context_len
        for layer in range(self.n_layers):
            q = self._tails[layer]                                                    # (B, H, W, hd)
            if q is None:
                return None
            W = q.shape[2]
            win = np.full((self.batch, W, K), -1, np.int64)
            for b in self.rids:
                codes, scales = self.indexer.keys(b, layer)
                for w in range(W):
                    t = L - W + w
                    if t == 0:
                        continue
                    s = gqa_indexer_scores(q[b, :, w][None].contiguous(), codes[None], scales[None],
                                           torch.tensor([t], device=q.device), backend=self.cfg.backend)
                    win[b, w] = topk_indices(s, K, backend=self.cfg.backend)[0].cpu().numpy()
            out.append(win)
        return out

    # -- one decode step --------------------------------------------------------------------------------------
    def _begin_step(self) -> None:
        self.timer.step = self.step_index
        self._t0 = self.clock()
        self._n_link = len(self.link.records)
        nl, B = self.n_layers, self.batch
        self._step_h = np.zeros((nl, B), np.int64)
        self._step_m = np.zeros((nl, B), np.int64)
        self._step_b = np.zeros((nl, B), np.int64)
        self._stall = 0.0
        self._new_keys = None
        self._new_rows = None

    def note_prefill(self, layer: int, query: torch.Tensor, indices: torch.Tensor | None) -> None:
        """What LRU-Warmup needs of the prefill: a GQA model's last W queries (B, H, W, hd), a DSA model's last W
        top-K sets (B, W, K) of ``layer``."""
        W = min(WARMUP_WINDOWS, query.shape[2])
        if indices is None:
            self._tails[layer] = query[:, :, -W:].detach().float()
        else:
            idx = torch.sort(indices[:, -W:].long(), dim=-1).values.cpu().numpy()       # position order
            self._windows[layer] = idx

    def decode_gqa(self, layer: int, query: torch.Tensor) -> torch.Tensor:
        """One layer of a GQA model's decode step; returns the attention output (B, 1, H, hd)."""
        k, v = self._new[layer]
        info = self.info
        if self._new_keys is None:
            self._new_keys = torch.empty((self.n_layers, self.batch, info.n_kv_heads, info.head_dim),
                                         device=k.device)
        wiring = _KVWiring(layer, query.float(), k.float(), v.float(), self.indexer, self.topk, self.pool, self.att)
        self._run(layer, wiring)
        self._new_keys[layer] = k[:, :, 0]
        out = self.att.output()[:, :, 0].unsqueeze(1).clone()                          # (B, 1, H, hd)
        if layer == self.n_layers - 1:
            self._end_step()
        return out.to(query.dtype)

    def decode_dsa(self, module, layer: int, query: torch.Tensor, indices: torch.Tensor, scaling: float):
        """One layer of a DSA model's decode step (absorbed sparse MLA over the latent pool); returns the attention
        output (B, 1, H, v_head_dim)."""
        info, fmt = self.info, self.latent
        k_pass, k_rot = self._new[layer]
        new = fmt.encode(k_pass[:, 0, 0], k_rot[:, 0, 0])                               # (B, E)
        own = fmt.decode(new)                                                          # (B, kv + rope)
        n = self._seen[layer] - 1                                                      # tokens in the cache
        idx = torch.sort(indices[:, 0].long(), dim=-1).values                          # (B, K') position order
        own_sel = (idx == n).any(-1)
        cached = torch.where(idx < n, idx, -1).cpu().numpy()
        nope = info.qk_nope_head_dim
        w = module.kv_b_proj.weight.view(info.n_heads, nope + info.v_head_dim, info.kv_lora_rank).float()
        q = query[:, :, 0].float()                                                     # (B, H, nope + rope)
        q_lat = torch.einsum("bhn,hnk->bhk", q[..., :nope], w[:, :nope])               # (B, H, kv)
        self.att.begin(torch.cat([q_lat, q[..., nope:]], -1), own, own_sel, self.pool, scaling)
        self._run(layer, _LatentWiring(cached, self.att, new))
        out = torch.einsum("bhk,hvk->bhv", self.att.out, w[:, nope:])                   # (B, H, v)
        if layer == self.n_layers - 1:
            self._end_step()
        return out.unsqueeze(1).to(query.dtype)

    def _run(self, layer: int, wiring) -> None:
        run = run_layer(self.store, layer, self.rids, wiring, schedule=self.schedule, link=self.link,
                        timer=self.timer, staging=self.staging if self.cfg.offload else None)
        if not self.cfg.offload:
            if self._new_rows is None:
                self._new_rows = torch.empty((self.n_layers, self.batch, self.format.entry_bytes), dtype=torch.uint8,
                                             device=self.device)
            self._new_rows[layer] = wiring.new_entries()
        for s in run.steps:
            self._step_h[layer, s.request_id] = s.n_hits
            self._step_m[layer, s.request_id] = s.n_misses
            self._step_b[layer, s.request_id] = s.n_misses * self.format.entry_bytes
        self._stall += run.stall_s
        if self._recorder is not None:
            self._recorder.observe(layer, run.indices[:, :self._recorder.k])

    def _end_step(self) -> None:
        with self.timer.span("write_back"):
            if self.cfg.offload:
                write_back(self.store, self.rids, self.staging.numpy().transpose(1, 0, 2))
            else:
                for b in self.rids:
                    self.store.append_token(b, self._new_rows[:, b])
            if self.indexer is not None:
                self.indexer.append_tokens(self.rids, self._new_keys)
        if self._recorder is not None:
            self._recorder.end_step()
        step_s = max(self.clock() - self._t0, 1e-12)
        self._hits.append(self._step_h)
        self._misses.append(self._step_m)
        self._bytes.append(self._step_b)
        E, nl, B = self.format.entry_bytes, self.n_layers, self.batch
        rec = DecodeStepMetrics(self.step_index, step_s, self._stall,
                                self.link.busy_s(self._n_link) if self.cfg.offload else 0.0,
                                int(self._step_b.sum()), B * nl * E if self.cfg.offload else 0,
                                tuple(self._step_h.sum(1).tolist()), tuple(self._step_m.sum(1).tolist()),
                                schedule=self.schedule, batch=B, context_len=self.context_len + self.step_index)
        self.step_index += 1
        self.log.add(rec)

    # -- results ----------------------------------------------------------------------------------------------
    def counters(self) -> dict:
        """Per decode step, layer and request, (steps, n_layers, B) int64 arrays: ``cache_hits`` (selected entries
        already in the device pool), ``cache_misses`` (copied host -> device) and ``host_to_device_bytes`` (the
        misses' bytes) -- the counter names of vLLM's HiSparse."""
        nl, B = self.n_layers, getattr(self, "batch", 0)
        stack = lambda xs: np.stack(xs) if xs else np.zeros((0, nl, B), np.int64)       # noqa: E731
        return {"cache_hits": stack(self._hits), "cache_misses": stack(self._misses),
                "host_to_device_bytes": stack(self._bytes)}

    def frame(self):
        """The counters as a table: one row per step and layer (summed over the batch's requests)."""
        import pandas as pd
        c = self.counters()
        steps, nl = c["cache_hits"].shape[:2]
        rows = [(t, l, *(int(c[k][t, l].sum()) for k in ("cache_hits", "cache_misses", "host_to_device_bytes")))
                for t in range(steps) for l in range(nl)]
        return pd.DataFrame(rows, columns=["step", "layer", "cache_hits", "cache_misses", "host_to_device_bytes"])

    def trace(self):
        """The recorded top-K sets as an :class:`ess.traces.Trace` (``record_trace=True``)."""
        if self._recorder is None:
            raise ValueError("this cache records no trace: make it with record_trace=True, and decode at least "
                             "one step")
        return self._recorder.to_trace()

    def close(self) -> None:
        """Stop the link (its copy worker)."""
        if self.link is not None:
            self.link.close()
