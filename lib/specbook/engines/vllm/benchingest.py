"""`vllm bench serve` outputs as `specbook ingest` records: a --save-result JSON file (detected by its content
before any log detector runs) or a `vllm bench sweep serve` output folder (its run=N.json files); each
measured run becomes one BenchIngestResult, its counts through the same acceptance model as a log's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from specbook.core.acceptance import DEFINITION
from specbook.engines.ingestfields import PositionCount, acceptance_fields, finite
from specbook.engines.vllm.benchresult import (
    SOURCE,
    BenchRun,
    detect_result,
    is_sweep_folder,
    read_result_file,
    read_sweep_folder,
)

ENGINE = "vllm"


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


def bench_run_result(run: BenchRun, note: str | None = None) -> dict[str, Any]:
    """BenchIngestResult of one vLLM benchmark run, as JSON-ready data."""
    acc = run.acceptance()
    if acc is None:
        fields: dict[str, Any] = {"source": SOURCE, "drafts": None, "draft_tokens": None,
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
        file=str(run.file), engine=ENGINE, record_kind="bench run", combination=run.combination,
        run_number=_int(run.number("run_number")), k=k, vllm_al=finite(run.number("spec_decode_acceptance_length")),
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


def read_bench_output(path: Path) -> list[dict[str, Any]]:
    """The records of a bench result file (one per run it holds) or a sweep folder (one per run=N.json)."""
    if path.is_dir():
        sweep = read_sweep_folder(path)
        note = (f"this sweep folder also holds {len(sweep.failures)} failed run(s): "
                f"{', '.join(str(p.relative_to(path)) for p in sweep.failures)}") if sweep.failures else None
        return [bench_run_result(run, note) for run in sweep.runs]
    return [bench_run_result(run) for run in read_result_file(path)]


class VllmBenchReader:
    """The bench-output capability of the vLLM adapter (specbook.engines.base.BenchReader)."""

    def reads_folder(self, path: Path) -> bool:
        return is_sweep_folder(path)

    def detects(self, head: str) -> bool:
        return detect_result(head)

    def read(self, path: Path) -> list[dict[str, Any]]:
        return read_bench_output(Path(path))
