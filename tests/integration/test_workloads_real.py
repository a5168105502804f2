"""Spec-Bench on a real llama-server (embedded target, int4 draft): an MT-Bench question sent as a real
two-turn conversation through `Server.measure`, and per-category windows whose counter deltas add up to
the whole run's (snapshots taken around all of them on the same server).

Run under the shared engine lock: `flock /tmp/specbook-engine.lock .venv/bin/pytest -m integration`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import TypeAdapter

from specbook.engines import EngineConfig, get_engine
from specbook.measure import harness
from specbook.measure.categories import measure_by_category
from specbook.models import DRAFT_INT4, TARGET
from specbook.serve.metrics import scrape
from specbook.store.runstore import RunContext
from specbook.workloads import draw_workload
from specbook.workloads.params import WorkloadParams

pytestmark = pytest.mark.integration

SPEC_BENCH = Path(__file__).resolve().parents[3] / "shared" / "data" / "spec_bench" / "question.jsonl"
K = 4


def test_two_turn_conversation_and_category_windows_on_llama_server(tmp_path):
    if not SPEC_BENCH.is_file():
        pytest.fail(f"Spec-Bench question.jsonl not found at {SPEC_BENCH}: the shared data beside the checkout "
                    f"is needed for this test")
    params = TypeAdapter(WorkloadParams).validate_python({
        "dataset": "spec_bench", "path": str(SPEC_BENCH), "categories": ["mt_bench", "qa", "translation"],
        "per_category": 1, "max_tokens": 32, "seed": 7})
    requests = draw_workload(params, params.seed).requests
    assert [len(r.follow_up) for r in requests] == [1, 0, 0]
    cfg = EngineConfig(engine="llamacpp", model=TARGET, served_model_name="smollm2", max_num_seqs=1,
                       speculative_config={"method": "draft_model", "model": DRAFT_INT4, "num_speculative_tokens": K},
                       extra_args=["-t", "2"])
    with harness.serve(cfg, RunContext(tmp_path / "run"), "llamacpp-spec-bench") as server:
        before = scrape(server.base_url)
        windows = measure_by_category(server, requests, concurrency=1, flush_wait_s=0.2)
        after = scrape(server.base_url)
    outer = get_engine("llamacpp").spec_decode_delta(before, after, server.model_name).acceptance

    assert [c for c, _ in windows.windows] == ["mt_bench", "qa", "translation"]
    first, second = windows.windows[0][1].records
    assert (first.turn, second.turn, second.prompt_id) == (1, 2, f"{first.prompt_id}/turn2")
    assert first.error is None and second.error is None and first.output_text and second.output_text
    # the second turn's prompt holds the first question, the model's own first answer and the follow-up
    assert second.prompt_tokens >= first.prompt_tokens + first.completion_tokens + 5
    assert {r.category for r in windows.whole.records} == {"mt_bench", "qa", "translation"}

    frame = windows.frame()
    assert (frame["counter_draft_tokens"] > 0).all()  # every category window drafted on its own
    whole = windows.whole.acceptance
    assert whole.draft_tokens == outer.draft_tokens == frame["counter_draft_tokens"].sum()
    assert whole.accepted_tokens == outer.accepted_tokens == frame["counter_accepted_tokens"].sum()
    assert 1.0 < whole.al <= 1 + K
