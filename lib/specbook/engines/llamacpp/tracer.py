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


def pass_tasks(tasks: list[str], n_requests: int, server_name: str) -> tuple[list[str], list[str]]:
    """The tasks of a pass's requests, in log order, and those before them. The requests go one at a time, after
    whatever the server served before the pass; llama-server writes its log from a thread of its own, so an
    earlier request's lines can land after the pass's log range began: such tasks come first and are not the
    pass's. Fewer tasks than requests: TraceError (the server was not started with -v, or its log was cut)."""
    if len(tasks) < n_requests:
        raise TraceError(f"{server_name}: the debug log shows {len(tasks)} tasks emitting tokens for {n_requests} "
                         "requests (was the server started with -v?)")
    cut = len(tasks) - n_requests
    return tasks[cut:], tasks[:cut]


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
        tasks, earlier = pass_tasks(list(parsed.emitted), len(traced.responses), traced.server_name)
        requests, histories = [], {}
        for req, resp, task in zip(traced.requests, traced.responses, tasks, strict=True):
            ids = prompt_ids(traced.base_url, resp)
            out = parsed.emitted[task]
            requests.append(RequestTrace(req.prompt_id, task, ids, int(resp["usage"]["prompt_tokens"]), out,
                                         resp["choices"][0].get("finish_reason"), eog_stop=task in parsed.stopped_on_eog))
            if ids is not None:
                histories[task] = list(ids) + out
        notes = ([EOG_NOTE] if parsed.stopped_on_eog else []) + ([NGRAM_NOTE] if parsed.ngram_matches else [])
        if earlier:
            notes.append(f"the pass's log also held {len(earlier)} earlier task(s) ({', '.join(earlier)}): lines of "
                         "requests sent before it, which llama-server's log thread wrote after the pass began; left out")
        return TraceReading(ngram_proposals(parsed, histories), requests, notes)
