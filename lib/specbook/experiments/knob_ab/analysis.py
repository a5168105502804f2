"""Knob A/B analysis: every number the report shows, computed here from the saved frames (no server); the
report's texts and table shapes are in tables.py.

Attribution (which arm each server really ran), steady-state windows by load, per-run AL, deltas with
their intervals and the verdicts of the rule fixed in the params, interaction, per-position acceptance,
accuracy, and the reconciliation of log intervals with the counters of the same window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from specbook.core import acceptance, request_failures, stats, verdicts
from specbook.core.errors import ExperimentError
from specbook.core.sequential import Design
from specbook.executors import placement
from specbook.experiments.arms import BASELINE
from specbook.experiments.knob_ab import decision, steady
from specbook.experiments.knob_ab.attribution import (
    arm_of_run,
    attention_backends_from_logs,
    attribute_runs,
    backend_knob_reach,
)
from specbook.experiments.knob_ab.collection import COUNTER, KnobABData, run_acceptance
from specbook.experiments.knob_ab.params import KnobABParams
from specbook.experiments.knob_ab.tables import (
    accuracy_lead,
    adaptive_sweeps_note,
    interaction_text,
    intervals_with_arm,
    intro_text,
    knob_ab_answer,
    knobs_table,
    no_accuracy_reason,
    per_position_table,
    request_failure_table,
    runs_table,
    sensitivity_table,
    verdict_vocabulary,
)
from specbook.measure import categories
from specbook.report import view as report_view


@dataclass
class AttributionReport:
    table: pd.DataFrame  # per run: declared arm, the arm its env/argv say, whether they match, why
    flagged: pd.DataFrame  # the runs whose real settings differ from their declared arm


@dataclass
class SteadyReport:
    result: steady.SteadyResult  # the load cut: kept and dropped intervals, counts per run
    drop_reasons: pd.DataFrame  # per run: intervals dropped per phase (warm-up, dip, drain, never steady)
    sensitivity: pd.DataFrame  # AL per run and per arm as the load threshold moves
    sensitivity_table: pd.DataFrame  # fraction x arm: arm AL
    crude: steady.SteadyResult  # the cut NOT to use (AL above a threshold), shown for contrast
    crude_vs_load: pd.DataFrame
    crude_threshold: float
    crude_explanation: str
    intervals: pd.DataFrame  # every interval with its run's arm (the AL-over-time plot)
    unavailable: str = ""  # why there is no steady-state cut (an engine that prints no stats intervals)

    def _shown_unavailable(self) -> bool:
        if self.unavailable:
            from IPython.display import Markdown, display

            display(Markdown(f"Not applicable: {self.unavailable}."))
        return bool(self.unavailable)

    def show(self, palette: dict[str, str] | None = None) -> None:
        """The rule, AL over time with each run's steady window, and the interval counts (report section);
        palette: the report's arm colours (plots.arm_palette)."""
        from IPython.display import Markdown, display

        from specbook.report import plots

        if self._shown_unavailable():
            return
        display(Markdown(f"Rule: keep intervals with **{self.result.rule}**"))
        plots.al_over_time(self.intervals, self.result.kept, palette=palette)
        report_view.show_raw(self.result.counts, "intervals kept per run")
        report_view.show_raw(self.drop_reasons, "intervals dropped per run and phase")

    def show_sensitivity(self, palette: dict[str, str] | None = None) -> None:
        from specbook.report import plots

        if self._shown_unavailable():
            return
        report_view.show_table(self.sensitivity_table, index=True)
        plots.cut_sensitivity(self.sensitivity, palette=palette)

    def show_crude(self) -> None:
        from IPython.display import Markdown, display

        if self._shown_unavailable():
            return
        report_view.show_table(self.crude_vs_load)
        display(Markdown(self.crude_explanation))


@dataclass
class DecisionReport:
    rule_text: str
    value_col: str  # the per-run AL the statistics use
    run_al: pd.DataFrame  # per run: arm, steady AL, all-interval AL, counter AL, tok/s, accuracy
    arm_summary: pd.DataFrame
    comparisons: pd.DataFrame  # deltas vs baseline (and each knob with the other on), CIs, TOST, Welch
    verdicts: list
    verdict_table: pd.DataFrame  # one row per (comparison, criterion)
    knob_verdicts: pd.DataFrame  # one row per comparison: expectation stated before the run vs conclusion
    interaction: pd.DataFrame | None
    interaction_text: str = ""  # the interaction's label (specbook.core.verdicts) with A and B named, and why
    vocabulary: str = ""  # how the labels read the intervals (verdict_vocabulary)


@dataclass
class KnobABResult:
    notes: list[str]
    knobs: pd.DataFrame
    attribution: AttributionReport
    steady: SteadyReport
    decision: DecisionReport
    accuracy: pd.DataFrame
    per_position: pd.DataFrame  # per run x position (1-based): accepted, drafts, rate
    per_position_table: pd.DataFrame  # position x arm: mean rate over the arm's runs
    reconciliation: pd.DataFrame  # per run: log totals vs counter deltas of the same window
    runs: pd.DataFrame  # every server run in launch order with its raw counters
    # per run: requests, failed, the bound (measurement.max_failed_requests), valid, why a run is left out
    request_failures: pd.DataFrame = field(default_factory=pd.DataFrame)
    accuracy_note: str = ""  # why there is no accuracy table ('' when there is one)
    # per (task category, arm): counter AL over the runs' category windows with its interval (empty: one category)
    category_al: pd.DataFrame = field(default_factory=pd.DataFrame)
    category_delta: pd.DataFrame = field(default_factory=pd.DataFrame)  # per category: each arm vs baseline
    # per arm x place (node/GPU) the runs ran on (executors.placement): runs, slots, mean AL
    placement: pd.DataFrame = field(default_factory=pd.DataFrame)
    intro: str = ""  # the report's opening paragraph: the design and the workload the params name
    accuracy_lead: str = ""  # the accuracy section's first line: what it can judge, or that it cannot
    arms: list[str] = field(default_factory=list)  # the arms in the params' order (one colour each in every plot)

    def answer(self, params: KnobABParams) -> report_view.Summary:
        """The report's summary block: each comparison's verdict with its delta and interval, and the evidence."""
        return knob_ab_answer(self, params)

    def comparison_view(self) -> pd.DataFrame:
        """The comparisons a reader reads: arms, means, delta (abs, %, baseline sds), its interval in %, p values."""
        cols = ["arm", "baseline", "n_baseline", "n_variant", "baseline_mean", "variant_mean", "delta_abs",
                "delta_pct", "delta_over_baseline_sd", "ci_low_pct", "ci_high_pct", "ci_method", "ci_df", "tost_p", "p_difference",
                "welch_p"]
        c = self.decision.comparisons
        return c[[k for k in cols if k in c.columns]]


def per_position_frame(runs: pd.DataFrame, intervals: pd.DataFrame, arm_of: dict[str, str]) -> pd.DataFrame:
    """Per run x position (1-based): from the counter deltas when launched, from the log intervals when ingested."""
    if f"{COUNTER}drafts" in runs and runs[f"{COUNTER}drafts"].notna().any():
        items = [({"run_id": r["run_id"], "arm": arm_of.get(r["run_id"]), "source": "counters"}, run_acceptance(r))
                 for _, r in runs.iterrows()]
    else:
        items = [({"run_id": run_id, "arm": arm_of.get(run_id), "source": "log"}, acceptance.frame_acceptance(part))
                 for run_id, part in intervals.groupby("run_id")] if len(intervals) else []
    return acceptance.per_position_frame(items)


def reconcile_log_with_counters(runs: pd.DataFrame, intervals: pd.DataFrame) -> pd.DataFrame:
    """Per launched run: drafts and accepted tokens summed over its log intervals against its /metrics deltas.

    They cover the same window when the server wrote its last interval before the final scrape; a log that
    lost its tail shows here (and its log-based AL, steady or not, is then short of the counters)."""
    cols = ["run_id", "log_drafts", "counter_drafts", "log_accepted_tokens", "counter_accepted_tokens",
            "log_matches_counters"]
    if f"{COUNTER}drafts" not in runs or intervals.empty:
        return pd.DataFrame(columns=cols)
    sums = intervals.groupby("run_id")[["drafts", "accepted_tokens"]].sum()
    out = runs[["run_id", f"{COUNTER}drafts", f"{COUNTER}accepted_tokens"]].copy()
    out["log_drafts"] = out["run_id"].map(sums["drafts"]).fillna(0).astype(int)
    out["log_accepted_tokens"] = out["run_id"].map(sums["accepted_tokens"]).fillna(0).astype(int)
    out["log_matches_counters"] = (out["log_drafts"] == out[f"{COUNTER}drafts"]) & (
        out["log_accepted_tokens"] == out[f"{COUNTER}accepted_tokens"])
    return out[cols]


def answered_accuracy(requests: pd.DataFrame) -> pd.DataFrame:
    """Per run: correct answers among the requests that answered (a failed request is no answer), and their count."""
    if requests.empty or not {"run_id", "correct"} <= set(requests.columns):
        return pd.DataFrame(columns=["correct", "total"])
    graded = request_failures.answered(requests).groupby("run_id")["correct"]
    return pd.DataFrame({"correct": graded.sum().astype(int), "total": graded.size()})


def analyze(data: KnobABData, params: KnobABParams) -> KnobABResult:
    """The knob A/B's analysis, stage by stage: the usable runs, each attributed to the arm it really ran, their
    intervals cut to the steady state, one AL per run, the comparisons and their labels, the cross-checks."""
    notes: list[str] = []
    runs, failures = _usable_runs(data, params, notes)
    attr, flagged, arm_of, runs = _attributed(runs, params, notes)
    iv, no_cut = _arm_intervals(data, runs, arm_of, notes)
    conc = params.workload.concurrency
    st = steady.steady_state_filter(iv, conc, params.steady_state.min_running_fraction)
    reasons = st.dropped.assign(phase=st.dropped["reason"].str.split(":").str[0])
    drop_reasons = (reasons.groupby(["run_id", "phase"]).size().unstack(fill_value=0).reset_index()
                    if len(reasons) else pd.DataFrame(columns=["run_id"]))
    run_al = _run_al(data, runs, iv, st)
    value_col, valued = _valued(run_al, params, notes)
    sens = steady.cut_sensitivity(iv, conc, params.steady_state.sensitivity)
    thr, crude, crude_vs_load = _crude_vs_load(iv, valued, params)
    decided = _decide(valued, value_col, run_al, data.looks, params, notes)
    notes += backend_knob_reach(runs, params)
    recon = reconcile_log_with_counters(runs, iv)
    if len(recon) and not recon["log_matches_counters"].all():
        short = recon.loc[~recon["log_matches_counters"], "run_id"].tolist()
        notes.append(f"the server log and /metrics disagree for {short}: their log-based AL misses part of the "
                     "window (see the reconciliation table); counter_al covers the whole run")
    accuracy = (stats.accuracy_by_arm(valued.dropna(subset=["correct"]), "arm")
                if "correct" in valued and valued["correct"].notna().any() else pd.DataFrame())
    accuracy_why = "" if len(accuracy) else no_accuracy_reason(params, graded="correct" in valued)
    planned = [a.name for a in params.arms()]
    arms = [a for a in planned if a in set(valued["arm"])] + sorted(set(valued["arm"]) - set(planned))
    placed = valued.merge(runs[[c for c in ("run_id", "gpu", "slot") if c in runs]], on="run_id", how="left")
    confined = placement.confined_arms(placed)
    if confined:
        notes.append(f"arm(s) {confined} ran on one GPU only while the run used several: a GPU-to-GPU difference "
                     "would sit in their delta (see where each run ran; executor.assignment: spread avoids this)")
    per_pos = per_position_frame(runs, iv, arm_of)
    category_al, category_delta = category_tables(data, runs, arm_of, params)
    return KnobABResult(
        notes=notes,
        knobs=knobs_table(params),
        attribution=AttributionReport(attr, flagged),
        steady=SteadyReport(st, drop_reasons, sens, sensitivity_table(sens), crude, crude_vs_load, thr,
                            steady.explain_crude_cut_bias(), intervals_with_arm(iv, arm_of), no_cut),
        decision=decided,
        accuracy=accuracy,
        per_position=per_pos,
        per_position_table=per_position_table(per_pos),
        reconciliation=recon,
        runs=runs_table(runs),
        request_failures=failures,
        accuracy_note=accuracy_why,
        category_al=category_al,
        category_delta=category_delta,
        placement=placement.placement_table(placed, value_col),
        intro=intro_text(params),
        accuracy_lead=accuracy_lead(accuracy, accuracy_why, params),
        arms=arms,
    )


def _usable_runs(data: KnobABData, params: KnobABParams, notes: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The runs that finished (or were ingested), less those with more failed requests than the bound; the
    failed-requests table."""
    runs = data.runs[data.runs["status"].isin(["ok", "ingested"])].copy()
    if data.looks:
        notes.append(adaptive_sweeps_note(data.looks, runs))
    if data.run_dir is not None:
        runs = attention_backends_from_logs(runs, data.run_dir, params.engine.engine)
    failures = request_failure_table(data, runs, params.measurement.max_failed_requests)
    over = request_failures.left_out(failures, ["run_id"])
    if over:
        notes.append(f"{len(over)} run(s) left out for failed requests (see the failed-requests table): "
                     + "; ".join(f"{run_id}: {why}" for run_id, why in over.items()))
        runs = runs[~runs["run_id"].isin(list(over))]
    if runs.empty:
        raise ExperimentError("no successful run to analyse" + (f" ({len(over)} left out for failed requests, "
                                                                f"more than {request_failures.FIELD})" if over else ""))
    return runs, failures


def _attributed(runs: pd.DataFrame, params: KnobABParams, notes: list[str]):
    """Each run under the arm it really ran (its env and args), unattributable runs left out."""
    attr = attribute_runs(runs, params)
    flagged = attr[~attr["matches_declared"] | attr["arm"].isna()]
    if len(flagged):
        notes.append(f"{len(flagged)} run(s) ran with an env/args that differ from their declared arm; "
                     "they are analysed under the arm they really ran (or left out if unattributable).")
    arm_of = arm_of_run(attr)
    runs = runs.assign(arm=runs["run_id"].map(arm_of))
    return attr, flagged, arm_of, runs[runs["arm"].notna()]


def _arm_intervals(data: KnobABData, runs: pd.DataFrame, arm_of: dict, notes: list[str]) -> tuple[pd.DataFrame, str]:
    """The attributed runs' log intervals with their arm; none (and why) for an engine that logs per request."""
    iv = data.intervals[data.intervals["run_id"].isin(runs["run_id"])].copy()
    no_cut = ""
    if not steady.has_interval_columns(iv):
        # llama.cpp logs per request, SGLang per interval without counts: no load cut; AL from the counters
        no_cut = ("the engine's log has no stats intervals with acceptance counts (llama.cpp logs draft statistics "
                  "per request, SGLang an AL per interval without its counts), so there is no steady-state cut; AL "
                  "comes from the /metrics counter deltas of each run (counter_al)")
        notes.append(no_cut)
        iv = steady.empty_intervals().assign(run_id=pd.Series(dtype=str))
    iv["arm"] = iv["run_id"].map(arm_of)
    return iv, no_cut


def _run_al(data: KnobABData, runs: pd.DataFrame, iv: pd.DataFrame, st) -> pd.DataFrame:
    """One row per run: its AL by every measure (steady-state log, all intervals, counters), its speed and its
    graded answers."""
    counts = st.counts.set_index("run_id")
    run_al = runs[["run_id", "arm", "sweep", "order"]].copy()
    run_al["steady_log_al"] = run_al["run_id"].map(counts["al_kept"])
    run_al["all_intervals_log_al"] = run_al["run_id"].map(
        {rid: steady.weighted_al(p) for rid, p in iv.groupby("run_id")})
    run_al["intervals_kept"] = run_al["run_id"].map(counts["kept"])
    run_al["intervals_total"] = run_al["run_id"].map(counts["intervals"])
    if f"{COUNTER}drafts" in runs:
        run_al["counter_al"] = [run_acceptance(r).al for _, r in runs.iterrows()]
    for col in ("tok_s", "wall_s", "completion_tokens", "ready_s", "correct", "total"):
        if col in runs:
            run_al[col] = runs[col].to_numpy()
    graded = answered_accuracy(data.requests)
    for col in ("correct", "total"):  # graded over the answers; runs saved before failures counted them wrong
        if col in run_al and len(graded):
            run_al[col] = run_al["run_id"].map(graded[col]).fillna(run_al[col])
    if "correct" in run_al:
        run_al["accuracy"] = run_al["correct"] / run_al["total"]
    return run_al


def _valued(run_al: pd.DataFrame, params: KnobABParams, notes: list[str]) -> tuple[str, pd.DataFrame]:
    """The runs that have the primary measure (measurement.primary), and its column."""
    value_col = params.measurement.primary
    if value_col not in run_al or run_al[value_col].isna().all():
        raise ExperimentError(f"measurement.primary={value_col!r} is not available for these runs "
                              f"(ingested logs have no counters: use steady_log_al)")
    if run_al[value_col].isna().any():
        bad = run_al.loc[run_al[value_col].isna(), "run_id"].tolist()
        notes.append(f"runs without a {value_col} (no steady interval) are left out: {bad}")
    return value_col, run_al[run_al[value_col].notna()]


def _crude_vs_load(iv: pd.DataFrame, valued: pd.DataFrame, params: KnobABParams):
    """The crude AL-threshold cut beside the load cut, per arm: what the cruder cut would have kept."""
    base_iv = iv[iv["arm"] == BASELINE]
    thr = params.steady_state.crude_al_threshold
    if thr is None:
        thr = steady.weighted_al(base_iv if len(base_iv) else iv)
    crude = steady.crude_al_threshold_cut(iv, thr)
    crude_runs = crude.counts.set_index("run_id")
    cmp_rows = []
    for arm, part in valued.groupby("arm", sort=False):
        crude_part = crude_runs.reindex(part["run_id"])
        cmp_rows.append({
            "arm": arm,
            "all intervals": float(part["all_intervals_log_al"].mean()),
            "load cut (steady)": float(part["steady_log_al"].mean()),
            f"crude cut (AL <= {thr:.3f})": float(crude_part["al_kept"].mean()),
            "intervals dropped by load cut": int((part["intervals_total"] - part["intervals_kept"]).fillna(0).sum()),
            "intervals dropped by crude cut": int(crude_part["dropped_high_al"].fillna(0).sum()),
        })
    return thr, crude, pd.DataFrame(cmp_rows)


def _decide(valued: pd.DataFrame, value_col: str, run_al: pd.DataFrame, looks: list[dict], params: KnobABParams,
            notes: list[str]) -> DecisionReport:
    """Every comparison (each arm vs the baseline, each crossed knob with the other on) with its label and the
    stated rule's outcome; the interaction of two crossed knobs."""
    rule = params.decision
    arm_summary = stats.arm_table(valued, "arm", value_col)
    design = sweeps_design(looks, params)
    comparisons, judged = _judge(valued, value_col, BASELINE, rule, params, design=design)
    knob_judged, knob_cmp = _knob_effects(valued, value_col, rule, params, design=design)
    verdicts_all = judged + list(knob_judged)
    comparisons = pd.concat([comparisons, knob_cmp], ignore_index=True) if len(knob_cmp) else comparisons
    interaction, inter_text = None, ""
    if params.crossed and len(params.knobs) == 2:
        a, b = (k.name for k in params.knobs)
        if {BASELINE, a, b, f"{a}+{b}"} <= set(valued["arm"]):
            inter = stats.interaction_2x2(valued, "arm", value_col, a, b, f"{a}+{b}", BASELINE,
                                          ci=1 - rule.alpha, sweep_col="sweep")
            interaction, inter_text = inter.to_frame(), interaction_text(inter, rule)
    elif params.crossed and len(params.knobs) > 2:
        notes.append("interaction is reported for two crossed knobs only")
    return DecisionReport(rule.describe(), value_col, run_al, arm_summary, comparisons, verdicts_all,
                          decision.verdict_table(verdicts_all), _knob_verdict_summary(verdicts_all, params),
                          interaction, inter_text, verdict_vocabulary(rule))


def category_tables(data: KnobABData, runs: pd.DataFrame, arm_of: dict, params: KnobABParams,
                    ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """AL per task category and arm, and each arm's delta per category, from the runs' per-category windows;
    empty where the workload has one category (the headline is then that category's AL)."""
    cats = data.categories
    if cats.empty or cats["category"].nunique() < 2:
        return pd.DataFrame(), pd.DataFrame()
    cats = cats[cats["run_id"].isin(runs["run_id"])].assign(arm=lambda f: f["run_id"].map(arm_of))
    cats = cats[cats["arm"].notna()]
    return (categories.al_by_category_arm(cats),
            categories.delta_by_category(cats, BASELINE, margin_pct=params.decision.tost_margin_pct))


def _expectation_of(arm_name: str, params: KnobABParams) -> str:
    knobs = arm_name.split("+")
    expects = {params.knob(k).expect for k in knobs if k != BASELINE}
    # An arm with a knob expected to move AL is judged for a difference; otherwise for equivalence.
    return "different" if "different" in expects else "equivalent"


def sweeps_design(looks: list[dict], params: KnobABParams) -> Design | None:
    """The group-sequential design the sweeps were chosen by: as the run's looks recorded it, else as the params
    plan it (adaptive sweeps); None for a fixed number of sweeps."""
    if looks:
        return Design.of_look(looks[-1])
    lo, hi = params.sweep_bounds()
    return Design(lo, hi, params.decision.alpha, params.decision.spending) if hi > lo else None


def _judge(df, value_col, baseline, rule, params, arms=None, label=None, design=None):
    """Deltas against `baseline` and a verdict per arm: a difference for arms expected to differ, else equivalence;
    under a sequential design, on its repeated intervals."""
    return decision.compare_and_decide(
        df, "arm", value_col, baseline, rule, arms=arms, sweep_col="sweep",
        expectation=lambda arm: _expectation_of(label or arm, params), design=design,
    )


def _knob_effects(df, value_col, rule, params, design=None):
    """Each knob's effect in the presence of every other knob combination (A+B vs B: does A still hold?)."""
    if not params.crossed:
        return [], pd.DataFrame()
    arms = set(df["arm"])
    judged, frames = [], []
    for knob in params.knobs:
        for arm in sorted(arms):
            parts = arm.split("+")
            if arm == BASELINE or knob.name not in parts or len(parts) == 1:
                continue
            rest = [p for p in parts if p != knob.name]
            other = "+".join(rest)
            if other not in arms:
                continue
            rows, vs = _judge(df, value_col, other, rule, params, arms=[arm], label=knob.name, design=design)
            frames.append(rows)
            judged.extend(vs)
    return judged, (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame())


def _knob_verdict_summary(judged, params: KnobABParams) -> pd.DataFrame:
    """One line per comparison: knob expectation (stated before the run), the label (conclusion), whether the
    label is what was expected (a knob expected neutral: inside the margin; a positive control: shown
    different), and the stated rule's outcome."""
    rows = []
    for v in judged:
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
            "as expected": bool(verdicts.expectation_met(expect, got)),
            "meets the stated rule": v.meets_rule,
            "deterministic": v.deterministic,
        })
    return pd.DataFrame(rows)
