"""vLLM server logs: SpecDecoding metrics, engine stats, the `Env:` line, timestamps; what the rest of
specbook reads a vLLM log through.

Two readers give one result:

* per line (`iter_records`, `parse_log(lines)`): every line through `LineParser.record` (lineparser);
* by block (`parse_log(path)`, `summarise_log(path)`, what `specbook ingest` runs; blockscan): the file is
  read in binary blocks (the memory held is a block, whatever the log's size), newlines are counted per
  block with numpy, and only the lines that can be records are looked at: lines starting with `Env:`, and
  lines holding `SpecDecoding metrics: ` or `Avg prompt throughput:` (found with bytes.find). A line in the
  exact layout vLLM writes is read from one compiled bytes regex's groups; any other such line goes through
  `LineParser.record`. `summarise_log` reads a large log with several processes, one byte range each, and
  puts their parts together exactly. Both readers agree line for line (tests/unit/test_ingest_fastpath.py
  checks it on every fixture log and on damaged copies; benchmarks/logparse_speed.py times it).

The parts, each in its module: the line shapes (logpatterns), timestamps without a year (timestamps), the
records and what a log adds up to (records), the counts vLLM does not print (counts), the two readers
(lineparser, blockscan), DataFrames (frames) and frames saved by older versions (upgrades). This module
names them all: import from here.

The AL, acceptance rate and per-position figures of a log come from `ParsedLog.acceptance()` (the
acceptance model, specbook.core.acceptance); the parsers only recover the counts vLLM's log does not print
(drafts per interval, accepted tokens per position) from what it does print.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from specbook.core.envline import format_env_line, parse_env_line
from specbook.engines.vllm import blockscan
from specbook.engines.vllm.counts import SOURCE, position_counts, recover_drafts
from specbook.engines.vllm.frames import engine_stats_frame, intervals_frame
from specbook.engines.vllm.lineparser import iter_records, open_log, parse_header, parse_lines
from specbook.engines.vllm.logpatterns import LOG_SIGNATURES, SPEC_DECODING_PREFIX, STATS_MARKER, detect_log
from specbook.engines.vllm.records import (
    BrokenLine,
    EngineStatsInterval,
    EnvRecord,
    LineHeader,
    LogSummary,
    ParsedLog,
    SpecDecodingInterval,
    UnknownLine,
)
from specbook.engines.vllm.timestamps import this_year
from specbook.engines.vllm.upgrades import upgrade_intervals_frame

__all__ = [
    "LOG_SIGNATURES",
    "SOURCE",
    "SPEC_DECODING_PREFIX",
    "STATS_MARKER",
    "BrokenLine",
    "EngineStatsInterval",
    "EnvRecord",
    "LineHeader",
    "LogSummary",
    "ParsedLog",
    "SpecDecodingInterval",
    "UnknownLine",
    "detect_log",
    "engine_stats_frame",
    "format_env_line",
    "ingest_summary",
    "intervals_frame",
    "iter_records",
    "parse_env_line",
    "parse_header",
    "parse_log",
    "position_counts",
    "recover_drafts",
    "summarise_log",
    "upgrade_intervals_frame",
]


def parse_log(
    source: str | Path | Iterable[str], *, year: int | None = None, keep_broken: int = 20
) -> ParsedLog:
    """Parse a whole log: a path (a str is a path) by the block reader, an iterable of lines line by line.

    `year` is the reference year for timestamps (vLLM logs none); default: the file's modification year,
    or this year for lines.
    """
    if isinstance(source, (str, Path)):
        return blockscan.scan_file(source, year=year, keep_records=True, keep_broken=keep_broken).parsed()
    out = parse_lines(source, None, year or this_year(), keep_broken)
    return out.parsed()


def summarise_log(
    source: str | Path | Iterable[str], *, year: int | None = None, keep_broken: int = 20,
    processes: int | None = None,
) -> LogSummary:
    """What a whole log adds up to, without keeping its records. A path is read by the block reader, a large
    log by several processes at once (`processes`; default: see blockscan.processes_for), with the same
    result."""
    if not isinstance(source, (str, Path)):
        return parse_lines(source, None, year or this_year(), keep_broken).summary()
    path, handle, default_year = open_log(source)
    handle.close()
    size = path.stat().st_size
    n = blockscan.processes_for(size) if processes is None else processes
    if n > 1:
        out = blockscan.summarise_parallel(path, year or default_year, keep_broken, n, blockscan.BLOCK_SIZE)
        if out is not None:
            return out.summary()
    return blockscan.scan_file(path, year=year or default_year, keep_records=False, keep_broken=keep_broken).summary()


def ingest_summary(path: str | Path) -> dict[str, Any]:
    """What `specbook ingest` reports for a vLLM log (specbook.ingest.IngestResult's fields, the acceptance
    counts as an Acceptance), read by the block reader."""
    s = summarise_log(path)
    return {
        "acceptance": s.acceptance, "records": s.intervals, "record_kind": "interval", "k": s.k, "env": s.env,
        "stats_lines": s.engine_stats, "total_lines": s.total_lines, "unknown_lines": s.unknown_lines,
        "broken_lines": s.broken_lines, "first_timestamp": s.first_timestamp, "last_timestamp": s.last_timestamp,
    }  # fmt: skip
