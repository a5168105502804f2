"""Knob A/B data: launch one fresh server per (sweep, arm) through the harness, or ingest existing logs.

Every run's rows are appended to the run folder's frames the moment the run ends (a later failure keeps
them); `load` reads them back, upgrading frames saved by older versions of specbook.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from specbook import executors
from specbook.core import secrets, verdicts
from specbook.core.acceptance import Acceptance, position_column
from specbook.core.envline import read_env_line
from specbook.core.errors import ParamsError, RunError, keep_cause
from specbook.engines import get_engine
from specbook.experiments import attribution
from specbook.experiments.arms import Arm, interleaved_schedule
from specbook.experiments.knob_ab.attribution import (
    _arm_config,
    _arm_from_glob,
    arm_signatures,
    check_inherited_knob_env,
)
from specbook.experiments.knob_ab.params import KnobABParams, resolve_path
from specbook.measure.categories import measure_by_category
from specbook.store.runstore import RunContext
from specbook.store.units import Units, done_units, register_units

# Frames saved in data/ (one parquet each) and what they hold.
RUNS = "runs"  # one row per (sweep, arm) server run
INTERVALS = "intervals"  # one row per SpecDecoding log interval, all runs
CATEGORIES = "categories"  # one row per (run, task category) window: its counter deltas (specbook.measure.categories)
REQUESTS = "requests"  # one row per request, all runs
LOOKS = "sequential_looks"  # adaptive sweeps: the stopping rule's looks (JSON)
COUNTER = "counter_"  # prefix of a run's counter-delta counts (the acceptance model's columns)
# A unit of work is one (sweep, arm) server run; its runs row (appended last) says it finished.
UNITS = register_units("knob_ab", Units(
    done_frame=RUNS, key=("run_id",), frames=(RUNS, REQUESTS, INTERVALS, CATEGORIES), server="run_id", done_when={"status": "ok"}))


@dataclass
class KnobABData:
    runs: pd.DataFrame
    intervals: pd.DataFrame
    requests: pd.DataFrame
    workload: dict[str, Any] = field(default_factory=dict)
    run_dir: Path | None = None  # where the server logs lie (start-up facts are read from them)
    categories: pd.DataFrame = field(default_factory=pd.DataFrame)  # per (run, category) window; empty before
    looks: list[dict[str, Any]] = field(default_factory=list)  # adaptive sweeps: the rule's state after each look


def run_name(order: int, sweep: int, arm: Arm) -> str:
    return f"{order:02d}-sweep{sweep}-{arm.name.replace('+', '.')}"


def _with_run_time(frame: pd.DataFrame, run_id: str) -> pd.DataFrame:
    frame = frame.copy()
    frame.insert(0, "run_id", run_id)
    # llama.cpp's records are per request and carry no time stamp
    frame["t_s"] = ((frame["timestamp"] - frame["timestamp"].min()).dt.total_seconds()
                    if len(frame) and "timestamp" in frame else pd.Series(float("nan"), index=frame.index))
    return frame


def _readable(field_name: str, value: str | None) -> Path | None:
    """A params input file (read-only: it may lie anywhere), resolved and opened once; ParamsError naming the
    field, the value and the resolved path when it is missing or unreadable."""
    path = resolve_path(value)
    if path is None:
        return None
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ParamsError(f"{field_name}: {value!r} cannot be read (looked at {path}): {exc.strerror or exc}") from None
    return path


def collect(params: KnobABParams, ctx: RunContext) -> KnobABData:
    """One fresh server per (sweep, arm), interleaved; each run's frames are saved before the next starts.

    A resumed run (specbook.store.units) skips the runs the folder holds as done: same schedule, same run ids."""
    if params.mode == "ingest":
        return ingest(params, ctx)
    from specbook.core import progress
    from specbook.workloads import draw_workload

    w = params.workload
    sweeps_min, sweeps_max = params.sweep_bounds()
    workloads = {}
    for sweep in range(sweeps_max):
        seed = w.subset_seed(sweep)
        if seed not in workloads:
            workloads[seed] = draw_workload(w, seed)
    ctx.save_json("workload", {str(seed): wl.selection for seed, wl in workloads.items()})
    arms = params.arms()
    check_inherited_knob_env(params, os.environ)
    ctx.save_json("arms", secrets.redact_data([a.model_dump() for a in arms]))  # arms echo the engine's env/args
    schedule = interleaved_schedule(arms, sweeps_max)
    flush = params.measurement.flush_wait_s
    flush = 2.5 * params.measurement.log_stats_interval_s if flush is None else flush

    done = done_units(ctx, UNITS)
    units = []
    for order, (sweep, arm) in enumerate(schedule):
        run_id = run_name(order, sweep, arm)
        if (run_id,) in done:
            progress.note(f"knob A/B run {run_id} already done (resumed run), skipped")
            continue
        seed = w.subset_seed(sweep)
        units.append(executors.Unit(
            key=run_id, label=f"{run_id} (sweep {sweep}, arm {arm.name})", arm=arm.name, sweep=sweep,
            call=partial(run_one, params=params, run_id=run_id, order=order, sweep=sweep, arm=arm,
                         workload=workloads[seed], flush_wait_s=flush),
            start_ahead=partial(start_server_ahead, params=params, run_id=run_id, arm=arm),
            failed_row={"run_id": run_id, "order": order, "sweep": sweep, "declared_arm": arm.name}))
    ran = executors.run_units(units, ctx, params.executor, done_frame=RUNS, what="knob A/B run",
                              look_after=(lambda _sweep: _rule_stops(params, ctx)) if params.adaptive else None,
                              looks_from=sweeps_min, gpus_hint=executors.tensor_parallel_size(params.engine.extra_args))
    data = load(ctx)
    if ran.stopped_after_sweep is not None:
        progress.note(stop_note(ran.stopped_after_sweep + 1, data.looks))
    return data


def stop_note(sweeps: int, looks: list[dict]) -> str:
    """The console line for an adaptive run that stopped: what its last look decided. A look at sweeps_max stops
    the run while still undecided, which is not the rule deciding."""
    last = next((lk for lk in reversed(looks) if lk.get("sweeps") == sweeps), {})
    decision = last.get("decision", "unknown")
    if decision == verdicts.UNDECIDED:
        return (f"adaptive sweeps: the last look ({sweeps} sweeps, sweeps_max) left the rule undecided; "
                "the report says how many more sweeps the noise would need")
    return f"adaptive sweeps: the rule decided ({decision}) after {sweeps} sweeps; the planned runs after it are not needed"


def start_server_ahead(ctx: RunContext, *, params: KnobABParams, run_id: str, arm: Arm) -> None:
    """Launch run `run_id`'s server now; its run_one serves on it (the local executor's starts_together)."""
    from specbook.measure import harness

    harness.start_ahead(_arm_config(arm, params), ctx, run_id)


def run_one(ctx: RunContext, *, params: KnobABParams, run_id: str, order: int, sweep: int, arm: Arm, workload: Any,
            flush_wait_s: float) -> None:
    """One (sweep, arm) run on a fresh server: its requests, categories, intervals rows, then its runs row (the
    unit's done row, last). A failure appends a failed runs row and raises RunError. Executors call this in the
    kernel (local) or in a Ray task against a staging folder (specbook.executors)."""
    from specbook.measure import harness

    w = params.workload
    cfg = _arm_config(arm, params)
    row: dict[str, Any] = {"run_id": run_id, "order": order, "sweep": sweep, "declared_arm": arm.name,
                           **executors.placement_columns()}
    try:
        with harness.serve(cfg, ctx, run_id, extra={"arm": arm.name, "sweep": sweep}) as server:
            # one window per task category on this server (one category: one plain window)
            by_cat = measure_by_category(server, workload.requests, concurrency=w.concurrency,
                                         flush_wait_s=flush_wait_s)
            window = by_cat.whole
    except Exception as exc:
        row.update(status="failed", error=keep_cause(f"{type(exc).__name__}: {exc}"))
        ctx.append_frame(RUNS, pd.DataFrame([row]))
        raise RunError(f"run {run_id} (arm {arm.name!r}, sweep {sweep}) failed; runs before it are saved "
                       f"in {ctx.data_dir}: {exc}") from exc
    rf = window.requests_frame()
    rf.insert(0, "run_id", run_id)
    graded = workload.grade(rf)
    log_env = read_env_line(server.log_path)
    ok = rf[rf["error"].isna()] if "error" in rf else rf
    row.update({
        "status": "ok",
        "subset_seed": w.subset_seed(sweep),
        "request_seed": w.request_seed,
        "log_path": str(server.log_path.relative_to(ctx.run_dir)),
        # as launched, secrets hidden; attribution compares them with each arm's redacted expectation
        "argv": json.dumps(secrets.redact_argv(server.managed.argv)),
        # Attribution reads the env the log says the server ran with, not what params declared.
        "launched_env": json.dumps(secrets.redact_env(log_env if log_env is not None else server.managed.launched_env)),
        "ready_s": server.ready_s,
        "started_at": server.managed.started_at.isoformat() if server.managed.started_at else None,
        "wall_s": window.wall_s,
        "n_requests": len(rf),
        "n_errors": int(len(rf) - len(ok)),
        "completion_tokens": window.completion_tokens,
        "tok_s": window.tok_s,
        **({"correct": int(graded["correct"].sum()), "total": int(len(graded))} if "correct" in graded else {}),
        **window.acceptance.counts(COUNTER),
        "versions": json.dumps(server.versions),
    })
    ctx.append_frame(REQUESTS, graded)
    ctx.append_frame(CATEGORIES, by_cat.frame().assign(run_id=run_id, sweep=sweep))
    ctx.append_frame(INTERVALS, _with_run_time(window.log_intervals(), run_id))
    ctx.append_frame(RUNS, pd.DataFrame([row]))


def _rule_stops(params: KnobABParams, ctx: RunContext) -> bool:
    """A look of the group-sequential rule (specbook.experiments.knob_ab.sequential) after a complete sweep; every look is kept in
    data/sequential_looks.json (a resumed run repeats a look on the same runs and gets the same answer)."""
    from specbook.experiments.knob_ab import sequential

    data = load(ctx)
    state = sequential.should_continue(data.runs, params, intervals=data.intervals)
    looks = [lk for lk in data.looks if lk.get("sweeps") != state.sweeps]
    looks.append({"sweeps": state.sweeps, "decision": state.decision, "method": state.method,
                  "value_col": state.value_col, "spending": state.spending, "alpha": state.alpha,
                  "sweeps_min": state.sweeps_min, "sweeps_max": state.sweeps_max, "notes": list(state.notes),
                  "comparisons": [lk.as_dict() for lk in state.looks]})
    ctx.save_json(LOOKS, looks)
    return state.stop


def ingest(params: KnobABParams, ctx: RunContext) -> KnobABData:
    """Existing logs as runs: each file's arm comes from its `Env:` line (or the params mapping)."""
    assert params.ingest is not None
    files: list[Path] = []
    for pattern in params.ingest.logs:
        p = resolve_path(pattern)
        hits = sorted(Path(x) for x in glob.glob(str(p), recursive=True))
        if not hits:
            raise ParamsError(f"ingest.logs: {pattern!r} matches no file (looked at {p})")
        files.extend(hits)
    sigs, env_keys, _ = arm_signatures(params)
    engine = get_engine(params.engine.engine)
    runs, intervals = [], []
    per_arm_count: dict[str, int] = {}
    for order, path in enumerate(files):
        run_id = f"{order:02d}-{path.stem}"
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                iv = engine.log_intervals(fh)
        except OSError as exc:
            raise ParamsError(f"ingest.logs: {str(path)!r} cannot be read: {exc.strerror or exc}") from None
        env = read_env_line(path) or {}
        if params.ingest.arm_from == "mapping":
            a = attribution.arm_from_env_line(env, params.ingest.mapping) if not any(
                k.startswith("glob:") for k in params.ingest.mapping) else _arm_from_glob(path, params.ingest.mapping)
        else:
            a = attribution.attribute(env, [], {n: s.model_copy(update={"args": {}}) for n, s in sigs.items()},
                                      env_keys, [])
        declared = a.arm
        sweep = per_arm_count.get(declared or "?", 0)
        per_arm_count[declared or "?"] = sweep + 1
        intervals.append(_with_run_time(iv, run_id))
        runs.append({"run_id": run_id, "order": order, "sweep": sweep, "declared_arm": declared or "",
                     "status": "ingested", "log_path": str(path), "argv": "",
                     "launched_env": json.dumps(secrets.redact_env(env)),
                     "ingest_reason": a.reason})
    ctx.save_frame(RUNS, pd.DataFrame(runs))
    ctx.save_frame(INTERVALS, pd.concat(intervals, ignore_index=True))
    return load(ctx)


def upgrade_runs_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs saved by specbook before the acceptance model (commit 5ece790 and earlier): counter counts renamed,
    per-position rates (counter_per_position, JSON) turned back into the integer counts they were divided from."""
    if "counter_per_position" not in runs:
        return runs
    out = runs.rename(columns={"counter_accepted": f"{COUNTER}accepted_tokens"}).drop(columns=["counter_al"],
                                                                                        errors="ignore")
    rates = [json.loads(v) if isinstance(v, str) and v else [] for v in out.pop("counter_per_position")]
    k = max((len(r) for r in rates), default=0)
    for pos in range(k):
        out[position_column(pos + 1, COUNTER)] = [
            (round(r[pos] * d) if d else 0) if pos < len(r) else float("nan")
            for r, d in zip(rates, out[f"{COUNTER}drafts"], strict=True)]
    return out


def run_acceptance(row: Any) -> Acceptance:
    """A run's whole-window acceptance from its counter deltas."""
    return Acceptance.from_row(row, COUNTER, source="counter delta")


def load(ctx: RunContext) -> KnobABData:
    """The saved frames of a run folder (what `specbook render` analyses with no server)."""
    from specbook.engines import upgrade_log_frame

    runs = upgrade_runs_frame(ctx.load_frame(RUNS))
    intervals = upgrade_log_frame(ctx.load_frame(INTERVALS)) if ctx.has_frame(INTERVALS) else pd.DataFrame()
    requests = ctx.load_frame(REQUESTS) if ctx.has_frame(REQUESTS) else pd.DataFrame()
    try:
        workload = ctx.load_json("workload")
    except RunError:
        workload = {}
    categories = ctx.load_frame(CATEGORIES) if ctx.has_frame(CATEGORIES) else pd.DataFrame()
    try:
        looks = ctx.load_json(LOOKS)
    except RunError:
        looks = []
    return KnobABData(runs, intervals, requests, workload, Path(ctx.run_dir), categories, looks)
