"""serve/clientload: a window's requests spread over client worker processes give the records one event loop
gives, in request order, and the client's CPU of every process (against the OpenAI SSE stub, no engine)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from specbook.core.errors import ClientError
from specbook.serve import clientload
from specbook.serve.client import ChatRequest
from specbook.serve.clientcpu import ClientCpu

_STUB = Path(__file__).resolve().parents[1] / "fixtures" / "stub_servers" / "openai_sse.py"
SAME = ("prompt_id", "turn", "output_text", "completion_tokens", "finish_reason", "chunks", "error")


@pytest.fixture(scope="module")
def stub():
    spec = importlib.util.spec_from_file_location("openai_sse_stub_load", _STUB)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    server, url, state = mod.serve_in_thread()
    yield url, state
    server.shutdown()


def reqs(n: int) -> list[ChatRequest]:
    out = []
    for i in range(n):
        kw = {"follow_up": ["and then?"]} if i % 3 == 0 else {}
        out.append(ChatRequest(prompt_id=f"p{i}", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=3 + i % 4,
                               extra_body={"stub_delay_s": 0.002}, **kw))
    return out


def fields(records):
    return [{f: getattr(r, f) for f in SAME} for r in records]


def test_two_processes_give_one_loops_records_in_request_order_and_both_processes_cpu(stub):
    url, state = stub
    window = reqs(7)
    one_cpu: list[ClientCpu] = []
    one = clientload.send_window(url, "stub", window, concurrency=4, processes=1, cpu=one_cpu, progress=False)
    state.max_in_flight = 0
    two_cpu: list[ClientCpu] = []
    two = clientload.send_window(url, "stub", window, concurrency=4, processes=2, cpu=two_cpu, progress=False)
    assert fields(two) == fields(one) and len(one) == 7 + 3  # three requests have a second turn
    assert all(r.error is None and len(r.itl_s) == r.chunks - 1 for r in two)
    assert one_cpu[0].processes == 1 and two_cpu[0].processes == 2
    assert two_cpu[0].requests == 7 and two_cpu[0].loop_cpu_s > 0 and two_cpu[0].busiest_share is not None
    assert state.max_in_flight <= 4


def test_processes_resolve_within_the_concurrency_and_auto_by_requests_in_flight(monkeypatch):
    assert clientload.resolve_processes(4, 2) == 2
    assert clientload.resolve_processes("2", 8) == 2
    monkeypatch.setattr(clientload.os, "cpu_count", lambda: 16)
    assert clientload.resolve_processes("auto", 16) == 1
    assert clientload.resolve_processes("auto", clientload.REQUESTS_PER_PROCESS + 1) == 2
    assert clientload.resolve_processes("auto", 10_000) == 8  # half the cores: the server shares the host
    for bad in (0, -1, "many"):
        with pytest.raises(ClientError, match="client processes"):
            clientload.resolve_processes(bad, 4)


def test_shares_split_every_nth_request_and_the_concurrency():
    assert clientload.shares(7, 5, 2) == [([0, 2, 4, 6], 3), ([1, 3, 5], 2)]
    assert clientload.shares(2, 3, 3) == [([0], 1), ([1], 1)]


def test_every_request_failing_in_workers_raises_with_the_records():
    url = "http://127.0.0.1:9"  # nothing listens there
    with pytest.raises(ClientError, match="all 4 requests") as err:
        clientload.send_window(url, "stub", reqs(4)[1:3] * 2, concurrency=2, processes=2, progress=False,
                               timeout_s=2)
    assert len(err.value.records) == 4 and all(r.error for r in err.value.records)


def test_a_harness_window_with_two_client_processes_records_both(tmp_path):
    from tests.unit.test_harness import ENGINE, StubEngine, cfg, req

    from specbook.engines import _ENGINES as REGISTRY
    from specbook.engines import register_engine
    from specbook.measure import harness
    from specbook.serve import clientcpu
    from specbook.store.runstore import RunContext

    register_engine(ENGINE)(StubEngine)
    try:
        run = RunContext(tmp_path / "run")
        with harness.serve(cfg(), run, "00-stub-procs") as server:
            window = server.measure([req(f"p{i}") for i in range(6)], concurrency=2, client_processes=2)
    finally:
        REGISTRY.pop(ENGINE, None)
    assert [r.prompt_id for r in window.records] == [f"p{i}" for i in range(6)]
    assert all(r.error is None and r.completion_tokens == 8 for r in window.records)
    assert window.client_cpu.processes == 2 and window.client_cpu.requests == 6
    (rec,) = clientcpu.read_records(run.run_dir)
    assert rec["processes"] == 2 and rec["server"] == "00-stub-procs"
