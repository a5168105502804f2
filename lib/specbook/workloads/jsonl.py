"""A user's own prompts from a JSONL file: the prompt field (a string, or a list of user turns sent as one
conversation), an optional category field and an optional id field, all named in the params."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specbook.core.errors import WorkloadError
from specbook.workloads.base import WorkloadDraw, load_hub, read_jsonl, stratified_sample
from specbook.workloads.params import JsonlWorkloadParams

NAME = "jsonl"


def _turns(row: dict[str, Any], field_name: str, where: str) -> list[str]:
    if field_name not in row:
        raise WorkloadError(f"{where}: field {field_name!r} (workload.prompt_field) absent; "
                            f"fields there: {sorted(k for k in row if k != '_line')}")
    value = row[field_name]
    turns = [value] if isinstance(value, str) else value
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
        raise WorkloadError(f"{where}: field {field_name!r} must be a non-empty string or list of strings")
    return turns


def draw(params: JsonlWorkloadParams, seed: int, path: Path | None) -> WorkloadDraw:
    from specbook.serve.client import ChatRequest

    if path is not None:
        rows, digest = read_jsonl(path, "jsonl workload (workload.path)")
        source = {"source": str(path), "sha256": digest}
    elif params.hub_id is not None:
        rows = load_hub(params.hub_id, params.hub_split, "jsonl workload (workload.hub_id)")
        source = {"source": f"hub:{params.hub_id}/{params.hub_split}", "sha256": None}
    else:
        raise WorkloadError("jsonl workload: give workload.path (a JSONL file) or workload.hub_id")
    src = source["source"]

    def category(row: dict[str, Any]) -> str:
        if params.category_field is None:
            return NAME
        if params.category_field not in row:
            raise WorkloadError(f"jsonl workload: {src} line {row['_line']}: field {params.category_field!r} "
                                f"(workload.category_field) absent")
        return str(row[params.category_field])

    def prompt_id(row: dict[str, Any]) -> str:
        if params.id_field is None:
            return f"{NAME}-{row['_line']:05d}"
        if params.id_field not in row:
            raise WorkloadError(f"jsonl workload: {src} line {row['_line']}: field {params.id_field!r} "
                                f"(workload.id_field) absent")
        return str(row[params.id_field])

    turns = {row["_line"]: _turns(row, params.prompt_field, f"jsonl workload: {src} line {row['_line']}")
             for row in rows}
    strata = list(dict.fromkeys(category(r) for r in rows))
    picked = stratified_sample(rows, category, strata, params.subset, seed, "jsonl workload")
    ids = [prompt_id(r) for r in picked]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise WorkloadError(f"jsonl workload: {src}: ids repeat in field {params.id_field!r}: {dup[:5]}")
    requests = [ChatRequest(prompt_id=pid, category=category(r),
                            messages=[{"role": "user", "content": turns[r["_line"]][0]}],
                            follow_up=turns[r["_line"]][1:], max_tokens=params.max_tokens, temperature=0.0,
                            seed=params.request_seed)
                for pid, r in zip(ids, picked, strict=True)]
    selection = {"workload": NAME, **source, "seed": seed, "subset": params.subset, "categories": strata,
                 "lines": [int(r["_line"]) for r in picked]}
    return WorkloadDraw(NAME, requests, selection)
