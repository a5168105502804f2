"""SGLang server logs (sglang 0.5.15.post1): its decode-batch lines, what a log adds up to, and its signatures.

SGLang's scheduler writes, every `--decode-log-interval` decode iterations (default 40), one line
(srt/managers/scheduler_components/metrics_reporter.py, one GPU: no " TP0" in the bracket):

    [2026-12-06 16:40:00] Decode batch, #running-req: 4, #token: 1210, token usage: 0.01, accept len: 3.21, accept rate: 0.55, cuda graph: True, gen throughput (token/s): 812.40, #queue-req: 0

`accept len` and `accept rate` appear only with speculative decoding. `accept len` is AL as the acceptance model
defines it (1 + accepted drafts per request per verify step, the bonus token counted), over the iterations since
the previous line, printed to two decimals; the number of verify steps it averages over is not printed. So a
line's AL cannot be weighted against another's: the log gives a per-interval AL and load (running, waiting, KV
usage), and the acceptance counts come from the server's counters (specbook.engines.sglang.metrics), as for
llama.cpp's per-request lines. Prefill lines (`Prefill batch, #new-seq: ...`) carry no acceptance figures.
Timestamps are the scheduler's local time without a zone (asctime), read as UTC (the hosts specbook runs on).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbook.core.acceptance import Acceptance
from specbook.engines.common import LogScan

if TYPE_CHECKING:
    import pandas as pd

SOURCE = "sglang log"
DECODE_MARKER = "Decode batch"
NO_COUNTS = (
    "SGLang's log prints AL per decode-log interval ('accept len', two decimals) without the verify steps it "
    "averages over, so its intervals cannot be summed into counts: drafts, accepted tokens and AL come from its "
    "/metrics counters (sglang:spec_verify_calls_total, generation_tokens_total, num_requests_total); the log's "
    "figures stay raw (log_mean_len: the intervals' printed AL, averaged unweighted)"
)

_NUM = r"\d+(?:\.\d+)?"
_STAMP = r"^\[(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d{3})?(?: [^\]]*)?\] "
DECODE_LINE = re.compile(
    _STAMP + r"Decode batch(?: \[\d+\])?, #running-req: (?P<running>\d+), #token: (?P<tokens>\d+), "
    rf"token usage: (?P<usage>{_NUM}), (?:accept len: (?P<al>{_NUM}), accept rate: (?P<rate>{_NUM}), )?"
    rf"cuda graph: (?P<graph>True|False), gen throughput \(token/s\): (?P<gen>{_NUM}), #queue-req: (?P<queue>\d+)"
)
_PREFIX = re.compile(_STAMP)

# Signatures of SGLang's log lines (searched in each of a file's first lines; see specbook.ingest).
LOG_SIGNATURES: list[re.Pattern[str]] = [
    re.compile(r"\b(?:Prefill|Decode) batch(?: \[\d+\])?, #"),
    re.compile(r"server_args=ServerArgs\(|sglang::|The server is fired up and ready to roll|KV Cache is allocated"),
    re.compile(r"Load weight (?:begin|end)\. |Capture (?:target|draft) \w+ CUDA graph"),
]

COLUMNS = ["line_no", "timestamp", "running", "waiting", "tokens", "kv_cache_usage", "printed_al", "printed_rate",
           "cuda_graph", "generation_throughput"]


def detect_log(lines: Iterable[str]) -> int:
    """How many of these lines carry an SGLang signature."""
    return sum(1 for line in lines if any(p.search(line) for p in LOG_SIGNATURES))


def _stamp(text: str) -> datetime | None:
    try:
        return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def read_decode_line(line: str) -> dict[str, Any] | None:
    """One decode-batch line's figures as printed (None for any other line)."""
    m = DECODE_LINE.search(line)
    if m is None:
        return None
    return {
        "timestamp": _stamp(m["stamp"]), "running": int(m["running"]), "waiting": int(m["queue"]),
        "tokens": int(m["tokens"]), "kv_cache_usage": float(m["usage"]),
        "printed_al": float(m["al"]) if m["al"] is not None else None,
        "printed_rate": float(m["rate"]) if m["rate"] is not None else None,
        "cuda_graph": m["graph"] == "True", "generation_throughput": float(m["gen"]),
    }  # fmt: skip


def decode_lines_frame(lines: Iterable[str]) -> pd.DataFrame:
    """One row per decode-batch line: its time, load (running, waiting, KV usage as a fraction), the printed AL
    and acceptance rate (None without speculation) and generation throughput, with its line number."""
    import pandas as pd

    rows = []
    for line_no, line in enumerate(lines, start=1):
        if DECODE_MARKER not in line:
            continue
        row = read_decode_line(line)
        if row is not None:
            rows.append({"line_no": line_no, **row})
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame["timestamp"] = pd.to_datetime(frame["timestamp"], utc=True)
    for col in ("printed_al", "printed_rate"):
        frame[col] = frame[col].astype(float)
    return frame


@dataclass(slots=True)
class DecodeLogSummary:
    """A whole SGLang log: its decode lines, the printed AL of those that carry one, and what else its lines are."""

    path: str
    env: dict[str, str] | None
    decode_lines: int
    printed_al: list[float]
    total_lines: int
    unknown_lines: int
    broken_lines: int
    first_timestamp: str | None
    last_timestamp: str | None


def summarise_log(path: str | Path) -> DecodeLogSummary:
    """Read an SGLang log line by line: the Env line, the decode-batch lines (one holding "Decode batch, " that
    does not read is broken), every other line unknown."""
    scan = LogScan(path)
    decode = 0
    als: list[float] = []
    first = last = None
    for line in scan.marked(DECODE_MARKER):
        row = read_decode_line(line)
        if row is None:
            scan.broken += 1
            continue
        decode += 1
        stamp = _PREFIX.match(line)
        if stamp:
            first = first or stamp["stamp"]
            last = stamp["stamp"]
        if row["printed_al"] is not None:
            als.append(row["printed_al"])
    return DecodeLogSummary(str(scan.path), scan.env, decode, als, scan.total, scan.unknown(decode), scan.broken,
                            first, last)


def ingest_summary(path: str | Path) -> dict[str, Any]:
    """What `specbook ingest` reports for an SGLang log (specbook.ingest.IngestResult's fields): no counts (the
    log prints none), the number of decode lines, and the note saying where counts come from."""
    s = summarise_log(path)
    return {
        "acceptance": Acceptance.from_counts(SOURCE, None, 0, 0), "records": s.decode_lines,
        "record_kind": "interval", "k": None, "env": s.env, "stats_lines": s.decode_lines,
        "total_lines": s.total_lines, "unknown_lines": s.unknown_lines, "broken_lines": s.broken_lines,
        "first_timestamp": s.first_timestamp.replace(" ", "T") if s.first_timestamp else None,
        "last_timestamp": s.last_timestamp.replace(" ", "T") if s.last_timestamp else None,
        "printed_al_mean": sum(s.printed_al) / len(s.printed_al) if s.printed_al else None,
        "note": NO_COUNTS,
    }  # fmt: skip
