"""Client processes: a window's requests on one event loop, or spread over several worker processes where one
Python process cannot read as many streams as the engine writes (issue 29).

`send_window` runs the requests on this process's loop (`run_requests_sync`) or, with `processes` > 1, on that
many worker processes started before the first request is sent (their start-up is neither the window's time nor
its CPU). Each worker gets every n-th request (so each share spans the whole window) and its share of the
concurrency; the records come back in request order, the same records one loop makes. The client's CPU over the
window is every worker's, summed (`clientcpu.combine`), and a window is saturated when any worker's loop was.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Sequence
from typing import Any

from specbook.core.errors import ClientError
from specbook.serve.client import ChatRequest, RequestRecord, run_requests, run_requests_sync
from specbook.serve.clientcpu import ClientCpu, combine

# `processes: auto`: one more client process per this many requests in flight, while cores allow
REQUESTS_PER_PROCESS = 64


def resolve_processes(processes: int | str, concurrency: int) -> int:
    """`auto`: one process per REQUESTS_PER_PROCESS requests in flight, at most half the cores (the server under
    test shares the host); never more processes than requests in flight."""
    if processes == "auto":
        cores = os.cpu_count() or 1
        return max(1, min(math.ceil(concurrency / REQUESTS_PER_PROCESS), cores // 2, concurrency))
    try:
        n = int(processes)
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise ClientError(f"client processes must be >= 1 or 'auto', got {processes!r}")
    return min(n, concurrency)


def shares(n_requests: int, concurrency: int, processes: int) -> list[tuple[list[int], int]]:
    """Per worker: the indices of its requests (every `processes`-th) and its share of the concurrency."""
    out = []
    for w in range(processes):
        idx = list(range(w, n_requests, processes))
        conc = concurrency // processes + (1 if w < concurrency % processes else 0)
        if idx:
            out.append((idx, max(1, conc)))
    return out


def _worker(base_url: str, model: str, payload: list[dict[str, Any]], concurrency: int,
            kwargs: dict[str, Any]) -> tuple[list[dict[str, Any]], ClientCpu | None]:
    """A worker process's share: its records (as dicts) and its client CPU."""
    import asyncio

    cpu: list[ClientCpu] = []
    reqs = [ChatRequest.model_validate(p) for p in payload]
    try:
        records = asyncio.run(run_requests(base_url, model, reqs, concurrency=concurrency, cpu=cpu, **kwargs))
    except ClientError as exc:  # every request of this share failed: the records still go back
        records = getattr(exc, "records", None)
        if records is None:
            raise
    return [r.model_dump() for r in records], (cpu[0] if cpu else None)


def _ready() -> int:
    return os.getpid()


class Workers:
    """Client worker processes started and ready before a window, ended after it; Ctrl-C or an error terminates
    them at once (their connections to the server close with them)."""

    def __init__(self, processes: int) -> None:
        import multiprocessing

        # spawn: the measuring process has threads (Jupyter's, the server watchers); fork would copy their locks
        self.pool = multiprocessing.get_context("spawn").Pool(processes)
        self.processes = processes
        try:
            self.pids = sorted({self.pool.apply_async(_ready).get(timeout=120) for _ in range(4 * processes)})
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.pool.terminate()
        self.pool.join()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def send_window(base_url: str, model: str, requests: Sequence[ChatRequest], *, concurrency: int,
                processes: int | str = 1, cpu: list[ClientCpu] | None = None, **kwargs: Any) -> list[RequestRecord]:
    """A window's requests on one event loop or spread over `processes` worker processes (resolve_processes);
    records in request order (a request's follow-up turns right after it); `cpu` receives the client's CPU (all
    processes together). Raises ClientError, its `.records` attached, when every request failed, as
    `run_requests` does."""
    n = resolve_processes(processes, concurrency)
    if n == 1 or len(requests) < 2:
        return run_requests_sync(base_url, model, requests, concurrency=concurrency, cpu=cpu, **kwargs)
    with Workers(n) as workers:
        return _send_spread(base_url, model, requests, concurrency, workers, kwargs, cpu)


def _send_spread(base_url: str, model: str, requests: Sequence[ChatRequest], concurrency: int, workers: Workers,
                 kwargs: dict[str, Any], cpu: list[ClientCpu] | None) -> list[RequestRecord]:
    kwargs = {k: v for k, v in kwargs.items() if k != "desc"} | {"progress": False}
    parts = shares(len(requests), concurrency, workers.processes)
    t0 = time.perf_counter()
    jobs = [workers.pool.apply_async(_worker, (base_url, model, [requests[i].model_dump() for i in idx], conc,
                                               kwargs)) for idx, conc in parts]
    by_request: dict[int, list[RequestRecord]] = {}
    used: list[ClientCpu] = []
    for (idx, _), job in zip(parts, jobs, strict=True):
        dumped, part_cpu = job.get()
        if part_cpu is not None:
            used.append(part_cpu)
        it = iter(RequestRecord.model_validate(d) for d in dumped)
        for i in idx:  # a request's records: its first turn, then one per follow-up
            by_request[i] = [next(it) for _ in range(1 + len(requests[i].follow_up))]
    records = [r for i in range(len(requests)) for r in by_request[i]]
    if cpu is not None and used:
        whole = combine(used)
        # the window's wall is this process's, from the first share sent to the last one back
        cpu.append(dataclasses.replace(whole, wall_s=max(whole.wall_s, time.perf_counter() - t0)))
    if all(r.error for r in records):
        err = ClientError(f"all {len(records)} requests to {base_url} (model {model!r}) failed; "
                          f"first: {records[0].error}")
        err.records = records  # type: ignore[attr-defined]
        raise err
    return records
