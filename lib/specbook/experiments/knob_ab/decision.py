"""Decision rules fixed in params BEFORE the run, judged on measured deltas, beside the book's label.

Each comparison gets two things: its label in the book's vocabulary (specbook.core.verdicts: the delta's interval
against the rule's margin; `conclusion`), and the outcome of the rule stated in the params (`meets_rule`, the
seed's point rule: |delta| within 1% and within one baseline sd over >= 2 sweeps, TOST; or, for a positive
control, an interval excluding 0 with |delta| beyond the margin). The rule's outcome is reported as its own
named line, never as the verdict. Every criterion lists PASS / FAIL / n/a with the numbers beside it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from specbook.core import verdicts as vocabulary
from specbook.core.errors import ExperimentError
from specbook.core.sequential import Design, repeated_intervals
from specbook.core.stats import PAIRED_METHOD, WELCH_METHOD, ArmSummary, delta_vs_baseline, summarize


class DecisionRule(BaseModel):
    """When is a variant 'equivalent' to the baseline? All thresholds apply to |delta|."""

    model_config = ConfigDict(extra="forbid")

    max_abs_delta_pct: float = Field(1.0, gt=0, description="|delta of means| as % of the baseline mean")
    max_abs_delta_over_sd: float = Field(
        1.0, gt=0, description="|delta| in units of the baseline's run-to-run sd"
    )
    min_sweeps: int = Field(2, ge=1, description="fewest independent sweeps (fresh servers) per arm")
    tost_margin_pct: float = Field(
        1.0, gt=0, description="TOST equivalence margin, +/- % of the baseline mean"
    )
    alpha: float = Field(0.05, gt=0, lt=1, description="TOST significance level")
    require_tost: bool = Field(True, description="TOST must pass too (else it is reported, not required)")
    spending: Literal["obrien_fleming", "pocock"] = Field(
        "obrien_fleming",
        description="adaptive sweeps (sweeps_min < sweeps_max): the Lan-DeMets alpha-spending function of the "
        "group-sequential tests (specbook.experiments.knob_ab.sequential)",
    )

    def describe(self) -> str:
        tost = "required" if self.require_tost else "reported only"
        return (
            f"equivalent iff >= {self.min_sweeps} sweeps per arm, |delta| <= {self.max_abs_delta_pct:g}% of the "
            f"baseline mean, |delta| <= {self.max_abs_delta_over_sd:g} x baseline sd, and TOST p < {self.alpha:g} "
            f"for a +/-{self.tost_margin_pct:g}% margin ({tost}); when both arms are deterministic (sd = 0) the sd "
            f"and TOST criteria are n/a and |delta| <= {self.tost_margin_pct:g}% decides. "
            f"'different' iff the delta's {1 - self.alpha:.0%} t CI excludes 0 and |delta| > "
            f"{self.tost_margin_pct:g}%. Intervals and tests: {PAIRED_METHOD} when the comparison is paired by "
            f"sweep and every sweep has both arms, else {WELCH_METHOD}; each comparison names its method."
        )


@dataclass(frozen=True)
class Criterion:
    name: str
    passed: bool | None  # None: not applicable (the text says why)
    value: float
    threshold: float
    text: str
    required: bool = True

    @property
    def status(self) -> str:
        return "n/a" if self.passed is None else ("PASS" if self.passed else "FAIL")


@dataclass(frozen=True)
class Verdict:
    """One variant arm against the baseline, judged by the stated equivalence rule, with its label."""

    arm: str
    baseline: str
    criteria: list[Criterion]
    equivalent: bool  # the stated rule's outcome (meets_rule), not the label
    deterministic: bool
    text: str
    kind: str = field(default="equivalence")
    label: vocabulary.Label | None = None

    @property
    def meets_rule(self) -> bool:
        return self.equivalent

    @property
    def conclusion(self) -> str:
        """The label's word (specbook.core.verdicts); without a label, the rule's outcome as the book said it before."""
        if self.label is not None:
            return self.label.word
        return "equivalent" if self.equivalent else "not shown equivalent"


@dataclass(frozen=True)
class DifferenceVerdict:
    """Positive control: one variant against the baseline, judged by the stated difference rule, with its label."""

    arm: str
    baseline: str
    criteria: list[Criterion]
    different: bool  # the stated rule's outcome (meets_rule), not the label
    deterministic: bool
    text: str
    kind: str = field(default="difference")
    label: vocabulary.Label | None = None

    @property
    def meets_rule(self) -> bool:
        return self.different

    @property
    def conclusion(self) -> str:
        """The label's word (specbook.core.verdicts); without a label, the rule's outcome as the book said it before."""
        if self.label is not None:
            return self.label.word
        return "different" if self.different else "not shown different"


RULE_NAMES = vocabulary.RULE_NAMES


def comparison_label(rule: DecisionRule, row: Mapping[str, Any] | pd.Series) -> vocabulary.Label:
    """The label of one comparison row (stats.delta_vs_baseline): its interval in % of the baseline mean against
    the rule's margin, +/-tost_margin_pct %; where undecided, the sweeps its observed noise would need
    (sequential.project_sweeps; a paired comparison also for the sequential design, sweeps_min max(2,
    rule.min_sweeps) and the rule's spending)."""
    margin = rule.tost_margin_pct
    est, lo, hi = (float(_get(row, k)) for k in ("delta_pct", "ci_low_pct", "ci_high_pct"))
    level = float(_get(row, "ci"))
    if math.isnan(lo) or math.isnan(hi):
        return vocabulary.label(est, lo, hi, margin, level=level, no_interval=str(_get(row, "ci_method")))
    lo, hi = min(lo, hi), max(lo, hi)  # a negative baseline mean would flip the bounds in %
    base = abs(float(_get(row, "baseline_mean")))
    se_pct = 100.0 * float(_get(row, "delta_se")) / base if base else math.nan
    n = int(min(int(_get(row, "n_baseline")), int(_get(row, "n_variant"))))
    if bool(row.get("paired", False)):
        return vocabulary.label(est, lo, hi, margin, level=level, se=se_pct, n=n,
                                design=(max(2, rule.min_sweeps), rule.spending))
    df_now = float(_get(row, "ci_df"))
    return vocabulary.label(est, lo, hi, margin, level=level, se=se_pct, n=n,
                            df_at=lambda ns: df_now * (ns - 1) / max(n - 1, 1),
                            df_words="the Welch df scaled with the sweeps")


def _head(arm: str, baseline: str, kind: str, passed: bool, lab: vocabulary.Label) -> str:
    return (f"{arm} vs {baseline}: {lab.verdict()} ({lab.interval_text()})\n"
            f"  {vocabulary.rule_text(passed)} (the rule for '{RULE_NAMES[kind]}')")


def _get(row: Mapping[str, Any] | pd.Series, key: str) -> Any:
    try:
        return row[key]
    except KeyError:
        raise ExperimentError(
            f"comparison row lacks {key!r}: pass a row of stats.delta_vs_baseline(...)"
        ) from None


def _line(c_name: str, passed: bool | None, body: str) -> str:
    status = "n/a" if passed is None else ("PASS" if passed else "FAIL")
    return f"{status} {c_name}: {body}"


def _check_margin(rule: DecisionRule, row: Mapping[str, Any] | pd.Series) -> None:
    if not math.isclose(float(_get(row, "margin_pct")), rule.tost_margin_pct):
        raise ExperimentError(
            f"comparison row was computed with margin_pct={_get(row, 'margin_pct')} but the rule's "
            f"tost_margin_pct is {rule.tost_margin_pct}: recompute delta_vs_baseline with the rule's margin"
        )


def _criterion(
    name: str, passed: bool | None, value: float, threshold: float, body: str, *, required: bool = True
) -> Criterion:
    return Criterion(name, passed, value, threshold, _line(name, passed, body), required=required)


def _le(ok: bool) -> str:
    return "<=" if ok else ">"


def sweeps_criterion(rule: DecisionRule, baseline: ArmSummary, variant: ArmSummary) -> Criterion:
    """Enough independent sweeps in both arms."""
    n_min = min(baseline.n, variant.n)
    ok = n_min >= rule.min_sweeps
    return _criterion(
        "sweeps",
        ok,
        n_min,
        rule.min_sweeps,
        f"min sweeps per arm = {n_min} (baseline {baseline.n}, variant {variant.n}) >= {rule.min_sweeps} required",
    )


def delta_pct_criterion(rule: DecisionRule, delta_pct: float) -> Criterion:
    """|delta| as % of the baseline mean within max_abs_delta_pct."""
    ok = abs(delta_pct) <= rule.max_abs_delta_pct
    return _criterion(
        "delta_pct",
        ok,
        delta_pct,
        rule.max_abs_delta_pct,
        f"|delta| = {abs(delta_pct):.3f}% of baseline mean {_le(ok)} {rule.max_abs_delta_pct:g}% "
        f"(delta {delta_pct:+.3f}%)",
    )


def delta_over_sd_criterion(
    rule: DecisionRule, row: Mapping[str, Any] | pd.Series, baseline: ArmSummary, deterministic: bool
) -> Criterion:
    """|delta| in baseline-sd units within max_abs_delta_over_sd; n/a when both arms are deterministic."""
    ratio = float(_get(row, "delta_over_baseline_sd"))
    threshold = rule.max_abs_delta_over_sd
    if deterministic:
        return _criterion("delta_over_sd", None, ratio, threshold, "n/a: deterministic (sd = 0 in both arms)")
    if math.isnan(ratio):
        note = str(_get(row, "sd_ratio_note")) or "undefined"
        return _criterion("delta_over_sd", False, ratio, threshold, f"|delta|/baseline sd undefined: {note}")
    ok = abs(ratio) <= threshold
    return _criterion(
        "delta_over_sd",
        ok,
        ratio,
        threshold,
        f"|delta| = {abs(ratio):.2f} x baseline sd ({baseline.sd:.4g}) {_le(ok)} {threshold:g}",
    )


def tost_criterion(rule: DecisionRule, row: Mapping[str, Any] | pd.Series, deterministic: bool) -> Criterion:
    """TOST p < alpha for the rule's margin (required or reported only); n/a when deterministic."""
    tost_p = float(_get(row, "tost_p"))
    req = rule.require_tost
    if deterministic:
        return _criterion(
            "tost", None, tost_p, rule.alpha, "n/a: deterministic (t undefined with zero variance)", required=req
        )
    if math.isnan(tost_p):
        status = str(_get(row, "tost_status"))
        return _criterion("tost", False, tost_p, rule.alpha, f"TOST not computable: {status}", required=req)
    ok = tost_p < rule.alpha
    return _criterion(
        "tost",
        ok,
        tost_p,
        rule.alpha,
        f"TOST p = {tost_p:.4g} {'<' if ok else '>='} alpha {rule.alpha:g} for +/-{rule.tost_margin_pct:g}% margin"
        + ("" if req else " (reported only)"),
        required=req,
    )


def deterministic_margin_criterion(rule: DecisionRule, delta_pct: float) -> Criterion:
    """Deterministic runs only: |delta| within the TOST margin decides on its own."""
    ok = abs(delta_pct) <= rule.tost_margin_pct
    return _criterion(
        "deterministic_margin",
        ok,
        delta_pct,
        rule.tost_margin_pct,
        f"runs are deterministic, so the margin alone decides: "
        f"|delta| = {abs(delta_pct):.3f}% {_le(ok)} {rule.tost_margin_pct:g}%",
    )


def evaluate(
    rule: DecisionRule,
    comparison_row: Mapping[str, Any] | pd.Series,
    baseline_summary: ArmSummary,
    variant_summary: ArmSummary,
) -> Verdict:
    """Judge one variant by the rule; every criterion carries its value and threshold."""
    _check_margin(rule, comparison_row)
    arm, base_name = str(_get(comparison_row, "arm")), str(_get(comparison_row, "baseline"))
    delta_pct = float(_get(comparison_row, "delta_pct"))
    deterministic = baseline_summary.deterministic and variant_summary.deterministic
    crit = [
        sweeps_criterion(rule, baseline_summary, variant_summary),
        delta_pct_criterion(rule, delta_pct),
        delta_over_sd_criterion(rule, comparison_row, baseline_summary, deterministic),
        tost_criterion(rule, comparison_row, deterministic),
    ]
    if deterministic:
        crit.append(deterministic_margin_criterion(rule, delta_pct))

    equivalent = all(c.passed for c in crit if c.required and c.passed is not None)
    lab = comparison_label(rule, comparison_row)
    head = _head(arm, base_name, "equivalence", equivalent, lab)
    if deterministic:
        head += " (deterministic runs: the rule is judged by the margin alone)"
    text = head + "\n" + "\n".join("  " + c.text for c in crit) + "\n  rule: " + rule.describe()
    return Verdict(
        arm=arm,
        baseline=base_name,
        criteria=crit,
        equivalent=equivalent,
        deterministic=deterministic,
        text=text,
        label=lab,
    )


def evaluate_difference(rule: DecisionRule, row: Mapping[str, Any] | pd.Series) -> DifferenceVerdict:
    """Positive control: 'different' iff the delta's t CI (paired or Welch, as the row says) excludes 0 and
    |delta| > the margin."""
    _check_margin(rule, row)
    arm, base_name = str(_get(row, "arm")), str(_get(row, "baseline"))
    lo, hi = float(_get(row, "ci_low")), float(_get(row, "ci_high"))
    delta_pct = float(_get(row, "delta_pct"))
    ci = float(_get(row, "ci"))
    df = float(_get(row, "ci_df"))
    # NaN bounds (an arm with one sweep) exclude nothing.
    excl = lo > 0 or hi < 0
    method = str(_get(row, "ci_method"))
    word = "excludes" if excl else "includes"
    if math.isnan(df):
        body = f"{ci:.0%} CI of delta [{lo:.4g}, {hi:.4g}]: {method}"
    elif method.startswith("paired t"):
        body = f"{ci:.0%} CI of delta [{lo:.4g}, {hi:.4g}], {method}, {word} 0"
    else:
        body = f"{ci:.0%} Welch t CI of delta [{lo:.4g}, {hi:.4g}] (df {df:.3g}) {word} 0"
        if method != WELCH_METHOD:  # why it is not paired
            body += f"; {method.removeprefix(WELCH_METHOD + '; ')}"
    if str(row.get("ci_design") or ""):
        body += f"; {row['ci_design']}"
    crit = [Criterion("ci_excludes_zero", excl, lo if lo > 0 else hi, 0.0, _line("ci_excludes_zero", excl, body))]
    big = abs(delta_pct) > rule.tost_margin_pct
    crit.append(
        Criterion(
            "delta_beyond_margin",
            big,
            delta_pct,
            rule.tost_margin_pct,
            _line(
                "delta_beyond_margin",
                big,
                f"|delta| = {abs(delta_pct):.3f}% {'>' if big else '<='} margin {rule.tost_margin_pct:g}%",
            ),
        )
    )
    n_min = min(int(_get(row, "n_baseline")), int(_get(row, "n_variant")))
    ok = n_min >= rule.min_sweeps
    crit.append(
        Criterion(
            "sweeps",
            ok,
            n_min,
            rule.min_sweeps,
            _line("sweeps", ok, f"min sweeps per arm = {n_min} >= {rule.min_sweeps} required"),
        )
    )
    different = all(c.passed for c in crit)
    deterministic = bool(_get(row, "deterministic"))
    lab = comparison_label(rule, row)
    text = _head(arm, base_name, "difference", different, lab) + "\n" + "\n".join("  " + c.text for c in crit)
    return DifferenceVerdict(
        arm=arm,
        baseline=base_name,
        criteria=crit,
        different=different,
        deterministic=deterministic,
        text=text,
        label=lab,
    )


EXPECTATIONS = ("equivalent", "different")


def compare_and_decide(
    df: pd.DataFrame,
    arm_col: str,
    value_col: str,
    baseline: str,
    rule: DecisionRule,
    *,
    arms: Sequence[str] | None = None,
    expectation: Callable[[str], str] | None = None,
    sweep_col: str | None = None,
    design: Design | None = None,
) -> tuple[pd.DataFrame, list[Verdict | DifferenceVerdict]]:
    """delta_vs_baseline with the rule's margin, then one verdict per variant arm.

    sweep_col: pair each comparison by sweep (paired t when every sweep has both arms, else Welch; see
    stats.delta_vs_baseline).
    arms: compare only these variants (with the baseline); None: every arm in `df`.
    expectation: arm name -> "different" (judged by evaluate_difference, a positive control) or
    "equivalent" (judged by evaluate); None judges every arm for equivalence.
    design: the group-sequential design the sweeps were chosen by; each interval (the label's and the difference
    rule's) is then its repeated interval (sequential.repeated_intervals), not the fixed-sample t's.
    """
    if arms is not None:
        if arm_col not in df.columns:
            raise ExperimentError(f"frame lacks column {arm_col!r}; it has {list(df.columns)}")
        present = {str(a) for a in pd.unique(df[arm_col])}
        missing = [a for a in arms if a not in present]
        if missing:
            raise ExperimentError(f"arms {missing} are not in column {arm_col!r}; arms: {sorted(present)}")
        df = df[df[arm_col].isin([baseline, *arms])]
    rows = delta_vs_baseline(df, arm_col, value_col, baseline, margin_pct=rule.tost_margin_pct, ci=1 - rule.alpha,
                             sweep_col=sweep_col)
    if design is not None:
        rows = repeated_intervals(rows, design)
    base = summarize(df.loc[df[arm_col] == baseline, value_col])
    verdicts: list[Verdict | DifferenceVerdict] = []
    for _, row in rows.iterrows():
        arm = row["arm"]
        expected = "equivalent" if expectation is None else expectation(arm)
        if expected not in EXPECTATIONS:
            raise ExperimentError(
                f"expectation for arm {arm!r} is {expected!r}; expected one of {', '.join(EXPECTATIONS)}"
            )
        if expected == "different":
            verdicts.append(evaluate_difference(rule, row))
        else:
            verdicts.append(evaluate(rule, row, base, summarize(df.loc[df[arm_col] == arm, value_col])))
    return rows, verdicts


def verdict_table(verdicts: Iterable[Verdict | DifferenceVerdict]) -> pd.DataFrame:
    """One row per (arm, criterion) of the stated rule: PASS / FAIL / n/a with value and threshold, whether the
    arm meets the rule, and its label (conclusion)."""
    rows = []
    for v in verdicts:
        for c in v.criteria:
            rows.append(
                {
                    "arm": v.arm,
                    "baseline": v.baseline,
                    "kind": v.kind,
                    "conclusion": v.conclusion,
                    "meets_rule": v.meets_rule,
                    "deterministic": v.deterministic,
                    "criterion": c.name,
                    "result": c.status,
                    "value": c.value,
                    "threshold": c.threshold,
                    "required": c.required,
                    "text": c.text,
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "arm",
            "baseline",
            "kind",
            "conclusion",
            "meets_rule",
            "deterministic",
            "criterion",
            "result",
            "value",
            "threshold",
            "required",
            "text",
        ],
    )
