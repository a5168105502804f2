"""specbook.core.request_failures: failed requests per unit of work and the params' bound on them."""

from __future__ import annotations

import pandas as pd
import pytest
from pydantic import ValidationError

from specbook.core import request_failures as rf


def _requests() -> pd.DataFrame:
    return pd.DataFrame({
        "run_id": ["a", "a", "a", "b", "b", "c"],
        "error": [None, "ReadTimeout: no token for 60 s", None, None, "", "HTTP 400: prompt too long"],
    })


def test_failed_mask_counts_set_errors_only():
    assert rf.failed_mask(_requests()).tolist() == [False, True, False, False, False, True]
    assert rf.failed_mask(pd.DataFrame({"x": [1, 2]})).tolist() == [False, False]
    assert rf.answered(_requests())["run_id"].tolist() == ["a", "a", "b", "b"]


@pytest.mark.parametrize(("bound", "left_out"), [(0, {"a", "c"}), (1, set())])
def test_failure_table_per_unit_with_the_bound_and_the_reason(bound, left_out):
    table = rf.failure_table(_requests(), ["run_id"], bound)
    assert table["run_id"].tolist() == ["a", "b", "c"]
    assert table["n_requests"].tolist() == [3, 2, 1] and table["n_failed"].tolist() == [1, 0, 1]
    assert set(rf.left_out(table, ["run_id"])) == left_out
    if bound == 0:
        assert table.set_index("run_id").loc["a", "reason"] == (
            "1 of 3 requests failed, more than measurement.max_failed_requests = 0")
        assert rf.left_out(table, ["run_id"])["c"].endswith("first: HTTP 400: prompt too long")


def test_units_of_several_columns_and_empty_frames():
    req = pd.DataFrame({"lane": ["x", "x", "y"], "prompt": ["p", "p", "p"], "error": ["boom", None, None]})
    assert rf.left_out(rf.failure_table(req, ["lane", "prompt"], 0), ["lane", "prompt"]) == {
        ("x", "p"): "1 of 2 requests failed, more than measurement.max_failed_requests = 0; first: boom"}
    empty = rf.failure_table(pd.DataFrame(), ["run_id"], 0)
    assert empty.empty and list(empty.columns) == ["run_id", *rf.COLUMNS]


def test_the_bound_is_a_count():
    assert rf.RequestMeasurement().max_failed_requests == 0
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        rf.RequestMeasurement(max_failed_requests=-1)
    with pytest.raises(ValidationError, match="Extra inputs"):
        rf.RequestMeasurement(max_failed=1)
