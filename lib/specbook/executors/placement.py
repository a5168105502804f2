"""Where a unit ran (node, slot, GPUs with their UUIDs) and which slot runs which unit.

A unit's collect code asks `current_placement()` and writes `placement_columns` into its done row; the executor
sets the placement around the call. GPUs are the ones the unit may see: `CUDA_VISIBLE_DEVICES` (Ray sets it for
a task that asked for GPUs), looked up in `nvidia-smi` for their names and UUIDs, so two runs on "GPU 0" of two
nodes are told apart.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

GPU_FIELDS = ("index", "uuid", "name")


@dataclass(frozen=True)
class Placement:
    executor: str = "local"
    node: str = ""  # hostname
    node_id: str = ""  # Ray's node id (empty on the local executor)
    slot: int = 0  # the placement-group bundle (local: 0)
    gpu_ids: str = ""  # CUDA_VISIBLE_DEVICES as the unit saw it
    gpu_uuids: str = ""  # comma-separated, in gpu_ids order
    gpu_names: str = ""

    @property
    def gpu(self) -> str:
        """The label a report groups by: 'node/GPU-uuid...' or 'node' where no GPU is visible."""
        return f"{self.node}/{self.gpu_uuids}" if self.gpu_uuids else self.node


def visible_gpus(nvidia_smi_csv: str | None, cuda_visible_devices: str | None) -> list[dict[str, str]]:
    """The rows of `nvidia-smi --query-gpu=index,uuid,name --format=csv,noheader` this process may use:
    all of them when CUDA_VISIBLE_DEVICES is unset, else the listed indices or UUIDs, in that order."""
    from specbook.store.fingerprint import parse_nvidia_smi_csv

    rows = parse_nvidia_smi_csv(nvidia_smi_csv or "", GPU_FIELDS)
    if cuda_visible_devices is None:
        return rows
    wanted = [v.strip() for v in cuda_visible_devices.split(",") if v.strip()]
    out = []
    for w in wanted:
        out.extend(r for r in rows if w in (r.get("index"), r.get("uuid")))
    return out


def _nvidia_smi() -> str | None:
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def detect(executor: str, *, slot: int = 0, node_id: str = "") -> Placement:
    """This process's placement: hostname, the GPUs it may see (none on a CPU host)."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = visible_gpus(_nvidia_smi(), cvd)
    return Placement(executor=executor, node=socket.gethostname(), node_id=node_id, slot=slot,
                     gpu_ids=cvd if cvd is not None else ",".join(g.get("index", "") for g in gpus),
                     gpu_uuids=",".join(g.get("uuid", "") for g in gpus),
                     gpu_names=",".join(g.get("name", "") for g in gpus))


_current: Placement | None = None


def current_placement() -> Placement:
    """The placement the executor set for the running unit (a plain local one outside an executor)."""
    return _current if _current is not None else detect("local")


@contextmanager
def placed(placement: Placement) -> Iterator[Placement]:
    global _current
    previous, _current = _current, placement
    try:
        yield placement
    finally:
        _current = previous


def placement_columns(placement: Placement | None = None) -> dict[str, Any]:
    """The columns a unit's done row carries: executor, node, node_id, slot, gpu_ids, gpu_uuids, gpu_names, gpu."""
    p = placement or current_placement()
    return {**asdict(p), "gpu": p.gpu}


def assign_slots(arms: Sequence[str], sweeps: Sequence[int], arm_order: Sequence[str], slots: int,
                 assignment: str | dict[str, list[int]] = "spread") -> list[int]:
    """The slot of each unit (arms[i], sweeps[i]).

    spread: arm number a's sweep s runs on slot (a + s) mod slots: over the sweeps every arm visits every slot,
    and in one sweep the arms sit on different slots (as long as there are enough). A dict pins each arm's
    sweeps to its listed slots, in turn (sweep s on slots[s mod len]); an arm it does not name spreads."""
    out = []
    for arm, sweep in zip(arms, sweeps, strict=True):
        if isinstance(assignment, dict) and arm in assignment:
            listed = assignment[arm]
            bad = [s for s in listed if s >= slots]
            if bad:
                from specbook.core.errors import ParamsError

                raise ParamsError(f"executor.assignment.{arm}: slot(s) {bad} do not exist; the cluster gives {slots} "
                                  f"slot(s), numbered 0..{slots - 1}")
            out.append(listed[sweep % len(listed)])
        else:
            out.append((arm_order.index(arm) + sweep) % slots)
    return out


def placement_table(runs: Any, value_col: str, arm_col: str = "arm") -> Any:
    """Per arm x place (node and GPU; one row per arm on the local executor): runs, slots, mean of value_col.

    The report's answer to "did a GPU effect hide inside an arm?": spread over the same places, arms share any
    GPU-to-GPU difference; an arm alone on one place would carry that place's difference in its delta."""
    import pandas as pd

    if "gpu" not in runs or not len(runs):
        return pd.DataFrame(columns=[arm_col, "place", "runs", "slots", value_col])
    rows = []
    for (arm, place), part in runs.groupby([arm_col, "gpu"], sort=False):
        rows.append({arm_col: arm, "place": place, "runs": len(part),
                     "slots": ",".join(str(s) for s in sorted(set(part["slot"]))) if "slot" in part else "",
                     value_col: float(part[value_col].mean()) if value_col in part else float("nan")})
    return pd.DataFrame(rows)


def confined_arms(runs: Any, arm_col: str = "arm") -> list[str]:
    """Arms that ran on one place only while the run used several: their delta may carry a GPU effect."""
    if "gpu" not in runs or runs["gpu"].nunique() < 2:
        return []
    return [str(arm) for arm, part in runs.groupby(arm_col, sort=False) if part["gpu"].nunique() == 1]
