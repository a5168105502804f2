"""Shared by the e2e tests: run one book experiment through the real CLI and return its run folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from specbook.paths import project_root


@pytest.fixture(scope="session")
def embedded_target() -> None:
    """The embedded target must be prepared (`make test` prepares it); otherwise the test says why it cannot run."""
    from specbook.errors import ModelNotPreparedError
    from specbook.models import TARGET, model_path

    try:
        model_path(TARGET)
    except ModelNotPreparedError:
        pytest.skip("embedded target not prepared: run `specbook models prepare`")


@pytest.fixture(scope="session")
def run_book():
    return _run_book


# The reduced knob A/B CPU demo (knobs one at a time, fewer and shorter requests): 3 arms x 2 sweeps = 6 runs.
# One wave of 4 requests (= workload.concurrency, so every request is in flight together) with 2-shot prompts:
# the positive control's AL gap (about 1 token: 3.4-3.6 vs 4.5-4.6) and the steady-state intervals need no more,
# and a run's requests take 9-30 s instead of 18-50 s (this fixture and the resume test run 12 runs between them).
KNOB_AB_DEMO = "params/knob_ab/cpu-demo.yaml"
KNOB_AB_DEMO_OVERRIDES = ["crossed=false", "workload.subset=4", "workload.shots=2", "workload.max_tokens=64",
                          "sweeps_max=2"]


@pytest.fixture(scope="session")
def knob_ab_demo() -> tuple[str, list[str]]:
    """(params file, overrides) of the reduced knob A/B demo."""
    return KNOB_AB_DEMO, list(KNOB_AB_DEMO_OVERRIDES)


@pytest.fixture(scope="session")
def knob_ab_demo_run(tmp_path_factory) -> Path:
    """The reduced knob A/B demo, run once per session: test_knob_ab_demo checks it, test_resume_knob_ab
    compares a killed and resumed run with it."""
    return _run_book("knob_ab", KNOB_AB_DEMO, KNOB_AB_DEMO_OVERRIDES, tmp_path_factory.mktemp("outputs"),
                     timeout=2400)


@dataclass
class AsOpened:
    notebook: object  # the executed nbformat notebook, outputs in it
    run_dirs: list[Path]  # the run folders it left under outputs/config_flip/
    seconds: float


@pytest.fixture(scope="session")
def config_flip_as_opened(tmp_path_factory, embedded_target) -> AsOpened:
    """config_flip.ipynb run top to bottom as Jupyter runs it, its parameters cell untouched (the CPU demo: two
    measured vLLM-CPU arms, then each arm's trace pass and profiled pass), once per session: the as-opened test
    checks it ran so, test_config_flip_demo checks the demo's findings in it (a second demo run cost ~8 min)."""
    import nbformat
    from tests.e2e.as_jupyter import execute_as_jupyter, notebook_path

    outputs = tmp_path_factory.mktemp("as_opened") / "outputs"
    nb = nbformat.read(notebook_path("config_flip"), as_version=4)
    previous = os.environ.get("SPECBOOK_OUTPUTS")
    os.environ["SPECBOOK_OUTPUTS"] = str(outputs)  # the kernel inherits this environment
    t0 = time.monotonic()
    try:
        execute_as_jupyter(nb, timeout=3000)
    finally:
        if previous is None:
            os.environ.pop("SPECBOOK_OUTPUTS", None)
        else:
            os.environ["SPECBOOK_OUTPUTS"] = previous
    seconds = time.monotonic() - t0
    print(f"config_flip as opened: {seconds:.0f} s")
    folder = outputs / "config_flip"
    return AsOpened(nb, sorted(folder.iterdir()) if folder.is_dir() else [], seconds)


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# `specbook ...` with the fixture experiments (tests/fixtures/notebooks/fixture_experiments.py) registered
FIXTURE_CLI = (f"import sys; sys.path.insert(0, {str(FIXTURES / 'notebooks')!r}); import fixture_experiments; "
               "from specbook.cli import main; sys.exit(main(sys.argv[1:]))")
# A distinct secret per channel a run takes in; test_secrets_never_written looks for each in every file.
PLANTED_SECRETS = {
    "launching env": "e2e-launch-env-7Q2ZK",
    "params env": "e2e-params-env-M4XW9",
    "override": "e2e-override-R8PLT",
    "extra arg": "e2e-extra-arg-V3NDB",
    "extra arg URL": "e2e-url-arg-H6JCS",
    "params URL": "e2e-url-desc-Y5TGE",
}


@pytest.fixture(scope="session")
def planted_secrets() -> dict[str, str]:
    return dict(PLANTED_SECRETS)


@pytest.fixture(scope="session")
def fixture_serve_run(tmp_path_factory, embedded_target) -> Path:
    """`specbook run fixture_serve` (one real vLLM-CPU server: the embedded target with n-gram speculation on the
    fixture params' 4 prompts) with a secret planted in every channel, run once per session and never changed:
    test_secrets_never_written checks that no secret reaches a file of it, test_runner_real_engine checks the
    runner's records of the real server (one server start for both; a test that changes a run works on a copy).

    The channels: the launching environment (MY_API_TOKEN, inherited by the kernel and the server);
    engine.env.E2E_SERVICE_TOKEN in params (on the server's `Env:` line) and a URL with user:password@ in the
    description; a `-p` override (engine.env.E2E_DB_PASSWORD); extra_args `--hf-token SECRET` (the model is a
    local folder, so it is never used) and a URL with user:password@ as `--disable-access-log-for-endpoints`
    (no request uses that path), which vLLM prints among its non-default args."""
    work = tmp_path_factory.mktemp("fixture_serve")
    params = yaml.safe_load((FIXTURES / "params" / "fixture_serve" / "ngram.yaml").read_text())
    params["name"] = "ngram-secrets"
    params["description"] = (f"weights mirrored from https://alice:{PLANTED_SECRETS['params URL']}"
                             "@example.invalid/models")
    params["engine"]["env"] = {"E2E_SERVICE_TOKEN": PLANTED_SECRETS["params env"]}
    params["engine"]["extra_args"] = [
        "--hf-token", PLANTED_SECRETS["extra arg"],
        "--disable-access-log-for-endpoints", f"http://bob:{PLANTED_SECRETS['extra arg URL']}@127.0.0.1/x",
    ]
    params_file = work / "ngram-secrets.yaml"
    params_file.write_text(yaml.safe_dump(params))
    env = {**os.environ, "MY_API_TOKEN": PLANTED_SECRETS["launching env"]}
    proc = subprocess.run(
        [sys.executable, "-c", FIXTURE_CLI, "run", "fixture_serve", "-f", str(params_file),
         "-p", f"engine.env.E2E_DB_PASSWORD={PLANTED_SECRETS['override']}", "--outputs", str(work / "outputs"),
         "--no-progress"],
        capture_output=True, text=True, timeout=900, env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    lines = dict(ln.split(": ", 1) for ln in proc.stdout.splitlines() if ": " in ln)
    return Path(lines["run folder"])


def _run_book(experiment: str, params_file: str, overrides: list[str], outputs: Path, timeout: int = 1800) -> Path:
    """`specbook run EXPERIMENT -f PARAMS -p ...` in a subprocess; fails the test with the output's tail."""
    cmd = [sys.executable, "-m", "specbook", "run", experiment, "-f", params_file, "--outputs", str(outputs)]
    for override in overrides:
        cmd += ["-p", override]
    proc = subprocess.run(cmd, cwd=project_root(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"specbook run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    match = re.search(r"^run folder: (.+)$", proc.stdout, re.MULTILINE)
    assert match, proc.stdout
    return Path(match.group(1).strip())
