"""Arms of an A/B experiment: knobs (env and/or server-arg changes), crossed or one at a time.

An arm is the baseline engine config with a set of knobs switched on. Knobs are declared once in
params; arms are derived here so that the notebook, the launcher and attribution all agree.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from specbook.core import dotted as dotted_path
from specbook.core.errors import ParamsError

BASELINE = "baseline"
ARM_JOIN = "+"


class KnobSpec(BaseModel):
    """One two-level factor: off (baseline) or on (this knob's env/args/field changes)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="identifier; arms are named by joining knob names with '+'")
    description: str = ""
    env: dict[str, str] = Field(default_factory=dict, description="env vars set when the knob is on")
    args: list[str] = Field(default_factory=list, description="server args appended when the knob is on")
    set: dict[str, Any] = Field(
        default_factory=dict,
        description="engine-config fields changed when on, by dotted path (e.g. speculative_config.model)",
    )
    expect: Literal["equivalent", "different", "unknown"] = Field(
        "unknown", description="stated before the run: is this knob expected to leave AL alone or move it?"
    )

    @field_validator("name")
    @classmethod
    def _name_is_identifier(cls, v: str) -> str:
        if not v or ARM_JOIN in v or v == BASELINE or not all(c.isalnum() or c in "_-." for c in v):
            raise ValueError(f"knob name {v!r} must be non-empty, not {BASELINE!r}, of letters, digits, _ - .")
        return v

    @field_validator("env", mode="before")
    @classmethod
    def _env_values_are_strings(cls, v: Any) -> Any:
        # YAML turns `1` or `true` into int/bool; env vars are strings, so keep what the user wrote.
        if isinstance(v, dict):
            return {k: (str(x).lower() if isinstance(x, bool) else str(x)) for k, x in v.items()}
        return v


class Arm(BaseModel):
    """A named combination of knobs and the engine config it launches with."""

    model_config = ConfigDict(extra="forbid")

    name: str
    knobs: list[str]
    engine: dict[str, Any]

    @property
    def is_baseline(self) -> bool:
        return not self.knobs


def arm_name(knobs: list[str]) -> str:
    return ARM_JOIN.join(knobs) if knobs else BASELINE


def set_dotted(tree: dict[str, Any], dotted: str, value: Any, *, where: str) -> None:
    """Set `a.b.c` in a nested dict, making missing mappings; ParamsError naming `where` otherwise."""
    try:
        dotted_path.set_path(tree, dotted, value)
    except dotted_path.DottedPathError as exc:
        raise ParamsError(f"{where}: cannot set {dotted!r}: {exc}") from None


def apply_knobs(base_engine: dict[str, Any], knobs: list[KnobSpec]) -> dict[str, Any]:
    """The engine config dict with these knobs on; two knobs touching the same thing is an error."""
    cfg = copy.deepcopy(base_engine)
    cfg.setdefault("env", {})
    cfg.setdefault("extra_args", [])
    touched: dict[str, str] = {}
    for knob in knobs:
        for key in [f"env.{k}" for k in knob.env] + [f"set.{p}" for p in knob.set]:
            if key in touched:
                raise ParamsError(f"knobs {touched[key]!r} and {knob.name!r} both change {key}: they cannot be crossed")
            touched[key] = knob.name
        cfg["env"] = {**cfg["env"], **knob.env}
        cfg["extra_args"] = [*cfg["extra_args"], *knob.args]
        for dotted, value in knob.set.items():
            set_dotted(cfg, dotted, value, where=f"knobs.{knob.name}.set")
    return cfg


def build_arms(base_engine: dict[str, Any], knobs: list[KnobSpec], *, crossed: bool) -> list[Arm]:
    """Baseline first; then every subset of knobs (crossed) or each knob alone."""
    names = [k.name for k in knobs]
    if len(set(names)) != len(names):
        raise ParamsError(f"knob names must be unique, got {names}")
    if crossed:
        combos = [list(c) for r in range(len(knobs) + 1) for c in itertools.combinations(knobs, r)]
    else:
        combos = [[], *([k] for k in knobs)]
    return [
        Arm(name=arm_name([k.name for k in combo]), knobs=[k.name for k in combo], engine=apply_knobs(base_engine, combo))
        for combo in combos
    ]


def interleaved_schedule(arms: list[Arm], sweeps: int) -> list[tuple[int, Arm]]:
    """A B C D, A B C D, ...: each sweep visits every arm once, so drift spreads over all arms.

    Odd sweeps run in reverse order (A B C D, D C B A) so no arm always runs first after a cold machine.
    """
    order: list[tuple[int, Arm]] = []
    for s in range(sweeps):
        seq = arms if s % 2 == 0 else list(reversed(arms))
        order.extend((s, arm) for arm in seq)
    return order
