"""SGLang's /metrics (`--enable-metrics`; srt/observability/metrics_collector.py, sglang 0.5.15.post1) -> CounterDelta.

SGLang counts no accepted draft token. What it counts, per finished request (its tokenizer process adds a
request's figures when the request finishes, so scrape after the requests returned):

    sglang:spec_verify_calls_total   verify steps of the target (the request's spec_verify_ct)
    sglang:generation_tokens_total   completion tokens: the first (sampled by the prefill) + every verify step's
    sglang:num_requests_total        finished requests

A verify step commits 1 + (accepted drafts) tokens, and the first token of a request comes from its prefill, so
over finished requests, in the acceptance model's terms:

    drafts          = d spec_verify_calls
    accepted_tokens = d generation_tokens - d num_requests - d spec_verify_calls
    draft_tokens    = drafts x k   (the config's k; the gauge sglang:spec_num_draft_tokens - 1 checks it: the gauge
                                    counts the verified root token, and is set only at decode-log intervals)

A run of accepted tokens that a stop string, EOS or max_tokens cuts short is not in completion_tokens, so
accepted_tokens can fall short of what the target accepted by at most k per request (the counters cannot tell).
No per-position counts. Without speculation the spec counters stay 0: drafts 0 and AL NaN. The labels are
model_name (the served name) and engine_type; one model per server.
"""

from __future__ import annotations

from specbook.core.acceptance import Acceptance
from specbook.core.errors import MetricsError
from specbook.serve.metrics import CounterDelta, MetricsSnapshot, int_delta

PREFIX = "sglang:"
SPEC_VERIFY_CALLS = PREFIX + "spec_verify_calls"
GENERATION_TOKENS = PREFIX + "generation_tokens"
PROMPT_TOKENS = PREFIX + "prompt_tokens"
NUM_REQUESTS = PREFIX + "num_requests"
SPEC_NUM_DRAFT_TOKENS = PREFIX + "spec_num_draft_tokens"  # gauge: tokens verified per step, root included
SOURCE = "sglang /metrics delta"


def draft_tokens_per_step(snapshot: MetricsSnapshot, model_name: str | None = None) -> int | None:
    """Draft tokens proposed per verify step as the server's gauge says (its count less the verified root token);
    None where the gauge is unset or 0: SGLang sets it only at a decode-log interval (every 40 decode batches by
    default), so before a server's first interval, and without speculation, it says nothing."""
    values = {s.value for s in snapshot.select(SPEC_NUM_DRAFT_TOKENS, model_name=model_name)}
    if len(values) > 1:
        raise MetricsError(f"{SPEC_NUM_DRAFT_TOKENS}: more than one value {sorted(values)} for one model")
    value = next(iter(values), None)
    return int(value) - 1 if value is not None and value > 1 else None


def counter_delta(before: MetricsSnapshot, after: MetricsSnapshot, model_name: str | None = None,
                  k: int | None = None) -> CounterDelta:
    """SGLang's counters between two snapshots, through the acceptance model (see the module docstring).

    `k` is what the server was asked to propose a step (its config's num_speculative_tokens); without it the
    gauge's value is used, and a gauge that disagrees with it is an error (the server runs another config)."""
    labels = {"model_name": model_name}
    verify = int_delta(before, after, SPEC_VERIFY_CALLS, **labels) or 0
    generated = int_delta(before, after, GENERATION_TOKENS, **labels)
    requests = int_delta(before, after, NUM_REQUESTS, **labels)
    accepted = 0
    if verify:
        if generated is None or requests is None:
            raise MetricsError(f"{SPEC_VERIFY_CALLS} moved by {verify} but {GENERATION_TOKENS} or {NUM_REQUESTS} is "
                               "missing from the scrape: accepted tokens cannot be counted")
        accepted = generated - requests - verify
        if accepted < 0:
            raise MetricsError(
                f"SGLang counters: {generated} generation tokens for {requests} requests and {verify} verify steps "
                "leave a negative accepted count: a request finished between the scrapes was not counted whole")
    gauge = draft_tokens_per_step(after, model_name)
    if k is not None and gauge is not None and gauge != k:
        raise MetricsError(f"{SPEC_NUM_DRAFT_TOKENS} says {gauge + 1} tokens a verify step (root included), the "
                           f"config {k} drafts + the root: the server runs another config")
    per_step = k if k is not None else gauge
    if verify and per_step is None:
        raise MetricsError(f"{SPEC_NUM_DRAFT_TOKENS} is not set although {verify} verify steps ran (SGLang sets it "
                           "at its first decode-log interval), and no config says k: draft tokens per step unknown")
    acceptance = Acceptance.from_counts(SOURCE, drafts=verify, draft_tokens=verify * (per_step or 0),
                                        accepted_tokens=accepted)
    return CounterDelta(
        acceptance=acceptance,
        generation_tokens=generated,
        prompt_tokens=int_delta(before, after, PROMPT_TOKENS, **labels),
        requests_succeeded=requests,
        interval_s=(after.timestamp - before.timestamp).total_seconds(),
    )
