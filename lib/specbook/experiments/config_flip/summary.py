"""The config-flip report's summary block: the question, one headline per arm against the best arm, whether the
outputs are equal across arms, the evidence, and the run index's one clause."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from specbook.core.verdicts import RUN_SCOPE
from specbook.experiments.config_flip.params import ConfigFlipParams
from specbook.experiments.config_flip.tables import identical_share_line
from specbook.report import view as report_view

if TYPE_CHECKING:
    from specbook.experiments.config_flip.analysis import FlipResult


def flip_answer(result: FlipResult, params: ConfigFlipParams) -> report_view.Summary:
    """Question, one headline per arm (AL and accepted tokens per step against the best arm), outputs equal or not.

    One server per arm: there is no run-to-run interval, so each label says what this run measured and nothing
    more ("COLLAPSED in this run"; specbook.core.verdicts' rule for labels without an interval)."""
    heads = [*arm_headlines(result), outputs_headline(result)]
    v, s = result.verdict, result.summary
    for arm, why in v.left_out.items():
        heads.append(report_view.Headline(arm, "LEFT OUT", False, why))
    failed = int(s["failed"].sum()) if "failed" in s else 0
    return report_view.Summary(
        question=f"Does flipping {params.flip.file}:{params.flip.field} of {params.flip.folder} "
                 f"({' vs '.join(json.dumps(x) for x in params.flip.values)}) change draft acceptance?",
        headlines=heads,
        evidence=[f"{len(s)} arms, one server each", f"{int(s['requests'].sum())} requests ({failed} failed)",
                  f"{int(s['drafts'].sum())} drafts counted", "arms proven to differ only in the flipped field",
                  *([line] if (line := identical_share_line(result.matched_summary)) else [])],
        short=short_clause(result, params, heads),
    )


def arm_headlines(result: FlipResult) -> list[report_view.Headline]:
    """Each arm but the best against the best arm: COLLAPSED or KEPT in this run, AL and accepted per step."""
    v, fmt = result.verdict, report_view.fmt
    al = dict(zip(result.summary["arm"], result.summary["al"], strict=True))
    best = v.accepted_per_step[v.best_arm]
    heads = []
    for arm, per_step in v.accepted_per_step.items():
        if arm == v.best_arm:
            continue
        share = per_step / best if best else float("nan")
        heads.append(report_view.Headline(
            f"{arm} vs {v.best_arm} (best)", f"{'COLLAPSED' if arm in v.collapsed else 'KEPT'} {RUN_SCOPE}",
            None, f"AL {fmt(al[arm])} vs {fmt(al[v.best_arm])}; accepted per step {fmt(per_step, 3)} vs "
            f"{fmt(best, 3)} ({share:.0%} of best; collapse at <= {v.collapse_fraction:.0%})",
            "one server per arm: no run-to-run interval (the counters cover every token of the window)",
            why=f"One server per arm: the counters are exact for this run's {int(result.summary['drafts'].sum())} "
                "drafts, but another run (another server start) could differ; the label says what this run "
                "measured."))
    return heads


def outputs_headline(result: FlipResult) -> report_view.Headline:
    """Whether every prompt compared gave the same output in every arm (a prompt with a failed request is not)."""
    eq = result.output_equality
    compared = eq[eq["comparable"].astype(bool)] if "comparable" in eq else eq
    n_eq = int(compared["all_equal"].astype(bool).sum()) if len(compared) else 0
    not_compared = f"; {len(eq) - len(compared)} not compared (a failed request)" if len(compared) < len(eq) else ""
    equal = result.verdict.outputs_equal
    return report_view.Headline("outputs across arms", f"{'EQUAL' if equal else 'NOT EQUAL'} {RUN_SCOPE}", equal,
                                f"{n_eq} of {len(compared)} prompts equal under greedy decoding{not_compared}",
                                "no interval: the prompts sent, compared token for token")


def short_clause(result: FlipResult, params: ConfigFlipParams, heads: list[report_view.Headline]) -> str:
    """The run index's one clause: the flipped field's values in words, not the arms' folder names."""
    v, s, fmt = result.verdict, result.summary, report_view.fmt
    others = [a for a in v.accepted_per_step if a != v.best_arm]
    if not others:
        return report_view.short_clause(heads)
    al = dict(zip(s["arm"], s["al"], strict=True))
    value = dict(zip(s["arm"], s["value"], strict=True)) if "value" in s else {}
    return (f"{params.flip.field.rsplit('.', 1)[-1]} {value.get(others[0], others[0])} vs "
            f"{value.get(v.best_arm, v.best_arm)}: {heads[0].verdict} (AL {fmt(al[others[0]])} vs "
            f"{fmt(al[v.best_arm])})")
