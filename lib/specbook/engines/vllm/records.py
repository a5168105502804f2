"""What a vLLM log's lines are read into: one record per line, and what a whole log adds up to.

`ParsedLog` keeps every record, `LogSummary` only the sums; `Collector` is where both readers (the per-line
one of lineparser, the block reader of blockscan) put what they read, so both give one result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from specbook.core.acceptance import Acceptance
from specbook.engines.vllm.counts import CountSums, recover_drafts


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
        """Accepted tokens at positions 1..k (index 0 is position 1), see IntervalRows.counts."""
        return list(self.acceptance().accepted_per_position)

    def acceptance(self) -> Acceptance:
        """This interval's counts through the acceptance model."""
        sums = CountSums()
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

    def _sums(self) -> CountSums:
        sums = CountSums()
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


class Collector:
    """Where both readers put what they read: records (ParsedLog) or only sums (LogSummary)."""

    def __init__(self, path: str | None, keep_records: bool, keep_broken: int):
        self.path = path
        self.keep_records = keep_records
        self.keep_broken = keep_broken
        self.env: dict[str, str] | None = None
        self.spec: list[SpecDecodingInterval] = []
        self.stats: list[EngineStatsInterval] = []
        self.sums = CountSums()
        self.intervals = self.stats_lines = self.env_lines = self.broken_lines = 0
        self.broken: list[BrokenLine] = []
        self.total_lines = 0
        self.first: datetime | None = None
        self.last: datetime | None = None

    def add(self, record: LogRecord) -> None:
        """A record from LineParser.record (UnknownLine is counted from the totals, not here)."""
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
