"""Shared by the e2e tests: run one book experiment through the real CLI and return its run folder."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

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
KNOB_AB_DEMO = "params/knob_ab/cpu-demo.yaml"
KNOB_AB_DEMO_OVERRIDES = ["crossed=false", "workload.subset=6", "workload.max_tokens=96", "sweeps_max=2"]


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
