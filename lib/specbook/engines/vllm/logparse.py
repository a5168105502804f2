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
acceptance model, specbook.acceptance); this module only recovers the counts vLLM's log does not print
(drafts per interval, accepted tokens per position) from what it does print.

Timestamps: vLLM logs `MM-DD HH:MM:SS` with no year. Each gets the reference year (the file's
modification year by default), stepping one year each time a month is lower than the previous one (a
log running past New Year). The months followed are those of the timestamps the parser reads: the
first timestamped line's, then those of the SpecDecoding and stats lines; the last timestamped line
takes the year they reached. A stray line with another month in between changes no record's year.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from specbook.acceptance import Acceptance, position_column, position_columns
from specbook.envline import ENV_PREFIX, format_env_line, parse_env_line
from specbook.errors import IngestError

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
            return int(round(accepted / (al - 1)))
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
        pid=int(pid) if pid else None,
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
        return _scan_file(source, year=year, keep_records=True, keep_broken=keep_broken).parsed()
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
    path, handle, default_year = _open(source)
    handle.close()
    size = path.stat().st_size
    n = _processes(size) if processes is None else processes
    if n > 1:
        out = _summarise_parallel(path, year or default_year, keep_broken, n, BLOCK_SIZE)
        if out is not None:
            return out.summary()
    return _scan_file(path, year=year or default_year, keep_records=False, keep_broken=keep_broken).summary()


# --- the block reader -------------------------------------------------------------------------------

BLOCK_SIZE = 1 << 19  # bytes read at a time (a few passes run over each: small enough to stay in cache); a
# longer line grows the buffer to hold it

_FLUSH_ROWS = 4096  # SpecDecoding rows summed at a time (numpy's per-call cost spread over many)
_SPEC_MARKER = SPEC_DECODING_PREFIX.encode()
_STATS_MARKER = STATS_MARKER.encode()
_ENV_BYTES = ENV_PREFIX.encode()
_NEWLINE, _ENV_FIRST = 10, _ENV_BYTES[0]
# A header needs one of these (after colour codes are stripped, hence ESC).
_HEADER_WORDS = (b"INFO", b"WARNING", b"DEBUG", b"ERROR", b"CRITICAL", b"\x1b")
# A number as _number reads it: float() of a match is what _number reads wherever float() accepts it (a
# value such as "1.2.3", which float() refuses, sends the line to _Parser.record); as a field's whole value
# it is valid for _number, _percent_fraction.
_N = rb"\d[\d.]*"
_I = rb"\d{1,15}"  # an integer below 2**53: int() of it is what _integer reads
# Groups of the two line regexes below.
_SPEC_GROUPS = {"stamp": 1, "marker": 2, "al": 3, "accepted": 6, "drafted": 7, "rates": 8}
_STATS_GROUPS = {"stamp": 1, "index": 2, "count": 3, "marker": 4}


def _line_regexes(month: int, colour: bool) -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
    """Whole SpecDecoding and stats lines in the exact layout vLLM writes (the format strings of
    vllm/v1/spec_decode/metrics.py and vllm/v1/metrics/loggers.py behind its formatter's header: one space
    between parts, a process name without spaces, colour codes only around the header's parts, as its
    ColoredFormatter puts them, where `colour`) with a timestamp in this month. Where one matches, the line without its
    colour codes is what _HEADER_RE.search splits the same way, and every field reads as _Parser.record
    reads it; every other line holding a marker goes through _Parser.record itself."""
    c = rb"(?:\x1b\[[0-9;]*m)*" if colour else b""  # colour codes (VLLM_LOGGING_COLOR), which _Parser.record strips
    head = (c + rb"(?:\([^ ()\n\x1b]* pid=\d+\)" + c + rb" " + c + rb")?(?:INFO|WARNING|DEBUG|ERROR|CRITICAL)" + c
            + rb" " + c + rb"(" + b"%02d" % month + rb"-\d\d \d\d:\d\d:\d\d)" + c + rb" " + c
            + rb"\[[^\]\n\x1b]+\]" + c + rb" ")
    spec = re.compile(
        head + rb"()SpecDecoding metrics: Mean acceptance length: (" + _N + rb"), "
        rb"Accepted throughput: (" + _N + rb") tokens/s, Drafted throughput: (" + _N + rb") tokens/s, "
        rb"Accepted: (" + _I + rb") tokens, Drafted: (" + _I + rb") tokens, "
        rb"Per-position acceptance rate: (" + _N + rb"(?:, " + _N + rb")*), "
        rb"Avg Draft acceptance rate: (" + _N + rb"|nan)%\r*\n"
    )
    stats = re.compile(
        head + rb"(?:Engine (\d+)|(\d+) Engines Aggregated): ()"
        rb"Avg prompt throughput: (" + _N + rb") tokens/s, Avg generation throughput: (" + _N + rb") tokens/s, "
        rb"Running: (" + _I + rb") reqs, Waiting: (" + _I + rb") reqs, "
        rb"([A-Z]+) KV cache usage: (" + _N + rb")%, Prefix cache hit rate: (" + _N + rb")%\r*\n"
    )
    return spec, stats


_REGEXES: dict[tuple[int, bool], tuple[re.Pattern[bytes], re.Pattern[bytes]]] = {}


def _regexes(month: int, colour: bool = True) -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
    """_line_regexes, compiled once; without colour codes the regexes run faster (a block without ESC)."""
    key = (month, colour)
    if key not in _REGEXES:
        _REGEXES[key] = _line_regexes(month, colour)
    return _REGEXES[key]


def _read_blocks(handle: BinaryIO, block_size: int, limit: int | None = None) -> Iterator[tuple[bytearray, int]]:
    """(buffer, end): buffer[:end] holds whole lines, each ending in b"\\n" (one is added after a last line
    that has none), read from the handle's position on, `limit` bytes at most. The buffer is reused: use it
    before asking for the next block."""
    buf = bytearray(block_size)
    filled = 0
    left = math.inf if limit is None else limit
    while True:
        if filled == len(buf):  # one line longer than the buffer: grow it to hold the line
            buf.extend(bytes(len(buf)))
        with memoryview(buf) as view:
            n = handle.readinto(view[filled : filled + int(min(len(buf) - filled, left))]) if left else 0
        left -= n
        if not n:
            if filled:
                if buf[filled - 1] != _NEWLINE:
                    if filled == len(buf):
                        buf.append(_NEWLINE)
                    else:
                        buf[filled] = _NEWLINE
                    filled += 1
                yield buf, filled
            return
        filled += n
        cut = buf.rfind(b"\n", 0, filled) + 1
        if not cut:
            continue
        yield buf, cut
        rest = filled - cut
        if rest:
            buf[:rest] = buf[cut:filled]
        filled = rest


def _marker_lines(buf: bytearray, end: int, marker: bytes, regex: re.Pattern[bytes], marker_group: int
                  ) -> list[tuple[int, re.Match[bytes] | None]]:
    """(line start, match or None) of each line of buf[:end] holding the marker: the match of the whole
    line when it is in vLLM's exact layout with the marker where the layout puts it, else None."""
    out: list[tuple[int, re.Match[bytes] | None]] = []
    find, rfind, match = buf.find, buf.rfind, regex.match
    p = find(marker, 0, end)
    while p >= 0:
        ls = rfind(b"\n", 0, p) + 1
        m = match(buf, ls, end)
        if m is not None and m.start(marker_group) == p:
            out.append((ls, m))
            p = find(marker, m.end(), end)
        else:
            out.append((ls, None))
            p = find(marker, find(b"\n", p, end) + 1, end)
    return out


class _BlockScan:
    """The block reader: feeds a _Collector from a file's blocks, with the per-line reader's results."""

    def __init__(self, out: _Collector, year: int, *, commit_first: bool = True):
        self.out = out
        self.parser = _Parser(year)
        self.lines_before = 0  # lines in the blocks already read
        self.offset = 0  # bytes in the blocks already read
        self.line_starts = _LineStarts()
        # Where the scan starts the file, its first timestamped line steps the year (commit_first); a part
        # read elsewhere keeps that line's timestamp text for the reader of the whole file to commit.
        self.commit_first = commit_first
        self.first_text: str | None = None
        self.parser.first_read = not commit_first

    def block(self, buf: bytearray, end: int) -> None:
        n_lines, env_starts = self.line_starts(buf, end)
        parser = self.parser
        if self.first_text is None and (not parser.first_read or not self.commit_first):
            self._first_timestamp(buf, end)
        month = parser.timestamps.last_month
        spec_re, stats_re = _regexes(month, buf.find(b"\x1b", 0, end) >= 0)
        spec = _marker_lines(buf, end, _SPEC_MARKER, spec_re, _SPEC_GROUPS["marker"])
        stats = _marker_lines(buf, end, _STATS_MARKER, stats_re, _STATS_GROUPS["marker"])
        if not self.out.keep_records and self._regular(buf, spec, stats, env_starts) and self._sum_regular(spec, stats):
            for ls in env_starts:  # checked by _regular: none is broken
                self.out.add(self.parser.env_record(0, _line_text(buf, ls)))
        elif spec or stats or env_starts:
            events = [(ls, _SPEC, m) for ls, m in spec] + [(ls, _STATS, m) for ls, m in stats]
            events += [(ls, _ENV, None) for ls in env_starts]
            events.sort(key=_event_order)
            self._ordered(buf, events, month)
        if len(self.out.sums.pending) >= _FLUSH_ROWS:
            self.out.sums.flush()
        self.lines_before += n_lines
        self.offset += end

    # -- a block whose every candidate line is in vLLM's layout and this month (summaries only) -------------
    def _regular(self, buf: bytearray, spec: list[tuple[int, Any]], stats: list[tuple[int, Any]],
                 env_starts: list[int]) -> bool:
        if any(m is None for _, m in spec) or any(m is None for _, m in stats):
            return False
        env_record = self.parser.env_record
        # Env lines only count (the first gives the env) unless one is broken (broken lines keep their order)
        return not any(isinstance(env_record(0, _line_text(buf, ls)), BrokenLine) for ls in env_starts)

    def _sum_regular(self, spec: list[tuple[int, Any]], stats: list[tuple[int, Any]]) -> bool:
        """The block's SpecDecoding figures, in file order, to the sums; no timestamp steps the year (all are
        in the month already read). False, and nothing added, where a number does not convert."""
        if spec:
            g = _SPEC_GROUPS
            al_b, accepted_b, drafted_b, rates_b = zip(*[m.group(g["al"], g["accepted"], g["drafted"], g["rates"])
                                                         for _, m in spec], strict=True)
            try:
                al = list(map(float, al_b))
                rates = list(map(float, b", ".join(rates_b).split(b", ")))
            except ValueError:  # a number float() refuses ("1.2.3"): the block goes line by line
                return False
            rows = self.out.sums.pending
            rows.al += al
            rows.accepted += map(int, accepted_b)
            rows.drafted += map(int, drafted_b)
            rows.rates += rates
            rows.ks += [r.count(b", ") + 1 for r in rates_b]
        self.out.intervals += len(spec)
        self.out.stats_lines += len(stats)
        if stats:
            self.parser.last_engine = _stats_engine(stats[-1][1])
        return True

    # -- any block: every candidate line in file order ---------------------------------------------------
    def _ordered(self, buf: bytearray, events: list[tuple[int, int, Any]], month: int) -> None:
        out, parser = self.out, self.parser
        timestamps = parser.timestamps
        keep = out.keep_records
        count = buf.count
        pos, line_no = 0, self.lines_before + 1  # line_no of the line starting at pos
        n, j = len(events), 0
        while j < n:
            ls, kind, m = events[j]
            j += 1
            shared = j < n and events[j][0] == ls
            while j < n and events[j][0] == ls:  # markers of two kinds in one line: _Parser.record decides
                j += 1
            line_no += count(b"\n", pos, ls)
            pos = ls
            if kind == _ENV or shared:
                m = None
            elif m is not None and timestamps.last_month != month:  # a line before stepped the month
                m = _rematch(buf, ls, kind, timestamps.last_month)
            if m is None:
                self._slow(buf, ls, line_no)
                continue
            try:
                if kind == _SPEC:
                    _, _, al_b, atp, dtp, acc_b, drafted_b, rates_b, rate_b = m.groups()
                    values: tuple[Any, ...] = (float(al_b), int(acc_b), int(drafted_b),
                                               list(map(float, rates_b.split(b", "))))
                    if keep:
                        values += (float(atp), float(dtp), float(rate_b))
                elif keep:
                    _, _, _, _, prompt_tp, gen_tp, running, waiting, device, usage, hit = m.groups()
                    values = (float(prompt_tp), float(gen_tp), int(running), int(waiting), device.decode(),
                              float(usage) / 100.0, float(hit) / 100.0)
            except ValueError:  # a number float() refuses ("1.2.3"): _Parser.record reads it as it reads it
                self._slow(buf, ls, line_no)
                continue
            stamp_text = m.group(1).decode()
            stamp = timestamps(stamp_text)
            if stamp is not None:
                parser.first_read = True
            if kind == _SPEC:
                out.intervals += 1
                out.sums.add(*values[:4])
                if keep:
                    al, accepted, drafted, rates, atp_f, dtp_f, rate = values
                    out.spec.append(SpecDecodingInterval(
                        line_no, stamp, al, accepted, drafted, rates, atp_f, dtp_f,
                        None if math.isnan(rate) else rate / 100.0, stamp_text, parser.last_engine, {},
                    ))  # fmt: skip
            else:
                engine = _stats_engine(m)
                parser.last_engine = engine
                out.stats_lines += 1
                if keep:
                    prompt, gen, running_n, waiting_n, device_s, usage_f, hit_f = values
                    out.stats.append(EngineStatsInterval(
                        line_no, stamp, engine, prompt, gen, running_n, waiting_n, usage_f, hit_f, {}, stamp_text,
                        device_s, None,
                    ))  # fmt: skip

    def _slow(self, buf: bytearray, start: int, line_no: int) -> None:
        """One line through _Parser.record, as the per-line reader reads it."""
        record = self.parser.record(line_no, _line_text(buf, start))
        if not isinstance(record, UnknownLine):
            self.out.add(record)

    # -- first and last timestamp -------------------------------------------------------------------
    def _first_timestamp(self, buf: bytearray, end: int) -> None:
        """The first timestamped line's timestamp, if this block holds it: read (it steps the year too), or
        kept as text where the scan does not start the file."""
        timestamps = self.parser.timestamps
        for start, stop in _header_lines(buf, 0, end):
            if buf.startswith(_ENV_BYTES, start):
                continue
            text = _header_stamp(buf[start:stop].decode("utf-8", errors="replace").rstrip("\r"))
            if text is None or timestamps.peek(text) is None:
                continue
            self.first_text = text
            if self.commit_first:
                self.parser.first_read = True
                self.out.first = timestamps(text)
            return

    def last_text(self, handle: BinaryIO, start: int = 0) -> str | None:
        """The timestamp text of the last timestamped line (a date in the year reached), read backwards from
        the end of what was scanned down to `start` (the file offset the scan began at)."""
        chunk_size = 1 << 16
        end = start + self.offset
        carry = b""
        while end > start:
            begin = max(start, end - chunk_size)
            handle.seek(begin)
            chunk = handle.read(end - begin) + carry
            cut = chunk.find(b"\n") + 1 if begin > start else 0  # a partial first line waits for the next chunk
            if begin > start and not cut:
                carry, end = chunk, begin
                continue
            lines = bytearray(chunk[cut:])
            for ls, le in reversed(list(_header_lines(lines, 0, len(lines)))):
                if lines.startswith(_ENV_BYTES, ls):
                    continue
                text = _header_stamp(lines[ls:le].decode("utf-8", errors="replace").rstrip("\r"))
                if text is not None and self.parser.timestamps.peek(text) is not None:
                    return text
            carry, end = chunk[:cut], begin
        return None


class _LineStarts:
    """Counts a block's lines and finds the lines that begin with "Env:", with numpy, in scratch arrays
    reused from block to block (fresh ones would cost the scan more than the comparisons do)."""

    def __init__(self) -> None:
        import numpy as np

        self.np = np
        self.newline = np.empty(0, dtype=bool)
        self.env_first = np.empty(0, dtype=bool)

    def __call__(self, buf: bytearray, end: int) -> tuple[int, list[int]]:
        """Lines in buf[:end] (whole lines), and the start of each line that begins with "Env:"."""
        np = self.np
        if len(self.newline) < end:
            self.newline = np.empty(end, dtype=bool)
            self.env_first = np.empty(end, dtype=bool)
        arr = np.frombuffer(buf, dtype=np.uint8, count=end)
        newline = np.equal(arr, _NEWLINE, out=self.newline[:end])
        n_lines = int(np.count_nonzero(newline))
        env_starts = [0] if buf.startswith(_ENV_BYTES, 0, end) else []
        # after_newline[i]: the byte after a newline at i is an "E" (a line starting with "E" begins at i + 1)
        after_newline = np.equal(arr[1:], _ENV_FIRST, out=self.env_first[: end - 1])
        np.logical_and(after_newline, newline[:-1], out=after_newline)
        pos, last = 0, end - 1
        while pos < last:  # argmax: the first True from pos (few: lines starting with "E" are rare)
            i = pos + int(after_newline[pos:last].argmax())
            if not after_newline[i]:
                break
            if buf.startswith(_ENV_BYTES, i + 1, end):
                env_starts.append(i + 1)
            pos = i + 1
        return n_lines, env_starts


def _rematch(buf: bytearray, start: int, kind: int, month: int) -> re.Match[bytes] | None:
    """The line at start against the regex of this month (a line before it stepped the month)."""
    m = _regexes(month)[kind].match(buf, start)
    marker, group = (_SPEC_MARKER, _SPEC_GROUPS["marker"]) if kind == _SPEC else (_STATS_MARKER, _STATS_GROUPS["marker"])
    return m if m is not None and buf.find(marker, start) == m.start(group) else None


def _line_text(buf: bytearray, start: int) -> str:
    return buf[start : buf.find(b"\n", start)].decode("utf-8", errors="replace")


def _stats_engine(m: re.Match[bytes]) -> str:
    index, count = m.group(_STATS_GROUPS["index"], _STATS_GROUPS["count"])
    return index.decode() if index is not None else f"aggregated:{count.decode()}"


def _event_order(event: tuple[int, int, Any]) -> tuple[int, int]:
    return event[0], event[1]


def _header_lines(buf: bytearray, start: int, end: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each line in buf[start:end] (whole lines) that holds a header word, in order."""
    nxt = {w: buf.find(w, start, end) for w in _HEADER_WORDS}
    while True:
        live = [p for p in nxt.values() if p >= 0]
        if not live:
            return
        p = min(live)
        ls = max(buf.rfind(b"\n", start, p) + 1, start)
        le = buf.find(b"\n", p, end)
        le = end if le < 0 else le
        yield ls, le
        for w, q in nxt.items():
            if 0 <= q <= le:
                nxt[w] = buf.find(w, le, end)


def _scan_file(source: str | Path, *, year: int | None, keep_records: bool, keep_broken: int,
               block_size: int | None = None) -> _Collector:
    path, handle, default_year = _open(source)
    out = _Collector(str(path), keep_records=keep_records, keep_broken=keep_broken)
    scan = _BlockScan(out, year or default_year)
    try:
        with handle:
            for buf, end in _read_blocks(handle, block_size or BLOCK_SIZE):
                scan.block(buf, end)
            out.total_lines = scan.lines_before
            last = scan.last_text(handle) if out.first is not None else None
            out.last = scan.parser.timestamps.peek(last) if last is not None else None
    except OSError as exc:
        raise IngestError(f"cannot read log file {path}: {exc.strerror or exc}") from exc
    return out


# --- one summary read by several processes --------------------------------------------------------------

PARALLEL_MIN_BYTES = 64 << 20  # smaller logs are read in one process (starting others costs more)
MAX_PROCESSES = 4


@dataclass(slots=True)
class _Part:
    """What one process read of a byte range of a log (whole lines): its counts, and its timestamps as text and
    months, for the reader of the whole file to put in order."""

    lines: int
    intervals: int
    stats_lines: int
    env_lines: int
    broken_lines: int
    broken: list[BrokenLine]  # line numbers counted from the range's first line
    env: dict[str, str] | None
    sums: _CountSums
    first_text: str | None
    last_text: str | None
    months: list[int]
    leap_day: bool


def _scan_range(path: str, start: int, stop: int, year: int, keep_broken: int, block_size: int) -> _Part:
    out = _Collector(path, keep_records=False, keep_broken=keep_broken)
    scan = _BlockScan(out, year, commit_first=False)
    with open(path, "rb") as handle:
        handle.seek(start)
        for buf, end in _read_blocks(handle, block_size, limit=stop - start):
            scan.block(buf, end)
        last = scan.last_text(handle, start)
    out.sums.flush()
    timestamps = scan.parser.timestamps
    return _Part(scan.lines_before, out.intervals, out.stats_lines, out.env_lines, out.broken_lines, out.broken,
                 out.env, out.sums, scan.first_text, last, timestamps.months, timestamps.leap_day)


def _ranges(path: Path, size: int, parts: int) -> list[tuple[int, int]]:
    """Byte ranges of about equal size, each starting a line."""
    starts = [0]
    with path.open("rb") as handle:
        for i in range(1, parts):
            handle.seek(max(size * i // parts, starts[-1]))
            handle.readline()  # to the end of the line the cut falls in
            if handle.tell() >= size:
                break
            if handle.tell() > starts[-1]:
                starts.append(handle.tell())
    return list(zip(starts, [*starts[1:], size], strict=True))


def _processes(size: int) -> int:
    """How many processes to read a log of this size with: one for small logs, where fork is missing, or where
    this process runs threads (forking them is unsafe); else one per CPU this process may use, up to 4."""
    import multiprocessing
    import os
    import threading

    if size < PARALLEL_MIN_BYTES or threading.active_count() > 1:
        return 1
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_PROCESSES))


def _summarise_parallel(path: Path, year: int, keep_broken: int, processes: int, block_size: int) -> _Collector | None:
    """A summary read by `processes` processes, one byte range each, put together exactly as one reader would
    have read it: counts added, line numbers shifted, sums exact (_CountSums), and the year stepped by
    replaying, in order, the months each part read. None where a part read a 02-29 (valid or not depending on
    the year the part could not know): the caller then reads the file in one process."""
    import multiprocessing

    size = path.stat().st_size
    ranges = _ranges(path, size, processes)
    if len(ranges) < 2:
        return None
    args = [(str(path), start, stop, year, keep_broken, block_size) for start, stop in ranges]
    try:
        with multiprocessing.get_context("fork").Pool(len(ranges) - 1) as pool:
            pending = [pool.apply_async(_scan_range, a) for a in args[1:]]
            parts = [_scan_range(*args[0]), *(p.get() for p in pending)]
    except OSError as exc:
        raise IngestError(f"cannot read log file {path}: {exc.strerror or exc}") from exc
    if any(part.leap_day for part in parts):
        return None
    out = _Collector(str(path), keep_records=False, keep_broken=keep_broken)
    timestamps = _Timestamps(year)
    last_text = None
    for part in parts:
        for broken in part.broken:
            if len(out.broken) < keep_broken:
                out.broken.append(dataclasses.replace(broken, line_no=broken.line_no + out.total_lines))
        out.total_lines += part.lines
        out.intervals += part.intervals
        out.stats_lines += part.stats_lines
        out.env_lines += part.env_lines
        out.broken_lines += part.broken_lines
        if out.env is None:
            out.env = part.env
        out.sums.merge(part.sums)
        if out.first is None and part.first_text is not None:  # the file's first timestamped line
            out.first = timestamps(part.first_text)
        for month in part.months:
            timestamps.replay(month)
        last_text = part.last_text or last_text
    out.last = timestamps.peek(last_text) if last_text is not None and out.first is not None else None
    return out


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
