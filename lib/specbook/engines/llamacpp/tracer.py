"""llama.cpp's proposal tracer: llama-server's debug log (`-v`) prints every draft and emitted id
(traceparse.py); the prompt's ids come from its templated prompt through /tokenize."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

from specbook.engines.base import EngineConfig, TracedPass
from specbook.traces.records import RequestTrace, TraceError, TraceReading

EOG_NOTE = ("llama.cpp ends a draft step at an end-of-generation token short of the draft's end (its own token, "
            "not an accepted one, even where the draft proposed it): the derived counts follow that")
NGRAM_NOTE = ("llama.cpp ngram-simple prints where its match lies, not the ids: its proposals are read from the "
              "token history (prompt ids from /tokenize + emitted ids)")


def prompt_ids(base_url: str, resp: dict[str, Any]) -> list[int] | None:
    """The prompt's ids as the server tokenised it: its templated prompt (in the -v reply) through /tokenize;
    None when they do not have the length the server reported."""
    import httpx

    text = (resp.get("__verbose") or {}).get("prompt")
    if not text:
        return None
    for add_special in (False, True):  # the templated text may or may not carry the BOS the model wants
        r = httpx.post(base_url + "/tokenize", json={"content": text, "add_special": add_special,
                       "parse_special": True}, timeout=60, trust_env=False)
        r.raise_for_status()
        ids = [int(t) for t in r.json()["tokens"]]
        if len(ids) == int(resp["usage"]["prompt_tokens"]):
            return ids
    return None


class LlamaCppTracer:
    extra_body: dict[str, Any] = {}
    traces_whole_server = True  # `-v` from the server's start: a traced server of its own

    def recording(self, folder: Path) -> Any:
        del folder  # on for the server's whole life
        return nullcontext()

    def traced_config(self, cfg: EngineConfig, folder: Path) -> EngineConfig:
        del folder  # llama-server writes what it traces into its log
        extra = list(cfg.extra_args)
        return cfg if "-v" in extra else cfg.model_copy(update={"extra_args": extra + ["-v"]})

    def read(self, traced: TracedPass) -> TraceReading:
        """One task per request (sent one at a time), in order of first token; proposals from the log."""
        from specbook.engines.llamacpp.traceparse import ngram_proposals, parse_trace_lines

        parsed = parse_trace_lines(traced.log_text.splitlines())
        tasks = list(parsed.emitted)
        if len(tasks) != len(traced.responses):
            raise TraceError(f"{traced.server_name}: the debug log shows {len(tasks)} tasks emitting tokens for "
                             f"{len(traced.responses)} requests (was the server started with -v?)")
        requests, histories = [], {}
        for req, resp, task in zip(traced.requests, traced.responses, tasks, strict=True):
            ids = prompt_ids(traced.base_url, resp)
            out = parsed.emitted[task]
            requests.append(RequestTrace(req.prompt_id, task, ids, int(resp["usage"]["prompt_tokens"]), out,
                                         resp["choices"][0].get("finish_reason"), eog_stop=task in parsed.stopped_on_eog))
            if ids is not None:
                histories[task] = list(ids) + out
        notes = ([EOG_NOTE] if parsed.stopped_on_eog else []) + ([NGRAM_NOTE] if parsed.ngram_matches else [])
        return TraceReading(ngram_proposals(parsed, histories), requests, notes)
