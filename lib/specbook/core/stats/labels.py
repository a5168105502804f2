"""How an interval's method is named beside it: the constants and labels the reports print."""

from __future__ import annotations

import math

# What every interval and test on run means here is; the reports print it beside the interval.
WELCH_METHOD = "Welch t on run means (Welch-Satterthwaite df)"
# The paired method in general; each result names its own sweeps (paired_method).
PAIRED_METHOD = "paired t on per-sweep differences (df n_sweeps - 1)"


def paired_method(n_sweeps: int) -> str:
    """The method of a paired interval as the report prints it: 'paired t over N sweeps (df N-1)'."""
    return f"paired t over {n_sweeps} sweeps (df {n_sweeps - 1})"


def method_label(method: str, df: float) -> str:
    """The method with its df where the method does not already name it (Welch's df is data-dependent)."""
    if method.startswith("paired t over") or not math.isfinite(df):
        return method
    return f"{method}, df {df:.3g}"


def pct(delta: float, base: float) -> float:
    """`delta` as a percentage of `base` (NaN when the base is 0)."""
    return 100.0 * delta / base if base != 0 else math.nan
