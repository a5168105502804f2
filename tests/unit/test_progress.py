"""specbook.core.progress: console progress lines (unit of how many, ETA, requests and tok/s) kept out of the report."""

from __future__ import annotations

import io
import os

import pytest

from specbook.core import progress


def test_duration_and_eta():
    assert progress.duration(42.4) == "42 s"
    assert progress.duration(185) == "3 min 05 s"
    assert progress.duration(3720) == "1 h 02 min"
    assert progress.duration(None) == progress.duration(float("nan")) == "?"
    assert progress.eta(60.0, 2, 8) == pytest.approx(180.0)
    assert progress.eta(0.0, 0, 8) is None


def test_requests_line_gives_tok_s():
    assert progress.requests_line(23, 24, 812, 31.0) == "23/24 requests ok, 812 tokens in 31 s (26.2 tok/s)"


def test_units_count_and_estimate_from_the_units_timed(monkeypatch, tmp_path):
    log = tmp_path / "progress.log"
    monkeypatch.setenv(progress.ENV, str(log))
    now = [0.0]
    units = progress.Units("knob A/B run", 4, clock=lambda: now[0])
    assert units.start("00-sweep0-baseline") == "knob A/B run 1/4: 00-sweep0-baseline"
    now[0] = 30.0
    units.skip("01-sweep0-fp32")  # a resumed run's finished unit: no time of its own
    assert units.start("02-sweep0-int4") == "knob A/B run 3/4: 02-sweep0-int4 (ETA 1 min 00 s)"
    now[0] = 80.0
    assert units.start("03-sweep1-int4") == "knob A/B run 4/4: 03-sweep1-int4 (ETA 40 s)"
    lines = log.read_text().splitlines()
    assert lines[1] == "[specbook] knob A/B run 2/4: 01-sweep0-fp32 already done (resumed run), skipped"
    assert len(lines) == 4


def test_without_the_progress_file_lines_go_to_stderr(monkeypatch, capsys):
    monkeypatch.delenv(progress.ENV, raising=False)
    progress.note("server ready in 3 s")
    assert capsys.readouterr().err == "[specbook] server ready in 3 s\n"


def test_console_copies_lines_written_by_another_process_and_restores_the_env(tmp_path, monkeypatch):
    import subprocess
    import sys

    monkeypatch.delenv(progress.ENV, raising=False)
    out = io.StringIO()
    with progress.console(tmp_path / "logs" / "progress.log", out, poll_s=0.05) as path:
        assert os.environ[progress.ENV] == str(path)
        # a kernel inherits the runner's environment: a child process writes through the same variable
        subprocess.run([sys.executable, "-c", "from specbook.core import progress; progress.note('arm 1/2: a')"],
                       check=True, env=dict(os.environ))
    assert out.getvalue() == "[specbook] arm 1/2: a\n"
    assert progress.ENV not in os.environ
