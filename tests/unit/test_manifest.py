"""specbook.store.manifest: the Manifest schema and its atomic round trip, ServerRecord, UTC timestamps."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from pydantic import ValidationError

from specbook.core.errors import RunError
from specbook.store.manifest import (
    MANIFEST_NAME,
    GitInfo,
    Manifest,
    ServerRecord,
    iso_utc,
    read_manifest,
    utc_now,
    write_manifest,
)


def _manifest(**kw) -> Manifest:
    base = dict(
        run_id="r",
        experiment="e",
        started_at="2026-11-29T22:00:00+00:00",
        params_file="params/e/x.yaml",
        params_name="x",
        params={"a": 1},
        params_hash="h",
        notebook="nb.ipynb",
        kernel="specbook",
        git=GitInfo(),
        specbook_version="0.1.0",
        python={"version": "3.11"},
        libraries={"pandas": "2"},
    )
    base.update(kw)
    return Manifest(**base)


# --------------------------------------------------------------------------------------------------
# timestamps


def test_iso_utc_accepts_datetimes_epochs_and_strings():
    assert iso_utc(0) == "1970-01-01T00:00:00+00:00"
    assert iso_utc("as-given") == "as-given"
    assert iso_utc(None) is None
    naive = datetime(2026, 1, 1, 12, 0, 0)
    assert iso_utc(naive) == naive.astimezone().astimezone(timezone.utc).isoformat()


def test_utc_now_is_aware_and_in_utc():
    now = utc_now()
    assert now.tzinfo is not None and now.utcoffset().total_seconds() == 0
    assert iso_utc(now).endswith("+00:00")


# --------------------------------------------------------------------------------------------------
# manifest.json


def test_manifest_round_trip_and_atomic_write(tmp_path):
    m = _manifest(status="ok", duration_s=1.5)
    path = write_manifest(tmp_path, m)
    assert path == tmp_path / MANIFEST_NAME
    assert json.loads(path.read_text())["status"] == "ok"
    assert not list(tmp_path.glob("*.tmp"))
    assert read_manifest(tmp_path) == m


def test_read_manifest_errors_name_the_file(tmp_path):
    with pytest.raises(RunError, match=r"manifest\.json: no manifest"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(RunError, match=r"manifest\.json: unreadable manifest"):
        read_manifest(tmp_path)


# --------------------------------------------------------------------------------------------------
# ServerRecord (a line of servers.jsonl, and the manifest's servers)


def test_server_record_status_and_error_round_trip(tmp_path):
    failed = ServerRecord(name="arm-1", argv=["vllm", "serve"], status="failed",
                          error="RunError: server exited with code 1 before it was ready")
    ok = ServerRecord(name="arm-0", argv=["vllm", "serve"], status="ok", ready_s=12.5)
    again = ServerRecord.model_validate_json(failed.model_dump_json())
    assert again == failed and (again.status, again.error) == ("failed", failed.error)
    assert ServerRecord.model_validate_json(ok.model_dump_json()).error is None

    write_manifest(tmp_path, _manifest(servers=[ok, failed]))
    servers = read_manifest(tmp_path).servers
    assert [(s.name, s.status, s.error) for s in servers] == [("arm-0", "ok", None), ("arm-1", "failed", failed.error)]


def test_server_record_of_an_older_run_has_no_status():
    """Runs recorded before status/error existed still load: both read as None."""
    old = '{"name": "arm-0", "argv": ["vllm"], "env": {}, "versions": {}, "startup": {}, "extra": {}}'
    rec = ServerRecord.model_validate_json(old)
    assert rec.status is None and rec.error is None


def test_server_record_refuses_an_unknown_status():
    with pytest.raises(ValidationError, match="status"):
        ServerRecord(name="arm-0", argv=[], status="crashed")
