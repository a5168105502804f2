"""The per-line reader of vLLM server logs: each line into one record (`LineParser.record`).

A line that cannot be read is counted (unknown or broken), never fatal. Lines are split on "\\n" only,
as `grep -n` numbers them (vLLM's progress bars hold bare "\\r"). The block reader (blockscan) sends
every line it does not read itself through `LineParser.record`, so both readers give one result.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from specbook.core.envline import ENV_PREFIX, parse_env_line
from specbook.core.errors import IngestError
from specbook.engines.vllm.logpatterns import (
    ANSI_RE,
    CANDIDATE_LINE,
    ENV_LINE,
    FIELD_SPLIT_RE,
    HEADER_RE,
    MAX_COUNT,
    NUMBER_RE,
    OTHER_LINE,
    SPEC_DECODING_PREFIX,
    STATS_MARKER,
    STATS_RE,
    header_stamp,
)
from specbook.engines.vllm.records import (
    BrokenLine,
    Collector,
    EngineStatsInterval,
    EnvRecord,
    LineHeader,
    LogRecord,
    SpecDecodingInterval,
    UnknownLine,
)
from specbook.engines.vllm.timestamps import Timestamps, reference_year, this_year

# --- fields -------------------------------------------------------------------------------------------


class _FieldError(ValueError):
    """A field of a recognised line does not parse."""


def _number(value: str, key: str) -> float:
    match = NUMBER_RE.match(value)
    if not match:
        raise _FieldError(f"{key}: {value!r} is not a number")
    return float(match.group(1))


def _integer(value: str, key: str) -> int:
    number = _number(value, key)
    if not number.is_integer():
        raise _FieldError(f"{key}: {value!r} is not an integer")
    if not 0 <= number < MAX_COUNT:  # a count: negative or huge ones break the drafts recovery and the sums
        raise _FieldError(f"{key}: {value!r} is not a count")
    return int(number)


def _percent_fraction(value: str, key: str) -> float | None:
    """'9.1%' -> 0.091; a bare number <= 1 is already a fraction (older vLLM); 'nan%' -> None."""
    number = _number(value, key)
    if math.isnan(number):
        return None
    return number / 100.0 if value.strip().endswith("%") else number


def _fields(body: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for part in FIELD_SPLIT_RE.split(body.strip()):
        key, sep, value = part.partition(": ")
        if not sep:
            raise _FieldError(f"field {part!r} is not 'Key: value'")
        fields[key.strip()] = value.strip()
    return fields


# --- records of the two line kinds ----------------------------------------------------------------------


def _spec_decoding(
    body: str, line_no: int, header: LineHeader | None, engine: str | None
) -> SpecDecodingInterval:
    fields = _fields(body)
    try:
        accepted = _integer(fields.pop("Accepted"), "Accepted")
        drafted = _integer(fields.pop("Drafted"), "Drafted")
    except KeyError as missing:
        raise _FieldError(f"no {missing} field") from None
    rates_text = fields.pop("Per-position acceptance rate", "")
    rates = [_number(r, "Per-position acceptance rate") for r in rates_text.split(",") if r.strip()]
    if any(math.isfinite(r) and not 0.0 <= r <= 1.0 for r in rates):  # accepted at a position / drafts
        raise _FieldError(f"Per-position acceptance rate: {rates_text!r} is not a rate in 0..1")
    if "Mean acceptance length" in fields:
        mean_al = _number(fields.pop("Mean acceptance length"), "Mean acceptance length")
    elif rates:
        mean_al = 1.0 + sum(rates)  # AL = 1 + accepted/drafts = 1 + sum of per-position rates
    else:
        raise _FieldError("no Mean acceptance length and no Per-position acceptance rate")
    # "Mean acceptance length: nan" (vLLM divided by zero drafts) is read into a row that keeps its
    # accepted and drafted tokens (recover_drafts then fits the rates alone). Only when tokens were
    # accepted and the per-position rates are not numbers either is the line broken: its counts
    # cannot be split by position.
    if accepted and not all(math.isfinite(r) for r in rates):
        raise _FieldError(f"Per-position acceptance rate: {rates_text!r} is not a number for {accepted} accepted tokens")
    accepted_tp = fields.pop("Accepted throughput", None)
    drafted_tp = fields.pop("Drafted throughput", None)
    # 0.8.5+ logs "Avg Draft acceptance rate: 9.1%"; earlier V1 logged "Draft acceptance rate: 100.0%".
    rate_text = fields.pop("Avg Draft acceptance rate", None) or fields.pop("Draft acceptance rate", None)
    return SpecDecodingInterval(
        line_no=line_no,
        timestamp=header.timestamp if header else None,
        mean_acceptance_length=mean_al,
        accepted_tokens=accepted,
        drafted_tokens=drafted,
        per_position_acceptance=rates,
        accepted_throughput=_number(accepted_tp, "Accepted throughput") if accepted_tp is not None else None,
        drafted_throughput=_number(drafted_tp, "Drafted throughput") if drafted_tp is not None else None,
        avg_draft_acceptance_rate=_percent_fraction(rate_text, "Avg Draft acceptance rate")
        if rate_text
        else None,
        timestamp_text=header.timestamp_text if header else None,
        engine=engine,
        extra=fields,
    )


def _engine_stats(match: re.Match[str], line_no: int, header: LineHeader | None) -> EngineStatsInterval:
    engine = match.group("index") or f"aggregated:{match.group('count')}"
    fields = _fields(match.group("body"))
    try:
        prompt_tp = _number(fields.pop("Avg prompt throughput"), "Avg prompt throughput")
        generation_tp = _number(fields.pop("Avg generation throughput"), "Avg generation throughput")
        running = _integer(fields.pop("Running"), "Running")
        waiting = _integer(fields.pop("Waiting"), "Waiting")
    except KeyError as missing:
        raise _FieldError(f"no {missing} field") from None
    kv_usage = kv_device = None
    for key in [k for k in fields if k.endswith("KV cache usage")]:
        kv_device = key[: -len("KV cache usage")].strip() or None
        kv_usage = _percent_fraction(fields.pop(key), key)
    hit_rate = fields.pop("Prefix cache hit rate", None)
    swapped = fields.pop("Swapped", None)
    return EngineStatsInterval(
        line_no=line_no,
        timestamp=header.timestamp if header else None,
        engine=engine,
        prompt_throughput=prompt_tp,
        generation_throughput=generation_tp,
        running=running,
        waiting=waiting,
        kv_cache_usage=kv_usage,
        prefix_cache_hit_rate=_percent_fraction(hit_rate, "Prefix cache hit rate")
        if hit_rate is not None
        else None,
        extra=fields,
        timestamp_text=header.timestamp_text if header else None,
        kv_cache_device=kv_device,
        swapped=_integer(swapped, "Swapped") if swapped is not None else None,
    )


def parse_header(line: str, timestamps: Timestamps | None = None) -> LineHeader | None:
    """The vLLM logging prefix of a line, None when it has none."""
    if "\x1b" in line:
        line = ANSI_RE.sub("", line)
    match = HEADER_RE.search(line)
    if not match:
        return None
    stamp = match.group("stamp")
    pid = match.group("pid")
    return LineHeader(
        process=match.group("process"),
        pid=int(pid) if pid and len(pid) <= 18 else None,  # more digits than any pid (or int() reads): none
        level=match.group("level"),
        timestamp_text=stamp,
        timestamp=(timestamps or Timestamps(this_year()))(stamp),
        source=match.group("source"),
        message=match.group("message"),
    )


# --- one line ---------------------------------------------------------------------------------------------


class LineParser:
    """State carried across lines: the timestamps read so far and the engine of the last stats line."""

    def __init__(self, year: int):
        self.timestamps = Timestamps(year)
        self.last_engine: str | None = None  # tags SpecDecoding lines with the stats line logged before them
        self.last_header: LineHeader | None = None
        self.last_stamp: datetime | None = None
        self.last_kind = OTHER_LINE
        self.first_read = False  # whether a timestamp was read yet (the first one steps the year too)
        self._env_cache: dict[str, dict[str, str] | str] = {}

    def env_record(self, line_no: int, line: str) -> EnvRecord | BrokenLine:
        parsed = self._env_cache.get(line)  # parse_env_line (shlex) is slow; a log may repeat the line
        if parsed is None:
            try:
                parsed = parse_env_line(line) or {}
            except ValueError as exc:
                parsed = str(exc)
            self._env_cache[line] = parsed
        if isinstance(parsed, str):
            return BrokenLine(line_no, "env", line, parsed)
        return EnvRecord(line_no, dict(parsed))

    def record(self, line_no: int, raw: str) -> LogRecord:
        """The record of one line; `last_stamp` is then the timestamp it read (committed), if any."""
        line = raw.rstrip("\r\n")
        self.last_header = self.last_stamp = None
        self.last_kind = ENV_LINE
        if line.startswith(ENV_PREFIX):
            return self.env_record(line_no, line)
        if SPEC_DECODING_PREFIX not in line and STATS_MARKER not in line:
            self.last_kind = OTHER_LINE
            if not self.first_read and (stamp := header_stamp(line)) is not None:
                self.last_stamp = self.timestamps(stamp)
                self.first_read = self.last_stamp is not None
            return UnknownLine(line_no, line)
        self.last_kind = CANDIDATE_LINE
        header = parse_header(line, self.timestamps) if ("[" in line) else None
        if header is not None and header.timestamp is not None:
            self.first_read = True
            self.last_stamp = header.timestamp
        self.last_header = header
        message = header.message if header else (ANSI_RE.sub("", line) if "\x1b" in line else line)
        try:
            if message.startswith(SPEC_DECODING_PREFIX):
                return _spec_decoding(message[len(SPEC_DECODING_PREFIX) :], line_no, header, self.last_engine)
            stats = STATS_RE.match(message) if "ngine" in message else None
            if stats:
                record = _engine_stats(stats, line_no, header)
                self.last_engine = record.engine
                return record
        except _FieldError as exc:
            kind = "spec_decoding" if message.startswith(SPEC_DECODING_PREFIX) else "engine_stats"
            return BrokenLine(line_no, kind, line, str(exc))
        return UnknownLine(line_no, line)


# --- a whole log, line by line -------------------------------------------------------------------------------


def open_log(source: str | Path) -> tuple[Path, BinaryIO, int]:
    """(path, binary handle, reference year) of a log file, for either reader."""
    if isinstance(source, str) and "\n" in source:
        raise IngestError(
            "parse_log got log text as a str, which it reads as a path: pass text.splitlines() instead"
        )
    path = Path(source)
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise IngestError(f"cannot read log file {path}: {exc.strerror or exc}") from exc
    try:
        year = reference_year(path)
    except OSError as exc:
        handle.close()
        raise IngestError(f"cannot read log file {path}: {exc.strerror or exc}") from exc
    return path, handle, year


def _lines(source: str | Path | Iterable[str]) -> tuple[str | None, Iterator[str], int]:
    """(path or None, line iterator, reference year) for a path or an iterable of lines.

    Files are split on "\\n" only (read as bytes): vLLM's progress bars hold bare "\\r", and text-mode
    universal newlines would split there, so line numbers would not match `grep -n`.
    """
    if isinstance(source, (str, Path)):
        path, handle, year = open_log(source)

        def read() -> Iterator[str]:
            with handle:
                for raw in handle:
                    yield raw.decode("utf-8", errors="replace")

        return str(path), read(), year
    return None, iter(source), this_year()


def iter_records(source: str | Path | Iterable[str], *, year: int | None = None) -> Iterator[LogRecord]:
    """One record per line, in order (the per-line reader). `year` is the reference year for timestamps
    (vLLM logs none); default: the file's modification year, or this year for an iterable of lines."""
    _, lines, default_year = _lines(source)
    parser = LineParser(year or default_year)
    for line_no, raw in enumerate(lines, start=1):
        yield parser.record(line_no, raw)


def parse_lines(lines: Iterable[str], path: str | None, year: int, keep_broken: int) -> Collector:
    """The per-line reader over a whole log."""
    parser = LineParser(year)
    out = Collector(path, keep_records=True, keep_broken=keep_broken)
    line_no = 0
    for line_no, raw in enumerate(lines, start=1):  # noqa: B007 (line_no is the total below)
        record = parser.record(line_no, raw)
        out.add(record)
        stamp = parser.last_stamp
        if stamp is None and parser.last_kind == OTHER_LINE and parser.first_read:
            text = header_stamp(raw.rstrip("\r\n"))  # read for the last timestamp only: no year step
            stamp = parser.timestamps.peek(text) if text is not None else None
        if stamp is not None:
            if out.first is None:
                out.first = stamp
            out.last = stamp
    out.total_lines = line_no
    return out
