"""Statistics of an A/B experiment: per-arm summaries, deltas vs the baseline, equivalence, interaction.

The unit of replication is the sweep (one fresh server, one pass over the workload): every function
here takes one value per sweep, never per request or per log interval, because requests on one server
share that server's state and are not independent replicates.

Intervals are t intervals: people run 2-5 sweeps per arm, and a percentile bootstrap of 2-3 values per
arm covers far less than it claims at 2 runs per arm; t intervals hold their coverage there
(tests/unit/test_interval_coverage.py measures both). Two kinds:

- paired by sweep (the knob A/B's block design: within a sweep every arm serves the same question draw,
  interleaved in time, so most run-to-run variance is between sweeps, not between arms): the per-sweep
  contrasts d_s (variant_s - baseline_s, or the interaction's AB_s - B_s - A_s + base_s) and their
  Student t interval with n_sweeps - 1 df. Used when every sweep has exactly one run of every arm the
  contrast involves (`sweep_blocks`);
- Welch t on run means (Welch-Satterthwaite df): when no sweep pairing is given, or the sweeps are
  unbalanced (a failed or excluded run); the result's method then says why it is not paired.

Modules: summaries (one arm's values), intervals (t, Fieller ratio, Wilson), labels (method names),
contrasts (paired / Welch contrasts of arm means), equivalence (TOST), deltas (the delta-vs-baseline table),
interaction (the 2x2 factorial), level_effects (the effect over levels), accuracy (accuracy per arm). Every
public name is re-exported here: import from `specbook.core.stats`.
"""

from __future__ import annotations

from specbook.core.stats.accuracy import accuracy_by_arm
from specbook.core.stats.contrasts import (
    ContrastInterval,
    contrast_of,
    paired_contrast,
    sweep_blocks,
    welch_contrast,
    welch_delta,
    welch_p,
)
from specbook.core.stats.deltas import delta_vs_baseline
from specbook.core.stats.equivalence import paired_tost_p, paired_tost_t, tost_equivalence, tost_of
from specbook.core.stats.interaction import InteractionResult, interaction_2x2
from specbook.core.stats.intervals import (
    mean_t_interval,
    paired_t_interval,
    ratio_of_means_interval,
    welch_df,
    welch_t_interval,
    wilson_ci,
)
from specbook.core.stats.labels import PAIRED_METHOD, WELCH_METHOD, method_label, paired_method
from specbook.core.stats.level_effects import LevelEffects, effect_by_level
from specbook.core.stats.summaries import (
    DEFAULT_CI,
    DETERMINISTIC_REL_TOL,
    ArmSummary,
    arm_table,
    summarize,
)

__all__ = [
    "DEFAULT_CI",
    "DETERMINISTIC_REL_TOL",
    "PAIRED_METHOD",
    "WELCH_METHOD",
    "ArmSummary",
    "ContrastInterval",
    "InteractionResult",
    "LevelEffects",
    "accuracy_by_arm",
    "arm_table",
    "contrast_of",
    "delta_vs_baseline",
    "effect_by_level",
    "interaction_2x2",
    "mean_t_interval",
    "method_label",
    "paired_contrast",
    "paired_method",
    "paired_t_interval",
    "paired_tost_p",
    "paired_tost_t",
    "ratio_of_means_interval",
    "summarize",
    "sweep_blocks",
    "tost_equivalence",
    "tost_of",
    "welch_contrast",
    "welch_delta",
    "welch_df",
    "welch_p",
    "welch_t_interval",
    "wilson_ci",
]
