"""The proposal-trace record schema, one record per request per draft step, whatever engine wrote it.

    request_id  the engine's id of the request (vLLM: its internal id, the response id + a suffix;
                llama.cpp: the slot task id)
    anchor_pos  tokens already in the sequence when the draft was proposed, the anchor token included
                (prompt + output so far); proposed[j] drafts the token at 0-based position anchor_pos + j
    anchor_id   the last token of that sequence (the one the draft continues), None where unknown
    proposed    the k draft ids, greedy (llama.cpp: candidate 0 of each draft position)
    engine_accepted  what the engine itself reported it accepted of this draft, where it says so (llama.cpp)

The vLLM plugin writes them as JSON lines (engines/vllm/trace_plugin.py), the llama.cpp parser makes
them from debug log lines (engines/llamacpp/traceparse.py); `read_trace_dir` reads a plugin folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specbook.core.errors import SpecbookError

SCHEMA = 1
COLUMNS = ["request_id", "step", "anchor_pos", "anchor_id", "proposed", "engine_accepted", "prompt_len"]


class TraceError(SpecbookError):
    """A proposal trace that cannot be read or does not fit the run it belongs to."""


class ProposalRecord(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    schema_: int = Field(SCHEMA, alias="schema")
    engine: str
    request_id: str
    anchor_pos: int = Field(ge=0)
    anchor_id: int | None = None
    proposed: tuple[int, ...]
    prompt_len: int | None = None
    engine_accepted: int | None = None


@dataclass
class RequestTrace:
    """One request of a trace pass: its ids (prompt and emitted) and the engine's id for it. `eog_stop`: it
    stopped on an end-of-generation token at which the engine's verifier ends a draft step (llama.cpp's
    rule, specbook.traces.derive); the engine's reader sets it."""

    prompt_id: str
    request_id: str
    prompt_ids: list[int] | None
    prompt_len: int
    output_ids: list[int]
    finish_reason: str | None = None
    eog_stop: bool = False


@dataclass
class TraceReading:
    """What an engine's proposal tracer read of one pass: the proposal records, each request's ids, and what
    a reader of the traces must know of how they were read (`notes`)."""

    records: list[ProposalRecord]
    requests: list[RequestTrace]
    notes: list[str] = field(default_factory=list)


def read_trace_file(path: str | Path) -> list[ProposalRecord]:
    """The records of one JSONL file; TraceError naming the file and line for a malformed one."""
    path = Path(path)
    out = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = ProposalRecord.model_validate(json.loads(line))
            except (ValueError, ValidationError) as exc:
                raise TraceError(f"{path}:{n}: not a proposal record ({str(exc).splitlines()[0]})") from None
            if rec.schema_ != SCHEMA:
                raise TraceError(f"{path}:{n}: record schema {rec.schema_}, this specbook reads {SCHEMA}")
            out.append(rec)
    return out


def read_trace_dir(folder: str | Path) -> tuple[list[ProposalRecord], list[dict[str, Any]]]:
    """All records of a plugin folder (one file per process, read in name order) and the processes'
    status documents (what was patched, or why the plugin refused)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TraceError(f"trace folder {folder} does not exist")
    records: list[ProposalRecord] = []
    for path in sorted(folder.glob("*.jsonl")):
        records += read_trace_file(path)
    statuses = []
    for path in sorted(folder.glob("*.status.json")):
        try:
            statuses.append(json.loads(path.read_text()))
        except ValueError:
            raise TraceError(f"{path}: not a JSON status document") from None
    return records, statuses


def records_frame(records: list[ProposalRecord]) -> Any:
    """One row per record, `step` numbering each request's records in order (0-based)."""
    import pandas as pd

    rows = [{"request_id": r.request_id, "anchor_pos": r.anchor_pos, "anchor_id": r.anchor_id,
             "proposed": list(r.proposed), "engine_accepted": r.engine_accepted, "prompt_len": r.prompt_len}
            for r in records]
    frame = pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "step"])
    frame["step"] = frame.groupby("request_id", sort=False).cumcount() if len(frame) else []
    return frame[COLUMNS]
