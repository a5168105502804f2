"""Knob A/B: does a process-wide knob move draft acceptance more than run-to-run noise?

`collect` launches one fresh server per (sweep, arm) in an interleaved order and saves every run's
raw data the moment it is measured; `ingest` reads existing server logs instead; `analyze` turns
either into the tables and verdicts the notebook shows. The notebook decides nothing itself.
"""

from __future__ import annotations

import glob
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator

from specbook import attribution, decision, stats, steady
from specbook.arms import ARM_JOIN, BASELINE, Arm, KnobSpec, build_arms, interleaved_schedule
from specbook.decision import DecisionRule
from specbook.engines.base import EngineConfig
from specbook.engines.vllm.startup import log_startup_facts
from specbook.errors import ExperimentError, ParamsError, RunError
from specbook.experiments.registry import ExperimentSpec, register_experiment
from specbook.params import ExperimentParams
from specbook.paths import project_root

NAME = "knob_ab"
# Frames saved in data/ (one parquet each) and what they hold.
RUNS = "runs"  # one row per (sweep, arm) server run
INTERVALS = "intervals"  # one row per SpecDecoding log interval, all runs
REQUESTS = "requests"  # one row per request, all runs


class WorkloadParams(BaseModel):
    """GSM8K k-shot chat: local JSONL paths (tests, CI) or the hub (`openai/gsm8k`) when left null."""

    model_config = ConfigDict(extra="forbid")

    dataset: Literal["gsm8k"] = "gsm8k"
    test_path: str | None = Field(None, description="test.jsonl; null loads openai/gsm8k from the hub")
    train_path: str | None = Field(None, description="train.jsonl (few-shot source); null: the hub")
    subset: int | None = Field(32, ge=1, description="questions drawn from the test split; null: all")
    seed: int = Field(1234, description="seed of the subset draw (recorded with the indices)")
    shots: int = Field(5, ge=0)
    max_tokens: int = Field(256, ge=1)
    concurrency: int = Field(4, ge=1, description="requests in flight; the steady-state target")
    request_seed: int | None = Field(0, description="per-request sampling seed (greedy anyway)")
    resample_per_sweep: bool = Field(
        False, description="draw a fresh subset for each sweep (seed + sweep), the same for every arm of that "
        "sweep: run-to-run sd then includes which questions were served, the noise of a real workload; "
        "false: every sweep serves the same questions and sd is the engine's own run-to-run noise",
    )

    def subset_seed(self, sweep: int) -> int:
        return self.seed + sweep if self.resample_per_sweep else self.seed


class SteadyParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min_running_fraction: float = Field(
        0.75, ge=0, le=1, description="keep intervals with running >= this x concurrency (the load cut)"
    )
    sensitivity: list[float] = Field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    crude_al_threshold: float | None = Field(
        None, description="the crude cut to contrast with: drop intervals with AL above this; null: the "
        "baseline's pooled AL over all its intervals"
    )


class MeasurementParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    log_stats_interval_s: float = Field(1.0, gt=0, description="VLLM_LOG_STATS_INTERVAL for launched servers")
    flush_wait_s: float | None = Field(
        None, ge=0, description="wait after the last request so the last log interval is written; "
        "null: 2.5 x log_stats_interval_s"
    )
    primary: Literal["steady_log_al", "counter_al"] = Field(
        "steady_log_al", description="per-run AL the statistics use: steady-state log intervals, or whole-run counters"
    )
    n_boot: int = Field(5000, ge=100)
    bootstrap_seed: int = 0


class IngestParams(BaseModel):
    """Analyse existing server logs instead of launching servers (one file = one run)."""

    model_config = ConfigDict(extra="forbid")

    logs: list[str] = Field(min_length=1, description="globs, relative to the project root or absolute")
    arm_from: Literal["env", "mapping"] = Field(
        "env", description="env: match each file's `Env:` line against the arms' knob env; mapping: by the mapping"
    )
    mapping: dict[str, str] = Field(
        default_factory=dict,
        description="arm_from=mapping: {'KEY=VALUE [KEY2=VALUE2]' or 'glob:PATTERN': arm name}",
    )
    sweep_from_order: bool = Field(True, description="number sweeps per arm by file order")


class KnobABParams(ExperimentParams):
    mode: Literal["launch", "ingest"] = "launch"
    engine: EngineConfig
    knobs: list[KnobSpec] = Field(min_length=1)
    crossed: bool = Field(True, description="all knob combinations (2^n arms); false: baseline + each knob alone")
    sweeps: int = Field(2, ge=1, description="independent sweeps per arm, each on a fresh server")
    workload: WorkloadParams = Field(default_factory=WorkloadParams)
    steady_state: SteadyParams = Field(default_factory=SteadyParams)
    measurement: MeasurementParams = Field(default_factory=MeasurementParams)
    decision: DecisionRule = Field(default_factory=DecisionRule)
    ingest: IngestParams | None = None

    @model_validator(mode="after")
    def _ingest_needs_logs(self) -> KnobABParams:
        if self.mode == "ingest" and self.ingest is None:
            raise ValueError("mode 'ingest' needs an `ingest:` block with `logs:` globs")
        return self

    def arms(self) -> list[Arm]:
        return build_arms(self.engine.model_dump(), self.knobs, crossed=self.crossed)

    def knob(self, name: str) -> KnobSpec:
        return next(k for k in self.knobs if k.name == name)


register_experiment(ExperimentSpec(NAME, KnobABParams, "knob_ab.ipynb"))


def load_params_file(path: str) -> KnobABParams:
    from specbook.params import load_params

    return load_params(KnobABParams, path)


def resolve_path(p: str | None) -> Path | None:
    """Params paths are relative to the project root, wherever the notebook runs."""
    if p is None:
        return None
    path = Path(p).expanduser()
    return path if path.is_absolute() else (project_root() / path).resolve()


# --------------------------------------------------------------------------------------------------
# Attribution: which arm did a server really run? (from its Env: line and recorded argv)


def _arm_config(arm: Arm, params: KnobABParams) -> EngineConfig:
    cfg = EngineConfig.model_validate(arm.engine)
    env = {"VLLM_LOG_STATS_INTERVAL": f"{params.measurement.log_stats_interval_s:g}", **cfg.env}
    return cfg.model_copy(update={"env": env})


def check_inherited_knob_env(params: KnobABParams, parent_env) -> None:
    """Refuse to launch when a knob's env var is already set in the launching environment.

    A server inherits it even in arms whose knob is off, and the `Env:` line lists only what the launcher
    set or changed, so the inherited value would be invisible to attribution: those runs would count as
    the baseline while running the variant.
    """
    arms = params.arms()
    knob_keys = {k for knob in params.knobs for k in knob.env}
    inherited = sorted(k for k in knob_keys if k in parent_env and not all(
        k in (arm.engine.get("env") or {}) for arm in arms))
    if inherited:
        shown = ", ".join(f"{k}={parent_env[k]!r}" for k in inherited)
        raise ExperimentError(
            f"knob env var(s) already set in the launching environment: {shown}; arms that leave the knob off "
            f"would inherit them unseen. Unset them before `specbook run` (or set them in engine.env for every arm)"
        )


def arm_signatures(params: KnobABParams) -> tuple[dict[str, attribution.ArmSignature], list[str], list[str]]:
    """Each arm's expected knob env and args, built by the engine adapter exactly as it would launch it.

    Knob keys are the env vars any knob sets and the server options whose value differs between arms,
    so attribution compares only what the knobs change (the port, the log path... never count).
    """
    from specbook.engines import get_engine

    arms = params.arms()
    env_keys = sorted({k for knob in params.knobs for k in knob.env})
    specs = {}
    for arm in arms:
        cfg = _arm_config(arm, params)
        specs[arm.name] = get_engine(cfg.engine).build_spec(cfg, name="sig", log_path=Path("sig.log"), port=1)
    opts = {name: attribution.parse_argv_options(s.argv) for name, s in specs.items()}
    all_keys = sorted({k for o in opts.values() for k in o})
    arg_keys = [
        k for k in all_keys if len({json.dumps(o.get(k), sort_keys=True, default=str) for o in opts.values()}) > 1
    ]
    sigs = {
        name: attribution.ArmSignature.from_launch(s.env, s.argv, env_keys, arg_keys) for name, s in specs.items()
    }
    return sigs, env_keys, arg_keys


def attribute_runs(runs: pd.DataFrame, params: KnobABParams) -> pd.DataFrame:
    """Per run: the arm its real env and argv say, whether that is the declared arm, and why."""
    sigs, env_keys, arg_keys = arm_signatures(params)
    rows = []
    for r in runs.itertuples(index=False):
        env = json.loads(r.launched_env) if isinstance(r.launched_env, str) else {}
        argv = json.loads(r.argv) if isinstance(r.argv, str) and r.argv else None
        if argv is None and params.ingest is not None and params.ingest.arm_from == "mapping":
            rows.append({"run_id": r.run_id, "declared_arm": r.declared_arm, "arm": r.declared_arm or None,
                         "matches_declared": bool(r.declared_arm),
                         "reason": getattr(r, "ingest_reason", "") or "ingest.mapping"})
            continue
        if argv is None:  # ingest: only the Env: line is known; args cannot be checked
            a = attribution.attribute(env, [], {n: s.model_copy(update={"args": {}}) for n, s in sigs.items()},
                                      env_keys, [], declared=r.declared_arm or None)
        else:
            a = attribution.attribute(env, argv, sigs, env_keys, arg_keys, declared=r.declared_arm or None)
        rows.append({
            "run_id": r.run_id,
            "declared_arm": r.declared_arm,
            "arm": a.arm,
            "matches_declared": a.matches_declared if r.declared_arm else a.arm is not None,
            "reason": a.reason,
            **{f"observed {k}": v for k, v in a.observed.items()},
        })
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------------
# Collect: launch, measure, save as we go


@dataclass
class KnobABData:
    runs: pd.DataFrame
    intervals: pd.DataFrame
    requests: pd.DataFrame
    workload: dict[str, Any] = field(default_factory=dict)


def run_name(order: int, sweep: int, arm: Arm) -> str:
    return f"{order:02d}-sweep{sweep}-{arm.name.replace('+', '.')}"


def _log_frame(log_path: Path, run_id: str) -> tuple[pd.DataFrame, dict[str, str] | None, dict[str, int]]:
    from specbook.engines.vllm.logparse import intervals_frame, parse_log

    parsed = parse_log(log_path)
    frame = intervals_frame(parsed)
    frame.insert(0, "run_id", run_id)
    if len(frame):
        t0 = frame["timestamp"].min()
        frame["t_s"] = (frame["timestamp"] - t0).dt.total_seconds()
    else:
        frame["t_s"] = pd.Series(dtype=float)
    counts = {"log_lines": parsed.total_lines, "unknown_lines": parsed.unknown_lines, "broken_lines": parsed.broken_lines}
    return frame, parsed.env, counts


def collect(params: KnobABParams, ctx) -> KnobABData:
    """One fresh server per (sweep, arm), interleaved; each run's frames are saved before the next starts."""
    if params.mode == "ingest":
        return ingest(params, ctx)
    from tqdm.auto import tqdm

    from specbook.client import records_frame, run_requests_sync
    from specbook.engines import get_engine, launch
    from specbook.metrics import scrape
    from specbook.workloads import gsm8k

    w = params.workload
    workloads = {}
    for sweep in range(params.sweeps):
        seed = w.subset_seed(sweep)
        if seed not in workloads:
            workloads[seed] = gsm8k.load_gsm8k(resolve_path(w.test_path), resolve_path(w.train_path), n=w.subset,
                                               seed=seed, num_shots=w.shots)
    ctx.save_json("workload", {str(seed): wl.selection for seed, wl in workloads.items()})
    requests_of = {seed: gsm8k.make_requests(wl, max_tokens=w.max_tokens, seed=w.request_seed)
                   for seed, wl in workloads.items()}
    arms = params.arms()
    check_inherited_knob_env(params, os.environ)
    ctx.save_json("arms", [a.model_dump() for a in arms])
    schedule = interleaved_schedule(arms, params.sweeps)
    flush = params.measurement.flush_wait_s
    flush = 2.5 * params.measurement.log_stats_interval_s if flush is None else flush

    runs: list[dict[str, Any]] = []
    intervals: list[pd.DataFrame] = []
    reqs: list[pd.DataFrame] = []

    def save() -> None:
        ctx.save_frame(RUNS, pd.DataFrame(runs))
        if intervals:
            ctx.save_frame(INTERVALS, pd.concat(intervals, ignore_index=True))
        if reqs:
            ctx.save_frame(REQUESTS, pd.concat(reqs, ignore_index=True))

    for order, (sweep, arm) in enumerate(tqdm(schedule, desc="knob A/B runs", unit="run")):
        run_id = run_name(order, sweep, arm)
        subset_seed = w.subset_seed(sweep)
        workload, requests = workloads[subset_seed], requests_of[subset_seed]
        cfg = _arm_config(arm, params)
        engine = get_engine(cfg.engine)
        server = launch(cfg, name=run_id, log_path=ctx.log_path(run_id))
        row: dict[str, Any] = {"run_id": run_id, "order": order, "sweep": sweep, "declared_arm": arm.name,
                               "status": "started"}
        versions: dict[str, str] = {}
        try:
            with server as srv:
                versions = engine.probe_versions(srv.base_url)
                before = scrape(srv.base_url)
                t0 = time.monotonic()
                records = run_requests_sync(srv.base_url, cfg.client_model_name(), requests,
                                            concurrency=w.concurrency, progress=False, desc=run_id)
                wall = time.monotonic() - t0
                time.sleep(flush)  # let the server write the SpecDecoding line of the last interval
                after = scrape(srv.base_url)
                delta = engine.spec_decode_delta(before, after, model_name=cfg.client_model_name())
            row.update(status="ok")
        except Exception as exc:
            row.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:2000])
            runs.append(row)
            save()
            raise RunError(f"run {run_id} (arm {arm.name!r}, sweep {sweep}) failed; runs before it are saved "
                           f"in {ctx.data_dir}: {exc}") from exc
        finally:
            ctx.record_server(run_id, server.argv, server.launched_env,
                              versions, server.started_at, server.stopped_at,
                              server.ready_s, extra={"arm": arm.name, "sweep": sweep})
        rf = records_frame(records)
        rf.insert(0, "run_id", run_id)
        graded = gsm8k.grade(rf, workload)
        reqs.append(graded)
        iv, log_env, log_counts = _log_frame(server.log_path, run_id)
        intervals.append(iv)
        ok = rf[rf["error"].isna()] if "error" in rf else rf
        completion = int(ok["completion_tokens"].fillna(0).sum())
        row.update({
            "subset_seed": subset_seed,
            "request_seed": w.request_seed,
            "log_path": str(server.log_path.relative_to(ctx.run_dir)),
            "argv": json.dumps(server.argv),
            # Attribution reads the env the log says the server ran with, not what params declared.
            "launched_env": json.dumps(log_env if log_env is not None else server.launched_env),
            "ready_s": server.ready_s,
            "started_at": server.started_at.isoformat() if server.started_at else None,
            "wall_s": wall,
            "n_requests": len(rf),
            "n_errors": int(len(rf) - len(ok)),
            "completion_tokens": completion,
            "tok_s": completion / wall if wall > 0 else math.nan,
            "correct": int(graded["correct"].sum()),
            "total": int(len(graded)),
            "counter_drafts": delta.drafts,
            "counter_draft_tokens": delta.draft_tokens,
            "counter_accepted": delta.accepted_tokens,
            "counter_al": delta.acceptance_length,
            "counter_per_position": json.dumps(delta.per_position_acceptance),
            **log_counts,
            "versions": json.dumps(versions),
        })
        runs.append(row)
        save()
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
    runs, intervals = [], []
    per_arm_count: dict[str, int] = {}
    for order, path in enumerate(files):
        run_id = f"{order:02d}-{path.stem}"
        iv, env, counts = _log_frame(path, run_id)
        env = env or {}
        if params.ingest.arm_from == "mapping":
            a = attribution.arm_from_env_line(env, params.ingest.mapping) if not any(
                k.startswith("glob:") for k in params.ingest.mapping) else _arm_from_glob(path, params.ingest.mapping)
            declared = a.arm
        else:
            a = attribution.attribute(env, [], {n: s.model_copy(update={"args": {}}) for n, s in sigs.items()},
                                      env_keys, [])
            declared = a.arm
        sweep = per_arm_count.get(declared or "?", 0)
        per_arm_count[declared or "?"] = sweep + 1
        intervals.append(iv)
        runs.append({"run_id": run_id, "order": order, "sweep": sweep, "declared_arm": declared or "",
                     "status": "ingested", "log_path": str(path), "argv": "", "launched_env": json.dumps(env),
                     "ingest_reason": a.reason, **counts})
    ctx.save_frame(RUNS, pd.DataFrame(runs))
    ctx.save_frame(INTERVALS, pd.concat(intervals, ignore_index=True))
    return load(ctx)


def _arm_from_glob(path: Path, mapping: dict[str, str]) -> attribution.Attribution:
    for key, arm in mapping.items():
        if key.startswith("glob:") and path.match(key[5:]):
            return attribution.Attribution(arm, None, True, f"file matches {key!r}", {})
    return attribution.Attribution(None, None, False, f"{path.name} matches no glob of ingest.mapping", {})


def attention_backends_from_logs(runs: pd.DataFrame, run_dir: Path) -> pd.DataFrame:
    """Per run, the attention backend its server's log says the target and the draft used (None: not logged)."""
    out = runs.copy()
    for role in ("target", "draft"):
        out[f"attention_backend_{role}"] = None
    if "log_path" not in out:
        return out
    for i, rel in out["log_path"].items():
        if not isinstance(rel, str) or not rel:
            continue
        facts = log_startup_facts(rel if Path(rel).is_absolute() else run_dir / rel)
        for role in ("target", "draft"):
            out.at[i, f"attention_backend_{role}"] = facts.get(f"attention_backend_{role}")
    return out


def backend_knob_reach(runs: pd.DataFrame, params: KnobABParams) -> list[str]:
    """Notes for knobs that request an attention backend which a run's target or draft did not use."""
    notes = []
    for knob in params.knobs:
        wanted = knob.set.get("attention_backend")
        if wanted is None or "arm" not in runs:
            continue
        on = runs[runs["arm"].map(lambda a, k=knob.name: k in str(a).split(ARM_JOIN))]
        for role in ("target", "draft"):
            col = f"attention_backend_{role}"
            if col not in on:
                continue
            used = sorted({str(v) for v in on[col] if v is not None and v == v})
            if used and used != [str(wanted)]:
                notes.append(
                    f"knob {knob.name!r} asks for attention backend {wanted}, but the {role} of its runs used "
                    f"{', '.join(used)} (server logs): the knob did not reach the {role}"
                    + (" (vLLM selects the draft's backend on its own unless "
                       "speculative_config.attention_backend is set)" if role == "draft" else "")
                )
    return notes


def load(ctx) -> KnobABData:
    """The saved frames of a run folder (what `specbook render` analyses with no server)."""
    runs = attention_backends_from_logs(ctx.load_frame(RUNS), ctx.run_dir)
    intervals = ctx.load_frame(INTERVALS) if ctx.has_frame(INTERVALS) else pd.DataFrame()
    requests = ctx.load_frame(REQUESTS) if ctx.has_frame(REQUESTS) else pd.DataFrame()
    try:
        workload = ctx.load_json("workload")
    except RunError:
        workload = {}
    return KnobABData(runs, intervals, requests, workload)


# --------------------------------------------------------------------------------------------------
# Analysis: everything the report shows, computed here


@dataclass
class KnobABAnalysis:
    rule_text: str
    attribution: pd.DataFrame
    flagged_runs: pd.DataFrame
    run_al: pd.DataFrame  # per run: arm, steady AL, all-interval AL, counter AL, tok/s, accuracy
    steady: steady.SteadyResult
    drop_reasons: pd.DataFrame
    sensitivity: pd.DataFrame
    crude: steady.SteadyResult
    crude_vs_load: pd.DataFrame
    crude_threshold: float
    crude_explanation: str
    value_col: str
    arm_summary: pd.DataFrame
    comparisons: pd.DataFrame
    verdicts: list
    verdict_table: pd.DataFrame
    knob_verdicts: pd.DataFrame
    interaction: pd.DataFrame | None
    accuracy: pd.DataFrame
    per_position: pd.DataFrame
    reconciliation: pd.DataFrame  # per run: log totals vs counter deltas of the same window
    notes: list[str]


def _per_position_frame(runs: pd.DataFrame, intervals: pd.DataFrame, arm_of: dict[str, str]) -> pd.DataFrame:
    """Per-position acceptance per arm: counter deltas when launched, drafts-weighted log rates when ingested."""
    rows = []
    if "counter_per_position" in runs and runs["counter_per_position"].notna().any():
        for r in runs.itertuples(index=False):
            for pos, rate in enumerate(json.loads(r.counter_per_position or "[]")):
                rows.append({"run_id": r.run_id, "arm": arm_of.get(r.run_id), "position": pos + 1,
                             "acceptance": rate, "source": "counters"})
    elif len(intervals):
        pos_cols = sorted(c for c in intervals.columns if c.startswith("acceptance_pos_"))
        for run_id, part in intervals.groupby("run_id"):
            w = part["drafts"].astype(float)
            for c in pos_cols:
                rate = float((part[c] * w).sum() / w.sum()) if w.sum() > 0 else math.nan
                rows.append({"run_id": run_id, "arm": arm_of.get(run_id), "position": int(c.rsplit("_", 1)[1]) + 1,
                             "acceptance": rate, "source": "log"})
    return pd.DataFrame(rows, columns=["run_id", "arm", "position", "acceptance", "source"])


def reconcile_log_with_counters(runs: pd.DataFrame, intervals: pd.DataFrame) -> pd.DataFrame:
    """Per launched run: drafts and accepted tokens summed over its log intervals against its /metrics deltas.

    They cover the same window when the server wrote its last interval before the final scrape; a log that
    lost its tail shows here (and its log-based AL, steady or not, is then short of the counters)."""
    if "counter_drafts" not in runs or intervals.empty:
        return pd.DataFrame(columns=["run_id", "log_drafts", "counter_drafts", "log_accepted", "counter_accepted",
                                     "log_matches_counters"])
    sums = intervals.groupby("run_id")[["drafts", "accepted_tokens"]].sum()
    out = runs[["run_id", "counter_drafts", "counter_accepted"]].copy()
    out["log_drafts"] = out["run_id"].map(sums["drafts"]).fillna(0).astype(int)
    out["log_accepted"] = out["run_id"].map(sums["accepted_tokens"]).fillna(0).astype(int)
    out["log_matches_counters"] = (out["log_drafts"] == out["counter_drafts"]) & (
        out["log_accepted"] == out["counter_accepted"])
    return out[["run_id", "log_drafts", "counter_drafts", "log_accepted", "counter_accepted", "log_matches_counters"]]


def analyze(data: KnobABData, params: KnobABParams) -> KnobABAnalysis:
    notes: list[str] = []
    runs = data.runs[data.runs["status"].isin(["ok", "ingested"])].copy()
    if runs.empty:
        raise ExperimentError("no successful run to analyse")
    attr = attribute_runs(runs, params)
    flagged = attr[~attr["matches_declared"] | attr["arm"].isna()]
    if len(flagged):
        notes.append(f"{len(flagged)} run(s) ran with an env/args that differ from their declared arm; "
                     "they are analysed under the arm they really ran (or left out if unattributable).")
    arm_of = {r.run_id: r.arm for r in attr.itertuples(index=False) if r.arm is not None}
    runs["arm"] = runs["run_id"].map(arm_of)
    runs = runs[runs["arm"].notna()]

    iv = data.intervals[data.intervals["run_id"].isin(runs["run_id"])].copy()
    iv["arm"] = iv["run_id"].map(arm_of)
    conc = params.workload.concurrency
    st = steady.steady_state_filter(iv, conc, params.steady_state.min_running_fraction)
    reasons = st.dropped.assign(phase=st.dropped["reason"].str.split(":").str[0])
    drop_reasons = (reasons.groupby(["run_id", "phase"]).size().unstack(fill_value=0).reset_index()
                    if len(reasons) else pd.DataFrame(columns=["run_id"]))
    counts = st.counts.set_index("run_id")
    run_al = runs[["run_id", "arm", "sweep", "order"]].copy()
    run_al["steady_log_al"] = run_al["run_id"].map(counts["al_kept"])
    run_al["all_intervals_log_al"] = run_al["run_id"].map(
        {rid: steady.weighted_al(p) for rid, p in iv.groupby("run_id")})
    run_al["intervals_kept"] = run_al["run_id"].map(counts["kept"])
    run_al["intervals_total"] = run_al["run_id"].map(counts["intervals"])
    for col in ("counter_al", "tok_s", "wall_s", "completion_tokens", "ready_s", "correct", "total"):
        if col in runs:
            run_al[col] = runs[col].to_numpy()
    if "correct" in run_al:
        run_al["accuracy"] = run_al["correct"] / run_al["total"]

    value_col = params.measurement.primary
    if value_col not in run_al or run_al[value_col].isna().all():
        raise ExperimentError(f"measurement.primary={value_col!r} is not available for these runs "
                              f"(ingested logs have no counters: use steady_log_al)")
    if run_al[value_col].isna().any():
        bad = run_al.loc[run_al[value_col].isna(), "run_id"].tolist()
        notes.append(f"runs without a {value_col} (no steady interval) are left out: {bad}")
    valued = run_al[run_al[value_col].notna()]

    sens = steady.cut_sensitivity(iv, conc, params.steady_state.sensitivity)
    base_iv = iv[iv["arm"] == BASELINE]
    thr = params.steady_state.crude_al_threshold
    if thr is None:
        thr = steady.weighted_al(base_iv if len(base_iv) else iv)
    crude = steady.crude_al_threshold_cut(iv, thr)
    crude_runs = crude.counts.set_index("run_id")
    cmp_rows = []
    for arm, part in valued.groupby("arm", sort=False):
        ids = part["run_id"]
        cmp_rows.append({
            "arm": arm,
            "all intervals": float(part["all_intervals_log_al"].mean()),
            "load cut (steady)": float(part["steady_log_al"].mean()),
            f"crude cut (AL <= {thr:.3f})": float(crude_runs.loc[ids, "al_kept"].mean()),
            "intervals dropped by load cut": int((part["intervals_total"] - part["intervals_kept"]).sum()),
            "intervals dropped by crude cut": int(crude_runs.loc[ids, "dropped_high_al"].sum()),
        })
    crude_vs_load = pd.DataFrame(cmp_rows)

    rule = params.decision
    n_boot, seed = params.measurement.n_boot, params.measurement.bootstrap_seed
    arm_summary = stats.arm_table(valued, "arm", value_col)
    comparisons, verdicts = _judge(valued, value_col, BASELINE, rule, params, n_boot, seed)
    knob_verdicts, knob_cmp = _knob_effects(valued, value_col, rule, params, n_boot, seed)
    verdicts_all = verdicts + [v for v in knob_verdicts]
    comparisons = pd.concat([comparisons, knob_cmp], ignore_index=True) if len(knob_cmp) else comparisons

    interaction = None
    if params.crossed and len(params.knobs) == 2:
        a, b = (k.name for k in params.knobs)
        arms_present = set(valued["arm"])
        if {BASELINE, a, b, f"{a}+{b}"} <= arms_present:
            interaction = stats.interaction_2x2(valued, "arm", value_col, a, b, f"{a}+{b}", BASELINE,
                                                n_boot=n_boot, seed=seed).to_frame()
    elif params.crossed and len(params.knobs) > 2:
        notes.append("interaction is reported for two crossed knobs only")

    notes += backend_knob_reach(runs, params)
    recon = reconcile_log_with_counters(runs, iv)
    if len(recon) and not recon["log_matches_counters"].all():
        short = recon.loc[~recon["log_matches_counters"], "run_id"].tolist()
        notes.append(f"the server log and /metrics disagree for {short}: their log-based AL misses part of the "
                     "window (see the reconciliation table); counter_al covers the whole run")

    accuracy = (stats.accuracy_by_arm(valued.dropna(subset=["correct"]), "arm")
                if "correct" in valued and valued["correct"].notna().any() else pd.DataFrame())
    return KnobABAnalysis(
        rule_text=rule.describe(), attribution=attr, flagged_runs=flagged, run_al=run_al, steady=st,
        drop_reasons=drop_reasons, sensitivity=sens, crude=crude, crude_vs_load=crude_vs_load,
        crude_threshold=thr, crude_explanation=steady.explain_crude_cut_bias(), value_col=value_col,
        arm_summary=arm_summary, comparisons=comparisons, verdicts=verdicts_all,
        verdict_table=decision.verdict_table(verdicts_all), knob_verdicts=_knob_verdict_summary(verdicts_all, params),
        interaction=interaction, accuracy=accuracy, per_position=_per_position_frame(runs, iv, arm_of), reconciliation=recon, notes=notes,
    )


def _expectation_of(arm_name: str, params: KnobABParams) -> str:
    knobs = arm_name.split("+")
    expects = {params.knob(k).expect for k in knobs if k != BASELINE}
    # An arm with a knob expected to move AL is judged for a difference; otherwise for equivalence.
    return "different" if "different" in expects else "equivalent"


def _judge(df, value_col, baseline, rule, params, n_boot, seed, arms=None, label=None):
    part = df if arms is None else df[df["arm"].isin([baseline, *arms])]
    rows = stats.delta_vs_baseline(part, "arm", value_col, baseline, margin_pct=rule.tost_margin_pct,
                                   n_boot=n_boot, seed=seed)
    base = stats.summarize(part.loc[part["arm"] == baseline, value_col])
    verdicts = []
    for _, row in rows.iterrows():
        arm = row["arm"]
        knob_names = label or arm
        if _expectation_of(knob_names, params) == "different":
            verdicts.append(decision.evaluate_difference(rule, row))
        else:
            verdicts.append(decision.evaluate(rule, row, base, stats.summarize(part.loc[part["arm"] == arm, value_col])))
    return rows, verdicts


def _knob_effects(df, value_col, rule, params, n_boot, seed):
    """Each knob's effect in the presence of every other knob combination (A+B vs B: does A still hold?)."""
    if not params.crossed:
        return [], pd.DataFrame()
    arms = set(df["arm"])
    verdicts, frames = [], []
    for knob in params.knobs:
        for arm in sorted(arms):
            parts = arm.split("+")
            if arm == BASELINE or knob.name not in parts or len(parts) == 1:
                continue
            rest = [p for p in parts if p != knob.name]
            other = "+".join(rest)
            if other not in arms:
                continue
            rows, vs = _judge(df, value_col, other, rule, params, n_boot, seed, arms=[arm], label=knob.name)
            frames.append(rows)
            verdicts.extend(vs)
    return verdicts, (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame())


def _knob_verdict_summary(verdicts, params: KnobABParams) -> pd.DataFrame:
    """One line per comparison: knob expectation (stated before the run), conclusion, and whether they agree."""
    rows = []
    for v in verdicts:
        changed = [k for k in v.arm.split("+") if k not in v.baseline.split("+")]
        knob = "+".join(changed)
        expect = _expectation_of(knob, params)
        got = v.conclusion
        rows.append({
            "comparison": f"{v.arm} vs {v.baseline}",
            "knob": knob,
            "expected (stated before the run)": expect,
            "judged as": v.kind,
            "conclusion": got,
            "as expected": got == expect,
            "deterministic": v.deterministic,
        })
    return pd.DataFrame(rows)
