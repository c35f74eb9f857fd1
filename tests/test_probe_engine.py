"""Hostile-user probes of the decode engine, the model loader and the link (``tests/hostile.py``): ``ess.engine``
on a small random Llama model (``engine_helpers``, not the real SmolLM2), ``ess.llm`` on a tiny GGUF file written
here, ``ess.link``. Each probe does what a careless or hostile user would -- an empty or planted cache folder, a
corrupt or killed cache write, an absurd context or option, a lone surrogate, a wrong recorder, a step after close,
two threads, a forked child -- and checks the answer: a refusal must name the argument, a call that goes through must
give the right tokens or bytes. Fixed seeds; the file runs in a few seconds.
"""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np

from ess.engine import DecodeConfig, DecodeEngine
from ess.link import EmulatedLink, make_link
from ess.llm import load_model
from ess.llm.weight_cache import cache_path, load_cached, read_cache, write_cache
from ess.traces import TraceRecorder

from engine_helpers import prompts, small_engine
from hostile import Probe, ProbeError, bad_rows, run_probes
from llm_helpers import TINY, write_tiny_gguf

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
_SHARED: dict = {}


def check(ok, what):
    if not ok:
        raise ProbeError(what)


def engine():
    if "engine" not in _SHARED:
        _SHARED["engine"] = small_engine()
    return _SHARED["engine"]


def pre():
    if "pre" not in _SHARED:
        _SHARED["pre"] = engine().prefill(prompts([24, 30]), max_new_tokens=6, keep_dense=True)
    return _SHARED["pre"]


def gguf(tmp):
    path = tmp / "tiny.gguf"
    write_tiny_gguf(path, template=TEMPLATE)
    return path


def text_engine(tmp):
    lm = load_model(gguf(tmp), cache_dir=None)
    return DecodeEngine(lm.model, lm.tokenizer)


# -- the model loader and its cache -----------------------------------------------------------------------------

def empty_cache_folder(tmp):
    src = gguf(tmp)
    here = os.getcwd()
    os.chdir(tmp)
    try:
        load_model(src, cache_dir="")
    finally:
        os.chdir(here)
        check(sorted(p.name for p in tmp.iterdir()) == ["tiny.gguf"], "a file was written into the current folder")


def cache_folder_is_a_file(tmp):
    (tmp / "file").write_text("keep")
    try:
        load_model(gguf(tmp), cache_dir=tmp / "file")
    finally:
        check((tmp / "file").read_text() == "keep", "the file given as cache folder changed")


def cache_folder_as_bytes(tmp):
    load_model(gguf(tmp), cache_dir=bytes(tmp))


def cache_file_a_planted_link(tmp):
    """A link planted under the cache file's name: the cache is written in its place, the link's target is kept."""
    src = gguf(tmp)
    folder = tmp / "cache"
    folder.mkdir()
    outside = tmp / "outside"
    outside.write_bytes(b"precious")
    cache_path(src, folder).symlink_to(outside)
    lm = load_model(src, cache_dir=folder)
    check(outside.read_bytes() == b"precious", "the cache was written through a planted link")
    check(lm.model.config.n_layers == TINY.n_layers, "the model did not load")
    check(load_cached(src, folder)[1] == "hit", "the cache written in the link's place does not read back")


def corrupt_cache_is_rebuilt(tmp):
    src = gguf(tmp)
    first, _ = load_cached(src, tmp)
    path = cache_path(src, tmp)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    again, status = load_cached(src, tmp)
    check(status.startswith("built") and "corrupt" in status, f"a corrupt cache was used ({status})")
    check(all(np.array_equal(first.tensors[k], again.tensors[k]) for k in first.tensors), "other weights came back")


def kill_during_cache_write(tmp):
    """``kill -9`` of a child writing the cache: a reader finds the old cache, a whole new one, or none."""
    src = gguf(tmp)
    contents, _ = load_cached(src, None)
    path = tmp / "c" / "tiny.esscache"
    path.parent.mkdir()
    for trial in range(3):
        pid = os.fork()
        if pid == 0:
            try:
                for _ in range(10 ** 6):
                    write_cache(contents, src, path)
            finally:
                os._exit(0)
        time.sleep(0.02 + 0.02 * trial)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        if path.exists():
            got = read_cache(path, src)          # a CacheMiss here: a half-written file was left (raw)
            check(all(np.array_equal(got.tensors[k], contents.tensors[k]) for k in contents.tensors),
                  "a killed write left other weights")


def extrapolate_below_trained(tmp):
    load_model(gguf(tmp), cache_dir=None, extrapolate_context_to=TINY.context_length // 2)


def extrapolate_absurd(tmp):
    load_model(gguf(tmp), cache_dir=None, extrapolate_context_to=2 ** 45)


def extrapolate_fraction(tmp):
    load_model(gguf(tmp), cache_dir=None, extrapolate_context_to=100.5)


def model_file_is_a_folder(tmp):
    load_model(tmp, cache_dir=None)


def truncated_model_file(tmp):
    src = gguf(tmp)
    src.write_bytes(src.read_bytes()[:1000])
    load_model(src, cache_dir=None)


# -- prompts and options ----------------------------------------------------------------------------------------

def lone_surrogate_text(tmp):
    text_engine(tmp).prefill(["fine", "bad \ud800 text"], max_new_tokens=2)


def lone_surrogate_chat(tmp):
    text_engine(tmp).prefill([[{"role": "user", "content": "x\udfff"}]], max_new_tokens=2)


def text_without_tokenizer(tmp):
    engine().prefill(["some text"], max_new_tokens=2)


def token_id_past_vocabulary(tmp):
    engine().prefill([[1, 2, 10 ** 6]], max_new_tokens=2)


def float_token_ids(tmp):
    engine().prefill([[1.5, 2.0]], max_new_tokens=2)


def max_new_tokens_fraction(tmp):
    engine().prefill(prompts([8]), max_new_tokens=2.5)


def prompt_past_the_context(tmp):
    engine().prefill(prompts([500]), max_new_tokens=100)


def keep_dense_as_text(tmp):
    engine().prefill(prompts([8]), max_new_tokens=2, keep_dense="no")


def ratio_zero(tmp):
    DecodeConfig(ratio=0.0)


def ratio_nan(tmp):
    DecodeConfig(ratio=float("nan"))


def link_speed_negative(tmp):
    DecodeConfig(link_GB_per_s=-1.0)


def topk_absurd(tmp):
    engine().start(pre(), 2, topk=2 ** 40)


def ratio_too_small_for_k(tmp):
    engine().start(pre(), 2, ratio=1e-6)


def steps_past_the_context(tmp):
    engine().start(pre(), 10 ** 6)


def feed_of_floats(tmp):
    engine().start(pre(), 2, feed=np.zeros((2, 3)))


def wrong_recorder(tmp):
    engine().start(pre(), 2, recorder="a trace")


def recorder_class_not_instance(tmp):
    engine().start(pre(), 2, recorder=TraceRecorder)


def step_after_close(tmp):
    s = engine().start(pre(), 3, offload=True, link_GB_per_s=50.0)
    s.step()
    s.close()
    s.step()


def dense_step_after_close(tmp):
    s = engine().start_dense(pre(), 3)
    s.step()
    s.close()
    s.step()


def config_and_settings_both(tmp):
    engine().start(pre(), 2, DecodeConfig(), ratio=0.5)


# -- concurrency, forks and the link ----------------------------------------------------------------------------

def two_threads_decode_as_one(tmp):
    eng, p = engine(), pre()
    want = eng.decode(p, 4, ratio=0.5, schedule="da", link_GB_per_s=50.0).tokens
    outs = [None, None]

    def run(i):
        outs[i] = eng.decode(p, 4, ratio=0.5, schedule="da", link_GB_per_s=50.0, clock="cpu").tokens
    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(all(o is not None and np.array_equal(o, want) for o in outs), "two threads decoded other tokens")


def link_cpu_clock_second_thread(tmp):
    with EmulatedLink(1.0, clock="cpu") as link:
        end = time.thread_time() + 0.2
        while time.thread_time() < end:
            pass
        buf = np.zeros(10, np.uint8)
        link.submit("h2d", 0, [(lambda: buf.fill(1), 10)]).wait()
        box = {}

        def run():
            job = link.submit("h2d", 0, [(lambda: buf.fill(2), 10)])
            job.wait()
            box["job"] = job
        t = threading.Thread(target=run)
        t.start()
        t.join()
        job = box["job"]
        check(job.start_s == job.submit_s and job.waited_s < 0.1, f"a 10-byte job queued {job.start_s - job.submit_s} s")
        check(buf[0] == 2, "the bytes did not move")


def link_used_by_forked_child(tmp):
    with EmulatedLink(1.0) as link:
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                link.submit("h2d", 0, [(lambda: None, 1 << 20)]).wait()
                code = 1                          # went through with the parent's worker: not what a child gets
            except RuntimeError as exc:
                code = 0 if "forked child" in str(exc) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        check(os.waitstatus_to_exitcode(status) == 0, f"the child's submit ended in {status}")


def link_after_close(tmp):
    link = EmulatedLink(None)
    link.close()
    link.submit("h2d", 0, [(lambda: None, 10)])


def link_zero_speed(tmp):
    EmulatedLink(0.0)


def link_clock_unknown(tmp):
    make_link(10.0, clock="gpu")


def link_chunk_not_callable(tmp):
    with EmulatedLink(None) as link:
        link.submit("h2d", 0, [("copy", 10)])


def link_chunk_raises(tmp):
    """A chunk that raises: its wait re-raises that error, and the link goes on."""
    with EmulatedLink(None, inline_below_bytes=0) as link:
        def boom():
            raise ValueError("chunk failed on purpose")
        try:
            link.submit("h2d", 0, [(boom, 10)]).wait()
            raise ProbeError("a failed chunk was not reported")
        except ValueError as exc:
            check("on purpose" in str(exc), f"another error came back: {exc}")
        buf = np.zeros(4, np.uint8)
        link.submit("h2d", 0, [(lambda: buf.fill(1), 4)]).wait()
        check(buf.all(), "the link stopped after a failed job")


PROBES = [
    Probe("engine", "empty_cache_folder", empty_cache_folder, ("cache_dir",)),
    Probe("engine", "cache_folder_is_a_file", cache_folder_is_a_file, ("cache_dir",)),
    Probe("engine", "cache_folder_as_bytes", cache_folder_as_bytes, ("cache_dir",)),
    Probe("engine", "cache_file_a_planted_link", cache_file_a_planted_link),
    Probe("engine", "corrupt_cache_is_rebuilt", corrupt_cache_is_rebuilt),
    Probe("engine", "kill_during_cache_write", kill_during_cache_write),
    Probe("engine", "extrapolate_below_trained", extrapolate_below_trained, ("extrapolate_context_to",)),
    Probe("engine", "extrapolate_absurd", extrapolate_absurd, ("extrapolate_context_to",)),
    Probe("engine", "extrapolate_fraction", extrapolate_fraction, ("extrapolate_context_to",)),
    Probe("engine", "model_file_is_a_folder", model_file_is_a_folder, ("model file",),
          clear_types=(FileNotFoundError,)),
    Probe("engine", "truncated_model_file", truncated_model_file, ("tiny.gguf",), clear_types=(Exception,)),
    Probe("engine", "lone_surrogate_text", lone_surrogate_text, ("prompts[1]",)),
    Probe("engine", "lone_surrogate_chat", lone_surrogate_chat, ("prompts[0]",)),
    Probe("engine", "text_without_tokenizer", text_without_tokenizer, ("prompts[0]",)),
    Probe("engine", "token_id_past_vocabulary", token_id_past_vocabulary, ("prompts[0]",)),
    Probe("engine", "float_token_ids", float_token_ids, ("prompts[0]",)),
    Probe("engine", "max_new_tokens_fraction", max_new_tokens_fraction, ("max_new_tokens",)),
    Probe("engine", "prompt_past_the_context", prompt_past_the_context, ("prompts[0]", "context")),
    Probe("engine", "keep_dense_as_text", keep_dense_as_text, ("keep_dense",)),
    Probe("engine", "ratio_zero", ratio_zero, ("ratio",)),
    Probe("engine", "ratio_nan", ratio_nan, ("ratio",)),
    Probe("engine", "link_speed_negative", link_speed_negative, ("link_GB_per_s",)),
    Probe("engine", "topk_absurd", topk_absurd, ("topk",)),
    Probe("engine", "ratio_too_small_for_k", ratio_too_small_for_k, ("ratio",)),
    Probe("engine", "steps_past_the_context", steps_past_the_context, ("steps",)),
    Probe("engine", "feed_of_floats", feed_of_floats, ("feed",)),
    Probe("engine", "wrong_recorder", wrong_recorder, ("recorder",)),
    Probe("engine", "recorder_class_not_instance", recorder_class_not_instance, ("recorder",)),
    Probe("engine", "step_after_close", step_after_close, ("closed",), clear_types=(RuntimeError,)),
    Probe("engine", "dense_step_after_close", dense_step_after_close, ("closed",), clear_types=(RuntimeError,)),
    Probe("engine", "config_and_settings_both", config_and_settings_both, ("config",)),
    Probe("engine", "two_threads_decode_as_one", two_threads_decode_as_one),
    Probe("engine", "link_cpu_clock_second_thread", link_cpu_clock_second_thread),
    Probe("engine", "link_used_by_forked_child", link_used_by_forked_child),
    Probe("engine", "link_after_close", link_after_close, ("closed",), clear_types=(RuntimeError,)),
    Probe("engine", "link_zero_speed", link_zero_speed, ("GB_per_s",)),
    Probe("engine", "link_clock_unknown", link_clock_unknown, ("clock",)),
    Probe("engine", "link_chunk_not_callable", link_chunk_not_callable, ("chunks[0]",)),
    Probe("engine", "link_chunk_raises", link_chunk_raises),
]


def test_engine_probes(tmp_path_factory):
    rows = run_probes(PROBES, tmp_path_factory.mktemp)
    assert bad_rows(rows) == []
