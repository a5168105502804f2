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


def _setup(ours_detail, oracle_detail="draft from the request's own tokens"):
    return pd.DataFrame([{"lane": "ngram", "aspect": "speculation", "ours": "ngram x", "oracle": "ngram y",
                          "differs": True, "ours_detail": ours_detail, "oracle_detail": oracle_detail}])


def test_the_caveat_names_the_remembering_side_and_the_chunk_counts_and_only_where_declared():
    df = _frame([_req("ours", "ngram", "a", 0, range(40), 20), _req("ours", "ngram", "a", 1, range(40), 9),
                 _req("oracle", "ngram", "a", 0, range(40), 30), _req("oracle", "ngram", "a", 1, range(40), 30)])
    chunks = dm.repeat_chunks(df)
    text = dm.lane_caveat(_setup(f"draft from a trie, {EARLIER_REQUESTS}"), chunks, "ngram", LABELS)
    assert text.startswith("sglang-cuda drafts from a trie that earlier requests fed")
    assert "sglang-cuda 1 of 1, vllm-cuda 0 of 1 prompts; in more: 0 and 0" in text
    assert "not for speculation on unseen text" in text
    assert dm.scope_word(text) == ", prompts served before"
    assert dm.lane_caveat(_setup("draft from the request's own tokens"), chunks, "ngram", LABELS) == ""
    assert dm.lane_caveat(_setup(f"x, {EARLIER_REQUESTS}"), chunks, "off", LABELS) == ""
    assert dm.caveats(_setup(f"x, {EARLIER_REQUESTS}"), chunks, ["off", "ngram"], LABELS).keys() == {"ngram"}
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
    assert ngram.why.startswith("sglang-cuda drafts from a trie that earlier requests fed")
    assert "sglang-cuda 5 of 24, vllm-cuda 0 of 24 prompts" in ngram.why
    for lane in ("off", "draft-int4"):
        assert "served before" not in heads[f"lane {lane}: decode rate"].verdict
    assert "lane ngram: prompts served before" in heads["speculation against off, each engine"].why
