"""Experiments register themselves (name -> params schema + notebook) when their module is imported."""

from __future__ import annotations

import importlib

from specbook.experiments.registry import (
    ExperimentSpec,
    get_experiment,
    list_experiments,
    register_experiment,
)

EXPERIMENT_MODULES = ("knob_ab", "config_flip", "cross_engine", "concurrency_curve")

for _name in EXPERIMENT_MODULES:
    importlib.import_module(f"specbook.experiments.{_name}")

__all__ = ["ExperimentSpec", "get_experiment", "list_experiments", "register_experiment"]
