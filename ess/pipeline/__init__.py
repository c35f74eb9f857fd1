"""The reproduction pipeline, the top layer of ``ess`` (nothing in the library imports it): ``ess reproduce``
executes every notebook with papermill, records every number it produced in ``build/results/``, renders the kept
figures and builds the book.

Modules, one concern each:

* :mod:`~ess.pipeline.build_folder` -- the guarded build folder: the only place ``ess`` writes and deletes, never
  the sources or a folder holding an input;
* :mod:`~ess.pipeline.notebook_process` -- one notebook executed by papermill in a process of its own;
* :mod:`~ess.pipeline.notebook` -- one notebook run into a scratch folder and swapped into place only when it
  finished (an interrupt or a failure leaves the last complete results);
* :mod:`~ess.pipeline.index` -- ``build/results/index.json``: what the run did, whose results are in place;
* :mod:`~ess.pipeline.run` -- the whole run (:func:`run_all`);
* :mod:`~ess.pipeline.figures` -- PNG/SVG of the figures a notebook keeps;
* :mod:`~ess.pipeline.book` -- the Jupyter Book build and its results page;
* :mod:`~ess.pipeline.errors` -- the errors the ``ess`` command prints as one line.
"""
from .book import build_book, check_executed, results_page, stage_book
from .build_folder import CREATED, MARKER, ROOT, BuildDir, BuildDirError
from .errors import ReproduceError, RunInterrupted
from .index import INDEX_FORMAT, load_index
from .notebook import CELL_TIMEOUT_S, NotebookRun, check_cell_timeout, run_notebook
from .run import list_notebooks, run_all, select_notebooks

__all__ = ["run_all", "run_notebook", "list_notebooks", "select_notebooks", "build_book", "stage_book",
           "check_executed", "results_page", "load_index", "check_cell_timeout", "BuildDir", "BuildDirError",
           "ReproduceError", "RunInterrupted", "NotebookRun", "CELL_TIMEOUT_S", "INDEX_FORMAT", "CREATED", "MARKER",
           "ROOT"]
