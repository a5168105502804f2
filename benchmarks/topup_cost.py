"""What a cross-engine run's timed phase spent on repeats added to reach `timing.min_timed_wall_s`, and how much of
that the rule `timing.worth_topping_up` skips: repeats for cells whose timed requests cannot time them (an output
shorter than `min_common_tokens`, a loop, or one unequal to the other side's where that side ran first).

usage: python benchmarks/topup_cost.py RUN_DIR_OR_TAR [RUN_DIR_OR_TAR ...]

Read from a run folder made before the rule (e.g. docs/reports/cross_engine-h100, or
../shared/data/h200-runs/cross_engine-h200-a0121e8.tar.gz): per side x lane, in the order the sides ran (the
first timed request's start), the timed requests and their seconds (request walls, one at a time) as the run made
them, beside what the rule would have sent: the first `warm_repeats` of every cell, and the added ones only
where it says yes. The rule decides from each side's first output as collection does. Figures only; no pass/fail.
"""

from __future__ import annotations

import argparse
import sys
import tarfile
import tempfile
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

from specbook.core.params import load_params  # noqa: E402
from specbook.experiments.cross_engine import CrossEngineParams  # noqa: E402
from specbook.experiments.cross_engine.timing import worth_topping_up  # noqa: E402


def run_folder(path: Path, scratch: Path) -> Path:
    if path.is_dir():
        return path
    with tarfile.open(path) as tar:
        tar.extractall(scratch, filter="data")
    return next(p.parent for p in scratch.rglob("manifest.json"))


def _count(row: pd.Series) -> int | None:
    n = row.get("completion_tokens")
    return int(n) if n is not None and n == n else None


def _timed_on_own_requests(run: Path, params: CrossEngineParams) -> dict[str, set[str]]:
    """Per lane, the prompts the run's analysis times on their timed requests (not on a re-run)."""
    from specbook.experiments import cross_engine as ce
    from specbook.experiments.cross_engine.timing import TIMED_REQUESTS
    from specbook.store.runstore import RunContext

    cells = ce.analyze(ce.load(RunContext.from_run_dir(run)), params).decode_cells
    own = cells[cells["timed"] & (cells["source"] == TIMED_REQUESTS)]
    return {str(lane): set(map(str, g["prompt"])) for lane, g in own.groupby("lane")}


def topups(run: Path) -> pd.DataFrame:
    params = load_params(CrossEngineParams, run / "params.yaml")
    req = pd.read_parquet(run / "data" / "requests.parquet")
    if "kind" in req:
        req = req[req["kind"] == "timed"]
    own_timed = _timed_on_own_requests(run, params)
    rows = []
    for lane, in_lane in req.groupby("lane", sort=False):
        order = in_lane.groupby("side")["started_at"].min().sort_values().index.tolist()
        firsts = {side: {str(p): g.sort_values("repeat").iloc[0]
                         for p, g in in_lane[in_lane["side"] == side].groupby("prompt")} for side in order}
        ids = {side: {p: [int(t) for t in row["token_ids"]] for p, row in firsts[side].items()} for side in order}
        for i, side in enumerate(order):
            other = ids[order[0]] if i == 1 else None
            mine = in_lane[in_lane["side"] == side]
            added = mine[mine["repeat"] >= params.warm_repeats]
            rule = [worth_topping_up(ids[side][str(p)], other.get(str(p)) if other else None,
                                     min_common_tokens=params.timing.min_common_tokens, guards=params.guards,
                                     length=_count(firsts[side][str(p)]))
                    for p in added["prompt"]]
            kept = added[pd.Series(rule, index=added.index, dtype=bool)]
            skipped = added[~pd.Series(rule, index=added.index, dtype=bool)]
            rows.append({"lane": lane, "side": side, "ran": f"{i + 1} of {len(order)}",
                         "timed requests": len(mine), "timed s": mine["wall_s"].sum(),
                         "added": len(added), "added s": added["wall_s"].sum(),
                         "added, rule": len(kept), "added s, rule": kept["wall_s"].sum(),
                         "timed s, rule": mine["wall_s"].sum() - added["wall_s"].sum() + kept["wall_s"].sum(),
                         # must be 0: the rule skips no repeat of a cell the report timed on these requests
                         "skipped in timed cells": int(skipped["prompt"].isin(own_timed.get(lane, set())).sum())})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    args = ap.parse_args(argv)
    pd.set_option("display.width", 200)
    for path in args.runs:
        with tempfile.TemporaryDirectory() as scratch:
            run = run_folder(path, Path(scratch))
            table = topups(run)
        print(f"{path}: the timed phase's requests as made vs with the rule (seconds: request walls)")
        print(table.round(1).to_string(index=False))
        made, rule = table["timed s"].sum(), table["timed s, rule"].sum()
        print(f"all: {int(table['added'].sum())} added repeats ({table['added s'].sum():.1f} s) as made; "
              f"{int(table['added, rule'].sum())} ({table['added s, rule'].sum():.1f} s) with the rule; timed "
              f"requests {made:.1f} s -> {rule:.1f} s\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
