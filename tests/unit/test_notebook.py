"""The book notebooks are thin reports over specbook.notebook.open_book, and every experiment follows the protocol.

A notebook is a report, not a program (../shared/STYLE.md): one papermill `parameters` cell, one open_book()
call with its experiment's name, then display calls on the typed result. What the notebook reads from the
result must exist on the result type analyze() returns, so a renamed field fails here, not in a run.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import types
import typing
from pathlib import Path

import pandas as pd
import pytest
from pydantic import BaseModel

import specbook.experiments
from specbook.core.errors import ExperimentError, RunError
from specbook.experiments.registry import ExperimentSpec, get_experiment
from specbook.notebook import DISPLAY_OPTIONS, Book, open_book
from specbook.store.runstore import RunContext

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
BOOKS = ("knob_ab", "config_flip", "cross_engine", "concurrency_curve")
PARAMETERS = {"params_file", "run_dir", "reuse_data", "overrides", "analysis"}
# Computation that belongs in the library (filters, reshaping, statistics), never in a report cell.
COMPUTATION = ("pivot", "groupby", ".map(", "lambda")


def cells(name: str, kind: str = "code") -> list[dict]:
    nb = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text(encoding="utf-8"))
    return [c for c in nb["cells"] if c["cell_type"] == kind]


def source(cell: dict) -> str:
    src = cell["source"]
    return "".join(src) if isinstance(src, list) else src


def code_tree(name: str) -> ast.Module:
    return ast.parse("\n".join(source(c) for c in cells(name)))


def test_the_books_are_the_registered_experiments():
    assert set(specbook.experiments.EXPERIMENT_MODULES) == set(BOOKS)
    for name in BOOKS:
        path = get_experiment(name).notebook_path()
        assert path == NOTEBOOKS / f"{name}.ipynb" and path.is_file()


@pytest.mark.parametrize("name", BOOKS)
def test_every_experiment_provides_collect_load_and_analyze(name):
    spec = get_experiment(name)
    for step in ("collect", "load", "analyze"):
        assert callable(spec.require(step)), f"{name}.{step}"
    hints = typing.get_type_hints(spec.analyze)
    assert dataclasses.is_dataclass(hints["return"]), f"{name}.analyze must return a typed result"


def test_a_missing_protocol_step_is_named():
    spec = ExperimentSpec("half_done", BaseModel, "half_done.ipynb", collect=lambda params, run: None)
    assert callable(spec.require("collect"))
    with pytest.raises(ExperimentError, match=r"experiment 'half_done' does not provide analyze\(\)"):
        spec.require("analyze")


@pytest.mark.parametrize("name", BOOKS)
def test_one_parameters_cell_with_params_file_run_dir_and_reuse_data(name):
    tagged = [c for c in cells(name) if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{name}: {len(tagged)} cells tagged 'parameters'"
    body = ast.parse(source(tagged[0])).body
    assigned = [t.id for stmt in body if isinstance(stmt, ast.Assign) for t in stmt.targets]
    assert all(isinstance(stmt, ast.Assign) for stmt in body), f"{name}: the parameters cell only assigns"
    assert sorted(assigned) == sorted(PARAMETERS)
    # papermill injects its values after this cell: it must come before the cell that opens the book
    opens = [i for i, c in enumerate(cells(name)) if "open_book(" in source(c)]
    assert opens and cells(name).index(tagged[0]) < opens[0]


@pytest.mark.parametrize("name", BOOKS)
def test_the_notebook_opens_its_own_experiment_through_open_book(name):
    calls = [n for n in ast.walk(code_tree(name))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "open_book"]
    assert len(calls) == 1, f"{name}: {len(calls)} open_book() calls"
    (call,) = calls
    assert isinstance(call.args[0], ast.Constant) and call.args[0].value == name
    assert [a.id for a in call.args[1:] if isinstance(a, ast.Name)] == ["params_file", "run_dir", "reuse_data",
                                                                         "overrides", "analysis"]
    imports = [n for n in ast.walk(code_tree(name))
               if isinstance(n, ast.ImportFrom) and n.module == "specbook.notebook"]
    assert any(alias.name == "open_book" for n in imports for alias in n.names)


@pytest.mark.parametrize("name", BOOKS)
def test_no_computation_in_code_cells(name):
    found = [(i, word) for i, c in enumerate(cells(name)) for word in COMPUTATION if word in source(c)]
    assert found == [], f"{name}: computation in code cells (cell index, word): {found}"


@pytest.mark.parametrize("name", BOOKS)
def test_notebooks_are_committed_without_outputs(name):
    dirty = [i for i, c in enumerate(cells(name)) if c.get("outputs") or c.get("execution_count") is not None]
    assert dirty == []


def _fields(cls: type) -> dict[str, typing.Any]:
    """A result type's fields with their types, plus its properties (type unknown: None)."""
    hints = typing.get_type_hints(cls)
    out: dict[str, typing.Any] = {f.name: hints.get(f.name) for f in dataclasses.fields(cls)}
    out.update({n: None for n in dir(cls) if isinstance(getattr(cls, n, None), property)})
    out.update({n: None for n in vars(cls) if callable(vars(cls)[n]) and not n.startswith("_")})  # methods
    return out


def _reads(tree: ast.Module, root: str, cls: type) -> list[str]:
    """`root.attr` reads in the notebook that `cls` lacks, following aliases `x = root.attr` to typed sub-results."""
    missing = []
    fields = _fields(cls)
    aliases = {
        t.id: fields.get(stmt.value.attr)
        for stmt in ast.walk(tree) if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Attribute)
        and isinstance(stmt.value.value, ast.Name) and stmt.value.value.id == root
        for t in stmt.targets if isinstance(t, ast.Name)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == root:
            if node.attr not in fields:
                missing.append(f"{root}.{node.attr}")
            sub = fields.get(node.attr)
            if dataclasses.is_dataclass(sub) and isinstance(sub, type):
                missing += [m for alias, t in aliases.items() if t is sub for m in _reads(tree, alias, sub)]
    return sorted(set(missing))


@pytest.mark.parametrize("name", BOOKS)
def test_what_the_notebook_reads_exists_on_the_result_type(name):
    result_type = typing.get_type_hints(get_experiment(name).analyze)["return"]
    tree = code_tree(name)
    assert _reads(tree, "result", result_type) == []
    assert {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "book"} <= {f.name for f in dataclasses.fields(Book)}


@pytest.mark.parametrize("name", BOOKS)
def test_what_the_notebook_imports_from_specbook_exists(name):
    """Every `from specbook... import x` resolves, and every `module.attr` used on an imported specbook module
    (plots.ratio_bars...) exists: a function moved out of an experiment fails here."""
    tree = code_tree(name)
    modules = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specbook"):
            for alias in node.names:
                owner = importlib.import_module(node.module)
                # what `from M import x` does: M's attribute x, else the submodule M.x
                target = (getattr(owner, alias.name) if hasattr(owner, alias.name)
                          else importlib.import_module(f"{node.module}.{alias.name}"))
                modules[alias.asname or alias.name] = target
    assert "open_book" in modules
    missing = [f"{n.value.id}.{n.attr}" for n in ast.walk(tree)
               if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in modules
               and isinstance(modules[n.value.id], types.ModuleType) and not hasattr(modules[n.value.id], n.attr)]
    assert missing == []


def test_the_read_check_catches_a_renamed_field():
    from specbook.experiments.knob_ab import KnobABResult

    tree = ast.parse("d = result.decision\ndisplay(d.acceptance_length)\ndisplay(result.flagged_runs)\n"
                     "display(result.per_position_table)\n")
    assert _reads(tree, "result", KnobABResult) == ["d.acceptance_length", "result.flagged_runs"]


# --------------------------------------------------------------------------------------------------
# open_book on a saved run folder (reuse_data: load and analyse, no server)

DEMO = ROOT / "params" / "cross_engine" / "cpu-demo.yaml"


def _cross_engine_run(run_dir: Path) -> None:
    """A one-cell cross-engine run folder: lane off, one prompt, three warm repeats per side."""
    tokens = list(range(100, 164))
    rows = [{"side": side, "engine": "llamacpp" if side == "ours" else "vllm", "lane": "off", "prompt": "p",
             "repeat": r, "completion_tokens": len(tokens), "prompt_tokens": 20, "wall_s": 1.0 + 0.1 * r + 0.5 * i,
             "ttft_s": 0.05, "itl_mean_s": 0.02, "error": None, "token_ids": tokens}
            for i, side in enumerate(("ours", "oracle")) for r in range(3)]
    cells = [{"side": side, "engine": "x", "lane": "off", "prompt": "p", "drafts": 0, "draft_tokens": 0,
              "accepted_tokens": 0} for side in ("ours", "oracle")]
    ctx = RunContext(run_dir)
    ctx.save_frame("requests", pd.DataFrame(rows))
    ctx.save_frame("cell_counters", pd.DataFrame(cells))
    servers = [{"side": "ours", "label": "llamacpp"}, {"side": "oracle", "label": "vllm"}]
    ctx.save_frame("servers", pd.DataFrame(servers))


def test_open_book_with_reuse_data_loads_and_analyses_the_run_folder(tmp_path):
    from specbook.experiments import cross_engine as ce

    _cross_engine_run(tmp_path / "run")
    book = open_book("cross_engine", str(DEMO), str(tmp_path / "run"), reuse_data=True, overrides=["n_boot=200"])
    assert book.experiment is get_experiment("cross_engine") and book.params.n_boot == 200
    assert isinstance(book.result, ce.CrossResult) and book.run.run_dir == (tmp_path / "run").resolve()
    assert len(book.data.requests) == 6
    # ratio of mean warm tok/s: 64 tokens over walls 1.0/1.1/1.2 s (ours) and 1.5/1.6/1.7 s (oracle)
    tok_s = {side: sum(64 / (1.0 + 0.1 * r + 0.5 * i) for r in range(3)) / 3
             for i, side in enumerate(("ours", "oracle"))}
    assert book.result.headline.loc[0, "ratio"] == pytest.approx(tok_s["ours"] / tok_s["oracle"], rel=1e-12)
    assert book.result.headline.loc[0, "comparable"] == 1
    assert pd.get_option("display.precision") == DISPLAY_OPTIONS["display.precision"]


def test_open_book_with_reuse_data_refuses_a_missing_run_folder(tmp_path):
    with pytest.raises(RunError, match="run folder does not exist"):
        open_book("cross_engine", str(DEMO), str(tmp_path / "nowhere"), reuse_data=True)
    assert not (tmp_path / "nowhere").exists()


# --------------------------------------------------------------------------------------------------
# The parameters cell as opened in Jupyter: params path from any cwd, overrides, analysis settings, re-analysis


def test_analysis_settings_become_overrides():
    from specbook.notebook import analysis_overrides

    assert analysis_overrides({"decision.alpha": 0.1, "guards.min_distinct_ratio": 0.2, "name": "x y"}) == [
        "decision.alpha=0.1", "guards.min_distinct_ratio=0.2", 'name="x y"']


def test_a_params_path_relative_to_the_project_root_is_found_from_notebooks(monkeypatch):
    from specbook.notebook import resolve_params_file

    monkeypatch.chdir(NOTEBOOKS)  # Jupyter's cwd is the notebook's folder
    assert resolve_params_file("params/cross_engine/cpu-demo.yaml") == str(DEMO)
    assert resolve_params_file("no/such.yaml") == "no/such.yaml"  # left as given: load_params names it


def test_reanalysis_uses_the_runs_params_applies_settings_and_overwrites_nothing(tmp_path):
    from specbook.core.params import dump_params, load_params
    from specbook.experiments.cross_engine import CrossEngineParams

    run = tmp_path / "run"
    _cross_engine_run(run)
    dump_params(load_params(CrossEngineParams, DEMO, ["n_boot=200"]), run / "params.yaml")
    first = open_book("cross_engine", "", str(run), reuse_data=True, analysis={"ci_level": 0.9})
    second = open_book("cross_engine", "", str(run), reuse_data=True, analysis={"ci_level": 0.8})
    assert (first.params.n_boot, first.params.ci_level, second.params.ci_level) == (200, 0.9, 0.8)
    records = sorted((run / "reanalyses").glob("*.yaml"))
    assert len(records) == 2 and {load_params(CrossEngineParams, r).ci_level for r in records} == {0.9, 0.8}
    assert first.summary_path != second.summary_path and first.summary_path.parent == run / "reanalyses"
    plain = open_book("cross_engine", "", str(run), reuse_data=True)
    assert plain.summary_path == run.resolve() / "summary.json"


def test_reuse_data_without_a_run_folder_is_refused():
    with pytest.raises(RunError, match="reuse_data = True needs run_dir"):
        open_book("cross_engine", str(DEMO), "", reuse_data=True)
