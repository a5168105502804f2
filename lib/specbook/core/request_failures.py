"""Failed requests per unit of work (a knob A/B run, a config-flip arm, a cross-engine cell) and the bound on them.

A failed request (an HTTP error, a dropped connection, a timeout) has no output: it is counted, never compared
or graded as if it had answered. Params state how many failed requests a unit may have and still count
(`measurement.max_failed_requests`, default 0); a unit over it is left out of the analysis and the report
says why. Every experiment uses this one table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

FIELD = "measurement.max_failed_requests"
COLUMNS = ["n_requests", "n_failed", "max_failed_requests", "valid", "reason", "first_error"]
_DESCRIPTION = ("failed requests (HTTP error, dropped connection, timeout) a unit of work may have and still count; "
                "a unit with more is left out of the analysis, with the reason shown in the report")


def max_failed_requests_field() -> Any:
    return Field(0, ge=0, description=_DESCRIPTION)


class RequestMeasurement(BaseModel):
    """The `measurement` section of experiments whose only measurement setting is this bound."""

    model_config = ConfigDict(extra="forbid")

    max_failed_requests: int = max_failed_requests_field()


def failed_mask(requests: pd.DataFrame) -> pd.Series:
    """True for each request that failed (its `error` is set); a frame without an `error` column has none."""
    if "error" not in requests:
        return pd.Series(False, index=requests.index)
    errors = requests["error"]
    return errors.notna() & (errors.astype(str) != "")


def answered(requests: pd.DataFrame) -> pd.DataFrame:
    """The requests that have an output (not failed)."""
    return requests[~failed_mask(requests)]


def failure_table(requests: pd.DataFrame, unit: Sequence[str], max_failed: int) -> pd.DataFrame:
    """One row per unit (the `unit` columns, in order of appearance): requests, failed, the bound, valid (failed
    <= bound), the reason a unit is left out, and its first error."""
    unit = list(unit)
    if requests.empty or not set(unit) <= set(requests.columns):
        return pd.DataFrame(columns=[*unit, *COLUMNS])
    frame = requests.assign(_failed=failed_mask(requests).to_numpy())
    rows = []
    for key, part in frame.groupby(unit, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        n, bad = len(part), int(part["_failed"].sum())
        first = str(part.loc[part["_failed"], "error"].iloc[0])[:300] if bad else ""
        valid = bad <= max_failed
        rows.append({**dict(zip(unit, key, strict=True)), "n_requests": n, "n_failed": bad,
                     "max_failed_requests": max_failed, "valid": valid,
                     "reason": "" if valid else f"{bad} of {n} requests failed, more than {FIELD} = {max_failed}",
                     "first_error": first})
    return pd.DataFrame(rows, columns=[*unit, *COLUMNS])


def left_out(table: pd.DataFrame, unit: Sequence[str]) -> dict[Any, str]:
    """{unit: reason} for the units over the bound (a unit of several columns is a tuple)."""
    unit = list(unit)
    bad = table[~table["valid"].astype(bool)] if len(table) else table
    return {(row[unit[0]] if len(unit) == 1 else tuple(row[c] for c in unit)):
            f"{row['reason']}; first: {row['first_error']}" for _, row in bad.iterrows()}
