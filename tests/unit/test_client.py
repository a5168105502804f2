"""Client parsing and timing against a stub OpenAI SSE server (client behaviour only, no engine)."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

from specbook.core.errors import ClientError
from specbook.serve.client import ChatRequest, RequestRecord, records_frame, run_requests, run_requests_sync

_STUB = Path(__file__).resolve().parents[1] / "fixtures" / "stub_servers" / "openai_sse.py"


@pytest.fixture(scope="module")
def stub():
    spec = importlib.util.spec_from_file_location("openai_sse_stub", _STUB)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    server, url, state = mod.serve_in_thread()
    yield url, state
    server.shutdown()


def chat(pid, text="hello", **kw) -> ChatRequest:
    return ChatRequest(prompt_id=pid, messages=[{"role": "user", "content": text}], **kw)


def test_request_needs_exactly_one_input():
    with pytest.raises(ValueError, match="exactly one"):
        ChatRequest(prompt_id="x")
    with pytest.raises(ValueError, match="exactly one"):
        ChatRequest(prompt_id="x", prompt="a", messages=[{"role": "user", "content": "a"}])
    assert ChatRequest(prompt_id=7, prompt="a").prompt_id == "7"


def test_payload_is_greedy_streams_usage_and_merges_extra_body():
    body = chat("a", max_tokens=5, extra_body={"top_k": 1}).payload("m", stream=True)
    assert body["temperature"] == 0.0 and body["stream_options"] == {"include_usage": True}
    assert body["top_k"] == 1 and "ignore_eos" not in body and "seed" not in body
    assert chat("a", ignore_eos=True, seed=3).payload("m", stream=False)["ignore_eos"] is True


async def test_stream_chat_timings_usage_and_order(stub):
    url, state = stub
    delay, n = 0.05, 6
    reqs = [chat(f"p{i}", max_tokens=n, extra_body={"stub_delay_s": delay}) for i in range(5)]
    recs = await run_requests(url, "stub", reqs, concurrency=2, progress=False)
    assert [r.prompt_id for r in recs] == [f"p{i}" for i in range(5)]
    for r in recs:
        assert r.error is None
        assert r.output_text == "".join(f"w{i} " for i in range(n))
        assert r.completion_tokens == n and r.prompt_tokens > 0 and r.finish_reason == "length"
        assert r.chunks == n and len(r.itl_s) == n - 1
        # The stub sleeps `delay` before each chunk: the first content chunk and the last one cannot come
        # sooner than 1 and n sleeps after the start. One gap alone has no floor: a client delayed on a loaded
        # machine reads two queued chunks back to back. The ceiling only catches gross mis-timing.
        assert delay * 0.8 <= r.ttft_s < delay + 3
        assert r.ttft_s + sum(r.itl_s) >= n * delay * 0.8
        assert all(0 <= x < delay + 3 for x in r.itl_s)
        assert r.itl_mean_s == pytest.approx(sum(r.itl_s) / len(r.itl_s))
        assert r.wall_s >= r.ttft_s + sum(r.itl_s) - 1e-6
        assert r.tpot_s == pytest.approx((r.wall_s - r.ttft_s) / (n - 1))
    assert state.max_in_flight <= 2


async def test_concurrency_is_bounded(stub):
    url, state = stub
    state.max_in_flight = 0
    reqs = [chat(f"c{i}", max_tokens=3, extra_body={"stub_delay_s": 0.05}) for i in range(9)]
    await run_requests(url, "stub", reqs, concurrency=3, progress=False)
    assert 2 <= state.max_in_flight <= 3


async def test_multi_token_chunks_count_chunks_not_tokens(stub):
    url, _ = stub
    req = chat("burst", max_tokens=8, extra_body={"stub_delay_s": 0.01, "stub_per_chunk": 4})
    (rec,) = await run_requests(url, "stub", [req], progress=False)
    assert rec.completion_tokens == 8 and rec.chunks == 2 and len(rec.itl_s) == 1


async def test_completions_endpoint_and_non_stream(stub):
    url, state = stub
    req = ChatRequest(prompt_id="c", prompt="once upon", max_tokens=4)
    (streamed,) = await run_requests(url, "stub", [req], progress=False)
    assert state.bodies[-1]["prompt"] == "once upon" and "messages" not in state.bodies[-1]
    (plain,) = await run_requests(url, "stub", [req], stream=False, progress=False)
    assert streamed.output_text == plain.output_text == "w0 w1 w2 w3 "
    assert plain.ttft_s is None and plain.itl_s == [] and plain.completion_tokens == 4


async def test_failures_are_recorded_not_raised(stub):
    url, _ = stub
    reqs = [chat("ok", max_tokens=2), chat("bad", "please FAIL"), chat("mid", "STREAM_ERROR now", max_tokens=5)]
    ok, bad, mid = await run_requests(url, "stub", reqs, progress=False)
    assert ok.error is None
    assert "HTTP 500" in bad.error and "injected failure" in bad.error
    assert "injected stream error" in mid.error and mid.ttft_s is not None


async def test_all_failing_raises_with_records(stub):
    url, _ = stub
    with pytest.raises(ClientError, match="all 2 requests") as info:
        await run_requests(url, "stub", [chat("a", "FAIL"), chat("b", "FAIL")], progress=False)
    assert [r.prompt_id for r in info.value.records] == ["a", "b"]


def test_unreachable_server_names_the_error():
    with pytest.raises(ClientError, match="ConnectError"):
        run_requests_sync("http://127.0.0.1:9", "m", [chat("x")], progress=False, timeout_s=5)


def test_sync_works_inside_a_running_loop(stub):
    url, _ = stub

    async def inside_loop():  # what a Jupyter cell does: a sync call while a loop runs
        return run_requests_sync(url, "stub", [chat("j", max_tokens=3)], progress=False)

    (rec,) = asyncio.run(inside_loop())
    assert rec.error is None and rec.completion_tokens == 3


def test_records_frame_has_every_field(stub):
    url, _ = stub
    recs = run_requests_sync(url, "stub", [chat("f", max_tokens=3), chat("g", "FAIL")], progress=False)
    df = records_frame(recs)
    assert list(df.columns) == list(RequestRecord.model_fields)
    assert df.loc[1, "error"].startswith("ClientError") and len(df.loc[0, "itl_s"]) == 2


def test_an_interrupt_closes_the_clients_connections_before_it_goes_through():
    """Ctrl-C in the kernel (a running loop: the client runs in a worker thread) must close the open streams
    before the server is stopped: a server that waits for its connections to close (uvicorn) waits otherwise."""
    import signal
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    connected, closed = threading.Event(), threading.Event()

    def silent_server() -> None:  # accepts, reads the request, answers nothing; notes when the client hangs up
        conn, _ = listener.accept()
        connected.set()
        while conn.recv(4096):
            pass
        closed.set()
        conn.close()

    threading.Thread(target=silent_server, daemon=True).start()
    main = threading.main_thread().ident
    threading.Thread(target=lambda: connected.wait(30) and signal.pthread_kill(main, signal.SIGINT),
                     daemon=True).start()
    req = ChatRequest(prompt_id="p", messages=[{"role": "user", "content": "hi"}], max_tokens=4)

    async def in_a_kernel() -> None:  # a running loop, as in Jupyter
        run_requests_sync(f"http://127.0.0.1:{port}", "m", [req], concurrency=1, progress=False)

    loop = asyncio.new_event_loop()  # not asyncio.run: its own SIGINT handler would only cancel the blocked task
    # Python's own Ctrl-C handler, as in a kernel: a test before this one in the same process (the runner's signal
    # tests) may have left another, and with it the interrupt would never raise here
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(in_a_kernel())
    finally:
        signal.signal(signal.SIGINT, previous)
        loop.close()
    # closed before the interrupt went through; the server's thread may take a moment to read the EOF (left open,
    # the old worker kept the stream for the client's 600 s timeout)
    assert connected.is_set() and closed.wait(5), "the interrupt went through with the connection still open"
    listener.close()
