"""Prompt sets (workloads) by name: each module offers load_<name>(), make_requests(), score()."""

from __future__ import annotations

import importlib
from types import ModuleType

from specbook.errors import WorkloadError

# name -> module under specbook.workloads; imported on first use so `datasets` etc. stay optional.
_WORKLOADS: dict[str, str] = {"gsm8k": "specbook.workloads.gsm8k"}


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
