"""The knob A/B analysis on crafted run/interval frames whose answers are known by construction.

Launch argv come from the real vLLM adapter (build_spec), exactly as collect() records them. Frames are
built in the layout collect() saves now (the acceptance model's counts); one test writes the layout of
older specbook versions into a run folder and checks load() gives the same figures.
"""

import json
import math
from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest

from specbook.core.acceptance import position_column
from specbook.core.errors import ExperimentError, ParamsError
from specbook.core.params import validate_params
from specbook.engines import get_engine
from specbook.experiments import knob_ab
from specbook.experiments.knob_ab.analysis import per_position_frame, reconcile_log_with_counters
from specbook.experiments.knob_ab.attribution import (
    _arm_config,
    attention_backends_from_logs,
    backend_knob_reach,
)
from specbook.experiments.knob_ab.collection import COUNTER, run_name, stop_note, upgrade_runs_frame
from specbook.store.runstore import RunContext

PARAMS = {
    "engine": {"engine": "vllm", "model": "org/target", "dtype": "bfloat16", "max_num_seqs": 4,
               "speculative_config": {"method": "draft_model", "model": "org/draft-fp8", "num_speculative_tokens": 4}},
    "knobs": [
        {"name": "fp32", "set": {"dtype": "float32"}, "expect": "equivalent"},
        {"name": "int4", "set": {"speculative_config.model": "org/draft-int4"}, "expect": "different"},
    ],
    "sweeps": 3,
    "workload": {"concurrency": 4},
    "measurement": {"n_boot": 2000},
    "decision": {"max_abs_delta_pct": 1.0, "max_abs_delta_over_sd": 1.0, "min_sweeps": 3, "tost_margin_pct": 1.0},
}
# Steady-state AL per (arm, sweep), chosen so fp32 is within noise and int4 is far off.
STEADY_AL = {
    "baseline": [4.30, 4.31, 4.32],
    "fp32": [4.305, 4.31, 4.315],
    "int4": [3.10, 3.12, 3.11],
    "fp32+int4": [3.105, 3.11, 3.115],
}
WARMUP_AL = 1.5  # what load-dropped intervals show: must not reach the verdicts
K = 4
IV_DRAFTS = 200  # drafts per log interval
RUN_DRAFTS = 337  # drafts per run (counter delta): rates accepted/337 are not exact in binary
# position i's share of the accepted tokens around their mean: falls with the position, as real drafts do
SHAPE = (1.15, 1.05, 0.95, 0.85)


def params(**overrides):
    return validate_params(knob_ab.KnobABParams, {**PARAMS, **overrides}, "test-params.yaml")


def position_counts(accepted: int, drafts: int) -> list[int]:
    """`accepted` split over positions 1..K, falling with the position, each at most `drafts`."""
    mean = accepted / K
    first = [round(mean * s) for s in SHAPE[:-1]]
    counts = [*first, accepted - sum(first)]
    assert all(0 <= c <= drafts for c in counts) and counts == sorted(counts, reverse=True)
    return counts


def run_counts(al: float) -> dict[str, int]:
    """A run's counter delta (acceptance-model columns, counter_ prefix) whose AL is `al`."""
    accepted = round((al - 1) * RUN_DRAFTS)
    return {f"{COUNTER}drafts": RUN_DRAFTS, f"{COUNTER}draft_tokens": RUN_DRAFTS * K,
            f"{COUNTER}accepted_tokens": accepted,
            **{position_column(i + 1, COUNTER): n for i, n in enumerate(position_counts(accepted, RUN_DRAFTS))}}


def intervals_for(run_id, steady_al, t0):
    """Ten log intervals: warm-up, six at full load with `steady_al`, drain (the new intervals layout)."""
    rows = []
    running = [1, 2, 4, 4, 4, 4, 4, 4, 2, 1]
    for i, r in enumerate(running):
        accepted = round(((steady_al if r == 4 else WARMUP_AL) - 1) * IV_DRAFTS)
        ts = t0 + timedelta(seconds=i)
        rows.append({"run_id": run_id, "line_no": 10 + i, "timestamp": ts,
                     "timestamp_text": ts.strftime("%m-%d %H:%M:%S"), "engine": "000",
                     "al": 1 + accepted / IV_DRAFTS, "accepted_tokens": accepted,
                     "draft_tokens": IV_DRAFTS * K, "drafts": IV_DRAFTS, "k": K, "accepted_throughput": accepted / 1.0,
                     "drafted_throughput": IV_DRAFTS * K / 1.0, "acceptance_rate": accepted / (IV_DRAFTS * K),
                     **{position_column(p + 1): n for p, n in enumerate(position_counts(accepted, IV_DRAFTS))},
                     "stats_line_no": 9 + i, "running": r, "waiting": 0, "prompt_throughput": 0.0,
                     "generation_throughput": 100.0, "kv_cache_usage": 0.1, "t_s": float(i)})
    return rows


def make_data(p, *, mislabel=None, al_table=None):
    engine = get_engine("vllm")
    arms = {a.name: a for a in p.arms()}
    runs, intervals = [], []
    t0 = datetime(2026, 11, 29, 12, 0, 0)
    order = 0
    for sweep in range(p.sweeps):
        for name, arm in arms.items():
            run_id = run_name(order, sweep, arm)
            real = mislabel[1] if mislabel and mislabel[0] == run_id else name
            cfg = _arm_config(arms[real], p)
            spec = engine.build_spec(cfg, name=run_id, log_path=Path("x.log"), port=40000 + order)
            al = (al_table or STEADY_AL)[real][sweep]
            runs.append({"run_id": run_id, "order": order, "sweep": sweep, "declared_arm": name, "status": "ok",
                         "argv": json.dumps(spec.argv), "launched_env": json.dumps(spec.env),
                         "tok_s": 50.0, "wall_s": 10.0, "completion_tokens": 500, "correct": 5, "total": 12,
                         **run_counts(al)})
            intervals += intervals_for(run_id, al, t0 + timedelta(minutes=order))
            order += 1
    return knob_ab.KnobABData(pd.DataFrame(runs), pd.DataFrame(intervals), pd.DataFrame())


def test_verdicts_equivalent_for_the_neutral_knob_and_different_for_the_control():
    p = params()
    d = knob_ab.analyze(make_data(p), p).decision
    conclusions = {(r["comparison"]): r["conclusion"] for _, r in d.knob_verdicts.iterrows()}
    # fp32's per-sweep deltas +0.005, 0, -0.005 AL: the 95% interval [-0.29%, +0.29%] lies inside +/-1%
    assert conclusions["fp32 vs baseline"] == "shown equivalent"
    assert conclusions["int4 vs baseline"] == "shown different"
    # each knob judged again with the other knob on
    assert conclusions["fp32+int4 vs int4"] == "shown equivalent"
    assert conclusions["fp32+int4 vs fp32"] == "shown different"
    assert d.knob_verdicts["as expected"].all() and d.knob_verdicts["meets the stated rule"].all()
    assert "PASS" in set(d.verdict_table["result"])
    assert d.value_col == "steady_log_al" and d.rule_text == p.decision.describe()
    assert "SHOWN EQUIVALENT when the whole interval lies inside \u00b11%" in d.vocabulary


def test_the_label_and_the_stated_rule_are_separate_lines():
    """A knob whose point passes the stated rule but whose interval reaches past the margin: UNDECIDED, and the
    rule's 'yes' is its own line; the colour is the expectation's, never the label's."""
    p = params(decision={"max_abs_delta_pct": 1.0, "max_abs_delta_over_sd": 1.0, "min_sweeps": 3,
                         "tost_margin_pct": 1.0, "require_tost": False})
    # fp32 - baseline per sweep: +0.03, -0.03, +0.02 AL: the mean (+0.16%, 0.67 baseline sd) passes the rule,
    # the paired 95% interval (+/-1.85%) reaches past the 1% margin
    r = knob_ab.analyze(make_data(p, al_table={**STEADY_AL, "fp32": [4.33, 4.28, 4.34]}), p)
    v = next(v for v in r.decision.verdicts if (v.arm, v.baseline) == ("fp32", "baseline"))
    assert (v.conclusion, v.meets_rule) == ("undecided", True)
    head = next(h for h in r.answer(p).headlines if h.comparison == "fp32 vs baseline")
    assert head.verdict.startswith("UNDECIDED: ~") and head.verdict.endswith("more sweeps")
    assert head.rule == "meets the stated rule: yes"
    assert head.expected == "expected equivalent: no" and head.good is False
    assert "vs margin \u00b11%; paired t over 3 sweeps (df 2)" in head.interval
    assert "includes 0 and reaches beyond \u00b11%" in head.why and "sweeps_max" in head.why


def test_steady_state_drops_load_intervals_and_keeps_the_constructed_al():
    p = params()
    res = knob_ab.analyze(make_data(p), p)
    run_al = res.decision.run_al
    base = run_al[run_al["arm"] == "baseline"].sort_values("sweep")
    assert base["steady_log_al"].tolist() == pytest.approx(STEADY_AL["baseline"], abs=1e-12)
    assert (base["intervals_kept"] == 6).all() and (base["intervals_total"] == 10).all()
    # all intervals (warm-up and drain included) pull AL toward the warm-up value
    assert (base["all_intervals_log_al"] < base["steady_log_al"]).all()
    assert set(res.steady.drop_reasons.columns) >= {"warm-up", "drain"}


def test_counter_al_is_derived_from_the_saved_counts():
    p = params()
    data = make_data(p)
    assert "counter_al" not in data.runs  # not saved: derived from the counts
    res = knob_ab.analyze(data, p)
    runs = data.runs.set_index("run_id")
    expected = 1 + runs[f"{COUNTER}accepted_tokens"] / runs[f"{COUNTER}drafts"]
    for table in (res.decision.run_al, res.runs):
        got = table.set_index("run_id")["counter_al"]
        assert got.to_dict() == pytest.approx(expected.to_dict(), abs=1e-12)
    # the counts are round((AL - 1) x 337): the counter AL is the constructed AL to 1/337
    base = res.decision.run_al[res.decision.run_al["arm"] == "baseline"].sort_values("sweep")
    assert base["counter_al"].tolist() == pytest.approx(STEADY_AL["baseline"], abs=0.5 / RUN_DRAFTS)


def test_counter_al_as_primary_gives_the_same_verdicts():
    p = params(measurement={"n_boot": 2000, "primary": "counter_al"})
    d = knob_ab.analyze(make_data(p), p).decision
    assert d.value_col == "counter_al"
    conclusions = d.knob_verdicts.set_index("comparison")["conclusion"]
    assert conclusions["fp32 vs baseline"] == "shown equivalent" and conclusions["int4 vs baseline"] == "shown different"


def test_crude_cut_is_shown_lower_than_the_load_cut():
    p = params()
    s = knob_ab.analyze(make_data(p), p).steady
    row = s.crude_vs_load.set_index("arm").loc["baseline"]
    crude_col = next(c for c in s.crude_vs_load.columns if c.startswith("crude cut"))
    assert row[crude_col] < row["load cut (steady)"]
    assert f"{s.crude_threshold:.3f}" in crude_col


def test_sensitivity_table_has_one_row_per_fraction_and_one_column_per_arm():
    p = params()
    s = knob_ab.analyze(make_data(p), p).steady
    assert list(s.sensitivity_table.index) == p.steady_state.sensitivity
    assert set(s.sensitivity_table.columns) == set(STEADY_AL)
    # at full load only steady intervals stay: the arm's mean of its constructed AL
    assert s.sensitivity_table.loc[1.0, "int4"] == pytest.approx(sum(STEADY_AL["int4"]) / 3, abs=1e-12)


def test_interaction_is_near_zero_when_effects_add_up():
    p = params()
    res = knob_ab.analyze(make_data(p), p)
    inter = res.decision.interaction.set_index("quantity")["value"]
    # (A+B - B) - (A - base) by construction: (3.11 - 3.11) - (4.31 - 4.31) = 0
    assert inter["interaction (A+B - B) - (A - base)"] == pytest.approx(0.0, abs=1e-9)
    assert inter["effect of B"] == pytest.approx(3.11 - 4.31, abs=1e-9)
    assert inter["interaction 95% CI low"] <= 0 <= inter["interaction 95% CI high"]
    # A and B are named: the table's arms column and the label below it
    arms = res.decision.interaction.set_index("quantity")["arms"]
    assert arms["effect of A"] == "fp32 - baseline" and arms["effect of B"] == "int4 - baseline"
    assert arms["interaction (A+B - B) - (A - base)"] == "(fp32+int4 - int4) - (fp32 - baseline)"
    text = res.decision.interaction_text
    assert text.startswith("A = fp32, B = int4, A+B = fp32+int4") and "vs margin \u00b11%" in text


def test_the_intro_follows_the_workload_and_accuracy_says_first_what_it_can_judge():
    from specbook.core.paths import project_root
    from specbook.experiments.knob_ab.tables import intro_text

    root = project_root() / "params" / "knob_ab"
    spec_bench = knob_ab.load_params_file(str(root / "h200-attention-backend-both.yaml"))
    assert "Spec-Bench" in intro_text(spec_bench) and "GSM8K" not in intro_text(spec_bench)
    assert "GSM8K 5-shot chat" in intro_text(knob_ab.load_params_file(str(root / "cpu-demo.yaml")))
    p = params()
    r = knob_ab.analyze(make_data(p), p)
    # 12 graded answers per run, 3 runs per arm: 36 per arm
    assert r.accuracy_lead.startswith("GSM8K exact-answer accuracy per arm") and "36 graded answers" in r.accuracy_lead
    assert r.arms == ["baseline", "fp32", "int4", "fp32+int4"]


def test_a_run_whose_real_args_differ_from_its_declared_arm_is_flagged_and_moved():
    p = params()
    data = make_data(p, mislabel=("01-sweep0-fp32", "baseline"))
    res = knob_ab.analyze(data, p)
    flagged = res.attribution.flagged.set_index("run_id")
    assert list(flagged.index) == ["01-sweep0-fp32"]
    assert flagged.loc["01-sweep0-fp32", "arm"] == "baseline"
    assert "--dtype" in flagged.loc["01-sweep0-fp32", "reason"]
    assert (res.decision.run_al["arm"] == "baseline").sum() == 4
    assert len(res.attribution.table) == len(data.runs)


def expected_position_rates(data, arm: str) -> dict[int, float]:
    """Mean over the arm's runs of counter_accepted_pos_i / counter_drafts, by position i (1-based)."""
    runs = data.runs[data.runs["declared_arm"] == arm]
    return {i: float((runs[position_column(i, COUNTER)] / runs[f"{COUNTER}drafts"]).mean()) for i in range(1, K + 1)}


def test_per_position_from_counters_is_one_based():
    p = params()
    data = make_data(p)
    res = knob_ab.analyze(data, p)
    pp = res.per_position
    assert sorted(pp["position"].unique()) == list(range(1, K + 1))
    assert set(pp["source"]) == {"counters"}
    rates = pp.groupby(["arm", "position"])["rate"].mean()
    for arm in STEADY_AL:
        for pos, rate in expected_position_rates(data, arm).items():
            assert rates[(arm, pos)] == pytest.approx(rate, abs=1e-12)
    # position 1 is the first drafted token: the highest rate, not shifted to position 0 or 2
    assert rates[("baseline", 1)] > rates[("baseline", 2)] > rates[("baseline", K)]
    table = res.per_position_table
    assert list(table.index) == list(range(1, K + 1)) and set(table.columns) == set(STEADY_AL)
    assert table.loc[1, "int4"] == pytest.approx(rates[("int4", 1)], abs=1e-12)


def test_per_position_from_log_intervals_when_runs_have_no_counters():
    p = params()
    data = make_data(p)
    runs = data.runs.drop(columns=[c for c in data.runs if c.startswith(COUNTER)])
    arm_of = dict(zip(runs["run_id"], runs["declared_arm"], strict=True))
    pp = per_position_frame(runs, data.intervals, arm_of)
    assert set(pp["source"]) == {"log"} and sorted(pp["position"].unique()) == list(range(1, K + 1))
    run_id = runs["run_id"].iloc[0]
    part = data.intervals[data.intervals["run_id"] == run_id]
    got = pp[pp["run_id"] == run_id].set_index("position")
    for pos in range(1, K + 1):
        assert got.loc[pos, "accepted"] == part[position_column(pos)].sum()
        assert got.loc[pos, "rate"] == pytest.approx(part[position_column(pos)].sum() / part["drafts"].sum())


def test_ingest_mode_requires_logs():
    with pytest.raises(ParamsError, match="ingest"):
        params(mode="ingest")


def test_resampling_draws_one_subset_per_sweep_shared_by_its_arms():
    fixed = params()
    assert {fixed.workload.subset_seed(s) for s in range(3)} == {fixed.workload.seed}
    fresh = params(workload={"concurrency": 4, "seed": 7, "resample_per_sweep": True})
    assert [fresh.workload.subset_seed(s) for s in range(3)] == [7, 8, 9]


def test_a_knob_env_var_inherited_from_the_launching_shell_is_refused():
    from specbook.core.errors import ExperimentError

    p = params(knobs=[{"name": "qr", "env": {"QR": "INT4"}}, {"name": "int4", "set": {"dtype": "float32"}}])
    knob_ab.check_inherited_knob_env(p, {"PATH": "/bin"})  # clean shell: fine
    with pytest.raises(ExperimentError, match="QR='INT6'"):
        knob_ab.check_inherited_knob_env(p, {"QR": "INT6"})
    # a key every arm sets explicitly is visible on every Env: line, so inheriting it is harmless
    p2 = params(engine={**PARAMS["engine"], "env": {"QR": "none"}},
                knobs=[{"name": "qr", "env": {"QR": "INT4"}}])
    knob_ab.check_inherited_knob_env(p2, {"QR": "INT6"})


def test_log_totals_are_reconciled_with_the_counters():
    runs = pd.DataFrame({"run_id": ["a", "b"], "counter_drafts": [30, 30], "counter_accepted_tokens": [90, 90]})
    iv = pd.DataFrame({"run_id": ["a", "a", "b"], "drafts": [10, 20, 10], "accepted_tokens": [30, 60, 30]})
    rec = reconcile_log_with_counters(runs, iv).set_index("run_id")
    assert rec.loc["a", "log_matches_counters"] and not rec.loc["b", "log_matches_counters"]
    assert rec.loc["b", "log_drafts"] == 10 and rec.loc["b", "log_accepted_tokens"] == 30
    assert rec.loc["b", "counter_accepted_tokens"] == 90


def test_a_log_short_of_its_counters_is_noted_in_the_result():
    p = params()
    res = knob_ab.analyze(make_data(p), p)
    rec = res.reconciliation.set_index("run_id")
    # the crafted counters are not the interval sums: every run disagrees, and the report says so
    assert not rec["log_matches_counters"].any()
    assert (rec["log_drafts"] == 10 * IV_DRAFTS).all() and (rec["counter_drafts"] == RUN_DRAFTS).all()
    assert any("disagree" in n for n in res.notes)


# --------------------------------------------------------------------------------------------------
# frames saved by older specbook versions (commit 5ece790 and before)


def old_runs_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` as specbook saved it before the acceptance model: counter_accepted, per-position RATES as
    JSON (accepted_i / drafts, position 0 first), and counter_al."""
    pos = [position_column(i, COUNTER) for i in range(1, K + 1)]
    old = runs.drop(columns=[*pos, f"{COUNTER}accepted_tokens"])
    old["counter_accepted"] = runs[f"{COUNTER}accepted_tokens"]
    old["counter_al"] = 1 + runs[f"{COUNTER}accepted_tokens"] / runs[f"{COUNTER}drafts"]
    old["counter_per_position"] = [json.dumps([r[c] / r[f"{COUNTER}drafts"] for c in pos]) for _, r in runs.iterrows()]
    return old


def old_intervals_frame(iv: pd.DataFrame) -> pd.DataFrame:
    """Log intervals as specbook saved them before: vLLM's printed names and per-position RATES (0-based)."""
    old = iv.rename(columns={"al": "mean_acceptance_length", "draft_tokens": "drafted_tokens",
                             "k": "num_speculative_tokens", "acceptance_rate": "avg_draft_acceptance_rate"})
    for p in range(K):
        old[f"acceptance_pos_{p}"] = (old.pop(position_column(p + 1)) / old["drafts"]).round(3)  # printed %.3f
    return old


def test_upgrade_runs_frame_recovers_the_integer_counts_from_old_rates():
    p = params()
    new = make_data(p).runs
    old = old_runs_frame(new)
    assert old["counter_per_position"].iloc[0] != json.dumps([])
    up = upgrade_runs_frame(old)
    cols = [f"{COUNTER}drafts", f"{COUNTER}draft_tokens", f"{COUNTER}accepted_tokens",
            *[position_column(i, COUNTER) for i in range(1, K + 1)]]
    assert "counter_per_position" not in up and "counter_accepted" not in up and "counter_al" not in up
    for c in cols:
        assert up[c].tolist() == new[c].tolist(), c  # exact integers, not rates x drafts
    # a run that failed before measuring has no counts to recover
    failed = old.iloc[:1].assign(status="failed", counter_drafts=math.nan, counter_accepted=math.nan,
                                 counter_per_position=None)
    up_failed = upgrade_runs_frame(pd.concat([old, failed], ignore_index=True)).iloc[-1]
    assert math.isnan(up_failed[position_column(1, COUNTER)])
    # a frame already in the new layout passes through untouched
    pd.testing.assert_frame_equal(upgrade_runs_frame(new), new)


def save_run(tmp_path: Path, name: str, runs: pd.DataFrame, intervals: pd.DataFrame) -> RunContext:
    ctx = RunContext(tmp_path / name)
    ctx.save_frame(knob_ab.RUNS, runs)
    ctx.save_frame(knob_ab.INTERVALS, intervals)
    return ctx


def test_a_run_folder_of_the_old_layout_loads_to_the_same_figures(tmp_path):
    p = params()
    data = make_data(p)
    new = knob_ab.analyze(knob_ab.load(save_run(tmp_path, "new", data.runs, data.intervals)), p)
    old_data = knob_ab.load(save_run(tmp_path, "old", old_runs_frame(data.runs), old_intervals_frame(data.intervals)))
    assert sorted(old_data.runs.columns) == sorted(data.runs.columns)
    for col in ("drafts", "accepted_tokens", "draft_tokens", "al", "acceptance_rate", "k",
                *[position_column(i) for i in range(1, K + 1)]):
        assert old_data.intervals[col].tolist() == pytest.approx(data.intervals[col].tolist()), col
    old = knob_ab.analyze(old_data, p)
    key = ["run_id"]
    for a, b in ((new.decision.run_al, old.decision.run_al), (new.per_position, old.per_position),
                 (new.reconciliation, old.reconciliation), (new.runs, old.runs)):
        pd.testing.assert_frame_equal(a.sort_values(key).reset_index(drop=True),
                                      b.sort_values(key).reset_index(drop=True), check_dtype=False)
    pd.testing.assert_frame_equal(new.decision.comparisons, old.decision.comparisons)
    pd.testing.assert_frame_equal(new.decision.knob_verdicts, old.decision.knob_verdicts)


STUB = Path(__file__).resolve().parents[1] / "fixtures" / "stub_servers" / "engine_stub.py"


def test_a_server_that_dies_at_start_fails_the_run_and_keeps_its_record_and_log(tmp_path):
    """Fault injection with the deliberately faulty stub server (it exits before listening)."""
    import sys

    from specbook.core.errors import RunError
    from specbook.engines import list_engines, register_engine
    from specbook.serve.server import ServerSpec

    if "stub-exit" not in list_engines():
        # the vLLM adapter's log readers (start-up facts...) with a server that exits before listening
        @register_engine("stub-exit")
        class _ExitAtOnce(type(get_engine("vllm"))):
            name = "stub-exit"

            def build_spec(self, cfg, *, name, log_path, port):
                return ServerSpec(name=name, argv=[sys.executable, str(STUB), "--mode", "exit-at-once",
                                                   "--port", str(port)],
                                  env=dict(cfg.env), port=port, log_path=log_path, ready_timeout_s=30)

            def probe_versions(self, base_url=None):
                return {"engine": self.name}

            def spec_decode_delta(self, before, after, model_name=None, cfg=None):
                raise AssertionError("never reached")

    p = params(engine={**PARAMS["engine"], "engine": "stub-exit"},
               workload={"concurrency": 4, "subset": 2, "test_path": "../shared/data/gsm8k/test.jsonl",
                         "train_path": "../shared/data/gsm8k/train.jsonl"})
    ctx = RunContext(tmp_path / "run")
    with pytest.raises(RunError, match="00-sweep0-baseline .*arm 'baseline'.*saved"):
        knob_ab.collect(p, ctx)
    runs = ctx.load_frame("runs")
    assert runs["status"].tolist() == ["failed"]
    assert "could not allocate KV cache" in runs["error"].iloc[0]  # the log tail travels with the error
    servers = ctx.servers()
    assert [s.name for s in servers] == ["00-sweep0-baseline"] and servers[0].status == "failed"
    assert ctx.log_path("00-sweep0-baseline").read_text().startswith("Env:")


# --------------------------------------------------------------------------------------------------
# attention backend knobs: what the servers' logs say each run really used (H200 logs, 2026-11-30)

H200_PARAMS = Path(__file__).resolve().parents[2] / "params" / "knob_ab" / "h200-attention-backend.yaml"
CUDA_LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def _h200_runs(tmp_path):
    """Two runs of the H200 knob A/B, their logs at paths relative to a run folder as the runner writes them."""
    (tmp_path / "logs").mkdir()
    for name in ("vllm-cuda-0.26-h200-draft-model.log", "vllm-cuda-0.26-h200-draft-model-triton-attn.log"):
        (tmp_path / "logs" / name).write_bytes((CUDA_LOGS / name).read_bytes())
    return pd.DataFrame({
        "run_id": ["00-sweep0-baseline", "01-sweep0-triton_attn", "02-no-log"],
        "arm": ["baseline", "triton_attn", "triton_attn"],
        "log_path": ["logs/vllm-cuda-0.26-h200-draft-model.log", "logs/vllm-cuda-0.26-h200-draft-model-triton-attn.log",
                     None],
    })


def test_backends_per_run_come_from_each_server_log(tmp_path):
    runs = attention_backends_from_logs(_h200_runs(tmp_path), tmp_path, "vllm")
    assert runs["attention_backend_target"].tolist() == ["FLASH_ATTN", "TRITON_ATTN", None]
    assert runs["attention_backend_draft"].tolist() == ["FLASH_ATTN", "FLASH_ATTN", None]


def test_a_backend_knob_that_misses_the_draft_is_noted(tmp_path):
    p = knob_ab.load_params_file(str(H200_PARAMS))
    runs = attention_backends_from_logs(_h200_runs(tmp_path), tmp_path, "vllm")
    (note,) = backend_knob_reach(runs, p)
    assert "'triton_attn' asks for attention backend TRITON_ATTN" in note
    assert "the draft of its runs used FLASH_ATTN" in note and "speculative_config.attention_backend" in note
    # where the draft did use the requested backend, nothing is noted
    runs.loc[runs["arm"] == "triton_attn", "attention_backend_draft"] = "TRITON_ATTN"
    assert backend_knob_reach(runs, p) == []


# --- failed requests ----------------------------------------------------------------------------------------


def _with_requests(data, failed: dict[str, int]):
    """12 graded requests per run (5 correct, as the runs frame says), `failed[run_id]` of them failed."""
    rows = []
    for run_id in data.runs["run_id"]:
        bad = failed.get(run_id, 0)
        for i in range(12):
            failing = i >= 12 - bad
            rows.append({"run_id": run_id, "prompt_id": f"q{i}", "correct": (i < 5) and not failing,
                         "error": "RemoteProtocolError: peer closed connection" if failing else None})
    data.requests = pd.DataFrame(rows)
    return data


def test_failed_requests_are_counted_per_run_and_a_run_over_the_bound_is_left_out():
    p = params()
    victim = "00-sweep0-baseline"
    res = knob_ab.analyze(_with_requests(make_data(p), {victim: 2}), p)
    failures = res.request_failures.set_index("run_id")
    assert len(failures) == len(res.decision.run_al) + 1 and failures["n_requests"].eq(12).all()
    assert failures.loc[victim, "n_failed"] == 2 and not failures.loc[victim, "valid"]
    assert failures.loc[victim, "reason"] == "2 of 12 requests failed, more than measurement.max_failed_requests = 0"
    assert victim not in set(res.decision.run_al["run_id"]) and victim not in set(res.runs["run_id"])
    assert any(n.startswith("1 run(s) left out for failed requests") and victim in n for n in res.notes)

    tolerant = params(measurement={"max_failed_requests": 2})
    kept = knob_ab.analyze(_with_requests(make_data(tolerant), {victim: 2}), tolerant)
    assert kept.request_failures["valid"].all() and victim in set(kept.decision.run_al["run_id"])
    # accuracy over the answers: the two failed requests are no answers (5 of 10), not wrong ones (5 of 12)
    row = kept.decision.run_al.set_index("run_id").loc[victim]
    assert (row["correct"], row["total"]) == (5, 10)


def test_every_run_over_the_bound_is_an_error_that_says_so():
    p = params()
    data = make_data(p)
    with pytest.raises(ExperimentError, match="left out for failed requests"):
        knob_ab.analyze(_with_requests(data, dict.fromkeys(data.runs["run_id"], 1)), p)


def test_comparisons_are_paired_by_sweep_and_fall_back_to_welch_when_a_run_is_missing():
    p = params()
    d = knob_ab.analyze(make_data(p), p).decision
    methods = dict(zip(d.comparisons["arm"] + " vs " + d.comparisons["baseline"], d.comparisons["ci_method"],
                       strict=True))
    assert {m for c, m in methods.items() if c != "fp32+int4 vs fp32"} == {"paired t over 3 sweeps (df 2)"}
    # fp32+int4 - fp32 is exactly -1.2 AL in every sweep here: no paired sd, so Welch, saying why
    assert methods["fp32+int4 vs fp32"].endswith("not paired: the 3 per-sweep contrasts are all equal (paired sd 0)")
    assert d.interaction is not None and d.interaction["method"].iloc[-1] == "paired t over 3 sweeps (df 2)"
    data = make_data(p)
    failed = data.runs["run_id"] == run_name(5, 1, next(a for a in p.arms() if a.name == "fp32"))
    assert failed.sum() == 1
    data.runs.loc[failed, "status"] = "failed"
    d = knob_ab.analyze(data, p).decision
    by = d.comparisons.set_index(["arm", "baseline"])
    fp32 = by.loc[("fp32", "baseline")]
    assert not fp32["paired"] and fp32["ci_method"].endswith("not paired: sweeps unbalanced: sweep 1 lacks 'fp32'")
    assert by.loc[("int4", "baseline")]["paired"]  # its two arms still ran in every sweep
    assert "not paired: sweeps unbalanced" in d.interaction["method"].iloc[-1]


def test_a_report_without_accuracy_says_why():
    from specbook.core.paths import project_root
    from specbook.experiments.knob_ab.tables import no_accuracy_reason

    root = project_root() / "params" / "knob_ab"
    assert "Ingested logs" in no_accuracy_reason(knob_ab.load_params_file(str(root / "ingest-example.yaml")),
                                                 graded=False)
    assert no_accuracy_reason(knob_ab.load_params_file(str(root / "cpu-demo-spec-bench.yaml")),
                              graded=False).startswith("The spec_bench workload has no reference answers")
    assert "No request" in no_accuracy_reason(knob_ab.load_params_file(str(root / "cpu-demo.yaml")), graded=True)
    from specbook.experiments.knob_ab.tables import accuracy_lead

    lead = accuracy_lead(pd.DataFrame(), "The spec_bench workload has no reference answers to grade: no accuracy.",
                         knob_ab.load_params_file(str(root / "cpu-demo-spec-bench.yaml")))
    assert lead.startswith("**This section cannot judge accuracy.**")


def test_the_stop_note_says_what_the_last_look_decided():
    # the H100 CUDA-graphs run (docs/reports/knob_ab-h100-cuda-graphs-seq) stopped at sweeps_max undecided,
    # and its console said "the rule decided"
    looks = json.loads((Path(__file__).parents[2] / "docs/reports/knob_ab-h100-cuda-graphs-seq/data/"
                        "sequential_looks.json").read_text())
    assert "left the rule undecided" in stop_note(5, looks)
    assert "decided (equivalent) after 3 sweeps" in stop_note(3, [{"sweeps": 3, "decision": "equivalent"}])


def test_the_sglang_graphs_run_takes_al_from_sglangs_counters_and_leaves_the_rule_undecided(tmp_path):
    """The first SGLang knob A/B (docs/reports/knob_ab-h100-sglang-cuda-graphs: SGLang 0.5.15.post1 on an H100, CUDA
    graphs vs --disable-cuda-graph, 2 sweeps) through today's analysis, from a copy elsewhere: every run's AL is its
    counters' 1 + accepted / drafts, each server ran the arm it was declared (read from its argv), no steady-state cut
    is claimed from SGLang's log, and two sweeps leave the equivalence undecided with the sweeps still needed."""
    import shutil

    src = Path(__file__).parents[2] / "docs/reports/knob_ab-h100-sglang-cuda-graphs"
    run = Path(shutil.copytree(src, tmp_path / "run"))
    p = knob_ab.load_params_file(str(run / "params.yaml"))
    assert p.engine.engine == "sglang"
    r = knob_ab.analyze(knob_ab.load(RunContext.from_run_dir(run)), p)

    runs = r.runs.set_index("run_id")
    al = r.decision.run_al.set_index("run_id")
    assert len(al) == 4 and r.decision.value_col == "counter_al"
    for run_id, row in al.iterrows():
        counts = runs.loc[run_id]
        assert counts["counter_drafts"] > 3000
        assert row["counter_al"] == pytest.approx(1 + counts["counter_accepted_tokens"] / counts["counter_drafts"])
    assert r.attribution.flagged.empty and len(r.attribution.table) == 4
    assert "no steady-state cut" in r.steady.unavailable

    (v,) = r.decision.verdicts
    assert (v.arm, v.baseline, v.label.word) == ("cuda_graphs", "baseline", "undecided")
    assert v.label.low < 0 < v.label.high and v.label.high > 1.0 and v.label.low < -1.0
    assert v.label.projection.to_equivalence > 2
    head = r.answer(p).headlines[0]
    assert head.verdict.startswith("UNDECIDED") and "more sweep" in head.verdict
