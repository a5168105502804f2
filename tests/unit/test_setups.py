"""Two engines' set-ups side by side (specbook.experiments.cross_engine.setups, Engine.setup_facts): what each adapter tells from the
declared config and its server's start-up facts, and the asymmetries a cross-engine report lists."""

from __future__ import annotations

import shutil
from pathlib import Path

from specbook.core.params import load_params
from specbook.engines import EngineConfig, get_engine
from specbook.engines.base import SETUP_ASPECTS, SetupFact
from specbook.experiments import cross_engine as ce
from specbook.experiments.cross_engine.setups import UNKNOWN, asymmetries, setup_rows
from specbook.store.runstore import RunContext

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "cross_engine"
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def test_each_adapter_tells_its_setup_on_the_shared_aspects():
    vllm = get_engine("vllm").setup_facts(
        EngineConfig(engine="vllm", model="m", max_num_seqs=2, dtype="bf16", speculative_config=NGRAM),
        {"omp_core_ids": [[0]], "reserved_cpus": [[1]], "processes": 3})
    assert vllm["compute threads"] == SetupFact("1", "OpenMP bound to cores [0]; [1] reserved for the front end")
    assert (vllm["server processes"].value, vllm["concurrent sequences"].value, vllm["weights"].value) == (
        "3", "2", "bfloat16")
    assert vllm["graphs / compilation"].value == "eager"
    assert vllm["speculation"].value == "ngram match length 2..4" and vllm["draft tokens per step"].value == "4"
    llama = get_engine("llamacpp").setup_facts(
        EngineConfig(engine="llamacpp", model="m", max_num_seqs=2, speculative_config=NGRAM),
        {"n_threads": 2, "n_slots": 2, "n_ctx_slot": 2048, "processes": 1})
    # llama-server looks up one n-gram size (the adapter maps prompt_lookup_max onto it)
    assert llama["speculation"].value == "ngram match length 4" and llama["compute threads"].value == "2"
    assert set(vllm) <= set(SETUP_ASPECTS) and set(llama) <= set(SETUP_ASPECTS)
    # a CUDA vLLM log has no OpenMP binding: the aspect is not told, never guessed
    cuda = get_engine("vllm").setup_facts(EngineConfig(engine="vllm", model="m", enforce_eager=False), {})
    assert "compute threads" not in cuda and cuda["graphs / compilation"].value == "compiled"
    assert cuda["speculation"] == SetupFact("off")


def test_rows_mark_differences_and_leave_one_sided_aspects_open():
    rows = setup_rows("ngram", {"compute threads": SetupFact("2"), "speculation": SetupFact("a")},
                      {"compute threads": SetupFact("1"), "speculation": SetupFact("a"),
                       "server processes": SetupFact("3")})
    by = {r["aspect"]: r for r in rows}
    assert [r["aspect"] for r in rows] == ["compute threads", "server processes", "speculation"]  # aspects' order
    assert by["compute threads"]["differs"] is True and by["speculation"]["differs"] is False
    assert by["server processes"]["differs"] is None and by["server processes"]["ours"] == UNKNOWN


def test_golden_cross_run_lists_its_asymmetries_beside_the_headline(tmp_path):
    run = tmp_path / "cross"
    shutil.copytree(GOLDEN, run)  # the facts come from the run's own logs, wherever the folder lies
    data = ce.load(RunContext.from_run_dir(run))
    params = load_params(ce.CrossEngineParams, run / "params.yaml")
    table = ce.setup_table(data, params)
    assert list(dict.fromkeys(table["lane"])) == ["off", "ngram", "draft-int4"]
    # llama-server -t 2; vLLM-CPU binds its one worker to core 0 and keeps core 1 for its front end
    assert asymmetries(table) == ["compute threads: 2 vs 1", "graphs / compilation: llama.cpp's own vs eager",
                                  "speculation (ngram): ngram match length 4 vs ngram match length 2..4"]
    evidence = ce.analyze(data, params).answer(params).evidence
    assert any(e.startswith("set-ups differ in 3 aspect(s): compute threads: 2 vs 1 · ") for e in evidence), evidence
