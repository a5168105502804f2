"""The knob A/B analysis on crafted run/interval frames whose answers are known by construction.

Launch argv come from the real vLLM adapter (build_spec), exactly as collect() records them.
"""

import json
from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest

from specbook.engines import get_engine
from specbook.errors import ParamsError
from specbook.experiments import knob_ab
from specbook.params import validate_params

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


def params(**overrides):
    return validate_params(knob_ab.KnobABParams, {**PARAMS, **overrides}, "test-params.yaml")


def intervals_for(run_id, steady_al, t0):
    rows = []
    running = [1, 2, 4, 4, 4, 4, 4, 4, 2, 1]
    for i, r in enumerate(running):
        al = steady_al if r == 4 else WARMUP_AL
        rows.append({"run_id": run_id, "line_no": 10 + i, "timestamp": t0 + timedelta(seconds=i), "t_s": float(i),
                     "mean_acceptance_length": al, "accepted_tokens": round((al - 1) * 200), "drafted_tokens": 800,
                     "drafts": 200, "num_speculative_tokens": 4, "running": r, "waiting": 0,
                     **{f"acceptance_pos_{p}": (al - 1) / 4 for p in range(4)}})
    return rows


def make_data(p, *, mislabel=None):
    engine = get_engine("vllm")
    arms = {a.name: a for a in p.arms()}
    runs, intervals = [], []
    t0 = datetime(2026, 11, 29, 12, 0, 0)
    order = 0
    for sweep in range(p.sweeps):
        for name, arm in arms.items():
            run_id = knob_ab.run_name(order, sweep, arm)
            real = mislabel[1] if mislabel and mislabel[0] == run_id else name
            cfg = knob_ab._arm_config(arms[real], p)
            spec = engine.build_spec(cfg, name=run_id, log_path=Path("x.log"), port=40000 + order)
            al = STEADY_AL[real][sweep]
            runs.append({"run_id": run_id, "order": order, "sweep": sweep, "declared_arm": name, "status": "ok",
                         "argv": json.dumps(spec.argv), "launched_env": json.dumps(spec.env),
                         "counter_al": al, "tok_s": 50.0, "wall_s": 10.0, "completion_tokens": 500,
                         "correct": 5, "total": 12,
                         "counter_per_position": json.dumps([(al - 1) / 4] * 4)})
            intervals += intervals_for(run_id, al, t0 + timedelta(minutes=order))
            order += 1
    return knob_ab.KnobABData(pd.DataFrame(runs), pd.DataFrame(intervals), pd.DataFrame())


def test_verdicts_equivalent_for_the_neutral_knob_and_different_for_the_control():
    p = params()
    res = knob_ab.analyze(make_data(p), p)
    conclusions = {(r["comparison"]): r["conclusion"] for _, r in res.knob_verdicts.iterrows()}
    assert conclusions["fp32 vs baseline"] == "equivalent"
    assert conclusions["int4 vs baseline"] == "different"
    # each knob judged again with the other knob on
    assert conclusions["fp32+int4 vs int4"] == "equivalent"
    assert conclusions["fp32+int4 vs fp32"] == "different"
    assert res.knob_verdicts["as expected"].all()
    assert "PASS" in set(res.verdict_table["result"])


def test_steady_state_drops_load_intervals_and_keeps_the_constructed_al():
    p = params()
    res = knob_ab.analyze(make_data(p), p)
    base = res.run_al[res.run_al["arm"] == "baseline"].sort_values("sweep")
    assert base["steady_log_al"].tolist() == pytest.approx(STEADY_AL["baseline"], abs=1e-3)
    assert (base["intervals_kept"] == 6).all() and (base["intervals_total"] == 10).all()
    # all intervals (warm-up and drain included) pull AL toward the warm-up value
    assert (base["all_intervals_log_al"] < base["steady_log_al"]).all()
    assert set(res.drop_reasons.columns) >= {"warm-up", "drain"}


def test_crude_cut_is_shown_lower_than_the_load_cut():
    p = params()
    res = knob_ab.analyze(make_data(p), p)
    row = res.crude_vs_load.set_index("arm").loc["baseline"]
    crude_col = next(c for c in res.crude_vs_load.columns if c.startswith("crude cut"))
    assert row[crude_col] < row["load cut (steady)"]


def test_interaction_is_near_zero_when_effects_add_up():
    p = params()
    res = knob_ab.analyze(make_data(p), p)
    inter = res.interaction.set_index("quantity")["value"]
    # (A+B - B) - (A - base) by construction: (3.11 - 3.11) - (4.31 - 4.31) = 0
    assert inter["interaction (A+B - B) - (A - base)"] == pytest.approx(0.0, abs=1e-9)
    assert inter["effect of B"] == pytest.approx(3.11 - 4.31, abs=1e-9)
    assert inter["interaction 95% CI low"] <= 0 <= inter["interaction 95% CI high"]


def test_a_run_whose_real_args_differ_from_its_declared_arm_is_flagged_and_moved():
    p = params()
    data = make_data(p, mislabel=("01-sweep0-fp32", "baseline"))
    res = knob_ab.analyze(data, p)
    flagged = res.flagged_runs.set_index("run_id")
    assert list(flagged.index) == ["01-sweep0-fp32"]
    assert flagged.loc["01-sweep0-fp32", "arm"] == "baseline"
    assert "--dtype" in flagged.loc["01-sweep0-fp32", "reason"]
    assert (res.run_al["arm"] == "baseline").sum() == 4


def test_per_position_from_counters():
    p = params()
    res = knob_ab.analyze(make_data(p), p)
    pp = res.per_position.groupby(["arm", "position"])["acceptance"].mean()
    assert pp[("baseline", 1)] == pytest.approx((4.31 - 1) / 4, abs=1e-3)
    assert sorted(res.per_position["position"].unique()) == [1, 2, 3, 4]


def test_ingest_mode_requires_logs():
    with pytest.raises(ParamsError, match="ingest"):
        params(mode="ingest")


def test_resampling_draws_one_subset_per_sweep_shared_by_its_arms():
    fixed = params()
    assert {fixed.workload.subset_seed(s) for s in range(3)} == {fixed.workload.seed}
    fresh = params(workload={"concurrency": 4, "seed": 7, "resample_per_sweep": True})
    assert [fresh.workload.subset_seed(s) for s in range(3)] == [7, 8, 9]


def test_a_knob_env_var_inherited_from_the_launching_shell_is_refused():
    from specbook.errors import ExperimentError

    p = params(knobs=[{"name": "qr", "env": {"QR": "INT4"}}, {"name": "int4", "set": {"dtype": "float32"}}])
    knob_ab.check_inherited_knob_env(p, {"PATH": "/bin"})  # clean shell: fine
    with pytest.raises(ExperimentError, match="QR='INT6'"):
        knob_ab.check_inherited_knob_env(p, {"QR": "INT6"})
    # a key every arm sets explicitly is visible on every Env: line, so inheriting it is harmless
    p2 = params(engine={**PARAMS["engine"], "env": {"QR": "none"}},
                knobs=[{"name": "qr", "env": {"QR": "INT4"}}])
    knob_ab.check_inherited_knob_env(p2, {"QR": "INT6"})


def test_log_totals_are_reconciled_with_the_counters():
    runs = pd.DataFrame({"run_id": ["a", "b"], "counter_drafts": [30, 30], "counter_accepted": [90, 90]})
    iv = pd.DataFrame({"run_id": ["a", "a", "b"], "drafts": [10, 20, 10], "accepted_tokens": [30, 60, 30]})
    rec = knob_ab.reconcile_log_with_counters(runs, iv).set_index("run_id")
    assert rec.loc["a", "log_matches_counters"] and not rec.loc["b", "log_matches_counters"]
    assert rec.loc["b", "log_drafts"] == 10


STUB = Path(__file__).resolve().parents[1] / "fixtures" / "stub_servers" / "engine_stub.py"


def test_a_server_that_dies_at_start_fails_the_run_and_keeps_its_record_and_log(tmp_path):
    """Fault injection with the deliberately faulty stub server (it exits before listening)."""
    import sys

    from specbook.engines import list_engines, register_engine
    from specbook.errors import RunError
    from specbook.runstore import RunContext
    from specbook.server import ServerSpec

    if "stub-exit" not in list_engines():
        @register_engine("stub-exit")
        class _ExitAtOnce:
            name = "stub-exit"

            def build_spec(self, cfg, *, name, log_path, port):
                return ServerSpec(name=name, argv=[sys.executable, str(STUB), "--mode", "exit-at-once",
                                                   "--port", str(port)],
                                  env=dict(cfg.env), port=port, log_path=log_path, ready_timeout_s=30)

            def probe_versions(self, base_url=None):
                return {"engine": self.name}

            def spec_decode_delta(self, before, after, model_name=None):
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
    assert [s.name for s in ctx.servers()] == ["00-sweep0-baseline"]
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
    runs = knob_ab.attention_backends_from_logs(_h200_runs(tmp_path), tmp_path)
    assert runs["attention_backend_target"].tolist() == ["FLASH_ATTN", "TRITON_ATTN", None]
    assert runs["attention_backend_draft"].tolist() == ["FLASH_ATTN", "FLASH_ATTN", None]


def test_a_backend_knob_that_misses_the_draft_is_noted(tmp_path):
    p = knob_ab.load_params_file(str(H200_PARAMS))
    runs = knob_ab.attention_backends_from_logs(_h200_runs(tmp_path), tmp_path)
    (note,) = knob_ab.backend_knob_reach(runs, p)
    assert "'triton_attn' asks for attention backend TRITON_ATTN" in note
    assert "the draft of its runs used FLASH_ATTN" in note and "speculative_config.attention_backend" in note
    # where the draft did use the requested backend, nothing is noted
    runs.loc[runs["arm"] == "triton_attn", "attention_backend_draft"] = "TRITON_ATTN"
    assert knob_ab.backend_knob_reach(runs, p) == []
