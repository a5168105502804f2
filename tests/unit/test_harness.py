"""specbook.measure.harness: one server's whole life and its measured windows, driven against the stub server.

The engine registered here is a test-only adapter whose server is tests/fixtures/stub_servers/engine_stub.py
(mode `serving`: OpenAI SSE answers and a /metrics of the stub's own request and token counters). The tests
check the harness's lifecycle, records and windows; they claim nothing about any real engine's behaviour.
"""

from __future__ import annotations

import math
import re
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx
import pandas as pd
import psutil
import pytest

from specbook.core.acceptance import Acceptance
from specbook.core.envline import read_env_line
from specbook.core.errors import RunError, ServerStartError
from specbook.engines import _ENGINES as REGISTRY
from specbook.engines import EngineConfig, register_engine
from specbook.measure import harness
from specbook.serve.client import ChatRequest
from specbook.serve.metrics import CounterDelta, MetricsSnapshot, int_delta
from specbook.serve.server import REDACTED, ServerSpec
from specbook.store.runstore import SERVERS_NAME, RunContext

STUB = Path(__file__).resolve().parents[1] / "fixtures" / "stub_servers" / "engine_stub.py"
ENGINE = "harness-stub"
STUB_VERSION = "0.0.0-stub"  # what engine_stub.py answers on /version
_START_LINE = re.compile(r"stub-engine: mode=(?P<mode>\S+) pid=(?P<pid>\d+)")


class StubEngine:
    """Test-only adapter: argv for the stub, its /version, its own counters, its start line and request lines
    (the harness calls no other method; the last two are there because the Engine protocol asks for them)."""

    name = ENGINE

    def refusals(self, cfg: EngineConfig) -> list[str]:
        return []

    def build_spec(self, cfg: EngineConfig, *, name: str, log_path: Path, port: int) -> ServerSpec:
        return ServerSpec(
            name=name, argv=[sys.executable, str(STUB), "--port", str(port), *cfg.extra_args], env=dict(cfg.env),
            port=port, log_path=log_path, ready_timeout_s=cfg.ready_timeout_s, model_name=cfg.client_model_name(),
        )  # fmt: skip

    def probe_versions(self, base_url: str | None = None) -> dict[str, str]:
        versions = {"engine": self.name}
        if base_url:
            versions["stub"] = httpx.get(base_url + "/version", timeout=5, trust_env=False).json()["version"]
        return versions

    def spec_decode_delta(self, before: MetricsSnapshot, after: MetricsSnapshot, model_name: str | None = None,
                          cfg=None):
        return CounterDelta(
            acceptance=Acceptance(source="stub: no speculation", drafts=0.0),
            generation_tokens=int_delta(before, after, "stub_generation_tokens"),
            requests_succeeded=int_delta(before, after, "stub_requests"),
            interval_s=(after.timestamp - before.timestamp).total_seconds(),
        )

    def startup_facts(self, log_path: str | Path) -> dict:
        m = _START_LINE.search(Path(log_path).read_text()) if Path(log_path).exists() else None
        return {"mode": m["mode"], "pid": int(m["pid"])} if m else {}

    def log_intervals(self, lines) -> pd.DataFrame:
        rows = [{"line_no": i, "text": ln.strip()} for i, ln in enumerate(lines, 1) if '"POST ' in ln]
        return pd.DataFrame(rows, columns=["line_no", "text"])

    def detect_log(self, head_lines) -> int:
        return sum("stub-engine: " in ln for ln in head_lines)

    def summarise_log(self, path: str | Path) -> dict:
        return {"acceptance": Acceptance(source="stub: no speculation", drafts=0.0)}

    def setup_facts(self, cfg: EngineConfig, startup) -> dict:
        return {}


@pytest.fixture(scope="module", autouse=True)
def stub_engine():
    register_engine(ENGINE)(StubEngine)
    yield REGISTRY[ENGINE]
    REGISTRY.pop(ENGINE, None)


def cfg(mode: str = "serving", **kw) -> EngineConfig:
    env = {"STUB_VISIBLE": "harness", "HF_TOKEN": "hf_secret_value"}
    return EngineConfig(engine=ENGINE, model="stub", served_model_name="stub", extra_args=["--mode", mode], env=env,
                        ready_timeout_s=30, **kw)


def req(pid: str, max_tokens: int = 8, text: str = "hello") -> ChatRequest:
    return ChatRequest(prompt_id=pid, messages=[{"role": "user", "content": text}], max_tokens=max_tokens,
                       extra_body={"stub_delay_s": 0.005})


def gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def only_record(run: RunContext):
    records = run.servers()
    assert len(records) == 1, records
    return records[0]


def posts(text: str) -> int:
    return len(re.findall(r'"POST /v1/chat/completions HTTP/1\.1" 200', text))


def test_clean_unit_is_recorded_ok_and_windows_hold_their_requests_counters_and_log_bytes(tmp_path):
    run = RunContext(tmp_path / "run")
    with harness.serve(cfg(), run, "00-stub-ok", extra={"arm": "baseline"}) as server:
        managed = server.managed
        assert server.ready_s is not None and 0 < server.ready_s < 30
        assert server.versions == {"engine": ENGINE, "stub": STUB_VERSION}
        assert server.log_path == run.log_path("00-stub-ok")
        assert [r.ok for r in server.send([req("warm-up")])] == [True]  # outside any window
        t0 = time.monotonic()
        first = server.measure([req(f"p{i}") for i in range(3)], concurrency=2)
        outer = time.monotonic() - t0
        second = server.measure([req("q", max_tokens=5)])
        raw = server.post_raw(req("raw", max_tokens=4))
        with pytest.raises(RunError, match=r"request fail to 00-stub-ok .*HTTP 500"):
            server.post_raw(req("fail", text="FAIL please"))
    pid = managed.pid

    # measure: the records of its own requests, in order, and a wall time inside the call's own time
    assert [r.prompt_id for r in first.records] == ["p0", "p1", "p2"] and all(r.ok for r in first.records)
    assert [r.completion_tokens for r in first.records] == [8, 8, 8] and first.completion_tokens == 24
    assert 0 < first.wall_s <= outer and first.tok_s == pytest.approx(24 / first.wall_s)
    assert list(first.requests_frame()["prompt_id"]) == ["p0", "p1", "p2"]
    # the counters are snapshots taken around the window: the warm-up request is not in it
    assert (first.counters.requests_succeeded, first.counters.generation_tokens) == (3, 24)
    assert (second.counters.requests_succeeded, second.counters.generation_tokens) == (1, 5)
    assert first.acceptance is first.counters.acceptance and math.isnan(first.acceptance.al)  # no drafts
    # the log byte range: the requests of this window and no other
    log = server.log_path.read_bytes()
    assert 0 < first.log_start < first.log_end <= second.log_start < second.log_end <= len(log)
    assert first.log_text() == log[first.log_start:first.log_end].decode()
    assert posts(first.log_text()) == 3 and posts(second.log_text()) == 1
    assert posts(log[: first.log_start].decode()) == 1  # the warm-up
    assert len(first.log_intervals()) == 3 and len(second.log_intervals()) == 1
    assert raw["choices"][0]["message"]["content"] == "w0 w1 w2 w3 "  # the server's whole JSON

    # servers.jsonl: one record, status ok, with what the server really ran
    rec = only_record(run)
    assert (rec.name, rec.status, rec.error) == ("00-stub-ok", "ok", None)
    assert rec.argv == managed.argv and rec.argv[:2] == [sys.executable, str(STUB)]
    assert rec.argv[rec.argv.index("--port") + 1] == str(managed.spec.port)
    assert rec.versions == {"engine": ENGINE, "stub": STUB_VERSION}
    started, stopped = datetime.fromisoformat(rec.started_at), datetime.fromisoformat(rec.stopped_at)
    assert started == managed.started_at and stopped == managed.stopped_at and started < stopped
    assert rec.ready_s == managed.ready_s and rec.extra == {"arm": "baseline"}
    assert rec.log_path == "logs/00-stub-ok.log"
    assert rec.env == {"HF_TOKEN": REDACTED, "STUB_VISIBLE": "harness"} == read_env_line(server.log_path)
    assert "hf_secret_value" not in (run.run_dir / SERVERS_NAME).read_text()
    assert rec.startup == {"mode": "serving", "pid": pid, "processes": 1}  # the stub serves from one process
    # nothing survives the unit
    assert managed.surviving_pids() == [] and gone(pid)


def test_exception_in_the_block_is_recorded_failed_with_its_text_and_re_raised(tmp_path):
    run = RunContext(tmp_path / "run")
    with pytest.raises(RuntimeError, match="injected failure in the unit"):
        with harness.serve(cfg(), run, "01-stub-fail") as server:
            managed = server.managed
            server.measure([req("p0")])
            raise RuntimeError("injected failure in the unit")
    rec = only_record(run)
    assert (rec.status, rec.error) == ("failed", "RuntimeError: injected failure in the unit")
    assert rec.versions["stub"] == STUB_VERSION and rec.stopped_at is not None
    assert managed.surviving_pids() == [] and gone(managed.pid)


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(2)], ids=["ctrl-c", "sys-exit"])
def test_interrupt_is_recorded_interrupted_and_re_raised(tmp_path, exc):
    run = RunContext(tmp_path / "run")
    with pytest.raises(type(exc)):
        with harness.serve(cfg(), run, "02-stub-interrupted") as server:
            managed = server.managed
            raise exc
    rec = only_record(run)
    assert rec.status == "interrupted" and rec.error.startswith(type(exc).__name__)
    assert managed.surviving_pids() == [] and gone(managed.pid)


def test_server_dying_at_start_is_recorded_failed_with_the_log_tail_and_leaves_nothing(tmp_path):
    run = RunContext(tmp_path / "run")
    with pytest.raises(ServerStartError, match="exited with code 3"):
        with harness.serve(cfg("exit-at-once"), run, "03-stub-dies"):
            pytest.fail("the block must not run for a server that never became ready")
    rec = only_record(run)
    assert rec.status == "failed" and "exited with code 3" in rec.error
    assert rec.versions == {"engine": ENGINE}  # never probed: the server was never ready
    assert rec.ready_s is None and rec.started_at is not None and rec.stopped_at is not None
    assert rec.log_path == "logs/03-stub-dies.log" and rec.startup["mode"] == "exit-at-once"
    assert "FATAL could not allocate KV cache" in run.log_path("03-stub-dies").read_text()
    assert gone(rec.startup["pid"])


def test_units_of_one_run_append_their_records_in_order(tmp_path):
    run = RunContext(tmp_path / "run")
    with harness.serve(cfg(), run, "a-ok"):
        pass
    with pytest.raises(ValueError, match="second"), harness.serve(cfg(), run, "b-fail"):
        raise ValueError("second unit fails")
    assert [(r.name, r.status) for r in run.servers()] == [("a-ok", "ok"), ("b-fail", "failed")]


def test_window_duration_is_the_request_span_not_the_clients_setup():
    from specbook.measure.harness import request_span_s
    from specbook.serve.client import RequestRecord

    recs = [RequestRecord(prompt_id="a", started_at=100.0, wall_s=2.0),
            RequestRecord(prompt_id="b", started_at=100.5, wall_s=3.0)]
    assert request_span_s(recs, fallback=9.0) == 3.5  # 100.0 -> 103.5
    assert request_span_s([RequestRecord(prompt_id="c")], fallback=9.0) == 9.0  # no start time: the fallback


def test_a_server_started_ahead_is_ready_before_the_other_units_window_and_serves_its_own_unit(tmp_path):
    run = RunContext(tmp_path / "run")
    harness.start_ahead(cfg(), run, "b-ahead")
    ahead = harness._AHEAD["b-ahead"]
    with harness.serve(cfg(), run, "a-first") as server:
        # no window overlaps a start: the server started ahead is ready before the first unit's block runs
        assert ahead.ready_s is not None and server.managed is not ahead
    with harness.serve(cfg(), run, "b-ahead") as server:
        assert server.managed is ahead and server.ready_s == ahead.ready_s  # its own launch's ready time, kept
        assert len(server.measure([req("p0")]).ok_records()) == 1
    assert [(r.name, r.status) for r in run.servers()] == [("a-first", "ok"), ("b-ahead", "ok")]
    assert harness._AHEAD == {} and ahead.surviving_pids() == [] and gone(ahead.pid)


def test_a_server_started_ahead_that_fails_is_dropped_and_its_unit_starts_one_again(tmp_path):
    run = RunContext(tmp_path / "run")
    harness.start_ahead(cfg("exit-at-once"), run, "b-ahead")
    with harness.serve(cfg(), run, "a-first"):
        assert harness._AHEAD == {}  # dropped: the failure belongs to its own unit, not to this one
    with harness.serve(cfg(), run, "b-ahead") as server:
        assert len(server.measure([req("p0")]).ok_records()) == 1
    assert "FATAL could not allocate KV cache" in run.log_path("b-ahead").with_name("b-ahead.1.log").read_text()
    assert [(r.name, r.status) for r in run.servers()] == [("a-first", "ok"), ("b-ahead", "ok")]


def test_discarding_servers_started_ahead_stops_every_process_and_keeps_their_logs(tmp_path):
    run = RunContext(tmp_path / "run")
    harness.start_ahead(cfg(), run, "c-never-run")
    ahead = harness._AHEAD["c-never-run"]
    ahead.wait_ready()
    assert harness.discard_ahead() == ["c-never-run"] and harness._AHEAD == {}
    assert ahead.surviving_pids() == [] and gone(ahead.pid)
    assert run.log_path("c-never-run").exists() and run.servers() == []


def test_a_server_that_cannot_be_launched_ahead_is_left_to_its_unit(tmp_path, monkeypatch):
    from specbook.serve.server import ManagedServer

    run = RunContext(tmp_path / "run")
    real_start = ManagedServer.start

    def refuse(self):
        raise ServerStartError(f"server {self.name!r} could not be launched (injected)")

    monkeypatch.setattr(ManagedServer, "start", refuse)
    harness.start_ahead(cfg(), run, "b-ahead")  # no raise: the current unit is not the one that failed
    assert harness._AHEAD == {}
    monkeypatch.setattr(ManagedServer, "start", real_start)
    with harness.serve(cfg(), run, "b-ahead") as server:
        assert len(server.measure([req("p0")]).ok_records()) == 1
    assert [(r.name, r.status) for r in run.servers()] == [("b-ahead", "ok")]


# ------------------------------------------------------------------ a log written after the response

REQUEST_LOG_ENGINE = "harness-stub-request-log"


class RequestLogStubEngine(StubEngine):
    """The stub as an engine whose log reports each request, a moment after its answer (SummarisesRequestLogs):
    the line `stub_end_line_after_s` asks the stub for."""

    name = REQUEST_LOG_ENGINE

    def request_log_figures(self, records: pd.DataFrame) -> dict:
        return {"log_requests": len(records)}

    def requests_logged(self, text: str) -> int:
        return text.count("stub-engine: request ended")


@pytest.fixture()
def request_log_engine():
    register_engine(REQUEST_LOG_ENGINE)(RequestLogStubEngine)
    yield
    REGISTRY.pop(REQUEST_LOG_ENGINE, None)


def late_req(pid: str, after_s: float) -> ChatRequest:
    return ChatRequest(prompt_id=pid, messages=[{"role": "user", "content": "hello"}], max_tokens=4,
                       extra_body={"stub_delay_s": 0.005, "stub_end_line_after_s": after_s})


def test_a_window_waits_for_the_log_to_show_its_requests_ended_and_the_next_starts_after_them(
        tmp_path, request_log_engine):
    run = RunContext(tmp_path / "run")
    config = cfg().model_copy(update={"engine": REQUEST_LOG_ENGINE})
    with harness.serve(config, run, "00-late-log") as server:
        server.send([late_req("warm-up", 0.4)])
        first = server.measure([late_req(f"p{i}", 0.4) for i in range(3)], concurrency=3)
        second = server.measure([late_req("q", 0.4)])
    ended = "stub-engine: request ended"
    # each window holds the lines of its own requests, written after their answers; none spills over
    assert first.log_text().count(ended) == 3 and second.log_text().count(ended) == 1
    log = server.log_path.read_text()
    assert log[: first.log_start].count(ended) == 1  # the warm-up's, waited for by send


def test_a_log_that_never_shows_the_requests_ended_is_said_after_the_bound_and_the_window_kept(
        tmp_path, request_log_engine, monkeypatch, capsys):
    monkeypatch.setattr(harness, "LOG_SETTLE_S", 0.3)
    run = RunContext(tmp_path / "run")
    config = cfg().model_copy(update={"engine": REQUEST_LOG_ENGINE})
    with harness.serve(config, run, "00-no-log") as server:
        window = server.measure([late_req("p0", 0.0), late_req("p1", -1)])
    assert [r.ok for r in window.records] == [True, True]
    assert window.log_text().count("stub-engine: request ended") == 1
    said = capsys.readouterr()
    assert "its log shows 1 of the 2 answered requests ended after 0.3 s" in said.out + said.err


def test_a_log_that_reports_no_request_end_is_said_once_and_not_waited_for_again(
        tmp_path, request_log_engine, monkeypatch, capsys):
    monkeypatch.setattr(harness, "LOG_SETTLE_S", 0.3)
    waits = []
    real_wait = harness.wait_for_log
    monkeypatch.setattr(harness, "wait_for_log", lambda *a, **k: waits.append(a) or real_wait(*a, **k))
    run = RunContext(tmp_path / "run")
    config = cfg().model_copy(update={"engine": REQUEST_LOG_ENGINE})
    with harness.serve(config, run, "00-silent-log") as server:
        windows = [server.measure([late_req(f"p{i}", -1)]) for i in range(3)]
    assert all(w.records[0].ok for w in windows) and len(waits) == 1
    said = capsys.readouterr()
    text = said.out + said.err
    assert text.count("its log shows no request ended (1 answered") == 1, text
