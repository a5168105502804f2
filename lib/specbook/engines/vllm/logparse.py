"""Streaming parser of vLLM server logs: SpecDecoding metrics, engine stats, the `Env:` line, timestamps.

vLLM (0.26 CUDA, 0.32 CPU) writes, every VLLM_LOG_STATS_INTERVAL seconds while busy, one stats line
per engine (or one `N Engines Aggregated:` line) followed by one `SpecDecoding metrics:` line, both
as `Key: value` fields joined by ", " (vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py).
Lines are read one at a time, so logs of any size fit; a line that cannot be read is counted
(unknown or broken), never fatal.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from specbook.envline import ENV_PREFIX, parse_env_line
from specbook.errors import IngestError

SPEC_DECODING_PREFIX = "SpecDecoding metrics: "

# vLLM's text format: "[VLLM_LOGGING_PREFIX](<process> pid=<pid>) LEVEL MM-DD HH:MM:SS [file.py:123] message".
_HEADER_RE = re.compile(
    r"(?:\((?P<process>[^()]*?) pid=(?P<pid>\d+)\)\s+)?"
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+"
    r"(?P<stamp>\d{2}-\d{2} \d{2}:\d{2}:\d{2})\s+"
    r"\[(?P<source>[^\]]+)\]\s?(?P<message>.*)$"
)
# The color formatter (tty or VLLM_LOGGING_COLOR=1) wraps header parts in ANSI codes.
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
_STATS_RE = re.compile(
    r"^(?:Engine (?P<index>\d+)|(?P<count>\d+) Engines Aggregated): (?P<body>Avg prompt throughput:.*)$"
)
# Fields are "Key: value" joined by ", "; a value may itself hold ", " (per-position rates, KV fetch)
# but never ", " followed by a capitalised "Key: ", so split only there.
_FIELD_SPLIT_RE = re.compile(r", (?=[A-Z][A-Za-z0-9 ()/_.-]*: )")
_NUMBER_RE = re.compile(r"^\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+|nan|inf)(?:[eE][-+]?\d+)?)")


@dataclass(slots=True)
class LineHeader:
    """The vLLM logging prefix of one line; `timestamp` carries the reference year (vLLM logs none)."""

    process: str | None
    pid: int | None
    level: str
    timestamp_text: str
    timestamp: datetime | None
    source: str
    message: str


@dataclass(slots=True)
class SpecDecodingInterval:
    """One `SpecDecoding metrics:` line: the drafts of one logging interval."""

    line_no: int
    timestamp: datetime | None
    mean_acceptance_length: float
    accepted_tokens: int
    drafted_tokens: int
    per_position_acceptance: list[float]
    accepted_throughput: float | None
    drafted_throughput: float | None
    avg_draft_acceptance_rate: float | None  # fraction 0..1 (vLLM logs a percentage)
    timestamp_text: str | None = None
    engine: str | None = None  # from the stats line logged just before it, when there is one
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def num_speculative_tokens(self) -> int:
        return len(self.per_position_acceptance)

    @property
    def accepted_per_position(self) -> list[float]:
        """Accepted tokens at each position: rate x drafts, rounded back to the integer count vLLM
        divided when the printed rate (%.3f) pins it down (drafts < 1000); else the unrounded product."""
        n = self.num_drafts
        exact = n < 1000
        return [round(rate * n) if exact else rate * n for rate in self.per_position_acceptance]

    @property
    def num_drafts(self) -> int:
        """Drafts in the interval (vLLM logs no draft count).

        A draft holds at most k tokens, so drafts lie in [ceil(drafted / k), drafted]; they equal drafted / k
        only when every draft is full (draft models). ngram drafts can be shorter, so the count is the
        integer in that range that best reproduces what vLLM printed from it: the AL (1 + accepted / drafts,
        %.2f) and every per-position rate (accepted_i / drafts, %.3f, whose numerators are integers).
        """
        k = self.num_speculative_tokens
        if not k:  # pre-per-position format: recover it from AL = 1 + accepted / drafts
            if self.mean_acceptance_length > 1 and self.accepted_tokens:
                return int(round(self.accepted_tokens / (self.mean_acceptance_length - 1)))
            return 0
        lo = -(-self.drafted_tokens // k)
        if self.drafted_tokens == lo * k or self.accepted_tokens == 0 or self.mean_acceptance_length <= 1:
            return lo
        hi = self.drafted_tokens

        def misfit(n: int) -> tuple[float, float]:
            al_err = abs(1 + self.accepted_tokens / n - self.mean_acceptance_length)
            rate_err = max(abs(r * n - round(r * n)) for r in self.per_position_acceptance)
            # printed values are rounded: within half a unit of the last digit counts as a fit
            return (max(0.0, al_err - 0.005), max(0.0, rate_err - 0.0005 * n))

        guess = self.accepted_tokens / (self.mean_acceptance_length - 1)
        window = range(max(lo, int(guess) - 3), min(hi, int(guess) + 4) + 1) or range(lo, lo + 1)
        return min(window, key=lambda n: (misfit(n), abs(n - guess)))


@dataclass(slots=True)
class EngineStatsInterval:
    """One `Engine NNN:` or `N Engines Aggregated:` stats line."""

    line_no: int
    timestamp: datetime | None
    engine: str  # "000", or "aggregated:N"
    prompt_throughput: float
    generation_throughput: float
    running: int
    waiting: int
    kv_cache_usage: float | None  # fraction 0..1
    prefix_cache_hit_rate: float | None  # fraction 0..1
    extra: dict[str, str] = field(default_factory=dict)
    timestamp_text: str | None = None
    kv_cache_device: str | None = None  # "GPU", "CPU", ... as vLLM names it
    swapped: int | None = None  # V0 engines only


@dataclass(slots=True)
class EnvRecord:
    """specbook's `Env: K=V ...` line, written first into every server log by the launcher."""

    line_no: int
    env: dict[str, str]


@dataclass(slots=True)
class UnknownLine:
    """A line of no kind this parser reads (startup chatter, access logs, tracebacks)."""

    line_no: int
    text: str


@dataclass(slots=True)
class BrokenLine:
    """A line of a known kind whose fields could not be read."""

    line_no: int
    kind: str
    text: str
    reason: str


LogRecord = SpecDecodingInterval | EngineStatsInterval | EnvRecord | UnknownLine | BrokenLine


@dataclass(slots=True)
class ParsedLog:
    path: str | None
    env: dict[str, str] | None
    spec_decoding: list[SpecDecodingInterval]
    engine_stats: list[EngineStatsInterval]
    total_lines: int
    unknown_lines: int
    broken_lines: int
    first_timestamp: datetime | None
    last_timestamp: datetime | None
    broken: list[BrokenLine] = field(default_factory=list)  # the first few, for error messages

    @property
    def accepted_tokens(self) -> int:
        return sum(i.accepted_tokens for i in self.spec_decoding)

    @property
    def drafted_tokens(self) -> int:
        return sum(i.drafted_tokens for i in self.spec_decoding)

    @property
    def num_drafts(self) -> int:
        return sum(i.num_drafts for i in self.spec_decoding)

    @property
    def num_speculative_tokens(self) -> int | None:
        """k of the log's intervals; None when there are none or they disagree."""
        ks = {i.num_speculative_tokens for i in self.spec_decoding}
        return ks.pop() if len(ks) == 1 else None

    def acceptance_length(self) -> float | None:
        """Whole-log AL: 1 + sum(accepted) / sum(drafts).

        Not the mean of the interval ALs: intervals hold different numbers of drafts, so that mean
        over-weights quiet intervals.
        """
        drafts = self.num_drafts
        if drafts <= 0:
            return None
        return 1.0 + self.accepted_tokens / drafts

    def accepted_per_position(self) -> list[float]:
        """Accepted tokens per draft position summed over intervals (see SpecDecodingInterval.accepted_per_position)."""
        totals: list[float] = []
        for interval in self.spec_decoding:
            for pos, count in enumerate(interval.accepted_per_position):
                if pos == len(totals):
                    totals.append(0)
                totals[pos] += count
        return totals

    def per_position_acceptance(self) -> list[float]:
        """Per-position acceptance over the whole log: accepted at that position / drafts that reached it.

        Weighted by each interval's drafts, like acceptance_length(); a position a short-k interval lacks
        counts only where present.
        """
        accepted: list[float] = []
        drafts: list[int] = []
        for interval in self.spec_decoding:
            n = interval.num_drafts
            for pos, count in enumerate(interval.accepted_per_position):
                if pos == len(accepted):
                    accepted.append(0.0)
                    drafts.append(0)
                accepted[pos] += count
                drafts[pos] += n
        return [a / d if d else math.nan for a, d in zip(accepted, drafts, strict=True)]

    def draft_acceptance_rate(self) -> float | None:
        drafted = self.drafted_tokens
        return self.accepted_tokens / drafted if drafted else None


# --- line-level parsing -------------------------------------------------------------------------------


class _FieldError(ValueError):
    """A field of a recognised line does not parse."""


def _number(value: str, key: str) -> float:
    match = _NUMBER_RE.match(value)
    if not match:
        raise _FieldError(f"{key}: {value!r} is not a number")
    return float(match.group(1))


def _integer(value: str, key: str) -> int:
    number = _number(value, key)
    if not number.is_integer():
        raise _FieldError(f"{key}: {value!r} is not an integer")
    return int(number)


def _percent_fraction(value: str, key: str) -> float | None:
    """'9.1%' -> 0.091; a bare number <= 1 is already a fraction (older vLLM); 'nan%' -> None."""
    number = _number(value, key)
    if math.isnan(number):
        return None
    return number / 100.0 if value.strip().endswith("%") else number


def _fields(body: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for part in _FIELD_SPLIT_RE.split(body.strip()):
        key, sep, value = part.partition(": ")
        if not sep:
            raise _FieldError(f"field {part!r} is not 'Key: value'")
        fields[key.strip()] = value.strip()
    return fields


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
    if "Mean acceptance length" in fields:
        mean_al = _number(fields.pop("Mean acceptance length"), "Mean acceptance length")
    elif rates:
        mean_al = 1.0 + sum(rates)  # AL = 1 + accepted/drafts = 1 + sum of per-position rates
    else:
        raise _FieldError("no Mean acceptance length and no Per-position acceptance rate")
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


class _Timestamps:
    """Turns 'MM-DD HH:MM:SS' into datetimes from a reference year, stepping the year when the month wraps."""

    def __init__(self, year: int):
        self.year = year
        self._last_month = 0

    def __call__(self, text: str) -> datetime | None:
        try:
            month, day = int(text[0:2]), int(text[3:5])
            hour, minute, second = int(text[6:8]), int(text[9:11]), int(text[12:14])
            if month < self._last_month:  # Dec 31 -> Jan 1 inside one log
                self.year += 1
            stamp = datetime(self.year, month, day, hour, minute, second)
        except ValueError:
            return None
        self._last_month = month
        return stamp


def parse_header(line: str, timestamps: _Timestamps | None = None) -> LineHeader | None:
    """The vLLM logging prefix of a line, None when it has none."""
    if "\x1b" in line:
        line = _ANSI_RE.sub("", line)
    match = _HEADER_RE.search(line)
    if not match:
        return None
    stamp = match.group("stamp")
    pid = match.group("pid")
    return LineHeader(
        process=match.group("process"),
        pid=int(pid) if pid else None,
        level=match.group("level"),
        timestamp_text=stamp,
        timestamp=(timestamps or _Timestamps(datetime.now(timezone.utc).year))(stamp),
        source=match.group("source"),
        message=match.group("message"),
    )


def _lines(source: str | Path | Iterable[str]) -> tuple[str | None, Iterator[str], int]:
    """(path or None, line iterator, reference year) for a path or an iterable of lines.

    Files are split on "\\n" only (read as bytes): vLLM's progress bars hold bare "\\r", and text-mode
    universal newlines would split there, so line numbers would not match `grep -n`.
    """
    if isinstance(source, str) and "\n" in source:
        raise IngestError(
            "parse_log got log text as a str, which it reads as a path: pass text.splitlines() instead"
        )
    if isinstance(source, (str, Path)):
        path = Path(source)
        try:
            handle = path.open("rb")
            year = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).year
        except OSError as exc:
            raise IngestError(f"cannot read log file {path}: {exc.strerror or exc}") from exc

        def read() -> Iterator[str]:
            with handle:
                for raw in handle:
                    yield raw.decode("utf-8", errors="replace")

        return str(path), read(), year
    return None, iter(source), datetime.now(timezone.utc).year


class _Parser:
    """State carried across lines: the reference year and the last stats line (to tag SpecDecoding lines)."""

    def __init__(self, year: int):
        self.timestamps = _Timestamps(year)
        self.last_stats: EngineStatsInterval | None = None
        self.last_header: LineHeader | None = None

    def record(self, line_no: int, raw: str) -> LogRecord:
        line = raw.rstrip("\r\n")
        self.last_header = None
        if line.startswith(ENV_PREFIX):
            try:
                env = parse_env_line(line)
            except ValueError as exc:
                return BrokenLine(line_no, "env", line, str(exc))
            return EnvRecord(line_no, env or {})
        header = parse_header(line, self.timestamps) if ("[" in line) else None
        self.last_header = header
        message = header.message if header else (_ANSI_RE.sub("", line) if "\x1b" in line else line)
        try:
            if message.startswith(SPEC_DECODING_PREFIX):
                engine = self.last_stats.engine if self.last_stats else None
                return _spec_decoding(message[len(SPEC_DECODING_PREFIX) :], line_no, header, engine)
            stats = _STATS_RE.match(message) if "ngine" in message else None
            if stats:
                self.last_stats = _engine_stats(stats, line_no, header)
                return self.last_stats
        except _FieldError as exc:
            kind = "spec_decoding" if message.startswith(SPEC_DECODING_PREFIX) else "engine_stats"
            return BrokenLine(line_no, kind, line, str(exc))
        return UnknownLine(line_no, line)


def iter_records(source: str | Path | Iterable[str], *, year: int | None = None) -> Iterator[LogRecord]:
    """One record per line, in order. `year` is the reference year for timestamps (vLLM logs none);
    default: the file's modification year, or this year for an iterable of lines."""
    _, lines, default_year = _lines(source)
    parser = _Parser(year or default_year)
    for line_no, raw in enumerate(lines, start=1):
        yield parser.record(line_no, raw)


def parse_log(
    source: str | Path | Iterable[str], *, year: int | None = None, keep_broken: int = 20
) -> ParsedLog:
    """Parse a whole log in one streaming pass (a str is a path; pass a list for in-memory lines)."""
    path, lines, default_year = _lines(source)
    parser = _Parser(year or default_year)
    parsed = ParsedLog(path, None, [], [], 0, 0, 0, None, None)
    for line_no, raw in enumerate(lines, start=1):
        record = parser.record(line_no, raw)
        parsed.total_lines = line_no
        stamp = parser.last_header.timestamp if parser.last_header else None
        if stamp is not None:
            if parsed.first_timestamp is None:
                parsed.first_timestamp = stamp
            parsed.last_timestamp = stamp
        if isinstance(record, UnknownLine):
            parsed.unknown_lines += 1
        elif isinstance(record, SpecDecodingInterval):
            parsed.spec_decoding.append(record)
        elif isinstance(record, EngineStatsInterval):
            parsed.engine_stats.append(record)
        elif isinstance(record, EnvRecord):
            if parsed.env is None:  # the launcher writes it first; a later one is a second server appending
                parsed.env = record.env
        else:
            parsed.broken_lines += 1
            if len(parsed.broken) < keep_broken:
                parsed.broken.append(record)
    return parsed


# --- frames -------------------------------------------------------------------------------------------

# Stats and SpecDecoding lines of one interval are logged by the same call, so at most a second apart.
_SAME_INTERVAL_S = 1.0


def intervals_frame(parsed: ParsedLog):
    """One row per SpecDecoding interval, joined with the stats line logged with it.

    The stats line joined is the nearest preceding one, kept only when its timestamp is the same
    (or within a second): `running`/`waiting` then describe the batch during that interval, which the
    steady-state filter needs.
    """
    import pandas as pd

    stats_by_line = sorted(parsed.engine_stats, key=lambda s: s.line_no)
    max_k = max((i.num_speculative_tokens for i in parsed.spec_decoding), default=0)
    rows = []
    cursor = -1
    for interval in parsed.spec_decoding:
        while cursor + 1 < len(stats_by_line) and stats_by_line[cursor + 1].line_no < interval.line_no:
            cursor += 1
        stats = stats_by_line[cursor] if cursor >= 0 else None
        if stats is not None and interval.timestamp is not None and stats.timestamp is not None:
            if abs((interval.timestamp - stats.timestamp).total_seconds()) > _SAME_INTERVAL_S:
                stats = None
        row = {
            "line_no": interval.line_no,
            "timestamp": interval.timestamp,
            "timestamp_text": interval.timestamp_text,
            "engine": interval.engine,
            "mean_acceptance_length": interval.mean_acceptance_length,
            "accepted_tokens": interval.accepted_tokens,
            "drafted_tokens": interval.drafted_tokens,
            "drafts": interval.num_drafts,
            "num_speculative_tokens": interval.num_speculative_tokens,
            "accepted_throughput": interval.accepted_throughput,
            "drafted_throughput": interval.drafted_throughput,
            "avg_draft_acceptance_rate": interval.avg_draft_acceptance_rate,
        }
        for pos in range(max_k):
            rates = interval.per_position_acceptance
            row[f"acceptance_pos_{pos}"] = rates[pos] if pos < len(rates) else math.nan
        row.update(
            {
                "stats_line_no": stats.line_no if stats else None,
                "running": stats.running if stats else None,
                "waiting": stats.waiting if stats else None,
                "prompt_throughput": stats.prompt_throughput if stats else None,
                "generation_throughput": stats.generation_throughput if stats else None,
                "kv_cache_usage": stats.kv_cache_usage if stats else None,
            }
        )
        rows.append(row)
    columns = [
        "line_no", "timestamp", "timestamp_text", "engine", "mean_acceptance_length", "accepted_tokens",
        "drafted_tokens", "drafts", "num_speculative_tokens", "accepted_throughput", "drafted_throughput",
        "avg_draft_acceptance_rate", *[f"acceptance_pos_{p}" for p in range(max_k)], "stats_line_no",
        "running", "waiting", "prompt_throughput", "generation_throughput", "kv_cache_usage",
    ]  # fmt: skip
    frame = pd.DataFrame(rows, columns=columns)
    for name in ("stats_line_no", "running", "waiting"):
        frame[name] = frame[name].astype("Int64")
    return frame


def engine_stats_frame(parsed: ParsedLog):
    """One row per stats line (extra fields as `extra_<key>` columns)."""
    import pandas as pd

    rows = []
    for s in parsed.engine_stats:
        row = {
            "line_no": s.line_no,
            "timestamp": s.timestamp,
            "timestamp_text": s.timestamp_text,
            "engine": s.engine,
            "prompt_throughput": s.prompt_throughput,
            "generation_throughput": s.generation_throughput,
            "running": s.running,
            "waiting": s.waiting,
            "swapped": s.swapped,
            "kv_cache_device": s.kv_cache_device,
            "kv_cache_usage": s.kv_cache_usage,
            "prefix_cache_hit_rate": s.prefix_cache_hit_rate,
        }
        row.update({f"extra_{k}": v for k, v in s.extra.items()})
        rows.append(row)
    return pd.DataFrame(rows)
