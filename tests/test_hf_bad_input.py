"""Bad input to ess.hf: an unsupported model, K <= 0, a ratio outside (0, 1], and the rest of what a caller may pass
wrong, each a TypeError or ValueError naming the argument, before anything is decoded."""
import numpy as np
import pytest
import torch

import ess.hf as H
from engine_helpers import SMALL, prompts
from ess.llm import LlamaWeights

MODEL = H.transformers_llama(LlamaWeights.random(SMALL, seed=0, dtype=np.float32), SMALL)
IDS = torch.tensor(prompts([30], 0))


class _Fake(torch.nn.Module):
    def __init__(self, model_type):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.config = type("C", (), {"model_type": model_type})()


def test_an_unsupported_architecture_is_named():
    with pytest.raises(ValueError, match="model: architecture 'gpt2' is not supported.*llama"):
        H.SparseCache(_Fake("gpt2"), max_new_tokens=4)
    with pytest.raises(ValueError, match="'deepseek_v4' is not supported.*update_compressor_states"):
        H.enable(_Fake("deepseek_v4"))
    with pytest.raises(TypeError, match="model must be a transformers model"):
        H.SparseCache("meta-llama/Llama-3.2-1B", max_new_tokens=4)


def test_a_model_not_in_float32_is_refused():
    half = H.transformers_llama(LlamaWeights.random(SMALL, seed=0, dtype=np.float32), SMALL).to(torch.bfloat16)
    with pytest.raises(ValueError, match="model: ess.hf decodes float32 models.*bfloat16"):
        H.SparseCache(half, max_new_tokens=4)


@pytest.mark.parametrize("topk", [0, -1, -100])
def test_k_must_be_positive(topk):
    with pytest.raises(ValueError, match="topk"):
        H.SparseCache(MODEL, max_new_tokens=4, topk=topk)
    with pytest.raises(ValueError, match="topk"):
        H.decode(MODEL, IDS, 2, topk=topk)


@pytest.mark.parametrize("ratio", [0.0, -0.1, 1.01, 2, float("nan"), float("inf")])
def test_ratio_must_lie_in_0_1(ratio):
    with pytest.raises(ValueError, match="ratio"):
        H.SparseCache(MODEL, max_new_tokens=4, ratio=ratio)


@pytest.mark.parametrize("bad, exc", [("0.5", TypeError), (None, TypeError), (True, TypeError)])
def test_ratio_must_be_a_number(bad, exc):
    with pytest.raises(exc, match="ratio"):
        H.SparseCache(MODEL, max_new_tokens=4, ratio=bad)


def test_the_rest_of_the_arguments():
    with pytest.raises(ValueError, match="max_new_tokens"):
        H.SparseCache(MODEL, max_new_tokens=0)
    with pytest.raises(ValueError, match="entry_dtype"):
        H.SparseCache(MODEL, max_new_tokens=4, entry_dtype="int4")
    with pytest.raises(ValueError, match="schedule"):
        H.SparseCache(MODEL, max_new_tokens=4, schedule="fast")
    with pytest.raises(ValueError, match="policy"):
        H.SparseCache(MODEL, max_new_tokens=4, policy="belady")
    with pytest.raises(TypeError, match="on_step must be callable"):
        H.SparseCache(MODEL, max_new_tokens=4, on_step=3)
    with pytest.raises(TypeError, match="config or its fields"):
        from ess.engine import DecodeConfig
        H.SparseCache(MODEL, DecodeConfig(), max_new_tokens=4, ratio=0.5)
    with pytest.raises(ValueError, match="kv_lora_rank a multiple"):
        H.LatentFormat(96, 16, "fp8")
    with pytest.raises(ValueError, match="steps"):
        H.decode(MODEL, IDS, 0)
    with pytest.raises(ValueError, match="source"):
        H.load_smollm2(source="hub")


def test_bad_prompts():
    with pytest.raises(ValueError, match="input_ids: every prompt must have the same length"):
        H.decode(MODEL, [[1, 2, 3], [4, 5]], 2)
    with pytest.raises(ValueError, match=r"input_ids must be token ids in \[0, 97\)"):
        H.decode(MODEL, torch.tensor([[1, 200]]), 2)
    with pytest.raises(TypeError, match="input_ids"):
        H.decode(MODEL, torch.ones((1, 4)), 2)
    with pytest.raises(ValueError, match="feed must have shape"):
        H.decode(MODEL, IDS, 2, feed=np.zeros((1, 2), np.int64))


def test_a_padded_batch_and_a_one_request_dba_are_refused():
    ids = torch.tensor(prompts([20, 20], 1))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    cache = H.SparseCache(MODEL, max_new_tokens=2, topk=4)
    with pytest.raises(ValueError, match="attention_mask: a SparseCache decodes batches of prompts of one length"):
        MODEL.generate(ids, attention_mask=mask, cache=cache, max_new_tokens=2, do_sample=False, pad_token_id=0)
    with pytest.raises(ValueError, match="'dba'.*2 requests"):
        H.decode(MODEL, IDS, 2, topk=4, schedule="dba")


def test_record_trace_command_refuses_bad_flags(tmp_path, capsys):
    from ess.__main__ import main
    base = ["record-trace", "--model", "smollm2", "--steps", "1"]
    assert main(base + ["--context", "8", "--out", str(tmp_path / "t.txt")]) == 2
    assert "--out must end in .npz" in capsys.readouterr().err
    assert main(["record-trace", "--model", str(tmp_path / "none"), "--context", "8", "--steps", "1",
                 "--out", str(tmp_path / "t.npz")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert main(base + ["--context", "0", "--out", str(tmp_path / "t.npz")]) == 2
    assert "--context" in capsys.readouterr().err
