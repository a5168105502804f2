"""The shapes of vLLM's log lines: markers, the logging header, fields, and the exact layouts vLLM writes.

vLLM (0.26 CUDA, 0.32 CPU) writes, every VLLM_LOG_STATS_INTERVAL seconds while busy, one stats line
per engine (or one `N Engines Aggregated:` line) followed by one `SpecDecoding metrics:` line, both
as `Key: value` fields joined by ", " (vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py).

The text regexes are what the per-line parser (lineparser) reads any line with; the bytes regexes of
`layout_regexes` match only whole lines in the exact layout vLLM writes, for the block reader (blockscan),
and read every field as the per-line parser reads it. Both are here so that they change together.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

SPEC_DECODING_PREFIX = "SpecDecoding metrics: "
STATS_MARKER = "Avg prompt throughput:"  # every stats line's fields start with it

# Line kinds, in the order the block reader handles two markers found in one line; SPEC_LINE and STATS_LINE
# also index the pair layout_regexes returns.
SPEC_LINE, STATS_LINE, ENV_LINE, CANDIDATE_LINE, OTHER_LINE = 0, 1, 2, 3, 4

# --- text: any line, as the per-line parser reads it -------------------------------------------------------

# vLLM's text format: "[VLLM_LOGGING_PREFIX](<process> pid=<pid>) LEVEL MM-DD HH:MM:SS [file.py:123] message".
HEADER_RE = re.compile(
    r"(?:\((?P<process>[^()]*?) pid=(?P<pid>\d+)\)\s+)?"
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+"
    r"(?P<stamp>\d{2}-\d{2} \d{2}:\d{2}:\d{2})\s+"
    r"\[(?P<source>[^\]]+)\]\s?(?P<message>.*)$"
)
# The color formatter (tty or VLLM_LOGGING_COLOR=1) wraps header parts in ANSI codes.
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
STATS_RE = re.compile(
    r"^(?:Engine (?P<index>\d+)|(?P<count>\d+) Engines Aggregated): (?P<body>Avg prompt throughput:.*)$"
)
# Fields are "Key: value" joined by ", "; a value may itself hold ", " (per-position rates, KV fetch)
# but never ", " followed by a capitalised "Key: ", so split only there.
FIELD_SPLIT_RE = re.compile(r", (?=[A-Z][A-Za-z0-9 ()/_.-]*: )")
NUMBER_RE = re.compile(r"^\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+|nan|inf)(?:[eE][-+]?\d+)?)")
MAX_COUNT = 2**53  # counts are read below it (exact as floats); the layout regexes read 15 digits (_I)


def header_stamp(line: str) -> str | None:
    """The timestamp text of a line's vLLM header, None when it has none (reads no year, commits nothing)."""
    if "[" not in line:
        return None
    if "\x1b" in line:
        line = ANSI_RE.sub("", line)
    match = HEADER_RE.search(line)
    return match.group("stamp") if match else None


# --- bytes: whole lines in the exact layout vLLM writes, for the block reader ------------------------------

# A number as the per-line parser's _number reads it: float() of a match is what _number reads wherever
# float() accepts it (a value such as "1.2.3", which float() refuses, sends the line to LineParser.record);
# as a field's whole value it is valid for _number, _percent_fraction.
_N = rb"\d[\d.]*"
_I = rb"\d{1,15}"  # an integer below MAX_COUNT: int() of it is what _integer reads
# Groups of the two layout regexes.
SPEC_GROUPS = {"stamp": 1, "marker": 2, "al": 3, "accepted": 6, "drafted": 7, "rates": 8}
STATS_GROUPS = {"stamp": 1, "index": 2, "count": 3, "marker": 4}


def _line_regexes(month: int, colour: bool) -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
    """Whole SpecDecoding and stats lines in the exact layout vLLM writes (the format strings of
    vllm/v1/spec_decode/metrics.py and vllm/v1/metrics/loggers.py behind its formatter's header: one space
    between parts, a process name without spaces, colour codes only around the header's parts, as its
    ColoredFormatter puts them, where `colour`) with a timestamp in this month. Where one matches, the line without its
    colour codes is what HEADER_RE.search splits the same way, and every field reads as LineParser.record
    reads it; every other line holding a marker goes through LineParser.record itself."""
    c = rb"(?:\x1b\[[0-9;]*m)*" if colour else b""  # colour codes (VLLM_LOGGING_COLOR), which LineParser.record strips
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


def layout_regexes(month: int, colour: bool = True) -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
    """(SpecDecoding, stats) regexes of _line_regexes, compiled once; without colour codes they run faster
    (a block without ESC)."""
    key = (month, colour)
    if key not in _REGEXES:
        _REGEXES[key] = _line_regexes(month, colour)
    return _REGEXES[key]


# --- engine detection --------------------------------------------------------------------------------------

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
