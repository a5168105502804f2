"""Report tables of provenance: the host row and the per-server table every report ends with."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbook.core.errors import RunError
from specbook.store.fingerprint import hardware_fingerprint
from specbook.store.manifest import ServerRecord, read_manifest
from specbook.store.runstore import RunContext

if TYPE_CHECKING:
    import pandas as pd

    from specbook.engines.base import Engine


def _adapter(engine: str | None) -> Engine | None:
    """The registered adapter of a recorded engine name; None for a name no longer (or never) registered."""
    from specbook.core.errors import UnknownEngineError
    from specbook.engines import get_engine

    try:
        return get_engine(engine or "")
    except UnknownEngineError:
        return None


def startup_facts_of(engine: str, log: Path) -> dict[str, Any] | None:
    """What the engine's own parser reads from a server log about its start; None for an unknown engine."""
    adapter = _adapter(engine)
    return adapter.startup_facts(log) if adapter is not None else None


def server_startup(s: ServerRecord, run_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """A server's start-up facts: what its engine's parser reads from its log in the run folder now (so a better
    parser improves old runs too) over what was recorded at the run (the harness's process count; everything
    when the log is gone or the engine unknown)."""
    log = Path(run_dir) / s.log_path if run_dir is not None and s.log_path else None
    engine = s.versions.get("engine")
    # a log that is gone (or only its .gz copy left) is the engine parser's to find: engines.common.facts_of_log
    facts = startup_facts_of(engine, log) if engine and log is not None else None
    return {**(s.startup or {}), **(facts or {})}


def start_breakdown(startup: Mapping[str, Any], ready_s: float | None) -> dict[str, float]:
    """Seconds per part of a server's start (engines.base.START_PARTS, in order): the parts its log tells
    (`start_parts`) and what the harness's ready_s holds beyond them, put into `imports` where the log cannot
    tell when the process started (its first line is then where the parts begin), else into `ready` (the
    readiness poll), never below 0 (a log clock that ran ahead of the harness's monotonic one). {} where the
    log tells no part (runs recorded before start_parts, or a log that is gone)."""
    from specbook.engines.base import START_PARTS

    parts = {k: float(v) for k, v in (startup.get("start_parts") or {}).items() if isinstance(v, (int, float))}
    if not parts:
        return {}
    if ready_s is not None:
        rest = ready_s - sum(parts.values())
        into = "ready" if "imports" in parts else "imports"
        parts[into] = max(parts.get(into, 0.0) + rest, 0.0)
    order = {name: i for i, name in enumerate(START_PARTS)}
    return {k: round(parts[k], 2) for k in sorted(parts, key=lambda k: order.get(k, len(order)))}


_PART_LABELS = {"kv_cache": "KV cache"}


def describe_start(parts: Mapping[str, float], startup: Mapping[str, Any] | None = None) -> str | None:
    """`imports N s, spawn N s, setup N s, weights N s, compile N s (cache miss), graphs N s (G), KV cache N s,
    ready N s`: the servers table's start_up cell (seconds to 0.1 below 10 s; the compile
    cache's hit or miss and the number of graphs captured where the log says them); None without parts."""
    if not parts:
        return None
    startup = startup or {}
    notes = {"compile": f"cache {startup['compile_cache']}" if startup.get("compile_cache") else None,
             "graphs": str(sum(startup["graphs_captured"].values())) if startup.get("graphs_captured") else None}
    words = []
    for name, seconds in parts.items():
        label = _PART_LABELS.get(name, name)
        text = f"{label} {seconds:.0f} s" if seconds >= 10 else f"{label} {seconds:.1f} s"
        words.append(text + (f" ({notes[name]})" if notes.get(name) else ""))
    return ", ".join(words)


def host_summary(hardware: dict[str, Any]) -> dict[str, Any]:
    """One flat row of a hardware_fingerprint(): host, CPU, memory and each GPU as nvidia-smi names it."""
    cpu = hardware.get("cpu") or {}
    row: dict[str, Any] = {
        "host": hardware.get("hostname"),
        "kernel": hardware.get("kernel"),
        "cpu": cpu.get("model_name"),
        "cpu_threads": cpu.get("threads"),
        "cpu_affinity": cpu.get("affinity"),
        "memory_gib": round(hardware["memory_total_bytes"] / 2**30, 1) if hardware.get("memory_total_bytes") else None,
    }
    gpus = (hardware.get("gpu") or {}).get("nvidia") or []
    row["gpus"] = len(gpus)
    if gpus:
        names = sorted({g.get("name", "?") for g in gpus})
        row["gpu"] = ", ".join(names)
        row["gpu_driver"] = ", ".join(sorted({g.get("driver_version", "?") for g in gpus}))
        row["gpu_memory"] = ", ".join(sorted({g.get("memory.total", "?") for g in gpus}))
        row["compute_cap"] = ", ".join(sorted({g.get("compute_cap", "?") for g in gpus}))
    cuda = hardware.get("cuda") or {}  # absent in manifests written before it was fingerprinted
    if cuda.get("driver") or cuda.get("torch"):
        row["cuda_driver"], row["cuda_torch"] = cuda.get("driver"), cuda.get("torch")
    return row


def version_keys(versions: dict[str, str]) -> tuple[str, ...]:
    """The versions a server's row shows: those its engine names (`version_keys`, an optional attribute)."""
    return tuple(getattr(_adapter(versions.get("engine")), "version_keys", ()))


def build_of(versions: dict[str, str]) -> str | None:
    """A server's build in its engine's own words (DescribesBuild, optional); None where it has none."""
    from specbook.engines import capability
    from specbook.engines.base import DescribesBuild

    adapter = _adapter(versions.get("engine"))
    describer = capability(adapter, DescribesBuild) if adapter is not None else None
    return describer.describe_build(versions) if describer is not None else None


def servers_summary(servers: list[ServerRecord], run_dir: str | os.PathLike[str] | None = None) -> pd.DataFrame:
    """One row per server: engine versions, the attention backends its log says target and draft used, start figures
    (`start_up`: where its ready_s went, start_breakdown in words).

    With the run folder, the facts are read again from each server's log (so a better parser improves old
    runs too); without it, or when the log is gone, the facts recorded at the run are shown.
    """
    import pandas as pd

    shown = list(dict.fromkeys(k for s in servers for k in version_keys(s.versions)))  # one column order for all
    rows = []
    for s in servers:
        facts = server_startup(s, run_dir)
        row: dict[str, Any] = {"server": s.name, "engine": s.versions.get("engine")}
        row["build"] = build_of(s.versions)  # every row, so the column keeps its place
        row.update({k: s.versions[k] for k in shown if k in s.versions})
        for role in ("target", "draft"):
            row[f"{role}_attention_backend"] = facts.get(f"attention_backend_{role}")
            row[f"{role}_backend_selected_by"] = facts.get(f"attention_backend_{role}_selected_by")
        row["flash_attn_version"] = facts.get("flash_attn_version")
        row["kv_cache_tokens"] = facts.get("kv_cache_tokens")
        row["init_engine_s"] = facts.get("init_engine_s")
        row["ready_s"] = s.ready_s
        row["start_up"] = describe_start(start_breakdown(facts, s.ready_s), facts)
        rows.append(row)
    return pd.DataFrame(rows)


def where_it_ran(run_dir: str | os.PathLike[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(host row, servers table) of a run, from its manifest and servers.jsonl: the report's provenance."""
    import pandas as pd

    try:
        hardware, source = read_manifest(run_dir).hardware, "manifest"
    except RunError:  # a notebook run by papermill alone: no manifest, so fingerprint this host now
        hardware, source = hardware_fingerprint(), "this host now (no manifest)"
    host = pd.DataFrame([{**host_summary(hardware), "source": source}])
    return host, servers_summary(RunContext(run_dir).servers(), run_dir)
