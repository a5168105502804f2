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
