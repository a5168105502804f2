"""Install into a venv what `pip install ARGS` would, with uv where it can: `make install` calls this.

usage: python scripts/venv_install.py VENV_PYTHON install|uninstall ARGS...

uv installs the project's pinned set (constraints/cpu.txt), bytecode compiled as pip does, faster than pip
(`benchmarks/clone_to_report.py --pip-reference` times both, cold, in one run).
It is itself installed into the venv from the pin below. uv does not read pip's configuration, so the package
sources pip is configured with (`pip config list`: files and PIP_* variables) are passed on, and several indexes
are weighed as pip weighs them (best match). pip does the work where uv cannot (INSTALLER=pip, or uv fails: say,
an index that only pip's own settings reach), and says so.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

UV_PIN = "uv==0.13.9"
SOURCE_FLAGS = {"find-links": "--find-links", "index-url": "--index-url", "extra-index-url": "--extra-index-url"}


def pip_sources(python: str) -> list[str]:
    """uv flags for the package sources pip is configured with, in pip's order, each once."""
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    flags: list[str] = []
    for line in out.splitlines():
        m = re.match(r"^[^=]*\.(find-links|index-url|extra-index-url)='(.*)'$", line.strip())
        if not m:
            continue
        for value in m.group(2).split():
            pair = [SOURCE_FLAGS[m.group(1)], value]
            if not any(flags[i:i + 2] == pair for i in range(0, len(flags), 2)):
                flags += pair
    if "--extra-index-url" in flags:
        flags += ["--index-strategy", "unsafe-best-match"]  # pip's rule: the best version over all indexes
    return flags


def run(argv: list[str]) -> int:
    print("+ " + shlex.join(argv), flush=True)
    return subprocess.run(argv).returncode


def main(argv: list[str]) -> int:
    python, verb, args = argv[0], argv[1], argv[2:]
    pip = [python, "-m", "pip", verb, "-q", *(["-y"] if verb == "uninstall" else []), *args]
    if os.environ.get("INSTALLER", "uv") == "uv":
        uv = os.path.join(os.path.dirname(python), "uv")
        if os.path.exists(uv) or run([python, "-m", "pip", "install", "-q", UV_PIN]) == 0:
            sources = pip_sources(python) if verb == "install" else []
            # --compile-bytecode: as pip does. Without .pyc files every server start compiles vLLM and torch
            # from source where the environment forbids writing them (PYTHONDONTWRITEBYTECODE), and that compile
            # lands in every start's time to ready (benchmarks/server_start.py measures time to ready).
            compile_flag = ["--compile-bytecode"] if verb == "install" else []
            if run([uv, "pip", verb, "-q", "--python", python, *compile_flag, *sources, *args]) == 0:
                return 0
        print(f"venv_install: uv could not {verb} {shlex.join(args)}; pip does it instead", file=sys.stderr, flush=True)
    return run(pip)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
