"""specbook.store.runstore: the run folder's files (frames, json, servers.jsonl), saved at once and atomically."""

from __future__ import annotations

import os
from datetime import datetime, timezone

import pandas as pd
import pytest

from specbook.core.errors import RunError
from specbook.store.runstore import SERVERS_NAME, RunContext


def test_run_context_makes_data_and_logs(tmp_path):
    ctx = RunContext(tmp_path / "run")
    assert ctx.data_dir == (tmp_path / "run" / "data").resolve() and ctx.data_dir.is_dir()
    assert ctx.logs_dir.is_dir()
    assert ctx.log_path("arm-0") == ctx.logs_dir / "arm-0.log"


def test_from_run_dir_requires_the_folder(tmp_path):
    with pytest.raises(RunError, match="run folder does not exist"):
        RunContext.from_run_dir(tmp_path / "missing")
    with pytest.raises(RunError, match="run_dir is empty"):
        RunContext("")


# --------------------------------------------------------------------------------------------------
# frames and json


def test_save_frame_writes_parquet_at_once_and_loads_back(tmp_path):
    ctx = RunContext(tmp_path)
    df = pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]})
    path = ctx.save_frame("requests", df)
    assert path == ctx.data_dir / "requests.parquet" and path.exists()
    assert not list(ctx.data_dir.glob("*.tmp"))
    # a new context (as a re-render would open) reads the same frame
    pd.testing.assert_frame_equal(RunContext.from_run_dir(tmp_path).load_frame("requests"), df)
    assert ctx.has_frame("requests") and not ctx.has_frame("other")


def test_load_missing_frame_names_file_and_saved_ones(tmp_path):
    ctx = RunContext(tmp_path)
    ctx.save_frame("arms", pd.DataFrame({"a": [1]}))
    with pytest.raises(RunError, match=r"requests\.parquet: no saved frame 'requests'; saved frames: arms"):
        ctx.load_frame("requests")


@pytest.mark.parametrize("bad", ["../escape", "a/b", "", ".hidden", "sp ace"])
def test_frame_names_cannot_escape_data_dir(tmp_path, bad):
    with pytest.raises(RunError, match="name"):
        RunContext(tmp_path).save_frame(bad, pd.DataFrame({"a": [1]}))
    with pytest.raises(RunError, match="name"):
        RunContext(tmp_path).append_frame(bad, pd.DataFrame({"a": [1]}))


def test_json_round_trip(tmp_path):
    ctx = RunContext(tmp_path)
    ctx.save_json("summary", {"al": 1.5, "when": datetime(2026, 1, 1, tzinfo=timezone.utc)})
    assert ctx.load_json("summary") == {"al": 1.5, "when": "2026-01-01 00:00:00+00:00"}
    with pytest.raises(RunError, match="no saved json 'nope'"):
        ctx.load_json("nope")


# --------------------------------------------------------------------------------------------------
# append_frame: one unit of work's rows on disk before the next unit starts


def runs(*ids: str) -> pd.DataFrame:
    return pd.DataFrame({"run_id": list(ids), "al": [1.5 + i / 10 for i in range(len(ids))]})


def test_append_frame_starts_a_frame_then_adds_rows(tmp_path):
    ctx = RunContext(tmp_path)
    path = ctx.append_frame("runs", runs("r0"))
    assert path == ctx.frame_path("runs")
    ctx.append_frame("runs", runs("r1", "r2"))
    got = RunContext.from_run_dir(tmp_path).load_frame("runs")
    assert list(got["run_id"]) == ["r0", "r1", "r2"] and list(got.index) == [0, 1, 2]
    assert not list(ctx.data_dir.glob("*.tmp"))


def test_append_frame_keeps_a_frame_saved_earlier(tmp_path):
    """A frame saved by save_frame (or by an earlier process) keeps every row when more are appended."""
    RunContext(tmp_path).save_frame("runs", runs("r0", "r1"))
    ctx = RunContext.from_run_dir(tmp_path)
    ctx.append_frame("runs", pd.DataFrame({"run_id": ["r2"], "al": [9.0], "status": ["failed"]}))
    got = ctx.load_frame("runs")
    assert list(got["run_id"]) == ["r0", "r1", "r2"]
    assert list(got["al"]) == [1.5, 1.6, 9.0]
    assert got["status"].isna().tolist() == [True, True, False]  # a new column is empty for older rows


def test_append_frame_of_no_rows_leaves_the_frame_alone(tmp_path):
    ctx = RunContext(tmp_path)
    ctx.append_frame("runs", runs("r0"))
    before = ctx.frame_path("runs").stat().st_mtime_ns
    ctx.append_frame("runs", runs())
    assert ctx.frame_path("runs").stat().st_mtime_ns == before
    assert list(ctx.load_frame("runs")["run_id"]) == ["r0"]


def test_append_frame_is_atomic_a_failed_write_loses_nothing(tmp_path, monkeypatch):
    """A write that dies half-way leaves the saved frame as it was, not a truncated parquet."""
    ctx = RunContext(tmp_path)
    ctx.append_frame("runs", runs("r0", "r1"))

    def dies_half_way(self, path, *args, **kwargs):
        with open(path, "wb") as fh:
            fh.write(b"PAR1 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", dies_half_way)
    with pytest.raises(OSError, match="disk full"):
        ctx.append_frame("runs", runs("r2"))
    monkeypatch.undo()
    assert list(ctx.load_frame("runs")["run_id"]) == ["r0", "r1"]
    ctx.append_frame("runs", runs("r2"))
    assert list(ctx.load_frame("runs")["run_id"]) == ["r0", "r1", "r2"]


# --------------------------------------------------------------------------------------------------
# servers.jsonl


def test_record_server_appends_redacted_records(tmp_path):
    ctx = RunContext(tmp_path)
    ctx.log_path("target").write_text("Env: X=1\n")
    started = datetime(2026, 11, 29, 22, 0, 0, tzinfo=timezone.utc)
    ctx.record_server(
        "target",
        ["python", "-m", "vllm", "serve", "m"],
        {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_TOKEN": "hf_secret"},
        {"vllm": "0.32.0"},
        started,
        stopped_at=started.timestamp() + 30,
        ready_s=23.5,
        extra={"arm": "A"},
    )
    ctx.record_server("draft", ["x"], {}, {}, "2026-11-29T22:01:00+00:00")
    lines = (tmp_path / SERVERS_NAME).read_text().splitlines()
    assert len(lines) == 2
    assert "hf_secret" not in lines[0]
    first, second = ctx.servers()
    assert first.env["VLLM_CPU_KVCACHE_SPACE"] == "1" and first.env["HF_TOKEN"] != "hf_secret"
    assert first.started_at == "2026-11-29T22:00:00+00:00"
    assert first.stopped_at == "2026-11-29T22:00:30+00:00"
    assert first.ready_s == 23.5 and first.extra == {"arm": "A"} and first.log_path == "logs/target.log"
    assert second.name == "draft" and second.log_path is None


def test_record_server_stores_the_start_up_facts_its_caller_read(tmp_path):
    """The caller (the engine adapter's parser) reads the log; record_server stores what it is given."""
    ctx = RunContext(tmp_path / "run")
    ctx.log_path("arm-0").write_text("INFO ... KV cache\n")
    facts = {"weights_load_s": [0.2, 0.18], "kv_cache_device": "CPU", "kv_cache_tokens": 23296}
    ctx.record_server("arm-0", ["vllm", "serve"], {}, {"engine": "vllm"}, started_at=None, startup=facts)
    ctx.record_server("arm-1", ["vllm", "serve"], {}, {"engine": "vllm"}, started_at=None)
    rec, bare = ctx.servers()
    assert rec.startup == facts and rec.log_path == "logs/arm-0.log"
    assert bare.startup == {}  # the run folder never parses a log itself


def test_record_server_status_and_error_round_trip(tmp_path):
    ctx = RunContext(tmp_path)
    ctx.record_server("arm-0", ["vllm"], {}, {}, started_at=None, status="ok")
    ctx.record_server("arm-1", ["vllm"], {}, {}, started_at=None, status="failed",
                      error="RunError: arm-1 exited with code 1 before it was ready")
    ctx.record_server("arm-2", ["vllm"], {}, {}, started_at=None)
    got = [(s.name, s.status, s.error) for s in RunContext.from_run_dir(tmp_path).servers()]
    assert got == [("arm-0", "ok", None), ("arm-1", "failed", "RunError: arm-1 exited with code 1 before it was ready"),
                   ("arm-2", None, None)]


def test_bad_server_line_is_skipped_and_named_by_file_and_line(tmp_path):
    ctx = RunContext(tmp_path)
    ctx.record_server("arm-0", ["vllm"], {}, {}, started_at=None)
    with open(tmp_path / SERVERS_NAME, "a") as fh:
        fh.write("\n{not json\n")
    read = ctx.read_servers()
    assert [s.name for s in read.records] == ["arm-0"]
    (skipped,) = read.skipped
    assert skipped.startswith("servers.jsonl:3: torn or damaged line (9 chars) skipped")
    assert [s.name for s in ctx.servers()] == ["arm-0"]
    assert RunContext(tmp_path / "empty").servers() == []


def test_a_line_torn_by_a_killed_runner_costs_only_itself(tmp_path):
    """A runner killed mid-append left half a record and no newline (what a buffered writer that flushed part
    of a long line leaves). The next append starts a line of its own; every whole record is read, the torn
    one is named."""
    ctx = RunContext(tmp_path)
    ctx.record_server("arm-0", ["vllm"], {}, {}, started_at=None, status="ok")
    whole = RunContext(tmp_path / "other").record_server("arm-1", ["vllm", "x" * 5000], {}, {}, started_at=None)
    torn = whole.model_dump_json()[:3000]
    with open(tmp_path / SERVERS_NAME, "a", encoding="utf-8") as fh:
        fh.write(torn)
    ctx.record_server("arm-1", ["vllm"], {}, {}, started_at=None, status="ok")  # the resumed run's record
    ctx.record_server("arm-2", ["vllm"], {}, {}, started_at=None, status="ok")
    lines = (tmp_path / SERVERS_NAME).read_text().split("\n")
    assert lines[1] == torn and lines[-1] == ""
    read = ctx.read_servers()
    assert [s.name for s in read.records] == ["arm-0", "arm-1", "arm-2"]
    (skipped,) = read.skipped
    assert skipped.startswith("servers.jsonl:2: torn or damaged line (3000 chars) skipped: ")


def test_record_server_appends_a_whole_line_in_one_write(tmp_path, monkeypatch):
    """One os.write per record: a kill between two writes of one record cannot happen."""
    import specbook.core.diskwrite as diskwrite

    calls: list[bytes] = []
    real_write = os.write

    def counting(fd, data):
        calls.append(bytes(data))
        return real_write(fd, data)

    monkeypatch.setattr(diskwrite.os, "write", counting)
    ctx = RunContext(tmp_path)
    ctx.record_server("arm-0", ["vllm", "y" * 20_000], {}, {}, started_at=None)  # larger than any io buffer
    assert len(calls) == 1 and calls[0].endswith(b"\n") and calls[0].count(b"\n") == 1
