"""Notebook 09's studies of the real model (SmolLM2-135M-Instruct decoding through the tiered cache,
:mod:`ess.engine`):

* :mod:`~ess.studies.real_model.measure` what the check of the simulator's overlap formulas measures on the engine
  (per-operation records, link jobs, the matrix products alone, configurations decoded interleaved);
* :mod:`~ess.studies.real_model.fit` the operation costs fitted on the calibration runs and a step's time predicted
  with :func:`ess.sim.timeline.overlap_overhead_s`;
* :mod:`~ess.studies.real_model.check` the check as a whole: its design, the held-out set, :func:`run_check` and
  what it found (:class:`OverlapCheck`);
* :mod:`~ess.studies.real_model.repeat_check` the check run several times in a row (``python -m
  ess.studies.real_model.repeat_check``);
* :mod:`~ess.studies.real_model.quality` offloaded against all-resident decoding (bit for bit), sparse against dense
  (token agreement, perplexity on held text);
* :mod:`~ess.studies.real_model.record_traces` real index sets in the :mod:`ess.traces` format (``python -m
  ess.studies.real_model.record_traces``).
"""
