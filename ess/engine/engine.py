"""The decode engine: a real pretrained model (SmolLM2-135M-Instruct, :mod:`ess.llm`) decoding with DSA-style sparse
attention while its K/V entries live in the tiered cache.

* :meth:`DecodeEngine.prefill` -- dense prefill of a batch of prompts; every token's K/V entries (all layers) and
  indexer keys are kept, and the queries of the last ``W`` prompt positions (LRU-Warmup's windows);
* :meth:`DecodeEngine.start` -- a :class:`DecodeSession` that decodes with sparse attention, one step at a time,
  as a :class:`~ess.engine.config.DecodeConfig` says: per step and layer the indexer picks K entries (K = L/16 by
  default), the cache plans, copies and commits them, attention reads the device pool, and the new token goes back
  to the host pool. ``offload=True``: a :class:`ess.storage.TieredCache` (the host pool holds every entry -- on the CPU
  the prompt's entries shared with the prefill, :mod:`ess.engine.shared_prompt` --, the
  device pool ``ratio`` of them under ``policy``, seeded by LRU-Warmup); ``offload=False``: a
  :class:`ess.storage.ResidentCache` (every entry on the device) -- the same step, bit for bit the same logits;
  :meth:`DecodeEngine.decode` runs a session to the end;
* :meth:`DecodeEngine.decode_dense` -- the model's dense decoding from the same prefill (the baseline sparse
  decoding is compared with).

A step is the model's wiring (:mod:`ess.engine.wiring`) run by :func:`ess.decode.run_layer` under a schedule
(``"none"``, ``"da"``, ``"dba"``) on a link (:mod:`ess.link`: on the CPU a copy worker emulating a link of
``link_GB_per_s``; on CUDA a copy stream). The model's device is the engine's: the indexer keys, the device pool
and the attention are torch tensors there, the same code on the CPU and on CUDA. Every operation is timed
(:class:`ess.metrics.OpTimer`) and every step reported to the :class:`ess.metrics.DecodeMetricsLog` (``on_step``
subscribes to it).

Glossary: B batch, L context length (prompt tokens at the first step), K top-k, W warmup windows.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from .. import validate
from ..attention import topk_indices
from ..decode import run_layer, write_back
from ..kernels.gqa_indexer import gqa_indexer_scores
from ..layout import pool_slots
from ..link import CLOCKS, SyncLink, make_link
from ..llm.generate import prompt_ids
from ..llm.inputs import as_token_batch
from ..metrics import DecodeMetricsLog, DecodeStepMetrics, MetricsLog, OpTimer
from ..storage import ResidentCache, TieredCache
from .attention import StepAttention
from .config import TOPK_DIVISOR, WARMUP_WINDOWS, DecodeConfig, default_topk
from .indexer import IndexerCache, quantize_keys
from .kv import kv_entries, kv_entry_format, kv_view
from .shared_prompt import PromptSharingCache
from .wiring import KVWiring

__all__ = ["TOPK_DIVISOR", "WARMUP_WINDOWS", "default_topk", "Prefilled", "DecodeRun", "DecodeEngine",
           "DecodeSession", "DenseSession"]


@dataclass
class Prefilled:
    """A batch of prompts after the dense prefill, everything decoding needs (the engine never changes it, so one
    prefill serves many runs).

    ``prompt_ids`` per request; ``entries`` per request ``(n_layers, L, entry_bytes)`` uint8 K/V entries (host);
    ``index_codes`` / ``index_scales`` per request the indexer keys (:func:`ess.engine.indexer.quantize_keys`);
    ``tail_queries`` per request ``(n_layers, W, H, hd)`` the queries of the last W prompt positions;
    ``first_logits`` (B, V) after each prompt; ``dense_cache`` the dense K/V cache (for :meth:`decode_dense`), or
    None; ``prefill_s`` seconds."""

    prompt_ids: list
    entries: list
    index_codes: list
    index_scales: list
    tail_queries: list
    first_logits: torch.Tensor
    dense_cache: object
    prefill_s: float
    _windows: dict = field(default_factory=dict, repr=False)      # (K, request of the whole prefill) -> windows
    _origin: list | None = field(default=None, repr=False)          # each request's index in the whole prefill

    def __post_init__(self):
        if self._origin is None:
            self._origin = list(range(len(self.prompt_ids)))

    @property
    def batch(self) -> int:
        return len(self.prompt_ids)

    @property
    def lengths(self) -> list:
        return [len(p) for p in self.prompt_ids]

    def select(self, rows: Sequence[int]) -> "Prefilled":
        """The same prefill for requests ``rows`` only (shares the arrays and the warmup windows; no dense
        cache)."""
        rows = [validate.integer("rows[i]", r, lo=0, below=self.batch) for r in rows]
        if not rows:
            raise ValueError("rows must name at least one request")
        pick = lambda xs: [xs[r] for r in rows]                                  # noqa: E731
        return Prefilled(pick(self.prompt_ids), pick(self.entries), pick(self.index_codes), pick(self.index_scales),
                         pick(self.tail_queries), self.first_logits[rows], None, self.prefill_s, self._windows,
                         pick(self._origin))


@dataclass
class DecodeRun:
    """The result of :meth:`DecodeEngine.decode` (or :meth:`~DecodeEngine.decode_dense`).

    ``tokens`` (B, steps + 1): the input token of every step, then the last step's choice (greedy: each the argmax
    of the logits before it; with ``feed``: the fed tokens); ``logits`` (B, steps, V) of every step when kept;
    ``logprobs`` (B, steps) of the next fed token (``feed[:, t + 1]``) when fed; ``metrics`` per step;
    ``timer`` per operation; ``link_records`` one dict per link job (:class:`ess.link.Transfer`'s fields);
    ``cache_metrics`` per (request, layer, step) of the cache;
    ``trace`` the recorded index sets (when a recorder was given); ``config`` what ran (the
    :class:`~ess.engine.config.DecodeConfig`'s fields and the run's sizes); ``hits`` and ``misses``
    (steps, n_layers, B) per request (sparse decoding only)."""

    tokens: np.ndarray
    logits: torch.Tensor | None
    logprobs: np.ndarray | None
    metrics: DecodeMetricsLog
    timer: OpTimer
    link_records: list
    cache_metrics: MetricsLog | None
    trace: object
    config: dict
    hits: np.ndarray | None = None
    misses: np.ndarray | None = None

    def step_times(self) -> np.ndarray:
        """Seconds of each step (on the run's clock)."""
        return np.array([r.step_s for r in self.metrics.records])


class DecodeEngine:
    """Decodes a :class:`ess.llm.LlamaModel` through the tiered cache (see the module docstring).

    The model's device (``"cpu"`` or ``"cuda"``) is the engine's: the device pool, the indexer keys and the
    attention live there; on CUDA the host pool is pinned and copies run on a copy stream."""

    def __init__(self, model, tokenizer=None):
        from ..llm.llama import LlamaModel
        if not isinstance(model, LlamaModel):
            raise TypeError(f"model must be an ess.llm.LlamaModel, got {type(model).__name__}")
        if model.dtype != torch.float32:
            raise ValueError(f"the engine's K/V entries are float32; the model computes in {model.dtype}")
        self.model, self.tokenizer, self.config = model, tokenizer, model.config
        self.device = str(model.device)
        self.format = kv_entry_format(self.config)

    @classmethod
    def load(cls, path=None, *, device: str = "cpu", cache_dir="default",
             extrapolate_context_to: int | None = None) -> "DecodeEngine":
        """An engine for the installed SmolLM2-135M-Instruct (or the GGUF file at ``path``), loaded with
        :func:`ess.llm.load_model`: a missing file is a ``FileNotFoundError`` that says how to install it, a
        truncated or corrupt one an :class:`ess.llm.ModelFileError`, a device that is not there a ``ValueError``,
        all before any decoding. ``extrapolate_context_to`` (**benchmarks only: the output past the trained context
        is not meaningful**): see :func:`ess.llm.load_model`."""
        from ..llm import load_model
        kw = {} if isinstance(cache_dir, str) and cache_dir == "default" else {"cache_dir": cache_dir}
        lm = load_model(path, device=device, extrapolate_context_to=extrapolate_context_to, **kw)
        return cls(lm.model, lm.tokenizer)

    @property
    def trained_context_length(self) -> int:
        """The context the model was trained for (the engine's context is longer only when extrapolated)."""
        return self.model.trained_context_length

    # -- prefill ------------------------------------------------------------------------------------------------
    def prefill(self, prompts, *, max_new_tokens: int, windows: int = WARMUP_WINDOWS,
                keep_dense: bool = False) -> Prefilled:
        """Dense prefill of a batch of prompts (text, chat messages or token ids each, :func:`ess.llm.prompt_ids`;
        or a (B, T) array of ids), keeping what sparse decoding needs.

        Checked before any model work: a non-empty batch, every prompt non-empty and short enough that it plus
        ``max_new_tokens`` fits the model's context. ``keep_dense`` keeps the dense K/V cache for
        :meth:`decode_dense`."""
        ids = self._prompt_batch(prompts)
        max_new_tokens = validate.positive_int("max_new_tokens", max_new_tokens)
        windows = validate.positive_int("windows", windows)
        keep_dense = validate.boolean("keep_dense", keep_dense)
        ctx = self.config.context_length
        for b, p in enumerate(ids):
            if len(p) + max_new_tokens > ctx:
                raise ValueError(f"prompts[{b}] has {len(p)} tokens; with max_new_tokens={max_new_tokens} that "
                                 f"exceeds the model's context of {ctx} tokens")
        c = self.config
        lengths = [len(p) for p in ids]
        W = min(windows, min(lengths))
        per_layer: list = [None] * c.n_layers

        def observe(layer, q, k, v):
            ent = kv_entries(k, v).cpu()                                               # (B, T, E)
            codes, scales = quantize_keys(k.transpose(1, 2))                           # (B, T, Hkv hd), (B, T, Hkv)
            tails = [q[b, :, n - W:n].transpose(0, 1).cpu() for b, n in enumerate(lengths)]   # (W, H, hd)
            per_layer[layer] = (ent, codes.cpu(), scales.cpu(), tails)

        t0 = time.perf_counter()
        logits, cache = self.model.prefill(ids, capacity=max(lengths) + (max_new_tokens if keep_dense else 0),
                                           observe=observe)
        seconds = time.perf_counter() - t0
        B = len(ids)
        entries = [torch.stack([per_layer[l][0][b, :n] for l in range(c.n_layers)]) for b, n in enumerate(lengths)]
        codes = [torch.stack([per_layer[l][1][b, :n] for l in range(c.n_layers)]) for b, n in enumerate(lengths)]
        scales = [torch.stack([per_layer[l][2][b, :n] for l in range(c.n_layers)]) for b, n in enumerate(lengths)]
        tails = [torch.stack([per_layer[l][3][b] for l in range(c.n_layers)]) for b in range(B)]
        pre = Prefilled(ids, entries, codes, scales, tails, logits.detach(), cache if keep_dense else None, seconds)
        per_layer.clear()
        del cache
        release_freed_memory()
        return pre

    def _prompt_batch(self, prompts) -> list:
        if isinstance(prompts, (np.ndarray, torch.Tensor)):
            if prompts.ndim != 2 or prompts.shape[0] == 0:
                raise ValueError(f"prompts as an array must be (B >= 1, T) token ids, got shape {tuple(prompts.shape)}")
            prompts = [list(map(int, row)) for row in prompts]
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise TypeError(f"prompts must be a list of prompts (one per request), got {type(prompts).__name__}")
        if len(prompts) == 0:
            raise ValueError("prompts is an empty batch: pass at least one prompt")
        out = []
        for b, p in enumerate(prompts):
            if isinstance(p, str) or (isinstance(p, Sequence) and p and isinstance(p[0], dict)):
                if self.tokenizer is None:
                    raise TypeError(f"prompts[{b}] is text, but the engine has no tokenizer: pass token ids")
                p = prompt_ids(self.tokenizer, p, name=f"prompts[{b}]")
            ids, _ = as_token_batch(p, self.config.vocab_size, 1 << 62, f"prompts[{b}]")   # length: prefill
            if ids.shape[0] != 1:
                raise ValueError(f"prompts[{b}] must be one sequence of token ids")
            out.append(ids[0].tolist())
        return out

    # -- the warmup windows -------------------------------------------------------------------------------------
    def windows(self, pre: Prefilled, topk: int, *, backend: str = "auto") -> list:
        """Per request ``(n_layers, W, K)`` int64: the indexer's top-K at each of the last W prompt positions (over
        the tokens before it), in position order, -1 padded -- LRU-Warmup's windows (cached per K and request, also
        for the prefills :meth:`Prefilled.select` makes). The same kernels as a decode step (``backend``)."""
        out = []
        for b, n in enumerate(pre.lengths):
            key = (topk, pre._origin[b])
            if key in pre._windows:
                out.append(pre._windows[key])
                continue
            dev = self.model.device
            q = pre.tail_queries[b].to(dev)                                            # (n_layers, W, H, hd)
            W = q.shape[1]
            win = np.full((self.config.n_layers, W, topk), -1, np.int64)
            for layer in range(self.config.n_layers):
                codes = pre.index_codes[b][layer][None].to(dev)                        # (1, n, Hkv hd)
                scales = pre.index_scales[b][layer][None].to(dev)                      # (1, n, Hkv)
                for w in range(W):
                    t = n - W + w                                                      # the query's position
                    if t == 0:
                        continue
                    s = gqa_indexer_scores(q[layer, w][None].contiguous(), codes, scales,
                                           torch.tensor([t], device=dev), backend=backend)    # (1, n)
                    win[layer, w] = topk_indices(s, topk, backend=backend)[0].cpu().numpy()
            pre._windows[key] = win
            out.append(win)
        return out

    # -- sparse decoding ----------------------------------------------------------------------------------------
    def start(self, pre: Prefilled, steps: int, config: DecodeConfig | None = None, *, feed=None, recorder=None,
              on_step: Callable | None = None, **settings) -> "DecodeSession":
        """A session that decodes ``steps`` tokens per request with sparse attention as ``config`` says (a
        :class:`~ess.engine.config.DecodeConfig`; or its fields as keywords, ``settings``, which build one), one
        :meth:`DecodeSession.step` at a time (:meth:`decode` runs them all).

        Per run, besides the configuration: ``feed`` (B, steps + 1) token ids to feed instead of the greedy choices
        (teacher forcing; log-probabilities of the fed tokens are kept); ``recorder`` an
        :class:`ess.traces.TraceRecorder` that sees every step's index sets (and the warmup windows); ``on_step``
        called with each step's :class:`ess.metrics.DecodeStepMetrics`.

        Everything is checked, and the pool sized (a ratio whose pool cannot hold one step's K entries is a
        ``ValueError``), before anything is allocated or decoded."""
        if config is None:
            config = DecodeConfig(**settings)
        elif settings:
            raise TypeError(f"pass a DecodeConfig or its fields as keywords, not both (got config and "
                            f"{sorted(settings)})")
        elif not isinstance(config, DecodeConfig):
            raise TypeError(f"config must be an ess.engine.DecodeConfig, got {type(config).__name__}")
        return DecodeSession(self, pre, steps, config, feed=feed, recorder=recorder, on_step=on_step)

    def decode(self, pre: Prefilled, steps: int, config: DecodeConfig | None = None, **kwargs) -> DecodeRun:
        """Decode ``steps`` tokens per request with sparse attention: :meth:`start` (every argument, see there)
        then every step. Returns the :class:`DecodeRun`."""
        session = self.start(pre, steps, config, **kwargs)
        try:
            while not session.done:
                session.step()
        finally:
            run = session.close()
        return run

    def _feed(self, feed, B: int, steps: int):
        if feed is None:
            return None
        arr = np.asarray(feed.cpu() if isinstance(feed, torch.Tensor) else feed)
        if not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"feed must hold integer token ids, got dtype {arr.dtype}")
        if arr.shape != (B, steps + 1):
            raise ValueError(f"feed must have shape (B={B}, steps + 1 = {steps + 1}), got {arr.shape}")
        if arr.min() < 0 or arr.max() >= self.config.vocab_size:
            raise ValueError(f"feed holds ids outside the vocabulary [0, {self.config.vocab_size})")
        return arr.astype(np.int64)

    def _run_facts(self, pre: Prefilled, steps: int) -> dict:
        """What every run's record says about the context beyond its configuration."""
        end = max(pre.lengths) + steps
        return {"trained_context": self.trained_context_length,
                "output_meaningful": end <= self.trained_context_length}

    # -- the dense baseline ---------------------------------------------------------------------------------------
    def start_dense(self, pre: Prefilled, steps: int, *, feed=None, keep_logits: bool = False,
                    clock: str = "wall") -> "DenseSession":
        """A session of the model's own dense decoding from the same prefill (needs ``keep_dense=True`` at
        prefill): every step attends over every cached token; :meth:`decode_dense` runs it to the end."""
        return DenseSession(self, pre, steps, feed=feed, keep_logits=keep_logits, clock=clock)

    def decode_dense(self, pre: Prefilled, steps: int, *, feed=None, keep_logits: bool = False,
                     clock: str = "wall") -> DecodeRun:
        """The model's own dense decoding (:meth:`start_dense`) to the end. Same outputs as :meth:`decode` (no cache
        metrics); ``clock`` as there."""
        session = self.start_dense(pre, steps, feed=feed, keep_logits=keep_logits, clock=clock)
        while not session.done:
            session.step()
        return session.close()


class _Session:
    """What a dense and a sparse decode run in progress share: the tokens (greedy or fed), the kept logits and
    log-probabilities, the step metrics and the step loop (:meth:`step` times :meth:`_decode_step`)."""

    def _begin(self, engine: DecodeEngine, pre: Prefilled, steps: int, feed, keep_logits: bool, clock: str):
        self.engine, self.steps, self.B = engine, steps, pre.batch
        self.feed = engine._feed(feed, pre.batch, steps)
        self.clock = CLOCKS[validate.one_of("clock", clock, tuple(CLOCKS))]
        self.tokens = np.zeros((pre.batch, steps + 1), np.int64)
        self.tokens[:, 0] = (self.feed[:, 0] if self.feed is not None
                             else torch.argmax(pre.first_logits, -1).cpu().numpy())
        self.logits_kept = [] if keep_logits else None
        self.logprobs = np.zeros((pre.batch, steps)) if self.feed is not None else None
        self.log = DecodeMetricsLog()
        self.context_len = max(pre.lengths)
        self.t = 0
        self._run = None

    @property
    def done(self) -> bool:
        return self.t >= self.steps

    def step(self) -> DecodeStepMetrics:
        """Decode the next token of every request; returns (and logs) the step's metrics. A ``RuntimeError`` after
        :meth:`close` (the run is final) or past the last step."""
        if self._run is not None:
            raise RuntimeError(f"the session is closed (after {self.t} of its {self.steps} steps): start a new one")
        if self.done:
            raise RuntimeError(f"the session has decoded its {self.steps} steps")
        t, B = self.t, self.B
        self.timer.step = t
        t0 = self.clock()
        with torch.no_grad():
            logits = self._decode_step(self.tokens[:, t])                                # (B, V)
        step_s = self.clock() - t0
        nxt = self.feed[:, t + 1] if self.feed is not None else torch.argmax(logits, dim=-1).cpu().numpy()
        self.tokens[:, t + 1] = nxt
        if self.logits_kept is not None:
            self.logits_kept.append(logits.cpu())
        if self.logprobs is not None:
            lp = torch.log_softmax(logits.double(), dim=-1).cpu()
            self.logprobs[:, t] = lp[torch.arange(B), torch.as_tensor(nxt)].numpy()
        rec = self._metrics(t, step_s)
        self.t += 1
        self.log.add(rec)
        return rec

    def _run_record(self, link_records, cache_metrics, trace, hits=None, misses=None) -> DecodeRun:
        n = self.t
        logits = torch.stack(self.logits_kept, dim=1) if self.logits_kept else None
        return DecodeRun(self.tokens[:, :n + 1], logits, None if self.logprobs is None else self.logprobs[:, :n],
                         self.log, self.timer, link_records, cache_metrics, trace, {**self.config, "steps": n},
                         hits, misses)


class DenseSession(_Session):
    """One dense decode run in progress (:meth:`DecodeEngine.start_dense`): :meth:`step` decodes the next token of
    every request over the whole dense K/V cache (a copy of the prefill's), :meth:`close` returns the
    :class:`DecodeRun`."""

    def __init__(self, engine: DecodeEngine, pre: Prefilled, steps: int, *, feed=None, keep_logits: bool = False,
                 clock: str = "wall"):
        if not isinstance(pre, Prefilled):
            raise TypeError(f"pre must be a Prefilled (DecodeEngine.prefill), got {type(pre).__name__}")
        if pre.dense_cache is None:
            raise ValueError("this prefill kept no dense cache: prefill with keep_dense=True")
        steps = validate.positive_int("steps", steps)
        keep_logits = validate.boolean("keep_logits", keep_logits)
        if max(pre.lengths) + steps > pre.dense_cache.capacity:
            raise ValueError(f"the dense cache holds {pre.dense_cache.capacity} tokens per request, fewer than the "
                             f"longest prompt ({max(pre.lengths)}) + steps ({steps})")
        self._begin(engine, pre, steps, feed, keep_logits, clock)
        self.timer = OpTimer(clock=self.clock)
        self.cache = _clone_cache(pre.dense_cache)
        self.config = {"mode": "dense", "batch": self.B, "context_len": self.context_len, "steps": steps,
                       "clock": clock, "device": engine.device, **engine._run_facts(pre, steps)}

    def _decode_step(self, tokens: np.ndarray) -> torch.Tensor:
        with self.timer.span("dense_step"):
            return self.engine.model.decode(tokens.tolist(), self.cache)

    def _metrics(self, t: int, step_s: float) -> DecodeStepMetrics:
        return DecodeStepMetrics(t, step_s, 0.0, 0.0, 0, 0, (), (), schedule="dense", batch=self.B,
                                 context_len=self.context_len + t)

    def close(self) -> DecodeRun:
        """The run so far (idempotent)."""
        if self._run is None:
            self._run = self._run_record([], None, None)
        return self._run


class DecodeSession(_Session):
    """One sparse decode run in progress (:meth:`DecodeEngine.start`): its caches, link, timer and metrics.
    :meth:`step` decodes the next token of every request; :meth:`close` stops the link and returns the
    :class:`DecodeRun` (also after an error, with the steps done)."""

    def __init__(self, engine: DecodeEngine, pre: Prefilled, steps: int, config: DecodeConfig, *, feed=None,
                 recorder=None, on_step: Callable | None = None):
        if not isinstance(pre, Prefilled):
            raise TypeError(f"pre must be a Prefilled (DecodeEngine.prefill), got {type(pre).__name__}")
        steps = validate.positive_int("steps", steps)
        c, B, L = engine.config, pre.batch, max(pre.lengths)
        cfg = config
        if cfg.offload and cfg.schedule == "dba" and B < 2:
            raise ValueError("schedule 'dba' splits the batch in two halves and needs at least 2 requests")
        if L + steps > c.context_length:
            raise ValueError(f"the longest prompt ({L} tokens) + steps ({steps}) exceed the model's context of "
                             f"{c.context_length} tokens")
        K = default_topk(L) if cfg.topk is None else cfg.topk
        if K > c.context_length:                 # no step can select more; a (B, H, K) table would be allocated
            raise ValueError(f"topk={K} exceeds the model's context of {c.context_length} tokens (no step selects "
                             f"more entries than the context holds)")
        capacity = pool_slots(engine.format, cfg.ratio, L, need=min(K, L)) if cfg.offload else None
        if on_step is not None and not callable(on_step):
            raise TypeError(f"on_step must be callable, got {type(on_step).__name__}")
        _check_recorder(recorder)
        self._begin(engine, pre, steps, feed, cfg.keep_logits, cfg.clock)

        self.cfg, self.topk, self.recorder = cfg, K, recorder
        self.offload = cfg.offload
        self.schedule = cfg.schedule if cfg.offload else "none"
        self.rids = list(range(B))
        dev = engine.device
        if cfg.offload:
            # on the CPU the host pool shares the prefill's entries (never written) instead of copying them: the
            # many runs of one prefill (notebook 09's check decodes 61 at once) hold one copy of the prompt's bytes
            kind = PromptSharingCache if engine.model.device.type == "cpu" else TieredCache
            cache = kind(engine.format, capacity=capacity, policy=cfg.policy, device=dev, max_requests=B,
                         policy_options=cfg.policy_options)
            for b in self.rids:
                cache.add_request(b, pre.entries[b].numpy(), reserve_tokens=pre.lengths[b] + steps)
        else:
            cache = ResidentCache(engine.format, max_requests=B, max_tokens=L + steps, device=dev)
            for b in self.rids:
                cache.add_request(b, pre.entries[b])
        indexer = IndexerCache(c.n_layers, c.n_kv_heads, c.head_dim, max_requests=B, capacity=L + steps,
                               device=dev, backend=cfg.backend)
        for b in self.rids:
            indexer.add_request(b, pre.index_codes[b], pre.index_scales[b])
        if cfg.offload and cfg.warmup:
            for b, win in enumerate(engine.windows(pre, K, backend=cfg.backend)):
                for layer in range(c.n_layers):
                    cache.warmup(b, layer, list(win[layer]))
        if recorder is not None:
            wins = engine.windows(pre, K, backend=cfg.backend)
            for layer in range(c.n_layers):
                recorder.observe_windows(layer, np.stack([w[layer] for w in wins]))
        self.cache, self.indexer = cache, indexer
        self.pool = kv_view(cache.device_pool, c.n_kv_heads, c.head_dim)                # read in place
        self.att = StepAttention(B, K, c.n_heads, c.n_kv_heads, c.head_dim, device=dev, backend=cfg.backend)
        self.link = (make_link(cfg.link_GB_per_s, device=dev, emulate=cfg.emulate_link, clock=cfg.clock)
                     if cfg.offload else SyncLink())
        # the D2H copies of the new tokens' entries land here, one row per layer (pinned for a CUDA device)
        self.staging = torch.zeros((c.n_layers, B, engine.format.entry_bytes), dtype=torch.uint8,
                                   pin_memory=engine.model.device.type == "cuda")
        self.timer = OpTimer(cfg.timing, clock=self.clock)
        if on_step is not None:
            self.log.subscribe(on_step)
        self.hits = np.zeros((steps, c.n_layers, B), np.int64)
        self.misses = np.zeros((steps, c.n_layers, B), np.int64)
        self._step_counts = None
        self.config = {**cfg.to_dict(), "mode": "offload" if cfg.offload else "resident", "batch": B,
                       "context_len": L, "prompt_lens": list(pre.lengths), "steps": steps,
                       "entry_bytes": engine.format.entry_bytes, "topk": K,
                       "ratio": cfg.ratio if cfg.offload else 1.0, "capacity": capacity,
                       "schedule": self.schedule, "link_GB_per_s": cfg.link_GB_per_s if cfg.offload else None,
                       "link": self.link.name, "warmup": cfg.warmup and cfg.offload, "device": dev,
                       **engine._run_facts(pre, steps)}

    def _metrics(self, t: int, step_s: float) -> DecodeStepMetrics:
        hits, misses, stall, n_link = self._step_counts
        self.hits[t], self.misses[t] = hits, misses
        E, nl, B = self.engine.format.entry_bytes, self.engine.config.n_layers, self.B
        return DecodeStepMetrics(t, step_s, stall, self.link.busy_s(n_link) if self.offload else 0.0,
                                 int(misses.sum()) * E, B * nl * E if self.offload else 0,
                                 tuple(hits.sum(1).tolist()), tuple(misses.sum(1).tolist()),
                                 schedule=self.schedule, batch=B, context_len=self.context_len + t)

    def _decode_step(self, tokens: np.ndarray) -> torch.Tensor:
        """One decode step of the batch: every layer through :func:`ess.decode.run_layer`, the logits, the
        write-back and the new indexer keys. Returns the logits (B, V); keeps the step's hits and misses
        (n_layers, B), its stall and where its link jobs start for :meth:`_metrics`."""
        model, c, timer, rids = self.engine.model, self.engine.config, self.timer, self.rids
        n_link = len(self.link.records)
        B, dev = len(rids), model.device
        with timer.span("embed"):
            h = model.embed(torch.as_tensor(tokens, device=dev)[:, None])                # (B, 1, D)
            positions = torch.as_tensor([self.cache.n_tokens(r) for r in rids], device=dev)[:, None]   # (B, 1)
        new_keys = torch.empty((c.n_layers, B, c.n_kv_heads, c.head_dim), device=dev)
        new_rows = None if self.offload else torch.empty((c.n_layers, B, self.engine.format.entry_bytes),
                                                         dtype=torch.uint8, device=dev)
        hits, misses, stall = np.zeros((c.n_layers, B), np.int64), np.zeros((c.n_layers, B), np.int64), 0.0
        for layer in range(c.n_layers):
            with timer.span("pre_attn", layer):
                q, k, v = model.attention_inputs(layer, h, positions)
                wiring = KVWiring(model, layer, h, q, k, v, self.indexer, self.topk, self.pool, self.att)
            run = run_layer(self.cache, layer, rids, wiring, schedule=self.schedule, link=self.link, timer=timer,
                            staging=self.staging if self.offload else None)
            h = wiring.hidden_out
            new_keys[layer] = wiring.new_keys()
            if new_rows is not None:
                new_rows[layer] = wiring.new_entries()
            for s in run.steps:
                hits[layer, s.request_id], misses[layer, s.request_id] = s.n_hits, s.n_misses
            stall += run.stall_s
            if self.recorder is not None:
                self.recorder.observe(layer, run.indices)
        with timer.span("logits"):
            logits = model.logits(h[:, 0])                                                # (B, V)
        with timer.span("write_back"):
            if self.offload:                       # the staged entries (landed: run_layer waited for every D2H)
                write_back(self.cache, rids, self.staging.numpy().transpose(1, 0, 2))
            else:                                  # resident: the entries stay on the device
                for b in rids:
                    self.cache.append_token(b, new_rows[:, b])
            self.indexer.append_tokens(rids, new_keys)
        if self.recorder is not None:
            self.recorder.end_step()
        self._step_counts = (hits, misses, stall, n_link)
        return logits

    def close(self) -> DecodeRun:
        """Stop the link; the run so far (idempotent)."""
        if self._run is None:
            self.link.close()
            trace = self.recorder.to_trace() if self.recorder is not None and self.t else None
            self._run = self._run_record([_job_record(j) for j in self.link.records], self.cache.metrics, trace,
                                         self.hits[:self.t], self.misses[:self.t])
        return self._run


_RECORDER_METHODS = ("observe", "observe_windows", "end_step", "to_trace")


def _check_recorder(recorder) -> None:
    """``recorder`` is ``None`` or offers what the session calls (:class:`ess.traces.TraceRecorder`'s
    ``observe``, ``observe_windows``, ``end_step``, ``to_trace``); a ``TypeError`` naming it, before anything is
    built, otherwise."""
    if recorder is None:
        return
    missing = [m for m in _RECORDER_METHODS if not callable(getattr(recorder, m, None))]
    if missing or isinstance(recorder, type):                # a class, not an instance, has the methods unbound
        got = f"the class {recorder.__name__}" if isinstance(recorder, type) else type(recorder).__name__
        raise TypeError(f"recorder must be an ess.traces.TraceRecorder (or offer {', '.join(_RECORDER_METHODS)}), "
                        f"got {got}")


def release_freed_memory() -> None:
    """Give the heap memory freed so far back to the operating system (glibc's ``malloc_trim``; nothing on another C
    library). A prefill frees hundreds of MB in blocks below glibc's mmap threshold (its per-layer entries, the
    model's activations), which glibc otherwise keeps for later allocations of the same sizes: after the four
    prefills of notebook 09's check the process held 1.3 GB less with it (3.1 -> 1.8 GB RSS), and the notebook's
    peak was 0.3 GB lower (5.2 against 5.5 GB; ``/usr/bin/time``, one run each on a shared machine)."""
    import ctypes
    import sys
    if not sys.platform.startswith("linux"):
        return
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):                      # not glibc (musl has no malloc_trim)
        return
    trim(0)


def _job_record(job) -> dict:
    """A link job (:class:`ess.link.Transfer`) as a plain record."""
    return {k: getattr(job, k) for k in ("kind", "layer", "nbytes", "submit_s", "start_s", "end_s", "returned_s",
                                         "waited_s")}


def _clone_cache(cache):
    from ..llm.kv_cache import KVCache
    new = KVCache.__new__(KVCache)
    new.config = cache.config
    new.k = [t.clone() for t in cache.k]
    new.v = [t.clone() for t in cache.v]
    new.lengths = cache.lengths.clone()
    return new
