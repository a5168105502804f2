"""config_flip experiment: params schema and refusals, arm building, launch equality, analysis."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from specbook.core.acceptance import Acceptance, position_column
from specbook.core.errors import ExperimentError, ParamsError
from specbook.core.params import load_params
from specbook.core.paths import params_dir
from specbook.engines import EngineConfig, get_engine
from specbook.experiments import config_flip as cf
from specbook.experiments.registry import get_experiment
from specbook.measure import costsplit
from specbook.store.runstore import RunContext
from specbook.traces.records import ProposalRecord, RequestTrace, records_frame
from specbook.traces.traceset import TraceSet


@pytest.fixture()
def draft_dir(tmp_path: Path) -> Path:
    src = tmp_path / "draft"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"rope_theta": 100000, "tie_word_embeddings": True}))
    (src / "tokenizer.json").write_text("{}")
    (src / "model.safetensors").write_bytes(os.urandom(1024))
    return src


def _params(folder: Path | str, **over) -> dict:
    data = {
        "flip": {"folder": str(folder), "field": "rope_theta", "values": [100000, 10000]},
        "engine": {
            "model": "/models/target",
            "speculative_config": {"method": "draft_model", "model": "@flip", "num_speculative_tokens": 4},
        },
        "prompts": ["a", "b", "c"],
    }
    data.update(over)
    return data


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# --- params ---------------------------------------------------------------------------------------


def test_registered_under_its_name():
    spec = get_experiment("config_flip")
    assert spec.params_model is cf.ConfigFlipParams and spec.notebook == "config_flip.ipynb"


def test_demo_params_validate_and_flip_the_draft():
    params = load_params(cf.ConfigFlipParams, params_dir() / "config_flip" / "cpu-demo.yaml")
    assert cf.flip_role(params.engine) == "draft"
    assert params.flip.field == "rope_parameters.rope_theta" and params.flip.values == [100000.0, 100.0]


def test_num_prompts_override_cuts_the_prompt_list(tmp_path, draft_dir):
    params = load_params(cf.ConfigFlipParams, _write(tmp_path, _params(draft_dir)), ["num_prompts=2"])
    assert params.selected_prompts() == ["a", "b"]


@pytest.mark.parametrize(
    "mutate, message",
    [
        # a per-arm engine/env override has no place in the schema
        (lambda d: d.update(arms=[{"env": {"X": "1"}}]), r"arms: Extra inputs are not permitted"),
        (lambda d: d["flip"].update(env={"X": "1"}), r"flip.env: Extra inputs are not permitted"),
        (lambda d: d["flip"].update(values=[1, 1]), r"flip.values: .*distinct"),
        (lambda d: d["flip"].update(values=[1]), r"flip.values: .*at least 2"),
        (lambda d: d["flip"].update(field="a..b"), r"flip.field: .*dotted path"),
        (lambda d: d["flip"].update(link="copy"), r"flip.link"),
        (lambda d: d["engine"]["speculative_config"].update(model="/models/draft"), r"exactly one of"),
        (lambda d: d["engine"].update(model="@flip"), r"found it in 2"),
        (lambda d: d["engine"].update(extra_args=["--tokenizer", "@flip"]), r"only stand for the model folder"),
    ],
)
def test_bad_params_are_refused_naming_file_and_field(tmp_path, draft_dir, mutate, message):
    data = _params(draft_dir)
    mutate(data)
    with pytest.raises(ParamsError, match=r"p\.yaml: .*" + message):
        load_params(cf.ConfigFlipParams, _write(tmp_path, data))


# --- arms -----------------------------------------------------------------------------------------


def test_arm_engine_config_puts_the_folder_where_the_placeholder_was(tmp_path):
    draft_flip = EngineConfig(model="/t", speculative_config={"method": "draft_model", "model": "@flip"})
    cfg = cf.arm_engine_config(draft_flip, tmp_path / "arm0", served_model_name="x")
    assert cfg.speculative_config["model"] == str(tmp_path / "arm0") and cfg.model == "/t"
    target_flip = EngineConfig(model="@flip", speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    cfg = cf.arm_engine_config(target_flip, tmp_path / "arm1", served_model_name="flip-target")
    assert cfg.model == str(tmp_path / "arm1") and cfg.served_model_name == "flip-target"


def test_build_arms_proves_the_one_field_difference(tmp_path, draft_dir):
    params = cf.ConfigFlipParams.model_validate(_params(draft_dir))
    folders, summary = cf.build_arms(params, tmp_path / "run" / "flip")
    assert [f.path.name for f in folders] == ["arm0-100000", "arm1-10000"]
    assert summary["original_value"] == 100000 and summary["role"] == "draft"
    assert summary["diffs_vs_first_arm"] == {"arm1-10000": ["config.json:rope_theta: 100000 != 10000"]}
    for f in folders:
        assert (f.path / "model.safetensors").stat().st_ino == (draft_dir / "model.safetensors").stat().st_ino


def test_build_arms_refuses_a_missing_field_unless_asked(tmp_path, draft_dir):
    data = _params(draft_dir)
    data["flip"].update(field="sample_from_anchor", values=[True, False])
    with pytest.raises(ExperimentError, match=r"'sample_from_anchor' does not exist; set flip.add_missing: true"):
        cf.build_arms(cf.ConfigFlipParams.model_validate(data), tmp_path / "flip")
    data["flip"]["add_missing"] = True
    folders, summary = cf.build_arms(cf.ConfigFlipParams.model_validate(data), tmp_path / "flip2")
    assert summary["field_was_added"] and len(folders) == 2


def test_unknown_folder_is_refused_by_name(tmp_path):
    with pytest.raises(ExperimentError, match="flip.folder 'no-such-model'"):
        cf.resolve_folder("no-such-model")


def test_real_vllm_launch_specs_of_two_arms_differ_only_in_the_folder(tmp_path, draft_dir):
    params = cf.ConfigFlipParams.model_validate(_params(draft_dir))
    folders, _ = cf.build_arms(params, tmp_path / "flip")
    engine = get_engine("vllm")
    views = []
    for f in folders:
        cfg = cf.arm_engine_config(params.engine, f.path, served_model_name="flip-target")
        views.append(cf._launch_view(engine.build_spec(cfg, name="arm", log_path=Path("a.log"), port=1), f.path))
    cf.assert_launches_differ_only_in_folder(views, ["a", "b"])
    assert any(cf.FLIP_PLACEHOLDER in a for a in views[0]["argv"])
    assert all(str(folders[0].path) not in a for a in views[0]["argv"])


def test_launches_that_differ_besides_the_folder_are_refused():
    base = {"argv": ["serve", "@flip"], "env": {"A": "1"}, "unset_env": [], "cwd": None}
    other = {**base, "env": {"A": "2"}}
    with pytest.raises(ExperimentError, match="arm b would launch differently from arm a in env"):
        cf.assert_launches_differ_only_in_folder([base, other], ["a", "b"])


def test_flip_arms_pair_each_folder_with_its_config_and_record_the_launch_masked(tmp_path, draft_dir):
    from specbook.experiments.config_flip.arms import flip_arms

    params = cf.ConfigFlipParams.model_validate(_params(draft_dir))
    arms, record = flip_arms(params, tmp_path / "flip")
    assert [(a.index, a.label, a.value) for a in arms] == [(0, "arm0-100000", "100000"), (1, "arm1-10000", "10000")]
    assert [a.cfg.speculative_config["model"] for a in arms] == [str(a.folder.path) for a in arms]
    assert record["diffs_vs_first_arm"] == {"arm1-10000": ["config.json:rope_theta: 100000 != 10000"]}
    assert any(cf.FLIP_PLACEHOLDER in a for a in record["launch"]["argv"])
    assert all(str(arms[0].folder.path) not in a for a in record["launch"]["argv"])


# --- collection (no server: each unit stands in) ----------------------------------------------------------------


def test_servers_start_in_pairs_only_with_starts_together_2():
    from specbook.experiments.config_flip.collection import pairs_ahead

    one = cf.ConfigFlipParams.model_validate(_params("/x"))
    servers = [(f"s{i}", EngineConfig(model=f"/m{i}")) for i in range(3)]
    assert pairs_ahead(one, servers) == {}
    assert pairs_ahead(one.model_copy(update={"starts_together": 2}), servers) == {"s0": servers[1]}  # s2: alone


def test_the_timed_window_follows_the_warmup_on_the_running_server(draft_dir):
    from specbook.experiments.config_flip.collection import chat_requests, measure_arm, warmup_requests

    class Server:  # the two calls measure_arm makes on a running harness.Server
        def __init__(self):
            self.calls = []

        def send(self, requests):
            self.calls.append(("send", [(r.prompt_id, r.max_tokens) for r in requests]))

        def measure(self, requests, *, concurrency):
            self.calls.append(("measure", [(r.prompt_id, r.max_tokens) for r in requests], concurrency))
            return "window"

    params = cf.ConfigFlipParams.model_validate(_params(draft_dir, warmup_requests=2, concurrency=3, max_tokens=16))
    server = Server()
    requests = chat_requests(params)
    assert measure_arm(server, params, requests, warmup_requests(params)) == "window"
    warm = ("send", [("warmup000", 8)])
    assert server.calls == [warm, warm, ("measure", [("p000", 16), ("p001", 16), ("p002", 16)], 3)]


def test_collect_serves_each_arms_phases_on_one_server_skipping_done_ones(
        tmp_path, draft_dir, monkeypatch):
    from specbook.experiments.config_flip import collection

    params = cf.ConfigFlipParams.model_validate(_params(draft_dir, traces=True, cost_split=True))
    ctx = RunContext(tmp_path / "run")
    cut = ctx.run_dir / "traces" / "arm1-10000-trace"  # a cut attempt's trace records: set aside before the pass
    cut.mkdir(parents=True)
    (cut / "1.jsonl").write_text("{}\n")
    ran = []
    monkeypatch.setattr(collection, "done_units", lambda ctx, units: {("arm0-100000", "trace")})
    for kind in ("trace", "profile"):  # servers of their own: not for vLLM, which switches both at run time
        monkeypatch.setattr(collection, f"{kind}_unit", lambda p, c, arm, *a, kind=kind: ran.append((arm.label, kind)))
    monkeypatch.setattr(collection, "arm_unit", lambda p, c, arm, name, cfg, kinds, *a: ran.append(
        (arm.label, name, kinds, {k: v for k, v in cfg.env.items() if k.startswith("SPECBOOK_")})))
    monkeypatch.setattr(collection, "load", lambda ctx: "data")
    assert collection.collect(params, ctx) == "data"
    run = ctx.run_dir
    # one server per arm, its phases in order; tracing installed only where its pass is still to run
    assert ran == [
        ("arm0-100000", "arm0-100000", ("measured", "profile"),
         {"SPECBOOK_STEP_TIMING_DIR": str((run / "profiles" / "arm0-100000-prof").resolve())}),
        ("arm1-10000", "arm1-10000", ("measured", "trace", "profile"),
         {"SPECBOOK_TRACE_DIR": str(run / "traces" / "arm1-10000-trace"),
          "SPECBOOK_STEP_TIMING_DIR": str((run / "profiles" / "arm1-10000-prof").resolve())})]
    assert not (cut / "1.jsonl").exists() and (cut.with_name("arm1-10000-trace.unfinished-1") / "1.jsonl").is_file()
    assert ctx.load_json(cf.FLIP_JSON)["launch"]["argv"]


# --- analysis -------------------------------------------------------------------------------------

# Counter deltas per arm (the acceptance model's columns, positions from 1): arm1 collapsed.
ARM_COUNTS = {
    "arm0-100000": {"drafts": 100, "draft_tokens": 400, "accepted_tokens": 300, "positions": [90, 80, 70, 60]},
    "arm1-10000": {"drafts": 380, "draft_tokens": 1520, "accepted_tokens": 19, "positions": [15, 3, 1, 0]},
}
ARM_ALS = [(1.0, 2.0, 3.0), (1.0, 1.1, 1.05)]  # SpecDecoding log intervals' AL per arm


def _arms_frame() -> pd.DataFrame:
    rows = []
    for index, (arm, c) in enumerate(ARM_COUNTS.items()):
        rows.append({"arm": arm, "index": index, "value": arm.split("-")[1], "is_original": index == 0,
                     "elapsed_s": 10.0 * (index + 1), "drafts": c["drafts"], "draft_tokens": c["draft_tokens"],
                     "accepted_tokens": c["accepted_tokens"],
                     **{position_column(p + 1): n for p, n in enumerate(c["positions"])}})
    return pd.DataFrame(rows)


def _intervals_frame() -> pd.DataFrame:
    """SpecDecoding log intervals per arm in the new intervals layout (counts, positions from 1)."""
    rows = []
    t0 = pd.Timestamp("2026-11-30 10:00:00")
    for (arm, als) in zip(ARM_COUNTS, ARM_ALS, strict=True):
        for i, al in enumerate(als):
            drafts = 20
            accepted = round((al - 1) * drafts)
            pos = [min(drafts, max(0, accepted - drafts * p)) for p in range(4)]  # fill position 1 first
            rows.append({"arm": arm, "line_no": 100 + i, "timestamp": t0 + pd.Timedelta(seconds=i),
                         "timestamp_text": "", "engine": "000", "al": 1 + accepted / drafts,
                         "accepted_tokens": accepted, "draft_tokens": 4 * drafts, "drafts": drafts, "k": 4,
                         "accepted_throughput": float(accepted), "drafted_throughput": 4.0 * drafts,
                         "acceptance_rate": accepted / (4 * drafts),
                         **{position_column(p + 1): n for p, n in enumerate(pos)},
                         "stats_line_no": 99 + i, "running": 1, "waiting": 0, "prompt_throughput": 0.0,
                         "generation_throughput": 10.0, "kv_cache_usage": 0.01})
    return pd.DataFrame(rows)


def _requests_frame() -> pd.DataFrame:
    req = []
    for arm, wall in (("arm0-100000", 2.0), ("arm1-10000", 4.0)):
        for pid, text in (("p000", "same"), ("p001", "x" if arm == "arm0-100000" else "y")):
            req.append({"arm": arm, "prompt_id": pid, "output_text": text, "completion_tokens": 201,
                        "ttft_s": 0.1, "wall_s": wall + 0.1, "error": None})
    return pd.DataFrame(req)


DIFFS = {"diffs_vs_first_arm": {"arm1-10000": ["config.json:rope_theta: 100000 != 10000"]}}


def _data(flip_summary: dict | None = None, intervals: pd.DataFrame | None = None) -> cf.FlipData:
    return cf.FlipData(flip=flip_summary or DIFFS, arms=_arms_frame(), requests=_requests_frame(),
                       intervals=pd.DataFrame() if intervals is None else intervals)


def test_arm_summary_derives_al_tok_s_and_per_step_time_from_counts():
    s = cf.arm_summary(_data()).set_index("arm")
    assert "acceptance_length" not in s and "draft_acceptance_rate" not in s  # the acceptance model's names
    assert s.loc["arm0-100000", "al"] == pytest.approx(4.0)
    assert s.loc["arm1-10000", "al"] == pytest.approx(1.05)
    assert s.loc["arm0-100000", "output_tok_s"] == pytest.approx(402 / 10.0)
    # 2 requests x 200 decode tokens / AL 4 = 100 steps over 4 s of decode
    assert s.loc["arm0-100000", "decode_steps"] == pytest.approx(100.0)
    assert s.loc["arm0-100000", "per_step_ms"] == pytest.approx(40.0)
    assert s.loc["arm1-10000", "per_step_ms"] == pytest.approx(8000.0 / (400 / 1.05))
    assert s.loc["arm0-100000", "acceptance_rate"] == pytest.approx(0.75)
    assert s.loc["arm1-10000", "acceptance_rate"] == pytest.approx(19 / 1520)
    assert s.loc["arm1-10000", ["drafts", "draft_tokens", "accepted_tokens"]].tolist() == [380, 1520, 19]


def test_per_position_acceptance_is_accepted_over_drafts_from_position_1():
    pp = cf.per_position_acceptance(_data())
    assert list(pp.columns) == ["arm", "value", "position", "accepted", "drafts", "rate"]
    for arm, c in ARM_COUNTS.items():
        mine = pp[pp["arm"] == arm].set_index("position")
        assert list(mine.index) == [1, 2, 3, 4]  # accepted_pos_1 is position 1: nothing shifted
        assert list(mine["accepted"]) == c["positions"]
        assert list(mine["rate"]) == pytest.approx([n / c["drafts"] for n in c["positions"]])
    table = cf.per_position_table(pp)
    assert list(table.index) == [1, 2, 3, 4] and list(table.columns) == list(ARM_COUNTS)
    assert table.loc[1, "arm0-100000"] == pytest.approx(0.9)


def test_intervals_by_arm_shows_each_log_interval_al():
    table = cf.intervals_by_arm(_data(intervals=_intervals_frame()))
    assert list(table.columns) == list(ARM_COUNTS) and list(table.index) == [0, 1, 2]
    for arm, als in zip(ARM_COUNTS, ARM_ALS, strict=True):
        assert list(table[arm]) == pytest.approx(als)
    assert cf.intervals_by_arm(_data()).empty


def test_output_equality_per_prompt_with_first_difference():
    eq = cf.output_equality(_data()).set_index("prompt_id")
    assert bool(eq.loc["p000", "all_equal"]) and not bool(eq.loc["p001", "all_equal"])
    assert eq.loc["p001", "first_difference_arm1-10000"] == 0


def test_verdict_names_the_collapsed_arm():
    data = _data()
    verdict = cf.flip_verdict(cf.arm_summary(data), cf.output_equality(data), collapse_fraction=0.25)
    assert verdict.collapsed == ["arm1-10000"] and verdict.best_arm == "arm0-100000"
    assert not verdict.outputs_equal
    assert "collapsed in arm1-10000" in verdict.sentence()


def test_verdict_without_collapse_and_without_drafts():
    data = _data()
    data.arms.loc[1, "accepted_tokens"] = 300
    verdict = cf.flip_verdict(cf.arm_summary(data), cf.output_equality(data), collapse_fraction=0.25)
    assert verdict.collapsed == []
    data.arms["drafts"] = 0
    with pytest.raises(ExperimentError, match="no arm has drafts"):
        cf.flip_verdict(cf.arm_summary(data), cf.output_equality(data), collapse_fraction=0.25)


def test_diff_table_lists_the_proven_difference():
    table = cf.diff_table(_data())
    assert table.to_dict("records") == [{"arm": "arm1-10000", "difference": "config.json:rope_theta: 100000 != 10000"}]


def test_describe_flip_names_field_values_and_sharing(tmp_path, draft_dir):
    params = cf.ConfigFlipParams.model_validate(_params(draft_dir))
    _, summary = cf.build_arms(params, tmp_path / "flip")
    data = cf.FlipData(flip=summary, arms=pd.DataFrame(), requests=pd.DataFrame(), intervals=pd.DataFrame())
    text = cf.describe_flip(data)
    assert "config.json:rope_theta  (original value 100000)" in text
    assert "arm1-10000: rope_theta = 10000; 1 weight file(s) symlinked" in text
    assert "serves as the draft" in text


def test_analyze_gathers_every_table_and_the_verdict(tmp_path, draft_dir):
    params = cf.ConfigFlipParams.model_validate(_params(draft_dir, collapse_fraction=0.25))
    _, summary = cf.build_arms(params, tmp_path / "flip")
    data = _data(summary, _intervals_frame())
    result = cf.analyze(data, params)
    assert isinstance(result, cf.FlipResult)
    pd.testing.assert_frame_equal(result.summary, cf.arm_summary(data))
    pd.testing.assert_frame_equal(result.per_position, cf.per_position_acceptance(data))
    assert list(result.per_position_table.index) == [1, 2, 3, 4]
    assert result.description == cf.describe_flip(data)
    assert result.differences.to_dict("records") == [
        {"arm": "arm1-10000", "difference": "config.json:rope_theta: 100000 != 10000"}]
    assert list(result.intervals_by_arm.columns) == list(ARM_COUNTS)
    assert result.verdict.collapsed == ["arm1-10000"] and not result.output_equality["all_equal"].all()
    # the verdict follows the params' collapse fraction: at 0.001 nothing counts as collapsed
    lenient = cf.analyze(data, params.model_copy(update={"collapse_fraction": 0.001}))
    assert lenient.verdict.collapsed == []


def _old_arms_frame(arms: pd.DataFrame) -> pd.DataFrame:
    """The arms frame as commit 5ece790 saved it: per-position counts numbered from 0."""
    return arms.rename(columns={position_column(p + 1): f"accepted_pos_{p}" for p in range(4)})


def _old_intervals_frame(iv: pd.DataFrame) -> pd.DataFrame:
    """Log intervals as specbook saved them before: vLLM's printed names and per-position RATES (0-based)."""
    old = iv.rename(columns={"al": "mean_acceptance_length", "draft_tokens": "drafted_tokens",
                             "k": "num_speculative_tokens", "acceptance_rate": "avg_draft_acceptance_rate"})
    for p in range(4):
        old[f"acceptance_pos_{p}"] = (old.pop(position_column(p + 1)) / old["drafts"]).round(3)
    return old


def _save_run(root: Path, summary: dict, arms: pd.DataFrame, intervals: pd.DataFrame) -> RunContext:
    ctx = RunContext(root)
    ctx.save_json(cf.FLIP_JSON, summary)
    ctx.save_frame(cf.ARMS_FRAME, arms)
    ctx.save_frame(cf.REQUESTS_FRAME, _requests_frame())
    ctx.save_frame(cf.INTERVALS_FRAME, intervals)
    return ctx


def test_load_of_an_old_layout_run_folder_gives_the_same_figures(tmp_path, draft_dir):
    params = cf.ConfigFlipParams.model_validate(_params(draft_dir))
    _, summary = cf.build_arms(params, tmp_path / "flip")
    arms, iv = _arms_frame(), _intervals_frame()
    new = cf.load(_save_run(tmp_path / "new", summary, arms, iv))
    old = cf.load(_save_run(tmp_path / "old", summary, _old_arms_frame(arms), _old_intervals_frame(iv)))
    assert "accepted_pos_0" not in old.arms and list(old.arms[position_column(1)]) == [90, 15]
    got, want = cf.analyze(old, params), cf.analyze(new, params)
    for name in ("summary", "per_position", "per_position_table", "intervals_by_arm", "output_equality"):
        pd.testing.assert_frame_equal(getattr(got, name), getattr(want, name), check_dtype=False, obj=name)
    assert got.verdict == want.verdict and got.description == want.description


# --- failed requests ------------------------------------------------------------------------------------------


def _data_with_a_failed_request() -> cf.FlipData:
    """p001 failed in the flipped arm: no output there (the client records the error and an empty text)."""
    data = _data()
    req = data.requests
    req.loc[(req["arm"] == "arm1-10000") & (req["prompt_id"] == "p001"), ["output_text", "error"]] = (
        "", "RemoteProtocolError: peer closed connection")
    return data


def test_a_failed_request_is_not_an_output_that_differs():
    """Before: the failed request's empty text was compared and counted as a differing output."""
    data = _data_with_a_failed_request()
    eq = cf.output_equality(data).set_index("prompt_id")
    assert bool(eq.loc["p000", "all_equal"]) and bool(eq.loc["p000", "comparable"])
    assert not eq.loc["p001", "comparable"] and eq.loc["p001", "all_equal"] is None
    assert eq.loc["p001", "no_output"] == "arm1-10000"
    verdict = cf.flip_verdict(cf.arm_summary(data), eq.reset_index(), collapse_fraction=0.25)
    assert verdict.outputs_equal  # the one prompt both arms answered is equal


def test_an_arm_over_max_failed_requests_is_left_out_with_the_reason(tmp_path, draft_dir):
    data = _data_with_a_failed_request()
    strict = cf.ConfigFlipParams.model_validate(_params(draft_dir))
    _, data.flip = cf.build_arms(strict, tmp_path / "flip")
    result = cf.analyze(data, strict)
    failures = result.request_failures.set_index("arm")
    assert failures["n_failed"].tolist() == [0, 1] and failures["valid"].tolist() == [True, False]
    assert list(result.verdict.left_out) == ["arm1-10000"]
    assert "1 of 2 requests failed, more than measurement.max_failed_requests = 0" in result.verdict.left_out["arm1-10000"]
    assert result.verdict.collapsed == [] and list(result.verdict.accepted_per_step) == ["arm0-100000"]
    assert "Left out for failed requests: arm1-10000" in result.verdict.sentence()
    heads = {h.comparison: h.verdict for h in result.answer(strict).headlines}
    assert heads["arm1-10000"] == "LEFT OUT"

    tolerant = strict.model_copy(update={"measurement": cf.RequestMeasurement(max_failed_requests=1)})
    kept = cf.analyze(data, tolerant)
    assert kept.verdict.left_out == {} and kept.verdict.collapsed == ["arm1-10000"]
    assert kept.verdict.outputs_equal and kept.summary.set_index("arm").loc["arm1-10000", "failed"] == 1


# --- the optional passes: traces and cost split per arm (synthetic frames) -------------------------------------

PROMPT_IDS = [1, 2, 3]
OUTPUT_IDS = [10, 11, 12, 13, 14, 15, 16, 17]  # both arms emit the same 8 ids (greedy: the target decides)
# (anchor_pos, proposed) per arm, k = 3; anchor_pos counts the prompt's 3 ids
ARM_STEPS = {
    "arm0-100000": [(4, [11, 12, 13]), (8, [15, 16, 99])],  # accepted 3, then 2 (ends at token 7 of 8)
    "arm1-10000": [(4, [50, 51, 52]), (5, [12, 60, 61]), (7, [70, 71, 72]), (8, [15, 16, 99])],  # 0, 1, 0, 2
}


def _trace_set(arm: str, counters: Acceptance) -> TraceSet:
    records = [ProposalRecord(engine="vllm", request_id=f"{arm}-r0", anchor_pos=pos,
                              anchor_id=(PROMPT_IDS + OUTPUT_IDS)[pos - 1], proposed=tuple(props), prompt_len=3)
               for pos, props in ARM_STEPS[arm]]
    req = RequestTrace("p000", f"{arm}-r0", PROMPT_IDS, len(PROMPT_IDS), OUTPUT_IDS, "length")
    return TraceSet("vllm", f"{arm}-trace", "draft_model", records_frame(records), [req], counters, wall_s=1.5)


COUNTERS = {"arm0-100000": Acceptance(source="c", drafts=2.0, draft_tokens=6.0, accepted_tokens=5.0,
                                      accepted_per_position=(2.0, 2.0, 1.0)),
            "arm1-10000": Acceptance(source="c", drafts=4.0, draft_tokens=12.0, accepted_tokens=4.0,
                                     accepted_per_position=(2.0, 1.0, 0.0))}  # one more accepted than the traces


def _split(arm: str, step_ms: float) -> pd.DataFrame:
    from specbook.measure.costsplit import CostSplit, splits_frame

    parts = {"target_forward": step_ms / 2, "draft": step_ms / 4, "sampling": 1.0, "rest": step_ms / 4 - 1.0}
    return splits_frame([CostSplit("vllm", arm, "profiler", 20, step_ms, parts, 4.0, overhead=1.2)])


def _traced_run(root: Path, summary: dict, references: dict[str, pd.DataFrame] | None = None) -> RunContext:
    """A run folder as collect leaves it with traces and cost_split on: the measured arms' rows, then per arm
    its trace pass's and profiled pass's frames and done rows (the arms frame holds all three kinds)."""
    from specbook.traces import tables

    arms = _arms_frame().assign(kind="measured", server=lambda f: f["arm"])
    ctx = _save_run(root, summary, arms, _intervals_frame())
    for index, arm in enumerate(ARM_COUNTS):
        frames = tables.trace_set_frames(_trace_set(arm, COUNTERS[arm]))
        if references and arm in references:
            frames[tables.TRACE_REFERENCE] = references[arm]
        for name, frame in frames.items():
            ctx.append_frame(name, cf._keyed(frame, arm, "trace"))
        ctx.append_frame(cf.ARMS_FRAME, pd.DataFrame([{"arm": arm, "kind": "trace", "server": f"{arm}-trace",
                                                       "index": index, "value": "v", "ready_s": 1.0}]))
        ctx.append_frame(cf.COST_SPLIT_FRAME, cf._keyed(_split(arm, 40.0 * (index + 1)), arm, "profile"))
        ctx.append_frame(cf.ARMS_FRAME, pd.DataFrame([{"arm": arm, "kind": "profile", "server": f"{arm}-prof",
                                                       "index": index, "value": "v", "ready_s": None}]))
    return ctx


@pytest.fixture()
def traced(tmp_path, draft_dir) -> tuple[cf.ConfigFlipParams, cf.FlipData]:
    params = cf.ConfigFlipParams.model_validate(_params(draft_dir, traces=True, cost_split=True))
    _, summary = cf.build_arms(params, tmp_path / "flip")
    return params, cf.load(_traced_run(tmp_path / "run", summary))


def test_the_passes_are_off_by_default_and_on_in_the_cpu_demo():
    base = cf.ConfigFlipParams.model_validate(_params("/x"))
    assert (base.traces, base.cost_split) == (False, False)
    demo = load_params(cf.ConfigFlipParams, params_dir() / "config_flip" / "cpu-demo.yaml")
    assert demo.traces and demo.cost_split


def test_load_keeps_the_measured_arms_apart_from_the_passes_done_rows(traced):
    _, data = traced
    assert data.arms["arm"].tolist() == list(ARM_COUNTS) and set(data.arms["kind"]) == {"measured"}
    assert set(data.trace_passes["arm"]) == set(ARM_COUNTS) and len(data.cost_split) == 2


def test_the_passes_are_resume_units_keyed_by_arm_and_kind(traced, tmp_path):
    from specbook.store.units import done_units, set_aside_unfinished

    ctx = RunContext(tmp_path / "run")
    assert done_units(ctx, cf.UNITS) == {(a, k) for a in ARM_COUNTS for k in cf.UNIT_KINDS}
    # arm1's profiled pass was cut before its done row: its split is set aside, the rest stays
    arms = ctx.load_frame(cf.ARMS_FRAME)
    ctx.save_frame(cf.ARMS_FRAME, arms[~((arms["arm"] == "arm1-10000") & (arms["kind"] == "profile"))])
    moved = set_aside_unfinished(ctx, cf.UNITS)
    assert moved["rows"] == {cf.COST_SPLIT_FRAME: 1}
    assert cf.load(ctx).cost_split["arm"].tolist() == ["arm0-100000"]


def test_derived_counts_against_the_counters_per_arm(traced):
    _, data = traced
    table = cf.trace_agreement_by_arm(data).set_index("arm")
    good, off = table.loc["arm0-100000"], table.loc["arm1-10000"]
    assert (good["derived_drafts"], good["derived_draft_tokens"], good["derived_accepted"]) == (2, 6, 5)
    assert good["agree"] and good["disagreements"] == "" and good["pass_wall_s"] == 1.5
    assert (off["derived_drafts"], off["derived_accepted"], off["counter_accepted"]) == (4, 3, 4)
    assert not off["agree"] and off["disagreements"].startswith("accepted_tokens: derived 3 vs counters 4")


def test_proposals_beside_the_emitted_ids(traced):
    _, data = traced
    table = cf.proposals_table(data)
    arm0 = table[table["arm"] == "arm0-100000"]
    assert arm0["proposed"].tolist() == [[11, 12, 13], [15, 16, 99]]
    assert arm0["emitted"].tolist() == [[11, 12, 13], [15, 16, 17]] and arm0["accepted"].tolist() == [3, 2]
    assert table[table["arm"] == "arm1-10000"]["accepted"].tolist() == [0, 1, 0, 2]
    assert len(cf.proposals_table(data, steps_per_arm=1)) == 2


def test_matched_anchors_between_arms_and_the_identical_share(traced):
    _, data = traced
    matched = cf.matched_anchors_between_arms(data)
    assert set(matched["pair"]) == {"arm0-100000 vs arm1-10000"}
    assert matched["anchor_pos"].tolist() == [4, 8]  # the positions both arms drafted from
    assert matched["identical"].tolist() == [False, True] and matched["first_diff"].tolist()[0] == 1
    summary = cf.matched_anchor_summary(matched).iloc[0]
    assert (summary["matched_anchors"], summary["identical"], summary["identical_share"]) == (2, 1, 0.5)
    assert cf.identical_share_line(cf.matched_anchor_summary(matched)).endswith("arm0-100000 vs arm1-10000 50% of 2")


def test_acceptance_on_the_common_prefix_reads_n_tokens_in_a_steps_vs_b(traced):
    _, data = traced
    row = cf.prefix_acceptance_between_arms(data).iloc[0]
    assert (row["common_prefix"], row["steps_a"], row["steps_b"]) == (8, 2, 4)
    assert (row["accepted_a"], row["accepted_b"]) == (5, 3)
    assert row["summary"] == "8 tokens in 2 steps (arm0-100000) vs 4 (arm1-10000)"


def test_replay_reference_per_draft_model_arm(tmp_path, draft_dir):
    params = cf.ConfigFlipParams.model_validate(_params(draft_dir, traces=True))
    _, summary = cf.build_arms(params, tmp_path / "flip")
    own = pd.DataFrame({"request_id": ["arm0-100000-r0"] * 2, "anchor_pos": [4, 8],
                        "reference": [[11, 12, 13], [15, 16, 99]]})
    data = cf.load(_traced_run(tmp_path / "run", summary, {"arm0-100000": own}))
    table = cf.replay_by_arm(data)
    assert table.to_dict("records") == [{"arm": "arm0-100000", "anchors": 2, "identical_share": 1.0,
                                         "systematic_mismatches": "none"}]


def test_cost_split_per_arm_as_the_bars_read_it(traced):
    from specbook.report import plots

    _, data = traced
    table = cf.cost_split_table(data)
    assert table["lane"].tolist() == list(ARM_COUNTS) and table["step_ms"].tolist() == [40.0, 80.0]
    assert "kind" not in table and "arm" not in table
    plots.cost_split_bars(table)  # the report's stacked bars take the table as it is


def test_the_split_is_scaled_to_each_arms_measured_step(traced):
    params, data = traced
    result = cf.analyze(data, params)
    per_step = dict(zip(result.summary["arm"], result.summary["per_step_ms"], strict=True))
    scaled = result.cost_split_scaled
    for arm, measured in zip(result.cost_split["lane"], result.cost_split["step_ms"], strict=True):
        whole = scaled[(scaled["lane"] == arm) & (scaled["part"] == "step (all parts)")]
        assert whole["measured_ms"].tolist() == [measured] and whole["scaled_ms"].tolist() == [per_step[arm]]
    assert result.cost_split_notes == costsplit.split_notes(result.cost_split)
    assert cf.analyze(_data(data.flip), params).cost_split_scaled.empty


def test_analyze_and_the_summary_show_the_passes_only_when_run(traced, tmp_path, draft_dir):
    params, data = traced
    result = cf.analyze(data, params)
    assert result.trace_note == cf.TRACE_NOTE and "untimed" in result.trace_note
    assert len(result.trace_agreement) == 2 and len(result.cost_split) == 2 and len(result.prefix_acceptance) == 1
    evidence = result.answer(params).evidence
    assert evidence[-1] == "identical proposals at matched anchors (untimed trace pass): arm0-100000 vs arm1-10000 50% of 2"
    plain = cf.analyze(_data(data.flip), params)
    assert plain.trace_note == "" and plain.trace_agreement.empty and plain.cost_split.empty
    assert not any("identical proposals" in e for e in plain.answer(params).evidence)


def test_a_cut_pass_folder_is_set_aside_beside_never_reused(tmp_path):
    from specbook.store.units import set_aside_folder

    folder = tmp_path / "traces" / "arm1-10000-trace"
    assert set_aside_folder(folder) is None  # a fresh run: nothing to move
    for n in (1, 2):
        folder.mkdir(parents=True)
        (folder / "1.jsonl").write_text("{}\n")
        assert set_aside_folder(folder) == folder.with_name(f"arm1-10000-trace.unfinished-{n}")
        assert not folder.exists() and (folder.with_name(f"arm1-10000-trace.unfinished-{n}") / "1.jsonl").is_file()


def test_a_resumed_arm_gets_a_fresh_server_name_where_a_done_phase_used_its_own():
    from types import SimpleNamespace

    from specbook.experiments.config_flip.collection import arm_server_name

    arm = SimpleNamespace(label="arm0-1")
    assert arm_server_name(arm, set()) == "arm0-1"
    assert arm_server_name(arm, {"arm0-1"}) == "arm0-1-2"
    assert arm_server_name(arm, {"arm0-1", "arm0-1-2", "arm1-2"}) == "arm0-1-3"
