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
