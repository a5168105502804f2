"""Knob A/B report texts and tables: the summary block, the opening paragraph, the verdict vocabulary, and the
frames the notebook shows, shaped from what analysis.py computed (no statistics here)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from specbook.core import request_failures, stats, verdicts
from specbook.experiments.knob_ab import decision
from specbook.experiments.knob_ab.collection import COUNTER, KnobABData, run_acceptance
from specbook.experiments.knob_ab.params import KnobABParams
from specbook.report import view as report_view

if TYPE_CHECKING:
    from specbook.experiments.knob_ab.analysis import KnobABResult


def knob_ab_answer(result: KnobABResult, params: KnobABParams) -> report_view.Summary:
    """Question, one headline per comparison (its label from the delta's interval, arm means and delta %, the
    interval against the margin; beside it whether the label is what the params expected and whether the stated
    rule is met, and why), evidence."""
    d = result.decision
    cmp = d.comparisons.set_index(["arm", "baseline"]) if len(d.comparisons) else None
    expected = {r["comparison"]: r["expected (stated before the run)"] for _, r in d.knob_verdicts.iterrows()}
    heads = []
    for v in d.verdicts:
        name = f"{v.arm} vs {v.baseline}"
        row = cmp.loc[(v.arm, v.baseline)] if cmp is not None and (v.arm, v.baseline) in cmp.index else None
        figure = method = ""
        if row is not None:
            figure = (f"{d.value_col} {report_view.fmt(row['variant_mean'])} vs {report_view.fmt(row['baseline_mean'])}"
                      f" ({report_view.signed_pct(row['delta_pct'])})")
            method = (row["ci_method"] if row.get("paired", False)  # the method names its sweeps and df
                      else "Welch t" + (f" (df {row['ci_df']:.3g})" if pd.notna(row.get("ci_df")) else ""))
            if str(row.get("ci_design") or ""):
                method += f"; {row['ci_design']}"
        lab = v.label
        wanted = expected.get(name, "")
        heads.append(report_view.Headline(
            name, lab.verdict(), verdicts.expectation_met(wanted, v.conclusion), figure, lab.interval_text(method),
            verdicts.expectation_text(wanted, v.conclusion), verdicts.rule_text(v.meets_rule), lab.why()))
    run_al = d.run_al
    usable = int(run_al[d.value_col].notna().sum()) if d.value_col in run_al else 0
    per_arm = run_al.loc[run_al[d.value_col].notna()].groupby("arm").size() if usable else pd.Series(dtype=int)
    sweeps = (f"{per_arm.min()} sweeps per arm" if len(per_arm) and per_arm.min() == per_arm.max()
              else f"{per_arm.min()}-{per_arm.max()} sweeps per arm" if len(per_arm) else "no usable sweep")
    lo, hi = params.sweep_bounds()
    if hi > lo:  # the params' description may name other bounds than the run's own (an override)
        sweeps += f" (adaptive sweeps {lo}..{hi})"
    knobs = ", ".join(k.name for k in params.knobs)
    return report_view.Summary(
        question=f"Does each knob ({knobs}) move draft acceptance ({d.value_col}) beyond run-to-run noise? "
                 f"{params.description}".strip(),
        headlines=heads,
        evidence=[sweeps, f"{usable} of {len(result.runs)} runs usable",
                  f"{len(result.attribution.flagged)} run(s) flagged by attribution",
                  f"{len(result.notes)} note(s)" if result.notes else "no notes"],
        short=report_view.short_clause(heads),
    )


def verdict_vocabulary(rule: decision.DecisionRule) -> str:
    """How a comparison's label reads its interval, and what the stated rule is beside it (the report's words)."""
    m, level = f"\u00b1{rule.tost_margin_pct:g}%", f"{1 - rule.alpha:.0%}"
    return (f"Each label reads the delta's {level} interval (in % of the baseline mean) against the margin {m}: "
            f"SHOWN EQUIVALENT when the whole interval lies inside {m}; SMALL REAL CHANGE, INSIDE THE MARGIN when it "
            f"also excludes 0; SHOWN DIFFERENT when it excludes 0 and reaches beyond {m}; UNDECIDED otherwise, with "
            "the sweeps its observed noise would need. The stated rule below judges the point estimate; its "
            "outcome is its own line (meets the stated rule: yes / no), and whether a label is what the params "
            "expected before the run is a third.")


def workload_text(params: KnobABParams) -> str:
    """The workload the params name, in words: what every arm of a sweep serves."""
    if params.mode == "ingest":
        return "existing server logs (ingest mode: no requests were sent by this run)"
    w = params.workload
    fresh = "drawn afresh each sweep" if w.resample_per_sweep else "the same in every sweep"
    sent = f"{w.concurrency} requests in flight, at most {w.max_tokens} tokens each"
    if w.dataset == "spec_bench":
        each = "all questions" if w.per_category is None else f"{w.per_category} questions"
        mt = ", MT-Bench as two turns" if w.turns == 2 and "mt_bench" in w.categories else ""
        return (f"Spec-Bench, {len(w.categories)} task group(s) ({', '.join(w.categories)}), {each} per group "
                f"({fresh}){mt}, each group in its own window; {sent}")
    if w.dataset == "gsm8k":
        qs = "every test question" if w.subset is None else f"{w.subset} test questions"
        return f"GSM8K {w.shots}-shot chat, {qs} ({fresh}); {sent}"
    source = w.path or w.hub_id
    qs = "every prompt" if w.subset is None else f"{w.subset} prompts per category"
    return f"prompts from {source} ({qs}, {fresh}); {sent}"


def intro_text(params: KnobABParams) -> str:
    """The report's opening paragraph, following the params (their workload, mode and arms)."""
    if params.mode == "ingest":
        how = ("Each run is one existing server log, attributed to the arm its recorded environment names; "
               "no server was launched.")
    else:
        how = ("Each arm is the baseline server with some knobs switched on. Every sweep starts a fresh server per "
               "arm, in an interleaved order, and every arm of a sweep serves the same requests.")
    return (f"{how} Workload: {workload_text(params)}. Acceptance length (AL) counts the bonus token: "
            "AL = 1 + accepted / drafts. The decision rule below was fixed in the params file before any data was "
            "seen.")


def accuracy_lead(accuracy: pd.DataFrame, reason: str, params: KnobABParams) -> str:
    """The accuracy section's first line: that it cannot judge (no reference answers, no graded request), or
    what it measures and the smallest change its counts could show."""
    if not len(accuracy):
        return f"**This section cannot judge accuracy.** {reason}"
    per_arm = int(accuracy["total"].min())
    half = float(((accuracy["wilson_high"] - accuracy["wilson_low"]) / 2).max())
    return (f"{params.workload.dataset.upper() if params.workload.dataset == 'gsm8k' else params.workload.dataset} "
            f"exact-answer accuracy per arm, counts pooled over sweeps, with the per-sweep spread. With {per_arm} "
            f"graded answers per arm (fewest), each arm's {accuracy['ci'].iloc[0]:.0%} Wilson interval is up to "
            f"\u00b1{100 * half:.0f} points wide: a change in accuracy smaller than that cannot be seen here. Under "
            "greedy decoding speculation is lossless, so accuracy moves only with the target's numerics (e.g. "
            "--dtype).")


def interaction_text(inter: stats.InteractionResult, rule: decision.DecisionRule) -> str:
    """The interaction's label (specbook.core.verdicts) in % of the baseline mean, A and B named, with why."""
    from scipy import stats as sps

    a, b, ab, base = inter.arms
    scale = 100.0 / abs(inter.baseline_mean) if inter.baseline_mean else float("nan")
    est, lo, hi = inter.interaction * scale, inter.ci_low * scale, inter.ci_high * scale
    paired = inter.method.startswith("paired t")
    se = ((hi - lo) / 2 / float(sps.t.ppf(0.5 + inter.ci / 2, inter.df))
          if paired and pd.notna(lo) and pd.notna(inter.df) and inter.df > 0 else None)
    if pd.notna(lo) and pd.notna(hi):
        lo, hi = min(lo, hi), max(lo, hi)
    lab = verdicts.label(est, lo, hi, rule.tost_margin_pct, level=inter.ci, se=se,
                         n=int(round(inter.df)) + 1 if se is not None else None,
                         no_interval="" if pd.notna(lo) else inter.method)
    return (f"A = {a}, B = {b}, A+B = {ab}: interaction ({ab} - {b}) - ({a} - {base}) "
            f"{report_view.signed_pct(est)} of the baseline mean, **{lab.verdict()}** "
            f"({lab.interval_text(stats.method_label(inter.method, inter.df))}). {lab.why()} Inside the margin the "
            "two knobs' effects add up; excluding 0 they do not.")


def knobs_table(params: KnobABParams) -> pd.DataFrame:
    return pd.DataFrame([{"knob": k.name, "what it changes": k.description, "env": k.env, "args": k.args,
                          "fields": k.set, "expected": k.expect} for k in params.knobs])


def intervals_with_arm(intervals: pd.DataFrame, arm_of: dict[str, str]) -> pd.DataFrame:
    return intervals.assign(arm=intervals["run_id"].map(arm_of)) if len(intervals) else intervals


def sensitivity_table(sens: pd.DataFrame) -> pd.DataFrame:
    return sens[sens["scope"] == "arm"].pivot_table(index="fraction", columns="arm", values="al")


def per_position_table(per_pos: pd.DataFrame) -> pd.DataFrame:
    return per_pos.pivot_table(index="position", columns="arm", values="rate") if len(per_pos) else pd.DataFrame()


RUN_COLUMNS = ["run_id", "order", "sweep", "declared_arm", "status", "attention_backend_target",
               "attention_backend_draft", "ready_s", "wall_s", "completion_tokens", "tok_s", "n_errors",
               f"{COUNTER}drafts", f"{COUNTER}accepted_tokens", "correct", "total"]


def runs_table(runs: pd.DataFrame) -> pd.DataFrame:
    out = runs[[c for c in RUN_COLUMNS if c in runs]].copy()
    if f"{COUNTER}drafts" in runs:
        out["counter_al"] = [run_acceptance(r).al for _, r in runs.iterrows()]
    return out


def request_failure_table(data: KnobABData, runs: pd.DataFrame, max_failed: int) -> pd.DataFrame:
    """Per launched run that finished: its requests, how many failed, and whether it stays in the analysis."""
    table = request_failures.failure_table(data.requests, ["run_id"], max_failed)
    return table[table["run_id"].isin(runs["run_id"])].reset_index(drop=True)


def no_accuracy_reason(params: KnobABParams, graded: bool) -> str:
    """Why a report has no accuracy table: ingested logs, a workload whose draw has no grader (its requests
    carry no `correct` column: graded False), or no graded request of a usable run."""
    if params.mode == "ingest":
        return "Ingested logs carry no outputs: no accuracy."
    if not graded:
        return f"The {params.workload.dataset} workload has no reference answers to grade: no accuracy."
    return "No request of a usable run was graded: no accuracy."


def server_minutes(runs: pd.DataFrame) -> float:
    """Server time the runs cost: start-up (ready_s) plus the measured window (wall_s), in minutes."""
    cols = [c for c in ("ready_s", "wall_s") if c in runs]
    return float(runs[cols].fillna(0).to_numpy().sum() / 60) if cols else float("nan")


def adaptive_sweeps_note(looks: list[dict], runs: pd.DataFrame) -> str:
    """What the group-sequential stopping rule decided, after how many sweeps, at what server cost; the looks'
    words in the book's vocabulary (sequential.look_word reads what older runs recorded)."""
    from specbook.experiments.knob_ab.sequential import UNDECIDED, look_word

    last = looks[-1]

    def word(recorded: str) -> str:
        w = look_word(recorded)
        return f"{w} at sweeps_max" if w == UNDECIDED else w

    per = "; ".join(f"{c['arm']}: {word(c['decision'])}" for c in last.get("comparisons", []))
    return (f"adaptive sweeps ({last['sweeps_min']}..{last['sweeps_max']}): after {last['sweeps']} sweeps the "
            f"group-sequential rule ({last['method']}, {last['spending']} alpha spending, alpha {last['alpha']:g}) "
            f"said {word(last['decision'])!r} ({per}) in {len(looks)} look(s); {server_minutes(runs):.1f} "
            "server-minutes")
