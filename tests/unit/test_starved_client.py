"""A deliberately starved client is flagged: its window's record says saturated, the report's summary block has
the "Client." line, and the concurrency curve's throughput verdict says CLIENT-BOUND; the same windows with the
client left alone are not flagged and the verdict says ENGINE-BOUND.

The server is the harness's stub (tests/fixtures/stub_servers/engine_stub.py, mode `serving`), not an engine: what
is tested is the client's own accounting and the report's reading of it; nothing here says how an engine saturates.
The client is starved from inside its own event loop: a callback that burns CPU on the loop's thread and puts
itself back on the loop's ready queue, so the loop never waits idle while the window's requests run."""

from __future__ import annotations

import asyncio
import time

import pandas as pd
import pytest
from tests.unit.test_harness import ENGINE, StubEngine, cfg, req

from specbook.engines import _ENGINES as REGISTRY
from specbook.engines import register_engine
from specbook.experiments import concurrency_curve as cc
from specbook.measure import harness
from specbook.report.view import summary_html
from specbook.serve import client, clientcpu
from specbook.store.runstore import RunContext


@pytest.fixture(scope="module", autouse=True)
def stub_engine():
    register_engine(ENGINE)(StubEngine)
    yield
    REGISTRY.pop(ENGINE, None)


def starve_the_loop(monkeypatch) -> None:
    """From the window's first request on, the client's loop runs a CPU-burning callback on every turn."""
    real = client._run_one
    started: list[asyncio.AbstractEventLoop] = []

    def burn() -> None:
        end = time.thread_time() + 0.02
        while time.thread_time() < end:
            pass
        started[0].call_soon(burn)

    async def run_one(*args, **kwargs):
        if not started:
            started.append(asyncio.get_running_loop())
            started[0].call_soon(burn)
        return await real(*args, **kwargs)

    monkeypatch.setattr(client, "_run_one", run_one)


def curve_rows(windows: dict[int, harness.Window]) -> pd.DataFrame:
    """Level rows as concurrency_curve.run_one writes them, for two sweeps of the demo's two arms (the same windows
    each time: the verdict read here is per arm)."""
    rows = []
    for sweep in (0, 1):
        for arm in ("baseline", "int4draft"):
            run_id = f"s{sweep}-{arm}"
            for order, (level, window) in enumerate(sorted(windows.items())):
                rows.append({"window_id": f"{run_id}@c{level}", "run_id": run_id, "order": sweep, "sweep": sweep,
                             "arm": arm, "level": level, "level_order": order, **cc.level_row(window, level)})
    return pd.DataFrame(rows)


def throughput_verdict(levels: pd.DataFrame) -> str:
    params = cc.load_params_file("params/concurrency_curve/cpu-demo.yaml")
    result = cc.analyze(cc.CurveData(levels, pd.DataFrame(), pd.DataFrame()), params)
    head = next(h for h in result.answer(params).headlines if h.comparison == "baseline: throughput")
    return head.verdict + " | " + head.figure


def test_a_starved_client_is_flagged_in_the_report_and_the_curve_says_client_bound(tmp_path, monkeypatch):
    run = RunContext(tmp_path / "run")
    reqs = [req(f"p{i}", max_tokens=8) for i in range(8)]
    with harness.serve(cfg(), run, "00-stub-client", extra={"arm": "baseline"}) as server:
        calm2 = server.measure(reqs, concurrency=2)
        calm4 = server.measure(reqs, concurrency=4)
        starve_the_loop(monkeypatch)
        starved = server.measure(reqs, concurrency=4)

    for w in (calm2, calm4, starved):
        assert w.client_cpu is not None and w.client_cpu.requests == len(reqs)
        assert not [r.error for r in w.records if r.error]
    assert not calm2.client_cpu.saturated and not calm4.client_cpu.saturated
    assert starved.client_cpu.saturated, starved.client_cpu
    assert starved.client_cpu.loop_cpu_s > calm4.client_cpu.loop_cpu_s

    records = clientcpu.read_records(run.run_dir)
    assert [r["saturated"] for r in records] == [False, False, True]
    assert {r["server"] for r in records} == {"00-stub-client"}
    line = clientcpu.client_line(run.run_dir)
    assert line is not None and line.startswith("1 of 3 measured windows had a near-saturated client")

    params = cc.load_params_file("params/concurrency_curve/cpu-demo.yaml")
    levels = curve_rows({2: calm2, 4: starved})
    result = cc.analyze(cc.CurveData(levels, pd.DataFrame(), pd.DataFrame()), params)
    assert "<b>Client.</b> 1 of 3 measured windows" in summary_html(result.answer(params), run.run_dir)
    verdict = throughput_verdict(levels)
    assert "CLIENT-BOUND" in verdict and "ENGINE-BOUND" not in verdict, verdict

    calm = throughput_verdict(curve_rows({2: calm2, 4: calm4}))
    assert "ENGINE-BOUND" in calm and "CLIENT-BOUND" not in calm, calm
