"""Experiments register themselves (name -> params schema + notebook) when their module is imported."""

from __future__ import annotations

import importlib

from specbook.experiments.registry import (
    ExperimentSpec,
    get_experiment,
    list_experiments,
    register_experiment,
)

EXPERIMENT_MODULES = ("knob_ab", "config_flip", "cross_engine")

for _name in EXPERIMENT_MODULES:
    try:
        importlib.import_module(f"specbook.experiments.{_name}")
    except ModuleNotFoundError as exc:  # an experiment still being written; the others stay usable
        if exc.name != f"specbook.experiments.{_name}":
            raise

__all__ = ["ExperimentSpec", "get_experiment", "list_experiments", "register_experiment"]
