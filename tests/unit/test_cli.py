"""cli: subprocess smoke of the real command, exit codes, `error:` lines without tracebacks.

The fixture experiments are not in the package, so the subprocess registers them first through a
one-line wrapper around specbook.cli.main (the same entry point the `specbook` script calls).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specbook.cli import EXIT_BAD_INPUT, EXIT_FAILED, build_parser, exit_code_for, infer_experiment
from specbook.core.errors import (
    ExperimentError,
    IngestError,
    ModelNotPreparedError,
    ModelPrepareError,
    NotebookExecutionError,
    ParamsError,
    RunError,
    ServerStartError,
)
from specbook.store.manifest import read_manifest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NOTEBOOKS = FIXTURES / "notebooks"
PARAMS = FIXTURES / "params" / "fixture_good"
SPECBOOK = Path(sys.executable).with_name("specbook")
WRAPPER = (
    f"import sys; sys.path.insert(0, {str(NOTEBOOKS)!r}); import fixture_experiments; "
    "from specbook.cli import main; sys.exit(main(sys.argv[1:]))"
)


def specbook(
    *args: str, with_fixtures: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    argv = (
        [sys.executable, "-c", WRAPPER, *args] if with_fixtures else [sys.executable, "-m", "specbook", *args]
    )
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


def assert_clean_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    error_lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert error_lines, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)


# --------------------------------------------------------------------------------------------------
# help


def test_help_lists_the_subcommands_and_is_fast():
    t0 = time.monotonic()
    proc = specbook("--help", with_fixtures=False)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0
    for cmd in ("run", "list", "render", "check", "models", "ingest"):
        assert cmd in proc.stdout
    # heavy modules are imported lazily: help must not pull in pandas/papermill/vllm
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from specbook.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('pandas', 'papermill', 'vllm', 'torch') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "[]"
    assert elapsed < 20


@pytest.mark.skipif(not SPECBOOK.exists(), reason="console script not installed")
def test_console_script_help():
    proc = subprocess.run([str(SPECBOOK), "run", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "-f PARAMS_FILE" in proc.stdout and "KEY=VALUE" in proc.stdout


def test_parser_collects_repeated_overrides():
    args = build_parser().parse_args(["run", "knob_ab", "-f", "x.yaml", "-p", "a=1", "-p", "arms.0.env.X=2"])
    assert args.override == ["a=1", "arms.0.env.X=2"] and args.experiment == "knob_ab"
    args = build_parser().parse_args(["models", "prepare", "--only", "a", "b", "--force"])
    assert args.only == ["a", "b"] and args.force and not args.verify_only


# --------------------------------------------------------------------------------------------------
# check


def test_check_good_file_infers_the_experiment_from_its_folder():
    proc = specbook("check", str(PARAMS / "small.yaml"))
    assert proc.returncode == 0, proc.stderr
    assert "is valid params for fixture_good" in proc.stdout


def test_check_bad_field_exits_2_naming_file_and_field():
    proc = specbook("check", str(PARAMS / "bad_type.yaml"))
    assert_clean_error(proc, 2, "bad_type.yaml: env.FOO: Input should be a valid string")


def test_check_yaml_syntax_error_names_the_line():
    proc = specbook("check", str(PARAMS / "bad_syntax.yaml"))
    assert_clean_error(proc, 2, "bad_syntax.yaml: YAML syntax error at line 4")


def test_check_unknown_field_and_bad_override():
    assert_clean_error(
        specbook("check", str(PARAMS / "unknown_field.yaml")), 2, "colums: Extra inputs are not permitted"
    )
    assert_clean_error(
        specbook("check", str(PARAMS / "small.yaml"), "-p", "rows=zero"),
        2,
        "rows: Input should be a valid integer",
    )


def test_check_unknown_experiment_says_how_to_name_it(tmp_path):
    path = tmp_path / "nowhere" / "x.yaml"
    path.parent.mkdir()
    path.write_text("name: x\n")
    proc = specbook("check", str(path))
    assert_clean_error(proc, 2, "unknown experiment 'nowhere'", "fixture_good", "--experiment")
    ok = specbook("check", str(path), "--experiment", "fixture_good", "-p", "rows=3")
    assert ok.returncode == 0, ok.stderr


def test_infer_experiment():
    assert infer_experiment("params/knob_ab/base.yaml") == "knob_ab"


# --------------------------------------------------------------------------------------------------
# run / list / render


def test_run_with_bad_params_exits_2_and_makes_nothing(tmp_path):
    proc = specbook("run", "fixture_good", "-f", str(PARAMS / "bad_type.yaml"), "--outputs", str(tmp_path))
    assert_clean_error(proc, 2, "env.FOO")
    assert list(tmp_path.iterdir()) == []


def test_run_unknown_experiment_exits_2(tmp_path):
    proc = specbook("run", "nope", "-f", str(PARAMS / "small.yaml"), "--outputs", str(tmp_path))
    assert_clean_error(proc, 2, "unknown experiment 'nope'")


def test_run_list_render_through_the_cli(tmp_path):
    good = specbook(
        "run",
        "fixture_good",
        "-f",
        str(PARAMS / "small.yaml"),
        "-p",
        "rows=4",
        "--outputs",
        str(tmp_path),
        "--no-progress",
    )
    assert good.returncode == 0, good.stderr
    lines = dict(ln.split(": ", 1) for ln in good.stdout.splitlines() if ": " in ln)
    run_dir = Path(lines["run folder"])
    assert lines["report"] == str(run_dir / "report.html") and Path(lines["report"]).is_file()
    assert read_manifest(run_dir).status == "ok"

    broken = specbook(
        "run", "fixture_broken", "-f", str(PARAMS / "small.yaml"), "--outputs", str(tmp_path), "--no-progress"
    )
    assert_clean_error(broken, 1, "cell 2", "deliberate failure in the third cell")
    broken_dir = Path(
        dict(ln.split(": ", 1) for ln in broken.stdout.splitlines() if ": " in ln)["run folder"]
    )
    m = read_manifest(broken_dir)
    assert m.status == "failed" and m.failed_cell.notebook_index == 2
    assert (broken_dir / "report.html").is_file() and (
        broken_dir / "data" / "before_failure.parquet"
    ).is_file()

    listed = specbook("list", "--outputs", str(tmp_path), with_fixtures=False)
    assert listed.returncode == 0, listed.stderr
    rows = {ln.split()[1]: ln.split()[2] for ln in listed.stdout.splitlines()[1:]}
    assert rows == {run_dir.name: "ok", broken_dir.name: "failed"}

    # render runs this project's notebook for the run's experiment, never the path the manifest names
    manifest_path = run_dir / "manifest.json"
    doc = json.loads(manifest_path.read_text())
    doc["notebook"] = str(tmp_path / "someone-elses.ipynb")
    manifest_path.write_text(json.dumps(doc))
    rendered = specbook("render", str(run_dir), "--no-progress")
    assert rendered.returncode == 0, rendered.stderr
    assert (run_dir / "renders" / "1" / "report.html").is_file()
    assert "reuse_data=True" in (run_dir / "report.html").read_text()
    assert read_manifest(run_dir).renders[-1].notebook == str(NOTEBOOKS / "good.ipynb")
    # an experiment this checkout does not know cannot be rendered: a clean error names it
    unknown = specbook("render", str(run_dir), "--no-progress", with_fixtures=False)
    assert_clean_error(unknown, 2, "fixture_good")


def test_sigterm_stops_the_cell_and_finalizes_the_manifest(tmp_path):
    # `timeout` and schedulers send SIGTERM: the running cell must still stop its child (a server in
    # real runs) and the manifest must say the run was interrupted, not stay "running"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRAPPER, "run", "fixture_good", "-f", str(PARAMS / "small.yaml"),
         "--notebook", str(NOTEBOOKS / "slow_child.ipynb"), "--outputs", str(tmp_path), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (pid_files := list(tmp_path.glob("*/*/child.pid"))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pid_files, "the notebook never started its child"
    run_dir = pid_files[0].parent
    child = int(pid_files[0].read_text())
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert f"run folder: {run_dir}" in stderr
    assert (run_dir / "child.stopped").exists() and not Path(f"/proc/{child}").exists()
    m = read_manifest(run_dir)
    assert m.status == "interrupted" and m.error.startswith("interrupted: KeyboardInterrupt signal SIGTERM")
    assert m.parts[-1].status == "interrupted" and m.parts[-1].ended_at
    assert m.failed_cell.notebook_index == 1 and m.failed_cell.first_line == "import subprocess"
    assert m.ended_at and (run_dir / "report.html").is_file()


def test_render_of_a_non_run_folder_fails_cleanly(tmp_path):
    assert_clean_error(specbook("render", str(tmp_path), with_fixtures=False), 1, "no manifest")


# --------------------------------------------------------------------------------------------------
# ingest


def test_ingest_missing_file_exits_2(tmp_path):
    proc = specbook("ingest", str(tmp_path / "missing.log"), "--json", with_fixtures=False)
    assert_clean_error(proc, 2, "missing.log")


# vLLM's SpecDecoding line, read here independently of the library's parser: the totals it prints per interval
_SPEC_LINE = re.compile(r"SpecDecoding metrics: .*?Accepted: (\d+) tokens, Drafted: (\d+) tokens")


def test_ingest_json_lines_give_each_captured_logs_totals():
    logs = sorted((FIXTURES / "logs").glob("*.log"))
    assert len(logs) >= 8, f"the captured vLLM logs in {FIXTURES / 'logs'} are missing: {logs}"
    proc = specbook("ingest", *map(str, logs), "--json", with_fixtures=False)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(ln) for ln in proc.stdout.splitlines()]
    assert [Path(r["file"]).name for r in records] == [p.name for p in logs]  # one line per file, in order
    for log, record in zip(logs, records, strict=True):
        sums = [tuple(map(int, m.groups())) for m in map(_SPEC_LINE.search, log.read_text().splitlines()) if m]
        assert record["engine"] == "vllm" and record["record_kind"] == "interval", record
        assert record["broken_lines"] == 0 and record["stats_lines"] >= record["records"] > 0, record
        assert record["accepted_tokens"] == sum(a for a, _ in sums), log.name
        assert record["draft_tokens"] == sum(d for _, d in sums), log.name
        assert record["al"] == pytest.approx(1 + record["accepted_tokens"] / record["drafts"]), log.name


# --------------------------------------------------------------------------------------------------
# exit codes


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ParamsError("x"), EXIT_BAD_INPUT),
        (ExperimentError("x"), EXIT_BAD_INPUT),
        (IngestError("x"), EXIT_BAD_INPUT),
        (ModelNotPreparedError("x"), EXIT_BAD_INPUT),
        (ModelPrepareError("x"), EXIT_FAILED),
        (RunError("x"), EXIT_FAILED),
        (NotebookExecutionError("x"), EXIT_FAILED),
        (ServerStartError("x"), EXIT_FAILED),
    ],
)
def test_exit_codes(exc, code):
    assert exit_code_for(exc) == code


def test_ingest_into_a_closed_pipe_ends_quietly(tmp_path):
    """`specbook ingest ... --json | head` printed a BrokenPipeError traceback once head had gone."""
    logs = sorted((FIXTURES / "logs").glob("*.log"))[:2]
    proc = subprocess.Popen([sys.executable, "-m", "specbook", "ingest", *map(str, logs), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the reader is gone before the first line
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_the_outputs_help_says_where_runs_go_and_the_lock_flags_exist():
    run = next(a for a in build_parser()._subparsers._group_actions[0].choices.items() if a[0] == "run")[1]
    helps = {a.dest: a.help for a in run._actions}
    assert "./outputs" not in helps["outputs"].replace("not ./outputs", "")  # the checkout's, from anywhere
    assert "SPECBOOK_ROOT" in helps["outputs"] and "SPECBOOK_OUTPUTS" in helps["outputs"]
    assert "holder" in helps["no_wait"] and "manifest" in helps["no_lock"]
    proc = specbook("run", "fixture_good", "-f", "x.yaml", "--no-wait", "--no-lock")
    assert_clean_error(proc, EXIT_BAD_INPUT, "--no-wait", "--no-lock")


def test_the_allow_flags_go_with_resume_only(tmp_path):
    proc = specbook("run", "fixture_good", "-f", str(PARAMS / "small.yaml"), "--outputs", str(tmp_path),
                    "--allow-hardware-change")
    assert_clean_error(proc, EXIT_BAD_INPUT, "--allow-hardware-change go with --resume")
    assert list(tmp_path.iterdir()) == []
    assert build_parser().parse_args(["run", "--resume", "r", "--allow-hardware-change"]).allow_hardware_change
