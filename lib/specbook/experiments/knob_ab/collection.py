"""Knob A/B data: launch one fresh server per (sweep, arm) through the harness, or ingest existing logs.

Every run's rows are appended to the run folder's frames the moment the run ends (a later failure keeps
them); `load` reads them back, upgrading frames saved by older versions of specbook.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from specbook import attribution, secrets
from specbook.acceptance import Acceptance, position_column
from specbook.arms import Arm, interleaved_schedule
from specbook.engines import get_engine
from specbook.envline import read_env_line
from specbook.errors import ParamsError, RunError
from specbook.experiments.knob_ab.attribution import (
    _arm_config,
    _arm_from_glob,
    arm_signatures,
    check_inherited_knob_env,
)
from specbook.experiments.knob_ab.params import KnobABParams, resolve_path

# Frames saved in data/ (one parquet each) and what they hold.
RUNS = "runs"  # one row per (sweep, arm) server run
INTERVALS = "intervals"  # one row per SpecDecoding log interval, all runs
REQUESTS = "requests"  # one row per request, all runs
COUNTER = "counter_"  # prefix of a run's counter-delta counts (the acceptance model's columns)


@dataclass
class KnobABData:
    runs: pd.DataFrame
    intervals: pd.DataFrame
    requests: pd.DataFrame
    workload: dict[str, Any] = field(default_factory=dict)
    run_dir: Path | None = None  # where the server logs lie (start-up facts are read from them)


def run_name(order: int, sweep: int, arm: Arm) -> str:
    return f"{order:02d}-sweep{sweep}-{arm.name.replace('+', '.')}"


def _with_run_time(frame: pd.DataFrame, run_id: str) -> pd.DataFrame:
    frame = frame.copy()
    frame.insert(0, "run_id", run_id)
    frame["t_s"] = ((frame["timestamp"] - frame["timestamp"].min()).dt.total_seconds() if len(frame)
                    else pd.Series(dtype=float))
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


def collect(params: KnobABParams, ctx) -> KnobABData:
    """One fresh server per (sweep, arm), interleaved; each run's frames are saved before the next starts."""
    if params.mode == "ingest":
        return ingest(params, ctx)
    from tqdm.auto import tqdm

    from specbook import harness
    from specbook.workloads import get_workload

    w = params.workload
    gsm8k = get_workload(w.dataset)
    test_path = _readable("workload.test_path", w.test_path)
    train_path = _readable("workload.train_path", w.train_path) if w.shots else resolve_path(w.train_path)
    workloads = {}
    for sweep in range(params.sweeps):
        seed = w.subset_seed(sweep)
        if seed not in workloads:
            workloads[seed] = gsm8k.load_gsm8k(test_path, train_path, n=w.subset, seed=seed, num_shots=w.shots)
    ctx.save_json("workload", {str(seed): wl.selection for seed, wl in workloads.items()})
    requests_of = {seed: gsm8k.make_requests(wl, max_tokens=w.max_tokens, seed=w.request_seed)
                   for seed, wl in workloads.items()}
    arms = params.arms()
    check_inherited_knob_env(params, os.environ)
    ctx.save_json("arms", secrets.redact_data([a.model_dump() for a in arms]))  # arms echo the engine's env/args
    schedule = interleaved_schedule(arms, params.sweeps)
    flush = params.measurement.flush_wait_s
    flush = 2.5 * params.measurement.log_stats_interval_s if flush is None else flush

    for order, (sweep, arm) in enumerate(tqdm(schedule, desc="knob A/B runs", unit="run")):
        run_id = run_name(order, sweep, arm)
        subset_seed = w.subset_seed(sweep)
        workload, requests = workloads[subset_seed], requests_of[subset_seed]
        cfg = _arm_config(arm, params)
        row: dict[str, Any] = {"run_id": run_id, "order": order, "sweep": sweep, "declared_arm": arm.name}
        try:
            with harness.serve(cfg, ctx, run_id, extra={"arm": arm.name, "sweep": sweep}) as server:
                window = server.measure(requests, concurrency=w.concurrency, flush_wait_s=flush)
        except Exception as exc:
            row.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:2000])
            ctx.append_frame(RUNS, pd.DataFrame([row]))
            raise RunError(f"run {run_id} (arm {arm.name!r}, sweep {sweep}) failed; runs before it are saved "
                           f"in {ctx.data_dir}: {exc}") from exc
        rf = window.requests_frame()
        rf.insert(0, "run_id", run_id)
        graded = gsm8k.grade(rf, workload)
        log_env = read_env_line(server.log_path)
        ok = rf[rf["error"].isna()] if "error" in rf else rf
        row.update({
            "status": "ok",
            "subset_seed": subset_seed,
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
            "correct": int(graded["correct"].sum()),
            "total": int(len(graded)),
            **window.acceptance.counts(COUNTER),
            "versions": json.dumps(server.versions),
        })
        ctx.append_frame(REQUESTS, graded)
        ctx.append_frame(INTERVALS, _with_run_time(window.log_intervals(), run_id))
        ctx.append_frame(RUNS, pd.DataFrame([row]))
    return load(ctx)


def ingest(params: KnobABParams, ctx) -> KnobABData:
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


def load(ctx) -> KnobABData:
    """The saved frames of a run folder (what `specbook render` analyses with no server)."""
    from specbook.engines.vllm.logparse import upgrade_intervals_frame

    runs = upgrade_runs_frame(ctx.load_frame(RUNS))
    intervals = upgrade_intervals_frame(ctx.load_frame(INTERVALS)) if ctx.has_frame(INTERVALS) else pd.DataFrame()
    requests = ctx.load_frame(REQUESTS) if ctx.has_frame(REQUESTS) else pd.DataFrame()
    try:
        workload = ctx.load_json("workload")
    except RunError:
        workload = {}
    return KnobABData(runs, intervals, requests, workload, Path(ctx.run_dir))
