"""The Ray executor: each unit a Ray task in one bundle ("slot") of a placement group, on the node Ray picked.

- Slots: a placement group of `slots` bundles, each {GPU: gpus_per_unit, CPU: cpus_per_unit}; a bundle is one
  GPU (or set of GPUs) on one node for the run's lifetime, so "slot 1" names the same GPU in every unit.
- Order: each slot runs its units one after another in schedule order (units that share a GPU over time keep
  the interleaved order); different slots run at once. With adaptive sweeps no unit of a later sweep starts
  before the look after the sweep before it.
- Data: a task serves and measures into a staging folder on its node and returns its files; the driver merges
  them into the run folder (`staging.merge`), so the layout is the local executor's.
- Faults: a unit that raises, or a task lost with its worker or node, fails only that unit (its failed row is
  written); the others finish; then `RunError` names the failed units. Ctrl-C cancels the tasks (each tears its
  server down and records it `interrupted`), force-cancels what does not end in time, and stops every process
  carrying the run's token on every node.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specbook.core import progress
from specbook.core.errors import ParamsError, RunError, keep_cause
from specbook.executors.placement import assign_slots, detect, placed
from specbook.executors.staging import collect_staged, mark_ended, merge, pack, staging_dir

if TYPE_CHECKING:
    from specbook.executors import Execution, ExecutorParams, Unit
    from specbook.store.runstore import RunContext

CANCEL_WAIT_S = 45.0  # as long as the runner waits for servers after Ctrl-C (runguard.SERVER_STOP_BOUND_S)
PLACEMENT_TIMEOUT_S = 120.0


def _ray():
    try:
        import ray
    except ImportError:
        raise ParamsError("executor.kind: 'ray' needs the ray package (pip install 'specbook[ray]', or "
                          "pip install ray==2.60.0); it is not installed in this environment") from None
    return ray


def unit_task(call: Callable[..., Any], key: str, token: str, slot: int, env: dict[str, str]) -> dict[str, Any]:
    """Body of the Ray task: the unit against a fresh staging folder; its files, error and placement back."""
    import ray

    from specbook.store.runstore import RunContext

    for name, value in env.items():  # the run token (no server outlives the run), the progress file
        os.environ[name] = value
    folder = staging_dir(token, key)
    shutil.rmtree(folder, ignore_errors=True)
    ctx = RunContext(folder)
    where = detect("ray", slot=slot, node_id=ray.get_runtime_context().get_node_id())
    error = None
    cancelled = False
    try:
        with placed(where):
            call(ctx)
    except KeyboardInterrupt:  # ray.cancel: the harness has torn the server down and recorded it interrupted
        error, cancelled = "KeyboardInterrupt: cancelled (Ctrl-C on the driver)", True
    except BaseException as exc:  # the unit fails alone; its files (failed row, log, record) still go back
        error = f"{type(exc).__name__}: {exc}"[:4000]
    mark_ended(folder)
    files = pack(folder)
    if not cancelled:  # a cancelled task's answer may never reach the driver (TaskCancelledError): the folder
        shutil.rmtree(folder, ignore_errors=True)  # stays for collect_staged
    return {"files": files, "error": error, "placement": where.__dict__}


def stop_run_processes(token: str) -> dict[str, Any]:
    """On one node: stop every process carrying the run's token (servers first); what was stopped."""
    from specbook.serve.processes import run_processes, stop

    servers, _ = run_processes(token)
    left = stop(servers)
    return {"node": socket.gethostname(), "stopped": len(servers), "left": [p.pid for p in left],
            "staged": collect_staged(token)}


def describe_cluster(ray: Any) -> dict[str, Any]:
    """Nodes (host, GPUs, CPUs, memory), Ray version and address: what the manifest records."""
    nodes = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        nodes.append({"node_id": n.get("NodeID", ""), "host": n.get("NodeManagerHostname", ""),
                      "address": n.get("NodeManagerAddress", ""), "gpus": res.get("GPU", 0.0),
                      "cpus": res.get("CPU", 0.0), "memory_gb": round(res.get("memory", 0.0) / 2**30, 1)})
    total = ray.cluster_resources()
    return {"executor": "ray", "ray_version": ray.__version__, "nodes": nodes,
            "gpus": total.get("GPU", 0.0), "cpus": total.get("CPU", 0.0)}


def _slot_count(params: ExecutorParams, cluster: dict[str, Any], gpus: float, cpus: float) -> int:
    if params.slots is not None:
        return params.slots
    by_gpu = int(cluster["gpus"] // gpus) if gpus > 0 else None
    by_cpu = int(cluster["cpus"] // cpus)
    n = min(x for x in (by_gpu, by_cpu) if x is not None)
    if n < 1:
        raise ParamsError(f"executor: a unit asks for {gpus:g} GPU and {cpus:g} CPU, the Ray cluster has "
                          f"{cluster['gpus']:g} GPU and {cluster['cpus']:g} CPU; lower executor.gpus_per_unit / "
                          f"cpus_per_unit or join a larger cluster")
    return n


def _init(ray: Any, params: ExecutorParams) -> bool:
    """Connect (or start a local instance); True when this call started it (and shutdown is ours)."""
    if ray.is_initialized():
        return False
    import logging

    kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": False,
                              "configure_logging": True}
    if params.address is None:
        kwargs["object_store_memory"] = params.object_store_mb * 2**20
    else:
        kwargs["address"] = params.address
    try:
        ray.init(**kwargs)
    except Exception as exc:
        raise RunError(f"executor.address {params.address!r}: cannot start or join Ray: {type(exc).__name__}: "
                       f"{exc}") from exc
    return True


def run_on_ray(units: Sequence[Unit], ctx: RunContext, params: ExecutorParams, *, done_frame: str,
               look_after: Callable[[int], bool] | None, looks_from: int | None, what: str,
               gpus_hint: int = 1) -> Execution:
    """Run `units` as Ray tasks, one per slot of a placement group at a time; adaptive sweeps: units of a later
    sweep wait for the look after the one before (`look_after`, from sweep `looks_from` on)."""
    from specbook.executors import Execution

    ray = _ray()
    from ray.util.placement_group import remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from specbook.core.secrets import RUN_TOKEN_ENV

    started = _init(ray, params)
    token = os.environ.get(RUN_TOKEN_ENV) or f"specbook-{os.getpid()}-{time.time_ns()}"
    env = {RUN_TOKEN_ENV: token}
    if os.environ.get(progress.ENV):
        env[progress.ENV] = os.environ[progress.ENV]
    pg = None
    try:
        cluster, pg, slots = _place(ray, ctx, params, gpus_hint)
        arm_order = list(dict.fromkeys(u.arm for u in units))
        slot_of = assign_slots([u.arm for u in units], [u.sweep for u in units], arm_order, slots.count,
                               params.assignment)
        schedule = _Schedule(units, slot_of, slots.count, look_after, looks_from)
        done = Execution(cluster=cluster)
        progress.note(f"Ray: {slots.count} slot(s) of {slots.bundle} on {len(cluster['nodes'])} node(s); "
                      f"{len(units)} {what}(s)")
        remote = ray.remote(unit_task)

        def submit_ready() -> None:
            for slot, unit in schedule.next_units():
                strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=slot)
                ref = remote.options(num_cpus=slots.cpus, num_gpus=slots.gpus, max_retries=0,
                                     scheduling_strategy=strategy).remote(unit.call, unit.key, token, slot, env)
                schedule.in_flight[ref] = (slot, unit)
                progress.note(f"{what} {unit.label}: started on slot {slot}")

        try:
            submit_ready()
            while schedule.in_flight:
                ready_refs, _ = ray.wait(list(schedule.in_flight), num_returns=1)
                slot, unit = schedule.in_flight.pop(ready_refs[0])
                _finish(ray, ready_refs[0], unit, ctx, done, done_frame, token)
                progress.note(f"{what} {len(done.ran) + len(done.failed)}/{len(units)}: {unit.key} "
                              f"{'FAILED' if unit.key in done.failed else 'done'} (slot {slot})")
                look = schedule.finished(unit)
                if look is not None and not done.failed and look_after is not None and look_after(look):
                    done.stopped_after_sweep = look
                    schedule.stop = True
                submit_ready()
        except KeyboardInterrupt:
            _cancel(ray, schedule.in_flight, ctx, done_frame, token)
            raise
        if done.failed:
            names = "; ".join(f"{k}: {v.splitlines()[0]}" for k, v in done.failed.items())
            raise RunError(f"{len(done.failed)} of {len(units)} {what}(s) failed on Ray, the others finished and are "
                           f"saved in {ctx.data_dir}: {names}. `specbook run --resume {ctx.run_dir}` re-runs only "
                           f"the failed ones")
        return done
    finally:
        if pg is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(pg)
        if started:
            ray.shutdown()


@dataclass(frozen=True)
class _Slots:
    """The placement group's slots: how many, and what each holds."""

    count: int
    bundle: dict[str, float]
    gpus: float
    cpus: float


def _place(ray: Any, ctx: RunContext, params: ExecutorParams, gpus_hint: int) -> tuple[dict[str, Any], Any, _Slots]:
    """The cluster as seen (saved as data/executor.json) and a placement group of its slots, placed."""
    from ray.util.placement_group import placement_group

    cluster = describe_cluster(ray)
    gpus = params.gpus_per_unit if params.gpus_per_unit is not None else (gpus_hint if cluster["gpus"] else 0)
    cpus = params.cpus_per_unit
    count = _slot_count(params, cluster, gpus, cpus)
    bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
    cluster.update(slots=count, bundle=bundle, address=params.address or "local instance",
                   assignment=params.assignment)
    ctx.save_json("executor", cluster)
    pg = placement_group([dict(bundle) for _ in range(count)], strategy="SPREAD" if gpus else "PACK")
    ready, _ = ray.wait([pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        with contextlib.suppress(Exception):
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(pg)
        raise RunError(f"executor: Ray could not place {count} slot(s) of {bundle} within "
                       f"{PLACEMENT_TIMEOUT_S:.0f} s (cluster: {cluster['gpus']:g} GPU, {cluster['cpus']:g} CPU); "
                       f"set executor.slots lower")
    return cluster, pg, _Slots(count, bundle, gpus, cpus)


class _Schedule:
    """Which unit runs next where: a queue per slot, a slot takes its next unit when free; with looks (adaptive
    sweeps), units of a later sweep wait until the sweep before has been looked at; `stop` ends submitting."""

    def __init__(self, units: Sequence[Unit], slot_of: Sequence[int], slots: int,
                 look_after: Callable[[int], bool] | None, looks_from: int | None):
        self.queues: dict[int, deque[Unit]] = {s: deque() for s in range(slots)}
        for unit, s in zip(units, slot_of, strict=True):
            self.queues[s].append(unit)
        self.sweeps_left: dict[int, int] = {}
        for u in units:
            self.sweeps_left[u.sweep] = self.sweeps_left.get(u.sweep, 0) + 1
        self.looks = look_after is not None and looks_from is not None
        self.looks_from = looks_from or 0
        self.looked: set[int] = set()
        self.in_flight: dict[Any, tuple[int, Unit]] = {}
        self.stop = False

    def gate(self) -> int | None:
        """The sweep whose look units of later sweeps wait for; None: no gate."""
        if not self.looks:
            return None
        pending = [s for s in sorted(self.sweeps_left) if s + 1 >= self.looks_from and s not in self.looked]
        return pending[0] if pending else None

    def next_units(self) -> list[tuple[int, Unit]]:
        """(slot, unit) for every free slot whose next unit may start now, taken off its queue."""
        if self.stop:
            return []
        g = self.gate()
        busy = {slot for slot, _ in self.in_flight.values()}
        out = []
        for slot, q in self.queues.items():
            if slot in busy or not q or (g is not None and q[0].sweep > g):
                continue
            out.append((slot, q.popleft()))
        return out

    def finished(self, unit: Unit) -> int | None:
        """Count `unit` done; the sweep to look at now that every unit up to it is done, else None."""
        self.sweeps_left[unit.sweep] -= 1
        g = self.gate()
        if g is not None and all(n == 0 for s, n in self.sweeps_left.items() if s <= g):
            self.looked.add(g)
            return g
        return None


def _finish(ray: Any, ref: Any, unit: Unit, ctx: RunContext, done: Execution, done_frame: str, token: str) -> None:
    """Merge a finished task's files; a task lost with its worker writes the unit's failed row instead."""
    try:
        out = ray.get(ref)
    except Exception as exc:  # the worker or node died, or the task was cancelled before it could answer
        local = staging_dir(token, unit.key)
        if local.is_dir():  # same host: what the unit wrote before it was lost is still here
            merge(pack(local), ctx, done_frame=done_frame)
            shutil.rmtree(local, ignore_errors=True)
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} (task lost)"
        _failed_row(unit, ctx, done_frame, error)
        done.failed[unit.key] = error
        return
    merge(out["files"], ctx, done_frame=done_frame)
    shutil.rmtree(staging_dir(token, unit.key), ignore_errors=True)  # a cancelled task kept it; merged now
    if out["error"]:
        if not _row_written(ctx, done_frame, unit):
            _failed_row(unit, ctx, done_frame, out["error"])
        done.failed[unit.key] = out["error"]
    else:
        done.ran.append(unit.key)


def _row_written(ctx: RunContext, done_frame: str, unit: Unit) -> bool:
    """Whether the unit's row (its own failed row) is in the done frame; True where it keeps no failed rows."""
    if not unit.failed_row:
        return True
    if not ctx.has_frame(done_frame):
        return False
    key_col = next(iter(unit.failed_row))
    frame = ctx.load_frame(done_frame)
    return key_col in frame and (frame[key_col] == unit.failed_row[key_col]).any()


def _failed_row(unit: Unit, ctx: RunContext, done_frame: str, error: str) -> None:
    if not unit.failed_row:
        return
    import pandas as pd

    row = {**unit.failed_row, "status": "failed", "error": keep_cause(error)}
    ctx.append_frame(done_frame, pd.DataFrame([row]))


def _cancel(ray: Any, in_flight: dict[Any, tuple[int, Unit]], ctx: RunContext, done_frame: str,
            token: str) -> None:
    """Ctrl-C: every task is asked to stop (its server torn down, recorded interrupted) and waited for; what does
    not end in CANCEL_WAIT_S is force-cancelled; then every node stops what still carries the run's token."""
    progress.note(f"Ray: cancelling {len(in_flight)} running unit(s)")
    for ref in in_flight:
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=False)
    end = time.monotonic() + CANCEL_WAIT_S
    merged: set[str] = set()
    while in_flight and time.monotonic() < end:
        try:
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=max(0.1, end - time.monotonic()))
        except KeyboardInterrupt:  # a second Ctrl-C: force at once
            break
        for ref in ready:
            _slot, unit = in_flight[ref]
            with contextlib.suppress(Exception):  # a cancelled task usually answers TaskCancelledError: its
                out = ray.get(ref)  # files are then collected from its node's staging folder below
                merge(out["files"], ctx, done_frame=done_frame)
                shutil.rmtree(staging_dir(token, unit.key), ignore_errors=True)
                merged.add(unit.key)
            del in_flight[ref]
    for ref in in_flight:
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)
    # this host's cancelled units first: under `specbook run` the runner ends the kernel soon after the servers
    # are gone (what is left then, runner.py merges through staging.recover_interrupted)
    _merge_staged(collect_staged(token), merged, ctx, done_frame)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    cleanup = ray.remote(stop_run_processes)
    refs = [cleanup.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(token) for n in ray.nodes() if n.get("Alive")]
    staged: dict[str, dict[str, bytes]] = {}
    with contextlib.suppress(Exception):
        for r in ray.get(refs, timeout=CANCEL_WAIT_S):
            progress.note(f"Ray: node {r['node']}: stopped {r['stopped']} server process(es)"
                          + (f", still alive: {r['left']}" if r["left"] else ""))
            staged.update(r["staged"])
    _merge_staged(staged, merged, ctx, done_frame)


def _merge_staged(staged: dict[str, dict[str, bytes]], merged: set[str], ctx: RunContext, done_frame: str) -> None:
    """What cancelled units wrote (server record `interrupted`, log, rows), each unit once."""
    for key, files in staged.items():
        if key not in merged:
            merged.add(key)
            with contextlib.suppress(Exception):
                merge(files, ctx, done_frame=done_frame)
