"""One arm's per-sweep values summarized, and the checked per-arm values of a frame of runs."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from specbook.core.errors import ExperimentError

DEFAULT_CI = 0.95
# Sweeps whose sd is below this fraction of |mean| are treated as identical (float noise, not run noise).
DETERMINISTIC_REL_TOL = 1e-12


@dataclass(frozen=True)
class ArmSummary:
    """One arm's per-sweep values: n, mean, sample sd (ddof=1), standard error, range."""

    n: int
    mean: float
    sd: float
    sem: float
    min: float
    max: float
    # True when n == 1: sd and sem are reported as 0.0 but are really unknown.
    single_sweep: bool

    @property
    def deterministic(self) -> bool:
        """At least two sweeps and all equal: the arm shows no run-to-run noise at all."""
        return self.n >= 2 and self.sd <= DETERMINISTIC_REL_TOL * max(abs(self.mean), 1.0)

    def as_dict(self) -> dict[str, float | int | bool]:
        return {**asdict(self), "deterministic": self.deterministic}


def as_array(values: Iterable[float], what: str) -> np.ndarray:
    """`values` as a float array; refuses an empty or non-finite one, naming `what` it is."""
    arr = np.asarray(list(values), dtype=float)
    if arr.size == 0:
        raise ExperimentError(f"{what}: no values to summarize")
    if not np.all(np.isfinite(arr)):
        bad = [i for i, v in enumerate(arr) if not np.isfinite(v)]
        raise ExperimentError(f"{what}: non-finite values at positions {bad}; drop or fix those sweeps first")
    return arr


def summarize(values: Iterable[float], *, what: str = "values") -> ArmSummary:
    """n, mean, sd (ddof=1; 0.0 and flagged single_sweep when n == 1), sem, min, max."""
    arr = as_array(values, what)
    n = int(arr.size)
    sd = float(arr.std(ddof=1)) if n >= 2 else 0.0
    return ArmSummary(
        n=n,
        mean=float(arr.mean()),
        sd=sd,
        sem=sd / math.sqrt(n) if n >= 2 else 0.0,
        min=float(arr.min()),
        max=float(arr.max()),
        single_sweep=n == 1,
    )


def check_columns(df: pd.DataFrame, cols: Sequence[str]) -> None:
    """Refuse a frame that lacks any of `cols`, naming what it has."""
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ExperimentError(f"frame lacks column(s) {missing}; it has {list(df.columns)}")


def arm_values(df: pd.DataFrame, arm_col: str, value_col: str) -> dict[str, np.ndarray]:
    """Values per arm in order of first appearance; every arm must have finite values."""
    check_columns(df, [arm_col, value_col])
    out: dict[str, np.ndarray] = {}
    for arm in pd.unique(df[arm_col]):
        out[str(arm)] = as_array(df.loc[df[arm_col] == arm, value_col], f"{value_col} of arm {arm!r}")
    if not out:
        raise ExperimentError(f"frame has no rows (column {arm_col!r})")
    return out


def arm_table(df: pd.DataFrame, arm_col: str, value_col: str) -> pd.DataFrame:
    """One row per arm (order of first appearance): n, mean, sd, sem, min, max, single_sweep, deterministic."""
    rows = []
    for arm, values in arm_values(df, arm_col, value_col).items():
        rows.append({arm_col: arm, **summarize(values, what=f"{value_col} of arm {arm!r}").as_dict()})
    return pd.DataFrame(rows)
