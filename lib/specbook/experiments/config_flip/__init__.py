"""Config-flip A/B: serve the same weights under configs that differ in exactly one field.

Each arm is a copy of one model folder (the target, or the draft of a draft-model speculative config) whose
weight files are links to the originals and whose config has the flipped field set to that arm's value. Everything
else is one shared EngineConfig in params, with the placeholder ``@flip`` where the arm's folder goes
(``engine.model`` or ``engine.speculative_config.model``). Before any server starts, the arms are proven to differ
in that field only: the folders file by file, and the launch specs (argv and env) built from them.

Per arm: a fresh server, a warm-up request, /metrics snapshot, the same prompts (greedy), a second snapshot.
After every measured arm, optional passes per arm, each on its own server (never the timed one): an untimed trace
pass (params `traces`) and a profiled pass (params `cost_split`).

  params.py      the params schema; where the placeholder sits (flip_role), the flip folder resolved
  flip.py        a folder copy with linked weights and one field flipped; the exactly-one-field diff
  arms.py        the arms: folders and engine configs, proven one field apart (folders and launches)
  data.py        the run folder's frames, flip.json and units of work; FlipData and load
  collection.py  collect: each arm's measured, trace and profile units
  analysis.py    analyze -> FlipResult: per-arm figures, per-position acceptance, output equality, the verdict
  tables.py      what was flipped; the trace and profiled passes' tables per arm
  summary.py     the report's summary block
"""

from specbook.core.request_failures import RequestMeasurement
from specbook.experiments.config_flip import flip
from specbook.experiments.config_flip.analysis import (
    FlipResult,
    FlipVerdict,
    analyze,
    arm_summary,
    flip_verdict,
    intervals_by_arm,
    output_equality,
    per_position_acceptance,
    per_position_table,
    request_failure_table,
)
from specbook.experiments.config_flip.arms import (
    FlipArm,
    arm_engine_config,
    arm_label,
    assert_launches_differ_only_in_folder,
    build_arms,
    launch_view,
)
from specbook.experiments.config_flip.collection import collect
from specbook.experiments.config_flip.data import (
    ARMS_FRAME,
    COST_SPLIT_FRAME,
    FLIP_DIRNAME,
    FLIP_JSON,
    INTERVALS_FRAME,
    REQUESTS_FRAME,
    UNIT_KINDS,
    UNITS,
    FlipData,
    keyed,
    load,
)
from specbook.experiments.config_flip.params import (
    FLIP_PLACEHOLDER,
    ConfigFlipParams,
    FlipSpec,
    flip_role,
    resolve_folder,
)
from specbook.experiments.config_flip.summary import flip_answer
from specbook.experiments.config_flip.tables import (
    TRACE_NOTE,
    cost_split_table,
    describe_flip,
    diff_table,
    identical_share_line,
    matched_anchor_summary,
    matched_anchors_between_arms,
    prefix_acceptance_between_arms,
    proposals_table,
    replay_by_arm,
    trace_agreement_by_arm,
)
from specbook.experiments.registry import ExperimentSpec, register_experiment

NAME = "config_flip"
register_experiment(ExperimentSpec(NAME, ConfigFlipParams, "config_flip.ipynb",
                                   collect=collect, load=load, analyze=analyze))

# the names these helpers had when they were private to this module (tests use them)
_keyed = keyed
_launch_view = launch_view

__all__ = [
    "ARMS_FRAME",
    "COST_SPLIT_FRAME",
    "FLIP_DIRNAME",
    "FLIP_JSON",
    "FLIP_PLACEHOLDER",
    "INTERVALS_FRAME",
    "NAME",
    "REQUESTS_FRAME",
    "TRACE_NOTE",
    "UNITS",
    "UNIT_KINDS",
    "ConfigFlipParams",
    "FlipArm",
    "FlipData",
    "FlipResult",
    "FlipSpec",
    "FlipVerdict",
    "RequestMeasurement",
    "analyze",
    "arm_engine_config",
    "arm_label",
    "arm_summary",
    "assert_launches_differ_only_in_folder",
    "build_arms",
    "collect",
    "cost_split_table",
    "describe_flip",
    "diff_table",
    "flip",
    "flip_answer",
    "flip_role",
    "flip_verdict",
    "identical_share_line",
    "intervals_by_arm",
    "keyed",
    "launch_view",
    "load",
    "matched_anchor_summary",
    "matched_anchors_between_arms",
    "output_equality",
    "per_position_acceptance",
    "per_position_table",
    "prefix_acceptance_between_arms",
    "proposals_table",
    "replay_by_arm",
    "request_failure_table",
    "resolve_folder",
    "trace_agreement_by_arm",
]
