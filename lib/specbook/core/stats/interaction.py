"""The 2x2 factorial on arm means: does knob B stack on knob A as the sum of their effects predicts?"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from specbook.core.errors import ExperimentError
from specbook.core.stats.contrasts import contrast_of, sweep_blocks
from specbook.core.stats.labels import method_label, pct
from specbook.core.stats.summaries import DEFAULT_CI, arm_values


@dataclass(frozen=True)
class InteractionResult:
    """2x2 factorial on arm means: does knob B stack on knob A as the sum of their effects predicts?"""

    baseline_mean: float
    effect_a: float
    effect_b: float
    effect_ab: float
    # (AB - B) - (A - base) = effect_ab - effect_a - effect_b: 0 when the effects add up.
    interaction: float
    # The AB mean that additivity predicts: base + effect_a + effect_b.
    additive_prediction: float
    ci_low: float
    ci_high: float
    ci: float
    df: float  # paired: n_sweeps - 1; else Welch-Satterthwaite df of the interaction contrast
    method: str
    n_per_arm: dict[str, int]
    arms: tuple[str, str, str, str] = ("A", "B", "A+B", "baseline")  # the arms of A, B, A+B and the baseline

    @property
    def interaction_pct(self) -> float:
        return pct(self.interaction, self.baseline_mean)

    @property
    def ci_excludes_zero(self) -> bool:
        return self.ci_low > 0 or self.ci_high < 0

    def to_frame(self) -> pd.DataFrame:
        """One row per quantity, absolute and as % of the baseline mean, with the arms it is made of (A and B
        named); the CI rows name their method."""
        a, b, ab, base = self.arms
        interaction = f"({ab} - {b}) - ({a} - {base})"
        made_of = [f"{a} - {base}", f"{b} - {base}", f"{ab} - {base}", f"{base} + ({a} - {base}) + ({b} - {base})",
                   interaction, interaction, interaction]
        rows = [
            ("effect of A", self.effect_a),
            ("effect of B", self.effect_b),
            ("effect of A+B", self.effect_ab),
            ("A+B predicted if additive (mean)", self.additive_prediction),
            ("interaction (A+B - B) - (A - base)", self.interaction),
            (f"interaction {self.ci:.0%} CI low", self.ci_low),
            (f"interaction {self.ci:.0%} CI high", self.ci_high),
        ]
        return pd.DataFrame(
            {
                "quantity": [r[0] for r in rows],
                "arms": made_of,
                "value": [r[1] for r in rows],
                "pct_of_baseline": [
                    math.nan if r[0].startswith("A+B predicted") else pct(r[1], self.baseline_mean)
                    for r in rows
                ],
                "method": [method_label(self.method, self.df) if " CI " in r[0] else "" for r in rows],
            }
        )


def interaction_2x2(
    df: pd.DataFrame,
    arm_col: str,
    value_col: str,
    knob_a_arm: str,
    knob_b_arm: str,
    both_arm: str,
    baseline: str,
    *,
    ci: float = DEFAULT_CI,
    sweep_col: str | None = None,
) -> InteractionResult:
    """Effects of A, B and A+B vs baseline, the interaction (AB - B) - (A - base), and its t interval:
    paired by sweep (AB_s - B_s - A_s + base_s, df n_sweeps - 1) when `sweep_col` is given and every sweep
    has one run of each of the four arms, else Welch on run means (the method says why)."""
    per_arm = arm_values(df, arm_col, value_col)
    needed = {"baseline": baseline, "A": knob_a_arm, "B": knob_b_arm, "A+B": both_arm}
    missing = {role: arm for role, arm in needed.items() if arm not in per_arm}
    if missing:
        raise ExperimentError(
            f"interaction needs arms {missing} in column {arm_col!r}; arms present: {list(per_arm)}"
        )
    if len(set(needed.values())) != 4:
        raise ExperimentError(f"interaction needs four distinct arms, got {needed}")
    base, a, b, ab = (per_arm[needed[r]] for r in ("baseline", "A", "B", "A+B"))
    m0, ma, mb, mab = base.mean(), a.mean(), b.mean(), ab.mean()
    order = [both_arm, knob_b_arm, knob_a_arm, baseline]
    blocks, why = sweep_blocks(df, arm_col, value_col, sweep_col, order) if sweep_col else (None, "")
    w = contrast_of(per_arm, blocks, why, order, [1.0, -1.0, -1.0, 1.0], ci)
    return InteractionResult(
        baseline_mean=float(m0),
        effect_a=float(ma - m0),
        effect_b=float(mb - m0),
        effect_ab=float(mab - m0),
        interaction=float((mab - mb) - (ma - m0)),
        additive_prediction=float(m0 + (ma - m0) + (mb - m0)),
        ci_low=w.low,
        ci_high=w.high,
        ci=ci,
        df=w.df,
        method=w.method,
        n_per_arm={needed[r]: int(per_arm[needed[r]].size) for r in needed},
        arms=(knob_a_arm, knob_b_arm, both_arm, baseline),
    )
