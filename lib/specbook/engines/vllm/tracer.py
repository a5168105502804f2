"""vLLM's proposal tracer: specbook's plugin (trace_plugin.py) records every proposal of a server launched with
$SPECBOOK_TRACE_DIR; the pass asks for the token ids of each request (`return_token_ids`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specbook.engines.base import EngineConfig, TracedPass
from specbook.engines.vllm.trace_plugin import TRACE_DIR_ENV
from specbook.traces.records import RequestTrace, TraceError, TraceReading, read_trace_dir


def _body_ids(resp: dict[str, Any]) -> tuple[list[int] | None, list[int]]:
    choice = resp["choices"][0]
    return resp.get("prompt_token_ids"), list(choice.get("token_ids") or [])


class VllmTracer:
    extra_body = {"return_token_ids": True}

    def traced_config(self, cfg: EngineConfig, folder: Path) -> EngineConfig:
        return cfg.model_copy(update={"env": {**cfg.env, TRACE_DIR_ENV: str(folder)}})

    def read(self, traced: TracedPass) -> TraceReading:
        """The plugin's records of every process; each request's ids from its response."""
        folder = traced.trace_dir
        records, statuses = read_trace_dir(folder)
        refused = [s["refused"] for s in statuses if s.get("refused")]
        if refused:
            raise TraceError(refused[0])
        if not any(s.get("patched") for s in statuses):
            raise TraceError(f"{folder}: no vLLM process installed the specbook trace plugin (is specbook installed "
                             "in the server's environment, with its vllm.general_plugins entry point?)")
        ids = sorted({r.request_id for r in records})
        requests = []
        for req, resp in zip(traced.requests, traced.responses, strict=True):
            prompt_ids, out = _body_ids(resp)
            # vLLM's internal id is the response id plus a suffix of its own
            rid = next((i for i in ids if i == resp["id"] or i.startswith(resp["id"] + "-")), resp["id"])
            requests.append(RequestTrace(req.prompt_id, rid, prompt_ids, int(resp["usage"]["prompt_tokens"]), out,
                                         resp["choices"][0].get("finish_reason")))
        return TraceReading(records, requests)
