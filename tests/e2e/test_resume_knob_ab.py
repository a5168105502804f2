"""The fast tier's shared knob A/B run (tests/e2e/shared_run.py), SIGKILLed once its first run was saved, then
`specbook run --resume`d.

What must hold: no kernel or server process survives the kill (the watchdog stops them), the manifest reads
abandoned; a resume without the values params.yaml redacted is refused naming each field and the `-p` to give;
the resume keeps the saved run (its log untouched), sets aside what the cut run left, runs the others, and the
runs, their arms, seeds and prompts are the schedule the params plan (arms interleaved, one draw per sweep);
the manifest records two parts and the report says the run was resumed.
"""

from __future__ import annotations

import pandas as pd
import pytest
import yaml
from tests.e2e.shared_run import KEPT, RUNS, digest, redacted_again

from specbook.experiments import knob_ab
from specbook.experiments.arms import interleaved_schedule
from specbook.experiments.knob_ab.collection import run_name
from specbook.store.manifest import read_manifest
from specbook.workloads import draw_workload

pytestmark = pytest.mark.e2e

# The bound a killed runner's processes have to be gone in: the watchdog SIGTERMs them and SIGKILLs after 10 s,
# so 10 s plus the teardown of a vLLM server on a loaded 2-core machine (up to ~20 s seen under load 30-48).
GONE_BOUND_S = 30


def test_sigkill_leaves_no_server_and_an_abandoned_run(shared_knob_ab):
    k = shared_knob_ab
    print(f"\nSIGKILL -> all {len(k.killed_processes)} kernel/server processes gone: {k.gone_s:.1f} s")
    assert k.killed_processes, "the runner had no kernel or server to kill"
    assert not k.survivors, [p.pid for p in k.survivors]
    assert k.gone_s < GONE_BOUND_S, f"processes outlived the runner by {k.gone_s:.1f} s"
    assert k.abandoned.status == "abandoned" and k.listed_status == "abandoned"
    assert "died without finishing" in k.abandoned.error


def test_a_resume_without_the_redacted_values_names_each_field_and_starts_nothing(shared_knob_ab):
    refused = shared_knob_ab.refused
    assert refused.returncode != 0
    for override in redacted_again(shared_knob_ab.params_file):
        field = override.split("=", 1)[0]
        assert f"-p {field}=VALUE" in refused.stderr, (field, refused.stderr[-2000:])
    for secret in shared_knob_ab.secrets.values():
        assert secret not in refused.stdout + refused.stderr


def _planned(run_dir) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The runs and the prompts each gets, as the params alone plan them."""
    params = knob_ab.load_params_file(str(run_dir / "params.yaml"))
    w = params.workload
    runs, prompts = [], []
    for order, (sweep, arm) in enumerate(interleaved_schedule(params.arms(), params.sweep_bounds()[1])):
        run_id = run_name(order, sweep, arm)
        runs.append({"run_id": run_id, "order": order, "sweep": sweep, "declared_arm": arm.name,
                     "subset_seed": w.subset_seed(sweep)})
        prompts += [{"run_id": run_id, "prompt_id": r.prompt_id}
                    for r in draw_workload(w, w.subset_seed(sweep)).requests]
    return pd.DataFrame(runs), pd.DataFrame(prompts)


def test_resume_keeps_the_saved_run_and_runs_the_planned_schedule(shared_knob_ab):
    k = shared_knob_ab
    run_dir = k.run_dir
    runs = pd.read_parquet(run_dir / "data" / "runs.parquet")
    assert len(runs) == RUNS and (runs["status"] == "ok").all()
    planned_runs, planned_prompts = _planned(run_dir)
    keys = list(planned_runs.columns)
    pd.testing.assert_frame_equal(runs[keys].reset_index(drop=True), planned_runs, check_dtype=False)
    assert runs["subset_seed"].dtype == "int64" and runs["n_requests"].dtype == "int64"
    requests = pd.read_parquet(run_dir / "data" / "requests.parquet")
    sent = requests[["run_id", "prompt_id"]].sort_values(["run_id", "prompt_id"], ignore_index=True)
    pd.testing.assert_frame_equal(sent, planned_prompts.sort_values(["run_id", "prompt_id"], ignore_index=True))
    # the run saved before the kill is kept as it was: the same row, its log never rewritten
    first = runs.iloc[:k.finished_at_kill]
    pd.testing.assert_frame_equal(first.reset_index(drop=True), k.kept.reset_index(drop=True), check_dtype=False)
    assert k.finished_at_kill == KEPT
    for rel, before in k.kept_logs.items():
        assert digest(run_dir / rel) == before, rel
    # the run the kill cut short left a log: set aside, not mixed into the data
    assert list((run_dir / "unfinished" / "1" / "logs").glob("*.log"))
    print(f"\nfirst part until SIGKILL: {k.first_s:.0f} s ({k.finished_at_kill} run saved); resume: {k.resume_s:.0f} s "
          f"({RUNS - k.finished_at_kill} runs)")


def test_resumed_run_records_two_parts_and_says_so(shared_knob_ab):
    run_dir = shared_knob_ab.run_dir
    m = read_manifest(run_dir)
    assert m.status == "ok" and [p.status for p in m.parts] == ["abandoned", "ok"]
    assert m.parts[1].resumed_from == "abandoned" and m.parts[1].kept_units == KEPT
    assert len(m.servers) == RUNS and all(s.status == "ok" for s in m.servers)
    assert "This run was resumed 1 time" in (run_dir / "report.html").read_text()
    # the resume was given the redacted values again (-p), recorded redacted like the first part's
    stored = yaml.safe_load((run_dir / "params.yaml").read_text())
    assert stored["engine"]["env"]["E2E_DB_PASSWORD"] == "***"
