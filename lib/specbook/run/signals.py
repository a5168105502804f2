"""Ctrl-C and SIGTERM on the runner's side of papermill.

While a collection runs, the run guard (specbook.run.runguard) owns both signals; a render (no servers) only
needs SIGTERM to take the Ctrl-C path. After an interrupt, asyncio's complaint about the cell task nobody reads
is dropped.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["quiet_interrupted_cell_task", "sigterm_as_interrupt"]


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (what `timeout` and job schedulers send) takes the Ctrl-C path.

    Ctrl-C lets nbclient interrupt the kernel, so the running cell's `with` blocks stop its servers,
    and lets the runner finalize the manifest; a bare SIGTERM would skip both.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _InterruptedCellTask(logging.Filter):
    """Drops asyncio's "Task exception was never retrieved" for nbclient's cell task that ended in the cell's own
    KeyboardInterrupt: the runner waited for that cell to finish (runguard), so its error reply arrived after the
    runner's KeyboardInterrupt had left nbclient, and nothing will read it; at exit asyncio would print the
    whole cell traceback under the run's "interrupted"."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (str(record.msg).startswith("Task exception was never retrieved")
                    and type(exc).__name__ == "CellExecutionError"
                    and getattr(exc, "ename", None) == "KeyboardInterrupt")


def quiet_interrupted_cell_task() -> None:
    """Install the filter on asyncio's logger (once)."""
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, _InterruptedCellTask) for f in asyncio_log.filters):
        asyncio_log.addFilter(_InterruptedCellTask())
