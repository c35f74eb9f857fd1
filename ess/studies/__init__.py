"""Studies: experiments the notebooks run on the library, built from its operations and mechanisms. They are a layer
above the core -- nothing in ``ess`` imports them -- so that the library's modules hold operations and mechanisms
only, and a study can change without touching them. One module per topic, a folder where a family grows:
:mod:`~ess.studies.attention` (notebook 03, synthetic inputs), :mod:`~ess.studies.locality` and
:mod:`~ess.studies.prefetching` (notebook 04, synthetic inputs and recorded traces; prefetching returns each study's
frames and records) and :mod:`~ess.studies.real_model` (notebook 09: the real model decoding through the tiered
cache). ``tests/test_studies.py`` checks that no module of ``ess`` outside this folder imports one."""
