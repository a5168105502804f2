"""Which servers a cross-engine side x lane starts and which phases each serves (experiments/cross_engine/phases)."""

from __future__ import annotations

from specbook.experiments.cross_engine.phases import PHASES, ServerPlan, plan_servers, side_order
from specbook.measure.instruments import switchable

ALL = list(PHASES)


def test_an_engine_that_switches_its_instruments_at_run_time_shares_its_server_and_one_that_cannot_does_not():
    assert switchable("vllm") == {"trace", "profile"}  # plugin switch file, step timer switch file
    assert switchable("llamacpp") == set()  # -v and -lv 4 from the start


def test_the_side_that_shares_one_server_goes_last_so_it_can_re_run_equal_work_at_once():
    assert side_order({"oracle": "vllm", "ours": "llamacpp"}) == ["ours", "oracle"]
    assert side_order({"oracle": "llamacpp", "ours": "vllm"}) == ["oracle", "ours"]
    assert side_order({"oracle": "vllm", "ours": "vllm"}) == ["oracle", "ours"]  # the params' order kept


def test_a_fresh_side_lane_on_a_switching_engine_serves_every_phase_on_one_server_timed_first():
    plans = plan_servers("vllm-draft", ALL, set(), "vllm", equal_now=True, used_names=set())
    assert plans == [ServerPlan("vllm-draft", ("timed", "equal_work", "trace", "profile"))]


def test_an_engine_that_traces_from_its_start_keeps_a_server_per_instrumented_phase_after_the_timed_one():
    plans = plan_servers("llamacpp-draft", ["timed", "trace", "profile"], set(), "llamacpp", equal_now=False,
                         used_names=set())
    assert plans == [ServerPlan("llamacpp-draft", ("timed",)), ServerPlan("llamacpp-draft-trace", ("trace",)),
                     ServerPlan("llamacpp-draft-prof", ("profile",))]
    # the side served first re-runs equal work later, on a server of its own
    assert plan_servers("llamacpp-draft", ["equal_work"], {"timed", "trace", "profile"}, "llamacpp",
                        equal_now=False, used_names={"llamacpp-draft"}) == [ServerPlan("llamacpp-draft-equal",
                                                                                        ("equal_work",))]
    # without equal_now the re-runs are never on the shared server (the other side's outputs are not there yet)
    assert plan_servers("vllm-draft", ALL, set(), "vllm", equal_now=False, used_names=set())[0] == ServerPlan(
        "vllm-draft", ("timed", "trace", "profile"))


def test_a_resumed_side_lane_restarts_only_its_unfinished_phases_on_a_fresh_server_name():
    plans = plan_servers("vllm-draft", ALL, {"timed", "equal_work"}, "vllm", equal_now=True,
                         used_names={"vllm-draft"})
    assert plans == [ServerPlan("vllm-draft-2", ("trace", "profile"))]
    plans = plan_servers("vllm-draft", ALL, {"timed", "equal_work", "trace"}, "vllm", equal_now=True,
                         used_names={"vllm-draft", "vllm-draft-2"})
    assert plans == [ServerPlan("vllm-draft-3", ("profile",))]
    # cut in its timed phase: nothing of it is done, its name is free again
    assert plan_servers("vllm-draft", ALL, set(), "vllm", equal_now=True, used_names=set())[0].name == "vllm-draft"
    assert plan_servers("vllm-draft", ALL, set(ALL), "vllm", equal_now=True, used_names={"vllm-draft"}) == []


def test_phases_keep_the_timed_windows_before_any_instrument():
    assert PHASES.index("timed") < PHASES.index("equal_work") < PHASES.index("trace") < PHASES.index("profile")
