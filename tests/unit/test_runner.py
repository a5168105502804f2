"""runner: real fixture notebooks executed by papermill on the real "specbook" Jupyter kernel.

No engine is involved: the fixture notebooks only save frames, so these tests take seconds.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import yaml
from pydantic import BaseModel

from specbook.core.errors import ExperimentError, NotebookExecutionError, ParamsError, RunError
from specbook.core.params import load_params, params_hash
from specbook.core.paths import project_root
from specbook.experiments.registry import (
    ExperimentSpec,
    get_experiment,
    list_experiments,
    register_experiment,
)
from specbook.run import runner
from specbook.run.runner import check_kernel, list_runs, make_run_dir, render_run, run_experiment
from specbook.store.fingerprint import git_info
from specbook.store.manifest import read_manifest, write_manifest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NOTEBOOKS = FIXTURES / "notebooks"
SMALL = FIXTURES / "params" / "fixture_good" / "small.yaml"
RUN_ID = re.compile(r"^\d{8}T\d{6}Z-[A-Za-z0-9_.-]+-([0-9a-f]{7}|nosha|nogit)(-\d+)?$")

sys.path.insert(0, str(NOTEBOOKS))
fixture_experiments = importlib.import_module("fixture_experiments")

try:
    check_kernel("specbook")
    HAVE_KERNEL = True
except RunError:
    HAVE_KERNEL = False
needs_kernel = pytest.mark.skipif(
    not HAVE_KERNEL, reason="register it: python -m ipykernel install --sys-prefix --name specbook"
)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("outputs")


@pytest.fixture(scope="module")
def good_run(outputs):
    return run_experiment("fixture_good", SMALL, overrides=["rows=7"], outputs_root=outputs, progress=False)


@pytest.fixture(scope="module")
def broken_run(outputs):
    with pytest.raises(NotebookExecutionError) as exc:
        run_experiment("fixture_broken", SMALL, outputs_root=outputs, progress=False)
    return exc.value


# --------------------------------------------------------------------------------------------------
# A good notebook


@needs_kernel
def test_good_run_leaves_report_data_params_and_manifest(good_run, outputs):
    run_dir = good_run.run_dir
    assert good_run.status == "ok" and good_run.failed_cell is None
    assert run_dir.parent == (outputs / "fixture_good").resolve()
    assert RUN_ID.match(run_dir.name) and "-small-" in run_dir.name
    for name in ("report.ipynb", "report.html", "manifest.json", "params.yaml", "data/numbers.parquet"):
        assert (run_dir / name).is_file(), name
    assert (run_dir / "logs").is_dir()
    assert good_run.report_html == run_dir / "report.html"

    # the override reached the notebook through params.yaml
    assert yaml.safe_load((run_dir / "params.yaml").read_text())["rows"] == 7
    frame = pd.read_parquet(run_dir / "data" / "numbers.parquet")
    assert list(frame["x"]) == list(range(7))


@needs_kernel
def test_good_report_html_hides_inputs_and_shows_outputs(good_run):
    html = (good_run.run_dir / "report.html").read_text()
    assert "OUTPUT-MARKER rows=7 sum_square=91 reuse_data=False" in html
    assert "INPUT-MARKER" not in html  # cell sources are not in the report
    assert "ctx.save_frame" not in html
    assert "The sum of squares below" in html  # markdown prose stays
    assert f"<title>fixture_good {good_run.run_dir.name}</title>" in html

    nb = nbformat.read(good_run.run_dir / "report.ipynb", as_version=4)
    assert any("INPUT-MARKER" in c.source for c in nb.cells)  # the executed notebook keeps the code
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and f'run_dir = "{good_run.run_dir}"' in injected[0].source


@needs_kernel
def test_good_manifest_fields(good_run):
    m = read_manifest(good_run.run_dir)
    assert m.status == "ok" and m.failed_cell is None and m.error is None
    assert m.experiment == "fixture_good" and m.run_id == good_run.run_dir.name
    assert m.params_name == "small" and m.overrides == ["rows=7"] and m.params["rows"] == 7
    expected = load_params(fixture_experiments.FixtureParams, SMALL, ["rows=7"])
    assert m.params_hash == params_hash(expected)
    assert m.params_file.endswith("tests/fixtures/params/fixture_good/small.yaml")
    assert m.notebook == str(NOTEBOOKS / "good.ipynb") and m.kernel == "specbook"
    assert len(m.notebook_sha256) == 64
    start = datetime.fromisoformat(m.started_at)
    end = datetime.fromisoformat(m.ended_at)
    assert start.tzinfo == timezone.utc and end >= start and m.duration_s > 0
    git = git_info(project_root())
    assert m.git.sha == git.sha and m.git.dirty == git.dirty
    assert m.libraries["papermill"] and m.libraries["pandas"] == pd.__version__ and m.python["version"]
    assert m.hardware["cpu"]["threads"] and m.hardware["hostname"]
    assert m.servers == [] and m.engine_versions == {}
    assert m.runner == {"hostname": socket.gethostname(), "pid": os.getpid()} and m.command == sys.argv
    assert good_run.manifest == m


# --------------------------------------------------------------------------------------------------
# A broken notebook


@needs_kernel
def test_broken_run_keeps_what_was_measured(broken_run):
    result = broken_run.result
    assert result.status == "failed"
    kept = pd.read_parquet(result.run_dir / "data" / "before_failure.parquet")
    assert list(kept["measured"]) == [1.0, 2.0, 3.0]
    assert (result.run_dir / "report.ipynb").is_file()


@needs_kernel
def test_broken_manifest_names_the_failed_cell(broken_run):
    m = read_manifest(broken_run.result.run_dir)
    assert m.status == "failed" and m.ended_at and m.duration_s > 0
    cell = m.failed_cell
    assert cell.notebook_index == 2  # third cell of broken.ipynb
    assert cell.report_index == 3  # papermill's injected-parameters cell sits before it in report.ipynb
    assert cell.first_line == 'raise ValueError("deliberate failure in the third cell")'
    assert (cell.ename, cell.evalue) == ("ValueError", "deliberate failure in the third cell")
    assert cell.exec_count is not None
    source = nbformat.read(NOTEBOOKS / "broken.ipynb", as_version=4).cells[cell.notebook_index].source
    assert source.startswith(cell.first_line)
    assert (
        "cell 2" in str(broken_run) and "ValueError" in str(broken_run) and str(m.run_id) in str(broken_run)
    )


@needs_kernel
def test_broken_report_html_is_rendered_with_the_error(broken_run):
    html = (broken_run.result.run_dir / "report.html").read_text()
    assert "An Exception was encountered" in html
    assert "deliberate failure in the third cell" in html
    assert "OUTPUT-MARKER saved before_failure" in html
    assert "UNREACHED-MARKER" not in html


@needs_kernel
def test_dead_kernel_is_a_failed_run_naming_the_last_cell(tmp_path):
    with pytest.raises(NotebookExecutionError, match="DeadKernelError") as exc:
        run_experiment(
            "fixture_good",
            SMALL,
            outputs_root=tmp_path,
            notebook=NOTEBOOKS / "kernel_dies.ipynb",
            progress=False,
        )
    result = exc.value.result
    assert (result.run_dir / "data" / "before_death.parquet").is_file()
    assert (result.run_dir / "report.html").is_file()
    m = read_manifest(result.run_dir)
    assert m.status == "failed" and m.notebook == str(NOTEBOOKS / "kernel_dies.ipynb")
    assert m.failed_cell.notebook_index == 2 and m.failed_cell.first_line == "import os"
    assert m.failed_cell.ename == "DeadKernelError"


# --------------------------------------------------------------------------------------------------
# Re-render


@needs_kernel
def test_render_run_reuses_saved_data_and_keeps_the_previous_report(good_run, tmp_path):
    run_dir = tmp_path / good_run.run_dir.name
    shutil.copytree(good_run.run_dir, run_dir)
    # change the saved data: the re-render must show it, proving it read data/ and collected nothing
    ctx_frame = pd.DataFrame({"x": [1, 2], "square": [100, 200]})
    ctx_frame.to_parquet(run_dir / "data" / "numbers.parquet")
    before = (run_dir / "report.html").read_text()

    result = render_run(run_dir, progress=False)
    assert result.status == "ok"
    html = (run_dir / "report.html").read_text()
    assert "OUTPUT-MARKER rows=2 sum_square=300 reuse_data=True" in html
    assert (run_dir / "renders" / "1" / "report.html").read_text() == before
    assert (run_dir / "renders" / "1" / "report.ipynb").is_file()
    m = read_manifest(run_dir)
    assert m.status == "ok" and len(m.renders) == 1 and m.renders[0].status == "ok"
    assert m.renders[0].previous_report == "renders/1" and m.report_status == "ok" and m.render_error is None
    assert m.renders[0].notebook == str(NOTEBOOKS / "good.ipynb")
    assert m.renders[0].host.startswith(socket.gethostname() + " (")  # the data may come from a GPU host
    assert "GPU" in m.renders[0].host
    root = tmp_path / "root"
    shutil.copytree(run_dir, root / "fixture_good" / run_dir.name)
    row = list_runs(root).iloc[0]
    assert (row["status"], row["renders"], row["last_render"]) == ("ok", 1, "ok")


@needs_kernel
def test_render_run_of_a_folder_without_data_fails_and_says_so(good_run, tmp_path):
    run_dir = tmp_path / "no-data"
    shutil.copytree(good_run.run_dir, run_dir)
    (run_dir / "data" / "numbers.parquet").unlink()
    with pytest.raises(NotebookExecutionError, match="no saved frame 'numbers'") as exc:
        render_run(run_dir, progress=False)
    m = read_manifest(run_dir)
    assert m.status == "ok"  # the collection's status is not rewritten by a failed render
    assert m.renders[-1].status == "failed" and m.renders[-1].failed_cell.ename == "RunError"
    assert exc.value.result.report_html.is_file()


def _html_step_fails(monkeypatch):
    """The html step as it failed on a GPU host with nbconvert's templates off the Jupyter path (2026-11-30)."""
    from specbook.run import render

    def no_templates(report, title=None):
        raise ValueError("No template sub-directory with name 'lab' found in the following paths:\n\t/opt/x")

    monkeypatch.setattr(render, "render_html", no_templates)


@needs_kernel
def test_a_failed_html_render_is_not_a_failed_run_and_a_later_render_makes_it(tmp_path, monkeypatch):
    _html_step_fails(monkeypatch)
    result = run_experiment("fixture_good", SMALL, outputs_root=tmp_path, progress=False)
    run_dir = result.run_dir
    assert result.status == "ok" and result.report_html is None and (run_dir / "report.ipynb").is_file()
    m = read_manifest(run_dir)
    assert (m.status, m.error, m.report_status) == ("ok", None, "failed")
    assert m.render_error.startswith("html render failed: ValueError: No template sub-directory")
    monkeypatch.undo()

    render_run(run_dir, progress=False)
    m = read_manifest(run_dir)
    assert (m.status, m.report_status, m.render_error) == ("ok", "ok", None)
    assert (run_dir / "report.html").is_file() and m.renders[-1].previous_report == "renders/1"
    assert sorted(p.name for p in (run_dir / "renders" / "1").iterdir()) == ["report.ipynb"]  # it had no html

    # every earlier report is kept, oldest first
    first_html = (run_dir / "report.html").read_text()
    render_run(run_dir, progress=False)
    assert (run_dir / "renders" / "2" / "report.html").read_text() == first_html
    assert [r.previous_report for r in read_manifest(run_dir).renders] == ["renders/1", "renders/2"]


@needs_kernel
def test_a_run_marked_failed_only_for_its_html_is_ok_once_rendered(good_run, tmp_path):
    """The committed H200 manifests (before a failed html stopped failing a run) say failed with no failed cell."""
    run_dir = tmp_path / good_run.run_dir.name
    shutil.copytree(good_run.run_dir, run_dir)
    m = read_manifest(run_dir)
    m.status, m.error = "failed", "html render failed: ValueError: No template sub-directory with name 'lab'"
    m.report_status = m.render_error = None
    write_manifest(run_dir, m)
    render_run(run_dir, progress=False)
    m = read_manifest(run_dir)
    assert (m.status, m.error, m.report_status) == ("ok", None, "ok")


@needs_kernel
def test_a_failed_cell_keeps_a_run_failed_when_its_report_renders(good_run, broken_run, tmp_path):
    run_dir = tmp_path / broken_run.result.run_dir.name
    shutil.copytree(broken_run.result.run_dir, run_dir)
    shutil.copy(good_run.run_dir / "data" / "numbers.parquet", run_dir / "data")  # good.ipynb renders on it
    m = read_manifest(run_dir)
    m.error = f"{m.error}; html render failed: ValueError: x"
    write_manifest(run_dir, m)
    assert render_run(run_dir, notebook=NOTEBOOKS / "good.ipynb", progress=False).status == "ok"
    m = read_manifest(run_dir)
    assert (m.status, m.report_status) == ("failed", "ok") and m.failed_cell is not None


def test_a_torn_servers_line_is_a_manifest_warning_not_lost_servers(good_run, tmp_path):
    from specbook.store.runstore import RunContext

    run_dir = tmp_path / "torn"
    ctx = RunContext(run_dir)
    ctx.record_server("arm-0", ["vllm"], {}, {"vllm": "0.32"}, started_at=None, status="ok")
    with open(run_dir / "servers.jsonl", "a") as fh:
        fh.write('{"name": "arm-1", "argv": ["vl')  # the runner was killed here
    ctx.record_server("arm-1", ["vllm"], {}, {"vllm": "0.32"}, started_at=None, status="ok")
    m = read_manifest(good_run.run_dir)
    runner._collect_servers(m, run_dir)
    assert [s.name for s in m.servers] == ["arm-0", "arm-1"] and set(m.engine_versions) == {"arm-0", "arm-1"}
    (warning,) = m.warnings
    assert warning.startswith("servers.jsonl:2: torn or damaged line")


def test_render_run_needs_a_manifest(tmp_path):
    with pytest.raises(RunError, match="no manifest"):
        render_run(tmp_path)


# --------------------------------------------------------------------------------------------------
# Bad input stops before a folder exists


def _folders(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_dir()) if root.exists() else []


def test_bad_params_abort_before_any_folder(tmp_path):
    with pytest.raises(ParamsError, match=r"bad_type\.yaml: env\.FOO: Input should be a valid string"):
        run_experiment(
            "fixture_good", FIXTURES / "params" / "fixture_good" / "bad_type.yaml", outputs_root=tmp_path
        )
    with pytest.raises(ParamsError, match=r"rows: Input should be greater than or equal to 1"):
        run_experiment("fixture_good", SMALL, overrides=["rows=0"], outputs_root=tmp_path)
    assert _folders(tmp_path) == []


def test_missing_kernel_names_the_fix_and_makes_no_folder(tmp_path):
    with pytest.raises(RunError, match=r"ipykernel install --sys-prefix --name no-such-kernel-xyz"):
        run_experiment("fixture_good", SMALL, outputs_root=tmp_path, kernel="no-such-kernel-xyz")
    assert _folders(tmp_path) == []


def test_notebook_without_parameters_cell_is_refused(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    path = tmp_path / "plain.ipynb"
    nbformat.write(nb, path)
    out = tmp_path / "out"
    with pytest.raises(RunError, match=r"plain\.ipynb: no cell tagged 'parameters'"):
        run_experiment("fixture_good", SMALL, outputs_root=out, notebook=path)
    cell = nbformat.v4.new_code_cell('params_file = ""\nrun_dir = ""')
    cell.metadata["tags"] = ["parameters"]
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), path)
    with pytest.raises(RunError, match=r"does not define reuse_data"):
        run_experiment("fixture_good", SMALL, outputs_root=out, notebook=path)
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import os"), cell]), path)
    with pytest.raises(RunError, match=r"'parameters' cell must be the first code cell \(it is cell 1\)"):
        run_experiment("fixture_good", SMALL, outputs_root=out, notebook=path)
    with pytest.raises(RunError, match=r"missing\.ipynb: notebook not found"):
        run_experiment("fixture_good", SMALL, outputs_root=out, notebook=tmp_path / "missing.ipynb")
    assert _folders(out) == []


# --------------------------------------------------------------------------------------------------
# Run folders and the run list


def test_run_folders_are_never_reused(tmp_path):
    when = datetime(2026, 11, 29, 22, 30, 5, tzinfo=timezone.utc)
    first = make_run_dir(tmp_path / "knob_ab", when, "base line/x", "abc1234")
    (first / "keep.txt").write_text("measured")
    second = make_run_dir(tmp_path / "knob_ab", when, "base line/x", "abc1234")
    third = make_run_dir(tmp_path / "knob_ab", when, "base line/x", "abc1234")
    assert first.name == "20261129T223005Z-base-line-x-abc1234"
    assert second.name == first.name + "-2" and third.name == first.name + "-3"
    assert (first / "keep.txt").read_text() == "measured"
    assert all(RUN_ID.match(p.name) for p in (first, second, third))


@needs_kernel
def test_list_runs_shows_each_run_with_status(good_run, broken_run, outputs):
    (outputs / "fixture_good" / "junk-run").mkdir()
    (outputs / "fixture_good" / "junk-run" / "manifest.json").write_text("{")
    runs = list_runs(outputs)
    by_id = runs.set_index("run_id")
    assert by_id.loc[good_run.run_dir.name, "status"] == "ok"
    assert by_id.loc[good_run.run_dir.name, "params_name"] == "small"
    assert by_id.loc[broken_run.result.run_dir.name, "status"] == "failed"
    assert by_id.loc[broken_run.result.run_dir.name, "experiment"] == "fixture_broken"
    assert by_id.loc["junk-run", "status"] == "unreadable"
    assert "abandoned" not in set(runs["status"])
    assert list(runs.columns)[:5] == ["experiment", "run_id", "status", "started_at", "duration_s"]
    assert list_runs(outputs / "empty").empty


# --------------------------------------------------------------------------------------------------
# Experiment registry


def test_registry_lookup_and_unknown_name_lists_known():
    assert get_experiment("fixture_good") is fixture_experiments.GOOD
    assert {"fixture_good", "fixture_broken"} <= set(list_experiments())
    with pytest.raises(
        ExperimentError, match=r"unknown experiment 'nope'; known experiments: .*fixture_broken, fixture_good"
    ):
        get_experiment("nope")


def test_registry_refuses_a_different_experiment_under_a_taken_name():
    class Other(BaseModel):
        pass

    with pytest.raises(ExperimentError, match="already registered"):
        register_experiment(ExperimentSpec("fixture_good", Other, "other.ipynb"))
    # re-registering the same experiment (a module reloaded) is fine
    register_experiment(
        ExperimentSpec("fixture_good", fixture_experiments.FixtureParams, str(NOTEBOOKS / "good.ipynb"))
    )


def test_notebook_path_resolution(tmp_path, monkeypatch):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "params").mkdir()
    (tmp_path / "notebooks" / "a.ipynb").write_text(json.dumps({}))
    monkeypatch.setenv("SPECBOOK_ROOT", str(tmp_path))
    spec = ExperimentSpec("a", BaseModel, "a.ipynb")
    assert spec.notebook_path() == tmp_path / "notebooks" / "a.ipynb"
    assert (
        ExperimentSpec("a", BaseModel, "notebooks/a.ipynb").notebook_path()
        == tmp_path / "notebooks" / "a.ipynb"
    )
    assert ExperimentSpec("a", BaseModel, "/abs/x.ipynb").notebook_path() == Path("/abs/x.ipynb")


def test_list_runs_marks_runs_whose_runner_died_as_abandoned(good_run, tmp_path):
    for name, pid in (("alive", os.getpid()), ("dead", _dead_pid())):
        run_dir = tmp_path / "fixture_good" / name
        shutil.copytree(good_run.run_dir, run_dir)
        m = read_manifest(run_dir)
        m.status, m.run_id = "running", name
        m.runner = {"hostname": socket.gethostname(), "pid": pid}
        write_manifest(run_dir, m)
    status = list_runs(tmp_path).set_index("run_id")["status"]
    assert status["alive"] == "running" and status["dead"] == "abandoned"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_missing_nbconvert_templates_are_explained_and_the_report_kept(tmp_path, monkeypatch):
    """What a GPU host with nbconvert installed by `pip --target` and no JUPYTER_PATH printed (2026-11-30)."""
    from specbook.run import render

    (tmp_path / "report.ipynb").write_text("{}")

    def no_templates(report, title=None):
        raise ValueError("No template sub-directory with name 'lab' found in the following paths:\n\t/opt/torch/.venv/share/jupyter")

    monkeypatch.setattr(render, "render_html", no_templates)
    html, error = render.try_render(tmp_path, "t")
    assert html is None and "No template sub-directory with name 'lab'" in error
    assert "JUPYTER_PATH" in error and "specbook render RUN_DIR" in error
    assert (tmp_path / "report.ipynb").is_file()


@needs_kernel
def test_a_failed_cell_is_named_by_the_call_that_failed_not_its_first_line(tmp_path):
    """Every error was labelled with its cell's first line (`from IPython.display import ...`), which never
    fails; the line IPython's traceback points at is the call to name."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    from specbook.run.execute import failed_cell_from

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1"),
                nbformat.v4.new_code_cell("from IPython.display import display\n\nvalue = int('not a number')\n")]
    nb.cells[0].metadata["tags"] = ["parameters"]
    nb.metadata["kernelspec"] = {"name": "specbook", "display_name": "specbook", "language": "python"}
    src = tmp_path / "fails.ipynb"
    nbformat.write(nb, src)
    with pytest.raises(PapermillExecutionError) as err:
        papermill.execute_notebook(str(src), str(tmp_path / "out.ipynb"), kernel_name="specbook", progress_bar=False)
    cell = failed_cell_from(err.value, src)
    assert cell.first_line == "from IPython.display import display"
    assert cell.failing_line == "value = int('not a number')"
    assert "(In [2]) at `value = int('not a number')` raised ValueError" in cell.describe()


def test_a_server_whose_kernel_died_before_recording_it_is_recorded_by_the_runner(good_run, tmp_path):
    """A kernel killed outright (the OOM killer) never runs the harness's record: the pending copy it left
    becomes the server's record when the runner ends the run."""
    from specbook.store.runstore import RunContext

    run_dir = tmp_path / "exp" / "run"
    ctx = RunContext(run_dir)
    ctx.mark_server_pending("00-sweep0-baseline", ["llama-server", "--api-key", "k-secret-1"], {"X": "1"},
                            started_at=1_700_000_000.0, extra={"arm": "baseline"})
    m = read_manifest(good_run.run_dir).model_copy(update={"servers": [], "warnings": [], "parts": []})
    m.status, m.error = "failed", "DeadKernelError: Kernel died"
    runner._finalize(m, run_dir, time.monotonic())
    (record,) = read_manifest(run_dir).servers
    assert record.name == "00-sweep0-baseline" and record.status == "failed" and record.extra == {"arm": "baseline"}
    assert "the kernel died" in record.error and "DeadKernelError" in record.error
    assert record.argv == ["llama-server", "--api-key", "***"] and record.started_at and record.stopped_at
    assert not list((run_dir / "data" / "pending_servers").iterdir())
    assert any("00-sweep0-baseline" in w for w in read_manifest(run_dir).warnings)
