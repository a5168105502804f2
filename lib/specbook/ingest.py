"""`specbook ingest FILE... --json`: one summary per server log, the engine detected from its content."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable
from datetime import datetime
from itertools import islice
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from specbook.engines.vllm import logparse
from specbook.errors import IngestError

# How many leading lines the engine detector reads (startup banners come first).
_DETECT_LINES = 2000

# Signatures of each engine's log lines; the engine with most hits in the head of the file wins.
ENGINE_SIGNATURES: dict[str, list[re.Pattern[str]]] = {
    "vllm": [
        re.compile(r"\((?:APIServer|EngineCore[^ ]*) pid=\d+\)"),
        re.compile(r"(?:INFO|WARNING|DEBUG|ERROR) \d\d-\d\d \d\d:\d\d:\d\d \[[\w./-]+\.py:\d+\]"),
        re.compile(r"vllm|vLLM"),
        re.compile(r"SpecDecoding metrics: |Engine \d{3}: Avg prompt throughput"),
    ],
    "llama.cpp": [
        re.compile(r"llama_model_loader|llama_context|ggml_|srv +update_slots|slot +\w+: id"),
    ],
    "sglang": [
        re.compile(r"sglang|\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: TP\d+)?\] (?:Decode|Prefill) batch"),
    ],
}


def _summarise_vllm(path: Path) -> dict[str, Any]:
    parsed = logparse.parse_log(path)
    return _vllm_summary(parsed)


# Engine name -> summariser; only engines whose log format specbook reads are here.
SUMMARISERS: dict[str, Callable[[Path], dict[str, Any]]] = {"vllm": _summarise_vllm}


class IngestResult(BaseModel):
    """What `specbook ingest --json` prints per log (NaN written as null)."""

    file: str
    engine: str
    intervals: int
    accepted_tokens: int
    drafted_tokens: int
    drafts: int
    num_speculative_tokens: int | None
    mean_acceptance_length: float | None  # whole-file, weighted by drafts
    per_position_acceptance: list[float | None]  # weighted by each interval's drafts
    draft_acceptance_rate: float | None
    env: dict[str, str] | None
    engine_stats_intervals: int
    total_lines: int
    unknown_lines: int
    broken_lines: int
    first_timestamp: datetime | None
    last_timestamp: datetime | None


def _finite(value: float | None) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _vllm_summary(parsed: logparse.ParsedLog) -> dict[str, Any]:
    return {
        "intervals": len(parsed.spec_decoding),
        "accepted_tokens": parsed.accepted_tokens,
        "drafted_tokens": parsed.drafted_tokens,
        "drafts": parsed.num_drafts,
        "num_speculative_tokens": parsed.num_speculative_tokens,
        "mean_acceptance_length": parsed.acceptance_length(),
        "per_position_acceptance": [_finite(p) for p in parsed.per_position_acceptance()],
        "draft_acceptance_rate": parsed.draft_acceptance_rate(),
        "env": parsed.env,
        "engine_stats_intervals": len(parsed.engine_stats),
        "total_lines": parsed.total_lines,
        "unknown_lines": parsed.unknown_lines,
        "broken_lines": parsed.broken_lines,
        "first_timestamp": parsed.first_timestamp,
        "last_timestamp": parsed.last_timestamp,
    }


def detect_engine(lines: Iterable[str]) -> str | None:
    """The engine whose signatures match most of the given lines; None when none matches."""
    hits = dict.fromkeys(ENGINE_SIGNATURES, 0)
    for line in lines:
        for engine, patterns in ENGINE_SIGNATURES.items():
            if any(p.search(line) for p in patterns):
                hits[engine] += 1
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
    """Summary of one server log; IngestError naming the file when it is missing, unreadable or of no known engine."""
    path = Path(path)
    _check_readable(path)
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            engine = detect_engine(islice(handle, _DETECT_LINES))
    except OSError as exc:
        raise IngestError(f"cannot read log file {path}: {exc.strerror or exc}") from exc
    if engine is None:
        raise IngestError(
            f"log file {path}: no line looks like a known engine's log ({', '.join(ENGINE_SIGNATURES)})"
        )
    summarise = SUMMARISERS.get(engine)
    if summarise is None:
        raise IngestError(
            f"log file {path} looks like a {engine} log; specbook reads only {', '.join(SUMMARISERS)} logs so far"
        )
    result = IngestResult(file=str(path), engine=engine, **summarise(path))
    return result.model_dump(mode="json")


def ingest_files(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """ingest_file for each path, in order; every path is checked before any is parsed."""
    paths = [Path(p) for p in paths]
    for path in paths:
        _check_readable(path)
    return [ingest_file(p) for p in paths]
