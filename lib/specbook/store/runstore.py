"""The run folder: raw frames in data/, server logs in logs/, servers.jsonl. All of a run's file IO.

Frames are written the moment they are saved (atomically), so a later failure keeps what was measured; a full
disk raises `DiskFullError` naming the file and leaves the earlier files whole (specbook.core.diskwrite).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbook.core import diskwrite, secrets
from specbook.core.errors import RunError
from specbook.store.manifest import ServerRecord, iso_utc

if TYPE_CHECKING:
    import pandas as pd

SERVERS_NAME = "servers.jsonl"


@dataclass
class ServerRecords:
    """servers.jsonl as read: the records, and the lines that were not one (a line torn by a killed runner)."""

    records: list[ServerRecord] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "servers.jsonl:3: torn or damaged line (212 bytes) skipped: ..."


class RunContext:
    """A run folder: raw frames in data/, server logs in logs/, servers.jsonl, manifest.json.

    Frames are written the moment they are saved, so a later failure keeps what was measured.
    """

    def __init__(self, run_dir: str | os.PathLike[str]):
        if not str(run_dir):
            raise RunError("run_dir is empty: a RunContext needs the run folder the runner made")
        self.run_dir = Path(run_dir).resolve()
        self.data_dir = self.run_dir / "data"
        self.logs_dir = self.run_dir / "logs"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)

    @classmethod
    def from_run_dir(cls, run_dir: str | os.PathLike[str]) -> RunContext:
        """Open an existing run folder (it must exist)."""
        path = Path(run_dir)
        if not path.is_dir():
            raise RunError(f"{path}: run folder does not exist")
        return cls(path)

    def __repr__(self) -> str:
        return f"RunContext({str(self.run_dir)!r})"

    @staticmethod
    def _check_name(name: str, what: str) -> str:
        if not name or not re.fullmatch(r"[A-Za-z0-9_.\-]+", name) or name.startswith("."):
            raise RunError(f"{what} name {name!r}: use letters, digits, '_', '-', '.' only")
        return name

    def log_path(self, server_name: str) -> Path:
        return self.logs_dir / f"{self._check_name(server_name, 'server')}.log"

    def _existing_log(self, server_name: str) -> str | None:
        try:
            path = self.log_path(server_name)
        except RunError:
            return None
        return str(path.relative_to(self.run_dir)) if path.exists() else None

    def record_server(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        versions: dict[str, Any],
        started_at: datetime | float | str | None,
        stopped_at: datetime | float | str | None = None,
        ready_s: float | None = None,
        extra: dict[str, Any] | None = None,
        startup: dict[str, Any] | None = None,
        status: str | None = None,
        error: str | None = None,
    ) -> ServerRecord:
        """Append one server to servers.jsonl (the manifest collects them at the end of the run).

        argv, env, extra and error are written with their secrets hidden (specbook.core.secrets): servers hand over
        an already redacted env, and redacting again keeps a caller's slip from leaking a secret."""
        log = self._existing_log(name)
        record = ServerRecord(
            name=name,
            argv=secrets.redact_argv(argv),
            env=secrets.redact_env(env),
            versions=dict(versions),
            started_at=iso_utc(started_at),
            stopped_at=iso_utc(stopped_at),
            ready_s=ready_s,
            log_path=log,
            startup=dict(startup or {}),
            extra=secrets.redact_data(dict(extra or {})),
            status=status,
            error=None if error is None else secrets.redact_text(error),
        )
        diskwrite.append_line(self.run_dir / SERVERS_NAME, record.model_dump_json())
        return record

    # A server's record is written when its unit ends; until then a pending copy says it runs, so a kernel that
    # dies without ending the unit (OOM-killed, killed by the watchdog) still leaves a record: the runner or the
    # watchdog turns what is pending into records (settle_pending_servers).
    PENDING_DIR = "pending_servers"

    def _pending_path(self, name: str) -> Path:
        return self.data_dir / self.PENDING_DIR / f"{self._check_name(name, 'server')}.json"

    def mark_server_pending(self, name: str, argv: list[str], env: dict[str, str], started_at: Any,
                            extra: dict[str, Any] | None = None) -> None:
        path = self._pending_path(name)
        path.parent.mkdir(exist_ok=True)
        doc = {"name": name, "argv": secrets.redact_argv(argv), "env": secrets.redact_env(env),
               "started_at": iso_utc(started_at), "extra": secrets.redact_data(dict(extra or {}))}
        diskwrite.write_text_atomic(path, json.dumps(doc))

    def clear_server_pending(self, name: str) -> None:
        self._pending_path(name).unlink(missing_ok=True)

    def settle_pending_servers(self, status: str, error: str) -> list[str]:
        """Record every server still pending (its unit never ended) with `status` and `error`; their names."""
        folder = self.data_dir / self.PENDING_DIR
        names = []
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                doc = {"name": path.stem, "argv": []}
            self.record_server(doc["name"], doc.get("argv") or [], doc.get("env") or {}, {},
                               started_at=doc.get("started_at"), stopped_at=datetime.now(timezone.utc),
                               extra=doc.get("extra"), status=status, error=error)
            path.unlink(missing_ok=True)
            names.append(doc["name"])
        return names

    def read_servers(self) -> ServerRecords:
        """Every whole record of servers.jsonl; a line that is not one (torn when a runner was killed mid-append)
        is skipped and said, never the cause of losing the others."""
        path = self.run_dir / SERVERS_NAME
        read = ServerRecords()
        if not path.exists():
            return read
        for lineno, line in enumerate(path.read_bytes().decode("utf-8", "replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                read.records.append(ServerRecord.model_validate_json(line))
            except ValueError as exc:
                first = str(exc).splitlines()[0]
                read.skipped.append(f"{SERVERS_NAME}:{lineno}: torn or damaged line ({len(line)} chars) skipped: "
                                    f"{first}")
        return read

    def servers(self) -> list[ServerRecord]:
        return self.read_servers().records

    def frame_path(self, name: str) -> Path:
        return self.data_dir / f"{self._check_name(name, 'frame')}.parquet"

    def save_frame(self, name: str, df: pd.DataFrame) -> Path:
        return diskwrite.write_atomic(self.frame_path(name), df.to_parquet)

    def append_frame(self, name: str, rows: pd.DataFrame) -> Path:
        """Add rows to a saved frame (or start it) and save at once: what one unit of work measured is on
        disk before the next unit starts."""
        import pandas as pd

        if self.has_frame(name) and len(rows):
            rows = pd.concat([self.load_frame(name), rows], ignore_index=True)
        elif self.has_frame(name):
            return self.frame_path(name)
        return self.save_frame(name, rows)

    def load_frame(self, name: str) -> pd.DataFrame:
        import pandas as pd

        path = self.frame_path(name)
        if not path.exists():
            saved = sorted(p.stem for p in self.data_dir.glob("*.parquet"))
            raise RunError(f"{path}: no saved frame {name!r}; saved frames: {', '.join(saved) or 'none'}")
        return pd.read_parquet(path)

    def has_frame(self, name: str) -> bool:
        return self.frame_path(name).exists()

    def save_json(self, name: str, obj: Any) -> Path:
        path = self.data_dir / f"{self._check_name(name, 'json')}.json"
        return diskwrite.write_text_atomic(path, json.dumps(obj, indent=2, default=str) + "\n")

    def load_json(self, name: str) -> Any:
        path = self.data_dir / f"{self._check_name(name, 'json')}.json"
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise RunError(f"{path}: no saved json {name!r}") from None
