"""One run's servers at a time on a host: two runs side by side measure each other (each at a fraction of its
speed, with nothing in either report to say so).

A run that starts servers holds an exclusive flock on one file per host (`SPECBOOK_HOST_LOCK`, default
`/tmp/specbook-host.lock`, so every checkout and user of the host shares it) from before its kernel starts its
first server until its last is gone. The holder writes its pid and run folder into the file; a second run
waits, saying for whom, or with `--no-wait` is refused naming the holder. `--no-lock` runs without it (the
manifest records that). The lock is the kernel's flock, so a killed holder releases it at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from specbook.core.errors import RunError

LOCK_ENV = "SPECBOOK_HOST_LOCK"
DEFAULT_LOCK = "/tmp/specbook-host.lock"
_POLL_S = 0.25
UNKNOWN_HOLDER = "a process that has not said who it is"


class HostBusyError(RunError):
    """Another run holds the host lock and the caller asked not to wait."""


def lock_path() -> Path:
    return Path(os.environ.get(LOCK_ENV) or DEFAULT_LOCK)


@dataclass
class HostLock:
    """What the manifest records of the lock: held or not, where, how long the run waited and for whom."""

    mode: str  # "held", or "off" (--no-lock)
    path: str
    waited_s: float = 0.0
    waited_for: str | None = None

    def record(self) -> dict[str, object]:
        return {"mode": self.mode, "path": self.path, "waited_s": round(self.waited_s, 2),
                "waited_for": self.waited_for}


def holder(path: Path | None = None) -> str:
    """Who holds the lock, as its holder wrote it ("pid N, run folder R"), or what is known."""
    try:
        doc = json.loads((path or lock_path()).read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        doc = {}
    if not doc.get("pid"):
        return UNKNOWN_HOLDER
    return f"pid {doc.get('pid')}, run folder {doc.get('run_dir')}"


def _open(path: Path) -> IO[str]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    with contextlib.suppress(OSError):  # a lock file another user made stays theirs
        os.fchmod(fd, 0o666)
    return os.fdopen(fd, "r+", encoding="utf-8")


@contextmanager
def held(run_dir: Path, *, wait: bool = True, enabled: bool = True,
         say: Callable[[str], None] | None = None) -> Iterator[HostLock]:
    """Hold the host lock inside (waiting for it, or HostBusyError with `wait=False`); `enabled=False`: no lock."""
    path = lock_path()
    if not enabled:
        yield HostLock("off", str(path))
        return
    try:
        fh = _open(path)
    except OSError as exc:
        raise RunError(f"{path}: cannot open the host lock ({exc}); set {LOCK_ENV} to a writable path, or run "
                       "with --no-lock") from None
    t0 = time.monotonic()
    waited_for = None
    got = False
    try:
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                got = True
                break
            except BlockingIOError:
                who = holder(path)
                if not wait:
                    raise HostBusyError(f"another run holds the host lock {path} ({who}); its servers would "
                                        "measure against this run's: wait for it (run without --no-wait), or "
                                        "--no-lock to run anyway (recorded in the manifest)") from None
                # a holder letting go empties the file just before its flock goes: keep the name it said
                if who != waited_for and not (waited_for and who == UNKNOWN_HOLDER):
                    waited_for = who
                    if say is not None:
                        say(f"waiting for the host lock {path}: held by {who}")
                time.sleep(_POLL_S)
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"pid": os.getpid(), "run_dir": str(run_dir), "since": time.time()}))
        fh.flush()
        yield HostLock("held", str(path), time.monotonic() - t0, waited_for)
    finally:
        if got:  # the holder's name goes with it; a refused run leaves the holder's in place
            with contextlib.suppress(OSError):
                fh.seek(0)
                fh.truncate()
        fh.close()  # closing the file releases the flock
