"""serve/clientcpu: the measuring client's own CPU per window, the saturation flag, its records and the report's
"Client." line; experiments/concurrency_curve/bound: ENGINE-BOUND / CLIENT-BOUND from the windows' client columns."""

from __future__ import annotations

import json
import math
import threading
import time

import pandas as pd
import pytest

from specbook.experiments.concurrency_curve import bound
from specbook.report.view import Headline, Summary, summary_html
from specbook.serve import clientcpu
from specbook.serve.clientcpu import SATURATED_SHARE, ClientCpu, LoopMeter


def cpu(loop: float, wall: float = 10.0, runq: float | None = 0.0, process: float | None = None, requests: int = 4,
        processes: int = 1) -> ClientCpu:
    return ClientCpu(wall_s=wall, loop_cpu_s=loop, process_cpu_s=loop if process is None else process,
                     runq_wait_s=runq, requests=requests, processes=processes)


def test_shares_are_of_the_window_and_the_wait_for_a_core_counts_as_busy():
    c = cpu(loop=3.0, runq=2.0)
    assert c.loop_share == pytest.approx(0.3) and c.runq_share == pytest.approx(0.2)
    assert c.busy_share == pytest.approx(0.5) and not c.saturated
    # a client niced away from the cores: little CPU, but runnable nearly all the window
    assert cpu(loop=1.0, runq=7.5).saturated
    assert cpu(loop=8.0, runq=None).saturated and cpu(loop=8.0, runq=None).runq_share is None
    assert not cpu(loop=SATURATED_SHARE * 10 - 0.01, runq=None).saturated
    assert cpu(loop=SATURATED_SHARE * 10, runq=None).saturated
    assert math.isnan(cpu(loop=1.0, wall=0.0).loop_share)


def test_per_request_cpu_is_the_process_cpu_over_the_requests():
    assert cpu(loop=1.0, process=2.0, requests=8).cpu_ms_per_request == pytest.approx(250.0)
    assert cpu(loop=1.0, requests=0).cpu_ms_per_request is None


def test_several_processes_sum_cpu_and_share_over_their_cores():
    parts = [cpu(loop=7.0, wall=10.0, runq=1.0, requests=3), cpu(loop=9.0, wall=9.0, runq=0.5, requests=5)]
    both = clientcpu.combine(parts)
    assert both.wall_s == 10.0 and both.loop_cpu_s == 16.0 and both.requests == 8 and both.processes == 2
    assert both.loop_share == pytest.approx(0.8) and both.runq_share == pytest.approx(0.075)
    assert clientcpu.combine([cpu(1.0, runq=None), cpu(1.0)]).runq_wait_s is None


def test_record_and_columns_carry_the_flag_and_the_shares():
    c = cpu(loop=6.0, runq=3.0)
    rec = c.record("s0")
    assert rec["server"] == "s0" and rec["saturated"] is True and rec["busy_share"] == pytest.approx(0.9)
    assert json.loads(json.dumps(rec)) == rec
    cols = c.columns()
    assert cols["client_saturated"] is True and cols["client_loop_share"] == pytest.approx(0.6)
    assert cols["client_busy_share"] == pytest.approx(0.9) and cols["client_cpu_ms_per_req"] == pytest.approx(1500.0)


def test_the_console_note_names_a_saturated_window_only():
    assert cpu(loop=1.0).note("s0") is None
    line = cpu(loop=6.0, runq=3.0).note("s0")
    assert line.startswith("s0: ") and "busy 90%" in line and "ran 60%" in line and "waited for a core 30%" in line


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_the_meter_counts_the_loop_threads_cpu_apart_from_other_threads():
    meter = LoopMeter()
    _burn(0.2)  # on this (the "loop") thread
    burned: list[float] = []

    def other() -> None:
        t0 = time.thread_time()
        _burn(0.3)
        burned.append(time.thread_time() - t0)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    c = meter.stop(requests=2)
    assert c.loop_cpu_s >= 0.2 and c.loop_cpu_s < 0.2 + burned[0]
    assert c.process_cpu_s >= c.loop_cpu_s + burned[0] * 0.99
    assert c.wall_s >= c.loop_cpu_s and c.requests == 2
    assert c.runq_wait_s is None or c.runq_wait_s >= 0


def write_records(run, records) -> None:
    (run / "data").mkdir(parents=True, exist_ok=True)
    (run / "data" / clientcpu.CLIENT_CPU_NAME).write_text("".join(json.dumps(r) + "\n" for r in records))


def test_the_report_line_counts_saturated_windows_and_names_the_worst(tmp_path):
    write_records(tmp_path, [cpu(1.0).record("a"), cpu(6.0, runq=2.5).record("b"), cpu(9.5).record("c"),
                             cpu(2.0).record("d")])
    line = clientcpu.client_line(tmp_path)
    assert line.startswith("2 of 4 measured windows had a near-saturated client")
    assert "at most 95%, in c" in line


def test_no_line_when_no_window_was_saturated_or_nothing_was_recorded(tmp_path):
    assert clientcpu.client_line(tmp_path) is None and clientcpu.client_line(None) is None
    write_records(tmp_path, [cpu(1.0).record("a")])
    assert clientcpu.client_line(tmp_path) is None


def test_a_torn_last_line_is_skipped_and_old_records_read_their_loop_share(tmp_path):
    old = {"server": "old", "wall_s": 1.0, "loop_cpu_s": 0.9, "loop_share": 0.9, "saturated": True}
    write_records(tmp_path, [old])
    with (tmp_path / "data" / clientcpu.CLIENT_CPU_NAME).open("a") as f:
        f.write('{"server": "torn", "satu')
    assert [r["server"] for r in clientcpu.read_records(tmp_path)] == ["old"]
    assert "at most 90%, in old" in clientcpu.client_line(tmp_path)


def test_the_summary_block_shows_the_client_line_only_when_a_window_was_saturated(tmp_path):
    summary = Summary(question="q?", headlines=[Headline("h", "SHOWN EQUIVALENT", None, "why", "ci")],
                      evidence=["e"], short="s")
    write_records(tmp_path, [cpu(1.0).record("a")])
    assert "<b>Client.</b>" not in summary_html(summary, tmp_path)
    write_records(tmp_path, [cpu(1.0).record("a"), cpu(9.0).record("b")])
    html = summary_html(summary, tmp_path)
    assert "<b>Client.</b> 1 of 2 measured windows had a near-saturated client" in html


# ---------------------------------------------------------------- bound


def windows(shares: dict[tuple[str, int], float]) -> pd.DataFrame:
    rows = []
    for (arm, level), share in shares.items():
        c = cpu(loop=10 * share)
        rows.append({"arm": arm, "sweep": 0, "level": level, **c.columns()})
    return pd.DataFrame(rows)


def test_client_bound_when_a_window_at_or_past_the_saturation_level_had_a_saturated_client():
    w = windows({("a", 1): 0.1, ("a", 4): 0.5, ("a", 16): 0.9, ("b", 1): 0.1, ("b", 4): 0.2, ("b", 16): 0.3})
    got = bound.bound(w, "a", 4)
    assert got.word == bound.CLIENT_BOUND and got.levels == [4, 16] and got.saturated_windows == 1
    assert got.windows == 2 and got.max_busy_share == pytest.approx(0.9) and "1 of 2 windows" in got.text()
    assert bound.bound(w, "b", 4).word == bound.ENGINE_BOUND


def test_a_saturated_client_below_the_saturation_level_does_not_decide():
    w = windows({("a", 1): 0.95, ("a", 4): 0.2, ("a", 16): 0.3})
    got = bound.bound(w, "a", 4)
    assert got.word == bound.ENGINE_BOUND and "at most 30%" in got.text()


def test_a_still_growing_curve_reads_its_top_level():
    w = windows({("a", 1): 0.1, ("a", 4): 0.95, ("a", 16): 0.2})
    assert bound.bound(w, "a", None).word == bound.ENGINE_BOUND
    w = windows({("a", 1): 0.1, ("a", 4): 0.2, ("a", 16): 0.85})
    got = bound.bound(w, "a", None)
    assert got.word == bound.CLIENT_BOUND and got.levels == [16]


def test_no_bound_without_client_figures():
    assert bound.bound(pd.DataFrame({"arm": ["a"], "level": [1]}), "a", None) is None
    w = windows({("a", 1): 0.1})
    w["client_loop_share"] = float("nan")
    assert bound.bound(w, "a", None) is None
    assert bound.bound(windows({("a", 1): 0.1}), "other", None) is None
