"""The AL-vs-concurrency curve: per arm, AL, tok/s, TTFT and ITL at each concurrency level.

One fresh server per (sweep, arm), arms interleaved as in the knob A/B; on each server every level is
its own measured window (counter snapshots around it, its own log intervals), the levels in a random
order drawn per sweep (the same order for every arm of that sweep, so arms meet the same warm-up and
drift). Intervals are across sweeps: a level's figure per arm is the mean of its sweeps' windows.

A knob's effect on AL is answered by one model over levels x arms (stats.effect_by_level on the per-sweep
paired differences, the level a factor, the sweep a block): its overall effect with its interval, labelled by
the book's vocabulary (specbook.core.verdicts) against `measurement.margin_pct`, and whether the effect depends on
concurrency (the level x arm F test and the effect's log-linear trend over the levels measured, labelled the
same way). Per-level deltas are estimates with their intervals, never labels.

Unit of work: one (sweep, arm) server; its level rows, requests and log intervals are appended when
it ends, so a failure later loses nothing measured before it (`specbook run --resume` re-runs the rest). Units
run through `specbook.executors`: one after another, or as Ray tasks over a cluster's GPUs.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specbook.core import secrets
from specbook.core.acceptance import Acceptance
from specbook.core.errors import RunError
from specbook.core.params import ExperimentParams, load_params
from specbook.engines import with_log_stats_interval
from specbook.engines.base import EngineConfig
from specbook.executors import ExecutorParams, placement
from specbook.experiments.arms import BASELINE, Arm, KnobSpec, build_arms, interleaved_schedule
from specbook.experiments.concurrency_curve import bound, capacity, extension
from specbook.experiments.registry import ExperimentSpec, register_experiment
from specbook.store.units import Units, done_units, register_units
from specbook.workloads.params import WorkloadParams

LEVELS = "levels"  # one row per (sweep, arm, level) window
REQUESTS = "requests"  # one row per request
INTERVALS = "intervals"  # one row per engine log interval, tagged with its level window
COUNTER = "counter_"  # prefix of a window's counter-delta counts (the acceptance model's columns)
# A unit of work is one (sweep, arm) server; its level rows (appended last) say it finished.
UNITS = register_units("concurrency_curve", Units(
    done_frame=LEVELS, key=("run_id",), frames=(LEVELS, REQUESTS, INTERVALS), server="run_id"))


class CurveMeasurement(BaseModel):
    model_config = ConfigDict(extra="forbid")

    log_stats_interval_s: float = Field(1.0, gt=0, description="the engine's log-statistics interval for launched "
                                        "servers (where its log reports at intervals: vLLM)")
    flush_wait_s: float | None = Field(
        None, ge=0, description="wait after a level's last request so its last log interval is written; null: "
        "2.5 x log_stats_interval_s")
    requests_per_slot: int = Field(
        2, ge=1, description="requests per level = max(min_requests, level x requests_per_slot): every slot "
        "is refilled this many times, so a level is mostly at its concurrency rather than draining")
    min_requests: int = Field(4, ge=1)
    warmup_requests: int = Field(2, ge=0, description="unmeasured requests before a server's first level")
    primary: Literal["counter_al", "steady_log_al"] = Field(
        "counter_al", description="per-window AL the curve uses: the level window's /metrics counters (every "
        "token, exact), or its steady log intervals (running >= min_running_fraction x level)")
    min_running_fraction: float = Field(0.75, ge=0, le=1)
    client_processes: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        1, description="client processes per level window (serve.clientload): 1, a number (at most the level), "
        "or auto (one per 64 requests in flight, at most half the host's cores); the same per-request records")
    ci: float = Field(0.95, gt=0, lt=1)
    margin_pct: float = Field(
        1.0, gt=0, description="equivalence margin for a knob's AL effect, +/- % of the baseline's mean AL: the "
        "overall effect (and its change across the levels) is labelled against it (specbook.core.verdicts)")
    kv_full_fraction: float = Field(
        capacity.KV_FULL_FRACTION, gt=0, le=1, description="KV cache usage (fraction of the pool, from the "
        "engine's log) at which a level counts as having filled the KV cache")


class ConcurrencyCurveParams(ExperimentParams):
    """Arms (the baseline and each knob alone) x concurrency levels x sweeps."""

    mode: Literal["launch"] = "launch"
    engine: EngineConfig
    knobs: list[KnobSpec] = Field(default_factory=list, description="each knob alone is an arm beside the baseline")
    levels: list[int] = Field(description="concurrency levels (requests in flight), e.g. [1, 2, 4, 8]")
    extend: extension.LevelExtension | None = Field(
        None, description="levels past the top until the curve ends: the run's first server multiplies the top by "
        "`factor` while tok/s still grows >= 5% per doubling and the KV cache is not full, up to `max_level`; "
        "every other server then runs the levels it reached (concurrency_curve.extension)")
    sweeps: int = Field(2, ge=2, description="fresh servers per arm; intervals are across sweeps")
    order_seed: int = Field(0, description="seed of each sweep's random level order (seed + sweep)")
    workload: WorkloadParams
    measurement: CurveMeasurement = Field(default_factory=CurveMeasurement)
    executor: ExecutorParams = Field(default_factory=ExecutorParams, description="where the runs execute: local "
                                     "(one after another) or ray (as Ray tasks over the cluster's GPUs)")

    @field_validator("levels")
    @classmethod
    def _levels(cls, v: list[int]) -> list[int]:
        if not v or any(x < 1 for x in v) or len(set(v)) != len(v):
            raise ValueError(f"levels must be distinct integers >= 1, got {v}")
        return sorted(v)

    @model_validator(mode="after")
    def _seats(self) -> ConcurrencyCurveParams:
        seqs = self.engine.max_num_seqs
        if seqs is not None and max(self.levels) > seqs:
            raise ValueError(f"levels: {max(self.levels)} exceeds engine.max_num_seqs={seqs}; the server would "
                             f"queue, not run, the extra requests")
        if self.extend is not None:
            top = max(self.levels)
            if self.extend.max_level <= top:
                raise ValueError(f"extend.max_level: {self.extend.max_level} must be above the top level {top}")
            if seqs is not None and self.extend.max_level > seqs:
                raise ValueError(f"extend.max_level: {self.extend.max_level} exceeds engine.max_num_seqs={seqs}; "
                                 f"the server would queue, not run, the extra requests")
        return self

    def arms(self) -> list[Arm]:
        return build_arms(self.engine.model_dump(exclude_none=True), self.knobs, crossed=False)

    def level_order(self, sweep: int, levels: list[int] | None = None) -> list[int]:
        """The sweep's random order of `levels` (the params' levels by default; a run that extends them passes
        the levels its first server reached)."""
        order = sorted(self.levels if levels is None else levels)
        random.Random(self.order_seed + sweep).shuffle(order)
        return order

    def requests_at(self, level: int) -> int:
        m = self.measurement
        return max(m.min_requests, level * m.requests_per_slot)


@dataclass
class CurveData:
    levels: pd.DataFrame
    requests: pd.DataFrame
    intervals: pd.DataFrame
    run_dir: Path | None = None
    workload: dict[str, Any] = field(default_factory=dict)


def run_name(order: int, sweep: int, arm: Arm) -> str:
    return f"{order:02d}-sweep{sweep}-{arm.name}"


def window_id(run_id: str, level: int) -> str:
    return f"{run_id}@c{level}"


def arm_config(arm: Arm, params: ConcurrencyCurveParams) -> EngineConfig:
    cfg = EngineConfig.model_validate(arm.engine)
    return with_log_stats_interval(cfg, params.measurement.log_stats_interval_s)


def _median(values: list[float]) -> float:
    vals = [v for v in values if v is not None and np.isfinite(v)]
    return float(np.median(vals)) if vals else float("nan")


def level_row(window: Any, level: int) -> dict[str, Any]:
    """A level window's figures: tok/s from the client, acceptance from the counters, median latencies."""
    ok = window.ok_records()
    itl = [gap for r in ok for gap in r.itl_s]
    return {
        "n_requests": len(window.records),
        "n_errors": len(window.records) - len(ok),
        "wall_s": window.wall_s,
        "completion_tokens": window.completion_tokens,
        "tok_s": window.tok_s,
        "ttft_ms": 1000 * _median([r.ttft_s for r in ok]),
        "tpot_ms": 1000 * _median([r.tpot_s for r in ok]),
        "itl_ms": 1000 * _median(itl),
        **window.acceptance.counts(COUNTER),
        **(window.client_cpu.columns() if getattr(window, "client_cpu", None) is not None else {}),
    }


def _requests(params: ConcurrencyCurveParams, draw: Any, level: int) -> list[Any]:
    """The first n requests of the sweep's workload draw (cycled), ids tagged with the level (ids stay unique)."""
    n = params.requests_at(level)
    base = draw.requests
    if not base:
        raise RunError("workload: no requests drawn")
    picked = [base[i % len(base)] for i in range(n)]
    return [r.model_copy(update={"prompt_id": f"c{level}-{i}-{r.prompt_id}"}) for i, r in enumerate(picked)]


def collect(params: ConcurrencyCurveParams, ctx: Any) -> CurveData:
    from specbook import executors
    from specbook.core import progress
    from specbook.workloads import draw_workload

    w = params.workload
    draws = {s: draw_workload(w, w.subset_seed(s)) for s in range(params.sweeps)}
    ctx.save_json("workload", {str(w.subset_seed(s)): d.selection for s, d in draws.items()})
    arms = params.arms()
    ctx.save_json("arms", secrets.redact_data([a.model_dump() for a in arms]))
    m = params.measurement
    flush = 2.5 * m.log_stats_interval_s if m.flush_wait_s is None else m.flush_wait_s
    schedule = list(enumerate(interleaved_schedule(arms, params.sweeps)))
    run = partial(executors.run_units, ctx=ctx, params=params.executor, done_frame=LEVELS, what="curve run",
                  gpus_hint=executors.tensor_parallel_size(params.engine.extra_args))

    def units(part: list[tuple[int, tuple[int, Arm]]], levels: list[int], explore: bool) -> list[Any]:
        done, out = done_units(ctx, UNITS), []
        for order, (sweep, arm) in part:
            run_id = run_name(order, sweep, arm)
            if (run_id,) in done:
                progress.note(f"curve run {run_id} already done (resumed run), skipped")
                continue
            out.append(executors.Unit(
                key=run_id, label=f"{run_id} (sweep {sweep}, arm {arm.name})", arm=arm.name, sweep=sweep,
                call=partial(run_one, params=params, run_id=run_id, order=order, sweep=sweep, arm=arm,
                             draw=draws[sweep], flush_wait_s=flush, levels=levels, explore=explore),
                start_ahead=partial(start_server_ahead, params=params, run_id=run_id, arm=arm)))
        return out

    if params.extend is None:
        run(units(schedule, params.levels, False))
        return load(ctx)
    # the first server finds the levels past the top; every other server runs the levels it reached
    run(units(schedule[:1], params.levels, True))
    levels = reached_levels(ctx, params)
    progress.note(f"curve levels for every server: {', '.join(map(str, levels))} (found by the first server)")
    run(units(schedule[1:], levels, False))
    return load(ctx)


def explorer_run_id(params: ConcurrencyCurveParams) -> str:
    """The run whose server finds the levels past the top (`extend`): the schedule's first."""
    sweep, arm = interleaved_schedule(params.arms(), params.sweeps)[0]
    return run_name(0, sweep, arm)


def reached_levels(ctx: Any, params: ConcurrencyCurveParams) -> list[int]:
    """The levels the first server measured (the params' levels and those it added), from its saved rows."""
    run_id = explorer_run_id(params)
    rows = ctx.load_frame(LEVELS) if ctx.has_frame(LEVELS) else pd.DataFrame()
    mine = rows[rows["run_id"] == run_id] if len(rows) else rows
    if not len(mine):
        raise RunError(f"curve run {run_id}: it measured no level, so the levels past the top are unknown; "
                       f"`specbook run --resume` runs it again")
    return sorted(int(x) for x in set(mine["level"]))


def start_server_ahead(ctx: Any, *, params: ConcurrencyCurveParams, run_id: str, arm: Arm) -> None:
    """Launch run `run_id`'s server now; its run_one serves on it (the local executor's starts_together)."""
    from specbook.measure import harness

    harness.start_ahead(arm_config(arm, params), ctx, run_id)


def run_one(ctx: Any, *, params: ConcurrencyCurveParams, run_id: str, order: int, sweep: int, arm: Arm, draw: Any,
            flush_wait_s: float, levels: list[int] | None = None, explore: bool = False) -> None:
    """One (sweep, arm) server and its level windows (`levels`, the params' by default, in the sweep's random
    order; with `explore`, then the levels past the top that params.extend asks for, one at a time); rows appended
    when it ends (the level rows, its done rows, last). Executors call this in the kernel (local) or in a Ray task
    against a staging folder."""
    from specbook import executors
    from specbook.core import progress
    from specbook.measure import harness

    m = params.measurement
    rows, requests, intervals = [], [], []
    where = executors.placement_columns()
    with harness.serve(arm_config(arm, params), ctx, run_id, extra={"arm": arm.name, "sweep": sweep}) as server:
        if m.warmup_requests:
            server.send(_requests(params, draw, 1)[: m.warmup_requests])

        def measure(level: int) -> None:
            window = server.measure(_requests(params, draw, level), concurrency=level, flush_wait_s=flush_wait_s,
                                    client_processes=m.client_processes)
            wid = window_id(run_id, level)
            iv = window.log_intervals()
            rows.append({"window_id": wid, "run_id": run_id, "order": order, "sweep": sweep, "arm": arm.name,
                         "level": level, "level_order": len(rows), **level_row(window, level),
                         **capacity.window_peaks(iv), "versions": json.dumps(server.versions), **where})
            rf = window.requests_frame()
            rf.insert(0, "window_id", wid)
            rf.insert(1, "level", level)
            requests.append(rf)
            iv.insert(0, "window_id", wid)
            iv.insert(1, "level", level)
            intervals.append(iv)

        for level in params.level_order(sweep, levels):
            measure(level)
        while explore and params.extend is not None:
            step = extension.next_level(pd.DataFrame(rows), params.extend, m.kv_full_fraction)
            progress.note(f"curve run {run_id}: {step.why}" + (f"; next level {step.level}" if step.level else ""))
            if step.level is None:
                break
            measure(step.level)
    for frame, name in ((requests, REQUESTS), (intervals, INTERVALS)):
        frame = [f.assign(run_id=run_id) if "run_id" not in f else f for f in frame]
        ctx.append_frame(name, pd.concat(frame, ignore_index=True))
    ctx.append_frame(LEVELS, pd.DataFrame(rows))


def load(ctx: Any) -> CurveData:
    levels = ctx.load_frame(LEVELS)
    requests = ctx.load_frame(REQUESTS) if ctx.has_frame(REQUESTS) else pd.DataFrame()
    intervals = ctx.load_frame(INTERVALS) if ctx.has_frame(INTERVALS) else pd.DataFrame()
    try:
        workload = ctx.load_json("workload")
    except RunError:
        workload = {}
    return CurveData(levels, requests, intervals, Path(ctx.run_dir), workload)


# ---------------------------------------------------------------- analysis


def window_al(data: CurveData, params: ConcurrencyCurveParams) -> pd.DataFrame:
    """Per window: AL from its counters, AL from its steady log intervals (running >= fraction x level), and
    the one the curve uses (`al`, per measurement.primary)."""
    from specbook.core.acceptance import frame_al

    out = data.levels.copy()
    out["counter_al"] = [Acceptance.from_row(r, COUNTER).al for _, r in out.iterrows()]
    steady = []
    frac = params.measurement.min_running_fraction
    for _, row in out.iterrows():
        iv = data.intervals[data.intervals["window_id"] == row["window_id"]] if len(data.intervals) else data.intervals
        if len(iv) and "running" in iv:
            kept = iv[iv["running"].astype(float) >= frac * row["level"]]
            steady.append((frame_al(kept), len(kept), len(iv)))
        else:
            steady.append((float("nan"), 0, len(iv)))
    out["steady_log_al"] = [s[0] for s in steady]
    out["steady_intervals"] = [s[1] for s in steady]
    out["log_intervals"] = [s[2] for s in steady]
    out["al"] = out[params.measurement.primary]
    return capacity.with_peaks(out, data.intervals)


def _t_interval(values: np.ndarray, ci: float) -> tuple[float, float, float, float]:
    """Mean, sd and the Student t interval of the mean across sweeps (stats.mean_t_interval)."""
    from specbook.core.stats import mean_t_interval

    vals = values[np.isfinite(values)]
    if vals.size == 0:
        return (float("nan"),) * 4
    mean, lo, hi = mean_t_interval(vals, ci)
    sd = float(vals.std(ddof=1)) if vals.size > 1 else float("nan")
    return mean, sd, lo, hi


METRICS = {"al": "AL", "tok_s": "tok/s", "ttft_ms": "TTFT ms", "itl_ms": "ITL ms"}


def curve_table(windows: pd.DataFrame, ci: float) -> pd.DataFrame:
    """One row per (arm, level, metric): mean across sweeps with its t interval, n sweeps."""
    rows = []
    for (arm, level), g in windows.groupby(["arm", "level"], sort=True):
        for col, label in METRICS.items():
            mean, sd, lo, hi = _t_interval(g[col].to_numpy(dtype=float), ci)
            rows.append({"arm": arm, "level": int(level), "metric": label, "mean": mean, "sd": sd,
                         "ci_low": lo, "ci_high": hi, "n": int(g[col].notna().sum())})
    return pd.DataFrame(rows)


def delta_table(windows: pd.DataFrame, ci: float) -> pd.DataFrame:
    """Each knob arm's AL and tok/s minus the baseline's at each level, paired by sweep (the same server
    slot in the interleaved order, the same questions), with the t interval of the paired differences: estimates
    per level (the labelled answer is `effects_table`'s, over every level at once)."""
    rows = []
    base = windows[windows["arm"] == BASELINE]
    for arm in sorted(set(windows["arm"]) - {BASELINE}):
        var = windows[windows["arm"] == arm]
        for level in sorted(set(windows["level"])):
            for col, label in (("al", "AL"), ("tok_s", "tok/s")):
                b = base[base["level"] == level].set_index("sweep")[col]
                v = var[var["level"] == level].set_index("sweep")[col]
                paired = (v - b).dropna()
                mean, sd, lo, hi = _t_interval(paired.to_numpy(dtype=float), ci)
                bmean = float(b.mean()) if len(b) else float("nan")
                rows.append({"arm": arm, "level": int(level), "metric": label, "delta": mean,
                             "delta_pct": 100 * mean / bmean if bmean else float("nan"), "ci_low": lo,
                             "ci_high": hi, "n_pairs": int(paired.size)})
    # a curve without a knob arm has no deltas: the same columns, no rows
    return pd.DataFrame(rows, columns=["arm", "level", "metric", "delta", "delta_pct", "ci_low", "ci_high", "n_pairs"])


def effects_table(windows: pd.DataFrame, ci: float) -> pd.DataFrame:
    """Per knob arm, one model of its AL effect over all levels (stats.effect_by_level on the per-sweep paired
    differences, sweep x level): the overall effect and its interval, absolute and in % of the baseline's mean
    AL; the level x arm F test; the effect's change from the lowest level to the highest along its log2 trend,
    with its interval. % figures are of the baseline's mean over the same windows."""
    from specbook.core import stats

    rows = []
    base = windows[windows["arm"] == BASELINE]
    levels = sorted(set(windows["level"]))
    for arm in sorted(set(windows["arm"]) - {BASELINE}):
        var = windows[windows["arm"] == arm]
        b = base.pivot_table(index="sweep", columns="level", values="al").reindex(columns=levels)
        v = var.pivot_table(index="sweep", columns="level", values="al").reindex(columns=levels)
        sweeps = sorted(set(b.index) & set(v.index))
        d = (v.loc[sweeps] - b.loc[sweeps]).to_numpy(dtype=float)
        e = stats.effect_by_level(d, levels, ci)
        whole = np.all(np.isfinite(d), axis=1) if len(d) else np.zeros(0, bool)
        bmean = float(np.nanmean(b.loc[sweeps].to_numpy(dtype=float)[whole])) if whole.any() else float("nan")
        pct = 100.0 / abs(bmean) if bmean else float("nan")
        rows.append({
            "arm": arm, "sweeps": e.n_blocks, "levels": len(levels), "baseline_al": bmean,
            "effect": e.overall, "effect_low": e.overall_low, "effect_high": e.overall_high, "effect_df": e.overall_df,
            "effect_se": e.overall_se, "effect_pct": e.overall * pct, "effect_low_pct": e.overall_low * pct,
            "effect_high_pct": e.overall_high * pct,
            "level_min_effect": float(np.min(e.level_means)) if e.n_blocks else float("nan"),
            "level_max_effect": float(np.max(e.level_means)) if e.n_blocks else float("nan"),
            "f_level": e.f, "f_df_level": e.f_df[0], "f_df_residual": e.f_df[1], "p_level": e.p_level,
            "trend_per_doubling": e.trend, "change": e.trend * e.span, "change_low": e.trend_low * e.span,
            "change_high": e.trend_high * e.span, "change_se": e.trend_se * e.span, "change_df": e.trend_df,
            "change_pct": e.trend * e.span * pct, "change_low_pct": e.trend_low * e.span * pct,
            "change_high_pct": e.trend_high * e.span * pct, "sweeps_left_out": e.dropped_blocks,
        })
    return pd.DataFrame(rows)


def saturation_level(curve: pd.DataFrame, arm: str, gain: float = extension.SATURATION_GAIN) -> int | None:
    """The lowest level past which tok/s grows by less than `gain` (5%) per doubling of concurrency: where
    the server stops turning more requests in flight into more throughput. None: it still grows."""
    t = curve[(curve["arm"] == arm) & (curve["metric"] == "tok/s")].sort_values("level")
    lv, tp = t["level"].to_numpy(), t["mean"].to_numpy(dtype=float)
    for i in range(len(lv) - 1):
        per_doubling = extension.per_doubling(lv[i], tp[i], lv[i + 1], tp[i + 1])
        if np.isfinite(per_doubling) and per_doubling < gain:
            return int(lv[i])
    return None


@dataclass
class CurveResult:
    windows: pd.DataFrame  # one row per (sweep, arm, level) window
    curve: pd.DataFrame  # mean and interval per (arm, level, metric)
    deltas: pd.DataFrame  # knob arm minus baseline per level
    saturation: dict[str, int | None]
    level_orders: pd.DataFrame  # the random level order each sweep used
    failed_requests: int
    notes: list[str]

    def curve_wide(self, metric: str) -> pd.DataFrame:
        """level x arm means of one metric (what the plots draw)."""
        c = self.curve[self.curve["metric"] == metric]
        return c.pivot_table(index="level", columns="arm", values="mean")

    ci_label: str = "95% t interval"
    # per arm x place (node/GPU) its servers ran on (executors.placement), with the mean window tok/s
    placement: pd.DataFrame = field(default_factory=pd.DataFrame)
    # per knob arm: its AL effect over every level in one model (effects_table)
    effects: pd.DataFrame = field(default_factory=pd.DataFrame)
    # per arm and level: the most requests running and waiting at once, the peak KV usage (capacity_table)
    capacity: pd.DataFrame = field(default_factory=pd.DataFrame)
    # with params.extend: the first server's decisions past the params' top (extension.replay)
    extension_steps: list[extension.Step] = field(default_factory=list)

    @property
    def arms(self) -> list[str]:
        """The arms, the baseline first (one colour each in every plot: plots.arm_palette)."""
        return sorted(set(self.windows["arm"]), key=lambda a: (a != BASELINE, a)) if len(self.windows) else []

    def labels(self, params: ConcurrencyCurveParams) -> dict[str, tuple[Any, Any]]:
        """knob arm -> (label of its overall AL effect, label of its change across the levels), in % of the
        baseline's mean AL against measurement.margin_pct (specbook.core.verdicts)."""
        from specbook.core import verdicts

        m, ci, out = params.measurement.margin_pct, params.measurement.ci, {}
        for _, r in self.effects.iterrows():
            pct = 100.0 / abs(r["baseline_al"])  # % of the baseline's mean AL
            levels = int(r["levels"])
            overall = verdicts.label(r["effect_pct"], r["effect_low_pct"], r["effect_high_pct"], m, level=ci,
                                     se=abs(r["effect_se"] * pct), n=int(r["sweeps"]),
                                     df_words="N - 1 (sweeps are the replicates)",
                                     no_interval="" if r["sweeps"] >= 2 else "one sweep")
            change = verdicts.label(r["change_pct"], r["change_low_pct"], r["change_high_pct"], m, level=ci,
                                    se=abs(r["change_se"] * pct), n=int(r["sweeps"]),
                                    df_at=lambda ns, k=levels: (ns - 1) * (k - 1), df_words="(N - 1)(levels - 1)",
                                    no_interval="" if r["sweeps"] >= 2 and levels >= 2 else "one sweep or one level")
            out[r["arm"]] = (overall, change)
        return out

    def answer(self, params: ConcurrencyCurveParams) -> Any:
        """The report's summary block: per knob, its AL effect over all levels and whether it depends on
        concurrency (labels from one model's intervals); per arm, where tok/s saturates in this run."""
        from specbook.core import verdicts
        from specbook.report import view as report_view

        fmt, heads = report_view.fmt, []
        expect = {k.name: k.expect for k in params.knobs}
        measured = self.levels_measured(params)
        lo_level, hi_level = min(measured), max(measured)
        labels = self.labels(params)
        for _, r in self.effects.iterrows():
            overall, change = labels[r["arm"]]
            n = int(r["sweeps"])
            wanted = expect.get(r["arm"], "unknown")
            heads.append(report_view.Headline(
                f"{r['arm']} vs baseline, all levels", overall.verdict(),
                verdicts.expectation_met(wanted, overall.word),
                f"AL {r['effect']:+.3f} ({report_view.signed_pct(r['effect_pct'])}) over levels {lo_level}-{hi_level}; "
                f"per level from {r['level_min_effect']:+.3f} to {r['level_max_effect']:+.3f} (estimates)",
                overall.interval_text(f"t over {n} sweep blocks (df {n - 1}), levels as a factor"),
                verdicts.expectation_text(wanted, overall.word), "", overall.why()))
            p = r["p_level"]
            joint = (f"level x arm F({r['f_df_level']:g}, {r['f_df_residual']:g}) = {fmt(r['f_level'], 3)}, "
                     f"p = {fmt(p, 3)}" if pd.notna(p) else "no joint test (one sweep or one level)")
            heads.append(report_view.Headline(
                f"{r['arm']}: change of its AL effect, c={lo_level} to c={hi_level}", change.verdict(), None,
                f"the effect changes by {report_view.signed_pct(r['change_pct'])} of baseline AL from c={lo_level} "
                f"to c={hi_level} along a log2 trend; {joint}",
                change.interval_text(f"within sweep blocks (df {r['change_df']:g})"), "", "",
                change.why() + (f" The joint test of any dependence on the level gives p = {fmt(p, 3)}."
                                if pd.notna(p) else "")))
        gain, m = f"{extension.SATURATION_GAIN:.0%}", params.measurement
        for arm, level in self.saturation.items():
            sweeps = int(self.windows.loc[self.windows["arm"] == arm, "sweep"].nunique())
            side = bound.bound(self.windows, arm, level)
            held = capacity.capacity(self.windows, arm, level, m.kv_full_fraction, m.min_running_fraction)
            words = [f"SATURATES AT {level}" if level is not None else "STILL GROWING"]
            # the client's bound first; on the server's side, what the engine's log says held it back
            named_by_log = held is not None and held.word is not None and (side is None or
                                                                          side.word != bound.CLIENT_BOUND)
            words += [held.word] if named_by_log else [side.word] if side is not None else []
            heads.append(report_view.Headline(
                f"{arm}: throughput", ", ".join(words) + f" {verdicts.RUN_SCOPE}", None,
                (f"tok/s grows < {gain} per doubling of concurrency past this level" if level is not None
                 else f"tok/s still grows >= {gain} per doubling at {hi_level}") + f" (means of {sweeps} sweeps)"
                + (f"; {held.text(level is not None)}" if held is not None else "")
                + (f"; {side.client_text() if named_by_log else side.text()}" if side is not None else ""),
                "no interval: read from the means of the sweeps"))
        w = self.windows
        return report_view.Summary(
            question=f"How do AL and throughput change with concurrency ({', '.join(map(str, measured))}), "
                     f"and does each knob ({', '.join(expect) or 'none'}) move AL, and does its effect depend on "
                     "concurrency?",
            headlines=heads,
            evidence=[f"{params.sweeps} sweeps x {w['arm'].nunique()} arms, a fresh server each",
                      f"{len(w)} level windows, {int(w['n_requests'].sum())} requests ({self.failed_requests} failed)",
                      *self.extension_evidence(params),
                      f"AL from {params.measurement.primary}",
                      f"labels against \u00b1{params.measurement.margin_pct:g}% of the baseline's mean AL", *self.notes],
            short=report_view.short_clause(heads))

    def levels_measured(self, params: ConcurrencyCurveParams) -> list[int]:
        """The levels the windows hold: the params' levels, and with `extend` those the first server added."""
        return sorted(int(x) for x in set(self.windows["level"])) if len(self.windows) else list(params.levels)

    def extension_evidence(self, params: ConcurrencyCurveParams) -> list[str]:
        """How the levels past the params' top were found: one line (none without `extend`)."""
        if params.extend is None:
            return []
        if not self.extension_steps:
            return [f"levels past {max(params.levels)}: none measured (the first server's windows are missing)"]
        added = [s.level for s in self.extension_steps if s.level is not None]
        end = self.extension_steps[-1]
        return [f"levels past {max(params.levels)} found by the first server ({explorer_run_id(params)}), x"
                f"{params.extend.factor} up to {params.extend.max_level}: "
                + (f"{', '.join(map(str, added))}; " if added else "none added; ")
                + f"it stopped after {end.after}: {end.why}"
                + ("" if end.level is None else " (the run ended before its next level)")]


def analyze(data: CurveData, params: ConcurrencyCurveParams) -> CurveResult:
    ci = params.measurement.ci
    windows = window_al(data, params)
    curve = curve_table(windows, ci)
    deltas = delta_table(windows, ci)
    saturation = {arm: saturation_level(curve, arm) for arm in sorted(set(windows["arm"]))}
    orders = (windows.sort_values(["sweep", "run_id", "level_order"]).groupby("sweep")
              .apply(lambda g: " → ".join(str(x) for x in g.drop_duplicates("level")["level"]), include_groups=False)
              .rename("level order").reset_index())
    notes = []
    never = windows[(windows["steady_intervals"] == 0)]
    if params.measurement.primary == "steady_log_al" and len(never):
        notes.append(f"{len(never)} window(s) had no steady log interval: their AL is missing from the curve")
    failed = int(windows["n_errors"].sum())
    if failed:
        notes.append(f"{failed} request(s) failed across all windows; tok/s counts only completed requests")
    runs = windows.drop_duplicates("run_id")
    confined = placement.confined_arms(runs)
    if confined:
        notes.append(f"arm(s) {confined} ran on one GPU only while the run used several: a GPU-to-GPU difference "
                     "would sit in their curve (executor.assignment: spread avoids this)")
    effects = effects_table(windows, ci)
    for _, r in (effects[effects["sweeps_left_out"] > 0] if len(effects) else effects).iterrows():
        notes.append(f"{r['arm']}: {r['sweeps_left_out']} sweep(s) lack a level's AL in one arm and are left out "
                     "of the model over levels")
    steps: list[extension.Step] = []
    if params.extend is not None:
        first = windows[windows["run_id"] == explorer_run_id(params)]
        if len(first):
            steps = extension.replay(first, params.levels, params.extend, params.measurement.kv_full_fraction)
    return CurveResult(windows, curve, deltas, saturation, orders, failed, notes,
                       ci_label=f"{ci:.0%} t interval", placement=placement.placement_table(runs, "tok_s"),
                       effects=effects, capacity=capacity.capacity_table(windows), extension_steps=steps)


def load_params_file(path: str) -> ConcurrencyCurveParams:
    return load_params(ConcurrencyCurveParams, path)


register_experiment(ExperimentSpec(name="concurrency_curve", params_model=ConcurrencyCurveParams,
                                   notebook="concurrency_curve.ipynb", collect=collect, load=load, analyze=analyze))
