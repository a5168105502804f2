"""A lean HTTP/1.1 streaming client on raw asyncio streams: POST a JSON body, read the SSE answer.

What the measuring client needs and nothing more: keep-alive connections (one per concurrency slot, reused),
chunked / Content-Length / read-to-close bodies, an incremental SSE split into `data:` payloads, a bound on
connecting and one on the wait for the next bytes. Per received HTTP chunk it keeps the arrival time and the
payload bytes; decoding the JSON of every event waits until the stream has ended (the caller's job), so the
event loop spends its time reading sockets while requests are in flight.

Errors carry httpx's names (ConnectError, ReadTimeout, RemoteProtocolError), the names the harness and the
failure tables already read: a stalled stream is `ReadTimeout`, a dropped connection is not.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit


class HTTPStreamError(Exception):
    """A transport failure; subclasses carry httpx's names."""


class ConnectError(HTTPStreamError):
    pass


class ReadTimeout(HTTPStreamError):
    pass


class RemoteProtocolError(HTTPStreamError):
    pass


DONE = b"[DONE]"


@dataclass
class Response:
    """A response's status, and either its whole body (not 200) or its SSE `data:` payloads with their arrival
    times (perf_counter), in order; `done`: the stream ended with `data: [DONE]`."""

    status: int
    body: bytes = b""
    events: list[tuple[float, bytes]] = field(default_factory=list)
    done: bool = False


def split_sse(buffer: bytes, now: float, events: list[tuple[float, bytes]]) -> tuple[bytes, bool]:
    """Append the `data:` payloads of the complete lines in `buffer` to `events` (time `now`); the incomplete
    rest of the buffer, and whether `data: [DONE]` came. Comments, event names and blank lines are skipped."""
    end = buffer.rfind(b"\n")
    if end < 0:
        return buffer, False
    done = False
    for line in buffer[:end].split(b"\n"):
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            if payload == DONE:
                done = True
                break
            events.append((now, payload))
    return buffer[end + 1:], done


def dechunk(pieces: list[tuple[float, bytes]]) -> list[tuple[float, bytes]]:
    """A chunked body's received pieces (arrival time, bytes as read) as its chunks' data, each with the arrival
    time of its last byte. Raises ValueError on a malformed size line."""
    raw = b"".join(p for _, p in pieces)
    ends: list[int] = []
    total = 0
    for _, p in pieces:
        total += len(p)
        ends.append(total)
    out: list[tuple[float, bytes]] = []
    pos, k, n = 0, 0, len(raw)
    while pos < n:
        eol = raw.find(b"\r\n", pos)
        if eol < 0:
            raise ValueError("chunk size line without its end")
        size = int(raw[pos:eol].split(b";", 1)[0], 16)
        if size == 0:
            break
        start, stop = eol + 2, eol + 2 + size
        while ends[k] < stop:
            k += 1
        out.append((pieces[k][0], raw[start:stop]))
        pos = stop + 2
    return out


_TERMINATOR = b"0\r\n\r\n"  # the last chunk of a chunked body: an SSE chunk's data ends "\n\n\r\n", never so


class _Reader(asyncio.Protocol):
    """One connection's bytes: the response head, then the body's pieces with their arrival times, gathered in
    the loop's own callback (no task woken per piece); `finished` resolves when the body is whole or the
    connection is lost."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self._reset()

    def _reset(self) -> None:
        self.head: bytes | None = None
        self.buf = b""
        self.pieces: list[tuple[float, bytes]] = []
        self.framing = ""  # "chunked", "length", "close"
        self.remaining = 0
        self.tail = b""
        self.last = time.monotonic()
        self.finished: asyncio.Future[bool] = self.loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.finished.done():
            self.finished.set_result(self.framing == "close" and self.head is not None)

    def data_received(self, data: bytes) -> None:
        self.last = time.monotonic()
        if self.head is None:
            self.buf += data
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            self.head, data = self.buf[:end], self.buf[end + 4:]
            self.buf = b""
            self._framing()
            if not data:
                if self.framing == "length" and self.remaining == 0:
                    self.finished.set_result(True)
                return
        self.pieces.append((time.perf_counter(), data))
        if self.framing == "chunked":
            self.tail = (self.tail + data)[-len(_TERMINATOR) - 2:]
            if self.tail.endswith(_TERMINATOR) and (self.tail.endswith(b"\r\n" + _TERMINATOR)
                                                    or sum(len(p) for _, p in self.pieces) == len(_TERMINATOR)):
                self.finished.set_result(True)
        elif self.framing == "length":
            self.remaining -= len(data)
            if self.remaining <= 0:
                self.finished.set_result(True)

    def _framing(self) -> None:
        lines = (self.head or b"").decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip().lower()
        self.headers = headers
        if "chunked" in headers.get("transfer-encoding", ""):
            self.framing = "chunked"
        elif "content-length" in headers:
            self.framing, self.remaining = "length", int(headers["content-length"])
        else:
            self.framing = "close"


class Pool:
    """Keep-alive connections to one `http://host:port`; at most as many as requests in flight."""

    def __init__(self, base_url: str, *, connect_timeout_s: float, read_timeout_s: float):
        parts = urlsplit(base_url)
        if parts.scheme != "http":
            raise ValueError(f"httpstream speaks plain http only, not {base_url!r}")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._idle: list[_Reader] = []
        self._head = f"Host: {self.host}:{self.port}\r\nContent-Type: application/json\r\nAccept: */*\r\n"

    async def _connect(self) -> _Reader:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, proto = await loop.create_connection(lambda: _Reader(loop), self.host, self.port)
        except TimeoutError as exc:
            raise ConnectError(f"no connection to {self.host}:{self.port} within {self.connect_timeout_s:g} s") from exc
        except OSError as exc:
            raise ConnectError(f"{self.host}:{self.port}: {exc}") from exc
        return proto

    def close(self) -> None:
        while self._idle:
            conn = self._idle.pop()
            if conn.transport is not None:
                conn.transport.close()

    async def post_stream(self, path: str, body: bytes) -> Response:
        """POST `body` (JSON) to `path` and read the answer: SSE payloads when 200, the whole body otherwise.
        A kept-alive connection the server closed meanwhile is replaced once, before anything was read."""
        conn = self._idle.pop() if self._idle else None
        if conn is not None and conn.lost:
            conn = None
        fresh = conn is None
        if conn is None:
            conn = await self._connect()
        reuse = False
        try:
            try:
                await self._exchange(conn, path, body)
            except RemoteProtocolError:
                if fresh or conn.head is not None:
                    raise
                if conn.transport is not None:  # a stale keep-alive connection: one new one, nothing answered
                    conn.transport.close()
                conn = await self._connect()
                await self._exchange(conn, path, body)
            resp, reuse = self._response(conn)
            return resp
        finally:
            if reuse and not conn.lost:
                self._idle.append(conn)
            elif conn.transport is not None:
                conn.transport.close()

    async def _exchange(self, conn: _Reader, path: str, body: bytes) -> None:
        conn._reset()
        assert conn.transport is not None
        conn.transport.write(f"POST {self.prefix}{path} HTTP/1.1\r\n{self._head}Content-Length: {len(body)}\r\n\r\n"
                             .encode("latin-1") + body)
        stall = self.read_timeout_s
        # the stall bound, checked a few times per bound rather than re-armed per received piece
        step = min(max(stall / 4, 0.05), 5.0)
        while True:
            left = stall - (time.monotonic() - conn.last)
            if left <= 0:
                raise ReadTimeout(f"no bytes for {stall:g} s")
            try:
                ok = await asyncio.wait_for(asyncio.shield(conn.finished), min(left, step))
                break
            except TimeoutError:
                continue
        if not ok:
            raise RemoteProtocolError("peer closed connection without sending complete message body"
                                      if conn.head is not None else "Server disconnected without sending a response.")

    def _response(self, conn: _Reader) -> tuple[Response, bool]:
        head = (conn.head or b"").decode("latin-1")
        first = head.split("\r\n", 1)[0]
        try:
            status = int(first.split(" ", 2)[1])
        except (IndexError, ValueError) as exc:
            raise RemoteProtocolError(f"bad status line {first[:100]!r}") from exc
        try:
            chunks = dechunk(conn.pieces) if conn.framing == "chunked" else conn.pieces
        except ValueError as exc:
            raise RemoteProtocolError(f"malformed chunked body: {exc}") from exc
        keep = conn.framing != "close" and conn.headers.get("connection") != "close"
        resp = Response(status)
        if status != 200:
            resp.body = b"".join(d for _, d in chunks)
            return resp, keep
        pending = b""
        events = resp.events
        for t, data in chunks:
            # the common case, one whole event per chunk ("data: {...}\n\n"), without splitting lines
            if not pending and data.startswith(b"data:") and data.find(b"\n") == len(data) - 2 \
                    and data.endswith(b"\n\n"):
                payload = data[5:-2].strip()
                if payload == DONE:
                    resp.done = True
                    break
                events.append((t, payload))
                continue
            pending, resp.done = split_sse(pending + data, t, events)
            if resp.done:
                break
        if pending and not resp.done:
            split_sse(pending + b"\n", chunks[-1][0], resp.events)
        return resp, keep
