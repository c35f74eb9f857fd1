"""Cached specs are shared by every caller (ess.specs): a field one caller could change in place changed every
later caller's spec. Each mutable field is now read-only, and the figures' dict a fresh copy per call."""
import copy
import dataclasses
import json
import pickle

import pytest

from ess.specs import (deployment_spec, gpu_spec, host_link_spec, host_spec, link_figures, list_deployments,
                       list_gpus, list_host_links, list_hosts, list_models, model_spec)

PRESETS = ([(model_spec, n) for n in list_models()] + [(gpu_spec, n) for n in list_gpus()]
           + [(host_spec, n) for n in list_hosts()] + [(deployment_spec, n) for n in list_deployments()]
           + [(host_link_spec, n) for n in list_host_links()])


def _mutable_fields(spec):
    return [f.name for f in dataclasses.fields(spec) if type(getattr(spec, f.name)) in (dict, list, set, bytearray)]


@pytest.mark.parametrize("load, name", PRESETS, ids=[f"{f.__name__}:{n}" for f, n in PRESETS])
def test_a_cached_spec_has_no_field_a_caller_can_change(load, name):
    spec = load(name)
    assert _mutable_fields(spec) == []
    key = next(iter(spec.sources))
    with pytest.raises(TypeError, match="read-only"):
        spec.sources[key] = "changed"
    with pytest.raises(TypeError, match="read-only"):
        spec.sources.pop(key)
    with pytest.raises(TypeError, match="read-only"):
        spec.sources.clear()
    assert load(name).sources[key] != "changed"


def test_read_only_sources_still_copy_pickle_and_write():
    spec = model_spec("tiny")
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert pickle.loads(pickle.dumps(spec)).sources == spec.sources
    assert copy.deepcopy(spec).sources == spec.sources
    assert json.loads(json.dumps(spec.sources)) == dict(spec.sources)
    assert dataclasses.asdict(spec)["sources"] == dict(spec.sources)
    assert dataclasses.replace(spec, n_layers=2).sources == spec.sources


def test_link_figures_are_a_fresh_copy_per_call():
    figs = link_figures()
    group = next(iter(figs))
    field = next(iter(figs[group]))
    value = figs[group][field]
    figs[group][field] = -1.0
    figs.clear()
    assert link_figures()[group][field] == value


def test_preset_listings_are_a_fresh_copy_per_call():
    for listing in (list_models, list_gpus, list_hosts, list_deployments, list_host_links):
        names = listing()
        names.clear()
        assert listing()
