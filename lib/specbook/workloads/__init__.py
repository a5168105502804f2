"""Prompt sets (workloads) by name, one registry for every experiment.

`draw_workload(params.workload, seed)` gives a `WorkloadDraw`: the requests (each with its category), the
selection record and, where the workload grades answers (gsm8k), its grader. The params schema per
workload is in `workloads.params` (`WorkloadParams`, chosen by `dataset`). Modules: `gsm8k` (5-shot chat,
exact-answer grading), `spec_bench` (six task groups, stratified, MT-Bench as two turns), `jsonl` (a
user's own prompts).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from specbook.core.errors import WorkloadError
from specbook.workloads.base import WorkloadDraw

# name -> module under specbook.workloads; imported on first use so `datasets` etc. stay optional.
_WORKLOADS: dict[str, str] = {
    "gsm8k": "specbook.workloads.gsm8k",
    "spec_bench": "specbook.workloads.spec_bench",
    "jsonl": "specbook.workloads.jsonl",
}

__all__ = ["WorkloadDraw", "draw_workload", "get_workload", "list_workloads", "register_workload",
           "resolve_input"]


def register_workload(name: str, module: str) -> None:
    """Make a workload module importable by name (a module path under any package)."""
    _WORKLOADS[name] = module


def list_workloads() -> list[str]:
    return sorted(_WORKLOADS)


def get_workload(name: str) -> ModuleType:
    """The workload module registered under `name` (WorkloadError lists the known names)."""
    try:
        module = _WORKLOADS[name]
    except KeyError:
        raise WorkloadError(f"unknown workload {name!r}; known: {list_workloads()}") from None
    return importlib.import_module(module)


def resolve_input(field_name: str, value: str | None) -> Path | None:
    """A params input path (relative to the project root), checked readable (specbook.core.params.readable_input:
    ParamsError naming the field, the value and the resolved path). None stays None (the hub)."""
    from specbook.core.params import readable_input

    return None if value is None else readable_input(field_name, value)


def draw_workload(params: Any, seed: int, *, field: str = "workload") -> WorkloadDraw:
    """One draw of the workload `params` (a `workloads.params` schema) with `seed`."""
    module = get_workload(params.dataset)
    if params.dataset == "gsm8k":
        test = resolve_input(f"{field}.test_path", params.test_path)
        train = resolve_input(f"{field}.train_path", params.train_path) if params.shots else None
        return module.draw(params, seed, test, train)
    return module.draw(params, seed, resolve_input(f"{field}.path", params.path))
