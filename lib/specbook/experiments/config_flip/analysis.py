"""Config-flip analysis: pure functions of the saved frames, and `analyze` gathering them into FlipResult.

AL and per-position acceptance come from each measured arm's counter deltas; per-step time is decode time
divided by decode steps, with decode steps = (completion tokens - 1) / AL per request (each engine step of one
sequence emits AL tokens on average; the first token is the prefill's). The verdict: which arms collapsed
against the best arm, and whether the outputs are equal across arms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from specbook.core import request_failures
from specbook.core.acceptance import Acceptance, accepted_per_draft_from_al, per_position_frame
from specbook.core.errors import ExperimentError
from specbook.experiments.config_flip import tables
from specbook.experiments.config_flip.data import FlipData
from specbook.experiments.config_flip.params import ConfigFlipParams
from specbook.experiments.config_flip.summary import flip_answer
from specbook.measure import costsplit
from specbook.report import view as report_view


def arm_acceptance(arm: pd.Series) -> Acceptance:
    return Acceptance.from_row(arm, source="counter delta")


def arm_summary(data: FlipData) -> pd.DataFrame:
    """One row per arm: AL, acceptance rate, tok/s, per-step time, failed requests.

    - al, acceptance_rate: the acceptance model on the counter deltas of the measured window
    - output_tok_s = completion tokens / elapsed wall time of the arm's measured window
    - decode_steps = sum over requests of (completion_tokens - 1) / AL
    - per_step_ms = sum(wall - ttft) / decode_steps
    """
    rows = []
    for _, arm in data.arms.sort_values("index").iterrows():
        req = data.requests[data.requests["arm"] == arm["arm"]]
        ok = req[req["error"].isna()] if "error" in req else req
        acc = arm_acceptance(arm)
        al = acc.al
        completion = float(ok["completion_tokens"].sum())
        decode_s = float((ok["wall_s"] - ok["ttft_s"]).sum())
        steps = float(((ok["completion_tokens"] - 1).clip(lower=0) / al).sum()) if al == al else math.nan
        rows.append({
            "arm": arm["arm"],
            "value": arm["value"],
            "is_original": bool(arm["is_original"]),
            "requests": int(len(req)),
            "failed": int(len(req) - len(ok)),
            "completion_tokens": int(completion),
            "drafts": int(acc.drafts or 0),
            "draft_tokens": int(acc.draft_tokens),
            "accepted_tokens": int(acc.accepted_tokens),
            "al": al,
            "acceptance_rate": acc.acceptance_rate,
            "output_tok_s": completion / float(arm["elapsed_s"]) if arm["elapsed_s"] else math.nan,
            "decode_tok_s": (completion - len(ok)) / decode_s if decode_s > 0 else math.nan,
            "decode_steps": steps,
            "per_step_ms": 1000.0 * decode_s / steps if steps and steps > 0 else math.nan,
            "ttft_ms_mean": 1000.0 * float(ok["ttft_s"].mean()) if len(ok) else math.nan,
        })
    return pd.DataFrame(rows)


def per_position_acceptance(data: FlipData) -> pd.DataFrame:
    """Arm x draft position (1-based): the share of drafts whose token at that position was accepted."""
    arms = data.arms.sort_values("index")
    return per_position_frame(({"arm": a["arm"], "value": a["value"]}, arm_acceptance(a)) for _, a in arms.iterrows())


def per_position_table(positions: pd.DataFrame) -> pd.DataFrame:
    """position x arm: the rate (the report's table and bar plot)."""
    return positions.pivot(index="position", columns="arm", values="rate")


def intervals_by_arm(data: FlipData) -> pd.DataFrame:
    """interval number x arm: each log interval's printed AL (a flat line = AL is the config's, not a prompt's)."""
    if data.intervals.empty:
        return pd.DataFrame()
    iv = data.intervals.copy()
    iv["interval"] = iv.groupby("arm").cumcount()
    return iv.pivot(index="interval", columns="arm", values="al")


def output_equality(data: FlipData, arms: list[str] | None = None) -> pd.DataFrame:
    """Per prompt: is every arm's output equal to the first arm's, and where they first part.

    Under greedy decoding the target alone decides the text, so equal outputs across arms are what
    lossless speculation promises whatever the draft proposes. A failed request has no output: a prompt
    that failed in an arm is not compared (`comparable` false, `all_equal` empty, `no_output` names the arms).
    `arms`: the arms to compare (default every arm, in order).
    """
    req = request_failures.answered(data.requests)
    arms = arms if arms is not None else list(data.arms.sort_values("index")["arm"])
    texts = req.pivot_table(index="prompt_id", columns="arm", values="output_text", aggfunc="first")
    prompts = list(dict.fromkeys(data.requests["prompt_id"])) if "prompt_id" in data.requests else []
    texts = texts.reindex(index=prompts, columns=arms)
    rows = []
    for prompt_id, row in texts.iterrows():
        missing = [a for a in arms if not isinstance(row.get(a), str)]
        first = row.get(arms[0]) if arms else None
        entry: dict[str, Any] = {"prompt_id": prompt_id}
        equal = True
        for arm in arms[1:]:
            other = row.get(arm)
            same = isinstance(first, str) and isinstance(other, str) and first == other
            equal &= same
            entry[f"first_difference_{arm}"] = None if same else _first_difference(first, other)
        entry["comparable"] = not missing
        entry["all_equal"] = equal if not missing else None
        entry["no_output"] = ", ".join(missing)
        rows.append(entry)
    return pd.DataFrame(rows)


def _first_difference(a: str | None, b: str | None) -> int | None:
    if not isinstance(a, str) or not isinstance(b, str):
        return None
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def request_failure_table(data: FlipData, max_failed: int) -> pd.DataFrame:
    """Per arm: its requests, how many failed, and whether it stays in the analysis."""
    return request_failures.failure_table(data.requests, ["arm"], max_failed)


@dataclass(frozen=True)
class FlipVerdict:
    collapsed: list[str]
    kept: list[str]
    best_arm: str
    accepted_per_step: dict[str, float]
    collapse_fraction: float
    outputs_equal: bool
    left_out: dict[str, str] = field(default_factory=dict)  # arm -> why (over measurement.max_failed_requests)

    def sentence(self) -> str:
        rates = ", ".join(f"{a}: {v:.2f}" for a, v in self.accepted_per_step.items())
        outputs = "equal" if self.outputs_equal else "NOT equal"
        if not self.collapsed:
            head = "No arm collapsed"
        else:
            head = f"Acceptance collapsed in {', '.join(self.collapsed)}"
        out = "; ".join(f"{a}: {why}" for a, why in self.left_out.items())
        return (
            f"{head} (accepted draft tokens per step {rates}; collapse = at most "
            f"{self.collapse_fraction:g} x the best arm {self.best_arm}). Outputs across arms are {outputs}."
            + (f" Left out for failed requests: {out}." if out else "")
        )


def flip_verdict(summary: pd.DataFrame, equality: pd.DataFrame, collapse_fraction: float,
                 left_out: dict[str, str] | None = None) -> FlipVerdict:
    """Which arms' acceptance collapsed relative to the best arm (AL-1 at most collapse_fraction x best); the arms
    in `left_out` (too many failed requests) are not judged. Outputs are equal when every prompt compared in
    every arm is (prompts with a failed request are not compared) and at least one was compared."""
    left_out = dict(left_out or {})
    if left_out and set(summary["arm"]) <= set(left_out):
        raise ExperimentError("every arm has more failed requests than measurement.max_failed_requests allows: "
                              + "; ".join(f"{a}: {why}" for a, why in left_out.items()))
    per_step = {r["arm"]: accepted_per_draft_from_al(float(r["al"])) for _, r in summary.iterrows()
                if r["arm"] not in left_out}
    finite = {a: v for a, v in per_step.items() if v == v}
    if not finite:
        raise ExperimentError("no arm has drafts in its counters; was speculative decoding on?")
    best = max(finite, key=finite.get)
    collapsed = [a for a, v in finite.items() if a != best and v <= collapse_fraction * finite[best]]
    return FlipVerdict(
        collapsed=collapsed,
        kept=[a for a in per_step if a not in collapsed],
        best_arm=best,
        accepted_per_step=per_step,
        collapse_fraction=collapse_fraction,
        outputs_equal=_outputs_equal(equality),
        left_out=left_out,
    )


def _outputs_equal(equality: pd.DataFrame) -> bool:
    compared = equality[equality["comparable"].astype(bool)] if "comparable" in equality else equality
    return bool(len(compared)) and bool(compared["all_equal"].astype(bool).all())


@dataclass
class FlipResult:
    """Everything the config-flip report shows."""

    description: str
    differences: pd.DataFrame
    summary: pd.DataFrame
    per_position: pd.DataFrame
    per_position_table: pd.DataFrame
    intervals_by_arm: pd.DataFrame
    output_equality: pd.DataFrame
    verdict: FlipVerdict
    # per arm: requests, failed, the bound (measurement.max_failed_requests), valid, why an arm is left out
    request_failures: pd.DataFrame = field(default_factory=pd.DataFrame)
    # proposal traces (params traces; a separate untimed pass per arm): "" / empty in runs without them
    trace_note: str = ""
    trace_agreement: pd.DataFrame = field(default_factory=pd.DataFrame)
    replay: pd.DataFrame = field(default_factory=pd.DataFrame)
    proposals: pd.DataFrame = field(default_factory=pd.DataFrame)
    matched_anchors: pd.DataFrame = field(default_factory=pd.DataFrame)
    matched_summary: pd.DataFrame = field(default_factory=pd.DataFrame)
    prefix_acceptance: pd.DataFrame = field(default_factory=pd.DataFrame)
    # per-step cost split per arm (params cost_split; a separate profiled pass per arm)
    cost_split: pd.DataFrame = field(default_factory=pd.DataFrame)
    cost_split_notes: list[str] = field(default_factory=list)  # parts out of proportion; what a split cannot see
    cost_split_scaled: pd.DataFrame = field(default_factory=pd.DataFrame)  # measured and scaled to the timed step

    def answer(self, params: ConfigFlipParams) -> report_view.Summary:
        """The report's summary block: each arm against the best arm (collapsed or kept), and output equality."""
        return flip_answer(self, params)


def analyze(data: FlipData, params: ConfigFlipParams) -> FlipResult:
    summary = arm_summary(data)
    positions = per_position_acceptance(data)
    failures = request_failure_table(data, params.measurement.max_failed_requests)
    left_out = request_failures.left_out(failures, ["arm"])
    kept = [a for a in data.arms.sort_values("index")["arm"] if a not in left_out]
    equality = output_equality(data, kept)
    traced = not data.trace_passes.empty
    matched = tables.matched_anchors_between_arms(data) if traced else pd.DataFrame()
    splits = tables.cost_split_table(data)
    return FlipResult(
        description=tables.describe_flip(data), differences=tables.diff_table(data), summary=summary,
        per_position=positions, per_position_table=per_position_table(positions),
        intervals_by_arm=intervals_by_arm(data), output_equality=equality,
        verdict=flip_verdict(summary, equality, params.collapse_fraction, left_out), request_failures=failures,
        trace_note=tables.TRACE_NOTE if traced else "",
        trace_agreement=tables.trace_agreement_by_arm(data) if traced else pd.DataFrame(),
        replay=tables.replay_by_arm(data) if traced else pd.DataFrame(),
        proposals=tables.proposals_table(data) if traced else pd.DataFrame(),
        matched_anchors=matched,
        matched_summary=tables.matched_anchor_summary(matched) if traced else pd.DataFrame(),
        prefix_acceptance=tables.prefix_acceptance_between_arms(data) if traced else pd.DataFrame(),
        cost_split=splits, cost_split_notes=costsplit.split_notes(splits) if len(splits) else [],
        cost_split_scaled=(costsplit.scaled_splits(splits, tables.timed_step_ms(splits, summary)) if len(splits)
                           else pd.DataFrame()),
    )
