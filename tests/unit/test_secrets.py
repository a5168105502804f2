"""specbook.core.secrets: what a secret looks like, and no channel a run writes shows one (no engine here).

The rules are checked on names, argv, env, params and free text; then every channel is checked without an
engine: params.yaml and the manifest (a real runner + kernel run of a notebook that prints what it got),
servers.jsonl and the server log (stand-in servers that print their argv and env), the knob A/B runs frame
and arms.json (a knob A/B collection against the stub server), flip.json (a config-flip collection), and
attribution, which still matches runs whose launches held secrets. tests/e2e/test_secrets_never_written.py
does the same through a real vLLM server.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import pandas as pd
import pytest
import yaml

from specbook.core import secrets
from specbook.core.acceptance import Acceptance
from specbook.core.envline import read_env_line
from specbook.core.errors import RunError, ServerStartError
from specbook.core.params import dump_params, validate_params
from specbook.core.secrets import (
    REDACTED,
    Scrubber,
    is_secret_name,
    redact_argv,
    redact_data,
    redact_env,
    redact_text,
)
from specbook.engines import _ENGINES as REGISTRY
from specbook.engines import EngineConfig, register_engine
from specbook.experiments import attribution
from specbook.serve.metrics import CounterDelta, MetricsSnapshot, int_delta
from specbook.serve.server import ManagedServer, ServerSpec, free_port
from specbook.store.runstore import RunContext

STUB = Path(__file__).resolve().parents[1] / "fixtures" / "stub_servers" / "engine_stub.py"
NOTEBOOKS = Path(__file__).resolve().parents[1] / "fixtures" / "notebooks"
GSM8K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"


def all_files_text(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_nowhere(folder: Path, planted: dict[str, str]) -> None:
    """No file under `folder` (binary parquet included) holds any planted secret."""
    leaks = [f"{channel} ({value}) in {name}" for name, data in all_files_text(folder).items()
             for channel, value in planted.items() if value.encode() in data]
    assert not leaks, "secrets written: " + "; ".join(leaks)


# --------------------------------------------------------------------------------------------------
# what a secret name is


@pytest.mark.parametrize("name", [
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "hf_token", "OPENAI_API_KEY", "openai-api-key", "apiKey", "APIKEY",
    "VLLM_API_KEY", "Db_Password", "PGPASSWORD", "MYSQL_PWD", "DB_PASS", "MY_SECRET_X", "AWS_SECRET_ACCESS_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS", "AUTHORIZATION", "BASIC_AUTH", "OAUTH", "SSH_PASSPHRASE", "--api-key",
    "--hf-token", "engine.env.E2E_DB_PASSWORD", "HFToken", "MY_API_TOKEN",
])
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", [
    "VLLM_CPU_KVCACHE_SPACE", "MAX_TOKENS", "max_tokens", "--max-num-batched-tokens", "--tokenizer",
    "--tokenizer-mode", "--long-prefill-token-threshold", "--return-tokens-as-token-ids",
    "VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD", "--ssl-keyfile", "SSH_AUTH_SOCK", "GIT_AUTHOR_NAME", "BYPASS",
    "GIT_ASKPASS", "PWD", "OLDPWD", "VLLM_LOG_STATS_INTERVAL", "num_speculative_tokens", "--speculative-config",
    "engine.speculative_config.num_speculative_tokens", "S3_ACCESS_KEY_ID", "KEYS", "", "--",
])
def test_not_secret_names(name):
    assert not is_secret_name(name)


def test_no_params_field_of_any_experiment_looks_secret():
    """Redacting by name must never hide a schema field (params.yaml must re-validate for `specbook render`)."""
    import typing

    from pydantic import BaseModel

    import specbook.experiments  # noqa: F401
    from specbook.experiments.registry import get_experiment, list_experiments

    seen: set[type] = set()

    def walk(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, field in model.model_fields.items():
            assert not is_secret_name(name), f"{model.__name__}.{name}"
            for arg in (field.annotation, *typing.get_args(field.annotation)):
                for sub in typing.get_args(arg) or (arg,):
                    if isinstance(sub, type) and issubclass(sub, BaseModel):
                        walk(sub)

    for experiment in list_experiments():
        walk(get_experiment(experiment).params_model)
    assert len(seen) > 5


# --------------------------------------------------------------------------------------------------
# the redaction rules


@pytest.mark.parametrize(("text", "shown"), [
    ("http://user:s3cret@127.0.0.1/x", "http://user:***@127.0.0.1/x"),
    ("pip index https://bob:p%40ss@pypi.example/simple and more", "pip index https://bob:***@pypi.example/simple and more"),
    ("redis://:onlypass@host:6379/0", "redis://:***@host:6379/0"),
    ("a http://u:p@h/1 b postgres://v:q@w:5432/db", "a http://u:***@h/1 b postgres://v:***@w:5432/db"),
    ('["http://u:pw@h","x@y"]', '["http://u:***@h","x@y"]'),
    ("http://u:p@ss@host/x", "http://u:***@host/x"),
    ("ssh://git@github.com/x", "ssh://git@github.com/x"),  # a user without a password stays
    ("user:pass@host", "user:pass@host"),  # not a URL
    ("no url here", "no url here"),
])
def test_url_passwords_are_hidden_and_the_user_kept(text, shown):
    found: set[str] = set()
    assert redact_text(text, found) == shown
    assert redact_text(shown) == shown  # idempotent
    assert REDACTED not in found


def test_redact_env_hides_secret_names_urls_and_json_inside_values():
    env = {"HF_TOKEN": "hf_abc", "openai_api_key": "sk", "Db_Password": "p", "MY_SECRET_X": "s", "VLLM_X": "1",
           "MIRROR": "https://me:pw123456@mirror/x", "CFG": '{"api_key": "k-123456", "n": 1}',
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    found: set[str] = set()
    out = redact_env(env, found)
    assert out == {
        "HF_TOKEN": REDACTED, "openai_api_key": REDACTED, "Db_Password": REDACTED, "MY_SECRET_X": REDACTED,
        "VLLM_X": "1", "MIRROR": "https://me:***@mirror/x", "CFG": '{"api_key": "***", "n": 1}',
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    assert {"hf_abc", "sk", "p", "s", "pw123456", "k-123456"} <= found
    assert redact_env(out) == out


def test_redact_argv_options_words_overrides_urls_and_json():
    argv = ["python", "-m", "vllm", "serve", "/m", "--api-key", "K1", "K2", "--port", "8000", "--hf-token=T",
            "--speculative-config", '{"hf_token": "D", "model": "m", "num_speculative_tokens": 4}',
            "--note", "http://u:PW@h/x", "HF_TOKEN=E", "-p", "engine.env.DB_PASSWORD=O",
            "-p", "engine.extra_args=[--api-key, X9]", "--enforce-eager", "--hf-token"]
    found: set[str] = set()
    out = redact_argv(argv, found)
    assert out == ["python", "-m", "vllm", "serve", "/m", "--api-key", REDACTED, REDACTED, "--port", "8000",
                   "--hf-token=***",
                   "--speculative-config", '{"hf_token": "***", "model": "m", "num_speculative_tokens": 4}',
                   "--note", "http://u:***@h/x", "HF_TOKEN=***", "-p", "engine.env.DB_PASSWORD=***",
                   "-p", "engine.extra_args=[--api-key, '***']", "--enforce-eager", "--hf-token"]
    assert {"K1", "K2", "T", "D", "PW", "E", "O", "X9"} <= found
    assert redact_argv(out) == out  # idempotent: recorded argv stay as they are
    # an argv without secrets is untouched, JSON formatting included
    plain = ["serve", "--speculative-config", '{"model":  "m"}', "--max-tokens", "5", "-1"]
    assert redact_argv(plain) == plain


def test_redact_data_by_key_and_argv_lists_keeps_booleans_and_structure():
    data = {
        "name": "x", "description": "see https://a:b12345@h/", "rows": 3,
        "engine": {"env": {"HF_TOKEN": "hf_1", "X": "1"}, "extra_args": ["--api-key", "k", "--seed", "0"],
                   "speculative_config": {"hf_token": True, "model": "m"}},
        "credentials": {"user": "u", "tokens": ["a", "b"], "n": 5, "off": None},
        "labels": ["a", "b"],
    }
    out = redact_data(data)
    assert out == {
        "name": "x", "description": "see https://a:***@h/", "rows": 3,
        "engine": {"env": {"HF_TOKEN": REDACTED, "X": "1"}, "extra_args": ["--api-key", REDACTED, "--seed", "0"],
                   "speculative_config": {"hf_token": True, "model": "m"}},
        "credentials": {"user": REDACTED, "tokens": [REDACTED, REDACTED], "n": REDACTED, "off": None},
        "labels": ["a", "b"],
    }
    assert redact_data(out) == out


@pytest.mark.parametrize(("override", "shown"), [
    ("engine.env.HF_TOKEN=abc", "engine.env.HF_TOKEN=***"),
    ("engine.extra_args=[--api-key, abc, --seed, 1]", "engine.extra_args=[--api-key, '***', --seed, 1]"),
    ("engine.speculative_config={model: m, hf_token: t}", "engine.speculative_config={hf_token: '***', model: m}"),
    ("description=http://u:pw@h/", "description=http://u:***@h/"),
    ("rows=7", "rows=7"),
    ("engine.extra_args=[--seed, 1]", "engine.extra_args=[--seed, 1]"),
])
def test_redact_override(override, shown):
    assert secrets.redact_override(override) == shown


def test_scrubber_hides_long_known_values_longest_first_and_url_passwords():
    scrub = Scrubber(["abcdef", "abcdefgh", "1234", None, REDACTED])
    assert scrub.values == ("abcdefgh", "abcdef")  # too short to search for: 1234
    assert scrub("x abcdefgh y abcdef z 1234 http://u:p@h/") == "x *** y *** z 1234 http://u:***@h/"
    assert scrub.data({"k": ["abcdef", 3], "abcdefgh": None}) == {"k": [REDACTED, 3], REDACTED: None}
    assert not Scrubber() and Scrubber()("http://u:p@h/") == "http://u:***@h/"


# --------------------------------------------------------------------------------------------------
# params.yaml and the manifest's params, overrides, command


def test_dump_params_hides_secrets_and_the_unredacted_copy_keeps_them(tmp_path):
    sys.path.insert(0, str(NOTEBOOKS))
    from fixture_experiments import FixtureParams

    p = validate_params(FixtureParams, {"rows": 2, "labels": ["--api-key", "lbl-secret-1"],
                                        "env": {"SERVICE_TOKEN": "env-secret-1", "X": "1"},
                                        "description": "http://u:url-secret-1@h/"})
    shown = yaml.safe_load(dump_params(p, tmp_path / "a.yaml").read_text())
    assert shown["env"] == {"SERVICE_TOKEN": REDACTED, "X": "1"} and shown["labels"] == ["--api-key", REDACTED]
    assert shown["description"] == "http://u:***@h/"
    validate_params(FixtureParams, shown)  # still valid params (specbook render reads it back)
    real = yaml.safe_load(dump_params(p, tmp_path / "b.yaml", redact=False).read_text())
    assert real == p.model_dump(mode="json")


def test_runner_shows_params_overrides_command_redacted_and_hashes_what_it_shows(monkeypatch):
    from specbook.core.params import params_hash
    from specbook.run.scrub import shown_of

    sys.path.insert(0, str(NOTEBOOKS))
    from fixture_experiments import FixtureParams

    monkeypatch.setenv("MY_API_TOKEN", "launch-env-secret")
    p = validate_params(FixtureParams, {"rows": 2, "env": {"DB_PASSWORD": "override-secret"},
                                        "labels": ["--hf-token", "extra-secret-1"]})
    overrides = ["env.DB_PASSWORD=override-secret", "labels.1=extra-secret-1", "rows=2"]
    command = ["specbook", "run", "x", "-p", overrides[0], "-p", overrides[1], "--note", "launch-env-secret"]
    shown = shown_of(p, overrides, command)
    assert shown.params["env"] == {"DB_PASSWORD": REDACTED} and shown.params["labels"] == ["--hf-token", REDACTED]
    # the value-only override is caught by the value the params showed to be secret
    assert shown.overrides == ["env.DB_PASSWORD=***", "labels.1=***", "rows=2"]
    assert shown.command == ["specbook", "run", "x", "-p", "env.DB_PASSWORD=***", "-p", "labels.1=***",
                             "--note", REDACTED]
    assert shown.hidden_in_params and shown.params_hash != params_hash(p)
    plain = validate_params(FixtureParams, {"rows": 2})
    clean = shown_of(plain, ["rows=2"], ["specbook"])
    assert not clean.hidden_in_params and clean.params_hash == params_hash(plain)  # unchanged without secrets


def test_summary_blocks_the_kernel_saved_are_scrubbed_like_the_report(tmp_path):
    """The kernel builds the summary's question from its real params: the runner hides what it knows."""
    from specbook.run.scrub import scrub_report

    question = "Weights mirrored from https://alice:pw-in-desc-123@example.invalid/models; token tok-value-4567"
    (tmp_path / "reanalyses").mkdir()
    for path in (tmp_path / "summary.json", tmp_path / "reanalyses" / "r1.summary.json"):
        path.write_text(json.dumps({"question": question, "headlines": [{"why": "tok-value-4567 said"}]}))
    (tmp_path / "report.ipynb").write_text("not a notebook")  # an unreadable report leaves the summaries scrubbed
    scrub_report(tmp_path, secrets.Scrubber({"tok-value-4567"}))
    for path in (tmp_path / "summary.json", tmp_path / "reanalyses" / "r1.summary.json"):
        doc = json.loads(path.read_text())
        assert doc == {"question": "Weights mirrored from https://alice:***@example.invalid/models; token ***",
                       "headlines": [{"why": "*** said"}]}, path


# --------------------------------------------------------------------------------------------------
# servers.jsonl and the server log

FAKE_ENGINE = """
import json, os, sys
print("fake-engine args:", sys.argv[2:], flush=True)
print("fake-engine env:", {k: v for k, v in os.environ.items() if k.startswith(("E2E_", "MY_"))}, flush=True)
print("fake-engine: dying", file=sys.stderr, flush=True)
with open(sys.argv[1], "w") as fh:
    json.dump({"argv": sys.argv[2:], "env": dict(os.environ)}, fh)
sys.exit(3)
"""


def test_server_gets_real_values_while_log_env_line_and_record_hide_them(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_API_TOKEN", "launch-env-secret")  # inherited, printed by the engine
    side = tmp_path / "seen.json"  # outside the run folder: what the process really got
    run = RunContext(tmp_path / "run")
    spec = ServerSpec(
        name="fake", port=free_port(), log_path=run.log_path("fake"), ready_timeout_s=30,
        argv=[sys.executable, "-c", FAKE_ENGINE, str(side), "--api-key", "argv-secret-1",
              "--note", "http://bob:url-secret-1@127.0.0.1/x", "--seed", "0"],
        env={"E2E_SERVICE_TOKEN": "env-secret-1", "E2E_PLAIN": "visible"},
    )
    server = ManagedServer(spec)
    with pytest.raises(ServerStartError) as info:
        with server:
            pytest.fail("the fake engine never listens")
    planted = {"launch env": "launch-env-secret", "argv": "argv-secret-1", "url": "url-secret-1",
               "env": "env-secret-1"}
    # the process got every real value
    seen = json.loads(side.read_text())
    assert seen["argv"][1] == "argv-secret-1" and "url-secret-1" in seen["argv"][3]
    assert seen["env"]["E2E_SERVICE_TOKEN"] == "env-secret-1" and seen["env"]["MY_API_TOKEN"] == "launch-env-secret"
    # the log: Env line redacted, the engine's own printing of its args and env scrubbed, its last words kept
    log = spec.log_path.read_text()
    assert read_env_line(spec.log_path) == {"E2E_PLAIN": "visible", "E2E_SERVICE_TOKEN": REDACTED}
    assert "fake-engine: dying" in log and "fake-engine: dying" in info.value.log_tail
    assert "'--api-key', '***'" in log and "http://bob:***@127.0.0.1/x" in log
    assert all(v not in str(info.value) for v in planted.values())
    # the record: argv through record_server, env as the server hands it over
    run.record_server(server.name, server.argv, server.launched_env, {}, server.started_at, status="failed",
                      error="failed with http://bob:url-secret-1@127.0.0.1/x", extra={"cfg": {"api_key": "x-secret-1"}})
    (record,) = run.servers()
    assert record.argv[-6:] == ["--api-key", REDACTED, "--note", "http://bob:***@127.0.0.1/x", "--seed", "0"]
    assert record.env == {"E2E_PLAIN": "visible", "E2E_SERVICE_TOKEN": REDACTED}
    assert record.extra == {"cfg": {"api_key": REDACTED}} and "url-secret-1" not in record.error
    assert_nowhere(run.run_dir, {**planted, "extra": "x-secret-1"})


def test_server_without_secrets_logs_directly(tmp_path):
    spec = ServerSpec(name="plain", port=free_port(), log_path=tmp_path / "plain.log", ready_timeout_s=30,
                      argv=[sys.executable, "-c", "print('hello from the engine')"])
    server = ManagedServer(spec).start()
    assert server._pump is None
    deadline = time.monotonic() + 20
    while server.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    server.stop()
    assert spec.log_path.read_text().splitlines()[1:] == ["hello from the engine"]


# --------------------------------------------------------------------------------------------------
# attribution compares redacted launches with redacted expectations


def test_attribution_matches_runs_whose_launches_held_secrets():
    arms = {
        "baseline": attribution.ArmSignature(env={"E2E_TOKEN": "t-123456"}, args=["--hf-token", "h-123456"]),
        "key": attribution.ArmSignature(env={"E2E_TOKEN": "t-123456"},
                                        args=["--hf-token", "h-123456", "--api-key", "k-123456",
                                              "--note", "http://u:p-123456@h/x"]),
    }
    recorded_argv = redact_argv(["serve", "--hf-token", "h-123456", "--api-key", "k-123456",
                                 "--note", "http://u:p-123456@h/x"])
    recorded_env = redact_env({"E2E_TOKEN": "t-123456", "OTHER": "1"})
    a = attribution.attribute(recorded_env, recorded_argv, arms, declared="key")
    assert a.arm == "key" and a.matches_declared, a.reason
    assert all(s not in a.reason + json.dumps(a.observed) for s in ("t-123456", "h-123456", "k-123456", "p-123456"))
    b = attribution.attribute(recorded_env, redact_argv(["serve", "--hf-token", "h-123456"]), arms)
    assert b.arm == "baseline", b.reason
    # unredacted launches (an older run folder) attribute the same way
    c = attribution.attribute({"E2E_TOKEN": "t-123456"}, ["serve", "--hf-token", "h-123456"], arms)
    assert c.arm == "baseline", c.reason


# --------------------------------------------------------------------------------------------------
# knob A/B: runs frame argv / launched_env, arms.json, servers.jsonl, logs — and attribution still matches

WRAP_STUB = """
import json, os, runpy, sys
stub, side, args = sys.argv[1], sys.argv[2], sys.argv[3:]
print("stand-in engine args:", args, flush=True)
with open(side, "a") as fh:
    fh.write(json.dumps({"argv": args, "env": {k: v for k, v in os.environ.items() if k.startswith("E2E_")}}) + "\\n")
sys.path.insert(0, os.path.dirname(stub))
sys.argv = [stub, *args[:4]]
runpy.run_path(stub, run_name="__main__")
"""
ENGINE = "secrets-stub"


class SecretsStubEngine:
    """Test-only adapter: the stub server behind a wrapper that prints and keeps its whole argv (with the
    secrets of extra_args) and drops them before the stub parses its own options."""

    name = ENGINE
    side: Path = Path("unset")

    def refusals(self, cfg: EngineConfig) -> list[str]:
        return []

    def build_spec(self, cfg: EngineConfig, *, name: str, log_path: Path, port: int) -> ServerSpec:
        argv = [sys.executable, "-c", WRAP_STUB, str(STUB), str(self.side), "--mode", "serving", "--port", str(port),
                *cfg.extra_args]
        return ServerSpec(name=name, argv=argv, env=dict(cfg.env), port=port, log_path=log_path,
                          ready_timeout_s=cfg.ready_timeout_s, model_name=cfg.client_model_name())

    def probe_versions(self, base_url: str | None = None) -> dict[str, str]:
        versions = {"engine": self.name}
        if base_url:
            versions["stub"] = httpx.get(base_url + "/version", timeout=5, trust_env=False).json()["version"]
        return versions

    def spec_decode_delta(self, before: MetricsSnapshot, after: MetricsSnapshot, model_name: str | None = None,
                          cfg=None):
        return CounterDelta(acceptance=Acceptance(source="stub: no speculation", drafts=0.0),
                            generation_tokens=int_delta(before, after, "stub_generation_tokens"),
                            requests_succeeded=int_delta(before, after, "stub_requests"),
                            interval_s=(after.timestamp - before.timestamp).total_seconds())

    def startup_facts(self, log_path) -> dict:
        return {}

    def log_intervals(self, lines) -> pd.DataFrame:
        return pd.DataFrame({"timestamp": pd.Series(dtype="datetime64[ns, UTC]"), "al": pd.Series(dtype=float)})

    def detect_log(self, head_lines) -> int:
        return 0

    def summarise_log(self, path) -> dict:
        return {"acceptance": Acceptance(source="stub", drafts=0.0)}

    def setup_facts(self, cfg, startup) -> dict:
        return {}


@pytest.fixture
def stub_engine(tmp_path):
    register_engine(ENGINE)(SecretsStubEngine)
    REGISTRY[ENGINE].side = tmp_path / "seen.jsonl"
    yield REGISTRY[ENGINE]
    REGISTRY.pop(ENGINE, None)


@pytest.mark.skipif(not (GSM8K / "test.jsonl").is_file(), reason="shared GSM8K JSONL not present")
def test_knob_ab_collection_writes_no_secret_and_attributes_every_run(tmp_path, stub_engine, monkeypatch):
    from specbook.experiments import knob_ab
    from specbook.experiments.knob_ab.attribution import attribute_runs

    monkeypatch.setenv("MY_API_TOKEN", "launch-env-secret")
    planted = {"engine env": "env-secret-1", "extra arg": "extra-secret-1", "url": "url-secret-1",
               "knob arg": "knob-secret-1", "launch env": "launch-env-secret"}
    p = validate_params(knob_ab.KnobABParams, {
        "engine": {"engine": ENGINE, "model": "stub", "served_model_name": "stub", "ready_timeout_s": 30,
                   "env": {"E2E_SERVICE_TOKEN": planted["engine env"]},
                   "extra_args": ["--hf-token", planted["extra arg"], "--note", f"http://bob:{planted['url']}@h/x"]},
        "knobs": [{"name": "key", "args": ["--api-key", planted["knob arg"]], "env": {"E2E_KNOB": "1"}}],
        "sweeps": 1,
        "workload": {"test_path": str(GSM8K / "test.jsonl"), "train_path": str(GSM8K / "train.jsonl"),
                     "subset": 2, "shots": 0, "max_tokens": 4, "concurrency": 2},
        "measurement": {"flush_wait_s": 0},
    })
    ctx = RunContext(tmp_path / "run")
    data = knob_ab.collect(p, ctx)
    # the servers got the real values
    seen = [json.loads(ln) for ln in stub_engine.side.read_text().splitlines()]
    assert len(seen) == 2 and all(s["env"]["E2E_SERVICE_TOKEN"] == planted["engine env"] for s in seen)
    assert any(planted["knob arg"] in s["argv"] for s in seen) and all(planted["extra arg"] in s["argv"] for s in seen)
    # recorded columns are redacted
    assert data.runs["status"].tolist() == ["ok", "ok"]
    for argv, env in zip(data.runs["argv"], data.runs["launched_env"], strict=True):
        argv, env = json.loads(argv), json.loads(env)
        assert argv[argv.index("--hf-token") + 1] == REDACTED and env["E2E_SERVICE_TOKEN"] == REDACTED
    attr = attribute_runs(data.runs, p)
    assert attr["matches_declared"].all() and attr["arm"].tolist() == data.runs["declared_arm"].tolist(), attr
    assert_nowhere(ctx.run_dir, planted)


# --------------------------------------------------------------------------------------------------
# config flip: flip.json's launch view, the server record and log


EXIT_ENGINE = "secrets-exit"
PRINT_AND_EXIT = "import sys; print('stand-in engine args:', sys.argv[1:], flush=True); sys.exit(3)"


class ExitEngine(SecretsStubEngine):
    name = EXIT_ENGINE

    def build_spec(self, cfg: EngineConfig, *, name: str, log_path: Path, port: int) -> ServerSpec:
        return ServerSpec(name=name, argv=[sys.executable, "-c", PRINT_AND_EXIT, cfg.model, *cfg.extra_args],
                          env=dict(cfg.env), port=port, log_path=log_path, ready_timeout_s=30)


def test_config_flip_launch_view_record_and_log_hide_secrets(tmp_path):
    from specbook.experiments import config_flip

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"rope_theta": 10000}))
    (folder / "model.safetensors").write_bytes(b"w")
    planted = {"engine env": "env-secret-2", "extra arg": "extra-secret-2", "url": "url-secret-2"}
    p = validate_params(config_flip.ConfigFlipParams, {
        "flip": {"folder": str(folder), "field": "rope_theta", "values": [10000, 20000]},
        "engine": {"engine": EXIT_ENGINE, "model": "@flip", "env": {"E2E_DB_PASSWORD": planted["engine env"]},
                   "extra_args": ["--api-key", planted["extra arg"], "--note", f"http://u:{planted['url']}@h/"]},
        "prompts": ["hi"],
    })
    register_engine(EXIT_ENGINE)(ExitEngine)
    try:
        ctx = RunContext(tmp_path / "run")
        with pytest.raises((ServerStartError, RunError)):
            config_flip.collect(p, ctx)
    finally:
        REGISTRY.pop(EXIT_ENGINE, None)
    launch = ctx.load_json("flip")["launch"]
    assert launch["env"] == {"E2E_DB_PASSWORD": REDACTED}
    assert launch["argv"][-4:] == ["--api-key", REDACTED, "--note", "http://u:***@h/"]
    (record,) = ctx.servers()
    assert record.status == "failed" and record.env == {"E2E_DB_PASSWORD": REDACTED}
    assert "stand-in engine args:" in ctx.log_path(record.name).read_text()
    assert_nowhere(ctx.run_dir, planted)


# --------------------------------------------------------------------------------------------------
# a whole run through the runner and a real kernel (no engine): every file of the folder

try:
    from specbook.run.runner import check_kernel

    check_kernel("specbook")
    HAVE_KERNEL = True
except RunError:
    HAVE_KERNEL = False

ECHO_NOTEBOOK_CELLS = [
    "params_file = ''\nrun_dir = ''\nreuse_data = False",
    # a careless notebook: prints everything the params and the environment hold
    "import json, os, yaml\nfrom specbook.store.runstore import RunContext\n"
    "params = yaml.safe_load(open(params_file))\nctx = RunContext(run_dir)\n"
    "print('PARAMS', json.dumps(params))\nprint('ENV', os.environ.get('MY_API_TOKEN'))\n"
    "json.dump({'params': params, 'params_file': params_file}, open(params['env']['SEEN_FILE'], 'w'))",
    # a server record as the harness writes it
    "ctx.record_server('fake', ['serve', *params['labels']], params['env'], {}, None, error=params['description'])",
]


@pytest.mark.skipif(not HAVE_KERNEL, reason="register it: python -m ipykernel install --sys-prefix --name specbook")
def test_a_run_writes_no_secret_in_any_file_and_the_kernel_gets_the_real_values(tmp_path, monkeypatch):
    import nbformat

    from specbook.run.runner import run_experiment
    from specbook.store.manifest import read_manifest

    sys.path.insert(0, str(NOTEBOOKS))
    import fixture_experiments  # noqa: F401  (registers fixture_good)

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in ECHO_NOTEBOOK_CELLS]
    nb.cells[0].metadata["tags"] = ["parameters"]
    nb.metadata["kernelspec"] = {"name": "specbook", "display_name": "specbook", "language": "python"}
    notebook = tmp_path / "echo.ipynb"
    nbformat.write(nb, notebook)
    seen_file = tmp_path / "seen.json"
    planted = {"launch env": "launch-env-secret-3", "params env": "params-env-secret-3",
               "override": "override-secret-3", "extra arg": "extra-arg-secret-3", "url": "url-secret-3"}
    params_file = tmp_path / "p.yaml"
    params_file.write_text(yaml.safe_dump({
        # the description repeats a secret's value as free text (issue 26): hidden by value, not by name
        "name": "secrets", "rows": 1, "description": f"mirror https://alice:{planted['url']}@example.invalid/m "
                                                     f"(token {planted['params env']})",
        "labels": ["--api-key", planted["extra arg"]],
        "env": {"SERVICE_API_TOKEN": planted["params env"], "SEEN_FILE": str(seen_file)},
    }))
    monkeypatch.setenv("MY_API_TOKEN", planted["launch env"])
    override = f"env.DB_PASSWORD={planted['override']}"
    monkeypatch.setattr(sys, "argv", ["specbook", "run", "fixture_good", "-f", str(params_file), "-p", override])
    result = run_experiment("fixture_good", params_file, overrides=[override], outputs_root=tmp_path / "out",
                            notebook=notebook, progress=False)
    assert result.status == "ok"
    # the kernel read the real values, from a private copy that is gone now
    seen = json.loads(seen_file.read_text())
    assert seen["params"]["env"]["SERVICE_API_TOKEN"] == planted["params env"]
    assert seen["params"]["env"]["DB_PASSWORD"] == planted["override"]
    assert seen["params"]["labels"] == ["--api-key", planted["extra arg"]]
    assert not Path(seen["params_file"]).exists() and not Path(seen["params_file"]).is_relative_to(result.run_dir)
    # ... and the run folder shows none of them, in any file
    assert_nowhere(result.run_dir, planted)
    m = read_manifest(result.run_dir)
    assert m.overrides == ["env.DB_PASSWORD=***"] and m.command[-1] == "env.DB_PASSWORD=***"
    assert m.params["env"]["SERVICE_API_TOKEN"] == REDACTED and m.servers[0].argv == ["serve", "--api-key", REDACTED]
    assert yaml.safe_load((result.run_dir / "params.yaml").read_text())["env"]["DB_PASSWORD"] == REDACTED
    html = (result.run_dir / "report.html").read_text()
    assert "PARAMS" in html and "https://alice:***@example.invalid/m" in html and "ENV ***" in html


def test_the_books_own_run_token_is_no_secret_and_sends_no_server_output_through_the_scrubbing_pipe(tmp_path,
                                                                                                monkeypatch):
    """The runner's SPECBOOK_RUN_TOKEN ends in TOKEN; taken for a secret it made every server's output go through
    the scrubbing pipe, whose drain waited for a dead server's children (a death recorded seconds late)."""
    from specbook.core.secrets import RUN_TOKEN_ENV
    from specbook.serve.server import ManagedServer, ServerSpec

    assert not is_secret_name(RUN_TOKEN_ENV) and is_secret_name("SPECBOOK_HF_TOKEN")
    monkeypatch.setenv(RUN_TOKEN_ENV, "0123456789abcdef")
    srv = ManagedServer(ServerSpec(name="quiet", argv=[sys.executable, "-c", "print('hello')"], port=1,
                                   log_path=tmp_path / "quiet.log", health_path=None, models_path=None))
    srv.start()
    try:
        assert srv._pump is None  # its output goes straight to the log
        # The child's own exit, not stop(): a stop before the child has printed would kill it first.
        assert srv._proc is not None and srv._proc.wait(timeout=120) == 0
    finally:
        srv.stop()
    assert "hello" in (tmp_path / "quiet.log").read_text()
