"""Levels past the params' top until the curve ends: found by the run's first server, then run by every server.

A curve asked to go "until throughput stops growing or the KV cache runs out" cannot list its levels in advance.
With `extend`, the first server of the run (sweep 0, the first arm of its order) measures the params' levels,
then multiplies the top by `factor` while the level just measured still grew tok/s by SATURATION_GAIN or more per
doubling over the level below it and did not fill the KV cache, up to `max_level`. The levels it reached are then every other server's levels, in a random order per sweep as
always, so every arm and sweep measures the same levels and the curve's intervals and the effect model stay
balanced. The decision is the first server's; the report's saturation and KV readings come from every sweep.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from specbook.experiments.concurrency_curve import capacity

# tok/s growth per doubling of concurrency below which the curve has stopped growing (saturation)
SATURATION_GAIN = 0.05


class LevelExtension(BaseModel):
    model_config = ConfigDict(extra="forbid")

    factor: int = Field(2, ge=2, description="each level past the params' top is the last one times this")
    max_level: int = Field(gt=0, description="no level above this (at most engine.max_num_seqs)")


def per_doubling(level0: float, tok0: float, level1: float, tok1: float) -> float:
    """tok/s growth per doubling of concurrency from level0 to level1 (0.05 = 5%); NaN when undefined."""
    if not (tok0 > 0 and np.isfinite(tok1) and level1 > level0 > 0):
        return float("nan")
    return float((tok1 / tok0) ** (1 / np.log2(level1 / level0)) - 1)


@dataclass(frozen=True)
class Step:
    """A decision after the server's windows so far: the next level, or None and why the curve ends there."""

    after: int  # the top level measured when deciding
    level: int | None
    why: str


def next_level(rows: pd.DataFrame, ext: LevelExtension, kv_full_fraction: float = capacity.KV_FULL_FRACTION) -> Step:
    """The level to measure after `rows` (one server's windows: level, tok_s and capacity.PEAKS), or the end."""
    by_level = rows.sort_values("level")
    top = by_level.iloc[-1]
    level = int(top["level"])
    if capacity.kv_full(top, kv_full_fraction):
        return Step(level, None, f"the KV cache filled at {level} ({top['peak_kv_usage']:.1%} in use)")
    growth = float("nan")
    if len(by_level) >= 2:
        below = by_level.iloc[-2]
        growth = per_doubling(below["level"], below["tok_s"], level, top["tok_s"])
        grew = f"tok/s grew {growth:+.1%} per doubling from {int(below['level'])} to {level}"
        if np.isfinite(growth) and growth < SATURATION_GAIN:
            return Step(level, None, f"{grew} (< {SATURATION_GAIN:.0%}): stopped growing")
    else:
        grew = f"one level measured ({level})"
    nxt = level * ext.factor
    if nxt > ext.max_level:
        return Step(level, None, f"{grew}; the next level {nxt} is above max_level {ext.max_level}")
    return Step(level, nxt, grew)


def replay(explorer: pd.DataFrame, planned: list[int], ext: LevelExtension,
           kv_full_fraction: float = capacity.KV_FULL_FRACTION) -> list[Step]:
    """The first server's decisions again, from its windows in the order it measured them: one after its planned
    levels, one after each level it added (what the report says of how the levels were found)."""
    ordered = explorer.sort_values("level_order")
    n = int(ordered["level"].isin(planned).sum())
    return [next_level(ordered.iloc[:i], ext, kv_full_fraction) for i in range(n, len(ordered) + 1) if i]
