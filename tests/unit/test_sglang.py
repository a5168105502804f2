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
    assert engine.build_env(cfg, {"PYTHONPATH": "/lib"}) == {"SGL_FORCE_SHUTDOWN": "1", "SGLANG_X": "1"}
    assert "SGL_FORCE_SHUTDOWN" not in engine.build_env(cfg, {"SGL_FORCE_SHUTDOWN": "0"})
    monkeypatch.setenv(adapter.SITE_ENV, str(tmp_path))
    assert engine.build_env(cfg, {"PYTHONPATH": "/lib"})["PYTHONPATH"] == f"{tmp_path}:/lib"
    assert engine.build_env(cfg, {})["PYTHONPATH"] == str(tmp_path)
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
