"""A proxy set in the environment never sits between specbook and a local server.

HTTP(S)_PROXY / ALL_PROXY point at a port nothing listens on: a call that honoured them would fail. Readiness,
the version probe, the /metrics scrape and the requests of a window all reach the (stub) server directly. The
stub stands in for an engine: what is tested is specbook's own HTTP clients, not an engine's behaviour.
"""

from __future__ import annotations

import sys
from pathlib import Path

from specbook.serve.client import ChatRequest, run_requests_sync
from specbook.serve.metrics import scrape
from specbook.serve.server import ManagedServer, ServerSpec, free_port

STUB = Path(__file__).resolve().parents[1] / "fixtures" / "stub_servers" / "engine_stub.py"


def test_readiness_scrape_and_requests_ignore_a_proxy_from_the_environment(tmp_path, monkeypatch):
    dead_proxy = f"http://127.0.0.1:{free_port()}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, dead_proxy)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    port = free_port()
    spec = ServerSpec(name="stub", argv=[sys.executable, str(STUB), "--mode", "serving", "--port", str(port)],
                      port=port, log_path=tmp_path / "stub.log", model_name="stub", ready_timeout_s=60)
    with ManagedServer(spec) as server:
        before = scrape(server.base_url)
        records = run_requests_sync(server.base_url, "stub", [
            ChatRequest(prompt_id="p0", messages=[{"role": "user", "content": "hi"}], max_tokens=4)], progress=False)
        after = scrape(server.base_url)
    assert [r.error for r in records] == [None]
    assert (before.value("stub_requests_total"), after.value("stub_requests_total")) == (0, 1)
