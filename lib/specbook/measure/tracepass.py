"""The trace pass: a separate, untimed pass on a server launched with tracing on, giving a TraceSet.

    cfg = traced_config(cfg, trace_dir)                  # vLLM: $SPECBOOK_TRACE_DIR; llama.cpp: -v
    with harness.serve(cfg, run, name) as server:
        traces = trace_pass(server, requests, trace_dir)

Requests go one at a time, non-streamed, asking for token ids (vLLM `return_token_ids`; llama.cpp's
debug log prints every emitted id). The pass is a window of its own: /metrics before and after, so the
accepted counts derived from the traces can be checked against the engine's counters for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from specbook.core.acceptance import Acceptance
from specbook.traces.derive import counts_agree, derive_steps, derived_acceptance
from specbook.traces.records import ProposalRecord, TraceError, read_trace_dir, records_frame

if TYPE_CHECKING:
    from specbook.engines.base import EngineConfig
    from specbook.measure.harness import Server
    from specbook.serve.client import ChatRequest

TRACE_NOTE = "proposal traces come from a separate, untimed trace pass (debug logging / trace plugin on)"


@dataclass
class RequestTrace:
    """One request of the pass: its ids (prompt and emitted) and the engine's id for it. `eog_stop`: it
    stopped on an end-of-generation token at which the engine's verifier ends a draft step (llama.cpp's
    rule, specbook.traces.derive); the engine's reader sets it."""

    prompt_id: str
    request_id: str
    prompt_ids: list[int] | None
    prompt_len: int
    output_ids: list[int]
    finish_reason: str | None = None
    eog_stop: bool = False


@dataclass
class TraceSet:
    """What one trace pass on one server gave: records, the requests' ids, the window's counters, and,
    where proposals could not be traced, why (`untraceable`)."""

    engine: str
    server: str
    method: str | None
    records: pd.DataFrame
    requests: list[RequestTrace]
    counters: Acceptance | None = None
    untraceable: str | None = None
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def steps(self) -> pd.DataFrame:
        """Every request's derived steps (specbook.traces.derive) with its prompt_id."""
        reqs = {r.request_id: (r.prompt_len, r.output_ids) for r in self.requests}
        steps = derive_steps(self.records, reqs, {r.request_id for r in self.requests if r.eog_stop})
        pid = {r.request_id: r.prompt_id for r in self.requests}
        steps.insert(0, "prompt_id", steps["request_id"].map(pid))
        return steps

    def derived_acceptance(self) -> Acceptance:
        return derived_acceptance(self.steps(), source=f"{self.engine} proposal traces")

    def disagreements(self) -> list[str]:
        """Where the counters of the same window fall outside the derived counts ([] when they agree; a
        step the request's stop cut counts between its derived and its full proposals)."""
        if self.counters is None:
            return ["no counters for this window"]
        steps = self.steps()
        return counts_agree(derived_acceptance(steps), self.counters, derived_acceptance(steps, upper=True))

    @property
    def output_tokens(self) -> int:
        return sum(len(r.output_ids) for r in self.requests)


# -- per engine: how tracing is switched on and how a pass's records are read -----------------------------

def _vllm_enable(cfg: EngineConfig, folder: Path) -> EngineConfig:
    from specbook.engines.vllm.trace_plugin import TRACE_DIR_ENV

    return cfg.model_copy(update={"env": {**cfg.env, TRACE_DIR_ENV: str(folder)}})


def _llamacpp_enable(cfg: EngineConfig, folder: Path) -> EngineConfig:
    extra = list(cfg.extra_args)
    return cfg if "-v" in extra else cfg.model_copy(update={"extra_args": extra + ["-v"]})


def _vllm_body(resp: dict[str, Any]) -> tuple[list[int] | None, list[int]]:
    choice = resp["choices"][0]
    return resp.get("prompt_token_ids"), list(choice.get("token_ids") or [])


def _vllm_read(server: Server, folder: Path, log_text: str, responses: list[dict[str, Any]],
               requests: Sequence[ChatRequest]) -> tuple[list[ProposalRecord], list[RequestTrace], list[str]]:
    records, statuses = read_trace_dir(folder)
    refused = [s["refused"] for s in statuses if s.get("refused")]
    if refused:
        raise TraceError(refused[0])
    if not any(s.get("patched") for s in statuses):
        raise TraceError(f"{folder}: no vLLM process installed the specbook trace plugin (is specbook installed "
                         "in the server's environment, with its vllm.general_plugins entry point?)")
    ids = sorted({r.request_id for r in records})
    traced = []
    for req, resp in zip(requests, responses, strict=True):
        prompt_ids, out = _vllm_body(resp)
        # vLLM's internal id is the response id plus a suffix of its own
        rid = next((i for i in ids if i == resp["id"] or i.startswith(resp["id"] + "-")), resp["id"])
        traced.append(RequestTrace(req.prompt_id, rid, prompt_ids, int(resp["usage"]["prompt_tokens"]), out,
                                   resp["choices"][0].get("finish_reason")))
    return records, traced, []


def _llamacpp_read(server: Server, folder: Path, log_text: str, responses: list[dict[str, Any]],
                   requests: Sequence[ChatRequest]) -> tuple[list[ProposalRecord], list[RequestTrace], list[str]]:
    from specbook.engines.llamacpp.traceparse import ngram_proposals, parse_trace_lines

    parsed = parse_trace_lines(log_text.splitlines())
    tasks = list(parsed.emitted)  # in order of first token: one task per request, sent one at a time
    if len(tasks) != len(responses):
        raise TraceError(f"{server.name}: the debug log shows {len(tasks)} tasks emitting tokens for "
                         f"{len(responses)} requests (was the server started with -v?)")
    traced, histories, notes = [], {}, []
    for req, resp, task in zip(requests, responses, tasks, strict=True):
        prompt_ids = _llamacpp_prompt_ids(server, resp)
        out = parsed.emitted[task]
        traced.append(RequestTrace(req.prompt_id, task, prompt_ids, int(resp["usage"]["prompt_tokens"]), out,
                                   resp["choices"][0].get("finish_reason"), eog_stop=task in parsed.stopped_on_eog))
        if prompt_ids is not None:
            histories[task] = list(prompt_ids) + out
    if parsed.stopped_on_eog:
        notes.append("llama.cpp ends a draft step at an end-of-generation token short of the draft's end (its own "
                     "token, not an accepted one, even where the draft proposed it): the derived counts follow that")
    if parsed.ngram_matches:
        notes.append("llama.cpp ngram-simple prints where its match lies, not the ids: its proposals are read "
                     "from the token history (prompt ids from /tokenize + emitted ids)")
    return ngram_proposals(parsed, histories), traced, notes


def _llamacpp_prompt_ids(server: Server, resp: dict[str, Any]) -> list[int] | None:
    """The prompt's ids as the server tokenised it: its templated prompt (in the -v reply) through /tokenize;
    None when they do not have the length the server reported."""
    import httpx

    text = (resp.get("__verbose") or {}).get("prompt")
    if not text:
        return None
    for add_special in (False, True):  # the templated text may or may not carry the BOS the model wants
        r = httpx.post(server.base_url + "/tokenize", json={"content": text, "add_special": add_special,
                       "parse_special": True}, timeout=60, trust_env=False)
        r.raise_for_status()
        ids = [int(t) for t in r.json()["tokens"]]
        if len(ids) == int(resp["usage"]["prompt_tokens"]):
            return ids
    return None


@dataclass(frozen=True)
class _Tracer:
    enable: Callable[[EngineConfig, Path], EngineConfig]
    read: Callable[..., tuple[list[ProposalRecord], list[RequestTrace], list[str]]]
    extra_body: dict[str, Any]


TRACERS: dict[str, _Tracer] = {
    "vllm": _Tracer(_vllm_enable, _vllm_read, {"return_token_ids": True}),
    "llamacpp": _Tracer(_llamacpp_enable, _llamacpp_read, {}),
}


def _tracer(engine: str) -> _Tracer:
    if engine not in TRACERS:
        raise TraceError(f"engine {engine!r} has no proposal tracer; known: {sorted(TRACERS)}")
    return TRACERS[engine]


def traced_config(cfg: EngineConfig, trace_dir: str | Path) -> EngineConfig:
    """`cfg` with tracing on (the same server otherwise)."""
    folder = Path(trace_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return _tracer(cfg.engine).enable(cfg, folder)


def trace_pass(server: Server, requests: Sequence[ChatRequest], trace_dir: str | Path, *,
               flush_wait_s: float = 1.0) -> TraceSet:
    """Send `requests` one at a time to a server started with `traced_config`; its TraceSet. A lane whose
    proposals cannot be traced on this build gives a TraceSet with `untraceable` saying why."""
    from specbook.measure.harness import log_size, read_log_range
    from specbook.serve.metrics import scrape

    tracer = _tracer(server.cfg.engine)
    spec = server.cfg.speculative_config or {}
    method = spec.get("method") or ("draft_model" if spec.get("model") else None)
    log_start = log_size(server.log_path)
    before = scrape(server.base_url)
    t0 = time.monotonic()
    responses = []
    for req in requests:
        sent = req.model_copy(update={"extra_body": {**req.extra_body, **tracer.extra_body}})
        responses.append(server.post_raw(sent))
    wall = time.monotonic() - t0
    time.sleep(flush_wait_s)
    after = scrape(server.base_url)
    counters = server.engine.spec_decode_delta(before, after, server.model_name).acceptance
    log_text = read_log_range(server.log_path, log_start, log_size(server.log_path))
    empty = records_frame([])
    try:
        records, traced, notes = tracer.read(server, Path(trace_dir), log_text, responses, requests)
    except TraceError as exc:
        return TraceSet(server.cfg.engine, server.name, method, empty, [], counters, untraceable=str(exc),
                        notes=[TRACE_NOTE], wall_s=wall)
    frame = records_frame(records)
    untraceable = None
    if method and not len(frame):
        untraceable = f"{server.name}: speculation {method} is on but the pass recorded no proposal"
    elif len(frame) and not frame["proposed"].map(len).any() and counters.draft_tokens:
        untraceable = f"{server.name}: the engine drafted tokens but the trace holds no proposed ids"
    return TraceSet(server.cfg.engine, server.name, method, frame, traced, counters, untraceable,
                    [TRACE_NOTE, *notes], wall)
