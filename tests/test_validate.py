"""The validator contract: TypeError for a wrong type, ValueError for a wrong value, the argument named; and the
library's entry points that use it."""
import numpy as np
import pytest

from ess import validate as V


def test_integers_refuse_bools_and_floats_and_accept_numpy_integers():
    assert V.integer("n", np.int32(7)) == 7 and type(V.integer("n", np.int64(7))) is int
    for bad in (True, np.bool_(False), 2.0, np.float64(3), "3", None):
        with pytest.raises(TypeError, match="n must be an integer, got"):
            V.integer("n", bad)
    with pytest.raises(ValueError, match="n must be a positive integer, got 0"):
        V.positive_int("n", 0)
    with pytest.raises(ValueError, match="n must be a non-negative integer, got -1"):
        V.non_negative_int("n", -1)
    with pytest.raises(ValueError, match=r"layer must be in \[0, 4\), got 4"):
        V.integer("layer", 4, lo=0, below=4)
    assert V.integer("layer", 3, lo=0, below=4) == 3


def test_reals_ratios_and_fractions():
    assert V.real("x", np.float32(0.5)) == 0.5 and V.real("x", 3) == 3.0
    for bad in (True, "0.5", None, [0.5]):
        with pytest.raises(TypeError, match="x must be a number, got"):
            V.real("x", bad)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="x must be finite"):
            V.real("x", bad)
    # the ratio interval is open at 0 and closed at 1; a fraction (probability, decay) is closed at both ends
    assert V.ratio("ratio", 1) == 1.0 and V.fraction("decay", 0) == 0.0 and V.fraction("decay", 1) == 1.0
    with pytest.raises(ValueError, match=r"ratio must be in \(0, 1\], got 0"):
        V.ratio("ratio", 0.0)
    with pytest.raises(ValueError, match=r"decay must be in \[0, 1\], got 1.5"):
        V.fraction("decay", 1.5)
    with pytest.raises(ValueError, match="s must be > 0, got -1"):
        V.real("s", -1, lo=0.0, lo_open=True)
    with pytest.raises(ValueError, match=r"rho must be in \[0, 1\), got 1"):
        V.real("rho", 1.0, lo=0.0, hi=1.0, hi_open=True)


def test_one_of_and_arrays():
    assert V.one_of("policy", "lru", ("lru", "fifo")) == "lru"
    for bad in ("LRU", None, ["lru"]):
        with pytest.raises(ValueError, match=r"policy must be one of \('lru', 'fifo'\)"):
            V.one_of("policy", bad, ("lru", "fifo"))
    out = V.int_array("idx", np.array([3, -1], np.int32), ndim=1, lo=-1, below=4)
    assert out.dtype == np.int64 and out.tolist() == [3, -1]
    with pytest.raises(TypeError, match="idx must be a NumPy integer array"):
        V.int_array("idx", [1, 2])
    with pytest.raises(TypeError, match="idx must hold integers"):
        V.int_array("idx", np.array([True]))
    with pytest.raises(ValueError, match=r"idx holds 4, outside \[-1, 4\)"):
        V.int_array("idx", np.array([0, 4]), lo=-1, below=4)
    with pytest.raises(ValueError, match="idx must be 1-D"):
        V.int_array("idx", np.zeros((1, 2), np.int64), ndim=1)
    np.testing.assert_array_equal(V.number_array("batch", [2, 4], whole=True), [2.0, 4.0])
    assert np.isinf(V.number_array("link", np.inf, allow_inf=True))
    with pytest.raises(ValueError, match="batch must hold whole numbers"):
        V.number_array("batch", 2.5, whole=True)
    with pytest.raises(ValueError, match="link must be finite and > 0"):
        V.number_array("link", np.inf)
    with pytest.raises(TypeError, match="batch must be a number or an array of numbers"):
        V.number_array("batch", "8")


def test_entries():
    e = V.entries("entries", np.zeros((2, 3, 8), np.uint8)[:, ::2], (8,), ndim=3)
    assert e.flags.c_contiguous and e.shape == (2, 2, 8)
    with pytest.raises(TypeError, match="entries must be uint8 cache entries"):
        V.entries("entries", np.zeros((2, 8), np.int8), (8,))
    with pytest.raises(ValueError, match=r"entries must have shape \(n, 8\), got \(2, 7\)"):
        V.entries("entries", np.zeros((2, 7), np.uint8), (8,), ndim=2, shape_doc="(n, 8)")
    with pytest.raises(ValueError, match="must have shape"):
        V.entries("entries", np.zeros((2, 2, 8), np.uint8), (8,), ndim=2)
    assert V.entries("entries", np.zeros((4, 5, 8), np.uint8), (4, None, 8), ndim=3).shape == (4, 5, 8)   # any L
    with pytest.raises(ValueError, match=r"entries must have shape \(\.\.\., 4, n, 8\), got \(3, 5, 8\)"):
        V.entries("entries", np.zeros((3, 5, 8), np.uint8), (4, None, 8), ndim=3)


def test_booleans_and_request_ids():
    assert V.boolean("verify", np.bool_(True)) is True and V.boolean("verify", False) is False
    for bad in (1, 0, "no", "False", None, 1.0):                 # bool("no") would be True
        with pytest.raises(TypeError, match="verify must be True or False, got"):
            V.boolean("verify", bad)
    assert V.request_id("request_id", np.int64(7)) == 7 and type(V.request_id("request_id", np.int32(7))) is int
    assert V.request_id("request_id", "r.1") == "r.1"
    for bad in (True, 1.0, float("nan"), None, ("a", 1), b"r"):  # 1.0 and True would name request 1
        with pytest.raises(TypeError, match="request_id must be an int or a str, got"):
            V.request_id("request_id", bad)
    with pytest.raises(TypeError, match="entries must be uint8 cache entries"):
        V.entries("entries", [[1, 2], [3]], (2,))                 # ragged: was NumPy's own ValueError


def test_library_entry_points_raise_type_errors_for_wrong_types():
    """Checks that used to raise ValueError for a non-integer now raise TypeError, naming the argument."""
    from ess.disk import DiskTier
    from ess.memory import host_memory_needed_bytes, tier_placement
    from ess.policies import LRUPolicy
    from ess.storage import TieredCache
    with pytest.raises(TypeError, match="capacity must be an integer"):
        LRUPolicy(4.0)
    with pytest.raises(TypeError, match="batch must be an integer"):
        tier_placement(32768, 0.2, batch=1.5)
    with pytest.raises(TypeError, match="batch must be an integer"):
        host_memory_needed_bytes(2.0, 4096)
    with pytest.raises(TypeError, match="block_tokens must be an integer"):
        DiskTier("/nonexistent/never-created", 4, 164, block_tokens=64.0)
    with pytest.raises(TypeError, match="max_requests must be an integer"):
        TieredCache("tiny", capacity=4, max_requests=2.0)


def test_fits_in_memory_refuses_an_array_past_a_quarter_of_the_memory(monkeypatch):
    monkeypatch.setattr(V, "_physical_memory", lambda: 4_000)
    assert V.fits_in_memory("n_layers", 1_000) == 1_000 and type(V.fits_in_memory("n", 10.0)) is int
    with pytest.raises(ValueError, match=r"n_layers is too large: the profile would take .* GB, more than a quarter"):
        V.fits_in_memory("n_layers", 1_001, "the profile")
    monkeypatch.setattr(V, "_physical_memory", lambda: None)     # not a POSIX system: no check
    assert V.fits_in_memory("n_layers", 10 ** 18) == 10 ** 18
