"""Executors without engines: the local loop and its looks, slot assignment, the staging merge, placement tables,
params and the CLI's override. (The Ray executor with real Ray and real llama-servers: tests/integration and e2e.)"""

from __future__ import annotations

import json
from functools import partial

import pandas as pd
import pytest

from specbook import executors
from specbook.core.errors import ParamsError
from specbook.core.params import load_params
from specbook.executors import ExecutorParams, Unit, placement, staging
from specbook.experiments.arms import interleaved_schedule
from specbook.experiments.knob_ab.params import KnobABParams
from specbook.store.runstore import RunContext


def _append_row(ctx: RunContext, *, key: str, sweep: int) -> None:
    ctx.append_frame("rows", pd.DataFrame([{"run_id": key, "sweep": sweep, **executors.placement_columns()}]))


def _units(arms: list[str], sweeps: int) -> list[Unit]:
    out = []
    for sweep in range(sweeps):
        for arm in (arms if sweep % 2 == 0 else arms[::-1]):  # interleaved: each sweep reverses the order
            key = f"s{sweep}-{arm}"
            out.append(Unit(key=key, label=key, arm=arm, sweep=sweep, call=partial(_append_row, key=key, sweep=sweep)))
    return out


def test_local_executor_looks_after_each_complete_sweep_from_looks_from_and_stops_when_told(tmp_path):
    ctx = RunContext(tmp_path / "run")
    looks = []

    def look(sweep: int) -> bool:
        looks.append((sweep, len(ctx.load_frame("rows"))))
        return sweep == 2

    done = executors.run_units(_units(["baseline", "a", "b"], 4), ctx, ExecutorParams(), done_frame="rows",
                               look_after=look, looks_from=2)
    # no look after sweep 0 (looks_from=2: first look once 2 sweeps are in); each look sees its sweep complete
    assert looks == [(1, 6), (2, 9)]
    assert done.stopped_after_sweep == 2 and len(done.ran) == 9
    rows = ctx.load_frame("rows")
    assert list(rows["sweep"]) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert set(rows["executor"]) == {"local"} and set(rows["slot"]) == {0}


def test_the_interleaved_schedule_of_the_demo_ends_its_sweeps_where_the_local_executor_looks(tmp_path):
    params = load_params(KnobABParams, "params/knob_ab/cpu-demo.yaml")
    schedule = interleaved_schedule(params.arms(), 3)
    units = [Unit(key=str(i), label=str(i), arm=a.name, sweep=s, call=partial(_append_row, key=str(i), sweep=s))
             for i, (s, a) in enumerate(schedule)]
    seen = []
    executors.run_units(units, RunContext(tmp_path / "run"), ExecutorParams(), done_frame="rows",
                        look_after=lambda s: seen.append(s) or False, looks_from=1)
    assert seen == [0, 1, 2]


def test_spread_puts_each_arms_sweeps_on_every_slot_and_a_sweeps_arms_on_different_slots():
    arms = ["baseline", "a", "b", "a+b"]
    units = [(arm, sweep) for sweep in range(4) for arm in arms]
    slots = placement.assign_slots([u[0] for u in units], [u[1] for u in units], arms, 2)
    by_arm: dict[str, set[int]] = {}
    for (arm, _), slot in zip(units, slots, strict=True):
        by_arm.setdefault(arm, set()).add(slot)
    assert all(s == {0, 1} for s in by_arm.values())  # no arm confined to one GPU
    four = placement.assign_slots([u[0] for u in units], [u[1] for u in units], arms, 4)
    for sweep in range(4):  # with a slot per arm, one sweep's arms run on four different GPUs at once
        assert len({four[i] for i, u in enumerate(units) if u[1] == sweep}) == 4


def test_a_pinned_assignment_turns_over_its_slots_and_names_a_slot_that_does_not_exist():
    slots = placement.assign_slots(["a", "a", "a", "b"], [0, 1, 2, 0], ["a", "b"], 3, {"a": [2, 0]})
    assert slots == [2, 0, 2, 1]
    with pytest.raises(ParamsError, match=r"executor.assignment.a: slot\(s\) \[5\] do not exist; the cluster "
                                          r"gives 3 slot\(s\)"):
        placement.assign_slots(["a"], [0], ["a"], 3, {"a": [5]})
    with pytest.raises(ValueError, match="assignment.a: list one or more slot numbers"):
        ExecutorParams(assignment={"a": []})


def test_merge_appends_frames_with_the_done_frame_last_and_writes_logs_and_server_records(tmp_path, monkeypatch):
    run = RunContext(tmp_path / "run")
    run.append_frame("runs", pd.DataFrame([{"run_id": "earlier", "status": "ok"}]))
    unit = RunContext(tmp_path / "staging")
    unit.append_frame("requests", pd.DataFrame([{"run_id": "u1", "prompt_id": "p"}]))
    unit.append_frame("runs", pd.DataFrame([{"run_id": "u1", "status": "ok"}]))
    unit.log_path("u1").write_text("Env: X=1\nserver log\n")
    unit.record_server("u1", ["llama-server"], {}, {}, None, status="ok")
    order = []
    real_append = RunContext.append_frame
    monkeypatch.setattr(RunContext, "append_frame",
                        lambda self, name, rows: order.append(name) or real_append(self, name, rows))
    written = staging.merge(staging.pack(tmp_path / "staging"), run, done_frame="runs")
    assert order == ["requests", "runs"]  # a unit counts as done only once its other rows are in
    assert list(run.load_frame("runs")["run_id"]) == ["earlier", "u1"]
    assert run.log_path("u1").read_text() == "Env: X=1\nserver log\n"
    assert [r.name for r in run.servers()] == ["u1"]
    assert set(written) == {"data/requests.parquet", "data/runs.parquet", "logs/u1.log", "servers.jsonl"}


def test_an_interrupted_units_staged_records_and_log_are_recovered_once_and_its_frames_left_out(tmp_path,
                                                                                               monkeypatch):
    monkeypatch.setattr(staging.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    token = "tok"
    for key in ("u1", "u2"):  # two cancelled units the kernel never merged; u1's record it had merged already
        unit = RunContext(staging.staging_dir(token, key))
        unit.append_frame("requests", pd.DataFrame([{"run_id": key, "prompt_id": "p"}]))
        unit.log_path(key).write_text(f"{key} log\n")
        unit.record_server(key, ["llama-server"], {}, {}, None, status="interrupted")
    staging.mark_ended(staging.staging_dir(token, "u1"))
    assert staging.wait_units_ended(token, timeout_s=0) == ["u2"]  # u2 has not recorded its server yet
    staging.mark_ended(staging.staging_dir(token, "u2"))
    assert staging.wait_units_ended(token, timeout_s=0) == []
    assert staging.ENDED_MARK not in staging.pack(staging.staging_dir(token, "u1"))
    run = RunContext(tmp_path / "run")
    u1_line = (staging.staging_dir(token, "u1") / "servers.jsonl").read_text().splitlines()[0]
    (run.run_dir / "servers.jsonl").write_text(u1_line + "\n")
    assert staging.recover_interrupted(token, run) == ["u1", "u2"]
    assert [(r.name, r.status) for r in run.servers()] == [("u1", "interrupted"), ("u2", "interrupted")]
    assert run.log_path("u2").read_text() == "u2 log\n"
    assert not run.has_frame("requests")  # not done: --resume runs the unit again
    assert not (tmp_path / "tmp" / staging.STAGING_ROOT / token).exists()
    assert staging.recover_interrupted(token, run) == []


def test_merge_refuses_a_file_outside_the_run_folder(tmp_path):
    with pytest.raises(ValueError, match="must lie inside the run folder"):
        staging.merge({"../escape.txt": b"x"}, RunContext(tmp_path / "run"), done_frame="runs")
    assert not (tmp_path / "escape.txt").exists()


def test_placement_table_and_an_arm_confined_to_one_gpu():
    runs = pd.DataFrame({"arm": ["baseline", "baseline", "knob", "knob"], "gpu": ["h/GPU-a", "h/GPU-b", "h/GPU-a",
                                                                                 "h/GPU-a"],
                         "slot": [0, 1, 0, 0], "al": [4.0, 4.2, 3.0, 3.2]})
    table = placement.placement_table(runs, "al")
    assert table.to_dict("records") == [
        {"arm": "baseline", "place": "h/GPU-a", "runs": 1, "slots": "0", "al": 4.0},
        {"arm": "baseline", "place": "h/GPU-b", "runs": 1, "slots": "1", "al": 4.2},
        {"arm": "knob", "place": "h/GPU-a", "runs": 2, "slots": "0", "al": pytest.approx(3.1)}]
    assert placement.confined_arms(runs) == ["knob"]
    assert placement.confined_arms(runs[runs["gpu"] == "h/GPU-a"]) == []  # one place in all: nothing to confound


def test_the_cli_choice_wins_over_the_params_and_a_bad_one_is_named(monkeypatch):
    monkeypatch.setenv(executors.KIND_ENV, "ray")
    monkeypatch.setenv(executors.ADDRESS_ENV, "ray://head:10001")
    eff = executors.effective(ExecutorParams(kind="local", cpus_per_unit=2))
    assert (eff.kind, eff.address, eff.cpus_per_unit) == ("ray", "ray://head:10001", 2)
    monkeypatch.setenv(executors.KIND_ENV, "slurm")
    with pytest.raises(ParamsError, match=r"\$SPECBOOK_EXECUTOR='slurm': use local or ray"):
        executors.effective(ExecutorParams())


def test_executor_params_are_validated_with_the_field_named(tmp_path):
    path = tmp_path / "p.yaml"
    data = json.loads(json.dumps(load_params(KnobABParams, "params/knob_ab/cpu-demo.yaml").model_dump(
        exclude_none=True)))
    data["executor"] = {"kind": "slurm"}
    path.write_text(json.dumps(data))
    with pytest.raises(ParamsError, match="executor.kind"):
        load_params(KnobABParams, str(path))


def test_tensor_parallel_size_from_extra_args():
    assert executors.tensor_parallel_size([]) == 1
    assert executors.tensor_parallel_size(["--tensor-parallel-size", "2"]) == 2
    assert executors.tensor_parallel_size(["-tp=4"]) == 4


def test_visible_gpus_from_the_h200s_nvidia_smi_by_index_or_uuid():
    # verbatim: `nvidia-smi --query-gpu=index,uuid,name --format=csv,noheader` on the lent H200 (2026-11-30)
    from pathlib import Path

    text = (Path(__file__).parents[1] / "fixtures" / "gpu" / "nvidia-smi-index-uuid-name-h200.csv").read_text()
    (gpu,) = placement.visible_gpus(text, None)
    assert gpu == {"index": "0", "uuid": "GPU-bd5a9fd4-969a-6315-ec35-d075a2a4254d", "name": "NVIDIA H200"}
    assert placement.visible_gpus(text, "0") == [gpu]
    assert placement.visible_gpus(text, "GPU-bd5a9fd4-969a-6315-ec35-d075a2a4254d") == [gpu]
    assert placement.visible_gpus(text, "1") == []  # Ray gave this task another GPU
    assert placement.visible_gpus(None, "0") == []  # no nvidia-smi: a CPU host


def _log_call(ctx: RunContext, *, key: str, events: list, fail: bool = False) -> None:
    events.append(("call", key))
    if fail:
        raise RuntimeError(f"unit {key} failed")


def _log_ahead(ctx: RunContext, *, key: str, events: list) -> None:
    events.append(("ahead", key))


def _paired_units(events: list, arms: list[str], sweeps: int, fail: str | None = None) -> list[Unit]:
    return [Unit(key=u.key, label=u.label, arm=u.arm, sweep=u.sweep,
                 call=partial(_log_call, key=u.key, events=events, fail=u.key == fail),
                 start_ahead=partial(_log_ahead, key=u.key, events=events)) for u in _units(arms, sweeps)]


def test_starts_together_launches_the_second_of_each_pair_in_a_sweep_beside_the_first(tmp_path):
    events: list = []
    executors.run_units(_paired_units(events, ["baseline", "a", "b"], 2), RunContext(tmp_path / "run"),
                        ExecutorParams(starts_together=2), done_frame="rows")
    # pairs never cross a sweep's end (a look may cancel the next sweep): the third unit of each sweep starts alone
    assert events == [("ahead", "s0-a"), ("call", "s0-baseline"), ("call", "s0-a"), ("call", "s0-b"),
                      ("ahead", "s1-a"), ("call", "s1-b"), ("call", "s1-a"), ("call", "s1-baseline")]


def test_one_start_at_a_time_unless_asked(tmp_path):
    events: list = []
    executors.run_units(_paired_units(events, ["baseline", "a"], 1), RunContext(tmp_path / "run"),
                        ExecutorParams(), done_frame="rows")
    assert events == [("call", "s0-baseline"), ("call", "s0-a")]


def test_a_failing_unit_stops_the_server_started_ahead_for_the_next(tmp_path, monkeypatch):
    from specbook.measure import harness

    events: list = []
    monkeypatch.setattr(harness, "discard_ahead", lambda: events.append(("discard",)) or ["s0-a"])
    with pytest.raises(RuntimeError, match="unit s0-baseline failed"):
        executors.run_units(_paired_units(events, ["baseline", "a"], 1, fail="s0-baseline"),
                            RunContext(tmp_path / "run"), ExecutorParams(starts_together=2), done_frame="rows")
    assert events == [("ahead", "s0-a"), ("call", "s0-baseline"), ("discard",)]


def test_the_ray_schedule_holds_later_sweeps_for_each_look_and_stops_submitting_when_told():
    from specbook.executors import Unit
    from specbook.executors.ray_cluster import _Schedule

    units = [Unit(f"s{s}-{a}", f"s{s}-{a}", a, s, print) for s in range(3) for a in ("base", "knob")]
    schedule = _Schedule(units, [0, 1] * 3, 2, look_after=lambda sweep: False, looks_from=2)
    first = schedule.next_units()
    assert [(slot, u.key) for slot, u in first] == [(0, "s0-base"), (1, "s0-knob")]
    for slot, u in first:
        schedule.in_flight[u.key] = (slot, u)
    assert schedule.next_units() == []  # both slots busy
    assert schedule.finished(schedule.in_flight.pop("s0-base")[1]) is None  # no look before sweep 2 of 2..
    started = schedule.next_units()  # slot 0 free: sweep 1's unit may start (the gate is sweep 1's look)
    assert [(slot, u.key) for slot, u in started] == [(0, "s1-base")]
    schedule.in_flight["s1-base"] = started[0]
    assert schedule.finished(schedule.in_flight.pop("s0-knob")[1]) is None
    started = schedule.next_units()
    assert [(slot, u.key) for slot, u in started] == [(1, "s1-knob")]
    schedule.in_flight["s1-knob"] = started[0]
    assert schedule.finished(schedule.in_flight.pop("s1-base")[1]) is None
    assert schedule.next_units() == []  # sweep 2 waits for the look after sweep 1 (sweep index 1 = 2 sweeps)
    assert schedule.finished(schedule.in_flight.pop("s1-knob")[1]) == 1  # sweep 1 complete: look now
    schedule.stop = True
    assert schedule.next_units() == []  # the look said stop: sweep 2 never starts


def test_the_ray_schedule_without_looks_fills_every_free_slot():
    from specbook.executors import Unit
    from specbook.executors.ray_cluster import _Schedule

    units = [Unit(f"u{i}", f"u{i}", "a", i, print) for i in range(4)]
    schedule = _Schedule(units, [0, 1, 0, 1], 2, look_after=None, looks_from=None)
    assert [u.key for _, u in schedule.next_units()] == ["u0", "u1"]
    assert schedule.gate() is None and schedule.finished(units[0]) is None
    assert [u.key for _, u in schedule.next_units()] == ["u2", "u3"]  # nothing was marked in flight
