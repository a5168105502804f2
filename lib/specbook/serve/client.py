"""Async OpenAI-compatible client: bounded concurrency, streamed TTFT / inter-token latency, every request kept.

A failed request becomes a record with its error text; only when every request fails does
`run_requests` raise (ClientError, with the records attached as `.records`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from tqdm import tqdm

from specbook.core.errors import ClientError
from specbook.serve import clientcpu, httpstream

_T = TypeVar("_T")


def turn_id(prompt_id: str, turn: int) -> str:
    """The prompt id of one turn of a conversation: the first keeps the request's id, later ones `ID/turnN`."""
    return prompt_id if turn == 1 else f"{prompt_id}/turn{turn}"


class ChatRequest(BaseModel):
    """One request: chat (`messages`) or plain completion (`prompt`), greedy by default.

    `follow_up`: further user turns of one conversation (MT-Bench's second question). Each is sent after the
    previous turn's answer came back, as messages + [assistant: that answer, user: the follow-up], so the
    model continues from its own answer; every turn gets its own record (`turn` 2.., prompt id `ID/turnN`).
    """

    model_config = ConfigDict(extra="forbid")

    prompt_id: str
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    max_tokens: int = Field(default=256, gt=0)
    temperature: float = Field(default=0.0, ge=0)
    seed: int | None = None
    ignore_eos: bool = False
    extra_body: dict[str, Any] = Field(default_factory=dict)
    category: str | None = None  # the workload's task category, carried into every record
    follow_up: list[str] = Field(default_factory=list)

    @field_validator("prompt_id", mode="before")
    @classmethod
    def _id_as_text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) else v

    @model_validator(mode="after")
    def _one_input(self) -> ChatRequest:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError(f"request {self.prompt_id!r}: give exactly one of 'messages' or 'prompt'")
        if self.follow_up and self.messages is None:
            raise ValueError(f"request {self.prompt_id!r}: 'follow_up' turns need a chat request ('messages')")
        return self

    def next_turn(self, answer: str, prompt_id: str) -> ChatRequest:
        """The conversation's next request: these messages, the model's `answer` to them, the first follow-up
        as the new user turn; the follow-ups after it stay for the turns after that."""
        if self.messages is None or not self.follow_up:
            raise ValueError(f"request {self.prompt_id!r}: no follow-up turn left")
        messages = [*self.messages, {"role": "assistant", "content": answer},
                    {"role": "user", "content": self.follow_up[0]}]
        return self.model_copy(update={"prompt_id": prompt_id, "messages": messages,
                                       "follow_up": self.follow_up[1:]})

    @property
    def endpoint(self) -> str:
        return "/v1/chat/completions" if self.messages is not None else "/v1/completions"

    def payload(self, model: str, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "max_tokens": self.max_tokens, "temperature": self.temperature}
        if self.messages is not None:
            body["messages"] = self.messages
        else:
            body["prompt"] = self.prompt
        if self.seed is not None:
            body["seed"] = self.seed
        if self.ignore_eos:  # a vLLM / SGLang extension: sent only when asked, other servers may refuse it
            body["ignore_eos"] = True
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        body.update(self.extra_body)
        return body


class RequestRecord(BaseModel):
    """What one request produced and how long it took (times in seconds; started_at is Unix time)."""

    prompt_id: str
    category: str | None = None
    turn: int = 1  # 1, or 2.. for a request's follow-up turns
    output_text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    ttft_s: float | None = None
    itl_mean_s: float | None = None
    # Gaps between content chunks: with speculative decoding one chunk may carry several tokens.
    itl_s: list[float] = Field(default_factory=list)
    # (wall - ttft) / (completion_tokens - 1): time per output token after the first.
    tpot_s: float | None = None
    chunks: int = 0
    wall_s: float = 0.0
    started_at: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _content_of(chunk: dict[str, Any]) -> tuple[str, str | None]:
    """(text, finish_reason) of one chat or completion chunk/response."""
    choices = chunk.get("choices") or []
    if not choices:
        return "", None
    choice = choices[0]
    if "delta" in choice:
        text = (choice.get("delta") or {}).get("content") or ""
    elif "message" in choice:
        text = (choice.get("message") or {}).get("content") or ""
    else:
        text = choice.get("text") or ""
    return text, choice.get("finish_reason")


def _apply_usage(rec: RequestRecord, usage: dict[str, Any] | None) -> None:
    if usage:
        rec.prompt_tokens = usage.get("prompt_tokens")
        rec.completion_tokens = usage.get("completion_tokens")


def _finish_timings(rec: RequestRecord) -> None:
    if rec.itl_s:
        rec.itl_mean_s = sum(rec.itl_s) / len(rec.itl_s)
    if rec.ttft_s is not None and rec.completion_tokens and rec.completion_tokens > 1:
        rec.tpot_s = (rec.wall_s - rec.ttft_s) / (rec.completion_tokens - 1)


async def _stream_one(http: Transport, req: ChatRequest, model: str, rec: RequestRecord, t0: float) -> None:
    if http.pool is None:
        assert http.httpx is not None
        return await _stream_one_httpx(http.httpx, req, model, rec, t0)
    resp = await http.pool.post_stream(req.endpoint, json.dumps(req.payload(model, stream=True)).encode())
    if resp.status != 200:
        raise ClientError(f"HTTP {resp.status}: {resp.body.decode(errors='replace')[:500]}")
    _read_events(resp.events, rec, t0)


def _read_events(events: Sequence[tuple[float, bytes]], rec: RequestRecord, t0: float) -> None:
    """A finished stream's SSE payloads (arrival time, JSON bytes) into the record: TTFT at the first chunk with
    text, one ITL per later chunk with text, the finish reason and the usage chunk's token counts."""
    parts: list[str] = []
    itl: list[float] = []
    last_token_t: float | None = None
    try:  # one decode for the whole stream: a malformed payload is then found (and named) one by one
        chunks = json.loads(b"[" + b",".join(data for _, data in events) + b"]") if events else []
    except ValueError:
        chunks = [json.loads(data) for _, data in events]
    finish = usage = None
    try:
        for (now, _), chunk in zip(events, chunks, strict=True):
            if "error" in chunk:
                raise ClientError(f"server error in stream: {json.dumps(chunk['error'])[:500]}")
            text, done = _content_of(chunk)
            if text:
                if last_token_t is None:
                    rec.ttft_s = now - t0
                else:
                    itl.append(now - last_token_t)
                last_token_t = now
                parts.append(text)
            if done:
                finish = done
            if chunk.get("usage"):
                usage = chunk["usage"]
    finally:  # what came before an error stays in the record, as when it is read chunk by chunk
        rec.itl_s = itl
        rec.chunks = len(parts)
        if finish:
            rec.finish_reason = finish
        _apply_usage(rec, usage)
    rec.output_text = "".join(parts)


async def _stream_one_httpx(http: httpx.AsyncClient, req: ChatRequest, model: str, rec: RequestRecord,
                            t0: float) -> None:
    parts: list[str] = []
    last_token_t: float | None = None
    async with http.stream("POST", req.endpoint, json=req.payload(model, stream=True)) as resp:
        if resp.status_code != 200:
            body = (await resp.aread()).decode(errors="replace")
            raise ClientError(f"HTTP {resp.status_code}: {body[:500]}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue  # SSE comments, blank separators, event names
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise ClientError(f"server error in stream: {json.dumps(chunk['error'])[:500]}")
            now = time.perf_counter()
            text, finish = _content_of(chunk)
            if text:
                if last_token_t is None:
                    rec.ttft_s = now - t0
                else:
                    rec.itl_s.append(now - last_token_t)
                last_token_t = now
                rec.chunks += 1
                parts.append(text)
            if finish:
                rec.finish_reason = finish
            _apply_usage(rec, chunk.get("usage"))
    rec.output_text = "".join(parts)


async def _post_one(http: Transport, req: ChatRequest, model: str, rec: RequestRecord) -> None:
    assert http.httpx is not None
    resp = await http.httpx.post(req.endpoint, json=req.payload(model, stream=False))
    if resp.status_code != 200:
        raise ClientError(f"HTTP {resp.status_code}: {resp.text[:500]}")
    body = resp.json()
    rec.output_text, rec.finish_reason = _content_of(body)
    _apply_usage(rec, body.get("usage"))


class Transport:
    """What a window's requests go through: streamed ones through httpstream's pool (plain http) or httpx
    (`transport="httpx"`, or an https server); non-streamed ones through httpx."""

    def __init__(self, pool: httpstream.Pool | None, http: httpx.AsyncClient | None):
        self.pool = pool
        self.httpx = http


TRANSPORTS = ("httpstream", "httpx")

STALLED = "Stalled"  # error prefix of requests not sent because an earlier one got no token in time


async def _send_turn(
    http: Transport, req: ChatRequest, model: str, stream: bool, stalled: asyncio.Event, turn: int,
) -> RequestRecord:
    rec = RequestRecord(prompt_id=req.prompt_id, category=req.category, turn=turn, started_at=time.time())
    t0 = time.perf_counter()
    if stalled.is_set():  # the server stopped answering: do not wait the stall bound once per request
        rec.error = f"{STALLED}: not sent, an earlier request received no token within the stall bound"
        rec.wall_s = 0.0
        return rec
    try:
        if stream:
            await _stream_one(http, req, model, rec, t0)
        else:
            await _post_one(http, req, model, rec)
    except (httpx.ReadTimeout, httpstream.ReadTimeout) as exc:
        stalled.set()
        rec.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    except (httpx.HTTPError, httpstream.HTTPStreamError, ClientError, ValueError, KeyError, TypeError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    rec.wall_s = time.perf_counter() - t0
    _finish_timings(rec)
    return rec


async def _run_one(
    http: Transport, sem: asyncio.Semaphore, req: ChatRequest, model: str, stream: bool,
    stalled: asyncio.Event,
) -> list[RequestRecord]:
    """A request and its follow-up turns, one after another in one concurrency slot: one record per turn."""
    async with sem:
        current = req
        records = [await _send_turn(http, current, model, stream, stalled, 1)]
        for turn in range(2, len(req.follow_up) + 2):
            previous = records[-1]
            if previous.error is not None:  # no answer to continue from
                records.append(RequestRecord(
                    prompt_id=turn_id(req.prompt_id, turn), category=req.category, turn=turn,
                    started_at=time.time(), error=f"not sent: turn {turn - 1} failed ({previous.error[:200]})"))
                continue
            current = current.next_turn(previous.output_text, turn_id(req.prompt_id, turn))
            records.append(await _send_turn(http, current, model, stream, stalled, turn))
        return records


async def run_requests(
    base_url: str,
    model: str,
    requests: Sequence[ChatRequest],
    *,
    concurrency: int = 8,
    stream: bool = True,
    timeout_s: float = 600,
    stall_timeout_s: float | None = None,
    progress: bool = True,
    desc: str | None = None,
    transport: str = "httpstream",
    cpu: list[clientcpu.ClientCpu] | None = None,
) -> list[RequestRecord]:
    """Send `requests` with at most `concurrency` in flight; records come back in input order, a request's
    follow-up turns right after it (one record per turn).

    `timeout_s` bounds connecting and a whole non-streamed response; `stall_timeout_s` (default: the same)
    bounds the wait for the next bytes of a response: a streamed request that receives no token for that
    long fails with ReadTimeout instead of waiting on a server that stopped making progress.

    `transport`: "httpstream" (the default: serve/httpstream.py, streamed requests to a plain-http server) or
    "httpx" (the client before it; https servers and non-streamed requests always go through httpx). `cpu`: a
    list that receives the client's own CPU use over the requests (clientcpu.ClientCpu: the event loop's CPU share, its run-queue wait), measured on the loop's thread.
    """
    if concurrency < 1:
        raise ClientError(f"concurrency must be >= 1, got {concurrency}")
    if not requests:
        return []
    if transport not in TRANSPORTS:
        raise ClientError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    read_s = stall_timeout_s if stall_timeout_s is not None else timeout_s
    pool = (httpstream.Pool(base_url, connect_timeout_s=timeout_s, read_timeout_s=read_s)
            if stream and transport == "httpstream" and base_url.startswith("http://") else None)
    meter = clientcpu.LoopMeter() if cpu is not None else None
    async with contextlib.AsyncExitStack() as stack:
        http = None
        if pool is None or not stream:
            # trust_env=False: a proxy from the environment must not sit between us and a local server.
            http = await stack.enter_async_context(httpx.AsyncClient(
                base_url=base_url.rstrip("/"), limits=limits, trust_env=False,
                timeout=httpx.Timeout(timeout_s, read=read_s)))
        stalled = asyncio.Event()
        via = Transport(pool, http)
        tasks = [asyncio.ensure_future(_run_one(via, sem, r, model, stream, stalled)) for r in requests]
        try:
            if not progress:
                await asyncio.gather(*tasks)
            else:
                with tqdm(total=len(tasks), desc=desc or model, file=sys.stderr) as bar:
                    for fut in asyncio.as_completed(tasks):
                        recs = await fut
                        bar.update(1)
                        if any(r.error for r in recs):
                            bar.set_postfix_str(f"last error: {next(r.error for r in recs if r.error)[:60]}")
        except asyncio.CancelledError:  # an interrupt: every stream ends (its connection closed) before we go
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if pool is not None:
                pool.close()
            await asyncio.sleep(0)  # a closed transport shuts its socket on the loop's next turn: let it come
            raise
        finally:
            if pool is not None:
                pool.close()
            if meter is not None and cpu is not None:
                cpu.append(meter.stop(requests=len(requests)))
        records = [r for t in tasks for r in t.result()]
    if all(r.error for r in records):
        err = ClientError(
            f"all {len(records)} requests to {base_url} (model {model!r}) failed; first: {records[0].error}"
        )
        err.records = records  # type: ignore[attr-defined]
        raise err
    return records


# How long an interrupted call waits for its requests to be cancelled and their connections closed: a server
# whose client keeps its streams open waits for them to close before it shuts down (uvicorn: until its grace)
CLOSE_BOUND_S = 2.0


def run_sync(make: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run the coroutine `make()` returns from synchronous code, also inside a running loop (Jupyter: a worker
    thread runs it). An interrupt (Ctrl-C, SIGTERM as KeyboardInterrupt) cancels it and waits, at most
    CLOSE_BOUND_S, until its connections are closed, before it goes on: the server is stopped only after."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())  # asyncio.run cancels its task on Ctrl-C, closing the connections
    loop = asyncio.new_event_loop()
    started, finished = threading.Event(), threading.Event()
    task: list[asyncio.Task[_T]] = []

    def work() -> _T:
        asyncio.set_event_loop(loop)
        try:
            task.append(loop.create_task(make()))
            started.set()
            return loop.run_until_complete(task[0])
        finally:
            started.set()
            loop.close()
            finished.set()

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="specbook-client")
    try:
        # submitted inside the try: a fast client connects before submit returns, and an interrupt arriving
        # then must cancel it too
        return pool.submit(work).result()
    except BaseException:
        if not finished.is_set() and started.wait(CLOSE_BOUND_S) and task:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing left to cancel
                loop.call_soon_threadsafe(task[0].cancel)
            finished.wait(CLOSE_BOUND_S)
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def run_requests_sync(base_url: str, model: str, requests: Sequence[ChatRequest], **kwargs: Any) -> list[RequestRecord]:
    """`run_requests` from synchronous code, also inside a running loop (Jupyter); an interrupt closes its
    connections before it goes through (run_sync)."""
    return run_sync(lambda: run_requests(base_url, model, requests, **kwargs))


def records_frame(records: Sequence[RequestRecord]):
    """One row per request (itl_s stays a list column; parquet keeps it)."""
    import pandas as pd

    columns = list(RequestRecord.model_fields)
    return pd.DataFrame([r.model_dump() for r in records], columns=columns)
