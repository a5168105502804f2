"""vLLM's proposal tracer: specbook's plugin (trace_plugin.py), installed in a server launched with
$SPECBOOK_TRACE_DIR, records every proposal while `recording` holds its switch file (TRACE_DIR/tracing); the
pass asks for the token ids of each request (`return_token_ids`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specbook.engines.base import EngineConfig, TracedPass
from specbook.engines.vllm.trace_plugin import TRACE_DIR_ENV, TRACE_SWITCH
from specbook.traces.records import RequestTrace, TraceError, TraceReading, read_trace_dir


def _body_ids(resp: dict[str, Any]) -> tuple[list[int] | None, list[int]]:
    choice = resp["choices"][0]
    return resp.get("prompt_token_ids"), list(choice.get("token_ids") or [])


@contextmanager
def recording(folder: Path) -> Iterator[None]:
    """Tracing on for the block: the plugin's switch file made, then removed whatever happens."""
    switch = Path(folder) / TRACE_SWITCH
    switch.parent.mkdir(parents=True, exist_ok=True)
    switch.touch()
    try:
        yield
    finally:
        switch.unlink(missing_ok=True)


class VllmTracer:
    extra_body = {"return_token_ids": True}
    traces_whole_server = False  # the plugin records only while its switch file exists

    def recording(self, folder: Path) -> Any:
        return recording(folder)

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
