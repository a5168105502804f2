"""benchmarks/run_cost.py: a server shared by several phases is one start; each phase keeps its own minutes."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "run_cost.py"
_spec = importlib.util.spec_from_file_location("run_cost", _PATH)
run_cost = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_cost)


def _server(name, t0, t1, ready, engine, **extra):
    return {"name": name, "started_at": f"2026-12-05T10:{t0:02d}:00+00:00", "stopped_at": f"2026-12-05T10:{t1:02d}:00+00:00",
            "ready_s": ready, "versions": {"engine": engine}, "extra": extra}


def _run(tmp_path: Path, servers: list[dict]) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"experiment": "cross_engine", "duration_s": 1200.0,
                                                      "servers": servers}))
    return folder


def test_a_shared_server_is_one_start_and_its_phases_keep_their_own_minutes(tmp_path):
    shared = _server("vllm-d", 0, 10, 60.0, "vllm", phases=["timed", "trace", "profile"],
                     phase_s={"timed": 300.0, "trace": 120.0, "profile": 60.0})
    old = _server("llamacpp-d-trace", 10, 12, 1.0, "llamacpp", **{"pass": "trace"})
    out = run_cost.cost(_run(tmp_path, [shared, old]))
    assert out["starts"] == 2 and out["shared_servers"] == 1
    assert out["engines"]["vllm"] == {"starts": 1, "ready_s": 60.0}
    assert out["phases"]["timed"] == {"servers": 1, "server_min": 5.0}
    assert out["phases"]["trace"] == {"servers": 2, "server_min": 2.0 + 2.0}  # 120 s shared + a 2-minute server
    assert out["phases"]["profile"]["server_min"] == pytest.approx(1.0)
    # the shared server's 10 minutes less its phases' 8: its start and teardown
    assert out["phases"]["start/stop"] == {"servers": 1, "server_min": pytest.approx(2.0)}
    assert out["starting_min"] == pytest.approx(61.0 / 60) and out["starting_share"] == pytest.approx(61.0 / 1200)
    table = run_cost.table([out])
    assert re.search(r"server starts \(shared by phases\) +2 \(1\)", table), table


def test_an_older_record_is_one_phase_for_its_whole_life():
    server = _server("vllm-d-prof", 0, 3, 50.0, "vllm", profiled_pass=True)
    assert run_cost.phases_of(server) == [("profile", None)]
    assert run_cost.phases_of(_server("vllm-d", 0, 3, 50.0, "vllm")) == [("timed", None)]
