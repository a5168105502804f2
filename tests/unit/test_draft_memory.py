"""A drafter that remembers earlier requests (specbook.experiments.cross_engine.draft_memory): the chunk counts of
a prompt's repeats, the set-up fact each engine declares, and the caveat a lane's headline carries; last, the
committed SGLang vs vLLM report (docs/reports/cross_engine-h100-sglang, commit fca55c1 on an H100), where
SGLang's server-wide NGRAM trie meets prompts it served before."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from specbook.core.params import load_params
from specbook.engines import EngineConfig, get_engine
from specbook.engines.base import EARLIER_REQUESTS
from specbook.experiments import cross_engine as ce
from specbook.experiments.cross_engine import draft_memory as dm
from specbook.store.runstore import RunContext

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
LABELS = {"ours": "sglang-cuda", "oracle": "vllm-cuda"}
SGLANG_RUN = Path(__file__).resolve().parents[2] / "docs" / "reports" / "cross_engine-h100-sglang"
PARAMS = Path(__file__).resolve().parents[2] / "params" / "cross_engine"


def _req(side, lane, prompt, repeat, tokens, chunks, engine=None):
    return {"side": side, "engine": engine or {"ours": "sglang", "oracle": "vllm"}[side], "lane": lane,
            "prompt": prompt, "repeat": repeat, "token_ids": list(tokens), "chunks": chunks,
            "completion_tokens": len(tokens)}


def _frame(rows):
    return pd.DataFrame(rows)


def test_fewer_chunks_for_the_same_output_on_a_later_repeat_is_counted_per_side_and_lane():
    same, other = range(40), range(100, 140)
    df = _frame([
        _req("ours", "ngram", "a", 0, same, 20), _req("ours", "ngram", "a", 1, same, 10),
        _req("ours", "ngram", "a", 2, same, 10),
        _req("ours", "ngram", "b", 0, other, 8), _req("ours", "ngram", "b", 1, other, 8),
        _req("oracle", "ngram", "a", 0, same, 30), _req("oracle", "ngram", "a", 1, same, 30),
        _req("oracle", "ngram", "b", 0, other, 30), _req("oracle", "ngram", "b", 1, other, 31),
    ])
    t = dm.repeat_chunks(df).set_index(["side", "lane"])
    ours, oracle = t.loc[("ours", "ngram")], t.loc[("oracle", "ngram")]
    assert (ours.prompts, ours.fewer_chunks_later, ours.more_chunks_later) == (2, 1, 0)
    assert ours.first_tokens_per_chunk == pytest.approx(80 / 28)
    assert ours.later_tokens_per_chunk == pytest.approx(120 / 28)
    assert (oracle.prompts, oracle.fewer_chunks_later, oracle.more_chunks_later) == (2, 0, 1)


def test_a_repeat_with_other_tokens_is_not_compared_and_a_lone_output_is_no_prompt():
    df = _frame([
        _req("ours", "ngram", "a", 0, range(40), 20), _req("ours", "ngram", "a", 1, range(1, 41), 5),
        _req("ours", "ngram", "b", 0, range(40), 20), _req("ours", "ngram", "b", 1, range(1, 41), 5),
        _req("ours", "ngram", "b", 2, range(40), 20),
    ])
    r = dm.repeat_chunks(df).iloc[0]
    assert (r.prompts, r.fewer_chunks_later, r.more_chunks_later) == (1, 0, 0)


def test_no_requests_or_no_token_ids_give_an_empty_table():
    assert dm.repeat_chunks(pd.DataFrame()).empty
    assert list(dm.repeat_chunks(pd.DataFrame()).columns) == dm.REPEAT_CHUNK_COLUMNS
    assert dm.repeat_chunks(pd.DataFrame({"side": ["ours"], "lane": ["off"]})).empty


def test_sglang_declares_its_ngram_drafter_server_wide_and_vllm_and_llamacpp_do_not():
    def spec_fact(engine, extra=None):
        cfg = EngineConfig(engine=engine, model="org/m", speculative_config=NGRAM, **(extra or {}))
        return get_engine(engine).setup_facts(cfg, {})["speculation"]

    assert EARLIER_REQUESTS in spec_fact("sglang").detail and "server-wide" in spec_fact("sglang").value
    assert EARLIER_REQUESTS not in spec_fact("vllm").detail
    assert EARLIER_REQUESTS not in spec_fact("llamacpp").detail


def _params(name):
    return load_params(ce.CrossEngineParams, PARAMS / f"{name}.yaml")


def test_the_remembering_sides_are_what_each_engine_says_of_its_config():
    """SGLang's NGRAM remembers (a server-wide trie); its draft model, vLLM's and llama.cpp's ngram do not."""
    assert dm.remembering_sides(_params("h200-sglang")) == {"off": [], "ngram": ["ours"], "draft-int4": []}
    assert dm.remembering_sides(_params("h200-llamacpp-vs-sglang"))["ngram"] == ["oracle"]
    assert dm.remembering_sides(_params("h200")) == {"off": [], "ngram": [], "draft-int4": []}


def test_the_caveat_names_the_remembering_side_and_the_chunk_counts_and_only_where_declared():
    df = _frame([_req("ours", "ngram", "a", 0, range(40), 20), _req("ours", "ngram", "a", 1, range(40), 9),
                 _req("oracle", "ngram", "a", 0, range(40), 30), _req("oracle", "ngram", "a", 1, range(40), 30)])
    chunks = dm.repeat_chunks(df)
    text = dm.lane_caveat(["ours"], chunks, "ngram", LABELS)
    assert text.startswith("sglang-cuda also drafts from earlier requests' tokens")
    assert "sglang-cuda 1 of 1, vllm-cuda 0 of 1 prompts; in more chunks: 0 and 0" in text
    assert "not for speculation on unseen text" in text
    assert dm.scope_word(text) == ", prompts served before"
    assert dm.lane_caveat([], chunks, "ngram", LABELS) == ""
    assert dm.caveats({"off": [], "ngram": ["ours"]}, chunks, LABELS).keys() == {"ngram"}
    assert dm.scope_word("") == ""


@pytest.fixture(scope="module")
def sglang_run():
    if not (SGLANG_RUN / "data" / "requests.parquet").is_file():
        pytest.fail(f"{SGLANG_RUN} holds no data/requests.parquet: docs/reports/README.md says what the folder keeps")
    params = load_params(ce.CrossEngineParams, SGLANG_RUN / "params.yaml")
    data = ce.load(RunContext.from_run_dir(SGLANG_RUN))
    return params, data, ce.analyze(data, params)


def test_on_the_committed_gpu_run_only_sglang_ngram_streams_a_served_prompt_in_fewer_chunks(sglang_run):
    _params, data, result = sglang_run
    t = result.repeat_chunks.set_index(["engine", "lane"])
    assert (t.loc[("sglang", "ngram"), "fewer_chunks_later"], t.loc[("sglang", "ngram"), "more_chunks_later"]) == (5, 0)
    for lane in ("off", "draft-int4"):
        assert (t.loc[("sglang", lane), "fewer_chunks_later"], t.loc[("sglang", lane), "more_chunks_later"]) == (0, 0)
    assert (t.loc[("vllm", "ngram"), "fewer_chunks_later"], t.loc[("vllm", "ngram"), "more_chunks_later"]) == (0, 0)
    # the same count straight from the raw frame: prompt spec_bench-483's first repeat against its second
    sg = data.requests[(data.requests["engine"] == "sglang") & (data.requests["lane"] == "ngram")
                       & (data.requests["prompt"] == "spec_bench-483")].sort_values("repeat")
    assert list(sg["token_ids"].iloc[0]) == list(sg["token_ids"].iloc[1]) and sg["chunks"].iloc[1] < sg["chunks"].iloc[0]


def test_on_the_committed_gpu_run_the_ngram_headline_is_scoped_to_prompts_served_before(sglang_run):
    params, _data, result = sglang_run
    heads = {h.comparison: h for h in result.answer(params).headlines}
    ngram = heads["lane ngram: decode rate"]
    assert ngram.verdict.endswith("faster, prompts served before")
    assert ngram.why.startswith("sglang-cuda also drafts from earlier requests' tokens")
    assert "sglang-cuda 5 of 24, vllm-cuda 0 of 24 prompts" in ngram.why
    for lane in ("off", "draft-int4"):
        assert "served before" not in heads[f"lane {lane}: decode rate"].verdict
    assert "lane ngram: prompts served before" in heads["speculation against off, each engine"].why


# -- emptying the drafter's memory before each timed request (params.draft_memory `forget`) ---------------------

class _Window:
    def __init__(self, records):
        from specbook.core.acceptance import Acceptance

        self.records = records
        self.acceptance = Acceptance(source="counters", drafts=1.0, draft_tokens=4.0, accepted_tokens=2.0)


class _Server:
    """Answers each request with a 10 ms first token and `decode_s` of decode; logs forgets and windows in order."""

    def __init__(self, decode_s: float, events: list):
        self.decode_s, self.events = decode_s, events

    def measure(self, requests, *, concurrency=1):
        from specbook.serve.client import RequestRecord

        self.events.append([r.prompt_id for r in requests])
        return _Window([RequestRecord(prompt_id=r.prompt_id, completion_tokens=33, ttft_s=0.01,
                                      wall_s=0.01 + self.decode_s, output_text="a b c") for r in requests])


def _demo_params(**update):
    import yaml

    demo = Path(__file__).resolve().parents[2] / "params" / "cross_engine" / "cpu-demo.yaml"
    return ce.CrossEngineParams.model_validate({**yaml.safe_load(demo.read_text()), **update})


def test_forgetting_gives_every_timed_request_a_window_of_its_own_right_after_emptying():
    from specbook.experiments.cross_engine.collection import measure_cell

    params = _demo_params()
    prompt = params.prompts[1].request()
    events: list = []
    server = _Server(decode_s=0.05, events=events)  # 3 repeats fall short of the wall minimum: 3 more are added
    windows = measure_cell(server, lambda i: ce.build_request(params, prompt, repeat=i), 3, params.timing,
                           forget=lambda: events.append("forget"))
    assert events == ["forget", ["capital#0"], "forget", ["capital#1"], "forget", ["capital#2"],
                      "forget", ["capital#3"], "forget", ["capital#4"], "forget", ["capital#5"]]
    assert len(windows) == 6
    plain: list = []
    measure_cell(_Server(decode_s=0.05, events=plain), lambda i: ce.build_request(params, prompt, repeat=i), 3,
                 params.timing)
    assert plain == [["capital#0", "capital#1", "capital#2"], ["capital#3", "capital#4", "capital#5"]]


def test_only_a_remembering_drafter_is_emptied_and_only_under_forget():
    from types import SimpleNamespace

    from specbook.experiments.cross_engine.collection import drafts_forgetter

    def server(engine, spec):
        return SimpleNamespace(cfg=EngineConfig(engine=engine, model="org/m", speculative_config=spec),
                               base_url="http://127.0.0.1:1")

    draft = {"method": "draft_model", "model": "org/d", "num_speculative_tokens": 4}
    forgetting = drafts_forgetter(_demo_params(), server("sglang", NGRAM))
    assert forgetting is not None and forgetting.base_url == "http://127.0.0.1:1" and forgetting.emptied == ""
    assert drafts_forgetter(_demo_params(draft_memory="keep"), server("sglang", NGRAM)) is None
    assert drafts_forgetter(_demo_params(), server("sglang", draft)) is None
    assert drafts_forgetter(_demo_params(), server("sglang", None)) is None
    assert drafts_forgetter(_demo_params(), server("vllm", NGRAM)) is None
    with pytest.raises(ValueError, match="draft_memory"):
        _demo_params(draft_memory="sometimes")


class _FlushStub:
    """A deliberately simple HTTP server in the place of an SGLang server's /flush_cache: answers `status` with
    `text`, and keeps each request's path (fault injection for the adapter's handling, not SGLang's behaviour)."""

    def __init__(self, status: int, text: str):
        import http.server
        import threading

        stub = self
        self.paths: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                stub.paths.append(self.path)
                body = text.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_sglang_forget_asks_flush_cache_to_wait_for_idle_and_raises_naming_a_refusal():
    from specbook.core.errors import EngineError
    from specbook.engines.sglang import adapter

    ok = _FlushStub(200, "Cache flushed.\n")
    try:
        assert get_engine("sglang").forget(ok.url) == adapter.FLUSHED
        assert ok.paths == [f"/flush_cache?timeout={adapter.FLUSH_WAIT_S}"]
    finally:
        ok.close()
    busy = _FlushStub(400, "Cache not flushed because there are pending requests.")
    try:
        with pytest.raises(EngineError, match=r"/flush_cache answered 400 'Cache not flushed because there are pending"):
            get_engine("sglang").forget(busy.url)
    finally:
        busy.close()


def test_a_lane_whose_remembering_side_was_emptied_carries_no_caveat_but_says_what_was_emptied():
    remembering = {"ngram": ["ours"]}
    rows = [_req("ours", "ngram", "a", 0, range(40), 9), _req("ours", "ngram", "a", 1, range(40), 9),
            _req("oracle", "ngram", "a", 0, range(40), 30), _req("oracle", "ngram", "a", 1, range(40), 30)]
    df = _frame(rows).assign(drafts_emptied=["its trie (/flush_cache)"] * 2 + [""] * 2)
    chunks = dm.repeat_chunks(df)
    assert dm.caveats(remembering, chunks, LABELS, df) == {}
    assert dm.emptied_notes(df, LABELS) == {"ngram": "sglang-cuda emptied its trie (/flush_cache) before each timed request"}
    # a run from before the column, or one request not emptied: the caveat stands
    assert dm.caveats(remembering, chunks, LABELS, df.drop(columns="drafts_emptied")).keys() == {"ngram"}
    partly = df.assign(drafts_emptied=["its trie (/flush_cache)", ""] + [""] * 2)
    assert dm.caveats(remembering, chunks, LABELS, partly).keys() == {"ngram"}
