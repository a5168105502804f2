"""Knob A/B: does a process-wide knob move draft acceptance more than run-to-run noise?

`collect` launches one fresh server per (sweep, arm) in an interleaved order through the measurement
harness and saves every run's raw data the moment it is measured; `ingest` (params mode: ingest)
reads existing server logs instead; `analyze` turns either into the typed result the notebook shows.

  params.py       the params schema
  attribution.py  which arm each server really ran (Env: line and argv), backend reach
  collection.py   collect / ingest / load
  analysis.py     analyze -> KnobABResult (the statistics: attribution, steady state, per-run AL, decisions)
  tables.py       the report's texts and tables: summary block, intro, verdict vocabulary, runs/knobs frames
  decision.py     the rule fixed in the params, applied to the per-run values
  steady.py       steady-state windows by load, the crude cut and its sensitivity
  sequential.py   the adaptive sweeps' look after each sweep (core.sequential's design)
"""

from specbook.experiments.knob_ab.analysis import KnobABResult, analyze
from specbook.experiments.knob_ab.attribution import arm_signatures, attribute_runs, check_inherited_knob_env
from specbook.experiments.knob_ab.collection import (
    INTERVALS,
    REQUESTS,
    RUNS,
    KnobABData,
    collect,
    ingest,
    load,
)
from specbook.experiments.knob_ab.params import KnobABParams, load_params_file
from specbook.experiments.registry import ExperimentSpec, register_experiment

NAME = "knob_ab"
register_experiment(ExperimentSpec(NAME, KnobABParams, "knob_ab.ipynb", collect=collect, load=load, analyze=analyze))

__all__ = [
    "INTERVALS",
    "NAME",
    "REQUESTS",
    "RUNS",
    "KnobABData",
    "KnobABParams",
    "KnobABResult",
    "analyze",
    "arm_signatures",
    "attribute_runs",
    "check_inherited_knob_env",
    "collect",
    "ingest",
    "load",
    "load_params_file",
]
