"""One exception hierarchy for the whole package: every message names the field, file or process."""

from __future__ import annotations


class SpecbookError(Exception):
    """Base of every error specbook raises on purpose."""


class ParamsError(SpecbookError):
    """Params that fail validation; the message names the field and the file."""


class ModelPrepareError(SpecbookError):
    """The embedded models could not be prepared or verified."""


class ModelNotPreparedError(ModelPrepareError):
    """A model folder was asked for before `specbook models prepare` made it."""


class ServerError(SpecbookError):
    """An engine server failed; carries the tail of its log."""

    def __init__(self, message: str, log_path: str | None = None, log_tail: str = ""):
        self.log_path = log_path
        self.log_tail = log_tail
        full = message
        if log_path:
            full += f"\n  log: {log_path}"
        if log_tail:
            full += "\n  --- log tail ---\n" + log_tail
        super().__init__(full)


class ServerStartError(ServerError):
    """The server died or did not become ready in time."""


class ServerDiedError(ServerError):
    """The server process ended while work was in flight (a crash, the OOM killer, a kill)."""


class ServerHungError(ServerError):
    """The server process lives but stopped making progress (no token for the stall bound)."""


class ServerTeardownError(ServerError):
    """Processes of the server survived teardown."""


class EngineError(SpecbookError):
    """An engine adapter cannot build or probe what was asked."""


class UnknownEngineError(EngineError):
    """No engine adapter is registered under that name."""


class PinMismatchError(SpecbookError):
    """A declared version pin does not match what was found."""


class ClientError(SpecbookError):
    """Requests to a server failed beyond what the caller tolerates."""


class WorkloadError(SpecbookError):
    """A workload (dataset) cannot be loaded; names the path or dataset."""


class IngestError(SpecbookError):
    """A log file cannot be ingested at all (missing, unreadable)."""


class RunError(SpecbookError):
    """A book run failed; the run folder keeps what was measured."""


class DiskFullError(RunError):
    """A run's file could not be written: the disk is full (or a file size limit or quota was hit); names the file."""


class NotebookExecutionError(RunError):
    """A notebook cell failed; names the cell."""


class AttributionError(SpecbookError):
    """A run's arm cannot be derived from what its server really ran with."""


class ExperimentError(SpecbookError):
    """An experiment's inputs are inconsistent (refusals with a reason)."""


class MetricsError(SpecbookError):
    """A server's /metrics cannot be scraped or parsed, or a counter went down (restart); names the URL or counter."""


# Lines that name a failure's cause, in a message and the log tail it carries: what a cut must keep
_CAUSE = None
ERROR_CHARS = 2000  # what the console, the manifest and a server record keep of one error


def keep_cause(text: str, limit: int = ERROR_CHARS) -> str:
    """`text` cut to about `limit` characters keeping what names the cause: its first line (the message), the
    lines that say error, exception, errno, traceback, killed or died (the last of them first: a traceback's
    last frames, vLLM's `OSError: [Errno 98] Address already in use` under its route listing), then its last
    lines; every gap is marked with the number of lines left out."""
    global _CAUSE
    if len(text) <= limit:
        return text
    import re

    if _CAUSE is None:
        _CAUSE = re.compile(r"error|exception|errno|traceback|fatal|killed|died|abort|refused|denied|"
                            r"no such file|not found|out of memory|---->|^\s*File \"", re.IGNORECASE)
    lines = [ln if len(ln) <= 300 else ln[:297] + "..." for ln in text.splitlines()]
    keep: set[int] = set()
    used = 0

    def take(i: int, budget: int) -> bool:
        nonlocal used
        if i in keep:
            return True
        if used + len(lines[i]) + 1 > budget:
            return False
        keep.add(i)
        used += len(lines[i]) + 1
        return True

    take(0, limit)
    for i in range(1, min(3, len(lines))):  # the message's own lines ("  log: PATH")
        if lines[i].startswith("  log:"):
            take(i, limit)
    cause_budget = int(limit * 0.7)
    for i in reversed(range(len(lines))):
        if _CAUSE.search(lines[i]):
            take(i, cause_budget)
    for i in reversed(range(len(lines))):
        if not take(i, limit - 60):
            break
    out, gap = [], 0
    for i, line in enumerate(lines):
        if i in keep:
            if gap:
                out.append(f"  [... {gap} line{'s' if gap != 1 else ''} left out ...]")
                gap = 0
            out.append(line)
        else:
            gap += 1
    if gap:
        out.append(f"  [... {gap} line{'s' if gap != 1 else ''} left out ...]")
    return "\n".join(out)
