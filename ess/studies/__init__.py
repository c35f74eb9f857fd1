"""Studies: experiments the notebooks run on the library, built from its operations and mechanisms and run on
synthetic inputs (each says so). They are a layer above the core -- nothing in ``ess`` imports them -- so that the
library's modules hold operations and mechanisms only, and a study can change without touching them. One module per
topic: :mod:`~ess.studies.attention` (notebook 03) and :mod:`~ess.studies.locality` (notebook 04)."""
