"""The one set-up of every book notebook: params, run folder, data (collected or loaded) and the result.

    book = open_book("knob_ab", params_file, run_dir, reuse_data)
    result = book.result

`reuse_data` False collects (servers run); True loads the run folder's saved data and only analyses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specbook.experiments.registry import ExperimentSpec

DISPLAY_OPTIONS = {"display.precision": 4, "display.max_colwidth": 200, "display.max_columns": 60,
                   "display.width": 250}


@dataclass
class Book:
    experiment: ExperimentSpec
    params: Any
    run: Any  # specbook.runstore.RunContext
    data: Any
    result: Any


def open_book(experiment: str, params_file: str, run_dir: str, reuse_data: bool = False,
              overrides: list[str] | tuple[str, ...] = ()) -> Book:
    import pandas as pd

    import specbook.experiments  # noqa: F401  (experiments register at import)
    from specbook.experiments.registry import get_experiment
    from specbook.params import load_params
    from specbook.runstore import RunContext

    for key, value in DISPLAY_OPTIONS.items():
        pd.set_option(key, value)
    spec = get_experiment(experiment)
    params = load_params(spec.params_model, params_file, list(overrides))
    run = RunContext.from_run_dir(run_dir) if reuse_data else RunContext(run_dir)
    data = spec.require("load")(run) if reuse_data else spec.require("collect")(params, run)
    result = spec.require("analyze")(data, params)
    return Book(spec, params, run, data, result)
