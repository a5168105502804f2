"""Every figure an analysis computes from a golden run folder, as JSON-ready values: the canon that a redesign
must reproduce (tests/unit/test_golden_figures.py compares it with what a commit recorded).

    .venv/bin/python tests/golden/figures.py record NAME [NAME ...]   # writes tests/golden/NAME/figures.json

For one folder: the experiment's own load() and analyze() (the calls its notebook makes with reuse_data=True),
then every field of the result, nested dataclasses and pydantic models field by field, DataFrames as records in
their own row order (a non-default index kept as columns), and the report's summary block (`answer`). Strings
have the folder's location replaced by <run>, so the figures do not depend on where the folder lies. Figures
only grow: a comparison reads every recorded field, row and column, and lets new ones through.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

GOLDEN = Path(__file__).resolve().parent
FIGURES_JSON = "figures.json"
# The second golden set (tests/golden/README.md): folder -> its experiment (not every folder kept its manifest).
SECOND_SET = {"config_flip_traced": "config_flip", "cross_engine_traced": "cross_engine",
              "concurrency_curve": "concurrency_curve", "cross_engine_h200": "cross_engine",
              "cross_engine_h100_sglang_off": "cross_engine", "cross_engine_h100_sglang_ngram_forget": "cross_engine"}


def jsonable(value: Any, run: str) -> Any:
    """A JSON-ready value; NaN/NA -> None, +-inf -> "inf"/"-inf", the run folder's path -> <run>."""
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, pd.DataFrame):
        return frame_records(value, run)
    if isinstance(value, pd.Series):
        return [jsonable(v, run) for v in value.tolist()]
    if isinstance(value, dict):
        return {str(k): jsonable(v, run) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else value
        return [jsonable(v, run) for v in items]
    if isinstance(value, np.ndarray):
        return [jsonable(v, run) for v in value.tolist()]
    if isinstance(value, (pd.Timestamp, dt.datetime, dt.date, pd.Timedelta)):
        return value.isoformat()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value):
            return None
        return ("inf" if value > 0 else "-inf") if math.isinf(value) else value
    if isinstance(value, (bool, int)):
        return value
    if isinstance(value, str):
        return value.replace(run, "<run>")
    if isinstance(value, Path):
        return str(value).replace(run, "<run>")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name), run) for f in dataclasses.fields(value)}
    if hasattr(value, "model_dump"):
        return jsonable(value.model_dump(mode="json"), run)
    return jsonable(str(value), run)


def frame_records(frame: pd.DataFrame, run: str) -> list[dict[str, Any]]:
    idx = frame.index
    if not (isinstance(idx, pd.RangeIndex) and idx.start == 0 and idx.step == 1 and idx.stop == len(frame)):
        frame = frame.reset_index()
    frame = frame.copy()
    frame.columns = ["|".join(map(str, c)) if isinstance(c, tuple) else str(c) for c in frame.columns]
    return [{k: jsonable(v, run) for k, v in row.items()} for row in frame.to_dict(orient="records")]


def figures_of(folder: Path, experiment: str) -> dict[str, Any]:
    """The experiment's analysis of `folder`, every figure of its result and its summary block."""
    import warnings

    from specbook.core.params import load_params
    from specbook.experiments import get_experiment
    from specbook.store.runstore import RunContext

    warnings.filterwarnings("ignore")
    spec = get_experiment(experiment)
    params = load_params(spec.params_model, str(folder / "params.yaml"))
    result = spec.require("analyze")(spec.require("load")(RunContext.from_run_dir(folder)), params)
    run = str(folder.resolve())
    figures = jsonable(result, run)
    answer = getattr(result, "answer", None)
    if callable(answer):
        figures["answer"] = jsonable(answer(params), run)
    return {"experiment": spec.name, "figures": figures}


def record(names: list[str]) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=GOLDEN, capture_output=True, text=True,
                            check=True).stdout.strip()
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:  # analysed where it does not lie, as the test does
            folder = Path(shutil.copytree(GOLDEN / name, Path(tmp) / name))
            doc = {"code_commit": commit, **figures_of(folder, SECOND_SET[name])}
        (GOLDEN / name / FIGURES_JSON).write_text(json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
        print(f"{name}: {len(doc['figures'])} figures of {doc['experiment']} at {commit}")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "record":
        sys.exit(__doc__)
    record(list(SECOND_SET) if sys.argv[2:] == ["all"] else sys.argv[2:])
