"""vLLM server logs: SpecDecoding metrics, engine stats, the `Env:` line, timestamps.

vLLM (0.26 CUDA, 0.32 CPU) writes, every VLLM_LOG_STATS_INTERVAL seconds while busy, one stats line
per engine (or one `N Engines Aggregated:` line) followed by one `SpecDecoding metrics:` line, both
as `Key: value` fields joined by ", " (vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py).
A line that cannot be read is counted (unknown or broken), never fatal. Lines are split on "\\n" only,
as `grep -n` numbers them (vLLM's progress bars hold bare "\\r").

Two readers give one result:

* per line (`iter_records`, `parse_log(lines)`): every line through `_Parser.record`;
* by block (`parse_log(path)`, `summarise_log(path)`, what `specbook ingest` runs): the file is read in
  binary blocks (the memory held is a block, whatever the log's size), newlines are counted per block with
  numpy, and only the lines that can be records are looked at: lines starting with `Env:`, and lines
  holding `SpecDecoding metrics: ` or `Avg prompt throughput:` (found with bytes.find). A line in the exact
  layout vLLM writes is read from one compiled bytes regex's groups; any other such line goes through
  `_Parser.record`. `summarise_log` reads a large log with several processes, one byte range each, and
  puts their parts together exactly. Both readers agree line for line (tests/unit/test_ingest_fastpath.py
  checks it on every fixture log and on damaged copies; benchmarks/logparse_speed.py times it).

The AL, acceptance rate and per-position figures of a log come from `ParsedLog.acceptance()` (the
acceptance model, specbook.core.acceptance); this module only recovers the counts vLLM's log does not print
(drafts per interval, accepted tokens per position) from what it does print.

Timestamps: vLLM logs `MM-DD HH:MM:SS` with no year. Each gets the reference year (the file's
modification year by default), stepping one year each time a month is lower than the previous one (a
log running past New Year). The months followed are those of the timestamps the parser reads: the
first timestamped line's, then those of the SpecDecoding and stats lines; the last timestamped line
takes the year they reached. A stray line with another month in between changes no record's year.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from specbook.core.acceptance import Acceptance, position_column, position_columns
from specbook.core.envline import ENV_PREFIX, format_env_line, parse_env_line
from specbook.core.errors import IngestError

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

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

SOURCE = "vllm log"  # Acceptance.source of every figure this module computes
SPEC_DECODING_PREFIX = "SpecDecoding metrics: "
STATS_MARKER = "Avg prompt throughput:"  # every stats line's fields start with it

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

# The printed per-position rate (%.3f) pins the integer count behind it while drafts < 1000.
_EXACT_DRAFTS = 1000
_MAX_COUNT = 2**53  # counts are read below it (exact as floats); the block reader's regexes read 15 digits
# Line kinds, in the order the block reader handles two markers found in one line.
_SPEC, _STATS, _ENV, _CANDIDATE, _OTHER = 0, 1, 2, 3, 4


# --- records ----------------------------------------------------------------------------------------


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


def recover_drafts(al: float, accepted: int, drafted: int, rates: Sequence[float]) -> int:
    """Drafts in one interval, which vLLM's log does not print, from what it does print.

    A draft holds at most k tokens, so drafts lie in [ceil(drafted / k), drafted]; they equal drafted / k
    only when every draft is full (draft models). ngram drafts can be shorter, so the count is the
    integer in that range that best reproduces what vLLM printed from it: the AL (1 + accepted / drafts,
    %.2f) and every per-position rate (accepted_i / drafts, %.3f, whose numerators are integers). A value
    vLLM printed as nan/inf (it divides by zero drafts) is left out of the fit; with neither AL nor rates
    to fit, the count is ceil(drafted / k), the fewest drafts that hold the drafted tokens.
    """
    k = len(rates)
    al_known = math.isfinite(al)
    if not k:  # pre-per-position format: recover it from AL = 1 + accepted / drafts
        if al_known and al > 1 and accepted:
            return min(drafted, int(round(accepted / (al - 1))))  # a draft holds a drafted token at least
        return 0
    lo = -(-drafted // k)
    if drafted == lo * k or accepted == 0 or (al_known and al <= 1):
        return lo
    rates_known = all(math.isfinite(r) for r in rates)
    if al_known:
        guess = accepted / (al - 1)
    elif rates_known and sum(rates) > 0:
        guess = accepted / sum(rates)
    else:
        return lo
    if not math.isfinite(guess):  # rates that add up to almost 0 for accepted tokens: as any guess past drafted
        return lo
    hi = drafted

    def misfit(n: int) -> tuple[float, float]:
        al_err = abs(1 + accepted / n - al) if al_known else 0.0
        rate_err = max(abs(r * n - round(r * n)) for r in rates) if rates_known else 0.0
        # printed values are rounded: within half a unit of the last digit counts as a fit
        return (max(0.0, al_err - 0.005), max(0.0, rate_err - 0.0005 * n))

    window = range(max(lo, int(guess) - 3), min(hi, int(guess) + 4) + 1) or range(lo, lo + 1)
    return min(window, key=lambda n: (misfit(n), abs(n - guess)))


def _position_table(rates: np.ndarray, drafts: np.ndarray) -> np.ndarray:
    """The per-position rule, row by row: rates (n, k) x drafts (n,), rounded to the integer count vLLM
    divided where the printed rate (%.3f) pins it down (drafts < 1000), else the unrounded product; NaN
    where a rate or a draft count is not a number. np.rint rounds half to even, as round() does."""
    import numpy as np

    product = rates * np.asarray(drafts, dtype=np.float64)[:, None]
    counts = np.where((drafts < _EXACT_DRAFTS)[:, None], np.rint(product), product)
    counts[~np.isfinite(counts)] = np.nan
    return counts


def position_counts(rates: Sequence[float], drafts: float) -> list[float]:
    """Accepted tokens at positions 1..k from one interval's printed rates and its drafts (see _position_table)."""
    import numpy as np

    table = _position_table(np.asarray(rates, dtype=np.float64).reshape(1, -1), np.asarray([drafts], dtype=np.float64))
    return table[0].tolist()


class _Rows:
    """SpecDecoding figures of intervals in file order, as the counts are recovered and summed from them."""

    __slots__ = ("accepted", "al", "drafted", "ks", "rates")

    def __init__(self) -> None:
        self.al: list[float] = []
        self.accepted: list[int] = []
        self.drafted: list[int] = []
        self.rates: list[float] = []  # every row's rates, one after the other
        self.ks: list[int] = []

    def add(self, al: float, accepted: int, drafted: int, rates: Sequence[float]) -> None:
        self.al.append(al)
        self.accepted.append(accepted)
        self.drafted.append(drafted)
        self.rates.extend(rates)
        self.ks.append(len(rates))

    def __len__(self) -> int:
        return len(self.accepted)

    def counts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(drafts (n,), accepted per position (n, K) with NaN past a row's own k, valid (n, K)): drafts by
        recover_drafts (drafted / k where every draft is full), positions by _position_table, and 0 at
        every position of an interval that accepted nothing, whatever rate it printed (0.000 or nan)."""
        import numpy as np

        n = len(self.accepted)
        ks = np.asarray(self.ks, dtype=np.int64)
        width = int(ks.max()) if n else 0
        flat = np.asarray(self.rates, dtype=np.float64)
        uniform = bool(n) and bool((ks == width).all())
        offsets = np.cumsum(ks) - ks
        if uniform:
            rates = flat.reshape(n, width)
            valid = np.ones((n, width), dtype=bool)
        else:
            rates = np.full((n, width), np.nan)
            rows = np.repeat(np.arange(n), ks)
            columns = np.arange(len(flat)) - np.repeat(offsets, ks)
            rates[rows, columns] = flat
            valid = np.arange(width)[None, :] < ks[:, None]
        drafted = np.asarray(self.drafted, dtype=np.int64)
        per_draft = np.maximum(ks, 1)
        full = (ks > 0) & (drafted % per_draft == 0)
        drafts = np.where(full, drafted // per_draft, 0)
        for i in np.flatnonzero(~full).tolist():  # short drafts (ngram) or no per-position rates
            start = int(offsets[i])
            drafts[i] = recover_drafts(self.al[i], self.accepted[i], self.drafted[i],
                                       self.rates[start : start + self.ks[i]])
        counts = _position_table(rates, drafts)
        counts[np.asarray(self.accepted, dtype=np.int64) == 0] = 0.0
        if not uniform:
            counts[~valid] = np.nan
        return drafts, counts, valid


@dataclass(slots=True)
class SpecDecodingInterval:
    """One `SpecDecoding metrics:` line: the drafts of one logging interval, fields as vLLM prints them."""

    line_no: int
    timestamp: datetime | None
    mean_acceptance_length: float  # the printed AL; nan where vLLM printed nan
    accepted_tokens: int
    drafted_tokens: int
    per_position_acceptance: list[float]  # printed rates, positions 1..k
    accepted_throughput: float | None
    drafted_throughput: float | None
    avg_draft_acceptance_rate: float | None  # fraction 0..1 (vLLM logs a percentage)
    timestamp_text: str | None = None
    engine: str | None = None  # from the stats line logged just before it, when there is one
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def num_speculative_tokens(self) -> int:
        """k: the number of per-position rates printed."""
        return len(self.per_position_acceptance)

    @property
    def num_drafts(self) -> int:
        """Drafts in the interval, recovered from the printed AL and rates (see recover_drafts)."""
        return recover_drafts(self.mean_acceptance_length, self.accepted_tokens, self.drafted_tokens,
                              self.per_position_acceptance)

    @property
    def accepted_per_position(self) -> list[float]:
        """Accepted tokens at positions 1..k (index 0 is position 1), see _Rows.counts."""
        return list(self.acceptance().accepted_per_position)

    def acceptance(self) -> Acceptance:
        """This interval's counts through the acceptance model."""
        sums = _CountSums()
        sums.add(self.mean_acceptance_length, self.accepted_tokens, self.drafted_tokens, self.per_position_acceptance)
        return sums.acceptance()


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


class _CountSums:
    """A log's interval counts added up; the one place its totals are. Sums are exact, so they do not depend on
    the order or the batches they are added in: integer counts as integers, an unrounded per-position count
    (intervals of 1000 drafts or more) as the exact fraction its float is, rounded to a float once at the end.
    Rows wait in `pending` and are counted a batch at a time."""

    __slots__ = ("accepted", "drafted", "drafts", "fractions", "integers", "ks", "nan", "pending")

    def __init__(self) -> None:
        self.drafts = 0
        self.drafted = 0
        self.accepted = 0
        self.integers: list[int] = []  # per position
        self.fractions: list[Fraction] = []  # per position
        self.nan: list[bool] = []  # per position: a count that is not a number was added
        self.ks: set[int] = set()
        self.pending = _Rows()

    def add(self, al: float, accepted: int, drafted: int, rates: Sequence[float]) -> None:
        self.pending.add(al, accepted, drafted, rates)

    def _widen(self, width: int) -> None:
        grow = width - len(self.integers)
        if grow > 0:
            self.integers += [0] * grow
            self.fractions += [Fraction(0)] * grow
            self.nan += [False] * grow

    def flush(self) -> None:
        rows = self.pending
        if not len(rows):
            return
        import numpy as np

        self.pending = _Rows()
        drafts, counts, valid = rows.counts()
        self.drafts += int(drafts.sum())
        self.drafted += sum(rows.drafted)
        self.accepted += sum(rows.accepted)
        self.ks.update(rows.ks)
        width = counts.shape[1]
        self._widen(width)
        counts = np.where(valid, counts, 0.0)  # a position past a row's k adds nothing
        nan = np.isnan(counts)
        counts[nan] = 0.0
        whole = drafts < _EXACT_DRAFTS  # rounded counts: integers (far below 2**53)
        integers = counts[whole].astype(np.int64).sum(axis=0).tolist()
        found_nan = nan.any(axis=0).tolist()
        for i in range(width):
            self.integers[i] += integers[i]
            self.nan[i] = self.nan[i] or found_nan[i]
        for row in counts[~whole].tolist():  # unrounded: rare (1000 drafts in one stats interval)
            for i, value in enumerate(row):
                self.fractions[i] += Fraction(value)

    def merge(self, other: _CountSums) -> None:
        """Add another part's sums (the same log, read elsewhere)."""
        self.flush()
        other.flush()
        self.drafts += other.drafts
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.ks |= other.ks
        self._widen(len(other.integers))
        for i in range(len(other.integers)):
            self.integers[i] += other.integers[i]
            self.fractions[i] += other.fractions[i]
            self.nan[i] = self.nan[i] or other.nan[i]

    @property
    def positions(self) -> list[float]:
        self.flush()
        return [math.nan if nan else float(whole + part)
                for whole, part, nan in zip(self.integers, self.fractions, self.nan, strict=True)]

    def acceptance(self) -> Acceptance:
        positions = self.positions  # flushes first
        return Acceptance.from_counts(SOURCE, self.drafts, self.drafted, self.accepted, positions)

    @property
    def k(self) -> int | None:
        self.flush()
        return next(iter(self.ks)) if len(self.ks) == 1 else None


@dataclass(slots=True)
class LogSummary:
    """What a whole log adds up to; what `specbook ingest` reports for a vLLM log."""

    path: str | None
    env: dict[str, str] | None
    acceptance: Acceptance
    k: int | None  # of the log's intervals; None when there are none or they disagree
    intervals: int
    engine_stats: int
    total_lines: int
    unknown_lines: int
    broken_lines: int
    first_timestamp: datetime | None
    last_timestamp: datetime | None
    broken: list[BrokenLine] = field(default_factory=list)  # the first few, for error messages


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

    def _sums(self) -> _CountSums:
        sums = _CountSums()
        for i in self.spec_decoding:
            sums.add(i.mean_acceptance_length, i.accepted_tokens, i.drafted_tokens, i.per_position_acceptance)
        return sums

    def acceptance(self) -> Acceptance:
        """The whole log through the acceptance model (source "vllm log"): every interval's counts summed,
        so AL = 1 + sum(accepted) / sum(drafts), never a mean of the interval ALs (intervals hold
        different numbers of drafts)."""
        return self._sums().acceptance()

    @property
    def k(self) -> int | None:
        """k of the log's intervals; None when there are none or they disagree."""
        return self._sums().k

    def summary(self) -> LogSummary:
        sums = self._sums()
        return LogSummary(
            path=self.path, env=self.env, acceptance=sums.acceptance(), k=sums.k,
            intervals=len(self.spec_decoding), engine_stats=len(self.engine_stats),
            total_lines=self.total_lines, unknown_lines=self.unknown_lines, broken_lines=self.broken_lines,
            first_timestamp=self.first_timestamp, last_timestamp=self.last_timestamp, broken=list(self.broken),
        )  # fmt: skip


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
    if not 0 <= number < _MAX_COUNT:  # a count: negative or huge ones break the drafts recovery and the sums
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


class _Timestamps:
    """Turns 'MM-DD HH:MM:SS' into datetimes from a reference year, stepping the year when the month wraps.

    Calling it commits the month (the parser read that timestamp); `peek` gives the datetime the same
    text would get now without committing. An impossible date (02-30) gives None and commits nothing.
    """

    def __init__(self, year: int):
        self.year = year
        self.last_month = 0
        self._cache: tuple[str, datetime | None] | None = None
        self.months: list[int] = []  # the months committed, in order (a run of one month once)
        self.leap_day = False  # a 02-29 was read: valid or not depending on the year (see _scan_parallel)

    def _resolve(self, text: str) -> tuple[datetime | None, int]:
        try:
            month, day = int(text[0:2]), int(text[3:5])
            hour, minute, second = int(text[6:8]), int(text[9:11]), int(text[12:14])
            year = self.year + 1 if month < self.last_month else self.year  # Dec 31 -> Jan 1 inside one log
            return datetime(year, month, day, hour, minute, second), year
        except ValueError:
            return None, self.year

    def __call__(self, text: str) -> datetime | None:
        cache = self._cache
        if cache is not None and cache[0] == text:  # the same text again: the same month, nothing to step
            return cache[1]
        stamp, year = self._resolve(text)
        if stamp is not None:
            self.year, self.last_month = year, stamp.month
            if not self.months or self.months[-1] != stamp.month:
                self.months.append(stamp.month)
        self.leap_day = self.leap_day or text.startswith("02-29")
        self._cache = (text, stamp)
        return stamp

    def peek(self, text: str) -> datetime | None:
        self.leap_day = self.leap_day or text.startswith("02-29")
        return self._resolve(text)[0]

    def replay(self, month: int) -> None:
        """Commit a month another reader committed (a valid date of that month), as __call__ would."""
        if month < self.last_month:
            self.year += 1
        self.last_month = month
        self._cache = None


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
        pid=int(pid) if pid and len(pid) <= 18 else None,  # more digits than any pid (or int() reads): none
        level=match.group("level"),
        timestamp_text=stamp,
        timestamp=(timestamps or _Timestamps(datetime.now(timezone.utc).year))(stamp),
        source=match.group("source"),
        message=match.group("message"),
    )


def _header_stamp(line: str) -> str | None:
    """The timestamp text of a line's vLLM header, None when it has none (reads no year, commits nothing)."""
    if "[" not in line:
        return None
    if "\x1b" in line:
        line = _ANSI_RE.sub("", line)
    match = _HEADER_RE.search(line)
    return match.group("stamp") if match else None


def _reference_year(path: Path) -> int:
    return datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).year


def _open(source: str | Path) -> tuple[Path, BinaryIO, int]:
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
        year = _reference_year(path)
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
        path, handle, year = _open(source)

        def read() -> Iterator[str]:
            with handle:
                for raw in handle:
                    yield raw.decode("utf-8", errors="replace")

        return str(path), read(), year
    return None, iter(source), datetime.now(timezone.utc).year


class _Parser:
    """State carried across lines: the timestamps read so far and the engine of the last stats line."""

    def __init__(self, year: int):
        self.timestamps = _Timestamps(year)
        self.last_engine: str | None = None  # tags SpecDecoding lines with the stats line logged before them
        self.last_header: LineHeader | None = None
        self.last_stamp: datetime | None = None
        self.last_kind = _OTHER
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
        self.last_kind = _ENV
        if line.startswith(ENV_PREFIX):
            return self.env_record(line_no, line)
        if SPEC_DECODING_PREFIX not in line and STATS_MARKER not in line:
            self.last_kind = _OTHER
            if not self.first_read and (stamp := _header_stamp(line)) is not None:
                self.last_stamp = self.timestamps(stamp)
                self.first_read = self.last_stamp is not None
            return UnknownLine(line_no, line)
        self.last_kind = _CANDIDATE
        header = parse_header(line, self.timestamps) if ("[" in line) else None
        if header is not None and header.timestamp is not None:
            self.first_read = True
            self.last_stamp = header.timestamp
        self.last_header = header
        message = header.message if header else (_ANSI_RE.sub("", line) if "\x1b" in line else line)
        try:
            if message.startswith(SPEC_DECODING_PREFIX):
                return _spec_decoding(message[len(SPEC_DECODING_PREFIX) :], line_no, header, self.last_engine)
            stats = _STATS_RE.match(message) if "ngine" in message else None
            if stats:
                record = _engine_stats(stats, line_no, header)
                self.last_engine = record.engine
                return record
        except _FieldError as exc:
            kind = "spec_decoding" if message.startswith(SPEC_DECODING_PREFIX) else "engine_stats"
            return BrokenLine(line_no, kind, line, str(exc))
        return UnknownLine(line_no, line)


def iter_records(source: str | Path | Iterable[str], *, year: int | None = None) -> Iterator[LogRecord]:
    """One record per line, in order (the per-line reader). `year` is the reference year for timestamps
    (vLLM logs none); default: the file's modification year, or this year for an iterable of lines."""
    _, lines, default_year = _lines(source)
    parser = _Parser(year or default_year)
    for line_no, raw in enumerate(lines, start=1):
        yield parser.record(line_no, raw)


class _Collector:
    """Where both readers put what they read: records (ParsedLog) or only sums (LogSummary)."""

    def __init__(self, path: str | None, keep_records: bool, keep_broken: int):
        self.path = path
        self.keep_records = keep_records
        self.keep_broken = keep_broken
        self.env: dict[str, str] | None = None
        self.spec: list[SpecDecodingInterval] = []
        self.stats: list[EngineStatsInterval] = []
        self.sums = _CountSums()
        self.intervals = self.stats_lines = self.env_lines = self.broken_lines = 0
        self.broken: list[BrokenLine] = []
        self.total_lines = 0
        self.first: datetime | None = None
        self.last: datetime | None = None

    def add(self, record: LogRecord) -> None:
        """A record from _Parser.record (UnknownLine is counted from the totals, not here)."""
        if isinstance(record, SpecDecodingInterval):
            self.intervals += 1
            self.sums.add(record.mean_acceptance_length, record.accepted_tokens, record.drafted_tokens,
                          record.per_position_acceptance)
            if self.keep_records:
                self.spec.append(record)
        elif isinstance(record, EngineStatsInterval):
            self.stats_lines += 1
            if self.keep_records:
                self.stats.append(record)
        elif isinstance(record, EnvRecord):
            self.env_lines += 1
            if self.env is None:  # the launcher writes it first; a later one is a second server appending
                self.env = record.env
        elif isinstance(record, BrokenLine):
            self.broken_lines += 1
            if len(self.broken) < self.keep_broken:
                self.broken.append(record)

    @property
    def unknown_lines(self) -> int:
        return self.total_lines - self.intervals - self.stats_lines - self.env_lines - self.broken_lines

    def parsed(self) -> ParsedLog:
        return ParsedLog(self.path, self.env, self.spec, self.stats, self.total_lines, self.unknown_lines,
                         self.broken_lines, self.first, self.last, self.broken)

    def summary(self) -> LogSummary:
        return LogSummary(
            path=self.path, env=self.env, acceptance=self.sums.acceptance(), k=self.sums.k,
            intervals=self.intervals, engine_stats=self.stats_lines, total_lines=self.total_lines,
            unknown_lines=self.unknown_lines, broken_lines=self.broken_lines, first_timestamp=self.first,
            last_timestamp=self.last, broken=list(self.broken),
        )  # fmt: skip


def _parse_lines(lines: Iterable[str], path: str | None, year: int, keep_broken: int) -> _Collector:
    """The per-line reader over a whole log."""
    parser = _Parser(year)
    out = _Collector(path, keep_records=True, keep_broken=keep_broken)
    line_no = 0
    for line_no, raw in enumerate(lines, start=1):  # noqa: B007 (line_no is the total below)
        record = parser.record(line_no, raw)
        out.add(record)
        stamp = parser.last_stamp
        if stamp is None and parser.last_kind == _OTHER and parser.first_read:
            text = _header_stamp(raw.rstrip("\r\n"))  # read for the last timestamp only: no year step
            stamp = parser.timestamps.peek(text) if text is not None else None
        if stamp is not None:
            if out.first is None:
                out.first = stamp
            out.last = stamp
    out.total_lines = line_no
    return out


def parse_log(
    source: str | Path | Iterable[str], *, year: int | None = None, keep_broken: int = 20
) -> ParsedLog:
    """Parse a whole log: a path (a str is a path) by the block reader, an iterable of lines line by line.

    `year` is the reference year for timestamps (vLLM logs none); default: the file's modification year,
    or this year for lines.
    """
    if isinstance(source, (str, Path)):
        from specbook.engines.vllm.blockscan import scan_file

        return scan_file(source, year=year, keep_records=True, keep_broken=keep_broken).parsed()
    out = _parse_lines(source, None, year or datetime.now(timezone.utc).year, keep_broken)
    return out.parsed()


def summarise_log(
    source: str | Path | Iterable[str], *, year: int | None = None, keep_broken: int = 20,
    processes: int | None = None,
) -> LogSummary:
    """What a whole log adds up to, without keeping its records. A path is read by the block reader, a large
    log by several processes at once (`processes`; default: see _processes), with the same result."""
    if not isinstance(source, (str, Path)):
        return _parse_lines(source, None, year or datetime.now(timezone.utc).year, keep_broken).summary()
    from specbook.engines.vllm import blockscan

    path, handle, default_year = _open(source)
    handle.close()
    size = path.stat().st_size
    n = blockscan.processes_for(size) if processes is None else processes
    if n > 1:
        out = blockscan.summarise_parallel(path, year or default_year, keep_broken, n, blockscan.BLOCK_SIZE)
        if out is not None:
            return out.summary()
    return blockscan.scan_file(path, year=year or default_year, keep_records=False, keep_broken=keep_broken).summary()


# --- frames -------------------------------------------------------------------------------------------

# Stats and SpecDecoding lines of one interval are logged by the same call, so at most a second apart.
_SAME_INTERVAL_S = 1.0
_HEAD_COLUMNS = ["line_no", "timestamp", "timestamp_text", "engine", "al", "accepted_tokens", "draft_tokens",
                 "drafts", "k", "accepted_throughput", "drafted_throughput", "acceptance_rate"]
_STATS_COLUMNS = ["stats_line_no", "running", "waiting", "prompt_throughput", "generation_throughput",
                  "kv_cache_usage"]
# Frames saved by the code before the acceptance model: old name -> new name.
_OLD_COLUMNS = {"mean_acceptance_length": "al", "drafted_tokens": "draft_tokens", "num_speculative_tokens": "k",
                "avg_draft_acceptance_rate": "acceptance_rate"}
_OLD_RATE_RE = re.compile(r"^acceptance_pos_(\d+)$")


def intervals_frame(parsed: ParsedLog) -> pd.DataFrame:
    """One row per SpecDecoding interval, joined with the stats line logged with it.

    Columns: line_no, timestamp, timestamp_text, engine, al (the printed "Mean acceptance length"),
    accepted_tokens, draft_tokens, drafts (recovered, see recover_drafts), k, accepted_throughput,
    drafted_throughput, acceptance_rate (the printed "Avg Draft acceptance rate", a fraction),
    accepted_pos_1 .. accepted_pos_K (accepted tokens at each position, counts, see _Rows.counts; NaN
    past an interval's own k), then the joined stats line: stats_line_no, running, waiting,
    prompt_throughput, generation_throughput, kv_cache_usage.

    The stats line joined is the nearest preceding one, kept only when its timestamp is the same
    (or within a second): `running`/`waiting` then describe the batch during that interval, which the
    steady-state filter needs.
    """
    import pandas as pd

    stats_by_line = sorted(parsed.engine_stats, key=lambda s: s.line_no)
    max_k = max((i.num_speculative_tokens for i in parsed.spec_decoding), default=0)
    pos_columns = [position_column(p) for p in range(1, max_k + 1)]
    figures = _Rows()
    for interval in parsed.spec_decoding:
        figures.add(interval.mean_acceptance_length, interval.accepted_tokens, interval.drafted_tokens,
                    interval.per_position_acceptance)
    drafts_all, counts_all, _ = figures.counts()
    rows = []
    cursor = -1
    for n, interval in enumerate(parsed.spec_decoding):
        while cursor + 1 < len(stats_by_line) and stats_by_line[cursor + 1].line_no < interval.line_no:
            cursor += 1
        stats = stats_by_line[cursor] if cursor >= 0 else None
        if stats is not None and interval.timestamp is not None and stats.timestamp is not None:
            if abs((interval.timestamp - stats.timestamp).total_seconds()) > _SAME_INTERVAL_S:
                stats = None
        drafts = int(drafts_all[n])
        counts = counts_all[n, : interval.num_speculative_tokens].tolist()
        row = [
            interval.line_no, interval.timestamp, interval.timestamp_text, interval.engine,
            interval.mean_acceptance_length, interval.accepted_tokens, interval.drafted_tokens, drafts,
            interval.num_speculative_tokens, interval.accepted_throughput, interval.drafted_throughput,
            interval.avg_draft_acceptance_rate,
            *[float(c) for c in counts], *[math.nan] * (max_k - len(counts)),
        ]  # fmt: skip
        if stats is None:
            row += [None] * len(_STATS_COLUMNS)
        else:
            row += [stats.line_no, stats.running, stats.waiting, stats.prompt_throughput,
                    stats.generation_throughput, stats.kv_cache_usage]
        rows.append(row)
    frame = pd.DataFrame(rows, columns=[*_HEAD_COLUMNS, *pos_columns, *_STATS_COLUMNS])
    return _intervals_dtypes(frame)


def _intervals_dtypes(frame: pd.DataFrame) -> pd.DataFrame:
    for name in ("stats_line_no", "running", "waiting"):
        frame[name] = frame[name].astype("Int64")
    for name in ("al", "accepted_throughput", "drafted_throughput", "acceptance_rate",
                 *position_columns(frame.columns), "prompt_throughput", "generation_throughput", "kv_cache_usage"):
        frame[name] = frame[name].astype("float64")
    for name in ("line_no", "accepted_tokens", "draft_tokens", "drafts", "k"):
        frame[name] = frame[name].astype("int64")
    return frame


def upgrade_intervals_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A frame saved by intervals_frame before the acceptance model (columns mean_acceptance_length,
    drafted_tokens, num_speculative_tokens, avg_draft_acceptance_rate and per-position RATES
    acceptance_pos_0..) in the columns intervals_frame gives now; a frame in the new columns as it is.

    Per-position counts come from the saved rates and drafts by _position_table, the rule the parser
    itself applies to the rates it reads (round(rate x drafts) below 1000 drafts, else rate x drafts);
    columns other than those renamed keep their place and values.
    """
    old_rates = sorted((int(m.group(1)), c) for c in frame.columns if (m := _OLD_RATE_RE.match(str(c))))
    if not old_rates and not any(c in frame.columns for c in _OLD_COLUMNS):
        return frame
    if old_rates and "drafts" not in frame.columns:
        raise IngestError(f"an old intervals frame with per-position rates needs its drafts column; it has "
                          f"{list(frame.columns)}")
    import pandas as pd

    rate_columns = [c for _, c in old_rates]
    new_pos = {c: position_column(p + 1) for p, c in old_rates}
    if rate_columns:  # the rule the parser applies to the rates it reads (NaN where no rate was saved)
        counts = _position_table(frame[rate_columns].to_numpy(dtype=float, na_value=math.nan),
                                 frame["drafts"].to_numpy(dtype=float, na_value=math.nan))
    columns: dict[str, Any] = {}
    for c in frame.columns:
        if c in new_pos:
            columns[new_pos[c]] = pd.Series(counts[:, rate_columns.index(c)], index=frame.index, dtype="float64")
        else:
            columns[_OLD_COLUMNS.get(c, c)] = frame[c]
    return pd.DataFrame(columns, index=frame.index)


def engine_stats_frame(parsed: ParsedLog) -> pd.DataFrame:
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


# --- engine detection and ingest ------------------------------------------------------------------------

# Signatures of vLLM's log lines (searched in each of a file's first lines; see specbook.ingest).
LOG_SIGNATURES: list[re.Pattern[str]] = [
    re.compile(r"\((?:APIServer|EngineCore[^ ]*) pid=\d+\)"),
    re.compile(r"(?:INFO|WARNING|DEBUG|ERROR) \d\d-\d\d \d\d:\d\d:\d\d \[[\w./-]+\.py:\d+\]"),
    re.compile(r"vllm|vLLM"),
    re.compile(r"SpecDecoding metrics: |Engine \d{3}: Avg prompt throughput"),
]


def detect_log(lines: Iterable[str]) -> int:
    """How many of these lines carry a vLLM signature."""
    return sum(1 for line in lines if any(p.search(line) for p in LOG_SIGNATURES))


def ingest_summary(path: str | Path) -> dict[str, Any]:
    """What `specbook ingest` reports for a vLLM log (specbook.ingest.IngestResult's fields, the acceptance
    counts as an Acceptance), read by the block reader."""
    s = summarise_log(path)
    return {
        "acceptance": s.acceptance, "records": s.intervals, "record_kind": "interval", "k": s.k, "env": s.env,
        "stats_lines": s.engine_stats, "total_lines": s.total_lines, "unknown_lines": s.unknown_lines,
        "broken_lines": s.broken_lines, "first_timestamp": s.first_timestamp, "last_timestamp": s.last_timestamp,
    }  # fmt: skip
