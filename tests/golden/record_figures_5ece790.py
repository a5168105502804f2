"""Record the headline figures that commit 5ece790's analysis computes from the golden run folders.

Run with the pre-refactor code first on the path, e.g.

    cd /work/golden-src && PYTHONPATH=/work/golden-src/lib SPECBOOK_ROOT=/work/golden-src \
        /work/main/.venv/bin/python /tmp/record_figures.py /work/main/tests/golden

For each folder it makes exactly the calls the notebooks make with reuse_data=True (loading the
folder from where it lies now) and writes <folder>/expected_figures.json:
{"experiment": ..., "code_commit": "5ece790", "figures": {name: records or value}}.

DataFrames are written as df.to_dict(orient="records") in the frame's own row order; a frame whose
index is not the default RangeIndex(0..n-1) is written as df.reset_index() first so its index is
kept as columns. numpy scalars/arrays become Python values/lists, NaN/NA/NaT become null, +-inf the
strings "inf"/"-inf", timestamps ISO strings; floats keep full precision (json's repr).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from specbook.provenance import RunContext

import specbook
from specbook.core.params import load_params
from specbook.experiments import config_flip as cf
from specbook.experiments import cross_engine as ce
from specbook.experiments import knob_ab

CODE_COMMIT = "5ece790"


def py(v):
    """A JSON-ready Python value."""
    if v is None:
        return None
    if isinstance(v, (pd.DataFrame,)):
        return records(v)
    if isinstance(v, pd.Series):
        return [py(x) for x in v.tolist()]
    if isinstance(v, dict):
        return {str(k): py(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set)):
        return [py(x) for x in v]
    if isinstance(v, np.ndarray):
        return [py(x) for x in v.tolist()]
    if isinstance(v, (pd.Timestamp, dt.datetime, dt.date)):
        return None if pd.isna(v) else v.isoformat()
    if isinstance(v, pd.Timedelta):
        return None if pd.isna(v) else v.isoformat()
    if isinstance(v, np.generic):
        v = v.item()
    if v is pd.NA or v is pd.NaT:
        return None
    if isinstance(v, float):
        if math.isnan(v):
            return None
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return v
    if isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, (np.bool_,)):
        return bool(v)
    if isinstance(v, Path):
        return str(v)
    if dataclasses.is_dataclass(v):
        return py(dataclasses.asdict(v))
    try:
        if pd.isna(v):
            return None
    except (TypeError, ValueError):
        pass
    raise TypeError(f"cannot write {type(v)!r}: {v!r}")


def records(df: pd.DataFrame | None):
    if df is None:
        return None
    idx = df.index
    default = isinstance(idx, pd.RangeIndex) and idx.start == 0 and idx.step == 1 and idx.stop == len(df)
    if not default:
        df = df.reset_index()
    # column labels must be strings in JSON; a MultiIndex column becomes "a|b"
    df = df.copy()
    df.columns = ["|".join(map(str, c)) if isinstance(c, tuple) else str(c) for c in df.columns]
    return [{k: py(v) for k, v in row.items()} for row in df.to_dict(orient="records")]


def knob_ab_figures(folder: Path) -> dict:
    params = knob_ab.load_params_file(str(folder / "params.yaml"))
    ctx = RunContext.from_run_dir(folder)
    data = knob_ab.load(ctx)
    r = knob_ab.analyze(data, params)
    figs = {}
    for name in ("attribution", "flagged_runs", "run_al", "drop_reasons", "sensitivity", "crude_vs_load",
                 "arm_summary", "comparisons", "verdict_table", "knob_verdicts", "interaction", "accuracy",
                 "per_position", "reconciliation"):
        figs[name] = records(getattr(r, name))
    figs["steady.counts"] = records(r.steady.counts)
    figs["steady.rule"] = r.steady.rule
    figs["crude.counts"] = records(r.crude.counts)
    figs["rule_text"] = r.rule_text
    figs["value_col"] = r.value_col
    figs["crude_threshold"] = py(r.crude_threshold)
    figs["notes"] = py(r.notes)
    figs["verdicts"] = [{"arm": v.arm, "baseline": v.baseline, "kind": v.kind, "conclusion": v.conclusion,
                         "text": v.text} for v in r.verdicts]
    return figs


def config_flip_figures(folder: Path) -> dict:
    params = load_params(cf.ConfigFlipParams, str(folder / "params.yaml"))
    ctx = RunContext.from_run_dir(folder)
    data = cf.load(ctx)
    summary = cf.arm_summary(data)
    equality = cf.output_equality(data)
    verdict = cf.flip_verdict(summary, cf.output_equality(data), params.collapse_fraction)
    return {
        "arm_summary": records(summary),
        "per_position_acceptance": records(cf.per_position_acceptance(data)),
        "output_equality": records(equality),
        "diff_table": records(cf.diff_table(data)),
        "flip_verdict": {**py(dataclasses.asdict(verdict)), "sentence": verdict.sentence()},
    }


def cross_engine_figures(folder: Path) -> dict:
    params = load_params(ce.CrossEngineParams, str(folder / "params.yaml"))
    ctx = RunContext.from_run_dir(folder)
    data = ce.load(ctx)
    cells = ce.cell_table(data, params.guards, ci=params.ci_level, n_boot=params.n_boot)
    cells_out = cells.copy()
    if "reasons" in cells_out:
        cells_out["reasons"] = cells_out["reasons"].map(lambda x: [str(s) for s in x] if x is not None else None)
    return {
        "cells": records(cells_out),
        "headline": records(ce.headline(cells, ci=params.ci_level, n_boot=params.n_boot)),
        "acceptance_table": records(ce.acceptance_table(data)),
        "per_position": records(ce.per_position(data)),
        "pins_table": records(ce.pins_table(data)),
        "weights_table": records(ce.weights_table(data)),
        "flagged_reasons": ce.flagged_reasons(cells),
    }


FOLDERS = {
    "knob_ab": ("knob_ab", knob_ab_figures),
    "knob_ab_ingest": ("knob_ab", knob_ab_figures),
    "config_flip": ("config_flip", config_flip_figures),
    "cross_engine": ("cross_engine", cross_engine_figures),
}


def main(root: str, names: list[str]) -> None:
    print(f"specbook imported from {specbook.__file__}")
    for name in names or list(FOLDERS):
        folder = Path(root) / name
        if not folder.is_dir():
            print(f"skip {name}: {folder} does not exist")
            continue
        experiment, fn = FOLDERS[name]
        out = {"experiment": experiment, "code_commit": CODE_COMMIT, "figures": fn(folder)}
        text = json.dumps(out, indent=1, allow_nan=False, ensure_ascii=False)
        (folder / "expected_figures.json").write_text(text + "\n", encoding="utf-8")
        print(f"wrote {folder / 'expected_figures.json'} ({len(text)} chars)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
