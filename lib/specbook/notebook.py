"""The one set-up of every book notebook: params, run folder, data (collected or loaded) and the result.

    book = open_book("knob_ab", params_file, run_dir, reuse_data)
    result = book.result

`reuse_data` False collects (servers run); True loads the run folder's saved data and only analyses it.
A run resumed after an interruption says so where the book opens (specbook.run.resume.resumed_note).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbook.core.errors import RunError
from specbook.experiments.registry import ExperimentSpec

DISPLAY_OPTIONS = {"display.precision": 4, "display.max_colwidth": 200, "display.max_columns": 60,
                   "display.width": 250}


@dataclass
class Book:
    experiment: ExperimentSpec
    params: Any
    run: Any  # specbook.store.runstore.RunContext
    data: Any
    result: Any
    summary_path: Path | None = None  # where the report's summary block is saved (specbook index reads it)


def open_book(experiment: str, params_file: str, run_dir: str, reuse_data: bool = False,
              overrides: list[str] | tuple[str, ...] = (), analysis: dict[str, Any] | None = None) -> Book:
    """Params (file + overrides + analysis settings), run folder, data and result.

    As opened in Jupyter: `run_dir` "" makes a new run folder under outputs/<experiment>/ the way `specbook run`
    names it (params.yaml, data/, logs/; no manifest: only the runner records one); `params_file` relative to the
    project root is found from any cwd. With `reuse_data` the run folder's saved data is analysed again (no server)
    with its own params.yaml when `params_file` is "", and `analysis` settings ({"decision.alpha": 0.1}) applied as
    overrides; a re-analysis with settings leaves the folder's report as it is and records the params it used in
    reanalyses/<UTC time>.yaml beside it.
    """
    import pandas as pd

    import specbook.experiments  # noqa: F401  (experiments register at import)
    from specbook.core.params import load_params
    from specbook.experiments.registry import get_experiment
    from specbook.store.runstore import RunContext

    for key, value in DISPLAY_OPTIONS.items():
        pd.set_option(key, value)
    # tqdm.auto's warning where the kernel has no ipywidgets (the H200 image): it would print into the report
    # the first time a cell imports transformers (the tokenizer, the replay reference)
    warnings.filterwarnings("ignore", message="IProgress not found")
    spec = get_experiment(experiment)
    if reuse_data and not params_file and run_dir:
        params_file = str(Path(run_dir) / "params.yaml")
    all_overrides = [*overrides, *analysis_overrides(analysis or {})]
    params = load_params(spec.params_model, resolve_params_file(params_file), all_overrides)
    if not run_dir:
        if reuse_data:
            raise RunError("reuse_data = True needs run_dir: the run folder whose saved data to analyse")
        run_dir = str(new_run_dir(experiment, params, params_file))
    run = RunContext.from_run_dir(run_dir) if reuse_data else RunContext(run_dir)
    summary_path = run.run_dir / "summary.json"
    if reuse_data and analysis:  # a re-analysis with other settings leaves the run's own summary as it is
        summary_path = record_reanalysis(run.run_dir, params).with_suffix(".summary.json")
    show_resumed(run_dir)
    data = spec.require("load")(run) if reuse_data else spec.require("collect")(params, run)
    result = spec.require("analyze")(data, params)
    return Book(spec, params, run, data, result, summary_path)


def analysis_overrides(analysis: dict[str, Any]) -> list[str]:
    """{"decision.alpha": 0.1} -> ["decision.alpha=0.1"]: the same path as `-p key=value` (values as YAML)."""
    import json

    return [f"{key}={json.dumps(value)}" for key, value in analysis.items()]


def resolve_params_file(params_file: str) -> str:
    """A relative params path as given from the cwd, else from the project root (Jupyter's cwd is notebooks/)."""
    from specbook.core.paths import project_root

    path = Path(params_file)
    if params_file and not path.is_absolute() and not path.exists() and (project_root() / path).is_file():
        return str(project_root() / path)
    return params_file


def new_run_dir(experiment: str, params: Any, params_file: str) -> Path:
    """A run folder named as `specbook run` names it, with the validated params.yaml (secrets hidden)."""
    from specbook.core.params import dump_params, params_display_name
    from specbook.core.paths import outputs_dir, project_root
    from specbook.run.runner import PARAMS_YAML, make_run_dir
    from specbook.store.fingerprint import git_info
    from specbook.store.manifest import utc_now

    run_dir = make_run_dir(outputs_dir() / experiment, utc_now(), params_display_name(params, params_file),
                           git_info(project_root()).short_sha).resolve()
    dump_params(params, run_dir / PARAMS_YAML)
    return run_dir


def record_reanalysis(run_dir: Path, params: Any) -> Path:
    """reanalyses/<UTC time>.yaml: the params a re-analysis used (never replaces an earlier one)."""
    from specbook.core.params import dump_params
    from specbook.store.manifest import utc_now

    folder = Path(run_dir) / "reanalyses"
    folder.mkdir(exist_ok=True)
    stem = utc_now().strftime("%Y%m%dT%H%M%SZ")
    path, n = folder / f"{stem}.yaml", 1
    while path.exists():
        n += 1
        path = folder / f"{stem}-{n}.yaml"
    return dump_params(params, path)


def show_resumed(run_dir: str) -> str | None:
    """Show, in the report, that the run was collected in parts (resumed); returns the text shown."""
    from specbook.run.resume import resumed_note_of

    note = resumed_note_of(run_dir) if run_dir else None
    if note:
        try:
            from IPython.display import Markdown, display

            display(Markdown(note))
        except ImportError:  # outside a kernel
            print(note)
    return note
