"""The measuring client's own CPU use over a window: is the client, not the engine, the limit?

One asyncio event loop runs a window's requests. `LoopMeter` reads, on the loop's thread, the thread's CPU time
(from the OS), the process's CPU time and the thread's run-queue wait (/proc/thread-self/schedstat: time spent
runnable but not running) at the window's start and end. A loop that was busy (running, or runnable and waiting
for a core) SATURATED_SHARE of the window or more was near saturation: chunks waited in the socket buffers for it,
and the window's tok/s and latencies may be the client's, not the engine's. The wait counts because a client
starved of a core (niced, or on a host whose cores the engine takes) is as late as one with too much to do. Each window's figures go to the run's `data/client_cpu.jsonl`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CLIENT_CPU_NAME = "client_cpu.jsonl"  # in data/
SATURATED_SHARE = 0.8  # of the window, for the event loop's thread: running or waiting for a core
_SCHEDSTAT = Path("/proc/thread-self/schedstat")


def _runq_wait_s() -> float | None:
    """This thread's time spent waiting on a run queue so far (Linux schedstat), None where unreadable."""
    try:
        fields = _SCHEDSTAT.read_text().split()
        return int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class ClientCpu:
    """The client's CPU over one window: wall time, its loop thread's CPU and run-queue wait, its process's CPU
    (the loop, plus any other thread of the process), the number of requests it sent."""

    wall_s: float
    loop_cpu_s: float
    process_cpu_s: float
    runq_wait_s: float | None = None
    requests: int = 0
    processes: int = 1
    busiest_share: float | None = None  # several client processes: the busiest loop's busy_share

    @property
    def loop_share(self) -> float:
        """The loop thread's CPU over the wall time: 1.0 is one core busy all the window (per process)."""
        return self.loop_cpu_s / (self.wall_s * self.processes) if self.wall_s > 0 else float("nan")

    @property
    def runq_share(self) -> float | None:
        """Share of the window the loop was runnable but waited for a core (the host took it)."""
        if self.runq_wait_s is None or self.wall_s <= 0:
            return None
        return self.runq_wait_s / (self.wall_s * self.processes)

    @property
    def busy_share(self) -> float:
        """Share of the window the loop ran or waited for a core to run (where the wait is readable)."""
        return self.loop_share + (self.runq_share or 0.0)

    @property
    def saturated(self) -> bool:
        """The loop (any loop, of several client processes) was busy SATURATED_SHARE of the window or more."""
        return max(self.busy_share, self.busiest_share or 0.0) >= SATURATED_SHARE

    @property
    def cpu_ms_per_request(self) -> float | None:
        return 1000 * self.process_cpu_s / self.requests if self.requests else None

    def record(self, server: str) -> dict[str, Any]:
        """One line of data/client_cpu.jsonl."""
        return {"server": server, **asdict(self), "loop_share": self.loop_share, "runq_share": self.runq_share,
                "busy_share": self.busy_share, "saturated": self.saturated}

    def columns(self) -> dict[str, object]:
        """The client_* columns of a windows table."""
        return {"client_loop_share": self.loop_share, "client_runq_share": self.runq_share,
                "client_busy_share": self.busy_share,
                "client_cpu_ms_per_req": self.cpu_ms_per_request, "client_saturated": self.saturated}

    def note(self, server: str) -> str | None:
        """The report's line for a saturated client, None otherwise."""
        if not self.saturated:
            return None
        return (f"{server}: the client's event loop was busy {self.busy_share:.0%} of the window (ran "
                f"{self.loop_share:.0%}, waited for a core {self.runq_share or 0.0:.0%}; saturated at "
                f"{SATURATED_SHARE:.0%}): its tok/s and latencies may be the client's limit, not the engine's")


def combine(parts: list[ClientCpu]) -> ClientCpu:
    """Several client processes' figures over one window as one: CPU and waits summed, the longest wall, the
    busiest loop kept (one saturated process is a saturated client)."""
    waits = [p.runq_wait_s for p in parts]
    return ClientCpu(
        wall_s=max(p.wall_s for p in parts), loop_cpu_s=sum(p.loop_cpu_s for p in parts),
        process_cpu_s=sum(p.process_cpu_s for p in parts),
        runq_wait_s=None if any(w is None for w in waits) else sum(w for w in waits if w is not None),
        requests=sum(p.requests for p in parts), processes=sum(p.processes for p in parts),
        busiest_share=max(max(p.busy_share, p.busiest_share or 0.0) for p in parts))


class LoopMeter:
    """Started on the event loop's thread; `stop()` there gives the ClientCpu since the start."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.thread0 = time.thread_time()
        self.process0 = time.process_time()
        self.runq0 = _runq_wait_s()

    def stop(self, requests: int = 0) -> ClientCpu:
        runq = _runq_wait_s()
        return ClientCpu(
            wall_s=time.perf_counter() - self.t0, loop_cpu_s=time.thread_time() - self.thread0,
            process_cpu_s=time.process_time() - self.process0,
            runq_wait_s=None if runq is None or self.runq0 is None else runq - self.runq0, requests=requests)


def read_records(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's per-window client CPU records (a torn last line is skipped)."""
    from specbook.serve.hostload import jsonl_records

    return jsonl_records(Path(run_dir) / "data" / CLIENT_CPU_NAME)


def client_line(run_dir: str | Path | None) -> str | None:
    """One sentence for the report when the client's loop was near saturation in a window; None when never."""
    if run_dir is None:
        return None
    records = read_records(run_dir)
    hit = [r for r in records if r.get("saturated")]
    if not hit:
        return None
    worst = max(hit, key=_busy)
    return (f"{len(hit)} of {len(records)} measured windows had a near-saturated client: its event loop ran or "
            f"waited for a core {SATURATED_SHARE:.0%} of the window or more (at most {_busy(worst):.0%}, in "
            f"{worst['server']}); their tok/s and latencies may be the client's limit, not the engine's "
            "(data/client_cpu.jsonl)")


def _busy(record: dict[str, Any]) -> float:
    """A record's busy share (records written before it carried one: its loop share)."""
    value = record.get("busy_share", record.get("loop_share"))
    return float(value) if isinstance(value, (int, float)) else 0.0
