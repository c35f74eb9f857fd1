"""The what-if grid's entries (ess.sim.grid and ess.plan on it) refuse what they cannot price, naming the argument:
contexts of 0, negative, fractional, NaN or text; ratio ceilings above 1 or NaN; iteration counts <= 0; negative or
NaN tolerances; reversed or broken link-speed spans; a GPU on a host link that cannot serve it; a GPU of
``list_gpus()`` without a deployment of the paper's shape. Each of these once gave an answer (a truncated context,
a ratio of 1.5 in the grid, a link speed of 5,000 GB/s after no bisection) or an error naming something else."""
import dataclasses
import math

import pytest

import ess
from ess.sim import grid as sgrid
from ess.sim.costs import CostParams
from ess.sim.misses import NOTEBOOK_SIZES, PLANNER_SIZES, BandSizes
from ess.specs import gpu_spec, host_link_spec, list_deployments, list_gpus, list_host_links
from ess.locality import locality_alternatives
import test_probe_grid as probe_grid

MODEL = "deepseek-v3.2"
BAD_CONTEXTS = [0, -5, 2.5, float("nan"), "32k", True]


@pytest.fixture(scope="module")
def inputs():
    return probe_grid.inputs()                       # grid inputs on fake miss tables, shared with the probes


@pytest.fixture(scope="module")
def found(inputs):
    return probe_grid.found()


# -------------------------------------------------------------------------------------------------- contexts
@pytest.mark.parametrize("L", BAD_CONTEXTS)
def test_grid_cells_refuse_a_context_that_is_not_a_positive_integer(L):
    with pytest.raises((TypeError, ValueError), match=r"contexts\[0\]"):
        sgrid.grid_cells([MODEL], ["H200"], [L])
    with pytest.raises((TypeError, ValueError), match=r"long_contexts\[0\]"):
        sgrid.grid_cells([MODEL], ["H200"], [32768], long_contexts=[L])


@pytest.mark.parametrize("arg", ["models", "gpus", "contexts", "links"])
def test_grid_cells_refuse_a_bare_string_for_a_list(arg):
    kw = {"models": [MODEL], "gpus": ["H200"], "contexts": [32768], "links": None}
    kw[arg] = {"models": MODEL, "gpus": "H200", "contexts": "32768", "links": "pcie5"}[arg]
    with pytest.raises(TypeError, match=arg):
        sgrid.grid_cells(kw["models"], kw["gpus"], kw["contexts"], links=kw["links"])


@pytest.mark.parametrize("L", BAD_CONTEXTS)
def test_ratio_grid_cell_view_and_evaluate_configs_refuse_a_bad_context(inputs, L):
    with pytest.raises((TypeError, ValueError), match="context_len"):
        sgrid.ratio_grid(MODEL, L, 2)
    with pytest.raises((TypeError, ValueError), match="context_len"):
        sgrid.cell_view(inputs, MODEL, "H200", "pcie5", L, 2)
    with pytest.raises((TypeError, ValueError), match="context_len"):
        sgrid.evaluate_configs(inputs, MODEL, "H200", "pcie5", L, [10], [0.5])


def test_a_context_beyond_the_model_is_refused_where_one_cell_is_asked_for(inputs):
    with pytest.raises(ValueError, match="context_len"):
        sgrid.cell_view(inputs, MODEL, "H200", "pcie5", 10 ** 7, 2)
    with pytest.raises(ValueError, match=r"contexts .*deepseek-v3.2"):
        sgrid.grid_cells([MODEL], ["H200"], [10 ** 7])


# --------------------------------------------------------------------------------------------- ratios, MTP
@pytest.mark.parametrize("top", [1.5, float("nan"), 0.0, -0.2, "0.8", True])
def test_the_ratio_ceiling_is_a_ratio(top):
    with pytest.raises((TypeError, ValueError), match="top"):
        sgrid.ratio_grid(MODEL, 32768, 2, top=top)


def test_the_ratio_grid_takes_an_integral_mtp():
    with pytest.raises(TypeError, match="mtp"):
        sgrid.ratio_grid(MODEL, 32768, 2.5)


@pytest.mark.parametrize("ratio", [True, float("nan"), 1.5, 0.0, "x"])
def test_the_cell_view_names_a_bad_ratio(inputs, ratio):
    with pytest.raises((TypeError, ValueError), match="ratio"):
        sgrid.cell_view(inputs, MODEL, "H200", "pcie5", 32768, 2, ratio=ratio)


def test_evaluate_configs_checks_its_mtp_batches_ratios_and_flag(inputs):
    call = lambda **kw: sgrid.evaluate_configs(inputs, MODEL, "H200", "pcie5", 32768,  # noqa: E731
                                               kw.pop("batches", [10]), kw.pop("ratios", [0.5]), **kw)
    with pytest.raises(TypeError, match="mtp"):
        call(mtp=2.5)
    with pytest.raises(ValueError, match="batches"):
        call(batches=[10.5])
    with pytest.raises(ValueError, match="ratios"):
        call(ratios=[1.5])
    with pytest.raises(ValueError, match="ratios"):
        call(ratios=[float("nan")])
    with pytest.raises(ValueError, match="batches.*ratios|ratios.*batches"):
        call(batches=[10, 20], ratios=[0.5])
    with pytest.raises(TypeError, match="check_memory"):
        call(check_memory="no")


@pytest.mark.parametrize("n", [0, -1, 2.5, True])
def test_n_ratios_is_named_as_the_caller_passed_it(inputs, found, n):
    cells = sgrid.grid_cells([MODEL], ["H200"], [32768], links=["pcie5"])
    for call in (lambda: sgrid.grid_search(cells, inputs, n_ratios=n),
                 lambda: sgrid.break_even_link(found, inputs, n_ratios=n),
                 lambda: sgrid.cell_view(inputs, MODEL, "H200", "pcie5", 32768, 2, n_ratios=n)):
        with pytest.raises((TypeError, ValueError), match="n_ratios"):
            call()


@pytest.mark.parametrize("flag", ["no", 0, 1, None])
def test_grid_search_check_memory_is_a_bool(inputs, flag):
    cells = sgrid.grid_cells([MODEL], ["H200"], [32768], links=["pcie5"])
    with pytest.raises(TypeError, match="check_memory"):
        sgrid.grid_search(cells, inputs, check_memory=flag)


# ----------------------------------------------------------------------------------------- link searches
@pytest.mark.parametrize("it", [0, -3, 2.5, "5", True])
def test_link_searches_refuse_an_iteration_count_below_one(inputs, found, it):
    with pytest.raises((TypeError, ValueError), match="iterations"):
        sgrid.break_even_link(found, inputs, iterations=it)
    with pytest.raises((TypeError, ValueError), match="iterations"):
        sgrid.overlap_links(found, inputs, iterations=it)


@pytest.mark.parametrize("span", [(5000.0, 0.5), (10.0, 10.0), (float("nan"), 10.0), (0.0, 10.0), (-1.0, 10.0),
                                  (1.0, float("inf")), (1.0,), (1.0, 2.0, 3.0), "ab", 5.0, ("1", 10.0)])
def test_link_searches_refuse_a_span_that_is_not_an_increasing_pair(inputs, found, span):
    with pytest.raises((TypeError, ValueError), match="span"):
        sgrid.break_even_link(found, inputs, span=span)
    with pytest.raises((TypeError, ValueError), match="span"):
        sgrid.overlap_links(found, inputs, span=span)


@pytest.mark.parametrize("tol", [-0.1, float("nan"), float("inf"), 1.5, "x", True])
def test_overlap_links_refuse_a_tolerance_outside_zero_to_one(inputs, found, tol):
    with pytest.raises((TypeError, ValueError), match="tolerance"):
        sgrid.overlap_links(found, inputs, tolerance=tol)


def test_a_valid_span_still_bounds_the_answers(inputs, found):
    be, below = sgrid.break_even_link(found, inputs, span=(1.0, 100.0), iterations=12)
    assert 1.0 <= be.iloc[0] <= 100.0 and not below.iloc[0]
    speeds = sgrid.overlap_links(found, inputs, span=(1.0, 100.0), iterations=12, tolerance=0.0)
    for v in speeds.iloc[0]:
        assert math.isnan(v) or 1.0 <= v <= 100.0


# ------------------------------------------------------------------------------------------ GPUs and links
def _serving(gpu):
    return [n for n in list_host_links() if host_link_spec(n).serves(gpu_spec(gpu))]


def test_a_gpu_on_a_link_that_cannot_serve_it_is_refused(inputs):
    assert "pcie6" not in _serving("H200") and "c2c-gb300" not in _serving("H200")
    for link in ("pcie6", "c2c-gb300"):
        with pytest.raises(ValueError, match=f"link '{link}' .*H200"):
            sgrid.cell_view(inputs, MODEL, "H200", link, 32768, 2)
        with pytest.raises(ValueError, match=f"link '{link}' .*H200"):
            sgrid.evaluate_configs(inputs, MODEL, "H200", link, 32768, [10], [0.5])
        with pytest.raises(ValueError, match=f"link '{link}' .*H200"):
            ess.plan(MODEL, "H200", 32768, link=link)
    with pytest.raises(ValueError, match=r"links \['pcie6'\] serve none of gpu 'H200'"):
        sgrid.grid_cells([MODEL], ["H200"], [32768], links=["pcie6"])
    with pytest.raises(ValueError, match="GB200"):                  # one GPU of two left without a link
        sgrid.grid_cells([MODEL], ["H200", "GB200"], [32768], links=["pcie5"])


@pytest.mark.parametrize("gpu", list_gpus())
def test_every_listed_gpu_is_priced_or_refused_by_name(gpu):
    if gpu == "H200" or f"paper-shape-{gpu.lower()}" in list_deployments():       # the paper's GPU, or its shape
        assert sgrid.grid_deployment(gpu) in list_deployments()
        assert len(sgrid.grid_cells([MODEL], [gpu], [32768])) >= 1
        return
    for call in (lambda: sgrid.grid_deployment(gpu), lambda: sgrid.grid_cells([MODEL], [gpu], [32768]),
                 lambda: sgrid.cell_provenance(MODEL, gpu), lambda: ess.plan(MODEL, gpu, 32768)):
        with pytest.raises(ValueError, match=rf"gpu '{gpu}' has no deployment .*prices"):
            call()


def test_the_a100_is_among_the_listed_gpus_the_grid_cannot_price():
    """The case above is not vacuous: one GPU of list_gpus() has no deployment of the paper's shape."""
    assert "A100-80G" in list_gpus()
    with pytest.raises(ValueError, match="gpu 'A100-80G'"):
        sgrid.grid_deployment("A100-80G")


def test_an_unknown_gpu_is_named():
    with pytest.raises(ValueError, match="gpu"):
        sgrid.grid_deployment("Z999")
    with pytest.raises(TypeError, match="gpu"):
        sgrid.grid_deployment(["H200"])


# ------------------------------------------------------------------------------------------------ inputs
@pytest.mark.parametrize("field,bad", [("steps", 2.5), ("batch", 0), ("band_batch", "1")])
def test_band_sizes_name_a_bad_size(field, bad):
    with pytest.raises((TypeError, ValueError), match=field):
        BandSizes(**{field: bad})
    with pytest.raises((TypeError, ValueError), match=field):
        PLANNER_SIZES.replace(**{field: bad})


def test_band_sizes_refuse_an_unknown_size_and_stay_frozen():
    with pytest.raises(ValueError, match="'cachesim_steps'"):
        NOTEBOOK_SIZES.replace(cachesim_steps=8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        NOTEBOOK_SIZES.steps = 8
    assert (NOTEBOOK_SIZES.steps, NOTEBOOK_SIZES.batch, NOTEBOOK_SIZES.band_batch) == (64, 4, 2)
    assert (PLANNER_SIZES.steps, PLANNER_SIZES.batch, PLANNER_SIZES.band_batch) == (32, 2, 1)
    assert PLANNER_SIZES.batch_of(True) == 2 and PLANNER_SIZES.batch_of(False) == 1
    for f in dataclasses.fields(BandSizes):               # help and unit, as the command line reads them
        assert f.metadata["help"] and f.metadata["unit"]


@pytest.mark.parametrize("field,bad", [("sizes", (8, 1, 1)), ("sizes", {"steps": 8}), ("store", "no"), ("store", 1)])
def test_grid_inputs_check_their_sizes_and_flag(field, bad):
    p = CostParams(0.6, 1.2, 46.0)
    kw = {"sizes": BandSizes(steps=8, batch=1, band_batch=1), "store": False, field: bad}
    with pytest.raises((TypeError, ValueError), match=field):
        sgrid.GridInputs(p, {"central": p}, {}, list(locality_alternatives()), **kw)
    for stored in (True, False):                     # the stored inputs and those computed here
        with pytest.raises((TypeError, ValueError), match="stored" if field == "store" else field):
            sgrid.grid_inputs(stored=bad) if field == "store" else sgrid.grid_inputs(stored=stored, **{field: bad})


def test_accept_ratio_for_and_the_planner_refuse_a_fractional_mtp():
    with pytest.raises(TypeError, match="mtp"):
        sgrid.accept_ratio_for(2.5, "paper-table1")
    with pytest.raises(TypeError, match="mtp"):
        ess.plan(MODEL, "H200", 32768, mtp=2.5)
    with pytest.raises((TypeError, ValueError), match="context_len"):
        ess.plan(MODEL, "H200", float("nan"))


def test_planner_inputs_name_their_sizes():
    from ess.planning import planner_inputs, shipped_tables
    with pytest.raises(TypeError, match="sizes"):
        planner_inputs(sizes={"steps": 8})
    with pytest.raises(TypeError, match="sizes"):
        shipped_tables([MODEL], sizes=(32, 2, 1))
    assert planner_inputs().sizes == PLANNER_SIZES
