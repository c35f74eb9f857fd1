"""Decoding runs of a transformers model through a :class:`~ess.hf.cache.SparseCache` (or its own dense cache), the
trace recorder, and the ``ess record-trace`` command.

* :func:`decode` -- prefill (in chunks, with a progress bar when asked), then one forward per step through a
  SparseCache, greedy or teacher-forced (``feed``); returns an :class:`HFRun` with the tokens, every step's
  logits, the counters and the per-step metrics. ``model.generate(ids, cache=SparseCache(...))`` decodes the same
  tokens; this loop also keeps the logits and times the steps;
* :func:`dense_decode` -- the same loop with transformers' own SDPA attention and ``DynamicCache`` (the dense
  baseline; for a DSA model transformers' dense-masked top-K);
* :func:`record_trace` -- a model's top-K selections as an :class:`ess.traces.Trace` (for the cache simulation and
  the simulator); :func:`run_command` runs ``ess record-trace`` (its flags: ``ess record-trace --help``).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .. import validate
from ..engine.config import DecodeConfig
from .cache import SparseCache
from .models import model_info

__all__ = ["HFRun", "prefill", "decode", "dense_decode", "record_trace", "run_command", "PREFILL_CHUNK"]

# design choice: prompts longer than this are prefilled in chunks of this many tokens (a progress bar per chunk);
# the chunk bounds the prefill's attention scores at chunk x context floats per head
PREFILL_CHUNK = 2048


@dataclass
class HFRun:
    """One decoding run: ``tokens`` (B, steps + 1) the input token of every step then the last step's choice;
    ``logits`` (B, steps, V) float32 of every step (``None`` unless kept); ``first_logits`` (B, V) after the prompt;
    ``cache`` the :class:`SparseCache` (``None`` for dense runs: its counters, metrics log, timer and trace);
    ``prefill_s`` and ``step_s`` (steps,) seconds."""

    tokens: np.ndarray
    logits: torch.Tensor | None
    first_logits: torch.Tensor
    cache: SparseCache | None
    prefill_s: float
    step_s: np.ndarray

    @property
    def counters(self) -> dict:
        return self.cache.counters() if self.cache is not None else {}


def _ids(model, input_ids) -> torch.Tensor:
    if isinstance(input_ids, (list, tuple)):
        lens = {len(r) if isinstance(r, (list, tuple)) else -1 for r in input_ids}
        if -1 in lens:
            raise TypeError("input_ids must be a (B, T) tensor or a list of token-id lists")
        if len(lens) > 1:
            raise ValueError(f"input_ids: every prompt must have the same length (no padding), got lengths "
                             f"{sorted(lens)}")
        input_ids = torch.tensor(input_ids, dtype=torch.long)
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"input_ids must be a (B, T) integer tensor, got {type(input_ids).__name__}")
    if input_ids.ndim != 2 or 0 in input_ids.shape:
        raise ValueError(f"input_ids must have shape (B >= 1, T >= 1), got {tuple(input_ids.shape)}")
    V = model.config.vocab_size
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= V:
        raise ValueError(f"input_ids must be token ids in [0, {V}), got values in [{int(input_ids.min())}, "
                         f"{int(input_ids.max())}]")
    return input_ids.long().to(next(model.parameters()).device)


def _feed(feed, B: int, steps: int):
    if feed is None:
        return None
    feed = torch.as_tensor(np.asarray(feed), dtype=torch.long)
    if feed.shape != (B, steps + 1):
        raise ValueError(f"feed must have shape (B={B}, steps + 1={steps + 1}): the token fed at each step, then "
                         f"the one scored after the last; got {tuple(feed.shape)}")
    return feed


def prefill(model, input_ids, cache, *, progress: bool = False, chunk: int | None = PREFILL_CHUNK):
    """The dense prefill of prompts ``input_ids`` (B, T) into ``cache`` (a :class:`SparseCache` or transformers'
    own), in chunks of ``chunk`` tokens (``None``: one forward, whose causal attention needs no mask: torch's fused
    kernel, faster for a long prompt, without a progress bar) with a progress bar when ``progress`` and the prompt
    is longer than one chunk; only the last position's logits are computed. Returns ``(logits (B, V) after the
    prompt, seconds)``."""
    from tqdm.auto import tqdm
    ids = _ids(model, input_ids)
    T = ids.shape[1]
    step = T if chunk is None else validate.positive_int("chunk", chunk)
    chunks = [(s, min(s + step, T)) for s in range(0, T, step)]
    if len(chunks) > 1 and chunks[-1][1] - chunks[-1][0] == 1:          # a 1-token chunk would read as a decode
        chunks[-2:] = [(chunks[-2][0], T)]
    t0 = time.perf_counter()
    with torch.no_grad():
        bar = tqdm(total=T, desc="prefill", unit="tok", disable=not progress or len(chunks) == 1, file=sys.stderr)
        for s, e in chunks:
            out = model(input_ids=ids[:, s:e], cache=cache, use_cache=True, logits_to_keep=1)
            bar.update(e - s)
        bar.close()
    return out.logits[:, -1].float(), time.perf_counter() - t0


def _loop(model, ids, steps, cache, feed, keep_logits, progress) -> HFRun:
    B = ids.shape[0]
    dev = ids.device
    kept = []
    first, prefill_s = prefill(model, ids, cache, progress=progress)
    with torch.no_grad():
        tokens = np.zeros((B, steps + 1), np.int64)
        tokens[:, 0] = (feed[:, 0] if feed is not None else first.argmax(-1)).cpu().numpy()
        times = np.zeros(steps)
        for t in range(steps):
            t1 = time.perf_counter()
            out = model(input_ids=torch.as_tensor(tokens[:, t:t + 1], device=dev), cache=cache, use_cache=True)
            lg = out.logits[:, -1].float()
            times[t] = time.perf_counter() - t1
            tokens[:, t + 1] = (feed[:, t + 1] if feed is not None else lg.argmax(-1)).cpu().numpy()
            if keep_logits:
                kept.append(lg.cpu())
    logits = torch.stack(kept, 1) if kept else None
    return HFRun(tokens, logits, first.cpu(), cache if isinstance(cache, SparseCache) else None, prefill_s, times)


def decode(model, input_ids, steps: int, config: DecodeConfig | None = None, *, feed=None, keep_logits: bool = True,
           entry_dtype: str = "fp8", on_step=None, record_trace: bool = False, progress: bool = False,
           **settings) -> HFRun:
    """Decode ``steps`` tokens of prompts ``input_ids`` ((B, T) token ids, one length) sparsely through a
    :class:`SparseCache` set by ``config`` (or its fields as keywords); ``feed`` (B, steps + 1) teacher-forces the
    tokens. The cache's link is stopped at the end (its counters, metrics and trace stay readable)."""
    steps = validate.positive_int("steps", steps)
    ids = _ids(model, input_ids)
    feed = _feed(feed, ids.shape[0], steps)
    keep_logits = validate.boolean("keep_logits", keep_logits)
    cache = SparseCache(model, config, max_new_tokens=steps, entry_dtype=entry_dtype, on_step=on_step,
                        record_trace=record_trace, **settings)
    try:
        return _loop(model, ids, steps, cache, feed, keep_logits, progress)
    finally:
        cache.close()


def dense_decode(model, input_ids, steps: int, *, feed=None, keep_logits: bool = True,
                 progress: bool = False) -> HFRun:
    """The same loop as :func:`decode` with transformers' own SDPA attention over its ``DynamicCache`` (the model's
    attention is switched to ``"sdpa"`` for the run and back after)."""
    model_info(model)
    steps = validate.positive_int("steps", steps)
    ids = _ids(model, input_ids)
    feed = _feed(feed, ids.shape[0], steps)
    from transformers import DynamicCache
    before = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        return _loop(model, ids, steps, DynamicCache(config=model.config), feed,
                     validate.boolean("keep_logits", keep_logits), progress)
    finally:
        model.set_attn_implementation(before)


def record_trace(model, input_ids, steps: int, *, feed=None, topk: int | None = None, progress: bool = False,
                 meta: dict | None = None):
    """The top-K sets ``model`` selects at each of ``steps`` decode steps of prompts ``input_ids`` (every layer,
    every request; with the LRU-Warmup windows), as an :class:`ess.traces.Trace`. Offload does not change the
    selection, so the run keeps every entry resident. ``feed`` teacher-forces (real text, not a generated loop)."""
    run = decode(model, input_ids, steps, feed=feed, keep_logits=False, record_trace=True, progress=progress,
                 offload=False, topk=topk, timing=False)
    trace = run.cache.trace()
    trace.meta.update({"prefill_s": run.prefill_s, "decode_s": float(run.step_s.sum()), **(meta or {})})
    return trace


def _load(path: str):
    """``(model, tokenizer)`` from ``--model``: ``smollm2`` (ess's GGUF file), a ``.gguf`` file, or a folder
    transformers loads (offline)."""
    import os
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from .models import load_smollm2
    if path == "smollm2":
        return load_smollm2()
    p = Path(path)
    if not p.exists():
        raise ValueError(f"--model {path}: no such file or folder (a transformers model folder, a .gguf file, or "
                         f"'smollm2')")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    kw = {"gguf_file": p.name} if p.suffix == ".gguf" else {}
    folder = str(p.parent if p.suffix == ".gguf" else p)
    tok = AutoTokenizer.from_pretrained(folder, **kw)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kw)
    return model.eval(), tok


def run_command(args) -> Path:
    """``ess record-trace`` (``args``: its parsed flags): load the model, read real text (:func:`ess.llm.reference_text_ids`, teacher-forced),
    record, write the trace atomically; returns its path."""
    from ..llm import reference_text_ids
    if args.out.suffix != ".npz":
        raise ValueError(f"--out must end in .npz, got {args.out}")
    context = validate.positive_int("--context", args.context)
    steps = validate.positive_int("--steps", args.steps)
    batch = validate.positive_int("--batch", args.batch)
    model, tok = _load(args.model)
    text = [reference_text_ids(tok, context + steps + 1, skip_tokens=args.skip + b * args.stride)
            for b in range(batch)]
    ids = torch.tensor([t[:context] for t in text])
    feed = np.array([t[context:] for t in text], np.int64)
    t0 = time.perf_counter()
    trace = record_trace(model, ids, steps, feed=feed, topk=args.topk, progress=True,
                         meta={"model_path": str(args.model), "text": "pydoc_data.topics (ess.llm.reference_text)",
                               "decode": "teacher forced"})
    trace.meta["seconds"] = time.perf_counter() - t0
    trace.save(args.out)
    print(f"wrote {args.out}: context {trace.context_len}, {trace.steps} steps, K {trace.k}, batch {trace.batch}, "
          f"{trace.n_layers} layers; recorded in {trace.meta['seconds']:.0f} s")
    return args.out
