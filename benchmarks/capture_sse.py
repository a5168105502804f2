"""Capture the raw bytes of streamed answers from real servers, for the client's parser tests (tests/fixtures/sse).

usage: python benchmarks/capture_sse.py --params params/knob_ab/cpu-demo.yaml --name vllm

Launches the params file's engine server (specbook's adapter), sends one streamed /v1/completions and one
streamed /v1/chat/completions request (usage included) over a plain socket, and writes each response exactly as
received (status line, headers, chunked body) to tests/fixtures/sse/NAME_completions.http / NAME_chat.http.
"""

from __future__ import annotations

import argparse
import json
import socket
import tempfile
from pathlib import Path

import yaml

from specbook.core.paths import project_root
from specbook.engines import launch
from specbook.engines.base import EngineConfig


def raw_post(host: str, port: int, path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    with socket.create_connection((host, port), timeout=120) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                  f"Connection: close\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def main() -> None:
    root = project_root()
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=Path, required=True)
    ap.add_argument("--name", required=True)
    args = ap.parse_args()
    cfg = EngineConfig(**yaml.safe_load(args.params.read_text())["engine"])
    out = root / "tests/fixtures/sse"
    out.mkdir(parents=True, exist_ok=True)
    with launch(cfg, name="capture", log_path=Path(tempfile.mkdtemp()) / "server.log") as managed:
        host, port = managed.base_url.rsplit("//", 1)[1].rsplit(":", 1)
        model = managed.model_name or cfg.client_model_name()
        common = {"model": model, "max_tokens": 24, "temperature": 0, "stream": True,
                  "stream_options": {"include_usage": True}}
        comp = raw_post(host, int(port), "/v1/completions", {**common, "prompt": "The capital of France is"})
        chat = raw_post(host, int(port), "/v1/chat/completions",
                        {**common, "messages": [{"role": "user", "content": "Name three colours."}]})
    (out / f"{args.name}_completions.http").write_bytes(comp)
    (out / f"{args.name}_chat.http").write_bytes(chat)
    print(f"wrote {out}/{args.name}_*.http ({len(comp)} and {len(chat)} bytes)")


if __name__ == "__main__":
    main()
