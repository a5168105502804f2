"""Console progress of a run (which unit of how many, server start, requests and tok/s, ETA), kept out of the report.

A notebook kernel's stdout and stderr become cell outputs (ipykernel forwards even writes to the raw file
descriptors), so progress printed inside the kernel would land in the rendered report. Progress lines go
instead to the file named by $SPECBOOK_PROGRESS_FILE; the runner sets it for the kernel and copies each new
line onto its own terminal (`console`). Without the variable (a notebook opened in Jupyter) lines go to the
kernel's stderr: the person running the cells sees them where they run.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

ENV = "SPECBOOK_PROGRESS_FILE"
PREFIX = "[specbook] "


def note(message: str) -> None:
    """One progress line: appended to $SPECBOOK_PROGRESS_FILE, else written to stderr."""
    line = f"{PREFIX}{message}\n"
    path = os.environ.get(ENV)
    if path:
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(line)
            return
        except OSError:  # progress must never fail a run
            pass
    sys.stderr.write(line)


def duration(seconds: float | None) -> str:
    """'42 s' / '3 min 05 s' / '1 h 02 min'; '?' when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


def eta(elapsed_s: float, done: int, total: int) -> float | None:
    """Seconds left at the mean pace of the units done so far; None before the first unit ends."""
    if done <= 0 or total <= 0:
        return None
    return max(0.0, elapsed_s / done * (total - done))


def requests_line(ok: int, total: int, completion_tokens: int, wall_s: float) -> str:
    """'24/24 requests ok, 812 tokens in 31 s (26.2 tok/s)'."""
    rate = completion_tokens / wall_s if wall_s > 0 else float("nan")
    return f"{ok}/{total} requests ok, {completion_tokens} tokens in {duration(wall_s)} ({rate:.1f} tok/s)"


class Units:
    """Which unit of work of how many, with an ETA from the pace so far (skipped units do not count)."""

    def __init__(self, what: str, total: int, *, clock=time.monotonic):
        self.what, self.total, self.clock = what, total, clock
        self.index = 0
        self.timed = 0
        self.t0 = clock()
        self.timed_s = 0.0
        self._started: float | None = None

    def start(self, label: str) -> str:
        """The next unit starts (the one before it, if still open, ends here)."""
        self.done()
        self.index += 1
        self._started = self.clock()
        # this unit and the ones after it, at the mean pace of the units timed so far
        left = self.timed_s / self.timed * (self.total - self.index + 1) if self.timed else None
        text = f"{self.what} {self.index}/{self.total}: {label}" + (f" (ETA {duration(left)})" if left is not None
                                                                    else "")
        note(text)
        return text

    def skip(self, label: str) -> str:
        self.index += 1
        text = f"{self.what} {self.index}/{self.total}: {label} already done (resumed run), skipped"
        note(text)
        return text

    def done(self) -> None:
        if self._started is not None:
            self.timed += 1
            self.timed_s += self.clock() - self._started
            self._started = None


def _copy_new_lines(path: Path, pos: int, out: IO[str]) -> int:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            f.seek(pos)
            chunk = f.read()
    except OSError:
        return pos
    if chunk:
        # on a terminal, clear the line papermill's cell bar is drawn on first (it redraws below ours)
        out.write(("\r\x1b[2K" if getattr(out, "isatty", lambda: False)() else "") + chunk)
        out.flush()
    return pos + len(chunk.encode("utf-8"))


@contextmanager
def console(progress_file: str | os.PathLike[str], out: IO[str] | None = None, poll_s: float = 0.5) -> Iterator[Path]:
    """While the body runs, kernels started from this process write progress to `progress_file`, and each new
    line is copied to `out` (the runner's stderr)."""
    out = out or sys.stderr
    path = Path(progress_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    start = path.stat().st_size
    previous = os.environ.get(ENV)
    os.environ[ENV] = str(path)
    stop = threading.Event()
    pos = [start]

    def tail() -> None:
        while not stop.wait(poll_s):
            pos[0] = _copy_new_lines(path, pos[0], out)

    thread = threading.Thread(target=tail, name="specbook-progress", daemon=True)
    thread.start()
    try:
        yield path
    finally:
        stop.set()
        thread.join(timeout=2)
        _copy_new_lines(path, pos[0], out)
        if previous is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = previous
