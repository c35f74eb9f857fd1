"""Kernels: one family per subpackage, each with the same files and the same signatures:

* ``reference.py``  the NumPy oracle, written to be read (float64 where numbers are computed, shapes in docstrings);
* ``numba_cpu.py``  Numba kernels for the CPU (module-level ``njit(cache=True)``, compiled on first use);
* ``torch_ops.py``  torch kernels for CPU and CUDA (torch imported lazily), where the operation has one.

The families: ``transfer`` (row copies host <-> device), ``attention`` (DeepSeek's indexer and sparse MLA),
``gqa_indexer`` and ``kv_attention`` (the real model's), ``topk``; and, with no torch kernel (chains of dependent
steps, one core's work), ``cachesim`` (the policies' miss counts), ``prefetch`` (the prefetch pool), ``tracegen``
(the synthetic trace generators), ``trace_stats`` (duplicate rows, Fig. 2's adjacent overlap, unions, returns) and
``timeline`` (the simulator's per-layer sums). ``lru_list`` holds the linked-list helpers two families inline. Every
Numba kernel of ``ess`` lives here (none elsewhere), so ``NUMBA_DISABLE_JIT=1`` runs them all as Python.

Kernels know shapes and dtypes, nothing else. The public wrappers validate their arguments, allocate the outputs and
pick the backend with :func:`resolve_backend`, the one place where ``backend="auto"`` is decided.
"""
from __future__ import annotations

import functools
import importlib
import re
import threading

__all__ = ["BACKENDS", "resolve_backend", "check_device", "cuda_available", "is_tensor", "device_of",
           "as_kernel_array", "family_module", "scratch"]

BACKENDS = ("reference", "numba", "torch")


@functools.lru_cache(maxsize=None)
def cuda_available() -> bool:
    """True when torch sees a CUDA device (torch is imported here, lazily, and only once)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return bool(torch.cuda.is_available())


_DEVICE = re.compile(r"(cpu|cuda)(:[0-9]+)?")


def check_device(device) -> str:
    """``device`` (a ``str`` or a ``torch.device``) as a ``str``, ``"cpu"`` or ``"cuda[:n]"``: a ``TypeError`` or
    ``ValueError`` naming ``device`` for anything else (another type, another device kind such as ``"tpu"``).
    Whether a CUDA device is present is :func:`resolve_backend`'s check."""
    if not (isinstance(device, str) or type(device).__module__ == "torch" and type(device).__name__ == "device"):
        raise TypeError(f"device must be a str ('cpu' or 'cuda[:n]') or a torch.device, got {type(device).__name__}")
    text = str(device)
    if not _DEVICE.fullmatch(text):
        raise ValueError(f"device must be 'cpu' or 'cuda[:n]', got {text!r}")
    return text


def resolve_backend(backend: str = "auto", *, device: str | None = None) -> str:
    """Resolve a backend name.

    ``"auto"`` means ``"torch"`` when the data lives on a CUDA device (``device`` starting with ``"cuda"``) and
    ``"numba"`` otherwise; the names in :data:`BACKENDS` pass through. ``device="cuda"`` with a backend other than
    ``"torch"`` is an error, and so is a CUDA device when none is present; ``device`` is ``None`` (the CPU) or what
    :func:`check_device` takes.
    """
    if not isinstance(backend, str) or backend not in BACKENDS + ("auto",):
        raise ValueError(f"backend must be 'auto' or one of {BACKENDS}, got {backend!r}")
    on_cuda = device is not None and check_device(device).startswith("cuda")
    if on_cuda and not cuda_available():
        raise ValueError(f"device={str(device)!r} was asked for but no CUDA device is available")
    if backend == "auto":
        return "torch" if on_cuda else "numba"
    if on_cuda and backend != "torch":
        raise ValueError(f"backend {backend!r} runs on the CPU only; use backend='torch' for device={device!r}")
    return backend


def is_tensor(a) -> bool:
    """True for a torch tensor (checked without importing torch)."""
    return type(a).__module__.startswith("torch")


def device_of(a) -> str:
    """Where an array lives: a torch tensor's device (``"cpu"``, ``"cuda:0"``), ``"cpu"`` for anything else."""
    return str(a.device) if is_tensor(a) else "cpu"


def as_kernel_array(a, backend: str):
    """``a`` (a NumPy array or a torch tensor) as the kernels of ``backend`` take it: a torch tensor for
    ``"torch"`` (a NumPy array shared, not copied), a NumPy array otherwise (a CPU tensor's memory, shared)."""
    if backend == "torch":
        if is_tensor(a):
            return a
        import torch
        return torch.from_numpy(a)
    return a.numpy() if is_tensor(a) else a


_FILES = {"reference": "reference", "numba": "numba_cpu", "torch": "torch_ops"}


def family_module(family: str, backend: str):
    """The kernel module of family ``family`` (a package name, e.g. ``"ess.kernels.topk"``) for a resolved backend
    name (``"reference"``, ``"numba"`` or ``"torch"``)."""
    return importlib.import_module(f"{family}.{_FILES[backend]}")


_LOCAL = threading.local()      # per-thread scratch buffers: two threads never share one


def scratch(name: str, shape: tuple, dtype=None):
    """A NumPy scratch buffer of ``shape`` for kernel ``name``, reused by later calls **of the same thread** (a fresh
    buffer per call pays its page faults every time: ``benchmarks/README.md`` measures it for the sparse MLA
    workspace). Each thread has its own (``threading.local``), so concurrent callers never overwrite each other's
    data; the buffer grows to the largest size asked for and is handed out as a view of the shape asked for.
    Contents are undefined: a kernel overwrites what it reads."""
    import numpy as np
    dtype = np.dtype(np.float32 if dtype is None else dtype)
    size = int(np.prod(shape))
    bufs = getattr(_LOCAL, "buffers", None)
    if bufs is None:
        bufs = _LOCAL.buffers = {}
    buf = bufs.get((name, dtype.str))
    if buf is None or buf.size < size:
        buf = bufs[(name, dtype.str)] = np.empty(max(size, 1), dtype)
    return buf[:size].reshape(shape)
