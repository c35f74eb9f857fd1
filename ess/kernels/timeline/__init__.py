"""The simulator's per-layer part (:func:`ess.sim.timeline.simulate`), fused over the layers of each configuration:
for every configuration ``i`` and layer ``l`` the offload overhead of the three strategies (none, DA, DBA: the
arithmetic of :func:`ess.sim.timeline.offload_overhead_s`), the strategy taken, and the layer's place on the two
lanes, summed over the layers::

    layer_sums(m, offload, k_h, d, bm, I, Ih, p, a, ah2, o, merge, fa, ab, ob, be, ent, spe, sel, comp_d, comp_m,
               comm_m, dense, per_layer, layer_over, choice, layers, layers0) -> int

    m          (1 or N, nl) float   misses per request and step of each layer (one row shared, or one per row)
    offload    (N,) bool            rows with offload (the others add no overhead)
    k_h, d     (N,) float           seconds per miss (one micro-batch), the write-back's seconds
    bm, I, Ih, p, a, ah2, o, merge, fa, ab      (N,) float   micro-batch and the operations' seconds: indexer (whole,
                                    half batch), pre-attention, attention (whole, half batch), o_proj, merge, a
                                    launch's fixed part, one entry block's seconds per request
    ob, be     float                a launch's overhead in blocks, entries per block
    ent, spe, sel                   (N,) float   entries attended, of them sparse, selected per request and step
    comp_d, comp_m, comm_m          (N,) float   a dense-FFN layer's and a MoE layer's compute, the all-to-all lane
    dense      int                  the first ``dense`` layers have a dense FFN (no all-to-all lane)
    per_layer  (nl,) int8           the strategy of each layer (0 none, 1 DA, 2 DBA) or -1: the cheapest, ties to
                                    none, then DA, then DBA
    layer_over (N, nl) float, choice (N, nl) int8, layers (N,) float, layers0 (N,) float      written: each
                                    layer's overhead (both micro-batches), its strategy, the sums over the layers
                                    with and without offload

Returns 0; 1 when a miss count is negative or not finite, 2 when one exceeds the entries selected (the outputs are
then undefined). Two files with this signature: ``reference`` (NumPy over the configurations, one layer at a time;
the oracle) and ``numba_cpu`` (one pass per configuration).
"""
from __future__ import annotations

from .. import family_module

__all__ = ["get"]


def get(backend: str):
    """The kernel module of a resolved backend name (``"reference"`` or ``"numba"``)."""
    if backend == "torch":
        raise ValueError("the timeline's layer sums have no torch kernel; use backend 'numba' or 'reference'")
    return family_module(__name__, backend)
