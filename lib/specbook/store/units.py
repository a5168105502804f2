"""A run folder's units of work: which are done, and setting aside what an unfinished one left.

A unit is what an experiment's collect appends in one go (a knob A/B run = arm x sweep, a config-flip arm, a
cross-engine lane x side server). Each experiment declares its units once (`Units`, registered by name); its
collect skips the keys `done_units` returns, and `set_aside_unfinished` moves the rows, logs and server records
of every other unit out of the way before a resumed part re-runs them (specbook.run.resume). Nothing is deleted:
what was set aside lies in `unfinished/<n>/` of the run folder.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbook.core.diskwrite import write_atomic, write_text_atomic
from specbook.core.envline import ENV_PREFIX
from specbook.core.errors import RunError
from specbook.store.runstore import SERVERS_NAME

if TYPE_CHECKING:
    import pandas as pd

    from specbook.store.runstore import RunContext

__all__ = [
    "SET_ASIDE_DIR",
    "Units",
    "done_units",
    "register_units",
    "set_aside_folder",
    "set_aside_unfinished",
    "units_of",
]

SET_ASIDE_DIR = "unfinished"


@dataclass(frozen=True)
class Units:
    """How an experiment's collect saves its units of work.

    done_frame: the frame whose row marks a unit done; collect appends it last, after the unit's other rows.
    key:        the columns naming a unit, in every frame of `frames`.
    frames:     the frames whose rows belong to units (done_frame among them).
    server:     the column of done_frame naming the unit's server (its logs/NAME.log, its servers.jsonl record).
    done_when:  column values a done_frame row must have to count as done (knob A/B also appends failed runs).
    key_defaults: the value of a key column in frames saved before that column existed.
    """

    done_frame: str
    key: tuple[str, ...]
    frames: tuple[str, ...]
    server: str
    done_when: dict[str, Any] = field(default_factory=dict)
    key_defaults: dict[str, Any] = field(default_factory=dict)

    def upgraded(self, frame: pd.DataFrame) -> pd.DataFrame:
        """`frame` with every absent key column that has a default filled in."""
        absent = {col: value for col, value in self.key_defaults.items() if col not in frame}
        return frame.assign(**absent) if absent else frame


_UNITS: dict[str, Units] = {}


def register_units(experiment: str, units: Units) -> Units:
    _UNITS[experiment] = units
    return units


def units_of(experiment: str) -> Units | None:
    return _UNITS.get(experiment)


def _done_rows(ctx: RunContext, units: Units) -> pd.DataFrame | None:
    if not ctx.has_frame(units.done_frame):
        return None
    frame = units.upgraded(ctx.load_frame(units.done_frame))
    missing = [col for col in units.key if col not in frame]
    if missing:  # saved before the experiment's units had this key (an older specbook)
        raise RunError(f"{ctx.frame_path(units.done_frame)}: has no {', '.join(missing)} column(s); cannot tell "
                       "which units are done")
    for col, value in units.done_when.items():
        frame = frame[frame[col] == value] if col in frame else frame.iloc[0:0]
    return frame


def done_units(ctx: RunContext, units: Units) -> set[tuple[Any, ...]]:
    """Keys of the units the run folder holds as done (empty in a fresh run)."""
    rows = _done_rows(ctx, units)
    if rows is None:
        return set()
    return set(rows[list(units.key)].itertuples(index=False, name=None))


def _done_servers(ctx: RunContext, units: Units) -> set[str]:
    rows = _done_rows(ctx, units)
    return set() if rows is None or units.server not in rows else {str(s) for s in rows[units.server]}


def _aside_folder(ctx: RunContext) -> Path:
    base = ctx.run_dir / SET_ASIDE_DIR
    n = 1
    while (base / str(n)).exists():
        n += 1
    return base / str(n)


def set_aside_unfinished(ctx: RunContext, units: Units) -> dict[str, Any]:
    """Move what unfinished units left (rows of data/*.parquet, logs/*.log, servers.jsonl records, stray temp
    files) into unfinished/<n>/, keeping the done units' as they are. Returns what moved ({} when nothing)."""
    servers = _done_servers(ctx, units)
    folder = _aside_folder(ctx)
    moved: dict[str, Any] = {"rows": {}, "logs": [], "servers": [], "temp_files": []}

    def target(rel: str) -> Path:
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    for tmp in sorted(ctx.data_dir.glob("*.tmp")):  # a write the kill cut short (first: saves below reuse the name)
        os.replace(tmp, target(f"data/{tmp.name}"))
        moved["temp_files"].append(tmp.name)
    moved["rows"] = _set_aside_rows(ctx, units, done_units(ctx, units), target)
    for log in sorted(ctx.logs_dir.glob("*.log")):
        # NAME.log, or NAME.<n>.log for a relaunch's earlier log; only server logs (the runner keeps others there)
        if log.stem not in servers and log.stem.split(".")[0] not in servers and _is_server_log(log):
            os.replace(log, target(f"logs/{log.name}"))
            moved["logs"].append(log.name)
    moved["servers"] = _set_aside_server_records(ctx, servers, target)
    if not any(moved.values()):
        return {}
    moved["folder"] = str(folder.relative_to(ctx.run_dir))
    write_text_atomic(folder / "set_aside.json", json.dumps(moved, indent=1) + "\n")
    return moved


def _set_aside_rows(ctx: RunContext, units: Units, done: set[tuple[Any, ...]],
                    target: Callable[[str], Path]) -> dict[str, int]:
    """The unfinished units' rows of every unit frame into the set-aside folder; how many rows left each frame."""
    import pandas as pd

    moved: dict[str, int] = {}
    for name in units.frames:
        if not ctx.has_frame(name):
            continue
        frame = units.upgraded(ctx.load_frame(name))
        if not all(col in frame for col in units.key):
            raise RunError(f"{ctx.frame_path(name)}: has no {', '.join(units.key)} column(s); cannot tell its units")
        keys = pd.Series(list(frame[list(units.key)].itertuples(index=False, name=None)), index=frame.index)
        unfinished = ~keys.isin(done)
        if unfinished.any():
            write_atomic(target(f"data/{name}.parquet"), frame[unfinished].reset_index(drop=True).to_parquet)
            ctx.save_frame(name, _integers_back(frame[~unfinished].reset_index(drop=True), frame[unfinished]))
            moved[name] = int(unfinished.sum())
    return moved


def _integers_back(kept: pd.DataFrame, moved: pd.DataFrame) -> pd.DataFrame:
    """The kept rows with the integer columns they had before a moved row made them float: a failed unit's row
    lacks the counts an ok row has (NaN), and appending it turned those int64 columns into float64. A resumed
    run's frames must read like an uninterrupted run's, dtypes included. (A float column whose kept values are
    all whole numbers comes back int64 as well; its values are unchanged.)"""
    import numpy as np

    out = kept.copy()
    for col in kept.columns:
        values = kept[col]
        if (values.dtype == np.float64 and len(values) and moved[col].isna().any() and values.notna().all()
                and bool((values == np.floor(values)).all()) and bool((values.abs() < 2**53).all())):
            out[col] = values.astype(np.int64)
    return out


def set_aside_folder(folder: str | os.PathLike[str]) -> Path | None:
    """A folder an unfinished unit's earlier attempt wrote (trace records, profiler traces) renamed beside it,
    NAME.unfinished-<n>: kept, never read as the new attempt's. Returns where it went (None: no such folder)."""
    folder = Path(folder)
    if not folder.exists():
        return None
    n = 1
    while folder.with_name(f"{folder.name}.unfinished-{n}").exists():
        n += 1
    target = folder.with_name(f"{folder.name}.unfinished-{n}")
    folder.rename(target)
    return target


def _is_server_log(path: Path) -> bool:
    """A server's log starts with the `Env:` line its launcher writes (specbook.core.envline)."""
    with open(path, "rb") as fh:
        return fh.read(len(ENV_PREFIX)) == ENV_PREFIX.encode()


def _set_aside_server_records(ctx: RunContext, servers: set[str], target: Callable[[str], Path]) -> list[str]:
    """servers.jsonl records of no done unit (torn lines among them) into the set-aside folder; their names."""
    path = ctx.run_dir / SERVERS_NAME
    if not path.exists():
        return []
    keep, aside = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = _json_or_none(line)  # a torn line (the runner died mid-write) belongs to no done unit
        name = record.get("name") if isinstance(record, dict) else None
        (keep if name in servers else aside).append(line)
    if not aside:
        return []
    write_text_atomic(target(SERVERS_NAME), "\n".join(aside) + "\n")
    write_text_atomic(path, "".join(ln + "\n" for ln in keep))
    return [r["name"] if isinstance(r := _json_or_none(ln), dict) and r.get("name")
            else f"(unreadable line {ln[:40]!r})" for ln in aside]


def _json_or_none(line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None
