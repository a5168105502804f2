"""A stand-in OpenAI-compatible server that streams as fast as it can: the load a measuring client must keep up with.

usage: python benchmarks/standin_server.py --port PORT [--tokens-per-chunk 1]

No model: `/v1/completions` and `/v1/chat/completions` answer `max_tokens` tokens (" tok"), `--tokens-per-chunk`
per SSE chunk, each chunk a separate HTTP/1.1 chunk written and handed to the socket before the next one (the
loop yields between them), in vLLM's chunk layout (id, object, created, model, choices[0] with text / delta,
logprobs, finish_reason, stop_reason; `usage` null), the last chunk with finish_reason "length", then, when
`stream_options.include_usage`, a chunk with empty choices and the usage, then `data: [DONE]`. Keep-alive
connections, as uvicorn serves vLLM's. `/v1/models` and `/metrics` answer as vLLM's do in shape (for
`vllm bench serve`'s and specbook's start-up checks). It serves a benchmark of clients, never a test of an engine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

MODEL = "standin"


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(obj: dict) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


def _plain(status: int, body: bytes, ctype: str = "application/json") -> bytes:
    reason = {200: "OK", 404: "Not Found", 400: "Bad Request"}.get(status, "Error")
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n\r\n"
            .encode() + body)


async def _stream(writer: asyncio.StreamWriter, body: dict, chat: bool, per_chunk: int) -> None:
    n = int(body.get("max_tokens") or 16)
    rid, created = f"cmpl-{time.monotonic_ns():x}", int(time.time())
    obj = "chat.completion.chunk" if chat else "text_completion"
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                 b"transfer-encoding: chunked\r\n\r\n")
    if chat:
        writer.write(_event({"id": rid, "object": obj, "created": created, "model": MODEL, "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]}))
    for start in range(0, n, per_chunk):
        k = min(per_chunk, n - start)
        last = start + k >= n
        choice: dict = {"index": 0}
        if chat:
            choice["delta"] = {"content": " tok" * k}
        else:
            choice["text"] = " tok" * k
        choice.update(logprobs=None, finish_reason="length" if last else None, stop_reason=None)
        writer.write(_event({"id": rid, "object": obj, "created": created, "model": MODEL, "choices": [choice],
                             "usage": None}))
        await writer.drain()
        await asyncio.sleep(0)  # one chunk per turn of the loop, as an engine's output queue hands them out
    if (body.get("stream_options") or {}).get("include_usage"):
        prompt = len(json.dumps(body.get("messages") if chat else body.get("prompt")).split())
        writer.write(_event({"id": rid, "object": obj, "created": created, "model": MODEL, "choices": [],
                             "usage": {"prompt_tokens": prompt, "total_tokens": prompt + n, "completion_tokens": n}}))
    writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await writer.drain()


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, per_chunk: int) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path = lines[0].split(" ")[:2]
            length = 0
            for line in lines[1:]:
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            raw = await reader.readexactly(length) if length else b""
            if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
                body = json.loads(raw)
                if body.get("stream"):
                    await _stream(writer, body, path.endswith("chat/completions"), per_chunk)
                else:
                    n = int(body.get("max_tokens") or 16)
                    writer.write(_plain(200, json.dumps({"choices": [{"index": 0, "text": " tok" * n,
                                 "finish_reason": "length"}], "usage": {"prompt_tokens": 1,
                                 "completion_tokens": n, "total_tokens": n + 1}}).encode()))
            elif path == "/v1/models":
                writer.write(_plain(200, json.dumps({"object": "list", "data": [
                    {"id": MODEL, "object": "model", "owned_by": "standin", "max_model_len": 1 << 20}]}).encode()))
            elif path in ("/metrics", "/health"):
                writer.write(_plain(200, b"", "text/plain"))
            else:
                writer.write(_plain(404, b'{"error":"not found"}'))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _main(port: int, per_chunk: int) -> None:
    server = await asyncio.start_server(lambda r, w: _handle(r, w, per_chunk), "127.0.0.1", port, backlog=4096)
    print(f"standin serving on http://127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    args = ap.parse_args()
    try:
        asyncio.run(_main(args.port, args.tokens_per_chunk))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
