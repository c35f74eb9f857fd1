"""Fuzz tests (hypothesis) of the copy link (ess.link), the decode engine's settings (ess.engine.config, the
overlap check's design) and greedy generation (ess.llm.generate): one
argument of one public call at a time gets a meaningless value (fuzz_helpers.BAD); the call returns a valid result
or raises a TypeError/ValueError naming the argument, never another exception, and a refused submit records nothing.
'no' is never taken for True, a device that is not 'cpu' or a present CUDA device is refused.

Cases per test (times ESS_FUZZ_SCALE): the link 200, the engine's settings 300, ess.llm.generate on a tiny GGUF model
60; about 560 calls, a few seconds."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from ess.engine.config import DecodeConfig, default_topk
from ess.studies.real_model.check import CheckDesign
from ess.link import EmulatedLink, SyncLink, make_link
from fuzz_helpers import BAD, call_one, fuzz_settings, outcome

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")
BUF = np.zeros(8, np.uint8)
CHUNKS = [(lambda: BUF.fill(1), 8)]
LINKS = {"sync": SyncLink(), "emulated": EmulatedLink(None, inline_below_bytes=0)}


@fuzz_settings(200)
@given(which=st.sampled_from(sorted(LINKS)), data=st.data())
def test_link_submit_refuses_meaningless_jobs_and_records_nothing(which, data):
    link = LINKS[which]
    before = len(link.records)
    fn, name, args, ok, job = call_one(data, {"submit": (lambda **a: link.submit(**a),
                                                         {"kind": "h2d", "layer": 3, "chunks": CHUNKS})},
                                       BAD, {"chunks": ("chunks", "nbytes")})
    if ok:
        assert job.wait() >= 0 and job.nbytes == sum(n for _, n in args["chunks"])
        assert len(link.records) == before + 1
    else:
        assert len(link.records) == before


CALLS = {
    "make_link": (lambda **a: make_link(**a), {"GB_per_s": 20.0, "device": "cpu", "emulate": False,
                                               "clock": "cpu"}),
    "EmulatedLink": (lambda **a: EmulatedLink(**a), {"GB_per_s": 5.0, "clock": "wall", "inline_below_bytes": 64}),
    "default_topk": (lambda **a: default_topk(**a), {"context_len": 4096}),
    "DecodeConfig": (lambda **a: DecodeConfig(**a), {
        "offload": True, "ratio": 0.25, "policy": "heat", "policy_options": {"decay": 0.5}, "schedule": "da",
        "link_GB_per_s": 10.0, "emulate_link": True, "topk": 64, "warmup": False, "keep_logits": False,
        "timing": True, "clock": "cpu", "backend": "numba"}),
    "CheckDesign": (lambda **a: CheckDesign(**a), {
        "calibration_contexts": [40, 60], "calibration_batches": [1, 2], "calibration_ratio": 0.5,
        "calibration_links_GB_per_s": [0.05, None], "held_out_contexts": (50,), "held_out_batches": [2],
        "held_out_ratio": 0.75, "held_out_links_GB_per_s": [0.1], "steps": 3, "clock": "wall"}),
}


@fuzz_settings(300)
@given(data=st.data())
def test_link_and_engine_settings_refuse_meaningless_arguments(data):
    fn, name, args, ok, out = call_one(data, CALLS, BAD, {"policy_options": ("policy_options", "decay"),
                                                          "calibration_ratio": ("ratio",), "held_out_ratio": ("ratio",)})
    if not ok:
        return
    if fn == "default_topk":
        assert type(out) is int and out >= 1
    elif fn == "DecodeConfig":
        for flag in ("offload", "emulate_link", "warmup", "keep_logits", "timing"):
            assert type(getattr(out, flag)) is bool                # never 'no' taken for True
    elif fn in ("make_link", "EmulatedLink"):
        out.close()
    elif fn == "CheckDesign":                                       # every configuration it lists can be made
        assert out.calibration() and out.held_out() and type(out.steps) is int
        assert all(type(v) is int and v >= 1 for v in out.contexts + [out.max_batch])


def test_the_meaningless_link_and_engine_inputs_found_by_probing_are_refused():
    """Each once ran anyway (on the wrong device, with a meaningless job) or gave a raw Python error."""
    link = SyncLink()
    with pytest.raises(TypeError, match=r"chunks\[0\] must be a \(callable, nbytes\) pair"):   # unpack error
        link.submit("h2d", 0, [1])
    with pytest.raises(TypeError, match="chunks must be a list"):              # 'int' is not iterable
        link.submit("h2d", 0, 5)
    with pytest.raises(ValueError, match="kind must be one of"):               # recorded as kind 'x'
        link.submit("x", 0, CHUNKS)
    with pytest.raises(ValueError, match="layer must be"):                     # recorded as layer -1
        link.submit("h2d", -1, CHUNKS)
    assert link.records == []
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda"):     # a 'tpu' link on the CPU
        make_link(device="tpu")
    with pytest.raises(TypeError, match="emulate must be True or False"):      # 'no' emulated
        make_link(emulate="no")
    with pytest.raises(ValueError, match="clock must be one of"):              # unchecked without emulation
        make_link(emulate=False, clock="sundial")
    import torch
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device is available"):   # torch's own RuntimeError
            make_link(device="cuda")
    with pytest.raises(TypeError, match="context_len must be an integer"):     # int('4096') = 4096
        default_topk("4096")
    with pytest.raises(ValueError, match="context_len must be"):               # max(1, -1 // 16): K = 1
        default_topk(-16)
    design = dict(calibration_contexts=[40], calibration_batches=[1], calibration_ratio=0.5,
                  calibration_links_GB_per_s=[0.05], held_out_contexts=[50], held_out_batches=[2], held_out_ratio=0.75,
                  held_out_links_GB_per_s=[0.1], steps=3)
    with pytest.raises(ValueError, match=r"held_out_links_GB_per_s\[0\] must be"):   # refused only when run
        CheckDesign(**{**design, "held_out_links_GB_per_s": [-1.0]})
    with pytest.raises(TypeError, match=r"calibration_contexts\[0\] must be an integer"):   # 'a' kept
        CheckDesign(**{**design, "calibration_contexts": ["a"]})
    with pytest.raises(ValueError, match=r"held_out_batches\[0\] must be"):   # a batch of 0 listed
        CheckDesign(**{**design, "held_out_batches": [0]})
    import json
    cfg = DecodeConfig(warmup=np.False_)                                        # kept as np.False_: to_dict
    assert cfg.warmup is False and json.dumps(cfg.to_dict())                   # was not JSON


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    from llm_helpers import write_tiny_gguf
    from ess.llm import load_model
    path = tmp_path_factory.mktemp("llm") / "tiny.gguf"
    write_tiny_gguf(path)
    return load_model(path, cache_dir=None)


@fuzz_settings(60)
@given(data=st.data())
def test_generate_refuses_meaningless_arguments(tiny_lm, data):
    from ess.llm import generate
    good = {"model": tiny_lm.model, "tokenizer": tiny_lm.tokenizer, "prompt": [3, 4, 5], "max_new_tokens": 2,
            "stop_at_eos": False}
    fn, name, args, ok, out = call_one(data, {"generate": (lambda **a: generate(**a), good)}, BAD,
                                       {"prompt": ("prompt", "token"), "max_new_tokens": ("max_new_tokens",)})
    if ok:
        assert 1 <= len(out.token_ids) <= args["max_new_tokens"]
        assert all(0 <= t < tiny_lm.tokenizer.vocab_size for t in out.token_ids)


def test_generate_takes_no_string_for_a_flag(tiny_lm):
    from ess.llm import generate
    with pytest.raises(TypeError, match="stop_at_eos must be True or False"):     # 'no' stopped at the EOS
        generate(tiny_lm.model, tiny_lm.tokenizer, [3, 4], max_new_tokens=2, stop_at_eos="no")
    with pytest.raises(TypeError, match="model must be an ess.llm.LlamaModel"):     # AttributeError
        generate(None, tiny_lm.tokenizer, [3, 4])
    assert len(generate(tiny_lm.model, tiny_lm.tokenizer, [3, 4], max_new_tokens=np.int64(2),
                        stop_at_eos=False).token_ids) == 2                         # a NumPy count was a TypeError
