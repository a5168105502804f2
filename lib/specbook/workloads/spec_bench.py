"""Spec-Bench (Xia et al. 2024) as a workload: six task groups, a stratified draw, MT-Bench as two turns.

The file is Spec-Bench's data/spec_bench/question.jsonl: {"question_id", "category", "turns": [...]} a line.
MT-Bench's eight categories (writing, roleplay, ...) form the group `mt_bench`; the other groups are the
file's own categories. Each request's category is its group; the file's category stays in the selection.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specbook.core.errors import WorkloadError
from specbook.workloads.base import WorkloadDraw, load_hub, read_jsonl, stratified_sample
from specbook.workloads.params import SPEC_BENCH_GROUPS, SpecBenchWorkloadParams

NAME = "spec_bench"
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


def group_of(category: str) -> str | None:
    """The task group of one of the file's categories; None when Spec-Bench has no such category."""
    if category in MT_BENCH_CATEGORIES:
        return "mt_bench"
    return category if category in SPEC_BENCH_GROUPS else None


def _checked(rows: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    for row in rows:
        where = f"spec_bench: {source} line {row.get('_line')}"
        for name in ("question_id", "category", "turns"):
            if name not in row:
                raise WorkloadError(f"{where}: field {name!r} absent")
        turns = row["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise WorkloadError(f"{where}: field 'turns' must be a non-empty list of strings")
        if group_of(str(row["category"])) is None:
            raise WorkloadError(f"{where}: unknown category {row['category']!r}; Spec-Bench has "
                                f"{list(MT_BENCH_CATEGORIES)} (mt_bench) and {list(SPEC_BENCH_GROUPS[1:])}")
    return rows


def load_rows(params: SpecBenchWorkloadParams, path: Path | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every question and where it came from ({"source", "sha256"})."""
    if path is not None:
        rows, digest = read_jsonl(path, "spec_bench (workload.path)")
        return _checked(rows, str(path)), {"source": str(path), "sha256": digest}
    if params.hub_id is None:
        raise WorkloadError("spec_bench: give workload.path (Spec-Bench's question.jsonl) or workload.hub_id")
    rows = load_hub(params.hub_id, params.hub_split, "spec_bench (workload.hub_id)")
    return _checked(rows, f"hub:{params.hub_id}"), {"source": f"hub:{params.hub_id}/{params.hub_split}",
                                                    "sha256": None}


def draw(params: SpecBenchWorkloadParams, seed: int, path: Path | None) -> WorkloadDraw:
    """`per_category` questions of each group in `categories` (that order), drawn with `seed`."""
    from specbook.serve.client import ChatRequest

    rows, source = load_rows(params, path)
    if params.max_chars is not None:  # before the draw: the sample is drawn among the questions that fit
        rows = [r for r in rows if all(len(t) <= params.max_chars for t in r["turns"][: params.turns])]
    picked = stratified_sample(rows, lambda r: group_of(str(r["category"])) or "", params.categories,
                               params.per_category, seed, "spec_bench")
    requests = []
    for row in picked:
        turns = row["turns"][: params.turns]
        requests.append(ChatRequest(
            prompt_id=f"{NAME}-{row['question_id']}", category=group_of(str(row["category"])),
            messages=[{"role": "user", "content": turns[0]}], follow_up=list(turns[1:]),
            max_tokens=params.max_tokens, temperature=0.0, seed=params.request_seed))
    selection = {"workload": NAME, **source, "seed": seed, "per_category": params.per_category,
                 "categories": list(params.categories), "turns": params.turns,
                 "max_chars": params.max_chars,
                 "question_ids": [int(r["question_id"]) for r in picked],
                 "source_categories": [str(r["category"]) for r in picked]}
    return WorkloadDraw(NAME, requests, selection)
