"""Readiness must be answered by this server for this model (the deliberately simple stub stands in for no engine)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from specbook.core.errors import ServerStartError
from specbook.serve.server import ManagedServer, ServerSpec, free_port

STUB = Path(__file__).resolve().parents[1] / "fixtures" / "stub_servers" / "engine_stub.py"


def _spec(tmp_path: Path, model_name: str | None) -> ServerSpec:
    port = free_port()
    return ServerSpec(name="stub", argv=[sys.executable, str(STUB), "--mode", "healthy", "--port", str(port)],
                      port=port, log_path=tmp_path / "stub.log", model_name=model_name, ready_timeout_s=60)


def test_a_model_list_without_our_model_is_not_ready(tmp_path):
    server = ManagedServer(_spec(tmp_path, "smollm2"))
    with pytest.raises(ServerStartError, match=r"serves \['stub'\], not 'smollm2'"):
        with server:
            pass
    assert server.surviving_pids() == []


def test_our_process_listing_our_model_is_ready(tmp_path):
    with ManagedServer(_spec(tmp_path, "stub")) as server:
        assert server.ready_s is not None and server.ready_s > 0
    assert server.surviving_pids() == []
