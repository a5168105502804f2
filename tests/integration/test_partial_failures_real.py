"""Partial request failures from a real llama-server: one request of a window is refused, the others answer.

A prompt longer than the server's context is refused by the engine itself (HTTP 400), the way a real
workload's outlier prompt is; the window keeps its records, the failure table counts it against the unit,
and the output comparison leaves it out instead of calling its missing text a differing output.
"""

from __future__ import annotations

import pandas as pd
import pytest

from specbook.core import request_failures
from specbook.engines import EngineConfig
from specbook.experiments import config_flip as cf
from specbook.measure import harness
from specbook.models import TARGET
from specbook.serve.client import ChatRequest
from specbook.store.runstore import RunContext

pytestmark = pytest.mark.integration

CONTEXT = 512
SHORT = "What is 2 + 3? Answer with the number only."
TOO_LONG = "Summarise this. " + "The bicycle has two wheels and a chain. " * 200  # ~2000 tokens > CONTEXT


def test_a_request_the_engine_refuses_is_counted_and_never_compared(tmp_path):
    run = RunContext(tmp_path / "run")
    cfg = EngineConfig(engine="llamacpp", model=TARGET, served_model_name="smollm2", max_num_seqs=1,
                       max_model_len=CONTEXT, extra_args=["-t", "2"])
    prompts = {"p0": SHORT, "p1": TOO_LONG}
    requests = [ChatRequest(prompt_id=pid, messages=[{"role": "user", "content": text}], max_tokens=8)
                for pid, text in prompts.items()]
    frames = []
    with harness.serve(cfg, run, "partial") as server:
        for arm in ("arm0", "arm1"):  # the same server twice: greedy outputs are equal where both answered
            frame = server.measure(requests, concurrency=1).requests_frame()
            frame.insert(0, "arm", arm)
            frames.append(frame)
    req = pd.concat(frames, ignore_index=True)
    failed = req[request_failures.failed_mask(req)]
    assert set(failed["prompt_id"]) == {"p1"} and len(failed) == 2, req[["arm", "prompt_id", "error"]]
    assert "HTTP 400" in failed["error"].iloc[0], failed["error"].iloc[0]

    table = request_failures.failure_table(req, ["arm"], max_failed=0).set_index("arm")
    assert table["n_failed"].tolist() == [1, 1] and not table["valid"].any()
    assert set(request_failures.left_out(table.reset_index(), ["arm"])) == {"arm0", "arm1"}
    assert request_failures.failure_table(req, ["arm"], max_failed=1)["valid"].all()

    data = cf.FlipData(flip={}, arms=pd.DataFrame({"arm": ["arm0", "arm1"], "index": [0, 1]}), requests=req,
                       intervals=pd.DataFrame())
    eq = cf.output_equality(data).set_index("prompt_id")
    assert eq.loc["p0", "all_equal"] and eq.loc["p0", "comparable"]
    assert not eq.loc["p1", "comparable"] and eq.loc["p1", "no_output"] == "arm0, arm1"
    (record,) = run.servers()
    assert record.status == "ok"
