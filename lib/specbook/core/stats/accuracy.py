"""Accuracy per arm from exact per-sweep counts: the spread of the per-sweep accuracies and the pooled Wilson
interval."""

from __future__ import annotations

import numpy as np
import pandas as pd

from specbook.core.errors import ExperimentError
from specbook.core.stats.intervals import wilson_ci
from specbook.core.stats.summaries import DEFAULT_CI, check_columns, summarize


def accuracy_by_arm(
    df: pd.DataFrame,
    arm_col: str,
    *,
    correct_col: str = "correct",
    total_col: str = "total",
    ci: float = DEFAULT_CI,
) -> pd.DataFrame:
    """Accuracy spread per arm from one row per sweep with exact counts: mean and sd of the per-sweep
    accuracies, the pooled counts, and the Wilson CI of the pooled accuracy.
    """
    check_columns(df, [arm_col, correct_col, total_col])
    rows = []
    for arm in pd.unique(df[arm_col]):
        part = df.loc[df[arm_col] == arm]
        correct = part[correct_col].to_numpy()
        total = part[total_col].to_numpy()
        if np.any(total <= 0) or np.any(correct < 0) or np.any(correct > total):
            raise ExperimentError(
                f"arm {arm!r}: counts must satisfy 0 <= {correct_col} <= {total_col} and {total_col} > 0"
            )
        acc = summarize(correct / total, what=f"accuracy of arm {arm!r}")
        c, t = int(correct.sum()), int(total.sum())
        lo, hi = wilson_ci(c, t, ci)
        rows.append(
            {
                arm_col: arm,
                "sweeps": acc.n,
                "accuracy_mean": acc.mean,
                "accuracy_sd": acc.sd,
                "accuracy_min": acc.min,
                "accuracy_max": acc.max,
                "correct": c,
                "total": t,
                "pooled_accuracy": c / t,
                "ci": ci,
                "wilson_low": lo,
                "wilson_high": hi,
            }
        )
    return pd.DataFrame(rows)
