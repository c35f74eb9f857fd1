import pytest

from ess.kernels import BACKENDS, cuda_available, resolve_backend


def test_auto_is_numba_on_cpu():
    assert resolve_backend("auto") == "numba"
    assert resolve_backend("auto", device="cpu") == "numba"


@pytest.mark.parametrize("name", BACKENDS)
def test_names_pass_through(name):
    assert resolve_backend(name) == name


def test_unknown_backend():
    with pytest.raises(ValueError, match="backend must be 'auto' or one of"):
        resolve_backend("cupy")


def test_cuda_rules():
    if cuda_available():
        assert resolve_backend("auto", device="cuda") == "torch"
        with pytest.raises(ValueError, match="runs on the CPU only"):
            resolve_backend("numba", device="cuda:0")
    else:
        with pytest.raises(ValueError, match="no CUDA device"):
            resolve_backend("auto", device="cuda")
