"""A server log read by byte range (what a window's requests made the server write, and what came before) or
by its last lines."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_LOG_POLL_S = 0.02


def log_size(path: Path) -> int:
    """The log's size in bytes now (0 when it does not exist yet)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def read_log_range(path: Path, start: int, end: int | None = None) -> str:
    """The log's bytes [start, end) decoded leniently ('' when it cannot be read); `end` None: to its end."""
    try:
        with open(path, "rb") as fh:
            fh.seek(start)
            data = fh.read(-1 if end is None else max(0, end - start))
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")


def wait_for_log(path: Path, start: int, written: Callable[[str], bool], timeout_s: float) -> bool:
    """Wait until the log's bytes from `start` satisfy `written` (an engine's report of the requests it ended,
    which its logger may write a moment after the response); False if `timeout_s` passed first."""
    deadline = time.monotonic() + timeout_s
    while not written(read_log_range(path, start)):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_LOG_POLL_S)
    return True


@dataclass(frozen=True)
class LogRange:
    """The part of a server log written between two moments (a measurement window): bytes [start, end)."""

    path: Path
    start: int
    end: int | None = None

    def text(self) -> str:
        return read_log_range(self.path, self.start, self.end)

    def text_before(self) -> str:
        """Everything the server wrote before the range (running totals are differenced against it)."""
        return read_log_range(self.path, 0, self.start)


LOG_TAIL_LINES = 40


def tail_lines(path: Path, n: int = LOG_TAIL_LINES) -> str:
    """The last `n` lines of a text file ('' if it does not exist)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return "".join(deque(fh, maxlen=n)).rstrip("\n")
    except FileNotFoundError:
        return ""
