"""llama-server's log lines: the per-request draft statistics (what its log says of acceptance).

    slot print_timing: id  0 | task 0 | draft acceptance = 0.58621 (   17 accepted /    29 generated), mean len =  2.21

One line per finished request with speculation (tools/server/server-context.cpp, print_timings:
"draft acceptance = %0.5f (%5d accepted / %5d generated), mean len = %5.2f", printed only when the
request drafted tokens). "draft acceptance" is the acceptance rate (accepted / drafted tokens); "mean len"
is 1 + accepted / n_draft_verif_steps, AL as the acceptance model defines it, printed to two decimals.
The draft count itself is not printed: it could be recovered from "mean len" only approximately, and not
at all for a request with 0 accepted tokens (mean len 1.00 then fits any count). So the log's figures
summed give draft and accepted tokens and the acceptance rate; drafts, AL and per-position counts come
from the server's counters (/metrics, llamacpp:spec_decode_num_drafts_total), and each request's printed
mean len stays a raw figure (draft_lines_frame's printed_al).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbook.core.acceptance import Acceptance
from specbook.engines.common import LogScan

if TYPE_CHECKING:
    import pandas as pd

SOURCE = "llamacpp log"
DRAFT_MARKER = "draft acceptance = "
NO_DRAFT_COUNT = (
    "llama-server's log prints no draft count (its per-request 'mean len' is AL to two decimals): drafts, AL "
    "and per-position counts come from its /metrics counters (llamacpp:spec_decode_num_drafts_total)"
)

# A decimal as "%f" prints it (float() reads every match) and a count int() reads (far below its 4300 digits).
_DECIMAL, _COUNT = r"\d+(?:\.\d+)?", r"\d{1,15}"
_DRAFT_LINE = re.compile(
    rf"draft acceptance = (?P<rate>{_DECIMAL}) \(\s*(?P<accepted>{_COUNT}) accepted /\s*(?P<generated>{_COUNT}) generated\)"
    rf"(?:, mean len =\s*(?P<mean_len>{_DECIMAL}))?"
)

# The last line llama-server writes of a request, after its timings and draft statistics (server_slot::release):
#     slot      release: id  1 | task 0 | stop processing: n_tokens = 169, truncated = 0
_RELEASE_LINE = re.compile(r"\bslot +release: id +\d+ \| task +-?\d+ \| stop processing:")


def requests_ended(text: str) -> int:
    """How many requests this stretch of the log shows released (their statistics lines written before)."""
    return len(_RELEASE_LINE.findall(text))


# Signatures of llama-server's log lines (searched in each of a file's first lines; see specbook.ingest).
LOG_SIGNATURES: list[re.Pattern[str]] = [
    re.compile(r"llama_model_loader|llama_context|llama_server|ggml_|common_params|common_speculative"),
    re.compile(r"\bsrv +\w+: |\bslot +\w+: id +-?\d+ \| task"),
    # its timestamp: minutes.seconds.milliseconds.microseconds since start, then the level letter
    re.compile(r"^\d+\.\d\d\.\d\d\d\.\d\d\d [IWEDT] "),
]


def detect_log(lines: Iterable[str]) -> int:
    """How many of these lines carry a llama-server signature."""
    return sum(1 for line in lines if any(p.search(line) for p in LOG_SIGNATURES))


def parse_draft_lines(text: str) -> list[dict[str, float]]:
    """llama-server's per-request draft statistics lines, raw figures as printed."""
    out = []
    for m in _DRAFT_LINE.finditer(text):
        row = {"rate": float(m["rate"]), "accepted": float(m["accepted"]), "generated": float(m["generated"])}
        if m["mean_len"] is not None:
            row["mean_len"] = float(m["mean_len"])
        out.append(row)
    return out


def draft_lines_frame(lines: Iterable[str]) -> pd.DataFrame:
    """One row per draft statistics line: accepted and drafted tokens (acceptance-model names), the printed
    rate and mean len, and the line number."""
    import pandas as pd

    rows = []
    for line_no, line in enumerate(lines, start=1):
        if "draft acceptance" not in line:
            continue
        for m in _DRAFT_LINE.finditer(line):
            rows.append({"line_no": line_no, "accepted_tokens": int(m["accepted"]), "draft_tokens": int(m["generated"]),
                         "printed_rate": float(m["rate"]),
                         "printed_al": float(m["mean_len"]) if m["mean_len"] is not None else None})
    return pd.DataFrame(rows, columns=["line_no", "accepted_tokens", "draft_tokens", "printed_rate", "printed_al"])


@dataclass(slots=True)
class DraftLogSummary:
    """A whole llama-server log: its draft lines summed, and what else its lines are."""

    path: str
    env: dict[str, str] | None
    acceptance: Acceptance  # drafts None: the log prints no draft count
    requests: int  # draft statistics lines (finished requests that drafted)
    total_lines: int
    unknown_lines: int
    broken_lines: int
    printed_mean_len: list[float] = field(default_factory=list)  # raw, per request, as printed


def summarise_log(path: str | Path) -> DraftLogSummary:
    """Read a llama-server log line by line (split on "\\n"): the Env line, the draft statistics lines (a
    line holding "draft acceptance = " that does not read is broken), every other line unknown."""
    scan = LogScan(path)
    accepted = drafted = requests = 0
    mean_lens: list[float] = []
    for line in scan.marked(DRAFT_MARKER):
        m = _DRAFT_LINE.search(line)
        if m is None:
            scan.broken += 1
            continue
        requests += 1
        accepted += int(m["accepted"])
        drafted += int(m["generated"])
        if m["mean_len"] is not None:
            mean_lens.append(float(m["mean_len"]))
    acceptance = Acceptance.from_counts(SOURCE, None, drafted, accepted)
    return DraftLogSummary(str(scan.path), scan.env, acceptance, requests, scan.total, scan.unknown(requests),
                           scan.broken, mean_lens)


def ingest_summary(path: str | Path) -> dict[str, Any]:
    """What `specbook ingest` reports for a llama-server log (specbook.ingest.IngestResult's fields, the
    acceptance counts as an Acceptance with no draft count)."""
    s = summarise_log(path)
    return {
        "acceptance": s.acceptance, "records": s.requests, "record_kind": "request", "k": None, "env": s.env,
        "stats_lines": None, "total_lines": s.total_lines, "unknown_lines": s.unknown_lines,
        "broken_lines": s.broken_lines, "first_timestamp": None, "last_timestamp": None,
        "note": NO_DRAFT_COUNT if s.requests else None,
    }  # fmt: skip
