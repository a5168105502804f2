"""How busy the host was during a measured window, apart from the run itself: lock or not, a window measured
while something else ran is told in the report.

Per window: the 1-minute load average at its start and end, and the CPU seconds that processes which are not
the run's own (this process, its descendants, the servers and their workers) took over it. Every window's
figures go to the run's `data/host_load.jsonl`; a window whose other processes used CONTENDED_CORES or more
on average is flagged (`contended`), and every report's summary says how many were.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

HOST_LOAD_NAME = "host_load.jsonl"  # in data/
# Other processes busy this many cores on average over a window: enough to slow a CPU engine measurably
# (two runs side by side share the cores) while the host's own daemons stay far below it.
CONTENDED_CORES = 0.25


@dataclass
class HostSnapshot:
    at: float
    load_1m: float
    cpu: dict[tuple[int, float], float]  # (pid, create_time) -> CPU seconds, processes not the run's own


@dataclass
class HostLoad:
    """The host's load over one window: what `Window.host_load` holds."""

    load_1m_start: float
    load_1m_end: float
    other_cpu_s: float  # CPU seconds of processes not the run's own over the window (those that ended: lost)
    window_s: float
    top: list[str]  # the busiest other processes, "name (pid N): S s"

    @property
    def other_cores(self) -> float:
        return self.other_cpu_s / self.window_s if self.window_s > 0 else 0.0

    @property
    def contended(self) -> bool:
        return self.other_cores >= CONTENDED_CORES

    def record(self, server: str) -> dict[str, Any]:
        return {"server": server, **asdict(self), "other_cores": round(self.other_cores, 3),
                "contended": self.contended}


def _own_pids(extra: Iterable[int]) -> set[int]:
    me = psutil.Process()
    own = {me.pid, os.getppid(), *extra}
    try:
        own.update(p.pid for p in me.children(recursive=True))
    except psutil.Error:
        pass
    return own


def snapshot(own: Iterable[int] = ()) -> HostSnapshot:
    """CPU times of every process that is not the run's own (`own`: the servers' pids, besides this process,
    its parent and its descendants)."""
    skip = _own_pids(own)
    cpu: dict[tuple[int, float], float] = {}
    for p in psutil.process_iter(["create_time", "cpu_times"]):
        if p.pid in skip or p.pid == 0:
            continue
        t, created = p.info.get("cpu_times"), p.info.get("create_time")
        if t is None or created is None:
            continue
        cpu[(p.pid, created)] = t.user + t.system
    return HostSnapshot(time.monotonic(), os.getloadavg()[0], cpu)


def between(before: HostSnapshot, own: Iterable[int] = ()) -> HostLoad:
    """The host's load from `before` to now; processes started meanwhile count from zero."""
    after = snapshot(own)
    used: dict[tuple[int, float], float] = {}
    for key, cpu in after.cpu.items():
        used[key] = max(0.0, cpu - before.cpu.get(key, 0.0))
    names = []
    for (pid, _), cpu_s in sorted(used.items(), key=lambda kv: -kv[1])[:3]:
        if cpu_s < 0.05:
            break
        try:
            name = psutil.Process(pid).name()
        except psutil.Error:
            name = "?"
        names.append(f"{name} (pid {pid}): {cpu_s:.1f} s")
    return HostLoad(round(before.load_1m, 2), round(after.load_1m, 2), round(sum(used.values()), 3),
                    round(after.at - before.at, 3), names)


def jsonl_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every whole JSON line of a per-window record file (a torn last line is skipped); [] where it is unreadable."""
    out = []
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def read_records(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The run's per-window host load records (a torn last line is skipped)."""
    return jsonl_records(Path(run_dir) / "data" / HOST_LOAD_NAME)


def contention_line(run_dir: str | os.PathLike[str] | None) -> str | None:
    """One sentence for the report when a window was measured under contention; None when none was."""
    if run_dir is None:
        return None
    records = read_records(run_dir)
    hit = [r for r in records if r.get("contended")]
    if not hit:
        return None
    worst = max(hit, key=lambda r: r.get("other_cores", 0.0))
    return (f"{len(hit)} of {len(records)} measured windows ran under contention: other processes on this host "
            f"took {CONTENDED_CORES:g} cores or more on average (at most {worst['other_cores']:.2f} cores, in "
            f"{worst['server']}; load average {worst['load_1m_end']:g}; busiest: "
            f"{', '.join(worst.get('top') or []) or 'not seen'}); their throughput and latency may be lower than "
            "on a quiet host (data/host_load.jsonl)")
