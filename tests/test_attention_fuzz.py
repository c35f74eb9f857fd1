"""Fuzz tests (hypothesis) of the attention operations: ess.attention (the lightning indexer, top-K, sparse and dense
MLA, the log-sum-exp merge, the ragged caches) and the public entry points of the kernel families
(ess.kernels.resolve_backend, topk.topk_positions, gqa_indexer.gqa_indexer_scores, kv_attention.score_columns and
combine_columns). One argument of one public call at a time gets a meaningless value (fuzz_helpers.BAD, plus
attention outputs holding NaN or infinite log-sum-exps, NaN scores, a k beyond the row and indices out of range);
the call returns a valid result or raises a TypeError/ValueError naming the argument, never another exception (a
NumPy, Numba or torch error; an index out of range in a Numba kernel would read or write past its array), and
finite inputs never give NaN: outputs are finite, log-sum-exps are finite or -inf (nothing attended), top-K
positions are in range, in position order and never repeat.

Cases per test (times ESS_FUZZ_SCALE): ess.attention 400, the merge 200, the kernel entry points 400; about 1,000
calls, a few seconds (on the NumPy and Numba backends: torch is the same contract behind the same checks)."""
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra.numpy import arrays

from ess import attention as A
from ess import quant
from ess.kernels import resolve_backend
from ess.kernels.gqa_indexer import gqa_indexer_scores
from ess.kernels.kv_attention import combine_columns, score_columns
from ess.kernels.topk import topk_positions
from ess.specs import model_spec
from fuzz_helpers import BAD, call_one, finite, fuzz_settings, outcome

TINY = model_spec("tiny")
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")
RNG = np.random.default_rng(7)
B, L, H = 2, 6, 3
Q = RNG.standard_normal((B, H, TINY.latent_dim)).astype(np.float32)
LAT = quant.encode_latent(RNG.standard_normal((B, L, TINY.kv_lora_rank)),
                          RNG.standard_normal((B, L, TINY.qk_rope_head_dim)), TINY)
IDX = np.array([[0, 2, 5, -1], [1, 3, 4, 0]])
KEYS = quant.encode_indexer_keys(RNG.standard_normal((B, L, TINY.index_head_dim)), TINY)
QI = RNG.standard_normal((B, 4, TINY.index_head_dim)).astype(np.float32)
W = RNG.random((B, 4)).astype(np.float32)
SCORES = RNG.standard_normal((B, L)).astype(np.float32)
OUT = A.sparse_mla_decode(Q, LAT, IDX, TINY)
# meaningless values, plus scores with NaN/inf, huge k, indices out of range, float64 beyond the float32 range
EXTRA = st.one_of(BAD, st.sampled_from([
    np.array([[0.0, np.nan, 1.0]], np.float32), np.array([[np.inf, 0.0]]), np.full((2, 3), -np.inf),
    np.array([[1e300, 1.0]]), 2 ** 40, 2 ** 62, 10 ** 30, np.array([[0, 99]]), np.array([[0, 0]]),
    np.array([[-5, 1], [2, 3]]), np.zeros((B, 0), np.int64), np.full((B, H, TINY.latent_dim), 1e300)]))

ATTENTION = {
    "softmax_scale": (lambda **a: A.softmax_scale(**a), {"model": TINY}),
    "latent_format": (lambda **a: A.latent_format(**a), {"model": TINY, "dtype": "bf16"}),
    "prepare_index_queries": (lambda **a: A.prepare_index_queries(**a), {"q": QI, "rotate": True, "fp8": True}),
    "indexer_scores": (lambda **a: A.indexer_scores(**a), {"q": QI, "weights": W, "keys": KEYS,
                                                           "lengths": np.array([6, 3]), "backend": "numba",
                                                           "device": None}),
    "topk_indices": (lambda **a: A.topk_indices(**a), {"scores": SCORES, "k": 4, "backend": "numba"}),
    "sparse_mla_decode": (lambda **a: A.sparse_mla_decode(**a), {"q": Q, "latents": LAT, "indices": IDX,
                                                                 "model": TINY, "dtype": "fp8", "sm_scale": None,
                                                                 "backend": "numba", "device": None}),
    "dense_mla_decode": (lambda **a: A.dense_mla_decode(**a), {"q": Q, "latents": LAT, "model": TINY,
                                                               "lengths": np.array([6, 2]), "dtype": "fp8",
                                                               "sm_scale": 0.2}),
    "split_attention": (lambda **a: A.split_attention(**a), {"q": Q, "latents": LAT, "indices0": IDX[:, :2],
                                                             "indices1": IDX[:, 2:], "model": TINY}),
    "stack_ragged": (lambda **a: A.stack_ragged(**a), {"arrays": [LAT[0], LAT[1, :3]], "name": "latents",
                                                       "width": LAT.shape[2]}),
    "resident_attention": (lambda **a: A.resident_attention(**a), {"q": Q, "latents": [LAT[0], LAT[1, :5]],
                                                                   "indices": IDX, "model": TINY,
                                                                   "backend": "reference"}),
}
ALIASES = {"model": ("model",), "arrays": ("arrays", "latents"), "indices0": ("indices0",), "name": ("name",),
           "width": ("width",), "latents": ("latents",), "device": ("device",)}


def _valid_attention(out: A.AttentionOutput, heads: int = H):
    assert out.out.shape == (B, heads, TINY.kv_lora_rank) and finite(out.out)
    assert out.lse.shape == (B, heads) and not np.isnan(out.lse).any() and not np.isposinf(out.lse).any()


def _valid_topk(idx, k, n):
    assert idx.shape[1] == k and idx.dtype == np.int64 and ((idx >= -1) & (idx < n)).all()
    for row in idx:
        v = row[row >= 0]
        assert (np.diff(v) > 0).all() and (row[v.size:] == -1).all()     # position order, padding at the end


@fuzz_settings(400)
@given(data=st.data())
def test_attention_operations_refuse_meaningless_arguments_and_never_give_nan(data):
    fn, name, args, ok, out = call_one(data, ATTENTION, EXTRA, ALIASES)
    if not ok:
        return
    if fn == "softmax_scale":
        assert math.isfinite(out) and out > 0
    elif fn == "indexer_scores":
        assert out.dtype == np.float32 and not np.isnan(out).any() and not np.isposinf(out).any()
    elif fn == "topk_indices":
        _valid_topk(out, args["k"], args["scores"].shape[1])
    elif fn in ("sparse_mla_decode", "dense_mla_decode", "split_attention", "resident_attention"):
        _valid_attention(out, args["q"].shape[1])
    elif fn == "prepare_index_queries":
        assert finite(out)


def _output(kind, shape=(B, H)):
    lse = {"nan": np.nan, "+inf": np.inf, "-inf": -np.inf, "big": 1e30, "zero": 0.0}[kind]
    return A.AttentionOutput(np.zeros(shape + (TINY.kv_lora_rank,), np.float32), np.full(shape, lse, np.float32))


OUTPUTS = st.one_of(BAD, st.sampled_from(["nan", "+inf", "-inf", "big", "zero"]).map(_output),
                    st.just(A.AttentionOutput(OUT.out, OUT.lse[:1])), st.just(A.AttentionOutput([1.0], [0.0])),
                    st.just(A.AttentionOutput(np.full_like(OUT.out, np.nan), OUT.lse)),
                    st.just(_output("zero", (B, H + 1))))


@fuzz_settings(200)
@given(a=OUTPUTS | st.just(OUT), b=OUTPUTS | st.just(OUT))
def test_merge_attention_refuses_meaningless_outputs_and_never_gives_nan(a, b):
    ok, out = outcome(lambda: A.merge_attention(a, b), "a", "b")
    if ok:
        _valid_attention(out, a.out.shape[1])
        both_empty = np.isneginf(a.lse) & np.isneginf(b.lse)
        assert (np.isneginf(out.lse) == both_empty).all()


TOPK = RNG.standard_normal((B, L))
GQA = {"q": RNG.standard_normal((B, 4, 8)).astype(np.float32),
       "codes": quant.fp8_e4m3_encode(RNG.standard_normal((B, L, 16))),
       "scales": RNG.random((B, L, 2)).astype(np.float32), "lengths": np.array([6, 2]), "backend": "numba",
       "out": None}
POOL = RNG.standard_normal((5, 2, 2, 8)).astype(np.float32)
KV = {"q": GQA["q"], "pool": POOL, "b": np.array([0, 1, 1]), "cols": np.array([0, 2, 1]), "rows": np.array([4, 0, 3]),
      "scale": 0.3, "scores": np.full((B, 4, 4), -np.inf, np.float32), "backend": "numba"}
COMBINE = {"scores": np.zeros((B, 4, 4), np.float32), "pool": POOL, "slots": np.array([[0, 1, -1], [2, 3, 4]]),
           "own_v": RNG.standard_normal((B, 2, 8)).astype(np.float32), "rows": np.array([0, 1]),
           "out": np.zeros((B, 4, 8), np.float32), "backend": "numba"}
KERNELS = {
    "resolve_backend": (lambda **a: resolve_backend(**a), {"backend": "auto", "device": "cpu"}),
    "topk_positions": (lambda **a: topk_positions(**a), {"scores": TOPK, "k": 3, "backend": "numba", "out": None}),
    "gqa_indexer_scores": (lambda **a: gqa_indexer_scores(**a), GQA),
    # fresh destinations: a refused call must leave them as they were, a valid one writes them
    "score_columns": (lambda **a: score_columns(**{**a, "scores": np.copy(a["scores"])}), KV),
    "combine_columns": (lambda **a: combine_columns(**{**a, "out": np.copy(a["out"])}), COMBINE),
}
KERNEL_ALIASES = {"device": ("device",), "backend": ("backend",)}


@fuzz_settings(400)
@given(data=st.data())
def test_kernel_entry_points_refuse_meaningless_arguments(data):
    fn, name, args, ok, out = call_one(data, KERNELS, EXTRA, KERNEL_ALIASES)
    if not ok:
        return
    if fn == "resolve_backend":
        assert out in ("reference", "numba", "torch")
    elif fn == "topk_positions":
        _valid_topk(out, args["k"], TOPK.shape[1])
    elif fn == "gqa_indexer_scores":
        assert out.shape == (B, L) and not np.isnan(out).any()


@fuzz_settings(100)
@given(k=st.integers(1, 12), scores=arrays(np.float64, (B, L), elements=st.sampled_from([0.0, 1.0, -np.inf, 2.5])))
def test_topk_of_any_k_keeps_the_top_k_rule(k, scores):
    """k beyond the row: every visible token, padded with -1; never an invisible one."""
    for backend in ("reference", "numba"):
        idx = A.topk_indices(scores, k, backend=backend)
        _valid_topk(idx, k, L)
        assert ((idx >= 0).sum(axis=1) == np.minimum(k, np.isfinite(scores).sum(axis=1))).all()
        assert all(np.isfinite(scores[r, idx[r][idx[r] >= 0]]).all() for r in range(B))


def test_the_meaningless_attention_inputs_found_by_probing_are_refused():
    """Each once gave a raw AttributeError/NumPy error, NaN out of the merge, or a Numba kernel reading or writing
    past its arrays."""
    with pytest.raises(ValueError, match=r"merge_attention: a.lse must be finite or -inf"):   # NaN out
        A.merge_attention(_output("nan"), OUT)
    with pytest.raises(ValueError, match=r"merge_attention: b.lse must be finite or -inf"):   # inf / inf = NaN
        A.merge_attention(OUT, _output("+inf"))
    with pytest.raises(ValueError, match=r"merge_attention: a.out must be finite"):
        A.merge_attention(A.AttentionOutput(np.full_like(OUT.out, np.inf), OUT.lse), OUT)
    with pytest.raises(TypeError, match=r"merge_attention: a.out must be a NumPy float array"):  # AttributeError
        A.merge_attention(A.AttentionOutput([1.0], [0.0]), OUT)
    with pytest.raises(ValueError, match=r"a.lse must have the shape of a.out without its last axis"):
        A.merge_attention(A.AttentionOutput(OUT.out, OUT.lse[:1]), A.AttentionOutput(OUT.out, OUT.lse[:1]))
    with pytest.raises(TypeError, match="model must be a ModelSpec"):                      # AttributeError
        A.softmax_scale(None)
    with pytest.raises(ValueError, match="q holds 1e\\+300, beyond the float32 range"):     # inf, then NaN
        A.dense_mla_decode(np.full((B, H, TINY.latent_dim), 1e300), LAT, TINY)
    with pytest.raises(ValueError, match="q must have a head dim"):                        # error named x
        A.prepare_index_queries(np.zeros((2, 0)))
    with pytest.raises(TypeError, match="rotate must be True or False"):                   # 'no' meant True
        A.prepare_index_queries(QI, rotate="no")
    with pytest.raises(TypeError, match="latents must be a non-empty list"):               # max() of nothing
        A.resident_attention(Q, [], IDX, TINY)
    with pytest.raises(TypeError, match="width must be an integer"):                        # truth of an array
        A.stack_ragged([LAT[0]], "latents", np.zeros(3))
    with pytest.raises(ValueError, match="backend must be 'auto' or one of"):              # truth of an array
        resolve_backend(np.zeros(2))
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda"):                 # taken as the CPU
        resolve_backend("numba", device="tpu")
    with pytest.raises(TypeError, match="device must be a str"):
        resolve_backend("numba", device=3)
    with pytest.raises(TypeError, match="out must be None or a"):                          # AttributeError
        topk_positions(TOPK, 2, out=False)
    with pytest.raises(ValueError, match="k is too large"):                                # a (2, 2**40) array
        topk_positions(TOPK, 2 ** 40)
    with pytest.raises(ValueError, match=r"rows must hold indices in \[0, 5\), found 5"):   # read past the pool
        score_columns(**{**KV, "rows": np.array([4, 0, 5])})
    with pytest.raises(ValueError, match=r"b must hold indices in \[0, 2\), found -1"):     # wrote before scores
        score_columns(**{**KV, "b": np.array([0, -1, 1])})
    with pytest.raises(ValueError, match=r"slots must hold indices in \[-1, 5\), found 9"):
        combine_columns(**{**COMBINE, "slots": np.array([[0, 9, -1], [2, 3, 4]])})
    with pytest.raises(ValueError, match="scale must be"):                                 # NaN scores
        score_columns(**{**KV, "scale": math.nan})
    with pytest.raises(TypeError, match="b must be a NumPy array or a torch tensor"):      # AttributeError
        score_columns(**{**KV, "b": None})
    with pytest.raises(TypeError, match="indices0 must hold integers"):                     # named 'indices'
        A.split_attention(Q, LAT, np.ones((B, 1)), IDX[:, 2:], TINY)
    with pytest.raises(ValueError, match=r"sm_scale or q too large"):                       # inf in float32
        A.dense_mla_decode(Q, LAT, TINY, sm_scale=1e37)
    with pytest.raises(ValueError, match=r"sm_scale must be at most float32"):               # NaN out
        A.dense_mla_decode(Q, LAT, TINY, sm_scale=1e307)
    with pytest.raises(ValueError, match="indices0 must select K >= 1 entries"):            # named 'indices'
        A.split_attention(Q, LAT, np.zeros((B, 0), np.int64), IDX[:, 2:], TINY)
    with pytest.raises(ValueError, match=r"sm_scale must be at most float32"):               # cast to float32 inf
        A.sparse_mla_decode(Q, LAT, IDX, TINY, sm_scale=3.4028235677973366e+38)
